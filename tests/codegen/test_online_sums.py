"""The online form of reduce kernels: a sum of ``exp(x - h)``, ``h`` the row's max (or a
value of it), or a logsumexp's, taken in the pass of the max, block by block, rescaled
when the max so far changes (``gradc.passes.row_schedule.OnlineSum``,
``gradc.passes.loop_ir.ONLINE_ROWS``).
The wrapper runs it on rows of ``_G_ONLINE[0]`` bytes or more (a module global; ``[1]``
where the online form computes an exp again); the tests set both to 0 (every call
online) or out of reach (none) and check the two forms against
each other, against float64 and against finite differences, at the special values the
rescaling must keep (a row that starts with -inf, all -inf, +inf, NaN, the largest
numbers, a max that grows in every block), and which calls run it."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import gradc
from row_sources import ONLINE_OPS

NEVER = 1 << 62


@pytest.fixture(scope="module")
def m(import_module_text):
    module = import_module_text(gradc.compile_source(ONLINE_OPS, file="online.grad"),
                                "online_ops")
    module._G_ROWS_MIN = 0
    return module


def _rows(shape, dtype, case, rng):
    """Rows of ``shape`` holding a special ``case``."""
    r, n = shape
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    big = np.finfo(dtype).max
    if case == "-inf first":            # the max so far is -inf for the first blocks,
        x -= dtype(1000)                # then far below 0 (a sum of 0 not rescaled)
        x[:, :min(n - 1, 300)] = -np.inf
    elif case == "all -inf":
        x[0] = -np.inf
    elif case == "+inf":
        x[0, n // 2] = np.inf
        x[-1, -1] = np.inf
    elif case == "nan":
        x[-1, n - 1] = np.nan
    elif case == "largest":             # exp(x - max) of the largest numbers, and -max
        x[:, ::3] = big / 2
        x[0, 0] = -big
    elif case == "rising":              # a new max in every block: rescaled each time
        x = np.tile(np.linspace(-300, 300, n), (r, 1)).astype(dtype)
    elif case == "offset":
        x += dtype(1e4)
    return x


def _call(m, op, method, x, rng):
    dtype = x.dtype.type
    args = [x]
    if op == "xent":
        t = rng.random(x.shape).astype(dtype)
        args.append(t / t.sum(axis=-1, keepdims=True))
    elif op == "wrow":
        args.append(rng.standard_normal(x.shape).astype(dtype))
    elif op == "lsm2":
        args.append((rng.standard_normal(x.shape[-1]) * 0.5 + 1).astype(dtype))
    f = getattr(m, op)
    if method == "forward":
        return (f(*args),)
    if method == "jvp":
        return f.jvp(*args, rng.standard_normal(x.shape).astype(dtype))
    ys = f(*args)
    dy = (dtype(1.5),) if op == "xent" else (rng.standard_normal(np.shape(ys)).astype(dtype),)
    got = getattr(f, method)(*args, *dy)
    return got if isinstance(got, tuple) else (got,)


# the methods with an online form (loop_ir.online; logsumexp's own max and sum online:
# lsmax's and xent's forward; a logsumexp of x less a shift of its max with the max's:
# lsmb's, the built-in log_softmax, lseh's, lsefloor's, lsecap's, and of x less the max
# itself: lkd's, jlsm's (JAX's log_softmax); two shifts: lsmb's and jlsm's fwd_bwd,
# twoshift's; weighted, sum(y * dy): smax's fwd_bwd and vjp, and the jvps of
# log-softmax and cross-entropy, sum(softmax * tangent); the built-in softmax's
# derivative, sum(-dy * e / s / s): bsmax's fwd_bwd and vjp; times another row value,
# negated: wrow's forward)
CASES = [("smax", "fwd_bwd"), ("smax", "vjp"), ("smax", "jvp"), ("lsmax", "fwd_bwd"),
         ("lsmax", "forward"),
         ("xent", "fwd_bwd"), ("xent", "forward"),
         ("lsm2", "forward"), ("lsm2", "fwd_bwd"), ("mexp", "forward"), ("wfloor", "forward"),
         ("wcap", "forward"), ("lsmb", "forward"), ("lsmb", "fwd_bwd"), ("lseh", "forward"),
         ("lsefloor", "forward"), ("lsecap", "forward"), ("twoshift", "forward"),
         ("jlsm", "forward"), ("jlsm", "fwd_bwd"), ("lkd", "forward"),
         ("xent", "jvp"), ("lsmax", "jvp"), ("lsmb", "jvp"), ("jlsm", "jvp"),
         ("bsmax", "fwd_bwd"), ("bsmax", "vjp"), ("wrow", "forward")]
SPECIAL = ["-inf first", "all -inf", "+inf", "nan", "largest", "rising"]


@pytest.mark.parametrize("op, method", CASES)
def test_online_form_agrees_with_the_other_form(m, monkeypatch, kernel_calls, op, method):
    """Float64, rows of 1, 256 (one block), 257 and 700 elements, random and special:
    the online form gives what the form with the max and the sum in passes of their
    own gives, to the order of the sums, with the same NaN and infinities."""
    calls = kernel_calls(m, "_online", "_online_chunks")
    for shape in [(3, 1), (4, 256), (3, 257), (2, 700)]:
        for case in ["random"] + SPECIAL:
            x = _rows(shape, np.float64, case, np.random.default_rng(1))
            results = []
            for online in (0, NEVER):
                monkeypatch.setattr(m, "_G_ONLINE", (online, online))
                before = len(calls)
                with np.errstate(all="ignore"):
                    results.append(_call(m, op, method, x, np.random.default_rng(2)))
                assert (len(calls) > before) == (online == 0), (shape, case)
            for a, b in zip(*results):
                a, b = np.asarray(a), np.asarray(b)
                assert a.dtype == b.dtype == np.float64
                np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"{shape} {case}")
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=f"{shape} {case}")


@pytest.mark.parametrize("op, method", [("smax", "fwd_bwd"), ("lsmax", "fwd_bwd"),
                                        ("xent", "forward"), ("lsmb", "forward")])
def test_float32_online_form_keeps_float32_accuracy(m, monkeypatch, op, method):
    """Float32 rows around 1e4 and rows whose max rises in every block: the online
    form is as close to float64 as the other form."""
    monkeypatch.setattr(m, "_G_ONLINE", (0, 0))
    for case in ["offset", "rising", "random"]:
        x = _rows((3, 1000), np.float32, case, np.random.default_rng(3))
        got = _call(m, op, method, x, np.random.default_rng(4))
        want = _call(m, op, method, x.astype(np.float64), np.random.default_rng(4))
        monkeypatch.setattr(m, "_G_ONLINE", (NEVER, NEVER))
        other = _call(m, op, method, x, np.random.default_rng(4))
        monkeypatch.setattr(m, "_G_ONLINE", (0, 0))
        for g, w, o in zip(got, want, other):
            assert np.asarray(g).dtype == np.float32
            scale = max(float(np.max(np.abs(w))), 1.0)
            err = float(np.max(np.abs(g - w))) / scale
            assert err <= max(2 * float(np.max(np.abs(o - w))) / scale, 2e-6), (case, err)


@pytest.mark.parametrize("op", ["lsmax", "lsm2", "mexp", "lsmb", "lseh", "twoshift", "jlsm",
                                "lkd", "bsmax"])
def test_online_vjp_against_finite_differences(m, monkeypatch, op):
    """The online form's vjp against central differences of its own forward, in float64,
    along random directions (rows of 700: three blocks, the shift rescaled)."""
    monkeypatch.setattr(m, "_G_ONLINE", (0, 0))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 700)) * 2
    args = [x] + ([rng.standard_normal(700) * 0.5 + 1] if op == "lsm2" else [])
    f = getattr(m, op)
    dy = rng.standard_normal(np.shape(f(*args)))
    grads = f.vjp(*args, dy)
    grads = grads if isinstance(grads, tuple) else (grads,)
    for _ in range(3):
        v = [rng.standard_normal(np.shape(a)) for a in args]
        h = 1e-6
        plus = f(*[a + h * d for a, d in zip(args, v)])
        minus = f(*[a - h * d for a, d in zip(args, v)])
        fd = float(np.sum((plus - minus) / (2 * h) * dy))
        ad = sum(float(np.sum(g * d)) for g, d in zip(grads, v))
        assert abs(fd - ad) <= 1e-6 * max(1.0, abs(ad)), (fd, ad)


@pytest.mark.parametrize("online, split", [(0, False), (NEVER, False), (NEVER, True)])
def test_builtin_log_softmax_against_numpy(m, monkeypatch, kernel_calls, online, split):
    """The built-in log_softmax's forward in both forms (online: its logsumexp in the
    pass of the max; the other: its logsumexp's max known, max(x) - h, and one pass for
    its sum), the other on split rows too, against NumPy's float64 at random and special
    rows."""
    monkeypatch.setattr(m, "_G_ONLINE", (online, online))
    calls = kernel_calls(m, "_0_split")
    if split:
        monkeypatch.setattr(m, "_G_SPLIT", (8, 64, 16))
    for shape in [(3, 1), (4, 256), (3, 257), (2, 700)]:
        for case in ["random"] + SPECIAL:
            x = _rows(shape, np.float64, case, np.random.default_rng(10))
            with np.errstate(all="ignore"):
                got = m.lsmb(x)
                mx = x.max(-1, keepdims=True)
                s = x - np.where(mx > -np.inf, mx, 0)
                want = s - np.log(np.exp(s).sum(-1, keepdims=True))
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=case)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=case)
    assert bool(calls) == split


@pytest.mark.parametrize("online, split", [(0, False), (NEVER, False), (NEVER, True)])
def test_logsumexp_of_x_less_its_max_against_numpy(m, monkeypatch, kernel_calls, online,
                                                  split):
    """``x - max(x)`` written out, as JAX's log_softmax (``stop_gradient``: jlsm) or
    with the max's gradient (lkd: ``lse(x) - max(x)``, whose gradient is softmax less
    the max's ties shared): its logsumexp's max is the max less itself (0, NaN for a
    row of -inf or +inf), which takes no pass; forward and vjp in every form against
    NumPy's float64 at random and special rows, ties too."""
    monkeypatch.setattr(m, "_G_ONLINE", (online, online))
    calls = kernel_calls(m, "_0_split")
    if split:
        monkeypatch.setattr(m, "_G_SPLIT", (8, 64, 16))
    for shape in [(3, 1), (4, 256), (3, 257), (2, 700)]:
        for case in ["random", "ties"] + SPECIAL:
            x = _rows(shape, np.float64, "random" if case == "ties" else case,
                      np.random.default_rng(11))
            if case == "ties":
                x[:, ::7] = x.max()
            dy = np.random.default_rng(12).standard_normal(shape)
            with np.errstate(all="ignore"):
                mx = x.max(-1, keepdims=True)
                s = x - mx
                lse = np.log(np.exp(s).sum(-1, keepdims=True))
                p = np.exp(s - lse)
                ties = (x == mx) / (x == mx).sum(-1, keepdims=True)
                want = {"jlsm": (s - lse, dy - p * dy.sum(-1, keepdims=True)),
                        "lkd": (lse[:, 0], dy[:, :1] * (p - ties))}
                for op, (value, grad) in want.items():
                    got = getattr(m, op)(x)
                    (got_grad,) = getattr(m, op).vjp(x, dy[:, 0] if op == "lkd" else dy)
                    for a, b in [(got, value), (got_grad, grad)]:
                        np.testing.assert_array_equal(np.isnan(a), np.isnan(b),
                                                      err_msg=f"{op} {shape} {case}")
                        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14,
                                                   err_msg=f"{op} {shape} {case}")
    assert bool(calls) == split


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["fwd_bwd", "vjp"])
@pytest.mark.parametrize("op", ["smax", "bsmax"])
def test_weighted_online_sum_keeps_what_the_sum_as_written_gives(m, monkeypatch, kernel_calls,
                                                                 dtype, method, op):
    """softmax's sum(y * dy) online is a sum of exp(x - k) * dy divided by the sum of
    exp(x - k) (row_schedule.OnlineSum's weight; the built-in softmax's derivative
    writes it sum(zero_masked(-dy * e / s / s, dy)): negated, over s twice): where dy
    holds an inf or a NaN, or is so large that the sum of exp(x - k) * dy overflows
    where the sum of y * dy does not (y sums to 1: rows of 0, the largest numbers in
    dy), or the row is all -inf (s is 0) with dy 0 there (the sum as written is 0, the
    sum over s NaN), it is taken again as written; both forms, on whole and on split
    rows, agree with each other to the order of their sums."""
    calls = kernel_calls(m, "_online", "_online_chunks", "_online_split")
    big = np.finfo(dtype).max
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    for shape in [(3, 257), (2, 700)]:
        for case in ["random", "inf", "-inf", "nan", "huge", "overflow", "huge mixed",
                     "-inf row, dy 0"]:
            rng = np.random.default_rng(13)
            x = (rng.standard_normal(shape) * 3).astype(dtype)
            dy = rng.standard_normal(shape).astype(dtype)
            if case in ("inf", "-inf", "nan"):
                dy[0, 100] = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}[case]
            elif case == "huge":
                dy = (dy / 4 * (big / 4)).astype(dtype)
            elif case == "overflow":       # sum(exp(x - k) * dy): n times dy's mean
                x[:] = 0
                dy = (rng.uniform(0.5, 1, shape) * (big / 2)).astype(dtype)
            elif case == "huge mixed":
                dy = np.where(dy > 0, big / 4, -big / 4).astype(dtype)
            elif case == "-inf row, dy 0":
                x[0], dy[0] = -np.inf, 0
            results = []
            for online, split in [(0, (0, 64, 16)), (0, (8, 64, 100)), (NEVER, (0, 64, 16))]:
                monkeypatch.setattr(m, "_G_ONLINE", (online, online))
                monkeypatch.setattr(m, "_G_SPLIT", split)
                before = len(calls)
                with np.errstate(all="ignore"):
                    got = getattr(getattr(m, op), method)(x, dy)
                assert (len(calls) > before) == (online == 0), (shape, case)
                results.append(got if isinstance(got, tuple) else (got,))
            for got in results[:2]:
                for a, b in zip(got, results[2]):
                    assert a.dtype == b.dtype == dtype
                    np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=case)
                    finite = np.abs(b[np.isfinite(b)])      # dy - sum(y * dy) cancels
                    atol = rtol * float(finite.max(initial=0.0))
                    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=case)


def test_two_shifts_are_subtracted_in_turn(m, monkeypatch, kernel_calls):
    """(x - h1) - h2 online is scaled by exp((k - h1) - h2), as written: h1 + h2 first
    loses a small h2 beside a large h1 (1e17 and 10) and overflows (1e308 twice), found
    by helper 44."""
    calls = kernel_calls(m, "_online", "_online_chunks")
    for x, want in [(np.array([[1e17, 1e17]]), (np.log(2) - 10, 2 * np.exp(-10.0), None)),
                    (np.array([[1e308, 1.0]]), (None, None, -1e308))]:
        got = []
        for online in (0, NEVER):
            monkeypatch.setattr(m, "_G_ONLINE", (online, online))
            before = len(calls)
            got.append(m.twoprec(x))
            assert (len(calls) > before) == (online == 0)
        for a, b, w in zip(*got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12)
            if w is not None:
                np.testing.assert_allclose(a, w, rtol=1e-12)


def test_long_rows_run_online(m, monkeypatch, kernel_calls):
    """The rule (_G_ONLINE, the bytes of a row): rows of 32768 float32 or 16384 float64
    run online, rows of 16384 float32 do not; where the online form computes an exp
    again and reads the row fewer than two passes less with four arrays or more
    (softmax's vjp: two passes, not four, with three arrays), from rows of 128 KiB where
    the CPU has 512-bit vectors, 4 MiB where not (softmax's fwd_bwd, two passes fewer
    with four arrays, and a logsumexp's forward, which computes none again, from 128
    KiB still); a call that splits its rows runs its split form instead.  Methods where
    the online form would compute an exp again with few arrays to save reading
    (softmax's forward: loop_ir.online) and ops without such a sum (layer norm) have
    none."""
    wide = m._g_wide_vectors(numba.config)
    assert m._G_ONLINE == (1 << 17, 1 << 17 if wide else 1 << 22)
    calls = kernel_calls(m, "_online", "_online_chunks")
    rng = np.random.default_rng(6)
    for shape, dtype, online in [((2, 32768), np.float32, True), ((2, 16384), np.float32, False),
                                 ((2, 16384), np.float64, True), ((3, 8192), np.float64, False)]:
        x = rng.standard_normal(shape).astype(dtype)
        before = len(calls)
        y, dx = m.smax.fwd_bwd(x, np.ones_like(x))
        assert (len(calls) > before) == online, (shape, dtype)
        np.testing.assert_allclose(y.sum(axis=-1), 1, rtol=1e-5)
    monkeypatch.setattr(m, "_G_SPLIT", (8, 64, 16))
    before = len(calls)
    m.smax.fwd_bwd(rng.standard_normal((2, 32768)).astype(np.float32),
                   np.ones((2, 32768), np.float32))
    assert len(calls) == before
    monkeypatch.undo()
    for limits, vjp_online in [((1 << 17, 1 << 17), True), ((1 << 17, 1 << 22), False)]:
        monkeypatch.setattr(m, "_G_ONLINE", limits)         # with AVX-512, without
        calls = kernel_calls(m, "_online", "_online_chunks", "_online_split")
        for method, shape, online in [(m.smax.vjp, (2, 32768), vjp_online),
                                      (m.smax.fwd_bwd, (2, 32768), True),
                                      (m.lseh, (2, 32768), True),
                                      (m.smax.vjp, (2, 1 << 20), True)]:   # split
            x = rng.standard_normal(shape).astype(np.float32)
            before = len(calls)
            method(x) if method is m.lseh else method(x, np.ones_like(x))
            assert (len(calls) > before) == online, (method, shape, limits)
    online = [n for n in dir(m) if n.endswith("_online")]
    assert {"_grk0_smax_fwd_bwd_0_online", "_grk0_smax_vjp_0_online"} <= set(online)
    none = ("_grk0_lnorm", "_grk0_smax_forward")
    assert not [n for n in online if n.startswith(none)]


def test_wide_vectors_are_those_numba_compiles_for(m):
    """_g_wide_vectors: the host's AVX-512F unless Numba was told another CPU."""
    import llvmlite.binding
    from types import SimpleNamespace as NS

    host = "+avx512f" in llvmlite.binding.get_host_cpu_features().flatten().split(",")
    assert m._g_wide_vectors(NS(CPU_FEATURES=None, CPU_NAME=None)) == host
    assert m._g_wide_vectors(NS(CPU_FEATURES=None, CPU_NAME="host")) == host
    assert m._g_wide_vectors(NS(CPU_FEATURES="+avx2,+avx512f,+fma", CPU_NAME="x")) is True
    assert m._g_wide_vectors(NS(CPU_FEATURES="+avx2,-avx512f", CPU_NAME=None)) is False
    assert m._g_wide_vectors(NS(CPU_FEATURES=None, CPU_NAME="generic")) is False


def test_online_bits_do_not_depend_on_threads(m, monkeypatch):
    """An online call's bits are the shape's: the same on one thread and two, and where
    the call is too small to be threaded (GRADC_PARALLEL_MIN)."""
    monkeypatch.setattr(m, "_G_ONLINE", (0, 0))
    monkeypatch.setattr(m, "_G_PARALLEL_MIN", 0)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 333)).astype(np.float32)
    dy = rng.standard_normal((40, 333)).astype(np.float32)
    first = m.smax.fwd_bwd(x, dy)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = m.smax.fwd_bwd(x, dy)
    finally:
        numba.set_num_threads(threads)
    monkeypatch.setattr(m, "_G_PARALLEL_MIN", NEVER)
    serial = m.smax.fwd_bwd(x, dy)
    for a, b, c in zip(first, one, serial):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("op, method", [("smax", "fwd_bwd"), ("smax", "vjp"), ("lsmax", "fwd_bwd"),
                                        ("bsmax", "fwd_bwd"), ("xent", "fwd_bwd"), ("xent", "jvp"),
                                        ("lsmax", "jvp"), ("mexp", "forward"),
                                        ("lsmb", "forward"), ("lsecap", "forward")])
def test_online_split_rows_agree_with_whole_rows(m, monkeypatch, kernel_calls, op, method):
    """Split rows of the online form (each segment leaves its online sum and shift,
    rescaled to the row's max's when combined) against whole rows of the other form,
    float64: segments of one block and of two, random and special rows (segments of
    -inf first, of -inf only, a NaN or +inf in one)."""
    calls = kernel_calls(m, "_online_split")
    for shape, split in [((1, 300), (8, 64, 16)), ((3, 700), (8, 64, 300))]:
        for case in ["random"] + SPECIAL:
            x = _rows(shape, np.float64, case, np.random.default_rng(8))
            monkeypatch.setattr(m, "_G_SPLIT", split)
            monkeypatch.setattr(m, "_G_ONLINE", (0, 0))
            before = len(calls)
            with np.errstate(all="ignore"):
                got = _call(m, op, method, x, np.random.default_rng(9))
            assert len(calls) > before, (shape, case)
            monkeypatch.setattr(m, "_G_SPLIT", (0, 64, 16))
            monkeypatch.setattr(m, "_G_ONLINE", (NEVER, NEVER))
            with np.errstate(all="ignore"):
                want = _call(m, op, method, x, np.random.default_rng(9))
            for a, b in zip(got, want):
                np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"{shape} {case}")
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=f"{shape} {case}")


def test_declared_softmax_fwd_bwd_runs_in_place_in_every_form(monkeypatch, import_module_text):
    """examples/kernels/softmax.grad (declared shapes: its own plan, no copy of an input
    made first) reads dy in the pass that stores y in each form (the other: y from its
    scratch row in the last pass; the online: dy's sum in the pass of the max), so
    fwd_bwd(x, dy, out=(dy, dx)) and out=(y, dy) run in place: the bits of out of
    place, whole rows, split rows, online or not."""
    from pathlib import Path
    text = (Path(__file__).parents[2] / "examples" / "kernels" / "softmax.grad").read_text()
    k = import_module_text(gradc.compile_source(text, file="softmax.grad"), "declared_smax")
    rng = np.random.default_rng(14)
    for online in (0, NEVER):
        monkeypatch.setattr(k, "_G_ONLINE", (online, online))
        for shape in [(3, 64), (40, 1000), (16, 40000), (2, 300000)]:
            x = rng.standard_normal(shape).astype(np.float32)
            dy = rng.standard_normal(shape).astype(np.float32)
            want = k.softmax.fwd_bwd(x, dy)
            for slot in (0, 1):
                d = dy.copy()
                out = [np.empty_like(x), np.empty_like(x)]
                out[slot] = d
                got = k.softmax.fwd_bwd(x, d, out=tuple(out))
                assert got[slot] is d
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b, err_msg=f"{shape} {slot} {online}")
