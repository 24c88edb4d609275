"""Split rows: a call of few long rows runs each pass of a row over segments of the row
in parallel, the segments' accumulators combined per row between passes
(``gradc.passes.loop_ir.SPLIT``; the wrapper decides by the shape, ``_g_rows``).  The
tests make rows of a few hundred elements split (``_G_SPLIT``, a module global) and check
every kind of accumulator a segment leaves (sums, two-pass maxima and shifted sums,
NaN flags, centred sums by Chan's formula, partials of all elements and across rows)
against the same op with whole rows, and against float64 where the order of the sums
moves the bits; the special values a segment may hold alone; bits that do not depend
on threads; and which calls split."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from gradc.passes.loop_ir import SPLIT, SPLIT_COLS
from row_sources import split_rows_module


# rows of 64 elements or more split, fewer than 8 of them, in segments of 16 or more
SMALL = (8, 64, 16)
WHOLE = (0, 64, 16)          # no call splits


@pytest.fixture(scope="module")
def m(import_module_text):
    return split_rows_module(import_module_text)     # test_split_rows's module


def _inputs(op, shape, dtype, rng):
    r, n = shape
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    if op == "lnorm":
        return [x, rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)]
    if op == "rms":
        return [x, rng.standard_normal(n).astype(dtype)]
    if op == "xent":
        t = rng.random(shape).astype(dtype)
        return [x, t / t.sum(axis=-1, keepdims=True)]
    return [x]


def _call(m, op, method, args, rng, dtype, **kw):
    f = getattr(m, op)
    if method == "forward":
        return f(*args, **kw)
    if method == "jvp":
        tangents = [rng.standard_normal(np.shape(a)).astype(dtype) for a in args]
        return f.jvp(*args[:1], *args[1:], *tangents[:1 if op == "xent" else len(args)], **kw)
    y = f(*args, **kw)
    ys = y if isinstance(y, tuple) else (y,)
    dy = [rng.standard_normal(np.shape(v)).astype(dtype) for v in ys]
    return getattr(f, method)(*args, *dy, **kw)


def _tuple(v):
    return v if isinstance(v, tuple) else (v,)


# every op's fwd_bwd, and the other methods where their kernels hold other accumulators
# (each case compiles its kernels twice: split and whole)
CASES = [(op, "fwd_bwd") for op in ("smax", "lsmax", "lnorm", "rms", "xent")] + [
    ("lnorm", "forward"), ("xent", "vjp"), ("smax", "jvp"), ("lnorm", "jvp"), ("xent", "jvp")]


@pytest.mark.parametrize("op, method", CASES)
def test_split_rows_agree_with_whole_rows(m, monkeypatch, kernel_calls, op, method):
    """Softmax, log-softmax, layer norm, RMS norm and cross-entropy in float64: split
    rows (of 1, 3 and 7 rows, segments of 16 to 41 elements, the last one longer; 2 x 3
    rows where a row plan serves the method at rank 3; 12 rows where sums across rows,
    dw and db, split up to 16) give what whole rows give, to the order of their sums."""
    calls = kernel_calls(m, "_split")
    cols = [(12, 90)] if op in ("lnorm", "rms") and method == "fwd_bwd" else []
    for shape in [(1, 300), (3, 257), (7, 100), (2, 3, 70)] + cols:
        rows = (int(np.prod(shape[:-1])), shape[-1])
        args = _inputs(op, rows, np.float64, np.random.default_rng(1))
        args = [a.reshape(shape) if a.shape == rows else a for a in args]
        monkeypatch.setattr(m, "_G_SPLIT", SMALL)
        before = len(calls)
        got = _tuple(_call(m, op, method, args, np.random.default_rng(2), np.float64))
        assert len(calls) > before or len(shape) > 2, "the call did not split"
        monkeypatch.setattr(m, "_G_SPLIT", WHOLE)
        want = _tuple(_call(m, op, method, args, np.random.default_rng(2), np.float64))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.float64
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_float32_split_rows_keep_float32_accuracy(m, monkeypatch):
    """Layer norm's fwd_bwd (centred sums: each segment's co-moment about its mean,
    combined by Chan's formula; dw and db gathered straight) and cross-entropy's vjp in
    float32 on rows around 1e4 with a spread of 1: as close to float64 as whole rows."""
    rng = np.random.default_rng(3)
    r, n = 3, 4099
    x = (1e4 + rng.standard_normal((r, n))).astype(np.float32)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dy = rng.standard_normal((r, n)).astype(np.float32)
    exact = m.lnorm.fwd_bwd(*(a.astype(np.float64) for a in (x, w, b, dy)))
    errors = {}
    for name, split in [("split", (8, 64, 64)), ("whole", WHOLE)]:
        monkeypatch.setattr(m, "_G_SPLIT", split)
        got = m.lnorm.fwd_bwd(x, w, b, dy)
        errors[name] = [float(np.max(np.abs(g - e)) / np.max(np.abs(e))) for g, e in zip(got, exact)]
        assert all(g.dtype == np.float32 for g in got)
    for s, whole in zip(errors["split"], errors["whole"]):
        assert s <= max(2 * whole, 1e-5), errors
    t = rng.random((r, n)).astype(np.float32)
    t /= t.sum(axis=-1, keepdims=True)
    x = rng.standard_normal((r, n)).astype(np.float32) * 30
    monkeypatch.setattr(m, "_G_SPLIT", (8, 64, 64))
    got = m.xent.vjp(x, t, np.float32(1.0))
    want = m.xent.vjp(x.astype(np.float64), t.astype(np.float64), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_special_values_in_one_segment(m, monkeypatch):
    """A NaN, an inf or a -inf in one segment of a row reaches the row's max, min, norm,
    logsumexp and softmax as in whole rows (the NaN flags or-ed across
    segments, the shifts from the combined max); a row of -inf and an empty-looking
    row of zeros too; the max across rows (a partial per column) started at the first
    row in each segment."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 200))
    x[0, 150] = np.nan
    x[1, 30] = np.inf
    x[2, :] = -np.inf
    x[3, 199] = -np.inf
    x[4, :] = 0.0
    x[5, 17] = 1e308
    results = {}
    for name, split in [("split", SMALL), ("whole", WHOLE)]:
        monkeypatch.setattr(m, "_G_SPLIT", split)
        with np.errstate(all="ignore"):
            results[name] = [*_tuple(m.ext(x)), m.smax(x), m.lsmax(x),
                             m.xent(x, np.full_like(x, 1 / 200)),
                             *_tuple(m.smax.fwd_bwd(x, np.ones_like(x)))]
    for a, b in zip(results["split"], results["whole"]):      # dx: 1 - sum(y) near 0
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15, equal_nan=True)


def test_max_across_rows_starts_at_the_first_row(m, monkeypatch):
    """The max across rows (a partial per column) of a kernel that splits rows, into an
    ``out=`` holding other numbers: each segment starts its columns at the first row."""
    monkeypatch.setattr(m, "_G_SPLIT", SMALL)
    x = np.random.default_rng(5).standard_normal((3, 130)) - 10
    outs = tuple(np.full(np.shape(v), 7.0) for v in _tuple(m.ext(x)))
    got = m.ext(x, out=outs)
    np.testing.assert_array_equal(got[3], x.max(axis=0))
    np.testing.assert_array_equal(got[0], x.max(axis=-1))


def test_bits_do_not_depend_on_threads(m, monkeypatch):
    """A split call's bits are the shape's: the same on one thread and two, and where
    the call is too small to be threaded (GRADC_PARALLEL_MIN: its segments in turn)."""
    monkeypatch.setattr(m, "_G_SPLIT", SMALL)
    rng = np.random.default_rng(6)
    args = _inputs("lnorm", (5, 333), np.float32, rng)
    dy = rng.standard_normal((5, 333)).astype(np.float32)
    first = m.lnorm.fwd_bwd(*args, dy)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = m.lnorm.fwd_bwd(*args, dy)
    finally:
        numba.set_num_threads(threads)
    monkeypatch.setattr(m, "_G_PARALLEL_MIN", 1 << 60)
    serial = m.lnorm.fwd_bwd(*args, dy)
    for a, b, c in zip(first, one, serial):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_random_numbers_in_split_rows(m, monkeypatch, kernel_calls):
    """A draw in a kernel that splits rows (an op of declared rank 2: its own reduce
    kernels) takes the element's index in the whole array: the same mask as whole
    rows."""
    x = np.random.default_rng(7).standard_normal((2, 500))
    monkeypatch.setattr(m, "_G_SPLIT", SMALL)
    calls = kernel_calls(m, "_split")
    got = m.dropmax(x, seed=11)
    assert calls
    monkeypatch.setattr(m, "_G_SPLIT", WHOLE)
    want = m.dropmax(x, seed=11)
    np.testing.assert_array_equal(got == 0, want == 0)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_which_calls_split(m, monkeypatch, kernel_calls):
    """Fewer rows than SPLIT[0], of SPLIT[1] elements or more, split; more rows, shorter
    rows, no rows and empty rows do not (the rule of ``_g_rows``, gradc's own)."""
    rows, least, segment = SPLIT
    assert m._G_SPLIT == SPLIT
    assert m._g_rows("f", (1, least), 1, None, split=SPLIT) == (1, least, 1, least // segment)
    assert m._g_rows("f", (rows - 1, 3 * least), 1, None, split=SPLIT)[3] == 3 * least // segment
    for shape in [(rows, least), (1, least - 1), (0, least), (3, 0)]:
        assert m._g_rows("f", shape, 1, None, split=SPLIT)[3] == 0
    assert m._g_rows("f", (1, least), 1, None)[3] == 0
    # a kernel with sums across rows (dw: cols) splits up to SPLIT_COLS times as many rows
    for shape, split in [((rows, least), True), ((2 * rows, least), True),
                         ((2 * rows + 1, least), False), ((1, least - 1), False)]:
        got = m._g_rows("f", shape, 1, None, cols=True, split=SPLIT, cols_split=SPLIT_COLS)
        assert (got[3] > 0) == split, shape
    assert m._G_SPLIT_COLS == SPLIT_COLS == 2
    assert m._g_rows("f", (1, least), 1, None, cols=True, split=WHOLE, cols_split=2)[3] == 0
    monkeypatch.setattr(m, "_G_SPLIT", SMALL)
    calls = kernel_calls(m, "_split")
    m.smax(np.ones((8, 100)))
    m.smax(np.ones((7, 63)))
    assert not calls
    m.smax(np.ones((7, 64)))
    assert calls


def test_row_products_do_not_split(m, monkeypatch, kernel_calls):
    """A kernel with a row product keeps whole rows: a row of 1e200s then of 1e-200s, as
    segments, would be a product of inf and 0 (NaN) where NumPy's is inf."""
    monkeypatch.setattr(m, "_G_SPLIT", SMALL)
    calls = kernel_calls(m, "_split")
    x = np.ones((1, 2048))
    x[0, :1024], x[0, 1024:] = 1e200, 1e-200
    with np.errstate(all="ignore"):
        got = m.prodrow(x)
        want = x * np.prod(x, axis=-1, keepdims=True)
    assert not calls
    np.testing.assert_array_equal(got, want)


def test_a_sum_across_few_rows_is_its_partial(m, monkeypatch):
    """Split rows gather dw and db straight into the one chunk's row of the compute
    dtype, which is then the result itself (no copy, no float64 round trip): the same
    bits as summing the partial, the float32 sum of at most 7 rows."""
    monkeypatch.setattr(m, "_G_SPLIT", SMALL)
    rng = np.random.default_rng(8)
    args = _inputs("lnorm", (3, 200), np.float32, rng)
    dy = rng.standard_normal((3, 200)).astype(np.float32)
    _, _, dw, db = m.lnorm.fwd_bwd(*args, dy)
    assert db.dtype == np.float32 and db.base is not None and db.base.shape == (1, 200)
    np.testing.assert_array_equal(db, (dy[0] + dy[1]) + dy[2])
    x, w, b = args
    outs = tuple(np.empty_like(a) for a in (x, x, w, b))
    _, _, dw_out, db_out = m.lnorm.fwd_bwd(*args, dy, out=outs)
    np.testing.assert_array_equal(dw_out, dw)
    np.testing.assert_array_equal(db_out, db)


def test_sums_across_rows_in_place_of_an_input(m, monkeypatch):
    """out= may hold the very array of an input where the kernel reads it before the
    result is written (dw in place of w): split rows then gather in a partial of their
    own, not in that array, which the kernel still reads."""
    monkeypatch.setattr(m, "_G_SPLIT", SMALL)
    rng = np.random.default_rng(9)
    x, w, b = (rng.standard_normal(s) for s in ((3, 150), 150, 150))
    dy = rng.standard_normal((3, 150))
    want = m.lnorm2.fwd_bwd(x, w, b, dy)
    outs = (np.empty_like(x), np.empty_like(x), w, b)
    got = m.lnorm2.fwd_bwd(x, w, b, dy, out=outs)
    assert got[2] is w and got[3] is b
    for a, e in zip(got, want):
        np.testing.assert_array_equal(a, e)


def test_a_pass_that_several_methods_share_is_one_function(m) -> None:
    """Softmax's first pass over a segment (its max) is the same loop in each of its
    methods: one function, which the other methods name (compiled once, not four
    times); its other functions stay apart where their loops differ."""
    seg0 = {k: getattr(m, f"_grk0_smax_{k}_0_seg0") for k in ("forward", "vjp", "fwd_bwd")}
    assert len({id(f) for f in seg0.values()}) == 1
    assert seg0["vjp"].py_func.__name__ == "_grk0_smax_forward_0_seg0"
    assert m._grk0_smax_vjp_0_seg0_par is m._grk0_smax_forward_0_seg0_par
    assert m._grk0_smax_fwd_bwd_0_seg2 is not m._grk0_smax_vjp_0_seg2
