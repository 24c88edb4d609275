"""Structural checks of a graph, run after every pass in tests and under --debug."""
from __future__ import annotations

from collections import Counter

import networkx as nx

from gradc.errors import InternalError
from gradc.ir.graph import DTYPES, Graph
from gradc.ir.primitives import PRIMITIVES


def verify(graph: Graph, after: str = "") -> None:
    """Raise InternalError unless the graph is acyclic, its ops are registered, arities
    match, edges agree with ``args``, dtypes are known and outputs exist."""
    where = f" after {after}" if after else ""
    if not nx.is_directed_acyclic_graph(graph.dg):
        raise InternalError(f"graph has a cycle{where}")
    for nid in graph.dg.nodes:
        node = graph.node(nid)
        prim = PRIMITIVES.get(node.op)
        if prim is None:
            raise InternalError(f"node %{nid}: unknown op '{node.op}'{where}")
        if len(node.args) != len(prim.params):
            raise InternalError(f"node %{nid}: '{node.op}' has {len(node.args)} args, "
                                f"expects {len(prim.params)}{where}")
        if set(graph.dg.predecessors(nid)) != set(node.args):
            raise InternalError(f"node %{nid}: edges disagree with args{where}")
        if node.dtype not in DTYPES:
            raise InternalError(f"node %{nid}: unknown dtype {node.dtype!r}{where}")
        for d in node.shape.dyn:
            if d not in graph:
                raise InternalError(f"node %{nid}: shape names missing node %{d}{where}")
    for o in graph.outputs:
        if o not in graph:
            raise InternalError(f"output %{o} is not in the graph{where}")
    counts = Counter(graph.params)
    if any(c > 1 for c in counts.values()):
        raise InternalError(f"a param is listed twice{where}")
