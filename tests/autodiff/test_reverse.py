"""Reverse mode through the generated module: broadcasting, custom gradients inside
derived ones, non-differentiable parameters, several outputs and ``grad()`` in a body.

Every expected value is a NumPy closed form (or float64 central differences);
the ops are compiled into one module per test session.
"""
from __future__ import annotations


import numpy as np
import pytest

import gradc
from finite_differences import close, fd_grad

SOURCE = """
# --- broadcasting ---
op bmul(x, y) -> r {
    r = x * y
}
op bias_tanh(x: f64[n, k], b: f64[k]) -> r {
    r = tanh(x + b)
}

# --- custom gradients inside derived ones ---
op halfgrad_sin(x) -> y {
    y = sin(x)
} grad(dy) -> dx {
    dx = dy * cos(x) * 0.5
}
op outer(x) -> y {
    y = 3 * halfgrad_sin(x)
}
op twice(x) -> y {
    y = halfgrad_sin(x) * halfgrad_sin(2 * x)
}
op inner_c(x) -> y {
    y = x ^ 2
} grad(dy) -> dx {
    dx = dy * 100
}
op outer_c(x) -> y {
    y = sin(inner_c(x))
} grad(dy) -> dx {
    dx = dy * 7
}
op use_outer_c(x) -> y {
    y = 2 * outer_c(x)
}
op derived_over_custom(x) -> y {
    y = sin(inner_c(x))
}
op bias_custom(x, b) -> r {
    r = x + b
} grad(dr) -> (dx, db) {
    dx = dr
    db = 2 * dr
}

# --- no gradient ---
op sg(x) -> y {
    y = x * stop_gradient(x)
}
op nograds(x, w: nograd, k: i32, alpha: nograd = 0.5) -> y {
    y = x * w * k + alpha * x
}
op zero_grad(x, y) -> r {
    r = x * y
} grad(dr) -> (dx, dy) {
    dx = 0
    dy = dr * x
}
op uses_zero_grad(x) -> r {
    r = zero_grad(x, sin(x))
}

# --- several outputs ---
op two(x, y) -> (a, b) {
    a = x * y
    b = sin(x) + y
}
op two_custom(x) -> (a, b) {
    a = 2 * x
    b = x * x
} grad(da, db) -> dx {
    dx = da + 10 * db
}

# --- grad() in a body ---
op gsq(x: f64[n]) -> y {
    g = grad(sum(sin(x)^2), x)
    y = sum(g * g)
}
op gcube(x, w) -> y {
    g = grad(sum(w * x^3), x)
    y = g
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="reverse.grad"),
                              "gradc_test_reverse_gen")


RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape)


def both(op):
    """The fused op and its unfused twin."""
    return (op, op.unfused)


# ---- broadcasting: cotangents are sum-reduced to each operand's shape -------------

def test_outer_broadcast_grads_keep_operand_shapes(m) -> None:
    x, y, g = rand(2, 1), rand(1, 3), rand(2, 3)
    for op in both(m.bmul):
        close(op(x, y), x * y)
        dx, dy = op.vjp(x, y, g)
        close(dx, (g * y).sum(axis=1, keepdims=True))      # row sums, shape (2, 1)
        close(dy, (g * x).sum(axis=0, keepdims=True))      # column sums, shape (1, 3)


def test_outer_broadcast_with_ones_upstream_gives_row_and_column_sums(m) -> None:
    x, y = np.array([[1.0], [2.0]]), np.array([[10.0, 20.0, 30.0]])
    dx, dy = m.bmul.vjp(x, y, np.ones((2, 3)))
    close(dx, [[60.0], [60.0]])
    close(dy, [[3.0, 3.0, 3.0]])


def test_leading_dims_are_summed_away(m) -> None:
    x, y, g = rand(4, 2, 3), rand(3), rand(4, 2, 3)
    dx, dy = m.bmul.vjp(x, y, g)
    close(dx, g * y)
    close(dy, (g * x).sum(axis=(0, 1)))


def test_bias_gradient_is_summed_over_rows(m) -> None:
    x, b, g = rand(5, 3), rand(3), rand(5, 3)
    r = np.tanh(x + b)
    for op in both(m.bias_tanh):
        close(op(x, b), r)
        dx, db = op.vjp(x, b, g)
        close(dx, g * (1 - r ** 2))
        close(db, (g * (1 - r ** 2)).sum(axis=0))


def test_python_scalar_argument_broadcasts_and_gets_a_0d_gradient(m) -> None:
    y, g = rand(2, 3), rand(2, 3)
    for op in both(m.bmul):
        close(op(2.5, y), 2.5 * y)
        dx, dy = op.vjp(2.5, y, g)
        close(dx, np.sum(g * y))         # shape (): the scalar's shape
        close(dy, 2.5 * g)
        assert dy.dtype == np.float64


def test_scalar_argument_takes_the_arrays_dtype(m) -> None:
    y = rand(3).astype(np.float32)
    r = m.bmul(2.5, y)
    assert r.dtype == np.float32
    dx, dy = m.bmul.vjp(2.5, y, np.ones(3, np.float32))
    assert dy.dtype == np.float32 and np.asarray(dx).dtype == np.float32


def test_custom_grad_block_results_are_unbroadcast(m) -> None:
    x, b, g = rand(4, 3), rand(3), rand(4, 3)
    dx, db = m.bias_custom.vjp(x, b, g)
    close(dx, g)
    close(db, 2 * g.sum(axis=0))


# ---- custom gradients inside derived ones -----------------------------------------

def test_custom_gradient_overrides_inside_a_composite(m) -> None:
    x, g = rand(6), rand(6)
    for op in both(m.outer):
        close(op(x), 3 * np.sin(x))
        (dx,) = op.vjp(x, g)
        close(dx, g * 1.5 * np.cos(x))           # not 3 cos(x): the custom rule halves it
        y, dx2 = op.fwd_bwd(x, g)
        close(y, 3 * np.sin(x))
        close(dx2, dx)


def test_custom_op_called_twice(m) -> None:
    x, g = rand(5), rand(5)
    s1, s2 = np.sin(x), np.sin(2 * x)
    (dx,) = m.twice.vjp(x, g)
    close(dx, g * (0.5 * np.cos(x) * s2 + s1 * 0.5 * np.cos(2 * x) * 2))
    (dxu,) = m.twice.unfused.vjp(x, g)
    close(dxu, dx)


def test_nested_custom_ops_the_outer_rule_wins(m) -> None:
    x, g = rand(4), rand(4)
    (dx,) = m.outer_c.vjp(x, g)
    close(dx, 7 * g)
    (dx,) = m.use_outer_c.vjp(x, g)
    close(dx, 14 * g)
    close(m.use_outer_c(x), 2 * np.sin(x ** 2))


def test_custom_op_inside_a_derived_op(m) -> None:
    x, g = rand(4), rand(4)
    (dx,) = m.derived_over_custom.vjp(x, g)
    close(dx, g * np.cos(x ** 2) * 100)          # chain rule with the inner custom rule


def test_custom_gradient_is_used_for_the_op_itself(m) -> None:
    x, g = rand(3), rand(3)
    for op in both(m.halfgrad_sin):
        (dx,) = op.vjp(x, g)
        close(dx, 0.5 * g * np.cos(x))


# ---- no gradient ------------------------------------------------------------------

def test_stop_gradient_blocks_flow(m) -> None:
    x, g = rand(4), rand(4)
    close(m.sg(x), x * x)
    (dx,) = m.sg.vjp(x, g)
    close(dx, g * x)                              # not 2 x g


def test_nograd_and_integer_params_get_no_gradient(m) -> None:
    x, w, g = rand(4), rand(4), rand(4)
    k = np.array([1, -2, 3, 0], dtype=np.int32)
    close(m.nograds(x, w, k), x * w * k + 0.5 * x)
    grads = m.nograds.vjp(x, w, k, g)
    assert isinstance(grads, tuple) and len(grads) == 1     # only x is differentiable
    close(grads[0], g * (w * k + 0.5))
    grads = m.nograds.vjp(x, w, k, g, alpha=2.0)
    close(grads[0], g * (w * k + 2.0))
    fb = m.nograds.fwd_bwd(x, w, k, g)
    assert len(fb) == 2
    close(fb[1], g * (w * k + 0.5))


def test_grad_block_returning_zero(m) -> None:
    x, y, g = rand(3), rand(3), rand(3)
    for op in both(m.zero_grad):
        dx, dy = op.vjp(x, y, g)
        close(dx, np.zeros(3))
        close(dy, g * x)
    # used inside a derived op: only the path through dy flows
    (dx,) = m.uses_zero_grad.vjp(x, g)
    close(dx, g * x * np.cos(x))


# ---- several outputs ----------------------------------------------------------------

def test_two_outputs_two_upstreams(m) -> None:
    x, y, da, db = rand(4), rand(4), rand(4), rand(4)
    for op in both(m.two):
        a, b = op(x, y)
        close(a, x * y)
        close(b, np.sin(x) + y)
        dx, dy = op.vjp(x, y, da, db)
        close(dx, da * y + db * np.cos(x))
        close(dy, da * x + db)
        fb = op.fwd_bwd(x, y, da, db)
        assert len(fb) == 4
        for got, want in zip(fb, (x * y, np.sin(x) + y, dx, dy)):
            close(got, want)


def test_two_outputs_one_upstream_zero(m) -> None:
    x, y, db = rand(4), rand(4), rand(4)
    dx, dy = m.two.vjp(x, y, np.zeros(4), db)
    close(dx, db * np.cos(x))
    close(dy, db)


def test_custom_grad_block_with_two_upstreams(m) -> None:
    x, da, db = rand(3), rand(3), rand(3)
    a, b = m.two_custom(x)
    close(a, 2 * x)
    close(b, x * x)
    (dx,) = m.two_custom.vjp(x, da, db)
    close(dx, da + 10 * db)


# ---- grad() in a body -----------------------------------------------------------------

def test_grad_in_a_body_and_its_second_order_vjp(m) -> None:
    x = rand(5)
    # g = d/dx sum(sin^2 x) = sin(2x);  y = sum(sin^2(2x));  dy/dx = 2 sin(4x)
    f = lambda v: np.sum(np.sin(2 * v) ** 2)
    for op in both(m.gsq):
        y = op(x)
        assert y.shape == ()
        close(y, f(x))
        (dx,) = op.vjp(x, 1.0)
        close(dx, 2 * np.sin(4 * x))
        np.testing.assert_allclose(dx, fd_grad(f, x), rtol=1e-6, atol=1e-8)
        (dx3,) = op.vjp(x, np.asarray(3.0))
        close(dx3, 6 * np.sin(4 * x))


def test_grad_in_a_body_with_respect_to_one_of_two_params(m) -> None:
    x, w, g = rand(4), rand(4), rand(4)
    close(m.gcube(x, w), 3 * w * x ** 2)
    dx, dw = m.gcube.vjp(x, w, g)
    close(dx, g * 6 * w * x)
    close(dw, g * 3 * x ** 2)
    np.testing.assert_allclose(dx, fd_grad(lambda v: np.vdot(g, 3 * w * v ** 2), x), rtol=1e-6)
