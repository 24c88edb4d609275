"""Passes: each establishes the invariant its docstring states."""
from __future__ import annotations

import numpy as np
import pytest

from gradc.frontend.check import check_source
from gradc.ir.interpret import interpret
from gradc.ir.verify import verify
from gradc.passes import run
from gradc.passes.cse import eliminate_common_subexpressions
from gradc.passes.dce import eliminate_dead_code
from gradc.passes.fuse import Kernel, LibraryCall, plan_kernels
from gradc.passes.simplify import simplify
from gradc.pipeline import build_op


def _op(src: str, name: str, **kw):
    program = check_source(src, "t.grad")
    return build_op(program.ops[name], program.ops, program.consts, check=True, **kw)


def _ops(graph) -> list[str]:
    return [n.op for n in graph if n.op not in ("param", "const")]


def test_constants_fold_and_identities_vanish():
    cop = _op("op f(x) -> y { y = (x * 1 + 0) * (2 * 3) - 0 }", "f")
    g = cop.methods["forward"].graph
    assert _ops(g) == ["mul"]
    consts = [n.value for n in g if n.op == "const"]
    assert consts == [6.0]


def test_fold_keeps_broadcast_shape():
    # x + 0 may not drop the add when 0 would change the result's shape class:
    # here the add is what broadcasts b against x.
    cop = _op("op f(x: f32[3, 4], b: f32[4]) -> y { y = x * 0 + b }", "f")
    g = cop.methods["forward"].graph
    assert g.node(g.outputs[0]).shape.static == (3, 4)
    x = np.ones((3, 4)); b = np.arange(4.0)
    np.testing.assert_array_equal(interpret(g, [x, b])[0], np.broadcast_to(b, (3, 4)))


def test_cse_merges_repeated_subexpressions():
    cop = _op("op f(x) -> y { a = sin(x) * 2\n b = sin(x) * 2\n y = a + b }", "f")
    assert _ops(cop.methods["forward"].graph).count("sin") == 1
    assert _ops(cop.methods["forward"].graph).count("mul") == 1


def test_dce_drops_unused_values_but_keeps_params():
    cop = _op("op f(x, z) -> y { unused = exp(z)\n y = sin(x) }", "f")
    g = cop.methods["forward"].graph
    assert _ops(g) == ["sin"]
    assert len(g.params) == 2 and all(p in g for p in g.params)


def test_run_verifies_after_every_pass():
    cop = _op("op f(x) -> y { y = tanh(x) * x }", "f")
    g = run(cop.methods["fwd_bwd"].graph, check=True)
    verify(g)


def test_passes_are_pure():
    cop = _op("op f(x) -> y { y = x * 1 }", "f")
    g = cop.primal
    before = [(n.id, n.op, n.args) for n in g]
    simplify(g); eliminate_common_subexpressions(g); eliminate_dead_code(g)
    assert [(n.id, n.op, n.args) for n in g] == before


def test_elementwise_fwd_bwd_is_one_kernel():
    src = "op st(x) -> y { y = tanh(x) } grad(dy) -> dx { dx = dy * (1 - y^2) * 0.5 }"
    plan = _op(src, "st").methods["fwd_bwd"].fused
    assert len(plan.steps) == 1 and isinstance(plan.steps[0], Kernel)
    k = plan.steps[0]
    assert len(k.inputs) == 2 and len(k.outputs) == 2      # x, dy in; y, dx out


def test_independent_loops_of_one_shape_fuse_horizontally():
    src = "op f(x) -> y { y = 2 * x } grad(dy) -> dx { dx = ones_like(dy) }"
    plan = _op(src, "f").methods["fwd_bwd"].fused
    assert len(plan.steps) == 1


def test_unfused_plan_has_one_kernel_per_primitive():
    src = "op f(x) -> y { y = sin(x) * cos(x) + 1 }"
    m = _op(src, "f").methods["forward"]
    assert len(m.unfused.steps) == 4
    assert all(len(s.nodes) == 1 for s in m.unfused.steps)


def test_reductions_and_matmul_are_kernel_boundaries():
    src = ("op f(x: f32[b, i], w: f32[i, o]) -> y {\n"
           "  h = tanh(x @ w)\n  y = sum(h * h, axis=1) + 1\n}")
    plan = _op(src, "f").methods["forward"].fused
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds == ["LibraryCall", "Kernel", "LibraryCall", "Kernel"]


@pytest.mark.parametrize("fuse", [True, False])
def test_plan_order_respects_dependencies(fuse):
    src = ("op f(x: f32[n, k]) -> y {\n  m = max(x, axis=1, keepdims=true)\n"
           "  e = exp(x - m)\n  y = e / sum(e, axis=1, keepdims=true)\n}")
    cop = _op(src, "f")
    for m in cop.methods.values():
        plan = m.fused if fuse else m.unfused
        ready = set(plan.graph.params) | {n.id for n in plan.graph if n.op == "const"}
        for step in plan.steps:
            nodes = step.nodes if isinstance(step, Kernel) else (step.node,)
            inside = set(nodes)
            for n in nodes:
                node = plan.graph.node(n)
                assert all(a in ready or a in inside for a in node.args)
                assert node.shape.dyn <= ready | inside
            ready |= inside


def test_shape_only_operands_are_not_kernel_inputs():
    src = "op f(x) -> y { y = 2 * x } grad(dy) -> dx { dx = ones_like(dy) }"
    plan = _op(src, "f").methods["fwd_bwd"].fused
    (kernel,) = plan.steps
    names = {plan.graph.node(i).attr("name") for i in kernel.inputs}
    assert names == {"x"}          # dy gives only its shape to ones_like
