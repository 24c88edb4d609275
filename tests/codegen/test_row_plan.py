"""Row plans: ops whose parameters have no declared shapes run the reduce kernels of the
same op declared of rank 2 (gradc.passes.row_plan), on the arguments with their leading
dims collapsed.  Checked against the unfused plan (NumPy's reductions) at every rank,
on empty rows, broadcast and non-contiguous arguments, with ``out=``; which plan runs is
checked by counting the row plan's calls.  Also the row kernels' vectorised forms (row
max with NaN kept apart, sums in blocks, sums across rows gathered in float32)."""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.frontend.check import check_source
from gradc.passes import row_plan
from gradc.pipeline import build_program
from row_sources import ROW_OPS

SOURCE = ROW_OPS + """
op smexp(x) -> y {      # smax with expand_dims (JAX's form), not keepdims
    e = exp(x - expand_dims(max(x, axis=-1), axis=-1))
    y = e / expand_dims(sum(e, axis=-1), -1)
} grad(dy) -> dx {
    dx = y * (dy - expand_dims(sum(y * dy, axis=-1), axis=-1))
}
op smjax(x) -> y {      # JAX's softmax with expand_dims, the gradient derived
    e = exp(x - expand_dims(stop_gradient(max(x, axis=-1)), axis=-1))
    y = e / expand_dims(sum(e, axis=-1), axis=-1)
}
op smkeep(x) -> y {     # smjax with keepdims
    e = exp(x - stop_gradient(max(x, axis=-1, keepdims=true)))
    y = e / sum(e, axis=-1, keepdims=true)
}
op ext(x) -> (hi, lo, n) {
    hi = max(x, axis=-1)
    lo = min(x, axis=-1, keepdims=true)
    n = norm(x, axis=-1)
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    module = import_module_text(gradc.compile_source(SOURCE, file="rows.grad"), "row_plan_ops")
    module._G_ROWS_MIN = 0        # row plans for the small arrays below too (GRADC_ROWS_MIN)
    return module


def _count(m, monkeypatch, name):
    """Calls of the row plan's wrapper ``name`` (a module global the generic one calls)."""
    calls = []
    inner = getattr(m, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)
    monkeypatch.setattr(m, name, counted)
    return calls


def _same(got, want, rtol=1e-12):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)


def test_the_plans():
    """The forms tried and the ranks each method serves: any rank where every reduction
    is along the last axis; rank >= 2 where a sum over axis 0 is summed back to a column
    parameter (layer norm's dw, db); rank 2 for the rest (lnorm's jvp)."""
    cops = build_program(check_source(SOURCE, "rows.grad"))
    assert [v.forms for v in cops["smax"].rows] == [("f",)]
    assert [v.forms for v in cops["xent"].rows] == [("f", "c"), ("f", "f")]
    (ln,) = cops["lnorm"].rows
    assert ln.forms == ("f", "c", "c", "-")
    assert ln.ranks == {"forward": row_plan.ANY_RANK, "vjp": row_plan.RANK_2_UP,
                        "fwd_bwd": row_plan.RANK_2_UP, "jvp": row_plan.RANK_2}


def test_expand_dims_of_row_reductions_runs_as_keepdims(m):
    """``x - expand_dims(max(x, axis=-1), -1)`` is ``x - max(x, axis=-1, keepdims=true)``: every
    method of smjax (JAX's softmax, the gradient derived, the max under stop_gradient)
    is one reduce kernel over rows, as smkeep's, and so is every method of smexp (a
    custom gradient, its grad block with expand_dims too: its jvp transposes the
    block), as smax's, with their values to the bit."""
    from gradc.passes.fuse_reduce import ReduceKernel, cpu_plan
    program = build_program(check_source(SOURCE, "rows.grad"))
    for op in ("smexp", "smjax"):
        (variant,) = program[op].rows
        for name in ("forward", "vjp", "fwd_bwd", "jvp"):
            (step,) = cpu_plan(variant.cop.methods[name].fused).steps
            assert isinstance(step, ReduceKernel) and not step.flat, (op, name)
    x = np.random.default_rng(0).standard_normal((6, 33)) * 5
    dy = np.random.default_rng(1).standard_normal((6, 33))
    for a, b in (("smexp", "smax"), ("smjax", "smkeep")):
        a, b = getattr(m, a), getattr(m, b)
        _same(a.fwd_bwd(x, dy), b.fwd_bwd(x, dy), rtol=0)
        _same(a.jvp(x, dy), b.jvp(x, dy), rtol=0)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (7,), (0, 4), (3, 0)])
def test_softmax_every_rank(m, monkeypatch, shape):
    calls = _count(m, monkeypatch, "_gr0_smax_fwd_bwd")
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    if shape[-1] == 0 and x.size == 0 and shape[0]:     # a max of an empty row: NumPy's error
        for fn in (m.smax.unfused.fwd_bwd, m.smax.fwd_bwd):
            with pytest.raises(ValueError, match="zero-size array to reduction operation "
                                                 "maximum which has no identity"):
                fn(x, dy)
        return
    _same(m.smax.fwd_bwd(x, dy), m.smax.unfused.fwd_bwd(x, dy))
    assert calls
    # out= (the caller's arrays, written through views), float32, a Fortran-ordered x
    outs = (np.empty(shape), np.empty(shape))
    assert m.smax.fwd_bwd(x, dy, out=outs) is outs or all(
        a is b for a, b in zip(m.smax.fwd_bwd(x, dy, out=outs), outs))
    _same(outs, m.smax.unfused.fwd_bwd(x, dy))
    _same(m.smax(np.asfortranarray(x)), m.smax.unfused(x))
    x32 = x.astype(np.float32)
    _same(m.smax(x32), m.smax.unfused(x32), rtol=1e-6)


def test_small_calls_go_generic(m, monkeypatch):
    """Below GRADC_ROWS_MIN elements (4096 by default) the generic plan runs: NumPy's
    order of summation, the same bits where a sum cancels (the row plan's lanes may
    give 0 for the sum of -1e4, 1e-30, 1e4, -1e-30)."""
    calls = _count(m, monkeypatch, "_gr0_smax_vjp")
    monkeypatch.setattr(m, "_G_ROWS_MIN", 4096)
    x, dy = np.zeros((3, 4)), np.array([[-1e4, 1e-30, 1e4, -1e-30]] * 3)
    np.testing.assert_array_equal(m.smax.vjp(x, dy)[0], m.smax.unfused.vjp(x, dy)[0])
    assert not calls
    big = np.tile(dy, (1024, 1))
    _same(m.smax.vjp(np.zeros(big.shape), big), m.smax.unfused.vjp(np.zeros(big.shape), big))
    assert calls


def test_in_place_runs_the_row_plan_where_its_passes_allow(m, monkeypatch, import_module_text):
    """out= an input itself: the row plan runs where its loops read every element of
    the input before they store the output there (softmax's forward stores y in its
    last pass; ``two``'s z), with the bits of the call out of place; where a later
    pass would read the input again (``two``'s y, stored in the pass of the sum that
    z's pass needs) it runs on a copy of the input, with those bits too (the generic
    plan ran, in its own order of summation and several kernels)."""
    calls = _count(m, monkeypatch, "_gr0_smax_forward")
    x = np.random.default_rng(1).standard_normal((64, 80))
    want = m.smax(x)
    assert len(calls) == 1
    assert m.smax(x, out=x) is x and len(calls) == 2
    np.testing.assert_array_equal(x, want)
    module = import_module_text(gradc.compile_source(
        "op two(x) -> (y, z) {\n    y = exp(x)\n    z = x * sum(y, axis=-1, keepdims=true)\n}\n",
        file="two.grad"), "row_plan_in_place")
    calls = _count(module, monkeypatch, "_gr0_two_forward")
    x = np.random.default_rng(2).standard_normal((64, 80))
    y, z = module.two(x)
    got = module.two(x, out=(np.empty_like(x), x))
    np.testing.assert_array_equal(got[0], y)
    np.testing.assert_array_equal(x, z)
    assert len(calls) == 2
    x = np.random.default_rng(2).standard_normal((64, 80))
    got = module.two(x, out=(x, np.empty_like(x)))
    assert len(calls) == 3 and got[0] is x
    for a, b in zip(got, (y, z)):
        np.testing.assert_array_equal(a, b)


def test_a_derived_gradient_may_overwrite_its_cotangent(monkeypatch, import_module_text):
    """log-softmax's derived gradient reads ``dy`` through ``sum_to(dy, x)``, which is
    ``dy``'s very array wherever out= may be ``dy`` (``Primitive.passes_operand``): its
    vjp, fwd_bwd and unfused forms run with out= ``dy``, in the generic plan (small
    calls) and the row plan, with the bits of the call out of place."""
    module = import_module_text(gradc.compile_source(
        "op lsm(x) -> y {\n    y = x - logsumexp(x, axis=-1, keepdims=true)\n}\n",
        file="lsm.grad"), "row_plan_lsm_in_place")
    calls = _count(module, monkeypatch, "_gr0_lsm_vjp")
    rng = np.random.default_rng(3)
    for shape, rows in (((3, 5), False), ((64, 300), True)):
        x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
        for method in (module.lsm.vjp, module.lsm.unfused.vjp):
            want = method(x, dy)
            d = dy.copy()
            assert method(x, d, out=d)[0] is d
            np.testing.assert_array_equal(d, want[0])
        want = module.lsm.fwd_bwd(x, dy)
        d = dy.copy()
        got = module.lsm.fwd_bwd(x, d, out=(np.empty(shape), d))
        assert got[1] is d
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        assert bool(calls) == rows
    assert module.lsm.vjp(x, dy)[0] is not dy


def test_out_is_checked_once_and_the_row_plan_trusts_only_that(m, monkeypatch):
    """The op's wrapper checks out= and hands the row plan's wrapper the reshaped
    buffers marked as checked (it does not check them again); a plain tuple given to
    the row plan's wrapper is still checked."""
    calls = _count(m, monkeypatch, "_gr0_lnorm_fwd_bwd")
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    outs = (np.empty((2, 3, 8)), np.empty((2, 3, 8)), np.empty(8), np.empty(8))
    got = m.lnorm.fwd_bwd(x, w, b, dy, out=outs)
    assert calls and all(a is o for a, o in zip(got, outs))
    _same(outs, m.lnorm.unfused.fwd_bwd(x, w, b, dy))
    calls.clear()
    big = np.zeros(2 * 3 * 8 + 1)
    bad = (big[1:].reshape(2, 3, 8), np.empty((2, 3, 8)), np.empty(8), np.empty(8))
    with pytest.raises(ValueError, match=r"out\[0\] overlaps input 'x'"):
        m.lnorm.fwd_bwd(big[:-1].reshape(2, 3, 8), w, b, dy, out=bad)
    assert not calls and not big.any()
    x2 = big[:-1].reshape(6, 8)
    with pytest.raises(ValueError, match=r"out\[0\] overlaps input 'x'"):
        m._gr0_lnorm_fwd_bwd(x2, w, b, dy.reshape(6, 8), out=(
            big[1:].reshape(6, 8), np.empty((6, 8)), np.empty(8), np.empty(8)))
    assert not big.any()


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (4,)])
def test_layer_norm_columns(m, monkeypatch, shape):
    """w, b of the last dim: the row plan from rank 2 up for the gradients (dw, db
    summed over every leading dim), its error at rank 1 as the generic plan's."""
    calls = _count(m, monkeypatch, "_gr0_lnorm_fwd_bwd")
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    w, b = rng.standard_normal(shape[-1:]), rng.standard_normal(shape[-1:])
    _same(m.lnorm(x, w, b), m.lnorm.unfused(x, w, b))
    if len(shape) == 1:
        with pytest.raises(ValueError, match="gradient 'd[wb]'"):
            m.lnorm.unfused.fwd_bwd(x, w, b, dy)
        with pytest.raises(ValueError, match="gradient 'd[wb]'"):
            m.lnorm.fwd_bwd(x, w, b, dy)
        assert not calls
        return
    _same(m.lnorm.fwd_bwd(x, w, b, dy, eps=0.5), m.lnorm.unfused.fwd_bwd(x, w, b, dy, eps=0.5))
    assert calls


def test_broadcast_arguments_go_generic(m, monkeypatch):
    """A scalar or (1, k) weight fits no row plan: the generic plan, same results."""
    calls = _count(m, monkeypatch, "_gr0_lnorm_forward")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4))
    for w in (2.0, rng.standard_normal((1, 4)), rng.standard_normal((3, 4))):
        _same(m.lnorm(x, w, 0.5), m.lnorm.unfused(x, w, 0.5))
    assert not calls


def test_xent_full_targets(m, monkeypatch):
    """Targets of x's shape: the second form (every argument full); a scalar loss."""
    calls = _count(m, monkeypatch, "_gr1_xent_fwd_bwd")
    rng = np.random.default_rng(4)
    x, t = rng.standard_normal((2, 3, 5)), rng.random((2, 3, 5))
    _same(m.xent.fwd_bwd(x, t, 0.75), m.xent.unfused.fwd_bwd(x, t, 0.75))
    assert calls


def test_row_max_min_norm_special_values(m):
    """The vectorised row max and min keep NaN apart; norm's scale sees NaN before inf."""
    x = np.array([[1, np.nan, 3, -np.inf], [-np.inf] * 4, [np.inf, np.nan, 0, 1],
                  [-0.0, 0.0, 2, -5]], np.float32)
    for got, want in zip(m.ext(x), (x.max(-1), x.min(-1, keepdims=True),
                                    np.linalg.norm(x.astype(np.float64), axis=-1))):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("n", [255, 256, 1000])
def test_long_rows_in_blocks(m, n):
    """Row sums run in blocks of 256 in float32 added in float64: within float32
    rounding of the float64 result, at block edges too."""
    rng = np.random.default_rng(5)
    x, t = (rng.standard_normal((3, n)) * 4).astype(np.float32), rng.random((3, n))
    want = m.xent.fwd_bwd(x.astype(np.float64), t, 1.0)
    got = m.xent.fwd_bwd(x, t.astype(np.float32), 1.0)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)


def test_column_sums_over_many_rows(m):
    """dw, db over 40 rows (gathered 16 rows at a time in float32) agree with float64."""
    rng = np.random.default_rng(6)
    x, dy = rng.standard_normal((40, 3)), rng.standard_normal((40, 3))
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    want = m.lnorm.fwd_bwd(x, w, b, dy)
    got = m.lnorm.fwd_bwd(*(a.astype(np.float32) for a in (x, w, b, dy)))
    for a, c in zip(got, want):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)


def test_outs_of_ndarray_subclasses(m):
    """np.matrix as out= (its reshape stays 2-d: the kernels wrote out of bounds, a
    segfault; found by helper 51) is written through a plain view of its memory, in the
    row plan, the generic plan and unfused alike; a masked array is a TypeError, as a
    masked input is (its mask would not be honoured), nothing written."""
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((6, 33)), rng.standard_normal((6, 33))
    want = m.smax.unfused.fwd_bwd(x, dy)
    for fn in (m.smax, m.smax.unfused):
        out = np.asmatrix(np.full(x.shape, np.nan))
        assert np.shares_memory(fn(x, out=out), out)
        _same(np.asarray(out), want[0])
        outs = (np.asmatrix(np.full(x.shape, np.nan)), np.asmatrix(np.full(x.shape, np.nan)))
        fn.fwd_bwd(x, dy, out=outs)
        _same(tuple(np.asarray(o) for o in outs), want)
    masked = np.ma.masked_array(np.zeros(x.shape), mask=np.eye(*x.shape, dtype=bool))
    with pytest.raises(TypeError, match=r"out\[0\] is a masked array"):
        m.smax(x, out=masked)
    assert not masked.data.any()


def test_the_row_plan_takes_the_arguments_as_checked(m, monkeypatch):
    """The op's wrapper checks and converts the arguments once (``_g_inputs``,
    ``_g_upstream``), and its row plan's wrapper takes them as they are
    (``_checked=``): a call checks them once, with the results of the row plan; the
    row plan's wrapper called on its own checks them itself."""
    inputs, ups = _count(m, monkeypatch, "_g_inputs"), _count(m, monkeypatch, "_g_upstream")
    rows = _count(m, monkeypatch, "_gr0_smax_vjp")
    x = np.random.default_rng(4).standard_normal((3, 4, 50)).astype(np.float32)
    dy = np.random.default_rng(5).standard_normal((3, 4, 50)).astype(np.float32)
    (got,) = m.smax.vjp(x, dy)
    assert (len(inputs), len(ups), len(rows)) == (1, 1, 1)
    (want,) = m._gr0_smax_vjp(x.reshape(12, 50), dy.reshape(12, 50))
    assert (len(inputs), len(ups)) == (2, 2)
    np.testing.assert_array_equal(got.reshape(12, 50), want)


def test_an_axis_out_of_bounds_is_numpys_axis_error_for_every_op(import_module_text):
    """An argument of too few dimensions for an op's axis: NumPy's AxisError (a
    ValueError and an IndexError), whether a NumPy step or gradc's own checks find it,
    with the method's name (softmax's was an IndexError alone, found by helper 53; the
    others a plain ValueError, found by helper 54)."""
    axis_error = getattr(np, "exceptions", np).AxisError
    module = import_module_text(gradc.compile_source(
        "op sm(x) -> y {\n    y = softmax(x, axis=-1)\n}\n"
        "op lse(x) -> y {\n    y = logsumexp(x, axis=-1)\n}\n"
        "op lse2(x) -> y {\n    y = logsumexp(x, axis=2, keepdims=true)\n}\n"
        "op sq(x) -> y {\n    y = squeeze(x, axis=3)\n}\n"
        "op cs(x) -> y {\n    y = cumsum(x, axis=4)\n}\n", file="zero_d.grad"), "zero_d")
    for name, x, axis in [("sm", np.float64(2.0), -1), ("lse", np.float64(2.0), -1),
                          ("lse2", np.ones((3, 5)), 2), ("sq", np.ones((3, 1)), 3),
                          ("cs", np.ones((3, 5)), 4)]:
        for fn, method in [(getattr(module, name), "forward"),
                           (getattr(module, name).unfused, "unfused.forward")]:
            with pytest.raises(axis_error, match=f"^{name}.{method}: .*axis {axis} is out "
                                                 "of bounds"):
                fn(x)
