"""Dead-code elimination."""
from __future__ import annotations

from gradc.ir.graph import Graph


def eliminate_dead_code(graph: Graph) -> Graph:
    """Every node left is a param, an ancestor of an output, or the source of a
    run-time shape that a kept node's shape class (or an output's) refers to."""
    out = graph.copy()
    keep = set(out.params)
    todo = set(out.outputs) | {d for s in out.output_shapes for d in s.dyn} \
        | {d for p in out.params for d in out.node(p).shape.dyn}
    while todo:
        new = out.ancestors(todo) - keep
        keep |= new
        todo = {d for n in new for d in out.node(n).shape.dyn} - keep
    out.remove([n for n in list(out.dg.nodes) if n not in keep])
    return out
