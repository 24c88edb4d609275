"""The JAX adapter (gradc.adapters.jax): every op of the spec examples through
``jax.test_util.check_grads``, orders 1 and 2, reverse mode (``custom_vjp``) and
forward mode (``custom_jvp``) where the op has one; under ``jax.jit`` and
``jax.vmap``; float32 and float64; the custom rules, jit, vmap and dtypes with
both lowerings (``jax.numpy`` fused by XLA, and gradc's kernels in callbacks),
which must agree with each other and with the module's own methods.

Ops whose custom rule is not the derivative (custom_linear, sign_ste,
clipped_relu, scaled_tanh, and mlp, whose hidden layer is scaled_tanh) fail
``check_grads`` of the op by design.  For them: the adapter's VJP and JVP equal
the op's own ``vjp`` and ``jvp``, and ``check_grads`` of those derivative
functions (order 1) checks their derivatives, the second order, against finite
differences of the rule itself.
"""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.test_util import check_grads

import gradc
from gradc.adapters.jax import as_jax
from gradc.frontend.check import check_source

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RNG = np.random.default_rng(8)


@pytest.fixture(scope="module")
def seed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradc.GradcWarning)   # W405 of two ops
        return gradc.load(EXAMPLES / "seed.grad")


# seed64, act64: the float64 twins of the examples (tests/adapters/conftest.py)


@pytest.fixture(scope="module")
def act():
    return gradc.load(EXAMPLES / "activations.grad")


@pytest.fixture(params=["xla", "kernels"])
def lowering(request):
    return request.param


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def away(shape, lo=0.2, hi=1.8):
    """Random values with |x| in [lo, hi]: away from the kinks at 0 and 1 (huber, relu)."""
    mag = RNG.uniform(lo, hi, shape)
    mag = np.where(np.abs(mag - 1) < 0.1, mag + 0.25, mag)
    return mag * RNG.choice([-1.0, 1.0], shape)


def onehot(b, o):
    return np.eye(o)[RNG.integers(0, o, b)]


# op -> (positional arguments: a shape, or a constant array closed over; keywords)
TRUE_DERIVATIVE = {
    "softplus_stable": ([(5,)], {}),
    "gelu_tanh": ([(5,)], {}),
    "swish": ([(5,)], {}),
    "huber": ([(5,)], {"delta": 1.0}),
    "log_sigmoid": ([(5,)], {}),
    "leaky_relu": ([(5,)], {"alpha": 0.2}),
    "add_bias": ([(3, 4), (4,)], {}),
    "softmax_xent": ([(3, 4), onehot(3, 4)], {}),        # onehot: nograd
    "critic": ([(3, 4), (4,)], {}),
    "gradient_penalty": ([(3, 4), (3, 4), RNG.uniform(0, 1, (3, 1)), (4,)], {}),  # alpha
}


def _of_differentiable(f, spec, kw):
    """``f`` of its shaped arguments only, the constant ones closed over."""
    def g(*xs):
        it = iter(xs)
        return f(*(next(it) if isinstance(a, tuple) else jnp.asarray(a) for a in spec), **kw)
    return g


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRUE_DERIVATIVE))
def test_check_grads_true_derivatives(name, seed64, act64, x64):
    op = seed64.OPS.get(name) or act64.OPS[name]
    spec, kw = TRUE_DERIVATIVE[name]
    xs = [jnp.asarray(away(s)) for s in spec if isinstance(s, tuple)]
    check_grads(_of_differentiable(as_jax(op), spec, kw), xs, order=2, modes=["rev"])
    check_grads(_of_differentiable(as_jax(op, mode="fwd"), spec, kw), xs, order=2,
                modes=["fwd"])


CUSTOM = {"custom_linear": [(5,)], "sign_ste": [(5,)], "clipped_relu": [(5,)],
          "scaled_tanh": [(5,)], "mlp": [(3, 4), (4, 6), (6,), (6, 2), (2,)]}


def jax_reference(module, name):
    """The op written in JAX from gradc's IR, each custom rule a jax.custom_vjp
    (gradc.tools.bench_frameworks): JAX's own semantics for the second order."""
    from gradc.adapters.framework_lowering import jax_framework
    from gradc.pipeline import build_op
    from gradc.tools.bench_frameworks import forward_function
    program = check_source(module.__gradc_origin__.text, module.__gradc_origin__.file)
    cop = build_op(program.ops[name], program.ops, program.consts)
    f = forward_function(cop, jax_framework(), np.float64)
    return lambda *xs: f(*xs)[0]


def per_argument_vjp(f, k, args):
    """The VJP of ``f`` with respect to its ``k``-th argument alone, at ``args[:-1]``
    and the cotangent ``args[-1]`` (what ``jax.grad(f, argnums=k)`` differentiates)."""
    xs, u = args[:-1], args[-1]
    fk = lambda xk: f(*xs[:k], xk, *xs[k + 1:])     # noqa: E731
    return jax.vjp(fk, xs[k])[1](u)[0]


def _dot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(CUSTOM))
def test_custom_rules_match_the_ops_methods_and_jax_semantics(name, seed64, x64, lowering):
    op = seed64.OPS[name]
    xs = tuple(jnp.asarray(away(s)) for s in CUSTOM[name])
    f = as_jax(op, lowering=lowering)
    y, pull = jax.vjp(f, *xs)
    u = jnp.asarray(RNG.standard_normal(np.shape(y)))
    np.testing.assert_allclose(y, op(*map(np.asarray, xs)), rtol=1e-12)
    for got, want in zip(pull(u), op.vjp(*map(np.asarray, xs), np.asarray(u))):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    # second order, reverse over reverse: as JAX differentiates its own custom_vjp
    # when each parameter's gradient is taken on its own (gradc's grad() semantics)
    ref = jax_reference(seed64, name)
    ws = tuple(jnp.asarray(RNG.standard_normal(x.shape)) for x in xs)
    adapter_vjp = lambda *a: jax.vjp(f, *a[:-1])[1](a[-1])         # noqa: E731
    got = jax.vjp(adapter_vjp, *xs, u)[1](ws)
    for k in range(len(xs)):
        want = jax.vjp(lambda *a: per_argument_vjp(ref, k, a), *xs, u)[1](ws[k])
        got = tuple(g - w for g, w in zip(got, want))
    for residue in got:
        np.testing.assert_allclose(residue, 0, atol=1e-10)
    if name in ("custom_linear", "clipped_relu"):        # rules not linear in dy: no jvp
        with pytest.raises(NotImplementedError, match=r"E405.*no forward mode"):
            as_jax(op, mode="fwd")
        return
    g = as_jax(op, mode="fwd", lowering=lowering)
    ts = tuple(jnp.asarray(RNG.standard_normal(x.shape)) for x in xs)
    y_t = jax.jvp(g, xs, ts)[1]
    np.testing.assert_allclose(y_t, op.jvp(*map(np.asarray, xs + ts))[1], rtol=1e-12,
                               atol=1e-15)
    # forward over forward, against reverse over reverse of JAX's own:
    # <u, d/ds J(x + s r) t> = <d/dx <J(x)^T u, t>, r>
    r = tuple(jnp.asarray(RNG.standard_normal(x.shape)) for x in xs)
    fwd2 = jax.jvp(lambda *a: jax.jvp(g, a, ts)[1], xs, r)[1]
    rev2 = sum(_dot(jax.grad(lambda *a: jnp.vdot(per_argument_vjp(ref, k, (*a, u)), ts[k]),
                             argnums=tuple(range(len(xs))))(*xs), r) for k in range(len(xs)))
    np.testing.assert_allclose(jnp.vdot(u, fwd2), rev2, rtol=1e-10)


def test_second_derivative_of_scaled_tanh_is_the_rule_differentiated(seed, x64, lowering):
    """docs/second_order.md: d/dx [0.5 (1 - tanh(x)^2)] = -y (1 - y^2), as JAX's own
    custom_vjp (fwd saving y) gives; in both modes (forward mode under jax.jit); the
    third derivative too (a derived op of a derived op)."""
    x = jnp.asarray([0.7, -1.3, 0.0])
    y = np.tanh(np.asarray(x))
    want = -y * (1 - y ** 2)
    f = as_jax(seed.scaled_tanh, lowering=lowering)
    rev = jax.grad(lambda x: jax.grad(lambda x: f(x).sum())(x).sum())(x)
    np.testing.assert_allclose(rev, want, rtol=1e-12)
    g = as_jax(seed.scaled_tanh, mode="fwd", lowering=lowering)
    one = jnp.ones(3)
    tangent = lambda x: jax.jvp(g, (x,), (one,))[1]             # noqa: E731
    fwd = jax.jit(lambda x: jax.jvp(tangent, (x,), (one,))[1])(x)
    np.testing.assert_allclose(fwd, want, rtol=1e-12)
    np.testing.assert_allclose(float(want[0]), -0.38362, atol=1e-5)
    d2 = jax.grad(lambda x: jax.grad(lambda x: f(x).sum())(x).sum())
    np.testing.assert_allclose(jax.grad(lambda x: d2(x).sum())(x),
                               -(1 - y ** 2) * (1 - 3 * y ** 2), rtol=1e-10)


SCALED = "op scaled(x, s: nograd = 2.0) -> y {\n    y = s * x^3 + sin(x)\n}\n"


def test_third_order_of_an_op_with_a_default(tmp_path, x64):
    """A derived op of a derived op passes the defaulted parameter by keyword after
    the positional ones (its text once read ``scaled__vjp(x, s=s, dy)``: E103)."""
    (tmp_path / "scaled.grad").write_text(SCALED)
    module = gradc.load(tmp_path / "scaled.grad")
    x = 0.7
    for mode, d in (("rev", jax.grad), ("fwd", jax.jacfwd)):
        f = as_jax(module.scaled, mode=mode)
        assert float(d(d(d(f)))(x)) == pytest.approx(2 * 6 - np.cos(x), rel=1e-12)
        assert float(d(d(d(lambda x: f(x, s=3.0))))(x)) == pytest.approx(3 * 6 - np.cos(x),
                                                                          rel=1e-12)
    # reverse mode has three orders (scaled__vjp__vjp has 2 outputs: x's and dy's)
    d3 = jax.grad(jax.grad(jax.grad(as_jax(module.scaled))))
    with pytest.raises(NotImplementedError, match=r"scaled__vjp__vjp: its vjp cannot be "
                                                  r"differentiated: the op has 2 outputs"):
        jax.grad(d3)(x)



SOFTMAXES = """op row_softmax(x) -> y { y = softmax(x, axis=-1) }
op row_log_softmax(x) -> y { y = log_softmax(x, axis=-1) }
"""


@pytest.mark.parametrize("lowering", ["xla", "kernels"])
def test_softmax_of_an_empty_axis_is_empty_and_all_minus_inf_rows_match(tmp_path, lowering):
    """softmax's shift is max(x, initial=-inf): the XLA lowering passes the initial on
    (jnp.max of an empty axis raised 'zero-size array to reduction operation max'),
    as jax.nn.softmax; rows of -inf and NaN give the module's values."""
    (tmp_path / "sm.grad").write_text(SOFTMAXES)
    module = gradc.load(tmp_path / "sm.grad")
    rows = np.array([[1.0, 2.0, -np.inf], [-np.inf] * 3, [np.nan, 1.0, 2.0]], np.float32)
    for op in (module.row_softmax, module.row_log_softmax):
        f = as_jax(op, lowering=lowering)
        empty = jnp.zeros((2, 0), jnp.float32)
        for call in (f, jax.jit(f), jax.grad(lambda x: f(x).sum())):
            assert call(empty).shape == (2, 0)
        np.testing.assert_allclose(np.asarray(f(jnp.asarray(rows))), op(rows), rtol=1e-6)

ST = """op st(x) -> y {
    y = tanh(x)
}
grad(dy) -> dx {
    dx = dy * (1 - y^2) * 0.5
}
op st_d2(x) -> h {
    h = grad(sum(grad(sum(st(x)^2), x)), x)
}
"""


def test_second_order_of_a_loss_nonlinear_in_the_output_goes_through_the_forward_body(
        tmp_path, x64):
    """d/dx rule(x, dy = 2 st(x)): JAX differentiates fwd's primal output through the
    forward body (tanh), not through the rule again; so does gradc's grad(), and so
    must as_jax (its fwd returns the op without its grad block, derived.primal)."""
    (tmp_path / "st.grad").write_text(ST)
    m = gradc.load(tmp_path / "st.grad")
    x = jnp.asarray([0.3, 0.7, -1.2])
    f = as_jax(m.st)
    gx = jax.grad(lambda x: (f(x) ** 2).sum())
    got = jax.grad(lambda x: gx(x).sum())(x)
    y = np.tanh(np.asarray(x))
    s = 1 - y ** 2              # d/dx [y s]: y' through tanh (s), s' = -2 y s
    np.testing.assert_allclose(got, s * (s - 2 * y ** 2), rtol=1e-12)   # [0.682, -0.0608, ...]
    np.testing.assert_allclose(got, m.st_d2(np.asarray(x)), rtol=1e-12)

    @jax.custom_vjp
    def st(x):
        return jnp.tanh(x)

    st.defvjp(lambda x: (jnp.tanh(x), x),
              lambda x, dy: (dy * (1 - jnp.tanh(x) ** 2) * 0.5,))
    want = jax.grad(lambda x: jax.grad(lambda x: (st(x) ** 2).sum())(x).sum())(x)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # the first derivative is still the rule's
    np.testing.assert_allclose(gx(x), 2 * np.tanh(x) * (1 - np.tanh(x) ** 2) * 0.5,
                               rtol=1e-12)


@pytest.mark.parametrize("name", ["custom_linear", "sign_ste", "clipped_relu",
                                  "scaled_tanh"])
def test_hessian_vector_products_of_nonlinear_losses_match_jax_custom_vjp(name, seed64, x64):
    """H v of sum(w * sin(f(x))) through as_jax equals JAX's own custom_vjp version
    of the op (jax_reference), for every seed op with a custom rule."""
    x = jnp.asarray(away((5,)))
    w, v = (jnp.asarray(RNG.standard_normal(5)) for _ in range(2))
    ref, f = jax_reference(seed64, name), as_jax(seed64.OPS[name])

    def hvp(g):
        grad = jax.grad(lambda x: (w * jnp.sin(g(x))).sum())
        return jax.grad(lambda x: jnp.vdot(grad(x), v))(x)

    np.testing.assert_allclose(hvp(f), hvp(ref), rtol=1e-10, atol=1e-12)


NAN_SAFE = """op xent(x: [n, c], t: i64[n]) -> loss {
    loss = mean(logsumexp(x, axis=-1) - x[arange(n), t])
}
op soft(x) -> y {
    y = softmax(x, axis=-1) * sqrt(x * x + 1)
}
op ratio(x, z) -> y {
    y = log(x * x + 1) / (z * z + 1) + exp(x) * sigmoid(z)
}
"""


def test_reverse_mode_over_forward_mode_of_nan_safe_products(tmp_path, x64):
    """jax.jacrev of a mode="fwd" function (JAX transposes its rule's jax.numpy code)
    equals the mode="rev" one's for ops whose JVP keeps 0 * inf at 0 (logsumexp,
    softmax, sqrt, log, a quotient, exp: gradc's zero_masked, whose test of the
    tangent JAX cannot transpose: it failed with an AssertionError in JAX's select
    transpose rule; the rule's products are plain ones)."""
    (tmp_path / "nan_safe.grad").write_text(NAN_SAFE)
    module = gradc.load(tmp_path / "nan_safe.grad")
    x, z = (jnp.asarray(RNG.standard_normal((2, 3))) for _ in range(2))
    t = jnp.asarray([0, 2])
    for name, args in (("xent", (x, t)), ("soft", (x,)), ("ratio", (x, z))):
        fwd, rev = (as_jax(module.OPS[name], mode=m) for m in ("fwd", "rev"))
        wrt = tuple(i for i, a in enumerate(args) if a.dtype.kind == "f")
        got = jax.jacrev(fwd, argnums=wrt)(*args)
        want = jax.jacrev(rev, argnums=wrt)(*args)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


NORM_MEAN = """
op rnorm(x) -> y { y = norm(x, axis=-1) }
op unit(x) -> y { y = x / norm(x, axis=-1, keepdims=true) }
op mn(x) -> y { y = mean(x^3) }
"""


def test_xla_lowering_scales_norm_and_keeps_means_1_over_n_in_float64(tmp_path, x64):
    """The "xla" lowering agrees with the module's kernels where a naive one does not:
    ``norm`` of float32 values near 1e20 and 1e-25 (whose squares overflow or vanish:
    it gave inf and 0, gradients 0), and ``mean``'s 1/3 in a float64 gradient (it was
    float32's 1/3: a relative error of 1e-8)."""
    (tmp_path / "nm.grad").write_text(NORM_MEAN)
    module = gradc.load(tmp_path / "nm.grad")
    x = np.array([[3e20, 4e20], [3e-25, 4e-25], [0, 0], [np.inf, 1]], np.float32)
    for name in ("rnorm", "unit"):
        op = getattr(module, name)
        with np.errstate(all="ignore"):
            want, up = op(x), np.ones(op(x).shape, np.float32)
            grad = op.vjp(x, up)[0]
        f = as_jax(op)
        np.testing.assert_allclose(f(jnp.asarray(x)), want, rtol=1e-6)
        got = jax.vjp(f, jnp.asarray(x))[1](jnp.asarray(up))[0]
        np.testing.assert_allclose(got[:2], grad[:2], rtol=1e-6)
    v = jnp.asarray([0.3, -1.1, 2.0])
    np.testing.assert_allclose(jax.grad(as_jax(module.mn))(v), v ** 2, rtol=1e-15)


TYPED = "op typed(x: f32[n], k: i32, m: bool[n]) -> y {\n    y = where(m, x * k, 0)\n}\n"


def test_python_numbers_for_integer_parameters_take_their_dtype(tmp_path, x64):
    """Under x64 a Python int is int64 to JAX: for an i32 parameter it is made int32;
    a float or an int out of range is the module's TypeError or OverflowError."""
    (tmp_path / "typed.grad").write_text(TYPED)
    f = as_jax(gradc.load(tmp_path / "typed.grad").typed)
    x, m = jnp.ones(3, jnp.float32), jnp.asarray([True, False, True])
    np.testing.assert_array_equal(f(x, 3, m), [3, 0, 3])
    with pytest.raises(TypeError, match="typed: argument 'k' must be int32, got float"):
        f(x, 2.5, m)
    with pytest.raises(OverflowError, match="'k' = 1099511627776 does not fit int32"):
        f(x, 2 ** 40, m)


def test_a_python_int_for_a_float_parameter_is_a_float(tmp_path, x64):
    """The module takes ``sq(3)`` as ``sq(3.0)``; so does the adapter (JAX alone would
    make 3 an int32 array, which the module rejects)."""
    (tmp_path / "sq.grad").write_text("op sq(x) -> y {\n    y = x * x\n}\n"
                                      "op sq32(x: f32) -> y {\n    y = x * x\n}\n")
    module = gradc.load(tmp_path / "sq.grad")
    sq, sq32 = as_jax(module.sq), as_jax(module.sq32)
    assert float(sq(3)) == 9.0 == float(module.sq(3))
    assert sq(3).dtype == jnp.float64                # under x64: a Python float's dtype
    assert sq32(3).dtype == jnp.float32 and float(sq32(3)) == 9.0
    with pytest.raises(TypeError, match="must be a floating-point array .*got int32"):
        sq(jnp.asarray([1, 2], jnp.int32))          # an int array stays an error


def _mlp_args(dtype):
    shapes = [(8, 4), (4, 6), (6,), (6, 3), (3,)]
    return [jnp.asarray(RNG.standard_normal(s), dtype) for s in shapes]


def test_jit_float32(seed, lowering):
    """A loss of softmax_xent(mlp(...)) under jax.jit: values and gradients are the
    module's own (float32 in, float32 out)."""
    mlp, xent = (as_jax(seed.mlp, lowering=lowering),
                 as_jax(seed.softmax_xent, lowering=lowering))
    args = _mlp_args(jnp.float32)
    oh = jnp.asarray(onehot(8, 3), jnp.float32)

    def loss(w1, b1, w2, b2):
        return xent(mlp(args[0], w1, b1, w2, b2), oh)

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(*args[1:])
    assert value.dtype == jnp.float32 and all(g.dtype == jnp.float32 for g in grads)
    np_args = [np.asarray(a) for a in args]
    logits = seed.mlp(*np_args)
    assert float(value) == pytest.approx(float(seed.softmax_xent(logits, np.asarray(oh))),
                                         rel=1e-6)
    (dlogits,) = seed.softmax_xent.vjp(logits, np.asarray(oh), 1.0)
    want = seed.mlp.vjp(*np_args, dlogits)[1:]
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_float16_and_float64_dtypes(act, x64, lowering):
    f = as_jax(act.swish, lowering=lowering)
    for dt in (jnp.float16, jnp.float32, jnp.float64):
        x = jnp.asarray([-1.0, 0.5, 2.0], dt)
        y, dx = jax.jit(jax.value_and_grad(lambda x: f(x).sum()))(x)
        assert y.dtype == dt and dx.dtype == dt
        np.testing.assert_allclose(dx, act.swish.vjp(np.asarray(x), np.ones(3, dt))[0],
                                   rtol=1e-3 if dt == jnp.float16 else 1e-6)


def test_each_gradient_in_its_primal_dtype(tmp_path, x64, lowering):
    """Mixed dtypes: the op computes in the widest (float32 for a float16 x beside a
    float32 b), and each gradient comes back in its own primal's dtype, as JAX's are
    (the XLA lowering gave x's in float32; found by helper 51)."""
    path = tmp_path / "bias.grad"
    path.write_text("op add_bias(x, b) -> y {\n    y = x + b\n}\n")
    f = as_jax(gradc.load(path).add_bias, lowering=lowering)
    for dx_t, db_t in ((jnp.float16, jnp.float32), (jnp.float32, jnp.float64)):
        x, b = jnp.asarray([[-1.0, 0.5, 2.0]], dx_t), jnp.asarray([0.25, 0.0, -1.0], db_t)
        loss = lambda x, b: (f(x, b) ** 2).sum()                        # noqa: E731
        for grad in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
            dx, db = grad(x, b)
            assert (dx.dtype, db.dtype) == (dx_t, db_t)
            want = 2 * (np.asarray(x, np.float64) + np.asarray(b, np.float64))
            np.testing.assert_allclose(dx, want, rtol=2e-3)
            np.testing.assert_allclose(db, want.sum(0), rtol=2e-3)


def test_vmap_elementwise_aligns_ranks_and_keeps_gradients_per_example(tmp_path, lowering):
    """An elementwise op runs once for the batch; a gradient of an unbatched input
    stays per example (not summed over the batch); an (n,) input meets an (m, n)
    one as NumPy broadcasting says, not against the batch dim."""
    path = tmp_path / "ew.grad"
    path.write_text("op mul_add(x, y) -> z {\n    z = x * y + sin(x)\n}\n")
    m = gradc.load(path)
    f = as_jax(m.mul_add, lowering=lowering)
    xs = jnp.asarray(RNG.standard_normal((5, 3)), jnp.float32)     # batch of (3,)
    y = jnp.asarray(RNG.standard_normal((2, 3)), jnp.float32)      # one (2, 3), unbatched
    out = jax.vmap(f, in_axes=(0, None))(xs, y)
    assert out.shape == (5, 2, 3)
    for k in range(5):
        np.testing.assert_allclose(out[k], m.mul_add(np.asarray(xs[k]), np.asarray(y)),
                                   rtol=1e-5, atol=1e-6)     # float32: XLA's sin, gradc's
    gy = jax.vmap(jax.grad(lambda x, y: f(x, y).sum(), argnums=1), in_axes=(0, None))(xs, y)
    assert gy.shape == (5, 2, 3)
    for k in range(5):
        np.testing.assert_allclose(gy[k], np.broadcast_to(np.asarray(xs[k]), (2, 3)), rtol=1e-6)
    gx = jax.vmap(jax.grad(lambda x, y: f(x, y).sum()), in_axes=(0, None))(xs, y)
    want = np.asarray(y).sum(axis=0) + 2 * np.cos(np.asarray(xs))
    np.testing.assert_allclose(gx, want, rtol=1e-5)


def test_vmap_of_an_op_with_annotated_shapes(seed, lowering):
    """Each example sees the shapes the op was written for (with kernels: one call
    per example)."""
    mlp = as_jax(seed.mlp, lowering=lowering)
    args = _mlp_args(jnp.float32)
    batch = jnp.stack([args[0], 2 * args[0]])
    out = jax.jit(jax.vmap(mlp, in_axes=(0, None, None, None, None)))(batch, *args[1:])
    np_args = [np.asarray(a) for a in args]
    np.testing.assert_allclose(out[1], seed.mlp(2 * np_args[0], *np_args[1:]), rtol=1e-5,
                               atol=1e-6)                    # float32 matmuls: XLA's, gradc's
    grads = jax.vmap(jax.grad(lambda x, *w: mlp(x, *w).sum(), argnums=1),
                     in_axes=(0, None, None, None, None))(batch, *args[1:])
    assert grads.shape == (2, 4, 6)
    dl = np.ones((8, 3), np.float32)
    np.testing.assert_allclose(grads[1], seed.mlp.vjp(2 * np_args[0], *np_args[1:], dl)[1],
                               rtol=1e-5, atol=1e-6)


def test_errors(seed, act, seed64):
    x = jnp.ones((8, 4), jnp.float32)
    mlp = as_jax(seed.mlp)
    args = _mlp_args(jnp.float32)
    with pytest.raises(TypeError, match=r"mlp: argument 'x' must be float32, got int32 "
                                        r"\(convert with .astype\(jnp.float32\)\)$"):
        mlp(jnp.ones((8, 4), jnp.int32), *args[1:])
    with jax.enable_x64(False), pytest.raises(TypeError, match=(
            r"mlp: argument 'x' must be float64, got float32 \(convert with .astype\(jnp."
            r"float64\); 64-bit arrays need jax.config.update\('jax_enable_x64', True\)\)")):
        as_jax(seed64.mlp)(*args)
    with pytest.raises(ValueError, match=r"mlp: dim 'i' is 4 in argument 'x' but 5 in "
                                         r"argument 'w1' \(shape \(5, 6\)\)"):
        mlp(x, jnp.ones((5, 6), jnp.float32), *args[2:])
    with pytest.raises(TypeError, match=r"takes 5 positional argument\(s\)"):
        mlp(x)
    # third order needs a derived op of mlp__vjp, which has 5 outputs: refused at trace
    d2 = jax.grad(lambda w2: jax.grad(lambda w2: mlp(*args[:3], w2, args[4]).sum())(w2).sum())
    with pytest.raises(NotImplementedError, match=r"mlp__vjp: its vjp cannot be differentiated: "
                                                  r"the op has 5 outputs"):
        jax.grad(lambda w2: d2(w2).sum())(args[3])
    leaky = as_jax(act.leaky_relu)
    with pytest.raises(TypeError, match=r"takes 1 positional argument\(s\) \(x\), got 2: alpha "
                                        r"is keyword-only.*leaky_relu\(\.\.\., alpha=\.\.\.\)"):
        leaky(jnp.ones(3), 0.3)
    with pytest.raises(TypeError, match=r"keyword parameter 'alpha' is static"):
        jax.jit(lambda a: leaky(jnp.ones(3), alpha=a))(0.3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'beta'"):
        leaky(jnp.ones(3), beta=1.0)
    for bad, kind in (("a", "str"), (None, "NoneType"), (1j, "complex")):
        with pytest.raises(TypeError, match=rf"keyword parameter 'alpha' must be a real "
                                            rf"number, got {kind}"):
            leaky(jnp.ones(3), alpha=bad)
    with pytest.raises(ValueError, match=r"mode must be"):
        as_jax(act.swish, mode="both")
    with pytest.raises(ValueError, match=r"lowering must be 'xla' or 'kernels', got 'numba'"):
        as_jax(act.swish, lowering="numba")
    with pytest.raises(ValueError, match=r"add_bias: dim 'k' is 3 in argument 'x' but 4"):
        as_jax(act.add_bias)(jnp.ones((2, 3), jnp.float32), jnp.ones(4, jnp.float32))
    # the keyword is static: a different alpha traces a different function
    g = jax.grad(lambda x: leaky(x, alpha=0.25).sum())(-jnp.ones(3))
    np.testing.assert_allclose(g, 0.25)


@pytest.fixture(scope="module")
def arrays():
    return gradc.load(EXAMPLES / "arrays.grad")


def _frozen(*arrays):
    """Read-only float32 copies: the arrays a callback gets, so the module's kernels
    compiled for the comparison are the ones the adapter's callbacks run."""
    out = [np.array(a, np.float32) for a in arrays]
    for a in out:
        a.flags.writeable = False
    return out


def test_seed_gives_the_modules_mask_to_every_derivative(arrays, lowering):
    """arrays.grad's dropout: seed= draws the module's numbers at that seed in the
    forward, the VJP (bwd reads the forward's seed) and the JVP; another seed draws
    another mask."""
    x, dy = _frozen(np.linspace(0.1, 2.0, 64), np.linspace(-1.0, 1.0, 64))
    drop = as_jax(arrays.dropout, lowering=lowering)
    fwd = as_jax(arrays.dropout, lowering=lowering, mode="fwd")

    @jax.jit                    # one XLA compile, not one per operation of the draw
    def run(x, dy):
        y, vjp = jax.vjp(lambda x: drop(x, p=0.3, seed=5), x)
        _, t = jax.jvp(lambda x: fwd(x, p=0.3, seed=5), (x,), (dy,))
        return y, vjp(dy)[0], t, drop(x, p=0.3, seed=6)

    y, dx, t, y6 = run(x, dy)
    want = arrays.dropout(x, p=0.3, seed=5)
    np.testing.assert_array_equal(y != 0, want != 0)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(dx != 0, y != 0)
    np.testing.assert_allclose(dx, arrays.dropout.vjp(x, dy, p=0.3, seed=5)[0], rtol=1e-6, atol=0)
    np.testing.assert_allclose(t, arrays.dropout.jvp(x, dy, p=0.3, seed=5)[1], rtol=1e-6, atol=0)
    assert not np.array_equal(y6 != 0, y != 0)


def test_a_traced_seed_draws_per_call_without_retracing(arrays, lowering):
    """Under jax.jit the seed is an argument: one trace, a mask per seed, the module's."""
    x, dy = _frozen(np.linspace(0.1, 2.0, 64), np.ones(64))
    drop = as_jax(arrays.dropout, lowering=lowering)
    traces = []

    @jax.jit
    def step(x, seed):
        traces.append(seed)
        y, vjp = jax.vjp(lambda x: drop(x, seed=seed), x)
        return y, vjp(dy)[0]

    masks = []
    for s in (5, 6, -5):
        y, dx = step(x, jnp.int32(s))
        np.testing.assert_array_equal(y != 0, arrays.dropout(x, seed=s) != 0)
        np.testing.assert_array_equal(dx, np.where(y != 0, 2.0, 0.0))
        masks.append(np.asarray(y) != 0)
    assert len(traces) == 1 and not np.array_equal(masks[0], masks[1])


def test_seed_as_a_jax_random_key(arrays, x64):
    """An int, an integer array and a key make the same 64-bit seed (key(s) draws as
    seed=s), so split keys thread through jit and vmap as in JAX's own code."""
    from gradc.adapters.jax import _seed_words
    for s in (7, 2**40 + 3, -5):
        want = [s % 2**32, s % 2**64 >> 32]
        for seed in (s, np.int64(s), jnp.int64(s), jax.random.key(s), jax.random.PRNGKey(s)):
            assert np.asarray(_seed_words("f", seed)).tolist() == want
    with jax.enable_x64(False):
        assert np.asarray(_seed_words("f", jnp.int32(-5))).tolist() == [2**32 - 5, 2**32 - 1]
    (x,) = _frozen(np.linspace(0.1, 2.0, 32))
    drop = jax.jit(lambda seed: as_jax(arrays.dropout)(x, seed=seed))
    for s in (7, 2**40 + 3, -5):
        np.testing.assert_array_equal(drop(jax.random.key(s)) != 0, arrays.dropout(x, seed=s) != 0)
    keys = jax.random.split(jax.random.key(0), 4)
    ys = jax.jit(jax.vmap(drop))(keys)
    np.testing.assert_array_equal(ys[2], drop(keys[2]))
    assert len({tuple(np.asarray(y) != 0) for y in ys}) == 4


def test_seed_reaches_the_second_order(arrays):
    """jax.grad of jax.grad of sum(dropout(x)^2): the derived ops (the VJP of the
    VJP) draw the forward's mask, 2 keep / (1 - p)^2."""
    (x,) = _frozen(np.linspace(0.1, 2.0, 16))
    drop = as_jax(arrays.dropout)
    d2 = jax.jit(jax.grad(lambda x: jax.grad(lambda x: (drop(x, seed=3) ** 2).sum())(x).sum()))
    np.testing.assert_allclose(d2(x), np.where(drop(x, seed=3) != 0, 8.0, 0.0), rtol=1e-6)


def test_seed_errors(arrays):
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(TypeError, match=r"dropout: seed= is required: the op draws"):
        as_jax(arrays.dropout)(x)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'seed'"):
        as_jax(arrays.softplus)(x, seed=1)              # an op that does not draw
    for bad in (1.5, True, jnp.ones(2), jnp.array([1, 2, 3]), jax.random.key(0, impl="rbg")):
        with pytest.raises(TypeError, match=r"dropout: seed= must be an int, an integer "):
            as_jax(arrays.dropout)(x, seed=bad)


def test_shapes_that_do_not_broadcast_are_the_ops_value_error(tmp_path, lowering):
    (tmp_path / "gated.grad").write_text("op gated(x, g) -> y {\n    y = x * sigmoid(g)\n}\n")
    f = as_jax(gradc.load(tmp_path / "gated.grad").gated, lowering=lowering)
    with pytest.raises(ValueError, match=r"^gated: arguments of shapes \[\(3,\), \(4,\)\] "
                                         r"do not fit"):
        f(jnp.ones(3, jnp.float32), jnp.ones(4, jnp.float32))
    with pytest.raises(ValueError, match=r"do not fit"):
        jax.jit(f)(jnp.ones(3, jnp.float32), jnp.ones(4, jnp.float32))


GATHERS = """op xent(logits: [n, k], labels: i64[n]) -> loss {
    loss = mean(logsumexp(logits, axis=-1) - logits[arange(n), labels])
}
op xent_along(logits: [n, k], labels: i64[n]) -> loss {
    picked = take_along_axis(logits, expand_dims(labels, -1), axis=-1)
    loss = mean(logsumexp(logits, axis=-1, keepdims=true) - picked)
}
op rows(x: [n, k], idx: i64[m]) -> y {
    y = take(x, idx, axis=0)
}
"""


@pytest.mark.parametrize("labels", [[0, -1, 2, 4], [0, 5, -7, 1], [0, -100, 2, 1]],
                         ids=["in-range", "out-of-range", "minus-100"])
def test_xla_gathers_by_labels_out_of_range_stay_in_their_axis(tmp_path, x64, labels):
    """Inside jax.jit nothing can raise (the module's IndexError): an integer-array index
    out of range is clamped into its own axis, as JAX's ``x[idx]`` reads it, never another
    row's element, its gradient going to the element read; ``take`` and
    ``take_along_axis`` read JAX's fill value (NaN), their gradient dropped, as
    ``jnp.take`` and ``jnp.take_along_axis``.  Negative indices in [-n, 0) count from
    the end."""
    (tmp_path / "gathers.grad").write_text(GATHERS)
    m = gradc.load(tmp_path / "gathers.grad")
    x = jnp.asarray(np.random.default_rng(27).standard_normal((4, 5)))
    lab, rows = jnp.asarray(labels), jnp.arange(4)
    lse = lambda v: jax.nn.logsumexp(v, axis=-1)
    clamped = jnp.clip(jnp.where(lab < 0, lab + 5, lab), 0, 4)
    refs = {"xent": lambda v, i: jnp.mean(lse(v) - v[rows, clamped]),
            "xent_along": lambda v, i: jnp.mean(
                lse(v) - jnp.take_along_axis(v, i[:, None], axis=-1)[:, 0]),
            "rows": lambda v, i: jnp.take(v, i, axis=0)}
    w = jnp.asarray(np.random.default_rng(3).standard_normal((4, 5)))
    for name, ref in refs.items():
        f = as_jax(getattr(m, name))
        loss = (lambda g: lambda v, i: jnp.nansum(g(v, i) * w)) if name == "rows" else \
            (lambda g: g)
        got = jax.jit(jax.value_and_grad(loss(f)))(x, lab)
        want = jax.value_and_grad(loss(ref))(x, lab)
        np.testing.assert_allclose(jax.jit(f)(x, lab), ref(x, lab), rtol=1e-12, err_msg=name)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, err_msg=name)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-15, err_msg=name)
    # the value is JAX's own x[rows, labels] (its gradient drops an index out of range)
    np.testing.assert_allclose(jax.jit(as_jax(m.xent))(x, lab),
                               jnp.mean(lse(x) - x[rows, lab]), rtol=1e-12)
    if labels[1] in (5, -100):
        assert np.isnan(jax.jit(as_jax(m.xent_along))(x, lab))
        with pytest.raises(IndexError, match="out of bounds for axis 1 with size 5"):
            m.xent(np.asarray(x), np.asarray(lab))


def test_the_lowerings_differ_in_what_xla_sees(act):
    """With "xla" the jitted step is XLA's own code (no callback, so XLA fuses it
    with its neighbours) and no derived op is compiled; with "kernels" the forward
    and the VJP are host callbacks into gradc's kernels."""
    x = jnp.linspace(-2, 2, 8, dtype=jnp.float32)
    for lowering, callbacks in (("xla", 0), ("kernels", 2)):
        f = as_jax(act.swish, lowering=lowering)
        step = jax.jit(jax.grad(lambda x: (f(x) * x).sum()))
        text = str(step.trace(x).jaxpr)
        assert text.count("pure_callback") == callbacks, text
        np.testing.assert_allclose(step(x), jax.grad(lambda x: (x * jax.nn.sigmoid(x) * x)
                                                     .sum())(x), rtol=1e-5, atol=1e-6)
    # the VJP is gradc's derivative (its tie rule for max and abs at 0), not JAX's
    f = as_jax(act.softplus_stable)
    x = np.asarray([0.0, 1e30, -1e30, np.inf, -np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(jax.grad(lambda x: f(x).sum())(jnp.asarray(x)),
                                  act.softplus_stable.vjp(x, np.ones(6, np.float32))[0])


def test_a_module_compiled_with_gradc_compile_needs_its_source(tmp_path):
    """``gradc compile -o`` modules do not know their .grad file: ``source=`` names it,
    and a source that is not the module's is refused."""
    out = tmp_path / "act_gen.py"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gradc.compile_file(EXAMPLES / "activations.grad", out)
    sys.path.insert(0, str(tmp_path))
    try:
        import act_gen
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.raises(ValueError, match=r"pass source="):
        as_jax(act_gen.swish)
    f = as_jax(act_gen.swish, source=EXAMPLES / "activations.grad")
    x = jnp.asarray([0.5, -1.0])
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x),       # XLA's rounding
                               act_gen.swish.vjp(np.asarray(x), np.ones(2, np.float32))[0],
                               rtol=1e-6)
    with pytest.raises(ValueError, match=r"not the source this module was compiled from"):
        as_jax(act_gen.swish, source=EXAMPLES / "seed.grad")


def test_generated_module_stays_standalone_without_jax(tmp_path):
    """The module imports neither jax nor gradc: it runs where both are missing."""
    out = tmp_path / "act_gen2.py"
    gradc.compile_file(EXAMPLES / "activations.grad", out)
    script = ("import sys; sys.modules['jax'] = None; sys.modules['gradc'] = None\n"
              f"sys.path.insert(0, {str(tmp_path)!r}); import numpy as np, act_gen2\n"
              "print(float(act_gen2.swish(np.float32(1.0))))\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout
    assert shown.startswith("0.731058")


def test_an_op_with_an_argmax_output_is_differentiated(tmp_path, x64, lowering):
    """The argmax output takes no gradient: jax.grad through the float output works
    (JAX hands the op a float0 cotangent for it, which the XLA lowering took for a
    float)."""
    (tmp_path / "am.grad").write_text("op max_and_index(x: [n, k]) -> (m, i) {\n"
                                      "    m = max(x, axis=-1)\n    i = argmax(x, axis=-1)\n}\n")
    f = as_jax(gradc.load(tmp_path / "am.grad").max_and_index, lowering=lowering)
    x = jnp.array([[1.0, 3.0, 2.0], [5.0, 4.0, 6.0]])
    np.testing.assert_array_equal(f(x)[1], [1, 2])
    g = jax.grad(lambda a: f(a)[0].sum())(x)
    np.testing.assert_array_equal(g, [[0, 1, 0], [0, 0, 1]])


def test_no_int64_warnings_without_x64(tmp_path):
    """Without x64, JAX has no int64: the XLA lowering keeps integer values (sort's and
    arange's indices, an argmax) 32-bit instead of asking for int64, which JAX truncated
    with a UserWarning at every cast (four for one sparsemax)."""
    assert not jax.config.jax_enable_x64
    (tmp_path / "am.grad").write_text("op max_and_index(x: [n, k]) -> (m, i) {\n"
                                      "    m = max(x, axis=-1)\n    i = argmax(x, axis=-1)\n}\n")
    top = as_jax(gradc.load(tmp_path / "am.grad").max_and_index)
    sparsemax = as_jax(gradc.load(Path(__file__).parents[2] / "examples" / "kernels" /
                                  "sparsemax.grad").sparsemax)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 6)), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = jax.jit(sparsemax)(x)
        g = jax.grad(lambda a: (sparsemax(a) * jnp.arange(6.0)).sum())(x)
        m, i = top(x)
    np.testing.assert_allclose(np.asarray(y).sum(-1), 1, rtol=1e-6)
    assert np.isfinite(np.asarray(g)).all()
    assert i.dtype == jnp.int32 and m.dtype == jnp.float32
    np.testing.assert_array_equal(i, np.asarray(x).argmax(-1))
    kernels = as_jax(gradc.load(tmp_path / "am.grad").max_and_index, lowering="kernels")
    with warnings.catch_warnings():     # the callback's result is int32 too (JAX refused int64)
        warnings.simplefilter("error")
        m, i = jax.jit(kernels)(x)
    assert i.dtype == jnp.int32 and m.dtype == jnp.float32
    np.testing.assert_array_equal(i, np.asarray(x).argmax(-1))


def test_int32_labels_for_an_i64_parameter_without_x64(lowering):
    """JAX makes int32 arrays by default; an ``i64`` parameter takes them (widened, as
    NumPy's safe casting), so examples/kernels/cross_entropy.grad runs without x64,
    with no warning, and a narrowing (float or int64 -> i32) stays a TypeError."""
    assert not jax.config.jax_enable_x64
    op = gradc.load(Path(__file__).parents[2] / "examples" / "kernels" /
                    "cross_entropy.grad").cross_entropy
    xent = as_jax(op, lowering=lowering)
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    t = jnp.asarray([1, 6, 0, 3])
    assert t.dtype == jnp.int32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, g = jax.jit(jax.value_and_grad(xent))(jnp.asarray(x), t)
    want, (want_g,) = op(x, np.asarray(t, np.int64)), op.vjp(x, np.asarray(t, np.int64), 1.0)
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-7)
    with pytest.raises(TypeError, match="argument 'labels' must be int64, got float32"):
        xent(jnp.asarray(x), t.astype(jnp.float32))


def test_cross_entropy_example_agrees_with_itself_on_labels_out_of_range(x64):
    """Inside the XLA lowering, which cannot raise, a label out of range is a row of
    zeros of the one-hot that the example's loss and its gradient both read: the
    gradient is the derivative of the loss returned (the loss gathered a clamped
    label, the gradient took a row of zeros)."""
    op = gradc.load(Path(__file__).parents[2] / "examples" / "kernels" /
                    "cross_entropy.grad").cross_entropy
    xent = as_jax(op)
    x = jnp.asarray([[1.0, 2.0, 3.0], [1.0, 0.0, 0.0]])
    for labels in ([2, 7], [2, -4]):
        t = jnp.asarray(labels)
        loss, g = jax.value_and_grad(xent)(x, t)
        lse = jax.scipy.special.logsumexp(x, axis=-1)      # of x less its max: 3, 1
        np.testing.assert_allclose(loss, ((lse[0] - 3.0) + lse[1] - 1.0) / 2, rtol=1e-12)
        want = jax.grad(lambda a: (jax.scipy.special.logsumexp(a, axis=-1)
                                   - jnp.asarray([1.0, 0.0]) * a[:, 2]).mean())(x)
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-15)
