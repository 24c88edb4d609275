"""Second order (issue 6, parts 3 and 4): ``grad(EXPR, NAME)`` in bodies, differentiated
again by the op's ``vjp``, by an outer ``grad()``, and through custom gradients.

The semantics (docs/second_order.md): a custom rule replaces its op's derivative for the
gradient that uses it; that gradient is then an ordinary function of the inputs, and
differentiating it again differentiates the rule's expressions and the residuals it reads
through the forward body (JAX's ``custom_vjp``), while custom ops called inside a grad
block, or not differentiated by the inner gradient, keep their rules.

Every expected value is a closed form that tells the candidate semantics apart (the
rule's derivative, the true second derivative and the custom rule applied to a residual
differ), checked against float64 central differences of the compiled forward where the
two must agree.  Ops are float64 so that the differences are meaningful.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gradc
from finite_differences import close, fd_grad

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SOURCE = """
# --- a custom rule that reads the forward's output y (a residual) ---
op scaled_tanh(x) -> y {
    y = tanh(x)
} grad(dy) -> dx {
    dx = dy * (1 - y^2) * 0.5
}
op st_rule_sum(x: f64[n]) -> r {
    r = sum(grad(sum(scaled_tanh(x)), x))
}
op st_hessian_diag(x: f64[n]) -> r {
    r = grad(sum(grad(sum(scaled_tanh(x)), x)), x)
}
# the same call used directly (custom rule) and inside grad() (rule differentiated)
op st_shared(x: f64[n]) -> r {
    h = scaled_tanh(x)
    r = sum(h) + sum(grad(sum(h^2), x))
}

# --- a custom rule that reads an intermediate of the forward body ---
op sin_sq(x) -> y {
    h = x^2
    y = sin(h)
} grad(dy) -> dx {
    dx = dy * cos(h) * 3 * x
}
op sin_sq_rule(x: f64[n]) -> r {
    r = sum(grad(sum(sin_sq(x)), x))
}

# --- custom ops called inside a grad block and inside a grad() expression ---
op cube(x) -> y {
    y = x^3
} grad(dy) -> dx {
    dx = dy * 100 * x
}
op sin_cube_rule(x) -> y {
    y = sin(x)
} grad(dy) -> dx {
    dx = dy * cube(x)
}
op in_block(x: f64[n]) -> r {
    r = sum(grad(sum(sin_cube_rule(x)), x))
}
op in_expr(x: f64[n]) -> r {
    r = sum(grad(sum(cube(x) * x), x))
}
op in_expr_constant(x: f64[n], w: f64[n]) -> r {
    r = sum(grad(sum(cube(w) * x), x))
}

# --- grad() inside a grad block: residuals differentiated by the forward body ---
op own_output(x) -> y {
    y = x^2
} grad(dy) -> dx {
    dx = dy * grad(sum(y), x)
}
op own_intermediate(x) -> y {
    h = sin(x)
    y = h^2
} grad(dy) -> dx {
    dx = dy * grad(sum(h), x) * 10
}
op grad_of_second(a, b) -> r {
    r = grad(sum(b), a)
}
op own_output_in_a_call(x) -> y {
    y = x^3
} grad(dy) -> dx {
    dx = dy * grad_of_second(x, y)
}
op use_own(x: f64[n]) -> r {
    r = sum(own_output(x)) + sum(own_intermediate(x)) + sum(own_output_in_a_call(x))
}

# --- a cotangent that is exactly 0 where its derivative is not ---
op zero_cotangent(x: f64[n]) -> r {
    r = sum(grad(sum((exp(x) - 1)^2), x))
}
op unused_branch(x: f64[n]) -> r {
    r = sum(grad(sum(where(x > 0, sqrt(x), 0) + x^2), x))
}

# --- nesting ---
op third(x: f64[n]) -> r {
    r = sum(grad(sum(grad(sum(grad(sum(x^4), x)), x)), x))
}
op hvp_cubic(x: f64[n], v: nograd f64[n]) -> r {
    r = grad(sum(grad(sum(x^3 * sin(x)), x) * v), x)
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="second.grad"),
                              "gradc_test_second_order_gen")


RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape)


def vjp_scalar(op, *args):
    """The gradient of a 0-d output, fused and unfused (checked equal)."""
    grads = op.vjp(*args, 1.0)
    for g, u in zip(grads, op.unfused.vjp(*args, 1.0)):
        close(u, g, rtol=1e-13, atol=1e-13)
    return grads


# ---- custom rules are differentiated as expressions ------------------------------------

def test_second_derivative_of_a_custom_rule_is_the_rules_derivative(m) -> None:
    x = rand(6)
    y = np.tanh(x)
    close(m.st_rule_sum(x), np.sum(0.5 * (1 - y ** 2)))       # first order: the rule
    (dx,) = vjp_scalar(m.st_rule_sum, x)
    rule_derivative = -y * (1 - y ** 2)               # d/dx 0.5 (1 - tanh(x)^2)
    close(dx, rule_derivative)
    assert np.max(np.abs(dx - 2 * rule_derivative)) > 1e-2    # not tanh''(x)
    assert np.max(np.abs(dx - 0.5 * rule_derivative)) > 1e-2  # not the rule applied to y
    close(dx, fd_grad(lambda v: m.st_rule_sum(v), x), rtol=1e-6, atol=1e-9)
    close(m.st_hessian_diag(x), rule_derivative)      # the same through a nested grad()


def test_a_call_used_directly_and_inside_grad_gets_each_its_derivative(m) -> None:
    x = rand(5)
    h = np.tanh(x)
    close(m.st_shared(x), np.sum(h) + np.sum(h * (1 - h ** 2)))
    (dx,) = vjp_scalar(m.st_shared, x)
    # sum(h): the custom rule; grad(): h (1 - h^2) = h - h^3 differentiated truly
    close(dx, 0.5 * (1 - h ** 2) + (1 - 3 * h ** 2) * (1 - h ** 2))


def test_a_rule_reading_an_intermediate_is_differentiated_through_it(m) -> None:
    x = rand(5)
    close(m.sin_sq_rule(x), np.sum(3 * x * np.cos(x ** 2)))
    (dx,) = vjp_scalar(m.sin_sq_rule, x)
    close(dx, 3 * np.cos(x ** 2) - 6 * x ** 2 * np.sin(x ** 2))    # h = x^2 depends on x
    close(dx, fd_grad(lambda v: m.sin_sq_rule(v), x), rtol=1e-6, atol=1e-9)


# ---- nested custom ops keep their rules ---------------------------------------------------

def test_custom_op_inside_a_grad_block_keeps_its_rule_at_second_order(m) -> None:
    x = rand(4)
    close(m.in_block(x), np.sum(x ** 3))              # the block calls cube(x)
    (dx,) = vjp_scalar(m.in_block, x)
    close(dx, 100 * x)                                # cube's rule, not 3 x^2


def test_custom_op_inside_a_grad_expression(m) -> None:
    x, w = rand(4), rand(4)
    # first order uses cube's rule: d/dx sum(cube(x) x) = 100 x * x + x^3
    close(m.in_expr(x), np.sum(100 * x ** 2 + x ** 3))
    (dx,) = vjp_scalar(m.in_expr, x)
    close(dx, 200 * x + 3 * x ** 2)                   # that gradient, differentiated
    close(dx, fd_grad(lambda v: m.in_expr(v), x), rtol=1e-6, atol=1e-8)
    # cube(w) does not depend on x: the inner gradient does not differentiate it, so
    # the outer derivative with respect to w uses its rule
    close(m.in_expr_constant(x, w), np.sum(w ** 3))
    dx, dw = vjp_scalar(m.in_expr_constant, x, w)
    close(dx, np.zeros(4))
    close(dw, 100 * w)


def test_grad_in_a_grad_block_differentiates_residuals_by_the_forward_body(m) -> None:
    x, dy = rand(4), rand(4)
    (dx,) = m.own_output.vjp(x, dy)
    close(dx, dy * 2 * x)                     # d/dx sum(y), y = x^2: not the rule itself
    (dx,) = m.own_intermediate.vjp(x, dy)
    close(dx, dy * np.cos(x) * 10)            # h = sin(x) inside the region
    (dx,) = m.own_output_in_a_call.vjp(x, dy)     # grad() in an op the block calls
    close(dx, dy * 3 * x ** 2)
    (dx,) = vjp_scalar(m.use_own, x)
    close(dx, 2 * x + 10 * np.cos(x) + 3 * x ** 2)


# ---- zero cotangents ---------------------------------------------------------------------

def test_second_derivative_where_a_first_order_cotangent_is_zero(m) -> None:
    """At x = 0 the cotangent of exp(x) - 1 is 2 (exp(x) - 1) = 0, but its derivative is
    not: the mask that keeps 0 * inf from making NaN must not hide it (it did: 0)."""
    x = np.array([0.0, 0.3, -0.2])
    (dx,) = vjp_scalar(m.zero_cotangent, x)
    close(dx, 2 * np.exp(2 * x) + 2 * (np.exp(x) - 1) * np.exp(x))
    close(dx[0], 2.0)
    close(dx, fd_grad(lambda v: m.zero_cotangent(v), x), rtol=1e-6, atol=1e-8)


def test_unselected_branch_stays_nan_free_at_second_order(m) -> None:
    x = np.array([-1.0, 0.0, 0.25, 4.0])
    # grad = where(x > 0, 0.5 / sqrt(x), 0) + 2 x; its derivative -0.25 x^-1.5 + 2
    # where x > 0, 2 elsewhere (sqrt's infinite derivative at 0 is not selected)
    pos = np.where(x > 0, x, 1.0)
    close(m.unused_branch(x), np.sum(np.where(x > 0, 0.5 / np.sqrt(pos), 0) + 2 * x))
    (dx,) = vjp_scalar(m.unused_branch, x)
    close(dx, np.where(x > 0, -0.25 * pos ** -1.5, 0) + 2)


# ---- nesting ------------------------------------------------------------------------------

def test_third_order(m) -> None:
    x = rand(3)
    close(m.third(x), np.sum(24 * x))
    (dx,) = vjp_scalar(m.third, x)
    close(dx, np.full(3, 24.0))


def test_hessian_vector_product_of_a_derived_gradient(m) -> None:
    x, v = rand(5), rand(5)
    f2 = 6 * x * np.sin(x) + 6 * x ** 2 * np.cos(x) - x ** 3 * np.sin(x)
    close(m.hvp_cubic(x, v), f2 * v)          # the Hessian is diagonal here


# ---- Hessian-vector products of the guide's classifier ----------------------------------

HVP = """
import "seed64.grad"

op loss_grad_w1(x: f64[b, i], w1: f64[i, h], b1: f64[h], w2: f64[h, o], b2: f64[o],
                onehot: nograd f64[b, o]) -> g {
    g = grad(softmax_xent(mlp(x, w1, b1, w2, b2), onehot), w1)
}
op hvp_w1(x: f64[b, i], w1: f64[i, h], b1: f64[h], w2: f64[h, o], b2: f64[o],
          onehot: nograd f64[b, o], v: nograd f64[i, h]) -> hv {
    hv = grad(sum(grad(softmax_xent(mlp(x, w1, b1, w2, b2), onehot), w1) * v), w1)
}
"""


@pytest.fixture(scope="module")
def seed64(tmp_path_factory):
    """examples/seed.grad with every f32 annotation made f64, and HVP ops over it."""
    d = tmp_path_factory.mktemp("seed64")
    (d / "seed64.grad").write_text((EXAMPLES / "seed.grad").read_text().replace("f32", "f64"))
    (d / "hvp.grad").write_text(HVP)
    return gradc.load(d / "seed64.grad"), gradc.load(d / "hvp.grad")


def _classifier(rng, b=6, i=5, h=4, o=3):
    x = rng.standard_normal((b, i))
    params = (rng.standard_normal((i, h)), 0.3 * rng.standard_normal(h),
              rng.standard_normal((h, o)), 0.3 * rng.standard_normal(o))
    onehot = np.eye(o)[rng.integers(0, o, b)]
    return x, params, onehot


@pytest.mark.slow
def test_hvp_of_softmax_xent_of_mlp_matches_differences_of_the_compiled_gradient(seed64):
    seed, ops = seed64
    for k in range(3):
        rng = np.random.default_rng(100 + k)
        x, (w1, b1, w2, b2), onehot = _classifier(rng)
        v = rng.standard_normal(w1.shape)

        def grad_w1(w):          # the compiled first-order gradient, by the modules' vjps
            logits = seed.mlp(x, w, b1, w2, b2)
            (dlogits,) = seed.softmax_xent.vjp(logits, onehot, 1.0)
            return seed.mlp.vjp(x, w, b1, w2, b2, dlogits)[1]

        close(ops.loss_grad_w1(x, w1, b1, w2, b2, onehot), grad_w1(w1), rtol=1e-12)
        eps = 1e-5
        fd = (grad_w1(w1 + eps * v) - grad_w1(w1 - eps * v)) / (2 * eps)
        hv = ops.hvp_w1(x, w1, b1, w2, b2, onehot, v)
        assert hv.dtype == np.float64 and hv.shape == w1.shape
        np.testing.assert_allclose(hv, fd, rtol=1e-6, atol=1e-8 * np.max(np.abs(fd)))
        np.testing.assert_allclose(ops.hvp_w1.unfused(x, w1, b1, w2, b2, onehot, v), hv,
                                   rtol=1e-12, atol=1e-14)
        # linear in v, and symmetric: <u, H v> = <v, H u>
        u = rng.standard_normal(w1.shape)
        hu = ops.hvp_w1(x, w1, b1, w2, b2, onehot, u)
        assert np.vdot(u, hv) == pytest.approx(np.vdot(v, hu), rel=1e-10)
        close(ops.hvp_w1(x, w1, b1, w2, b2, onehot, 2 * v - u), 2 * hv - hu, rtol=1e-9,
              atol=1e-12)


# ---- the gradient penalty of examples/seed.grad, in float64 -------------------------------

def penalty_ref(real, fake, alpha, w):
    xi = alpha * real + (1 - alpha) * fake
    s = np.tanh(xi @ w)
    g = (1 - s ** 2)[:, None] * w
    return np.mean((np.linalg.norm(g, axis=1) - 1) ** 2)


def _check_penalty(gp, real, fake, alpha, w, h=1e-6):
    p = gp(real, fake, alpha, w)
    assert p.dtype == np.float64 and p.shape == ()
    close(p, penalty_ref(real, fake, alpha, w), rtol=1e-13)
    grads = gp.vjp(real, fake, alpha, w, 1.0)
    fb = gp.fwd_bwd(real, fake, alpha, w, 1.0)
    close(fb[0], p, rtol=1e-14)
    refs = (lambda v: penalty_ref(v, fake, alpha, w), lambda v: penalty_ref(real, v, alpha, w),
            lambda v: penalty_ref(real, fake, alpha, v))
    for name, g, g2, ref, at in zip(("real", "fake", "w"), grads, fb[1:], refs,
                                    (real, fake, w)):
        assert np.all(np.isfinite(g)), name
        want = fd_grad(ref, at, h)
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-8, err_msg=f"d/d{name}")
        close(g2, g, rtol=1e-13, atol=1e-15)
    return grads


def test_gradient_penalty_and_its_second_order_gradient_at_random_points(seed64):
    gp = seed64[0].gradient_penalty
    for k in range(5):
        rng = np.random.default_rng(200 + k)
        b, d = 4, 3
        _check_penalty(gp, rng.standard_normal((b, d)), rng.standard_normal((b, d)),
                       rng.uniform(0, 1, (b, 1)), (0.3 + 0.5 * k) * rng.standard_normal(d))


def test_gradient_penalty_edge_cases(seed64):
    gp = seed64[0].gradient_penalty
    rng = np.random.default_rng(300)
    real, fake = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    w = np.array([0.8, -1.1])
    for a in (0.0, 1.0):                  # alpha at 0 (all fake) and 1 (all real)
        alpha = np.full((3, 1), a)
        grads = _check_penalty(gp, real, fake, alpha, w)
        close(grads[0 if a == 0 else 1], np.zeros((3, 2)))     # the unused end: 0
    # a zero-norm gradient (w = 0): penalty 1, gradient 0 by norm's convention at 0
    # (central differences agree: the penalty is even in w), and no NaN
    alpha = rng.uniform(0, 1, (3, 1))
    grads = _check_penalty(gp, real, fake, alpha, np.zeros(2))
    close(gp(real, fake, alpha, np.zeros(2)), 1.0)
    for g in grads:
        close(g, np.zeros_like(g))
    # one row saturated: tanh' underflows to 0 there, so that row's gradient norm is 0
    big = np.array([[400.0, 0.0], [0.1, 0.2], [-0.3, 0.5]])
    _check_penalty(gp, big, big, alpha, np.array([1.0, 0.5]))


def test_grad_with_respect_to_a_zeros_like_name(import_module_text) -> None:
    """``J t`` as the gradient in ``dy`` of ``<J^T dy, t>`` with ``dy = zeros_like(y)``
    (how gradc.adapters.derived writes an op's JVP): ``dy``'s value does not depend on
    ``x`` (``zeros_like`` reads only ``y``'s shape), so grad() must not detach it into
    a copy (it did, and the result was 0)."""
    src = """
op f(x) -> y {
    y = sin(x) * x
}
op jt(x: f64[n], t: f64[n]) -> y_t {
    y = f(x)
    dy = zeros_like(y)
    g = grad(sum(y * dy), x)
    y_t = grad(sum(g * t), dy)
}
"""
    mod = import_module_text(gradc.compile_source(src, file="jt.grad"), "second_order_jt")
    x, t = rand(7), rand(7)
    close(mod.jt(x, t), (np.cos(x) * x + np.sin(x)) * t, rtol=1e-14, atol=1e-15)


def test_grad_differentiates_the_stable_forms(import_module_text) -> None:
    """grad() differentiates what the op's own methods differentiate, in a body and in
    a grad block: the stable primitive a naive spelling is rewritten to, and the
    keepdims form of JAX's expand_dims spelling.  The gradient of log(1 + exp(x)) is
    sigmoid(x), 1 at x = 100 and 1000 in float32, where exp(x) / (1 + exp(x)) is
    inf / inf (it gave 0 there); a softmax spelled with expand_dims gives the keepdims
    spelling's bits."""
    src = """
op softplus_grad(x: f32[n]) -> g {
    g = grad(sum(log(1 + exp(x))), x)
}
op softplus_rule(x: f32[n]) -> y {      # the same grad() in a grad block
    y = x
} grad(dy) -> dx {
    dx = dy * grad(sum(log(1 + exp(x))), x)
}
op sm_expand(x: f64[b, k], w: f64[b, k]) -> g {
    e = exp(x - expand_dims(stop_gradient(max(x, axis=-1)), axis=-1))
    g = grad(sum(e / expand_dims(sum(e, axis=-1), axis=-1) * w), x)
}
op sm_keep(x: f64[b, k], w: f64[b, k]) -> g {
    e = exp(x - stop_gradient(max(x, axis=-1, keepdims=true)))
    g = grad(sum(e / sum(e, axis=-1, keepdims=true) * w), x)
}
"""
    mod = import_module_text(gradc.compile_source(src, file="stable.grad"), "second_order_stable")
    x = np.array([-200, -1, 0, 1, 100, 1000], np.float32)
    with np.errstate(over="ignore"):
        want = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)
    np.testing.assert_allclose(mod.softplus_grad(x), want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(mod.softplus_rule.vjp(x, np.ones_like(x))[0], want,
                               rtol=1e-6, atol=0)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 9)) * 3, rng.standard_normal((4, 9))
    np.testing.assert_array_equal(mod.sm_expand(x, w), mod.sm_keep(x, w))
    np.testing.assert_array_equal(mod.sm_expand.vjp(x, w, w), mod.sm_keep.vjp(x, w, w))
