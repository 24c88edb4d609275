"""Issue 3 §1: derivatives that are numerically safe where the forward is finite.

Each case is compiled as a ``.grad`` op and run through every path a user can take
(derived ``vjp``, fused ``fwd_bwd``, ``.unfused.vjp``, ``.unfused.fwd_bwd``) in
float32 and float64; all must give the value shown (which is the mathematical
limit, or the convention documented in ``docs/numerics.md``).
"""
from __future__ import annotations

import numpy as np
import pytest

import gradc

SOURCE = """
op where_sqrt_else(x) -> y { y = where(x < 1, x, sqrt(x)) }
op where_sqrt_then(x) -> y { y = where(x > 0, sqrt(x), 0) }
op where_recip(x) -> y { y = where(x > 0, 1 / x, 1) }
op norm_sq(x) -> y { y = norm(x)^2 }
op norm_plain(x) -> y { y = norm(x) }
op power(a, b) -> y { y = a^b }
op naive_softplus(x) -> y { y = log1p(exp(x)) }
op tanh_op(x) -> y { y = tanh(x) }
op lse(x) -> y { y = logsumexp(x) }
op bcast(a, b) -> y { y = sum(a * b) }
op cube(x) -> y { y = x^3 }
op sign_ste(x) -> y {
    y = sign(x)
} grad(dy) -> dx surrogate {
    dx = dy * (abs(x) <= 1)
}
"""

DTYPES = (np.float32, np.float64)


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="safe.grad"), "gradc_test_safe")


FAST_SOURCE = """
op tanh_op(x) -> y { y = tanh(x) }
op cube(x) -> y { y = x^3 }
op naive_softplus(x) -> y { y = log1p(exp(x)) }
op lse(x) -> y { y = logsumexp(x) }
"""


@pytest.fixture(scope="module")
def fast_text():
    return gradc.compile_source(FAST_SOURCE, file="fast.grad", fast_math=True)


@pytest.fixture(scope="module", params=["default", "fast_math"])
def mathlib(request, m, fast_text, import_module_text):
    """The module compiled both ways: the math library differs (--fast-math)."""
    if request.param == "default":
        return m
    return import_module_text(fast_text, "gradc_test_fast")


def test_fast_math_never_assumes_no_nan_or_inf(fast_text):
    flags = {line.strip() for line in fast_text.splitlines() if "fastmath" in line}
    assert flags, "fast_math=True emitted no fast-math kernels"
    for line in flags:
        assert "nnan" not in line and "ninf" not in line and "fastmath=True" not in line, line
        assert "reassoc" not in line, line      # breaks the exp range reduction


def all_paths(op, inputs, upstreams, n_out=1):
    """(name, outputs, gradients) of every way to get an op's value and VJP."""
    for name, impl in (("fused", op), ("unfused", op.unfused)):
        grads = impl.vjp(*inputs, *upstreams)
        yield name + ".vjp", impl(*inputs), grads
        both = impl.fwd_bwd(*inputs, *upstreams)
        yield name + ".fwd_bwd", both[0] if n_out == 1 else both[:n_out], both[n_out:]


def check(op, inputs, value, grads, dtype, rtol=None):
    rtol = rtol or (2e-6 if dtype == np.float32 else 1e-12)
    inputs = [np.asarray(a, dtype) for a in inputs]
    out_shape = np.broadcast_shapes(*(np.shape(v) for v in [value]))
    dy = np.ones(out_shape, dtype)
    for path, out, got in all_paths(op, inputs, [dy]):
        assert np.asarray(out).dtype == dtype, path
        np.testing.assert_allclose(out, value, rtol=rtol, err_msg=f"{path} value")
        for g, want, a in zip(got, grads, inputs):
            assert g.dtype == dtype and g.shape == a.shape, (path, g.dtype, g.shape)
            np.testing.assert_allclose(g, want, rtol=rtol, atol=0, err_msg=f"{path} gradient")


@pytest.mark.parametrize("dtype", DTYPES)
def test_where_does_not_leak_the_unselected_branch(m, dtype):
    check(m.where_sqrt_else, [0.0], 0.0, [1.0], dtype)
    check(m.where_sqrt_then, [[-1, 0, 1, 4]], [0, 0, 1, 2], [[0, 0, 0.5, 0.25]], dtype)
    check(m.where_recip, [0.0], 1.0, [0.0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_at_zero(m, dtype):
    check(m.norm_sq, [[0, 0]], 0.0, [[0, 0]], dtype)
    check(m.norm_plain, [[0, 0]], 0.0, [[0, 0]], dtype)
    check(m.norm_plain, [[3, 4]], 5.0, [[0.6, 0.8]], dtype)
    check(m.norm_sq, [[3, 4]], 25.0, [[6, 8]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_power_at_zero_base(m, dtype):
    check(m.power, [0.0, 1.0], 0.0, [1.0, 0.0], dtype)
    check(m.power, [2.0, 1.0], 2.0, [1.0, 2 * np.log(2)], dtype)
    check(m.power, [0.0, 2.0], 0.0, [0.0, 0.0], dtype)
    check(m.power, [0.0, 0.0], 1.0, [0.0, 0.0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_softplus_is_rewritten_stably(m, dtype):
    check(m.naive_softplus, [100.0], 100.0, [1.0], dtype)
    check(m.naive_softplus, [-20.0], np.log1p(np.exp(-20.0)), [np.exp(-20.0) / (1 + np.exp(-20.0))],
          dtype, rtol=1e-5)


@pytest.mark.parametrize("dtype, x", [(np.float32, 50.0), (np.float64, 400.0)])
def test_tanh_saturates_with_zero_gradient(mathlib, dtype, x):
    for sgn in (1, -1):
        inputs = [np.asarray([sgn * x], dtype)]
        for path, out, (g,) in all_paths(mathlib.tanh_op, inputs, [np.ones(1, dtype)]):
            assert out[0] == sgn, path
            assert np.isfinite(g).all() and 0 <= g[0] < 1e-40, (path, g)


@pytest.mark.parametrize("dtype", DTYPES)
def test_logsumexp_edges(m, dtype):
    check(m.lse, [[-np.inf, -np.inf]], -np.inf, [[0, 0]], dtype)
    check(m.lse, [[1000, 1000]], 1000 + np.log(2), [[0.5, 0.5]], dtype)
    check(m.lse, [[-np.inf, 1]], 1.0, [[0, 1]], dtype)
    # a +inf element: NaN there (not a silent 0), 0 at the finite ones, as jax.vjp
    check(m.lse, [[0, np.inf]], np.inf, [[0, np.nan]], dtype)
    check(m.lse, [np.zeros(0)], -np.inf, [np.zeros(0)], dtype)     # empty: -inf, as NumPy's


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_gradients_keep_operand_shapes(m, dtype):
    a = np.array([[1.0], [2.0]])
    b = np.array([[3.0, 4.0, 5.0]])
    check(m.bcast, [a, b], (a * b).sum(), [np.broadcast_to(b.sum(), (2, 1)),
                                             np.broadcast_to(a.sum(), (1, 3))], dtype)


def test_float32_stays_float32(mathlib):
    x = np.linspace(-2, 2, 7, dtype=np.float32)
    check(mathlib.cube, [x], x.astype(np.float64) ** 3, [3 * x.astype(np.float64) ** 2], np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_propagates_through_every_path(mathlib, dtype):
    x = np.array([np.nan, 1.0, np.inf, -np.inf], dtype)
    for op in (mathlib.tanh_op, mathlib.cube, mathlib.naive_softplus, mathlib.lse):
        dy = np.ones((), dtype) if op is mathlib.lse else np.ones(4, dtype)
        for path, out, (g,) in all_paths(op, [x], [dy]):
            assert np.isnan(np.ravel(out)[0]) and np.isnan(g[0]), (op, path, out, g)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pow_exponent_gradient_is_nan_at_a_nan_base(import_module_text, dtype):
    """d(x^p)/dp is x^p log(x): NaN at x = NaN (it was 0: the mask ``x > 0`` is false
    at NaN), 0 for x <= 0 (docs/language.md), as JAX and PyTorch give at NaN."""
    pw = import_module_text(gradc.compile_source("op pw(x, p) -> y { y = x ^ p }",
                                                 file="pw.grad"), "gradc_test_pow_nan").pw
    x = np.array([np.nan, np.nan, 0.0, -2.0, 4.0, -np.inf], dtype)
    p = np.array([1.0, 0.0, 2.0, 3.0, 0.5, 2.0], dtype)
    for path, out, (gx, gp) in all_paths(pw, [x, p], [np.ones(6, dtype)]):
        np.testing.assert_array_equal(gp[:4], [np.nan, np.nan, 0, 0], err_msg=path)
        np.testing.assert_allclose(gp[4], 2 * np.log(4), rtol=4 * np.finfo(dtype).eps)
        assert gp[5] == 0, path


CLIP_SOURCE = """
op clip3(x, lo, hi) -> y { y = clip(x, lo, hi) }
op clip_lo(x, lo) -> y { y = clip(x, lo, 1) * 2 }
"""


@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_propagates_nan_bounds_like_np_clip(import_module_text, dtype):
    """clip(0.5, nan, 1) is NaN, as np.clip, torch.clamp and min(max(x, lo), hi) give
    (the kernels' comparisons ignored a NaN bound and gave 0.5): every CPU path, the
    IR interpreter and Dask; tests/cuda/sim checks the CUDA kernels."""
    import dask.array as da

    from gradc.frontend.check import check_source
    from gradc.ir.interpret import interpret
    from gradc.pipeline import build_program
    m = import_module_text(gradc.compile_source(CLIP_SOURCE, file="clip.grad"),
                           "gradc_test_clip_nan")
    nan = np.nan
    x = np.array([0.5, 0.5, nan, 2.0, -2.0, 0.5, 0.5], dtype)
    lo = np.array([nan, 0.0, 0.0, 0.0, 0.0, 1.0, nan], dtype)
    hi = np.array([1.0, nan, 1.0, 1.0, 1.0, 0.0, nan], dtype)
    want = np.clip(x, lo, hi)
    assert np.isnan(want[[0, 1, 2, 6]]).all()
    for path, out, _ in all_paths(m.clip3, [x, lo, hi], [np.ones(7, dtype)]):
        np.testing.assert_array_equal(out, want, err_msg=path)
        assert out.dtype == dtype, path
    for path, out, _ in all_paths(m.clip_lo, [x, nan], [np.ones(7, dtype)]):
        assert np.isnan(out).all() and out.dtype == dtype, (path, out)
    lazy = m.clip3(*(da.from_array(a, chunks=3) for a in (x, lo, hi))).compute()
    np.testing.assert_array_equal(lazy, want)
    graph = build_program(check_source(CLIP_SOURCE, "clip.grad"))["clip3"].methods["forward"].graph
    np.testing.assert_array_equal(interpret(graph, [x, lo, hi], dtype)[0], want)


FLAT_SIDES = """
op sqrt_max(x) -> y { y = sqrt(max(x, 0)) }
op sqrt_min(x) -> y { y = sqrt(-min(x, 0)) }
op sqrt_clip(x) -> y { y = sqrt(clip(x, 0, 4)) }
"""


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_infinite_cotangent_does_not_reach_the_side_max_min_and_clip_drop(
        import_module_text, dtype):
    """sqrt(max(x, 0)) at x = -2 is 0 and flat there: gradient 0, not inf * 0 = NaN
    (max, min and clip select the cotangent, as torch.maximum and torch.clamp do; JAX
    multiplies by a mask and gives NaN); the JVP agreed already.  At the tie (x = 0,
    half to each side) the derivative is truly infinite."""
    m = import_module_text(gradc.compile_source(FLAT_SIDES, file="flat.grad"),
                           "gradc_test_flat_sides")
    x = np.array([-2.0, 0.0, 4.0, 9.0], dtype)
    inf = np.inf
    for op, want in ((m.sqrt_max, [0, inf, 0.25, 1 / 6]), (m.sqrt_min, [-0.5 ** 1.5, inf, 0, 0]),
                     (m.sqrt_clip, [0, inf, 0.25, 0])):
        for path, _, (g,) in all_paths(op, [x], [np.ones(4, dtype)]):
            np.testing.assert_allclose(g, np.array(want, dtype), rtol=1e-6, err_msg=path)
        np.testing.assert_allclose(op.jvp(x, np.ones(4, dtype))[1], np.array(want, dtype),
                                   rtol=1e-6)


FLAT_EXTREMES = """
op sqrt_top(x) -> y { y = sqrt(max(x, axis=-1) - 1) }
op sqrt_bottom(x) -> y { y = sqrt(1 - min(x, axis=-1, keepdims=true)) }
"""


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_infinite_cotangent_does_not_reach_what_max_and_min_reductions_drop(
        import_module_text, dtype):
    """The max and min reductions select the cotangent for their extreme (1/k each of k
    ties) and give the other elements 0, even where the cotangent is infinite:
    sqrt(max(x) - 1) at a row whose max is 1 has gradient inf at the max and 0 elsewhere,
    where multiplying by the 0/1 tie mask gave inf * 0 = NaN.  A row whose extreme is
    NaN has no element equal to it: NaN for every element, as JAX and torch.amax give.
    The JVP selects the tangent too."""
    m = import_module_text(gradc.compile_source(FLAT_EXTREMES, file="extremes.grad"),
                           "gradc_test_flat_extremes")
    nan, inf = np.nan, np.inf
    x = np.array([[1, 0.5, -2], [5, 5, 0], [nan, 1, 2], [1, -inf, 1]], dtype)
    t = np.array([[inf, 1, inf], [1, 2, inf], [1, 1, 1], [2, inf, 4]], dtype)
    r3 = -1 / (2 * np.sqrt(3))
    cases = ((m.sqrt_top, np.ones(4, dtype), [[inf, 0, 0], [0.125, 0.125, 0], [nan] * 3,
                                              [inf, 0, inf]], [inf, 0.375, nan, inf]),
             (m.sqrt_bottom, np.ones((4, 1), dtype), [[0, 0, r3], [0, 0, -0.5], [nan] * 3,
                                                      [0, 0, 0]], [-inf, -inf, nan, nan]))
    for op, up, want, tangent in cases:
        for path, _, (g,) in all_paths(op, [x], [up]):
            np.testing.assert_allclose(g, np.array(want, dtype), rtol=1e-6, err_msg=path)
        got = op.jvp(x, t)[1].reshape(-1)
        np.testing.assert_allclose(got, np.array(tangent, dtype), rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_gradient_keeps_its_relative_accuracy_on_both_sides(import_module_text, dtype):
    """sigmoid' = e / (1 + e)^2, e = exp(-|x|), symmetric in x; ``out * (1 - out)`` was 0
    from x = 17 in float32 (and 44 % off at 17)."""
    sg = import_module_text(gradc.compile_source("op sg(x) -> y { y = sigmoid(x) }",
                                                 file="sg.grad"), "gradc_test_sigmoid_tail").sg
    x = np.array([0.0, 1.0, 5.0, 10.0, 17.0, 20.0, 30.0, 80.0, 700.0], dtype)
    x = np.concatenate([x, -x])
    e = np.exp(-np.abs(x.astype(np.float64)))
    want = (e / (1 + e) ** 2).astype(dtype)
    for path, out, (g,) in all_paths(sg, [x], [np.ones_like(x)]):
        np.testing.assert_allclose(g, want, rtol=8 * np.finfo(dtype).eps, atol=0, err_msg=path)


def test_straight_through_forward_is_exact_at_large_inputs(m):
    x = np.array([1e8, -1e8, 0.5, 0.0], np.float32)
    for path, out, (g,) in all_paths(m.sign_ste, [x], [np.ones(4, np.float32)]):
        np.testing.assert_array_equal(out, [1, -1, 1, 0])
        np.testing.assert_array_equal(g, [0, 0, 1, 1])


# Every differentiable elementwise builtin, as an expression of x alone (binary
# ones get x for both operands, so their singular points are reached).
ELEMENTWISE_EXPRS = {
    **{f: f"{f}(x)" for f in """abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt square
        reciprocal sin cos tan asin acos atan sinh cosh tanh sigmoid softplus erf erfc""".split()},
    "atan2": "atan2(x, x)", "pow": "pow(x, x)", "min": "min(x, 2 * x)", "max": "max(x, 2 * x)",
    "clip": "clip(x, -1, 1)", "add": "x + x", "sub": "x - 2 * x", "mul": "x * x",
    "div": "1 / x", "div2": "x / x", "neg": "-x", "pow_const": "x^0.5", "pow_neg": "x^-1.5",
}
EDGE_POINTS = [-np.inf, -1e30, -2.0, -1.0, -0.5, -1e-30, 0.0, 1e-30, 0.5, 1.0, 2.0, 1e30, np.inf]


NAMES = sorted(ELEMENTWISE_EXPRS)


@pytest.fixture(scope="module")
def unselected(import_module_text):
    """One op with an output per primitive (one compilation, not 35)."""
    outs = ", ".join(f"y_{n}" for n in NAMES)
    body = "\n".join(f"    y_{n} = where(x != x, {ELEMENTWISE_EXPRS[n]}, 0)" for n in NAMES)
    src = f"op unselected(x) -> ({outs}) {{\n{body}\n}}\n"
    return import_module_text(gradc.compile_source(src, file="unselected.grad"),
                              "gradc_test_unselected").unselected


# Compiling the 35-output op is the cost (about 8 s a method and dtype): float64 runs
# every path, value and gradients, fused and unfused; float32 the fused vjp, where
# its math library's inf and NaN at the edge points meet the masks (fwd_bwd's kernel
# masks its gradients with the same code: float64 runs it).  The unfused gradients
# are the same masks in the kernels of one primitive each, which
# test_where_does_not_leak_the_unselected_branch runs in float32 too.
UNSELECTED_PATHS = [(np.float64, "fused", True), (np.float64, "unfused", True),
                    (np.float32, "fused", False)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, impl, value", UNSELECTED_PATHS,
                         ids=[f"{np.dtype(d).name}-{i}" for d, i, _ in UNSELECTED_PATHS])
def test_unselected_branch_never_leaks_for_any_primitive(unselected, dtype, impl, value):
    """``where(never, f(x), 0)`` has value 0 and gradient 0 at every non-NaN x,
    even where f or f' is inf or NaN (the singular points of every domain).
    Each output's gradient is isolated by a one-hot choice of upstreams."""
    x = np.array(EDGE_POINTS, dtype)
    zero = np.zeros_like(x)
    impl = unselected if impl == "fused" else unselected.unfused
    if value:
        for y in impl(x):
            np.testing.assert_array_equal(y, zero)
    for k, name in enumerate(NAMES):
        ups = [np.ones_like(x) if j == k else zero for j in range(len(NAMES))]
        (g,) = impl.vjp(x, *ups)
        both = [g, impl.fwd_bwd(x, *ups)[-1]] if dtype == np.float64 else [g]
        for got in both:
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, zero, err_msg=f"{name}: {impl}")
