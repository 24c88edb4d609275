"""The canonical form of graph values (gradc/audit/canonical.py): values of two graphs
compared symbolically, up to a constant factor."""
from __future__ import annotations

import pytest

from gradc.audit.canonical import canonical, clip_bounds, proportion, reads_params
from gradc.frontend.check import check_source
from gradc.pipeline import build_op


def forward(body: str, params: str = "x, w"):
    program = check_source(f"op f({params}) -> y {{\n    y = {body}\n}}\n", "canon.grad")
    g = build_op(program.ops["f"], program.ops, program.consts).methods["forward"].graph
    return g, g.outputs[0]


@pytest.mark.parametrize("a, b, k", [
    ("2 * (x + w)", "w * 2 + x + x", 1.0),             # sums sorted, like terms collected
    ("x * 3 - x", "2 * x", 1.0),
    ("tanh(x) * 0.5", "tanh(x)", 0.5),
    ("-(w * tanh(x)) / 4", "tanh(x) * w", -0.25),
    ("max(x, w) * 3", "max(w, x)", 3.0),                 # commutative operands sorted
    ("x * 0", "zeros_like(x)", 1.0),                     # both 0: equal
    ("sin(x) + cos(x)", "sin(x) * cos(x)", None),
    ("tanh(x)", "tanh(w)", None),                        # parameters by name
])
def test_proportion(a, b, k):
    ga, na = forward(a)
    gb, nb = forward(b)
    got = proportion(ga, na, gb, nb)
    assert (got is None) if k is None else got == ("scaled", pytest.approx(k))


def test_a_value_over_an_identically_zero_one_and_unit_parameters():
    ga, na = forward("3 * w")
    gz, nz = forward("zeros_like(x)")
    assert proportion(ga, na, gz, nz) == ("zero", 0.0)
    gb, nb = forward("6 * x * w")
    assert proportion(ga, na, gb, nb) is None
    assert proportion(ga, na, gb, nb, unit=frozenset({"x"})) == ("scaled", 0.5)


def test_reads_params_ignores_shape_only_operands():
    g, n = forward("ones_like(w) + x")
    assert reads_params(g, n, {"x"}) and not reads_params(g, n, {"w"})


def test_clip_bounds_are_the_constant_bounds_of_clips_upstream():
    g, n = forward("clip(x * w, -1, 2) + clip(x, w, 3)")
    assert clip_bounds(g, n) == [(-1.0, 2.0)]
    assert clip_bounds(*forward("min(max(x, -1), 2) * max(3, min(w, 4))")) == [(-1.0, 2.0),
                                                                            (3.0, 4.0)]
    assert canonical(g, n) == canonical(*forward("clip(w * x, -1, 2) + clip(x, w, 3)"))


def vjp(body: str, params: str = "x"):
    program = check_source(f"op f({params}) -> y {{\n    y = {body}\n}}\n", "canon.grad")
    g = build_op(program.ops["f"], program.ops, program.consts).methods["vjp"].graph
    return g, g.outputs[0]


def _has_op(key, op: str) -> bool:
    return key == op or isinstance(key, tuple) and any(_has_op(k, op) for k in key)


def test_a_shape_derived_factor_stays_in_the_key_never_in_the_constant():
    """mean's 1/n is ``size_ratio(out, x)``, known only at run time: the canonical form
    keys it (an opaque factor), so a constant factor between two forms comes from
    literal constants only and holds whatever the input shapes (the audit may claim it
    'everywhere')."""
    gm, nm = vjp("mean(x)")
    c, key = canonical(gm, nm)
    assert c == 1.0 and _has_op(key, "size_ratio")
    gs, ns = vjp("sum(x)")
    assert proportion(gs, ns, gm, nm) is None             # n times mean's: not a constant
    assert proportion(gm, nm, *vjp("mean(x)")) == ("scaled", 1.0)
