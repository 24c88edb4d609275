"""Dead-code elimination."""
from __future__ import annotations

from gradc.ir.graph import Graph


def eliminate_dead_code(graph: Graph) -> Graph:
    """Every node left is a param or an ancestor of an output."""
    out = graph.copy()
    keep = out.ancestors(out.outputs) | set(out.params)
    out.remove([n for n in list(out.dg.nodes) if n not in keep])
    return out
