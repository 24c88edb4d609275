"""Custom regions for autodiff: a rule's backward copied in, and copies of
forward bodies.

A :class:`~gradc.ir.graph.CustomRegion` is an inlined call of an op with a
``grad`` block, whose rule holds the block lowered once (a
:class:`~gradc.ir.graph.Template` over the call's residuals).  Reverse mode
applies it to the cotangents of the call's outputs, forward mode to
placeholders to transpose it; both go through :func:`apply_rule`.  Where an
outer derivative differentiates a gradient (:mod:`gradc.autodiff.higher`),
forward bodies are copied (:func:`copy_nodes`) so that the copy differentiates
by its derived rules.
"""
from __future__ import annotations

from typing import Sequence

from gradc.autodiff.core import zeros_like
from gradc.ir.builder import Builder
from gradc.ir.graph import CustomRegion, Graph, inline, remap_region


def apply_rule(graph: Graph, region: CustomRegion,
               upstreams: Sequence[int | None]) -> tuple[list[int], list[int]]:
    """``region``'s rule applied in ``graph``: its backward copied in with its
    upstreams bound to ``upstreams`` (a zero array of its output's shape for
    None).  Returns the upstream nodes and one gradient node per differentiable
    parameter; raises the error that lowering the block raised, if any."""
    rule = region.rule
    if rule.error is not None:
        raise rule.error
    b = Builder(graph)
    ups = [u if u is not None else zeros_like(b, o) for u, o in zip(upstreams, region.outputs)]
    return ups, inline(graph, rule.backward, ups)


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
    graph.regions = graph.regions + [remap_region(r, mapping) for r in kept]
    return mapping
