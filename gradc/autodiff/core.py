"""The machinery both walkers share: reverse mode (:mod:`gradc.autodiff.reverse`)
and forward mode (:mod:`gradc.autodiff.forward`) differ only in the direction of
the walk and in which rule of the table they instantiate.

- :func:`instantiate`: a primitive's rule (a .grad expression of the table) as
  nodes, over the node's operands, ``out``, its attributes and the cotangent
  ``g`` or a tangent ``x_t``;
- :func:`total`: contributions accumulated (gradients always accumulate), the
  zeros dropped (:func:`is_zero`, the one test of a zero; None is the walkers'
  symbolic zero, :func:`zeros_like` the value it stands for);
- :func:`unbroadcast`: a contribution summed back to its operand's shape;
- :func:`nan_safe`: a rule's result kept 0 where its cotangent or tangent is 0
  and the local derivative is inf or NaN;
- :func:`units`: the order of a walk, an outermost custom region as one unit.
"""
from __future__ import annotations

from gradc.autodiff.rules import rule_ast
from gradc.errors import Span
from gradc.ir.builder import Builder
from gradc.ir.expr import ExprLowerer, operand_scope
from gradc.ir.graph import CustomRegion, Graph, Node, outermost_regions, unit_order
from gradc.ir.primitives import INFIX, PRIMITIVES


def units(graph: Graph, live: set[int]) -> list[int | CustomRegion]:
    """Live nodes in topological order, each outermost custom region as one unit
    (reverse mode walks it backwards)."""
    return unit_order(graph, live, outermost_regions(graph))


def is_zero(graph: Graph, nid: int) -> bool:
    """Whether node ``nid`` is a zero: the constant 0, or an array of zeros
    (``full_like(x, 0)``, which ``zeros_like`` and :func:`zeros_like` build).

    The one test of a zero, for both walkers (a zero contribution is dropped, so
    a cotangent or tangent with none is None, the walkers' symbolic zero),
    linearity (a zero is linear in anything) and simplification (``x + 0``)."""
    node = graph.node(nid)
    while node.op == "full_like":
        node = graph.node(node.args[1])       # the fill value
    return node.op == "const" and node.value == 0


def zeros_like(b: Builder, like: int, span: Span | None = None) -> int:
    """A zero array of ``like``'s shape class, where a symbolic zero (None) must
    become a value: a gradient output, a custom block's upstream, a ``grad()``."""
    return b.apply("full_like", (like, b.const(0.0, span=span)), span=span)


def total(graph: Graph, parts: list[int]) -> int | None:
    """The sum of the contributions ``parts`` to one cotangent or tangent; None
    (no contribution) when every part is a symbolic zero."""
    parts = [p for p in parts if not is_zero(graph, p)]
    if not parts:
        return None
    acc = parts[0]
    b = Builder(graph)
    for p in parts[1:]:
        acc = b.apply("add", (acc, p), span=graph.node(p).span)
    return acc


def unbroadcast(b: Builder, ct: int, operand: int) -> int:
    """``ct`` summed to ``operand``'s shape class, where a primitive broadcast it."""
    graph = b.graph
    if graph.node(ct).shape == graph.node(operand).shape:
        return ct
    return b.apply("sum_to", (ct, operand))


def instantiate(graph: Graph, rule: str, node: Node, extra: dict[str, int], b: Builder) -> int:
    """Lower a rule of ``node``'s primitive: its operands by parameter name, ``out``,
    its attributes, and ``extra`` (the cotangent ``g``, or a tangent ``x_t``)."""
    scope = operand_scope(node)
    scope.update(out=node.id, **extra)
    return ExprLowerer(graph, {}, rules=True, span=node.span).expr(rule_ast(rule), scope)


def nan_safe(b: Builder, node: Node, part: int, scale: int) -> int:
    """``part``, a rule's result for ``node`` that is linear in ``scale`` (the
    cotangent ``g``, or an operand's tangent), made NaN-safe where the primitive's
    local derivative can be inf or NaN: ``zero_masked(part, scale)`` is 0 where
    ``scale`` is 0 and ``part`` is NaN (``0 * inf``, ``0 / 0``, which would leak NaN
    from the unselected branch of a ``where``; docs/numerics.md).  Only there: where
    ``part`` is a number, a derivative of the gradient (second order) still sees its
    dependence on ``scale`` (``where(g == 0, 0, ct)`` would make it 0 wherever a
    cotangent is 0)."""
    if PRIMITIVES[node.op].masks_zero_cotangent and node.attr("zero_mask", True):
        return b.apply("zero_masked", (part, scale))
    return part


def surface(op: str) -> str:
    """The .grad spelling of a primitive, for messages (``zero_masked``, which no
    file spells, by its NaN test ``ct != ct``, where it reads its operand nonlinearly)."""
    return INFIX.get(op) or {"neg": "unary -", "maximum": "max", "minimum": "min",
                             "zero_masked": "!="}.get(op, op)
