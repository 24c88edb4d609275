"""Fusion: the kernel plan of a graph.

Connected elementwise nodes of equal shape class are grouped into one
:class:`Kernel` (one loop over memory), as long as the group does not need a
value that itself needs the group (no cycle through a reduction or matmul).
Everything else (reductions, matmul, layout) is a :class:`LibraryCall`, a
kernel boundary run by NumPy.  With ``fuse=False`` every elementwise node is
its own kernel and every intermediate is stored: the baseline that shows
what fusion buys.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

import networkx as nx

from gradc.ir.graph import FLOAT, Graph
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES, REDUCTION, SOURCE
from gradc.ir.shapes import Shape, broadcast


@dataclass(frozen=True)
class Kernel:
    """One fused loop: ``nodes`` in order, reading ``inputs``, storing ``outputs``."""

    nodes: tuple[int, ...]
    inputs: tuple[int, ...]       # array values read (params and earlier results)
    outputs: tuple[int, ...]      # values stored for later steps or the caller
    shape: Shape                  # the iteration space: every node's shape, or (a cheap
    #                               node _sink moved in) one that broadcasts to it


@dataclass(frozen=True)
class LibraryCall:
    node: int


Step = Union[Kernel, LibraryCall]


@dataclass(frozen=True)
class KernelPlan:
    graph: Graph
    steps: tuple[Step, ...]
    fused: bool = True            # planned with fusion (False: one kernel per primitive)


def _is_fusable(graph: Graph, nid: int) -> bool:
    node = graph.node(nid)
    return PRIMITIVES[node.op].kind == ELEMENTWISE and bool(node.args)


class _Groups:
    """Fusion groups and the quotient graph over them, updated merge by merge.

    A group is named by one of its nodes (its id, what :func:`group_elementwise`
    returns); in the quotient graph ``q`` it is one unit, the root of its members'
    union-find tree.  A merge moves the edges of the unit with fewer of them (and
    re-roots that tree), so that growing one big group node by node costs time in
    proportion to the nodes, not to their square."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.parent: dict[int, int] = {}      # fusable node -> its tree's parent
        self.label: dict[int, int] = {}       # unit (a root) -> the group's id
        self.alive: set[int] = set()          # group ids not merged away
        self.q = graph.dg.copy()          # units: group roots and unfused node ids
        order = graph.topo_order()
        self.pos = {n: k for k, n in enumerate(order)}   # a unit's first member's position
        self.horizon = len(order)         # units starting later cannot lead back

    def add(self, nid: int) -> None:
        self.parent[nid] = nid
        self.label[nid] = nid
        self.alive.add(nid)

    def __contains__(self, nid: int) -> bool:
        return nid in self.parent

    def _root(self, nid: int) -> int:
        root = nid
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[nid] != root:           # path compression
            self.parent[nid], nid = root, self.parent[nid]
        return root

    def group(self, nid: int) -> int:
        return self.label[self._root(nid)]

    def group_of(self) -> dict[int, int]:
        return {n: self.group(n) for n in self.parent}

    def groups(self) -> list[int]:
        return sorted(self.alive)

    def try_merge(self, a: int, b: int) -> None:
        """Merge group ``a`` into ``b`` unless a path between them leaves both
        (which would make the plan cyclic)."""
        if a == b:
            return
        ua, ub = self._root(a), self._root(b)
        if self._joined_outside(ua, ub) or self._joined_outside(ub, ua):
            return
        keep, gone = (ua, ub) if self.q.degree(ua) > self.q.degree(ub) else (ub, ua)
        for p in list(self.q.predecessors(gone)):
            if p != keep:
                self.q.add_edge(p, keep)
        for c in list(self.q.successors(gone)):
            if c != keep:
                self.q.add_edge(keep, c)
        self.q.remove_node(gone)
        self.parent[gone] = keep
        self.label[keep] = b
        del self.label[gone]
        self.alive.discard(a)
        self.pos[keep] = min(self.pos[ua], self.pos[ub])

    def _joined_outside(self, src: int, dst: int) -> bool:
        stack = [s for s in self.q.successors(src) if s != dst]
        seen = set(stack)
        while stack:
            n = stack.pop()
            if n == dst:
                return True
            for s in self.q.successors(n):
                if s not in seen and self.pos[s] <= self.horizon:
                    seen.add(s)
                    stack.append(s)
        return False


def group_elementwise(graph: Graph, fuse: bool = True) -> dict[int, int]:
    """Map each fusable node to its group's id (a node of the group)."""
    groups = _Groups(graph)
    for nid in graph.topo_order():
        if not _is_fusable(graph, nid):
            continue
        groups.add(nid)
        if not fuse:
            continue
        # Nodes after nid in topological order are still single units whose
        # successors come later too: no path through them returns to nid.
        groups.horizon = groups.pos[nid]
        shape = graph.node(nid).shape
        for g in sorted({groups.group(a) for a in graph.node(nid).args
                         if a in groups and graph.node(a).shape == shape}):
            groups.try_merge(g, groups.group(nid))
    groups.horizon = len(groups.pos)
    if fuse:                            # horizontal: independent loops over one shape
        flags = _group_flags(graph, groups)
        for gid in groups.groups():
            for other in groups.groups():
                if other < gid and gid in groups.alive and other in groups.alive and \
                        graph.node(other).shape == graph.node(gid).shape and \
                        not _holds_back(graph, flags, gid, other):
                    groups.try_merge(other, gid)
                    if other not in groups.alive:     # merged: the flags of both
                        flags[gid] = tuple(map(max, flags[gid], flags.pop(other)))
        return _sink(graph, groups.group_of())
    return groups.group_of()


def is_reduction(graph: Graph, nid: int) -> bool:
    node = graph.node(nid)
    return PRIMITIVES[node.op].kind == REDUCTION or node.op == "sum_to"


def row_kernel_takes(graph: Graph, nid: int) -> bool:
    """Whether :func:`gradc.passes.fuse_reduce.fuse_reductions` may take node ``nid``
    into a row kernel (where its shapes fit): an elementwise node, a ``broadcast_in``,
    a reduction.  Any other library call stays a kernel boundary."""
    return PRIMITIVES[graph.node(nid).op].kind == ELEMENTWISE or \
        graph.node(nid).op == "broadcast_in" or is_reduction(graph, nid)


def _group_flags(graph: Graph, groups: _Groups) -> dict[int, tuple[bool, bool]]:
    """Per group: whether a library call that stays a kernel boundary reads it, and
    whether it needs a reduction's value (a row's max, a mean), directly or not."""
    late: set[int] = set()
    for nid in graph.topo_order():
        if any(a in late or is_reduction(graph, a) for a in graph.node(nid).args):
            late.add(nid)
    flags = {g: (False, False) for g in groups.groups()}
    for n, g in groups.group_of().items():
        called = any(u not in groups and not row_kernel_takes(graph, u)
                     and PRIMITIVES[graph.node(u).op].kind != SOURCE
                     and n in value_args(graph, u) for u in graph.users(n))
        flags[g] = (flags[g][0] or called, flags[g][1] or n in late)
    return flags


def _holds_back(graph: Graph, flags: dict, a: int, b: int) -> bool:
    """Whether merging independent groups ``a`` and ``b`` would make a library call
    that reads one of them wait for a reduction that only the other needs: the labels
    a cross-entropy's one_hot checks, beside its smoothing term's (a mean of the
    logits), would leave the check, and the gradient after it, outside the row
    kernel that computes the mean (fuse_reduce).  Not over a shape known only at run
    time, where no row kernel forms."""
    if graph.node(a).shape.dyn:
        return False
    return any(flags[x][0] and flags[y][1] and not flags[x][1] for x, y in ((a, b), (b, a)))


def _sink(graph: Graph, group_of: dict[int, int]) -> dict[int, int]:
    """Move values that a group stores only for one later group into that group.

    Fusion merges a node into the group of its operands, so ``1 - t^2`` of a
    forward ``t = tanh(...)`` lands in the forward loop and is stored for the
    backward loop that multiplies it with a matmul's result.  Computed in the
    backward loop instead, from ``t`` (stored anyway), it costs no array: the
    forward loop writes one array less and the backward one reads ``t``
    instead of it.  A node ``n`` of group ``G`` whose users all lie in one other
    group ``H`` moves there with the ancestors in ``G`` that only it (and ``H``)
    use, when every value they read is a constant, a value from outside ``G``
    or one ``G`` stores anyway, and ``H`` reads no more arrays than the move
    saves stores.  Nothing is computed twice, and ``H`` comes after ``G`` (it
    read ``n``), so the plan stays acyclic.  Group ids stay members.

    Over shapes known only at run time, ``H``'s loop may be over a broadcast of
    ``G``'s shape and another (``tanh(x * 2 + b)``: ``x * 2`` over ``shape(x)``, the
    rest over the broadcast of ``x`` and the bias ``b``): the move is made there too
    where every node moved is cheap arithmetic (:data:`CHEAP`), since ``H`` computes
    it once per element of its loop, the loop reading ``G``'s inputs broadcast to it
    (one loop for the two, which reads ``b`` per row where it is one row).
    """
    group_of = dict(group_of)
    outputs = set(graph.outputs)
    members: dict[int, set[int]] = {}
    for n, g in group_of.items():
        members.setdefault(g, set()).add(n)

    reads = lambda nid: value_args(graph, nid)

    def users_of(nid: int) -> list[int]:     # those that read its values, not its shape
        return [u for u in graph.users(nid) if nid in reads(u)]

    def stored(nid: int) -> bool:
        return nid in outputs or any(group_of.get(u) != group_of[nid] for u in users_of(nid))

    changed = True
    while changed:
        changed = False
        for n in reversed(graph.topo_order()):
            g = group_of.get(n)
            users = users_of(n)
            if g is None or n in outputs or not users or \
                    not all(u in group_of for u in users):
                continue
            h = group_of[users[0]]
            if h == g or any(group_of[u] != h for u in users) or \
                    not _sinks_into(graph.node(n).shape, graph.node(users[0]).shape):
                continue
            move, todo = {n}, [n]
            while todo:                      # ancestors in G used only by the move and H
                for a in reads(todo.pop()):
                    if a not in move and group_of.get(a) == g and a not in outputs and \
                            all(u in move or group_of.get(u) == h for u in users_of(a)):
                        move.add(a)
                        todo.append(a)
            if graph.node(n).shape != graph.node(users[0]).shape and \
                    any(graph.node(m).op not in CHEAP for m in move):
                continue                     # computed per element of H's larger loop
            leaves = {a for m in move for a in reads(m) if a not in move}
            if any(group_of.get(a) == g and not stored(a) for a in leaves):
                continue                     # it would store a value G keeps in registers
            h_reads = {a for m in members[h] for a in reads(m) if group_of.get(a) != h}
            new_reads = leaves - h_reads - members[h]
            saved = [m for m in move if stored(m)]
            if len(new_reads) > len(saved):
                continue
            for m in move:
                group_of[m] = h
            members[h] |= move
            members[g] -= move
            if g in move and members[g]:     # relabel G by one of its members
                new_id = min(members[g])
                for m in members[g]:
                    group_of[m] = new_id
                members[new_id] = members.pop(g)
            elif not members[g]:
                del members[g]
            changed = True
            break
    return group_of


def _sinks_into(a: Shape, b: Shape) -> bool:
    """Whether a value over shape ``a`` may move into a loop over shape ``b``: the same
    shape, or shapes known only at run time where ``b`` is a broadcast of ``a`` and others
    (at run time as large as ``a`` or larger in every dim)."""
    return a == b or (bool(a.dyn) and a.dyn <= b.dyn and broadcast([a, b]) == b)


def plan_kernels(graph: Graph, fuse: bool = True) -> KernelPlan:
    """Kernels and library calls in a deterministic order that respects data
    and shape dependencies."""
    group_of = group_elementwise(graph, fuse)
    members: dict[int, list[int]] = {}
    order = graph.topo_order()
    for nid in order:
        if nid in group_of:
            members.setdefault(group_of[nid], []).append(nid)
    outputs = set(graph.outputs)
    steps: dict[int, Step] = {}
    for gid, nodes in members.items():
        inside = set(nodes)
        # stored: the values a result or a later step reads (not those read only for
        # their shape, which the wrappers take from the arguments); computed: those
        # and what they need
        outs = [n for n in nodes if n in outputs or any(
            u not in inside and n in value_args(graph, u) for u in graph.users(n))]
        live, todo = set(outs), list(outs)
        while todo:
            for a in value_args(graph, todo.pop()):
                if a in inside and a not in live:
                    live.add(a)
                    todo.append(a)
        nodes = [n for n in nodes if n in live]
        if not nodes:
            continue
        ins = sorted({a for n in nodes for a in value_args(graph, n) if a not in live})
        # one shape, or a broadcast of a node's moved in by _sink: the larger
        steps[gid] = Kernel(tuple(nodes), tuple(ins), tuple(outs),
                            broadcast(graph.node(n).shape for n in nodes))
    for nid in order:
        node = graph.node(nid)
        if nid not in group_of and PRIMITIVES[node.op].kind != SOURCE:   # arange: no operand
            steps[nid] = LibraryCall(nid)
    return KernelPlan(graph, tuple(_order_steps(graph, steps)), fuse)


def value_args(graph: Graph, nid: int) -> list[int]:
    """Operands of ``nid`` whose values are read (not shape-only, not constants)."""
    node = graph.node(nid)
    skip = PRIMITIVES[node.op].shape_only
    return [a for i, a in enumerate(node.args)
            if i not in skip and graph.node(a).op != "const"]


def value_used(graph: Graph, nid: int) -> bool:
    """Whether some user reads ``nid``'s values, not only its shape."""
    return nid in graph.outputs or any(
        i not in PRIMITIVES[graph.node(u).op].shape_only
        for u in graph.users(nid) for i, a in enumerate(graph.node(u).args) if a == nid)


def _order_steps(graph: Graph, steps: dict[int, Step]) -> list[Step]:
    q = nx.DiGraph()
    q.add_nodes_from(steps)
    at = {n: sid for sid, step in steps.items()
          for n in (step.nodes if isinstance(step, Kernel) else (step.node,))}
    for sid, step in steps.items():
        nodes = step.nodes if isinstance(step, Kernel) else (step.node,)
        shape_deps = {d for n in nodes for d in graph.node(n).shape.dyn}
        # an operand read only for its shape: the steps its run-time shape needs, not
        # its own (the wrappers take its shape from the arguments where its value is
        # not computed yet; a loop may compute it after the call, _sink)
        for n in nodes:
            skip = PRIMITIVES[graph.node(n).op].shape_only
            shape_of = [d for i, a in enumerate(graph.node(n).args) if i in skip
                        for d in graph.node(a).shape.dyn]
            for a in (*value_args(graph, n), *shape_of, *shape_deps):
                if a in at and at[a] != sid:
                    q.add_edge(at[a], sid)
    return [steps[s] for s in nx.lexicographical_topological_sort(q)]


@dataclass(frozen=True)
class MatmulEpilogue(Kernel):
    """A matmul and the elementwise kernel after it, as one step: each element of
    the product goes through ``epilogue``'s loop body as it is computed, instead
    of being stored and read back.  ``inputs`` are the epilogue's other inputs,
    then the matmul's two operands; ``outputs`` the epilogue's, then the product
    when ``store`` (something else reads it).  For backends whose matmul is a
    generated kernel (CUDA); BLAS cannot take an epilogue."""

    matmul: int = -1
    epilogue: Kernel | None = None
    store: bool = False


def attach_epilogues(plan: KernelPlan) -> KernelPlan:
    """``plan`` with each matmul whose product is next read by an elementwise
    kernel over the product's shape merged into that kernel's step
    (:class:`MatmulEpilogue`), at the kernel's place: the operands are computed
    by then, and no step in between reads the product."""
    g = plan.graph
    steps = list(plan.steps)
    k = 0
    while k < len(steps):
        step = steps[k]
        node = g.node(step.node) if isinstance(step, LibraryCall) else None
        if node is None or node.op != "matmul" or node.shape.is_scalar or node.dtype != FLOAT:
            k += 1
            continue
        m = step.node
        readers = [q for q in range(k + 1, len(steps)) if _reads(g, steps[q], m)]
        q = readers[0] if readers else None
        epi = steps[q] if q is not None else None
        # the epilogue is a plain loop: no reduce kernel, no other matmul's epilogue
        if type(epi) is not Kernel or epi.shape != node.shape:
            k += 1
            continue
        store = (m in g.outputs or len(readers) > 1
                 or any(m in n.shape.dyn for n in g if n.id != m))
        fused = MatmulEpilogue(
            nodes=(m, *epi.nodes),
            inputs=tuple(i for i in epi.inputs if i != m) + tuple(node.args[:2]),
            outputs=epi.outputs + ((m,) if store else ()),
            shape=epi.shape, matmul=m, epilogue=epi, store=store)
        steps[q] = fused
        del steps[k]
    return KernelPlan(g, tuple(steps), plan.fused)


def _reads(graph: Graph, step: Step, nid: int) -> bool:
    if isinstance(step, Kernel):
        return nid in step.inputs or any(nid in graph.node(n).shape.dyn for n in step.nodes)
    node = graph.node(step.node)
    return nid in node.args or nid in node.shape.dyn


# Recomputing a stored value in the kernel that reads it: the cost model.  A
# vectorised loop on these machines moves ~15 GB/s on 2 cores (gradc bench's
# copy column), 4 bytes per float32 element and array; the math library's
# transcendentals cost 10-40 instructions per 8 lanes (docs/mathlib.md), so a
# cone of a few arithmetic nodes and at most two transcendentals recomputed per
# element costs less than storing and reading back one array.
RECOMPUTE_MAX_NODES = 8
RECOMPUTE_MAX_TRANSCENDENTAL = 2
CHEAP = frozenset("""add sub mul neg identity cast where clip full_like abs maximum minimum
    lt le gt ge eq ne square sign floor ceil round zero_masked""".split())


def recompute_residuals(plan: KernelPlan) -> KernelPlan:
    """Store or recompute, per value a kernel stores only for later kernels.

    A value ``v`` that kernel G stores and kernels H1, H2... read (element by
    element, over G's shape) is recomputed in each H instead, and G no longer
    stores it, when every H already reads everything ``v``'s computation in G
    needs (no new array read) and that computation is cheap
    (``RECOMPUTE_MAX_NODES`` primitives, ``RECOMPUTE_MAX_TRANSCENDENTAL``
    transcendental ones): a store and a read per element saved for a little
    arithmetic.  Graph outputs are always stored.  The recomputed nodes appear
    in G and in each H; nothing else changes.
    """
    if not plan.fused:
        return plan
    g = plan.graph
    steps = list(plan.steps)
    order = {n: k for k, n in enumerate(g.topo_order())}
    changed = True
    while changed:
        changed = False
        index = _StepIndex(g, steps)       # one per plan: lookups, not scans, per value
        for s, step in enumerate(steps):
            if not isinstance(step, Kernel) or isinstance(step, MatmulEpilogue):
                continue
            levels = dict(getattr(step, "levels", ()))
            for v in step.outputs:
                if levels.get(v, "E") != "E":     # a reduce kernel's row values
                    continue
                new = _recompute_in_readers(g, steps, s, v, index, order)
                if new is not None:
                    steps = new
                    changed = True
                    break
            if changed:
                break
    return KernelPlan(g, tuple(steps), plan.fused)


class _StepIndex:
    """Which steps read each value (as :func:`_reads` says) and in how many kernels
    each node is computed, for one list of steps."""

    def __init__(self, g: Graph, steps: list) -> None:
        self.readers: dict[int, list[int]] = {}
        self.kernels_of: dict[int, int] = {}
        for q, st in enumerate(steps):
            if isinstance(st, Kernel):
                read = set(st.inputs).union(*(g.node(n).shape.dyn for n in st.nodes))
                for n in st.nodes:
                    self.kernels_of[n] = self.kernels_of.get(n, 0) + 1
            else:
                node = g.node(st.node)
                read = set(node.args) | node.shape.dyn
            for v in read:
                self.readers.setdefault(v, []).append(q)


def _recompute_in_readers(g: Graph, steps: list, s: int, v: int, index: _StepIndex,
                          order: dict[int, int]) -> list | None:
    found = _recompute_cones(g, steps, s, v, index=index)
    if isinstance(found, str):
        return None
    cones, scalars = found
    producer = steps[s]
    steps = list(steps)
    for q, cone in cones.items():
        h = steps[q]
        nodes = sorted(set(h.nodes) | cone, key=order.__getitem__)
        ins = tuple(sorted({i for i in h.inputs if i not in cone} | scalars[q]))
        steps[q] = Kernel(tuple(nodes), ins, h.outputs, h.shape)
    still_read = any(_reads(g, st, v) for q, st in enumerate(steps) if q != s)
    if not still_read:
        outputs = tuple(o for o in producer.outputs if o != v)
        if outputs or type(producer) is not Kernel:     # (a reduce kernel's sums remain)
            steps[s] = replace(producer, outputs=outputs)
        else:                           # nothing left to store: no loop (its readers
            del steps[s]                # compute it; another reads only its shape)
    return steps


def why_stored(plan: KernelPlan, s: int, v: int, ref=lambda n: f"%{n}") -> str:
    """Why step ``s`` of ``plan`` (after :func:`recompute_residuals`) stores ``v`` for
    the steps that read it instead of each of them recomputing it, in words
    (values named by ``ref``, steps as ``[k]``); "" when nothing stops it."""
    found = _recompute_cones(plan.graph, list(plan.steps), s, v, ref)
    return found if isinstance(found, str) else ""


def reading_steps(graph: Graph, steps, s: int, v: int,
                  index: _StepIndex | None = None) -> list[int]:
    """The positions of the steps other than ``s`` that read ``v``."""
    if index is not None:
        return [q for q in index.readers.get(v, ()) if q != s]
    return [q for q, st in enumerate(steps) if q != s and _reads(graph, st, v)]


def _recompute_cones(g: Graph, steps: list, s: int, v: int, ref=lambda n: f"%{n}",
                     index: _StepIndex | None = None) -> tuple[dict, dict] | str:
    """For each step H that reads ``v`` (stored by step ``s``): the nodes H would
    recompute and the scalars it would read in addition; or why ``v`` must stay
    stored (an output, a reader that is not a loop over the same shape, a value
    H does not read, or too costly)."""
    producer = steps[s]
    if v in g.outputs:
        return "an output of the method: always stored"
    if g.node(v).op == "broadcast_in" and not g.node(g.node(v).args[0]).shape.is_scalar:
        return "a broadcast of an array: loops read the array itself"
    index = index or _StepIndex(g, steps)
    readers = reading_steps(g, steps, s, v, index)
    for q in readers:
        st = steps[q]
        if type(st) is not Kernel:
            what = (f"a library call ({g.node(st.node).op})" if isinstance(st, LibraryCall)
                    else "a kernel over rows" if hasattr(st, "levels") else "a matmul kernel")
            return f"[{q}] is {what}, which reads it stored"
        if st.shape != producer.shape:
            return f"[{q}] loops over another shape"
        if any(v in g.node(n).shape.dyn for n in st.nodes):
            return f"[{q}] takes a shape from it"
    levels = dict(getattr(producer, "levels", ()))
    inside = {n for n in producer.nodes if levels.get(n, "E") == "E"}
    cones, scalars = {}, {}
    for q in readers:
        # Values H computes itself; what it recomputes already counts again.
        again = {n for n in steps[q].nodes if index.kernels_of.get(n, 0) > 1}
        have = set(steps[q].inputs) | (set(steps[q].nodes) - again)
        cone, todo, extra = {v}, [v], set()
        while todo:
            n = todo.pop()
            shape_only = PRIMITIVES[g.node(n).op].shape_only
            for i, a in enumerate(g.node(n).args):
                if g.node(a).op == "const" or a in cone or a in have or i in shape_only:
                    continue
                if a in again:
                    cone.add(a)
                    todo.append(a)
                    continue
                if g.node(a).shape.is_scalar and a not in producer.nodes:
                    extra.add(a)                  # read once per kernel: free
                    continue
                if a not in inside or (g.node(a).op == "broadcast_in" and
                                       not g.node(g.node(a).args[0]).shape.is_scalar):
                    return f"recomputing it in [{q}] would read {ref(a)}, which [{q}] does not"
                cone.add(a)
                todo.append(a)
        scalars[q] = extra
        size, costly = len(cone), sum(1 for n in cone if g.node(n).op not in CHEAP)
        if size > RECOMPUTE_MAX_NODES or costly > RECOMPUTE_MAX_TRANSCENDENTAL:
            return (f"too costly to recompute in [{q}]: {size} primitive(s), {costly} of "
                    f"them costly (transcendental, division...); at most "
                    f"{RECOMPUTE_MAX_NODES}, {RECOMPUTE_MAX_TRANSCENDENTAL} costly")
        cones[q] = cone
    if not readers:
        return "no later step reads it"
    return cones, scalars
