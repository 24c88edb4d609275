"""Custom regions for autodiff: the names a grad block reads, its lowering, and
copies of forward bodies.

A :class:`~gradc.ir.graph.CustomRegion` is an inlined call of an op with a
``grad`` block.  Reverse mode lowers the block over the cotangents of the
call's outputs, forward mode over placeholders to transpose it; both go
through :func:`lower_grad_block`, which calls the region's own
``lower_block`` (given by the lowerer: autodiff never imports it).  Where the
block calls ``grad()``, or an outer derivative differentiates a gradient
(:mod:`gradc.autodiff.higher`), forward bodies are copied
(:func:`copy_nodes`) so that the copy differentiates by its derived rules.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from gradc.autodiff.core import zeros_like
from gradc.errors import GradientError
from gradc.frontend import ast
from gradc.ir.builder import Builder
from gradc.ir.graph import CustomRegion, Graph


def lower_grad_block(graph: Graph, region: CustomRegion,
                     upstreams: Sequence[int | None]) -> dict[str, int]:
    """The names of ``region``'s grad block once lowered into ``graph``: its
    residuals (:func:`block_scope`), its upstreams bound to ``upstreams`` (a zero
    array of its output's shape for None) and its statements.  Raises
    :class:`GradientError` unless it gives one gradient per differentiable
    parameter."""
    block = region.op.grad
    scope = block_scope(graph, region)
    b = Builder(graph)
    for name, u, o in zip(block.upstreams, upstreams, region.outputs):
        scope[name] = u if u is not None else zeros_like(b, o)
    scope = region.lower_block(graph, scope)
    _check_gradient_count(region)
    return scope


def _check_gradient_count(region: CustomRegion) -> None:
    """The grad block of ``region`` must give one gradient per differentiable parameter."""
    op, block = region.op, region.op.grad
    n_diff = sum(p.differentiable for p in op.params)
    if n_diff != len(block.outputs):
        raise GradientError(f"the grad block of '{op.name}' gives {len(block.outputs)} "
                            f"gradients, but '{op.name}' has {n_diff} differentiable "
                            "parameters", block.span)


def block_scope(graph: Graph, region: CustomRegion) -> dict[str, int]:
    """The names ``region``'s grad block reads: the region's own nodes, or, when the
    block calls ``grad()``, :func:`residual_scope` (differentiating the region's own
    nodes would enter its grad block again, without end)."""
    if ast.calls(region.op.grad.body, "grad", region.ops):
        return residual_scope(graph, region)
    return dict(region.names)


def residual_scope(graph: Graph, region: CustomRegion) -> dict[str, int]:
    """The names a grad block reads, bound to a copy of the region's forward body in
    which the region itself is plain: what ``grad()`` inside the block
    differentiates, so that a residual's gradient is its forward body's (a
    custom op's own rule would recurse).  Custom calls inside stay custom."""
    mapping = copy_nodes(graph, set(region.nodes), region.nodes, [region])
    return {k: mapping.get(v, v) for k, v in region.names.items()}


def copy_nodes(graph: Graph, copied: set[int], dissolved: frozenset[int],
               applied: list[CustomRegion]) -> dict[int, int]:
    """Add a copy of the ``copied`` nodes (operands outside it read as they are) and
    return the map from each node to its copy.  The regions nested in ``dissolved``
    (other than the ``applied`` ones) that the copy touches are copied whole, and
    stay custom regions."""
    kept = [r for r in graph.regions if r.nodes <= dissolved and r.nodes & copied
            and all(r is not a for a in applied)]
    for r in kept:
        copied |= r.nodes
    mapping: dict[int, int] = {}
    for n in graph.topo_order():
        if n in copied:
            node = graph.node(n)
            mapping[n] = graph.next_id
            graph.add(node.op, [mapping.get(a, a) for a in node.args], dict(node.attrs),
                      node.shape.substitute(mapping), node.dtype, node.span)
    graph.regions = graph.regions + [
        replace(remap_region(r, mapping), outputs=tuple(mapping[o] for o in r.outputs),
                nodes=frozenset(mapping[n] for n in r.nodes)) for r in kept]
    return mapping


def remap_region(region: CustomRegion, mapping: dict[int, int]) -> CustomRegion:
    """``region`` reading the copies of its inputs and names."""
    return replace(region, inputs=tuple(mapping.get(i, i) for i in region.inputs),
                   names={k: mapping.get(v, v) for k, v in region.names.items()})
