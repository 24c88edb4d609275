"""The graph IR: a thin wrapper over :class:`networkx.DiGraph`.

One :class:`Node` per primitive application.  ``Node.args`` is the source of
truth for operand order (``x * x`` repeats an argument, which DiGraph edges
cannot express); edges are a derived index used by networkx algorithms and
checked against ``args`` by :func:`gradc.ir.verify.verify`.

A graph has named ``params`` (node ids of ``param`` nodes, in call order) and
``outputs`` (node ids of results, in order, each with the shape class the
caller will see).  Custom-gradient call sites are recorded as
:class:`CustomRegion` s: the nodes inlined from the callee's forward body,
whose gradient is the callee's ``grad`` block instead of the derived one.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping

import networkx as nx

from gradc.errors import Span
from gradc.ir.shapes import Shape

FLOAT = "T"          # the op's floating-point compute dtype, fixed at call time
DTYPES = (FLOAT, "bool", "i32", "i64")


@dataclass(frozen=True)
class Node:
    id: int
    op: str
    args: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    shape: Shape
    dtype: str
    span: Span | None = None

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def value(self) -> float:
        """The value of a ``const`` node."""
        return self.attr("value")


def freeze_attrs(attrs: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((attrs or {}).items()))


@dataclass
class CustomRegion:
    """An inlined call of an op with a ``grad`` block (JAX's ``custom_vjp_call``).

    ``inputs`` maps each callee parameter, in order, to the caller node passed
    for it; ``names`` maps every name the grad block may read (parameters and
    forward-body names) to its node; ``outputs`` are the call's results, in
    order; ``nodes`` is every node created by the inlining.  ``lower_block(graph,
    scope) -> scope`` lowers the grad block's statements into a graph over the
    nodes ``scope`` names, as JAX's ``custom_vjp_call`` holds its ``bwd``: the
    lowerer (:func:`gradc.ir.lower.grad_block_lowerer`) gives it, and autodiff
    calls it when it differentiates the call, without importing the lowerer.
    """

    op: Any                       # gradc.frontend.ast.OpDef
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    names: dict[str, int]
    nodes: frozenset[int]
    span: Span | None = None
    ops: Mapping[str, Any] = field(default_factory=dict)      # for calls in the grad block
    consts: Mapping[str, float] = field(default_factory=dict)
    lower_block: Callable[["Graph", dict[str, Any]], dict[str, Any]] | None = None


@dataclass
class Graph:
    dg: nx.DiGraph = field(default_factory=nx.DiGraph)
    params: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    output_shapes: list[Shape] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    regions: list[CustomRegion] = field(default_factory=list)
    next_id: int = 0
    # Warnings found while building the graph (GradcWarning), shared by copies.
    diagnostics: list = field(default_factory=list)

    # -- construction ---------------------------------------------------
    def add(self, op: str, args: Iterable[int], attrs: Mapping[str, Any] | None,
            shape: Shape, dtype: str, span: Span | None = None) -> int:
        nid = self.next_id
        self.next_id += 1
        node = Node(nid, op, tuple(args), freeze_attrs(attrs), shape, dtype, span)
        self.dg.add_node(nid, node=node)
        for a in node.args:
            self.dg.add_edge(a, nid)
        return nid

    def set_output(self, nid: int, shape: Shape | None = None, name: str = "") -> None:
        self.outputs.append(nid)
        self.output_shapes.append(self.node(nid).shape if shape is None else shape)
        self.output_names.append(name)

    # -- queries ----------------------------------------------------------
    def node(self, nid: int) -> Node:
        return self.dg.nodes[nid]["node"]

    def __contains__(self, nid: int) -> bool:
        return nid in self.dg

    def __len__(self) -> int:
        return self.dg.number_of_nodes()

    def __iter__(self) -> Iterator[Node]:
        return (self.node(n) for n in self.topo_order())

    def users(self, nid: int) -> list[int]:
        return sorted(self.dg.successors(nid))

    def topo_order(self) -> list[int]:
        """Node ids in a deterministic topological order (ties by id)."""
        return list(nx.lexicographical_topological_sort(self.dg))

    def ancestors(self, nids: Iterable[int]) -> set[int]:
        out: set[int] = set()
        for n in nids:
            if n not in out:
                out |= nx.ancestors(self.dg, n)
                out.add(n)
        return out

    # -- rewriting --------------------------------------------------------
    def copy(self) -> "Graph":
        return Graph(self.dg.copy(), list(self.params), list(self.outputs),
                     list(self.output_shapes), list(self.output_names),
                     list(self.regions), self.next_id, self.diagnostics)

    def update(self, nid: int, **changes: Any) -> None:
        """Replace fields of node ``nid`` (args, attrs, shape, dtype, op)."""
        old = self.node(nid)
        if "attrs" in changes and isinstance(changes["attrs"], Mapping):
            changes["attrs"] = freeze_attrs(changes["attrs"])
        new = replace(old, **changes)
        if new.args != old.args:
            for a in set(old.args):
                self.dg.remove_edge(a, nid)
            for a in new.args:
                self.dg.add_edge(a, nid)
        self.dg.nodes[nid]["node"] = new

    def replace_uses(self, old: int, new: int) -> None:
        """Make every user of ``old`` (and every output) use ``new`` instead."""
        if old == new:
            return
        for u in list(self.dg.successors(old)):
            node = self.node(u)
            self.update(u, args=tuple(new if a == old else a for a in node.args))
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove(self, nids: Iterable[int]) -> None:
        self.dg.remove_nodes_from(list(nids))


def outermost_regions(graph: Graph) -> list[CustomRegion]:
    """The custom regions not nested in another one, whose rules are the ones used
    (of two with the same nodes, an op whose body is one call, the later: the op's)."""
    regions = graph.regions
    return [r for k, r in enumerate(regions)
            if not any(r.nodes < o.nodes for o in regions)
            and not any(r.nodes == o.nodes for o in regions[k + 1:])]


def unit_order(graph: Graph, nodes: set[int], regions: list[CustomRegion]) -> list:
    """``nodes`` in topological order, each of ``regions`` (disjoint: the outermost
    ones) met as one unit after its inputs; ties broken by node id, regions after
    nodes, so the order is deterministic."""
    owner = {n: -1 - k for k, r in enumerate(regions) for n in r.nodes if n in nodes}
    q = nx.DiGraph()
    q.add_nodes_from(owner.get(n, n) for n in nodes)
    for k, r in enumerate(regions):
        if -1 - k in q:
            q.add_edges_from((i, -1 - k) for i in r.inputs if i in nodes)
    for a, b in graph.dg.subgraph(nodes).edges:
        ua, ub = owner.get(a, a), owner.get(b, b)
        if ua != ub:
            q.add_edge(ua, ub)
    order = nx.lexicographical_topological_sort(q, key=lambda u: (u < 0, abs(u)))
    return [regions[-1 - u] if u < 0 else u for u in order]
