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

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

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


_TEMPLATE_IDS = itertools.count(-1, -1)   # ids of template nodes: negative, never reused


@dataclass(frozen=True)
class Template:
    """A graph fragment lowered once and copied in where it is used (:func:`inline`).

    ``nodes`` are in topological order, with ids of their own (negative, unique in
    the process, so no mapping of a graph's ids ever touches them); their
    operands are other nodes of the template, its ``placeholders`` (bound at
    each copy) or nodes of the graph it was lowered over: its ``residuals``.
    ``results`` are the nodes the template gives (of any of the three kinds);
    ``regions`` the custom regions among its nodes."""

    nodes: tuple[Node, ...]
    placeholders: tuple[int, ...]
    results: tuple[int, ...]
    regions: tuple["CustomRegion", ...] = ()

    @property
    def residuals(self) -> tuple[int, ...]:
        """The graph's nodes the template reads (its results included), in order."""
        own = {n.id for n in self.nodes} | set(self.placeholders)
        reads = [a for n in self.nodes for a in n.args] + list(self.results)
        return tuple(sorted({a for a in reads if a not in own}))

    @classmethod
    def extract(cls, graph: "Graph", since: int, placeholders: Sequence[int],
                results: Sequence[int], regions: Sequence["CustomRegion"]) -> "Template":
        """The nodes of ``graph`` from id ``since`` on as a template (renumbered)."""
        ids = [n for n in graph.topo_order() if n >= since and n not in placeholders]
        mapping = {n: next(_TEMPLATE_IDS) for n in [*placeholders, *ids]}
        nodes = tuple(_remap_node(graph.node(n), mapping, mapping[n]) for n in ids)
        return cls(nodes, tuple(mapping[p] for p in placeholders),
                   tuple(mapping.get(r, r) for r in results),
                   tuple(remap_region(r, mapping) for r in regions))

    def remap(self, mapping: Mapping[int, int]) -> "Template":
        """The template reading ``mapping``'s replacements of its residuals."""
        if not mapping:
            return self
        return Template(tuple(_remap_node(n, mapping, n.id) for n in self.nodes),
                        self.placeholders, tuple(mapping.get(r, r) for r in self.results),
                        tuple(remap_region(r, mapping) for r in self.regions))


def _remap_node(node: Node, mapping: Mapping[int, int], nid: int) -> Node:
    return replace(node, id=nid, args=tuple(mapping.get(a, a) for a in node.args),
                   shape=node.shape.substitute(dict(mapping)))


def inline(graph: "Graph", template: Template, bindings: Sequence[int]) -> list[int]:
    """Copy ``template`` into ``graph``, its placeholders bound to ``bindings``;
    return the nodes of its results.  The one way a lowered fragment (a custom
    rule's backward) becomes part of a graph: no re-lowering, no AST."""
    mapping = dict(zip(template.placeholders, bindings))
    for node in template.nodes:
        mapping[node.id] = graph.next_id       # a shape class may name its own node
        graph.add(node.op, [mapping.get(a, a) for a in node.args], dict(node.attrs),
                  node.shape.substitute(mapping), node.dtype, node.span)
    graph.regions = graph.regions + [remap_region(r, mapping) for r in template.regions]
    return [mapping.get(r, r) for r in template.results]


@dataclass(frozen=True)
class CustomRule:
    """An op's ``grad`` block as the IR holds it: names, spans, and the block
    lowered once (``backward``, a :class:`Template` whose placeholders are the
    upstream cotangents and whose results are the gradients, one per
    differentiable parameter, in order), or the error lowering it raised,
    raised again where the rule is used."""

    op: str
    params: tuple[str, ...]
    differentiable: tuple[bool, ...]
    upstreams: tuple[str, ...]
    gradients: tuple[str, ...]
    span: Span                                    # the 'grad' keyword
    gradient_spans: Mapping[str, Span] = field(default_factory=dict)
    surrogate: bool = False
    backward: Template | None = None
    error: Exception | None = None

    def remap(self, mapping: Mapping[int, int]) -> "CustomRule":
        if self.backward is None:
            return self
        return replace(self, backward=self.backward.remap(mapping))


@dataclass(frozen=True)
class CustomRegion:
    """An inlined call of an op with a ``grad`` block (JAX's ``custom_vjp_call``):
    its forward body is the ``nodes`` (the inlined call, in the graph), its
    backward is ``rule.backward`` (lowered once, reading the forward's residuals).

    ``inputs`` are the caller's nodes passed for the callee's parameters, in
    order; ``outputs`` the call's results, in order.  Autodiff uses the rule
    instead of the nodes' derived rules; passes leave the nodes as written
    until differentiation is done (:func:`dissolve_regions`).  ``span``: the call
    where ``called`` (another op calls the op), else the op's own definition."""

    rule: CustomRule
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    nodes: frozenset[int]
    span: Span | None = None
    called: bool = False

    @property
    def differentiable_inputs(self) -> list[tuple[str, int]]:
        """(parameter name, input node) per differentiable parameter, in order: what
        the rule's gradients are for."""
        rule = self.rule
        return [(p, a) for p, a, d in zip(rule.params, self.inputs, rule.differentiable) if d]


def remap_region(region: CustomRegion, mapping: Mapping[int, int]) -> CustomRegion:
    """``region`` with every node it names (inputs, outputs, nodes, and the
    residuals of its rule) replaced by ``mapping``'s image, where it has one."""
    get = lambda n: mapping.get(n, n)
    return replace(region, rule=region.rule.remap(mapping),
                   inputs=tuple(map(get, region.inputs)),
                   outputs=tuple(map(get, region.outputs)),
                   nodes=frozenset(map(get, region.nodes)))


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

    def substitute_shapes(self, moved: Mapping[int, int]) -> None:
        """After nodes ``old`` of ``moved`` were replaced by ``new`` ones (the same values,
        so the same run-time shapes): where old's shape class is one node's run-time
        shape, ``shape(%a)``, and new's another one's, ``shape(%b)``, every shape class
        (of a node or an output) that refers to ``a`` refers to ``b`` instead, so that no
        class keeps a replaced node alive (``a`` is old itself for a node whose shape
        only its value tells, an expand_dims of a reduction; its operand for an
        elementwise node, ``sqrt`` of a ``sum``); where old's class is its own shape
        with others', ``shape(%old)`` is ``shape(%new)``."""
        mapping: dict[int, int] = {}
        for old, new in moved.items():
            a, b = self.node(old).shape, self.node(new).shape
            if not a.static and not b.static and len(a.dyn) == len(b.dyn) == 1 \
                    and a.dyn != b.dyn:
                mapping[next(iter(a.dyn))] = next(iter(b.dyn))
            elif old in a.dyn:                  # old's shape among others': new's
                mapping.setdefault(old, new)
        for a in list(mapping):                 # a chain of replacements: its last
            seen = {a}
            while mapping[a] in mapping and mapping[a] not in seen:
                seen.add(mapping[a])
                mapping[a] = mapping[mapping[a]]
        if not mapping:
            return
        for nid in list(self.dg.nodes):
            node = self.node(nid)
            shape = node.shape.substitute(mapping)
            if shape != node.shape:
                self.update(nid, shape=shape)
        self.output_shapes = [s.substitute(mapping) for s in self.output_shapes]

    def remove(self, nids: Iterable[int]) -> None:
        self.dg.remove_nodes_from(list(nids))


def outermost_regions(graph: Graph) -> list[CustomRegion]:
    """The custom regions of ``graph`` not nested in another one (:func:`outermost`)."""
    return outermost(graph.regions)


def outermost(regions: Sequence[CustomRegion]) -> list[CustomRegion]:
    """The regions not nested in another one, whose rules are the ones used
    (of two with the same nodes, an op whose body is one call, the later: the op's)."""
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
