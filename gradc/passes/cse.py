"""Common-subexpression elimination by structural hashing."""
from __future__ import annotations

from gradc.ir.graph import Graph


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """No two live nodes have the same (op, args, attrs, dtype); params stay distinct."""
    out = graph.copy()
    seen: dict[tuple, int] = {}
    mapping: dict[int, int] = {}
    for nid in out.topo_order():
        node = out.node(nid)
        if node.op == "param":
            continue
        key = (node.op, node.args, node.attrs, node.dtype,
               node.shape if not node.args else None)
        first = seen.setdefault(key, nid)
        if first != nid:
            out.replace_uses(nid, first)
            mapping[nid] = first
    out.substitute_shapes(mapping)
    return out
