"""Linearity of a graph in some of its nodes (the cotangents of a custom VJP).

A VJP is linear in its cotangent: ``vjp(x, a*u + b*v) = a*vjp(x, u) + b*vjp(x, v)``.
A grad block that is not (``dx = dy * dy``, ``dx = dy + 1``, ``clip(dy, -1, 1)``)
is almost always a mistake: gradient accumulation, loss scaling and
mixed-precision training all assume linearity, and such a rule cannot be
transposed into a JVP.  This module classifies every node that depends on the
``sources`` as linear in them or not, from the ``linear``/``multilinear``
fields of the primitive table; nodes that do not depend on the sources are
constants here (residuals of the forward pass).

The analysis is syntactic (as JAX's ``linear_util``/``ad.is_linear`` checks
on jaxprs): ``dy * where(dy > 0, 1, 1)`` is reported as nonlinear because the
condition reads ``dy``.  A symbolic zero (``0``, ``zeros_like``) is linear.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from gradc.autodiff.core import is_zero
from gradc.ir.graph import Graph
from gradc.ir.primitives import PRIMITIVES


@dataclass(frozen=True)
class Nonlinear:
    """Where linearity is first lost: ``node`` applies a primitive nonlinearly
    to operands that depend on the sources ``depends`` (node ids)."""

    node: int
    depends: frozenset[int]


def describe_upstreams(names: Sequence[str]) -> str:
    """``upstream 'dy'``, or ``upstreams 'a', 'b' and 'c'``, for messages."""
    quoted = [f"'{n}'" for n in names]
    if len(quoted) == 1:
        return f"upstream {quoted[0]}"
    return f"upstreams {', '.join(quoted[:-1])} and {quoted[-1]}"


def classify(graph: Graph, sources: Iterable[int], since: int = 0
             ) -> dict[int, Nonlinear | None]:
    """For every node (of id ``since`` or later) that depends on a source: None
    when it is linear in the sources, else the :class:`Nonlinear` node where
    linearity was lost (a node downstream of a nonlinear one inherits it)."""
    deps: dict[int, frozenset[int]] = {s: frozenset([s]) for s in sources}
    verdict: dict[int, Nonlinear | None] = {s: None for s in deps}
    for nid in graph.topo_order():
        if nid in verdict or nid < since:
            continue
        node = graph.node(nid)
        prim = PRIMITIVES[node.op]
        operands = [(i, a) for i, a in enumerate(node.args)
                    if i not in prim.shape_only and a in deps]
        if not operands:
            continue
        deps[nid] = frozenset().union(*(deps[a] for _, a in operands))
        inherited = next((verdict[a] for _, a in operands if verdict[a] is not None), None)
        if inherited is not None:
            verdict[nid] = inherited
            continue
        # a scale-invariant test of an operand keeps linearity in the others (a mask
        # alone is not linear: where only tested operands depend, they count)
        operands = [(i, a) for i, a in operands if i not in prim.scale_tested] or operands
        linear_ok = all(i in prim.linear for i, _ in operands)
        if prim.multilinear:
            linear_ok = linear_ok and len(operands) == 1
        elif linear_ok:        # jointly linear: the other linear operands must be zero
            linear_ok = all(is_zero(graph, a) for i, a in enumerate(node.args)
                            if i in prim.linear and a not in deps)
        verdict[nid] = None if linear_ok else Nonlinear(nid, deps[nid])
    return verdict
