"""The row-wise examples (examples/rowwise.grad: softmax, log-softmax, layer norm, RMS
norm, cross-entropy) on CUDA, in the simulator, at special rows, against the CPU module
of the same file and against the IR interpreter (NumPy, float64): rows of -inf, +inf,
NaN, inf and -inf, the largest numbers, subnormals, ties, zeros, -inf filling a
segment of a split row, and rows of one element; NaN where NaN, inf where inf.

Every special row of a call is a row of one array (the ops are row-wise; the loss's
mean and layer norm's ``dw``, ``db`` mix the rows, so the rows whose loss is NaN or
inf are one array, the finite ones another), run with whole rows and with split rows
(``_GC_SPLIT`` made to split 4 rows of 20 into 3 segments, one of them all -inf,
one holding the row's only +inf, one its only NaN).  Float32: whole rows against
NumPy's float64 rounded (the CPU's float32 kernels' JIT would double the time).

Left out as legitimate differences (found with these tests' helpers): rows around 1e4
(layer norm's centring loses 4 digits; the kernels' sums and the CPU's round
differently), cross-entropy of a row of 9e307 against soft targets (``lse - <x, t>``
cancels: any order of the dot's sum gives another multiple of an ulp of 9e307),
squares that overflow with a sum of ``dy * w * x`` near the largest float64 (whether
that sum overflows depends on the order of the sum; the device's tree sometimes
stays finite where the CPU's and NumPy's pairwise sums give -inf: RMS norm's dx is 0
there, not NaN), and float32 rows near float32's largest (the CPU sums 256-element
blocks in float32, the device in float64: layer norm of a row of 1.7e38 is NaN on
the CPU, ``b`` on the device; docs/fusion.md)."""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from simulated import EXAMPLES, Ops

import gradc
from gradc.ir.interpret import interpret

WHOLE = (0, 16, 4, 16)             # no call splits
SPLIT = (8, 16, 6, 16)             # 4 rows of 20: 3 segments (7, 7, 6)
OPS = ("softmax_rows", "log_softmax_rows", "layer_norm", "rms_norm", "xent_rows")
METHODS = ("forward", "vjp", "fwd_bwd", "jvp")

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


@pytest.fixture(scope="module")
def mods():
    """The CUDA module (with the compiled ops, for the interpreter) and the CPU module."""
    path = EXAMPLES / "rowwise.grad"
    return Ops(path), gradc.load(path)


@pytest.fixture
def splits(mods, monkeypatch):
    """The split drivers called (``<kernel>_split``)."""
    made = []
    module = mods[0].module

    def counting(name):
        inner = getattr(module, name)

        def counted(*args):
            made.append(name)
            return inner(*args)
        return counted

    for name in [n for n in dir(module) if n.startswith("_gc") and n.endswith("_split")]:
        monkeypatch.setattr(module, name, counting(name))
    return made


def _rows(n, dtype, nonfinite):
    """Special rows of ``n`` elements: those whose softmax (or loss) holds NaN or inf
    (``nonfinite``), or finite extremes (float32: none near its largest)."""
    rng = np.random.default_rng(n)
    big, tiny = np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal
    row = lambda: rng.standard_normal(n) * 3
    if nonfinite:
        rows = [np.full(n, -np.inf), row(), row(), row(), row(), row(), np.full(n, np.nan)]
        rows[1][n // 2] = np.inf                       # one +inf
        rows[2][[0, -1]] = np.inf                      # two
        rows[3][0], rows[3][-1] = np.inf, -np.inf
        rows[4][n // 3] = np.nan
        rows[5][::2] = -np.inf                         # some -inf, the max finite
    else:
        rows = [row() - 1000, np.zeros(n), np.full(n, 2.0), np.round(row()) * tiny,
                np.linspace(-300, 300, n), row(), row()]    # exp(x) of the first is 0
        rows[5][::3] = 1e30 if dtype == np.float32 else big / 2
        rows[5][0] = -1e30 if dtype == np.float32 else -big
        rows[6][:] = 1e30 if dtype == np.float32 else big / 2    # exp(x - max) = 1
    return np.array(rows, dtype)


def _split_rows():
    """4 rows of 20 in 3 segments (7, 7, 6): -inf filling the first two (the last
    around -1000: its exp is 0), +inf in the second alone, NaN in the last alone, the
    largest numbers in every one."""
    x = np.random.default_rng(3).standard_normal((4, 20)) * 3
    x[0, :14] = -np.inf
    x[0, 14:] -= 1000
    x[1, 9] = np.inf
    x[2, 17] = np.nan
    x[3, ::3] = np.finfo(np.float64).max / 2
    x[3, 0] = -np.finfo(np.float64).max
    return x


def _args(name, x, rng):
    """The op's inputs: ``x`` and a weight and bias, or targets (soft; one-hot for
    the rows of one value, where soft targets make the loss a cancellation)."""
    dtype, (r, n) = x.dtype.type, x.shape
    if name == "layer_norm":
        return [x, rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)]
    if name == "rms_norm":
        return [x, rng.standard_normal(n).astype(dtype)]
    if name == "xent_rows":
        t = rng.random((r, n)).astype(dtype)
        t /= t.sum(axis=-1, keepdims=True)
        same = (x == x[:, :1]).all(axis=-1) & np.isfinite(x[:, 0])
        t[same] = np.eye(n, dtype=dtype)[min(1, n - 1)]
        return [x, t]
    return [x]


def _extra(ops, name, method, args, rng):
    """A cotangent like the result (dy, or the loss's scalar), or a tangent like each
    differentiable input."""
    dtype = args[0].dtype.type
    if method == "forward":
        return []
    if method == "jvp":
        params = [p for p in ops.compiled[name].params if not p.has_default]
        return [rng.standard_normal(a.shape).astype(dtype)
                for a, p in zip(args, params) if p.differentiable]
    if name == "xent_rows":
        return [dtype(1.5)]
    return [rng.standard_normal(args[0].shape).astype(dtype)]


def _host(v):
    return tuple(np.asarray(a.copy_to_host() if hasattr(a, "copy_to_host") else a)
                 for a in (v if isinstance(v, tuple) else (v,)))


def _call(f, method, args):
    return _host((f if method == "forward" else getattr(f, method))(*args))


def _same(got, want, dtype, what):
    """NaN where NaN, inf of the same sign where inf, the rest to the dtype's tolerance."""
    assert len(got) == len(want), what
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == dtype, (what, k, g.shape, w.shape, g.dtype)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}[{k}] NaN")
        np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w), err_msg=f"{what}[{k}]")
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=f"{what}[{k}]")
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, equal_nan=True,
                                   err_msg=f"{what}[{k}]")


def _check(mods, name, x, split, monkeypatch, reference=True):
    """Every method of ``name`` on the device against the CPU module and (float64,
    ``reference``) the interpreter; returns the device's results."""
    ops, cpu = mods
    monkeypatch.setattr(ops.module, "_GC_SPLIT", split)
    rng = np.random.default_rng(7)
    args = _args(name, x, rng)
    dtype = x.dtype.type
    cop = ops.compiled[name]
    defaults = [p.default for p in cop.params if p.has_default]
    results = {}
    for method in METHODS:
        extra = _extra(ops, name, method, args, rng)
        dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args + extra]
        got = _call(ops.OPS[name].cuda, method, dev)
        what = f"{name}.{method} {x.dtype} {x.shape} {'split' if split is SPLIT else 'whole'}"
        _same(got, _call(getattr(cpu, name), method, args + extra), dtype, what + " vs CPU")
        if reference and dtype == np.float64:
            with np.errstate(all="ignore"):
                want = interpret(cop.methods[method].graph, args + defaults + extra)
            _same(got, tuple(np.asarray(w, dtype) for w in want), dtype, what + " vs NumPy")
        results[method] = got
    return results


@pytest.mark.parametrize("nonfinite", [True, False], ids=["nonfinite", "extreme"])
def test_special_rows_whole(mods, monkeypatch, splits, nonfinite):
    """Float64, 7 special rows of 5 (4 rows a block in the simulator: the second block
    strides), every method of every op as on the CPU and in NumPy."""
    x = _rows(5, np.float64, nonfinite)
    for name in OPS:
        got = _check(mods, name, x, WHOLE, monkeypatch)
        if name == "softmax_rows" and nonfinite:
            y = got["forward"][0]
            assert np.isnan(y[[0, 1, 2, 3, 4, 6]]).all()            # -inf - -inf, inf - inf
            assert np.isfinite(y[5]).all() and (y[5][np.isneginf(x[5])] == 0).all()
            np.testing.assert_allclose(y[5].sum(), 1.0, rtol=1e-12)
        if name == "log_softmax_rows" and nonfinite:
            y = got["forward"][0]                 # x - lse, lse = inf where inf anywhere
            np.testing.assert_array_equal(np.isneginf(y[1]), np.isfinite(x[1]))
            assert np.isnan(y[0]).all() and np.isneginf(y[5][np.isneginf(x[5])]).all()
    assert not splits


def test_special_values_in_segments_of_split_rows(mods, monkeypatch, splits):
    """Float64, split rows (``_GC_SPLIT`` made to split 4 rows of 20 into 3 segments):
    every method of every op as on the CPU and in NumPy, with every kind of segment."""
    x = _split_rows()
    for name in OPS:
        before = len(splits)
        got = _check(mods, name, x, SPLIT, monkeypatch)
        assert len(splits) > before, name
        if name == "softmax_rows":
            y = got["forward"][0]
            assert (y[0, :14] == 0).all() and np.isnan(y[1:3]).all()
            np.testing.assert_allclose(y[[0, 3]].sum(axis=-1), 1.0, rtol=1e-12)


def test_special_rows_float32(mods, monkeypatch):
    """Float32, whole rows, the non-finite rows: every method against NumPy's float64
    (the interpreter) rounded to float32 (the CPU's float32 kernels are not compiled
    here: their JIT would double the file's time)."""
    ops = mods[0]
    x = _rows(5, np.float32, True)
    monkeypatch.setattr(ops.module, "_GC_SPLIT", WHOLE)
    rng = np.random.default_rng(7)
    for name in OPS:
        args = _args(name, x, rng)
        cop = ops.compiled[name]
        defaults = [p.default for p in cop.params if p.has_default]
        for method in METHODS:
            extra = _extra(ops, name, method, args, rng)
            dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args + extra]
            got = _call(ops.OPS[name].cuda, method, dev)
            wide = [a.astype(np.float64) if isinstance(a, np.ndarray) else float(a)
                    for a in args + extra]
            with np.errstate(all="ignore"):
                want = interpret(cop.methods[method].graph, wide[:len(args)] + defaults
                                 + wide[len(args):])
            _same(got, tuple(np.asarray(w, np.float32) for w in want), np.float32,
                  f"{name}.{method} float32 vs NumPy")


def test_rows_of_one_element(mods, monkeypatch):
    """Rows of one element: softmax 1 (NaN at inf and NaN), log-softmax 0, every
    method as on the CPU and in NumPy."""
    x = np.array([[-np.inf], [np.inf], [np.nan], [0.0], [3.0], [1e308]])
    got = {name: _check(mods, name, x, WHOLE, monkeypatch) for name in OPS}
    np.testing.assert_array_equal(got["softmax_rows"]["forward"][0][:, 0],
                                  [np.nan, np.nan, np.nan, 1, 1, 1])
    np.testing.assert_array_equal(got["log_softmax_rows"]["forward"][0][:, 0],
                                  [np.nan, np.nan, np.nan, 0, 0, 0])


@pytest.mark.parametrize("split", [WHOLE, SPLIT], ids=["whole", "split"])
def test_in_place_where_the_row_plan_reads_the_input_again(mods, monkeypatch, split):
    """out= an input itself where a pass of the row plan would read the input after
    another stored over it (softmax's fwd_bwd y into dy, layer norm's y into x): the row
    plan runs on a copy of the input (``_gc_rows_own``), with the values of the call out
    of place."""
    ops = mods[0]
    monkeypatch.setattr(ops.module, "_GC_SPLIT", split)
    rng = np.random.default_rng(12)
    x, dy = rng.standard_normal((4, 20)), rng.standard_normal((4, 20))
    for name, j in (("softmax_rows", 1), ("layer_norm", 0)):
        rows = []
        inner = getattr(ops.module, f"_gcr0_{name}_fwd_bwd")
        monkeypatch.setattr(ops.module, f"_gcr0_{name}_fwd_bwd",
                            lambda *a, _f=inner, **k: rows.append(1) or _f(*a, **k))
        args = _args(name, x, rng)
        f = getattr(ops, name).cuda
        want = _host(f.fwd_bwd(*[cuda.to_device(a) for a in args], cuda.to_device(dy)))
        dev = [cuda.to_device(a) for a in args] + [cuda.to_device(dy)]
        outs = (dev[j],) + tuple(cuda.to_device(np.empty_like(w)) for w in want[1:])
        got = _host(f.fwd_bwd(*dev, out=outs))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=name)
        np.testing.assert_array_equal(dev[j].copy_to_host(), want[0], err_msg=name)
        assert len(rows) == 2, name              # out of place and in place


@pytest.mark.parametrize("split", [WHOLE, SPLIT], ids=["whole", "split"])
def test_in_place_row_plans(mods, monkeypatch, splits, split):
    """out= an input itself on the device: the forwards into x and the vjps' dx into dy
    where the row plan's loops read each element before they store over it
    (loop_ir.stores_after_reads on CUDA's loops; log-softmax's reads dy through
    ``sum_to(dy, x)``, which is dy itself), the values of the call out of place."""
    ops = mods[0]
    monkeypatch.setattr(ops.module, "_GC_SPLIT", split)
    rng = np.random.default_rng(11)
    x, dy = rng.standard_normal((4, 20)), rng.standard_normal((4, 20))
    for name in OPS[:4]:
        args = _args(name, x, rng)
        f = getattr(ops, name).cuda
        want = _host(f(*[cuda.to_device(a) for a in args]))
        dev = [cuda.to_device(a) for a in args]
        f(*dev, out=dev[0])
        np.testing.assert_array_equal(dev[0].copy_to_host(), want[0], err_msg=name)
        want = _host(f.vjp(*[cuda.to_device(a) for a in args], cuda.to_device(dy)))
        dev, ddy = [cuda.to_device(a) for a in args], cuda.to_device(dy)
        outs = (ddy,) + tuple(cuda.to_device(np.empty_like(w)) for w in want[1:])
        f.vjp(*dev, ddy, out=outs)
        np.testing.assert_array_equal(ddy.copy_to_host(), want[0], err_msg=name)
    assert bool(splits) == (split == SPLIT)
