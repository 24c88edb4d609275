"""The stable rewrites of ``simplify._stable_forms``, applied before differentiation."""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.frontend.check import check_source
from gradc.pipeline import build_op

# written form -> (primitive that must appear, input, value, gradient) in float32,
# at an input where the written form overflows or cancels (in value or gradient).
CASES = {
    "log1p(exp(x))": ("softplus", 100.0, 100.0, 1.0),
    "log(1 + exp(x))": ("softplus", 100.0, 100.0, 1.0),
    "log(exp(x) + 1)": ("softplus", -100.0, 3.7200760e-44, 3.7200760e-44),
    "1 / (1 + exp(-x))": ("sigmoid", -100.0, 3.7200760e-44, 3.7200760e-44),
    "log(sigmoid(x))": ("softplus", -200.0, -200.0, 1.0),
    "log(exp(x))": (None, 200.0, 200.0, 1.0),
    "log(sum(exp(x)))": ("logsumexp", 500.0, 500.0, 1.0),
    "sqrt(sum(x^2))": ("norm", 0.0, 0.0, 0.0),
    "sqrt(sum(x * x))": ("norm", 1e30, 1e30, 1.0),
    "sqrt(sum(square(x)))": ("norm", -1e30, 1e30, -1.0),
    "log(1 + x)": ("log1p", 1e-10, 1e-10, 1.0),
    "exp(x) - 1": ("expm1", 1e-10, 1e-10, 1.0),
}


def ops_of(expr: str) -> set[str]:
    program = check_source(f"op f(x) -> y {{ y = {expr} }}", "s.grad")
    cop = build_op(program.ops["f"], program.ops, program.consts)
    return {n.op for n in cop.methods["forward"].graph}


@pytest.mark.parametrize("expr", sorted(CASES))
def test_rewrite_reaches_the_stable_primitive(expr):
    prim = CASES[expr][0]
    ops = ops_of(expr)
    if prim is not None:
        assert prim in ops, ops
    assert "exp" not in ops, ops


@pytest.fixture(scope="module")
def m(import_module_text):
    names = {expr: f"f{i}" for i, expr in enumerate(sorted(CASES))}
    src = "\n".join(f"op {n}(x) -> y {{ y = {e} }}" for e, n in names.items())
    mod = import_module_text(gradc.compile_source(src, file="stable.grad"), "gradc_test_stable")
    return {e: getattr(mod, n) for e, n in names.items()}


@pytest.mark.parametrize("expr", sorted(CASES))
def test_rewritten_form_is_finite_and_right_in_float32(m, expr):
    _, x, value, grad = CASES[expr]
    x = np.array([x], np.float32)
    op = m[expr]
    for impl in (op, op.unfused):
        out = impl(x)
        dy = np.ones(np.shape(out), np.float32)
        (g,) = impl.vjp(x, dy)
        assert np.asarray(out).dtype == np.float32 and g.dtype == np.float32
        # atol: below float32's smallest normal (1.2e-38) only the absolute error counts
        np.testing.assert_allclose(np.ravel(out), [value], rtol=1e-6, atol=1e-37)
        np.testing.assert_allclose(g, [grad], rtol=1e-6, atol=1e-37)


def test_a_custom_gradient_inside_a_rewrite_pattern_is_kept(import_module_text):
    """``log1p(e(x))`` where ``e`` has a custom rule is not fused into softplus:
    the user's rule for ``e`` must still be used."""
    src = """
op e(x) -> y {
    y = exp(x)
} grad(dy) -> dx {
    dx = dy * 7
}
op f(x) -> y { y = log1p(e(x)) }
op g(x) -> y {
    y = log1p(exp(x))
} grad(dy) -> dx {
    dx = dy * 3
}
op h(x) -> y { y = g(log1p(exp(x))) }
"""
    mod = import_module_text(gradc.compile_source(src, file="c.grad"), "gradc_test_stable_c")
    x = np.array([0.5, 2.0])
    (g,) = mod.f.vjp(x, np.ones(2))
    np.testing.assert_allclose(g, 7 / (1 + np.exp(x)))
    (g,) = mod.g.vjp(x, np.ones(2))
    np.testing.assert_allclose(g, [3, 3])
    np.testing.assert_allclose(mod.g(x), np.log1p(np.exp(x)))
    # a rewritten node passed into a custom region: the region's input is remapped
    (g,) = mod.h.vjp(x, np.ones(2))
    np.testing.assert_allclose(g, 3 / (1 + np.exp(-x)))


# Strength reduction (simplify._strength): the forward graph after simplification.
STRENGTH = {
    "x * x": ({"square"}, {"mul", "pow"}),
    "x^2": ({"square"}, {"pow"}),
    "x^3": ({"square", "mul"}, {"pow"}),
    "x^4": ({"square"}, {"pow", "mul"}),
    "x^-2": ({"square", "div"}, {"pow"}),
    "x^5": ({"pow"}, set()),
    "x^2.5": ({"pow"}, set()),
    "x / 4": ({"mul"}, {"div"}),
    "x / 3": ({"div"}, {"mul"}),           # 1/3 is inexact: kept as written
    "exp(log(x))": (set(), {"exp", "log"}),
}


@pytest.mark.parametrize("expr", sorted(STRENGTH))
def test_strength_reduction(expr):
    present, absent = STRENGTH[expr]
    ops = ops_of(expr)
    assert present <= ops and not (absent & ops), ops


def test_integer_powers_stay_within_three_ulp(import_module_text):
    src = "\n".join(f"op p{k}(x) -> y {{ y = x^{n} }}" for k, n in enumerate([2, 3, 4, -1, -2, -3]))
    mod = import_module_text(gradc.compile_source(src, file="p.grad"), "gradc_test_ipow")
    x = np.random.default_rng(0).uniform(0.1, 10, 100_000).astype(np.float32)
    for k, n in enumerate([2, 3, 4, -1, -2, -3]):
        op = getattr(mod, f"p{k}")
        want = x.astype(np.float64) ** n
        got = op(x)
        ulp = np.abs(got - want) / np.spacing(want.astype(np.float32))
        assert got.dtype == np.float32 and ulp.max() <= 3, (n, ulp.max())
        (g,) = op.vjp(x, np.ones_like(x))
        np.testing.assert_allclose(g, n * x.astype(np.float64) ** (n - 1), rtol=1e-6)


def test_log_sigmoid_is_the_form_log_of_sigmoid_is_rewritten_to():
    """``log(sigmoid(x))`` becomes the builtin ``log_sigmoid(x)``'s decomposition."""
    def graph(expr):
        program = check_source(f"op f(x) -> y {{ y = {expr} }}", "s.grad")
        g = build_op(program.ops["f"], program.ops, program.consts).methods["vjp"].graph
        return sorted((n.op, n.attrs) for n in g)
    assert graph("log(sigmoid(x))") == graph("log_sigmoid(x)")
