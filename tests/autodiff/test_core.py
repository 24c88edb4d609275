"""The machinery both walkers share (:mod:`gradc.autodiff.core`): one test of a
zero, and the modules of the autodiff import no private name of another."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gradc
from gradc.autodiff.core import is_zero, zeros_like
from gradc.frontend.check import check_source
from gradc.ir.builder import Builder
from gradc.ir.graph import FLOAT, Graph
from gradc.ir.shapes import Shape
from gradc.pipeline import build_op

AUTODIFF = Path(gradc.__file__).parent / "autodiff"


def _graph():
    g = Graph()
    b = Builder(g)
    return g, b, b.param("x", Shape((3,)), FLOAT, None)


def test_a_zero_is_the_constant_0_or_an_array_of_it():
    g, b, x = _graph()
    zeros = [b.const(0.0), b.const(-0.0), zeros_like(b, x),
             b.apply("full_like", (x, b.const(0, "i32")))]
    others = [x, b.const(1.0), b.apply("full_like", (x, b.const(2.0))),
              b.apply("mul", (x, b.const(0.0)))]          # x * 0 is NaN where x is inf
    assert [is_zero(g, z) for z in zeros] == [True] * 4
    assert [is_zero(g, o) for o in others] == [False] * 4
    assert g.node(zeros_like(b, x)).shape == g.node(x).shape


@pytest.mark.parametrize("zero", ["0", "zeros_like(w)", "zeros_like(x * w)"])
def test_every_spelling_of_a_zero_gradient_is_the_same_symbolic_zero(zero):
    """A grad block's ``dw = 0`` and ``dw = zeros_like(w)`` give no contribution:
    no rule runs on it (tanh's), and the gradient is the materialised zero."""
    src = (f"op f(x, w) -> y {{\n    y = x * w\n}} grad(dy) -> (dx, dw) {{\n"
           f"    dx = dy * w\n    dw = {zero}\n}}\nop h(x, w) -> z {{\n    z = f(x, tanh(w)) * 3\n}}\n")
    program = check_source(src, "z.grad")
    vjp = build_op(program.ops["h"], program.ops, program.consts).methods["vjp"].graph
    dw = vjp.node(vjp.outputs[1])
    assert dw.op == "full_like" and is_zero(vjp, dw.id)


def test_no_private_name_is_imported_across_autodiff_modules():
    for path in sorted(AUTODIFF.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gradc"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
