"""Fusion into reductions: the CPU plan, where a reduction is a loop we print.

:func:`gradc.passes.fuse.plan_kernels` stops every loop at a reduction, which
NumPy then runs: the reduction's input is stored by one loop and read back by
NumPy, and whatever uses the reduced value reads its own inputs again.
:func:`fuse_reductions` merges those steps into :class:`ReduceKernel` s, one
parallel loop over the *rows* of a loop shape ``S`` split at ``k`` (rows are
``S[:k]``, a row is ``S[k:]``), the schedule of a "persistent" reduction in
TorchInductor's terms.  Each node of a reduce kernel has a level:

* ``E`` (element): a value of shape ``S``, computed per element of a row;
* ``R`` (row): one value per row: a reduction of an element value over the
  last ``n - k`` dims (``logsumexp(x, axis=1)`` of ``x: [b, o]``), and
  elementwise nodes of the row shape ``S[:k]`` (or ``S[:k] + (1,)*(n-k)``);
* ``C`` (chunk): a reduction across rows: over every dim (``mean`` of a loss),
  or over the first ``k`` dims (``sum_to`` of a bias gradient), or over the
  rows of a row value.  Each chunk of rows accumulates a partial; the
  wrapper combines the partials after the loop.  The chunks depend only on
  the shape, so results do not depend on the number of threads.

An element value that reads a row value computed from a reduction of its own
row runs in a later *phase*: one more pass over the row, which is in cache by
then, recomputing the element values it needs rather than storing them.
``logsumexp`` and ``norm`` take two passes themselves (a max first, then the
shifted or scaled sum, as ``scipy.special.logsumexp`` and LAPACK's ``nrm2``
avoid overflow).  Softmax cross-entropy's forward and backward is one kernel
of three passes per row, reading the logits once from memory.

Only loop shapes of static rank take part (a named dim is fine: its size is
read at run time); reductions over other axis sets, of integer values, or of
generic-rank arrays stay NumPy calls.  The CUDA plan uses it too (its reduce
kernels are printed by :mod:`gradc.codegen.cuda_reduce`; its other reductions are
the run time's, :mod:`gradc.codegen.runtime_cuda_src`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from gradc.ir.graph import FLOAT, Graph
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES
from gradc.ir.shapes import Shape, normalize_axis
from gradc.passes.fuse import (Kernel, KernelPlan, LibraryCall, MatmulEpilogue, Step,
                               is_reduction, row_kernel_takes,
                               recompute_residuals, value_args)

ELEMENT, ROW, CHUNK = "E", "R", "C"
# Reductions a row loop computes, and how many passes over the row each takes.
ROW_PASSES = {"sum": 1, "mean": 1, "max": 1, "min": 1, "prod": 1, "logsumexp": 2, "norm": 2}
# Reductions across rows (partials per chunk, combined by the wrapper).
CHUNK_REDUCERS = ("sum", "mean", "max", "min", "prod")


@dataclass(frozen=True)
class ReduceKernel(Kernel):
    """A loop over the rows of ``shape`` split at ``split`` (see the module doc).

    ``nodes`` are every fused node in topological order, ``levels`` their
    level; ``outputs`` the element and row values stored (in arrays of their
    own shapes); ``partials`` the chunk reductions whose values are used,
    each with ``chunk_kind`` "all" (one scalar per chunk) or "cols" (one value
    per element of a row: a reduction over the first ``split`` dims).
    ``flat``: no row reduction and no column reduction: rows are single
    elements and the loop runs over the flat array (``split`` = rank).
    """

    split: int = 0
    levels: tuple[tuple[int, str], ...] = ()
    partials: tuple[int, ...] = ()
    chunk_kind: tuple[tuple[int, str], ...] = ()
    flat: bool = False

    def level(self, nid: int) -> str:
        return dict(self.levels)[nid]

    @property
    def cols(self) -> bool:
        """Whether a partial is a row per chunk (a sum across rows, ``dw``)."""
        return any(k == "cols" for n, k in self.chunk_kind if n in self.partials)


def row_forms(shape: Shape, k: int) -> tuple[tuple, tuple]:
    """The static shapes of a row value of loop ``shape`` split at ``k``: the
    rows' shape, and the same with the row's dims kept as 1 (keepdims)."""
    dims = shape.static
    return dims[:k], dims[:k] + (1,) * (len(dims) - k)


def col_forms(shape: Shape, k: int) -> tuple[tuple, tuple]:
    """The static shapes of a value with one element per position in a row (a
    bias): the row's dims, and the same with the rows' dims kept as 1."""
    dims = shape.static
    return dims[k:], (1,) * k + dims[k:]


class _Group:
    """A candidate reduce kernel while units are merged into it."""

    def __init__(self, gid: int, loop: Shape) -> None:
        self.gid = gid
        self.loop = loop
        self.split: int | None = None
        self.level: dict[int, str] = {}
        self.kind: dict[int, str] = {}        # chunk reduction -> "all" | "cols"

    @property
    def rank(self) -> int:
        return len(self.loop.static)

    def is_row(self, shape: Shape) -> bool:
        return self.split is not None and not shape.dyn and \
            shape.static in row_forms(self.loop, self.split)

    def is_keepdims_row(self, shape: Shape) -> bool:
        """A row value that broadcasts against the loop per row (NumPy aligns dims on
        the right, so ``(b,)`` against ``(b, o)`` would not)."""
        return self.split is not None and not shape.dyn and \
            shape.static == row_forms(self.loop, self.split)[1]


def reduced_axes(graph: Graph, nid: int) -> tuple[int, ...] | None:
    """The axes of its operand a reduction (or ``sum_to``) sums over, sorted;
    None when the operand's rank is not static or nothing is reduced."""
    node = graph.node(nid)
    xs = graph.node(node.args[0]).shape
    if xs.dyn or not xs.static:
        return None
    n = len(xs.static)
    if node.op != "sum_to":
        return normalize_axis(node.attr("axis"), n) or None   # axis=(): nothing reduced
    like = graph.node(node.args[1]).shape
    if like.dyn or len(like.static) > n:
        return None
    lead = n - len(like.static)
    axes = tuple(i for i in range(n) if i < lead or
                 (like.static[i - lead] == 1 and xs.static[i] != 1))
    return axes or None


def _static_rank(shape: Shape) -> bool:
    return not shape.dyn and len(shape.static) >= 1


def _levels_for(graph: Graph, grp: _Group, nodes: list[int]) -> tuple[dict, dict, int | None] | None:
    """The levels ``nodes`` (one unit, in order) would take in ``grp``, the chunk
    kinds and the group's split after it, or None when the unit cannot join."""
    level, kind, split = dict(grp.level), {}, grp.split
    tmp = _Group(grp.gid, grp.loop)
    tmp.level, tmp.split = level, split
    n_rank = grp.rank
    for nid in nodes:
        node = graph.node(nid)
        prim = PRIMITIVES[node.op]
        if node.dtype != FLOAT and is_reduction(graph, nid):
            return None
        ins = [a for a in value_args(graph, nid)]
        lv_args = [level.get(a) for a in ins]
        if CHUNK in lv_args:
            return None                       # a chunk value exists only after the loop
        if prim.kind == ELEMENTWISE:
            if node.shape == grp.loop:
                for a, lv in zip(ins, lv_args):
                    if lv == ROW and not tmp.is_keepdims_row(graph.node(a).shape):
                        return None
                level[nid] = ELEMENT
            elif tmp.is_row(node.shape) and all(lv in (None, ROW) for lv in lv_args):
                for a, lv in zip(ins, lv_args):
                    if lv is None and not (graph.node(a).shape.is_scalar
                                           or tmp.is_row(graph.node(a).shape)):
                        return None
                level[nid] = ROW
            else:
                return None
            continue
        if node.op == "broadcast_in":
            x = node.args[0]
            xs, lx = graph.node(x).shape, level.get(x)
            if xs.dyn or lx in (ELEMENT, CHUNK):
                return None
            if xs.is_scalar and lx is None:
                if node.shape == grp.loop:
                    level[nid] = ELEMENT
                elif tmp.is_row(node.shape):
                    level[nid] = ROW
                else:
                    return None
                continue
            if node.shape != grp.loop:
                return None
            axes = normalize_axis(node.attr("axis"), n_rank)
            if axes and axes[-1] == n_rank - 1 and axes == tuple(range(axes[0], n_rank)):
                k = axes[0]                     # one value per row
                if split not in (None, k) or xs.static not in row_forms(grp.loop, k):
                    return None
            elif axes and axes[0] == 0 and axes == tuple(range(axes[-1] + 1)):
                k = axes[-1] + 1                # one value per column, from outside
                if lx is not None or split not in (None, k) or \
                        xs.static not in col_forms(grp.loop, k):
                    return None
            else:
                return None
            level[nid], split = ELEMENT, k
            tmp.split = split
            continue
        if not is_reduction(graph, nid):
            return None
        x = node.args[0]
        xs = graph.node(x).shape
        axes = reduced_axes(graph, nid)
        if graph.node(x).dtype != FLOAT or axes is None:
            return None
        op = "sum" if node.op == "sum_to" else node.op
        if level.get(x) == ROW:     # a reduction of row values over every row
            if op not in CHUNK_REDUCERS or \
                    not set(axes) >= {i for i, d in enumerate(xs.static) if d != 1}:
                return None
            level[nid], kind[nid] = CHUNK, "all"
            continue
        if xs != grp.loop:
            return None
        if axes == tuple(range(n_rank)):
            if op not in CHUNK_REDUCERS:
                return None
            level[nid], kind[nid] = CHUNK, "all"
        elif axes[-1] == n_rank - 1 and axes == tuple(range(axes[0], n_rank)):
            k = axes[0]
            if split not in (None, k) or op not in ROW_PASSES:
                return None
            level[nid], split = ROW, k
        elif axes[0] == 0 and axes == tuple(range(axes[-1] + 1)):
            k = axes[-1] + 1
            if split not in (None, k) or op not in CHUNK_REDUCERS:
                return None
            level[nid], kind[nid], split = CHUNK, "cols", k
        else:
            return None
        tmp.split = split
    return level, kind, split


def _unit_deps(graph: Graph, nodes) -> set[int]:
    """Nodes whose values ``nodes`` read, or whose run-time shapes they need."""
    out = set()
    for n in nodes:
        out.update(value_args(graph, n))
        out.update(graph.node(n).shape.dyn)
    return out


def fuse_reductions(plan: KernelPlan) -> KernelPlan:
    """``plan`` (from :func:`plan_kernels` with fusion) with reductions, the loops
    that produce their inputs and the loops that use their values merged into
    :class:`ReduceKernel` s where a row loop can compute them (module doc).
    Units are merged greedily in plan order; a merge that would make the plan
    cyclic (a path between the two leaving both) is refused."""
    if not plan.fused:
        return plan
    g = plan.graph
    units: list[list[int]] = [list(s.nodes) if isinstance(s, Kernel) else [s.node]
                              for s in plan.steps]
    unit_of = {n: u for u, nodes in enumerate(units) for n in nodes}
    q = nx.DiGraph()
    q.add_nodes_from(range(len(units)))
    for u, nodes in enumerate(units):
        for d in _unit_deps(g, nodes):
            if d in unit_of and unit_of[d] != u:
                q.add_edge(unit_of[d], u)
    groups: dict[int, _Group] = {}
    owner = {}                                   # unit -> group id it joined
    calls = {s.node for s in plan.steps
             if isinstance(s, LibraryCall) and not row_kernel_takes(g, s.node)}
    for u, step in enumerate(plan.steps):
        nodes = units[u]
        reads = [owner[unit_of[d]] for d in sorted(_unit_deps(g, nodes))
                 if d in unit_of and unit_of[d] in owner]
        candidates = list(dict.fromkeys(reads))
        # A loop that reads no group's values joins one only where no library call
        # reads it: that call would then wait for the whole group, and the loops after
        # it could not join (a cross-entropy's labels, checked by one_hot, would split
        # its gradient from the row kernel).
        if not any(w in calls and n in value_args(g, w) for n in nodes for w in g.users(n)):
            candidates += [gid for gid in groups if gid not in reads]
        joined = False
        for gid in candidates:
            grp = groups[gid]
            res = _levels_for(g, grp, nodes)
            if res is None:
                continue
            merged = nx.contracted_nodes(q, gid, u, self_loops=False, copy=True)
            if not nx.is_directed_acyclic_graph(merged):
                continue
            q = merged
            grp.level, grp.split = res[0], res[2]
            grp.kind.update(res[1])
            owner[u] = gid
            joined = True
            break
        if joined:
            continue
        if isinstance(step, Kernel) and not isinstance(step, ReduceKernel) and \
                _static_rank(step.shape) and type(step) is Kernel:
            grp = _Group(u, step.shape)
        elif isinstance(step, LibraryCall) and is_reduction(g, step.node) and \
                _static_rank(g.node(g.node(step.node).args[0]).shape):
            grp = _Group(u, g.node(g.node(step.node).args[0]).shape)
        else:
            continue
        res = _levels_for(g, grp, nodes)
        if res is None:
            continue
        grp.level, grp.split = res[0], res[2]
        grp.kind.update(res[1])
        groups[u] = grp
        owner[u] = u
    members: dict[int, list[int]] = {}
    for u, gid in owner.items():
        members.setdefault(gid, []).extend(units[u])
    order = {n: i for i, n in enumerate(g.topo_order())}
    steps: list[Step] = []
    for u, step in enumerate(plan.steps):
        grp = groups.get(owner.get(u))
        if grp is None or all(lv == ELEMENT for lv in grp.level.values()):
            steps.append(_per_row_reads(g, step))   # no reduction joined

        elif grp.gid == u:
            kernel = _make_kernel(g, grp, sorted(members[u], key=order.__getitem__))
            if kernel is not None:
                steps.append(kernel)
    return KernelPlan(g, tuple(order_steps(g, steps)), plan.fused)


def cpu_plan(plan: KernelPlan) -> KernelPlan:
    """The plan the CPU runs: reductions fused into loops, then cheap residuals
    recomputed where they are read (:func:`recompute_residuals`), then results that
    are parameters stored by a loop over their shape (:func:`store_passthrough_outputs`)."""
    return store_passthrough_outputs(recompute_residuals(fuse_reductions(plan)))



def store_passthrough_outputs(plan: KernelPlan) -> KernelPlan:
    """A result that is a parameter itself (``dx = dy`` of a straight-through
    estimator or of ``x + b``) becomes an ``identity`` node stored by a loop over
    the result's shape (the first that reads the parameter, else the first, which
    then reads it too), instead of a copy the wrapper makes after the loops: one
    pass over memory less (sign_ste's fwd_bwd moves 4 arrays per element, not 6).
    Fused plans only (the unfused baseline keeps its copy); matmul epilogues are
    left alone.  Returns a plan over a copy of the graph when it adds nodes."""
    g = plan.graph
    todo = [k for k, o in enumerate(g.outputs) if plan.fused and g.node(o).op == "param"
            and g.node(o).dtype == FLOAT and not g.node(o).shape.is_scalar]
    if not todo:
        return plan
    g = g.copy()
    steps = list(plan.steps)
    for k in todo:
        p = g.outputs[k]
        node = g.node(p)
        loops = [s for s, step in enumerate(steps) if isinstance(step, Kernel)
                 and not isinstance(step, MatmulEpilogue) and step.shape == node.shape]
        if not loops:
            continue
        s = next((s for s in loops if p in steps[s].inputs), loops[0])
        step = steps[s]
        nid = g.add("identity", (p,), None, node.shape, node.dtype, node.span)
        g.outputs[k] = nid
        more = {"levels": step.levels + ((nid, ELEMENT),)} if isinstance(step, ReduceKernel) else {}
        steps[s] = replace(step, nodes=step.nodes + (nid,), outputs=step.outputs + (nid,),
                           inputs=step.inputs + ((p,) if p not in step.inputs else ()), **more)
    return KernelPlan(g, tuple(steps), plan.fused)

def order_steps(g: Graph, steps: list[Step]) -> list[Step]:
    """``steps`` in a topological order of the values they read (shape-only
    operands excepted: wrappers compute shapes from the arguments), ties in
    the given order."""
    at = {}
    for s, step in enumerate(steps):
        for n in (step.nodes if isinstance(step, Kernel) else (step.node,)):
            at[n] = s
    q = nx.DiGraph()
    q.add_nodes_from(range(len(steps)))
    for s, step in enumerate(steps):
        for d in _unit_deps(g, step.nodes if isinstance(step, Kernel) else (step.node,)):
            if d in at and at[d] != s:
                q.add_edge(at[d], s)
    return [steps[s] for s in nx.lexicographical_topological_sort(q)]


def _per_row_reads(g: Graph, step: Step) -> Step:
    """An elementwise loop over ``(n, k)`` that reads a value of one element per row
    (``w: [n, 1]``, a one_hot's labels ``expand_dims(t, axis=-1)``) as a loop over rows
    reading it once per row (a :class:`ReduceKernel` without reductions); the wrapper
    would broadcast it to ``(n, k)`` first.  Any other step as it is."""
    if type(step) is not Kernel or not _static_rank(step.shape) or len(step.shape.static) < 2:
        return step
    k = len(step.shape.static) - 1
    rows = [i for i in step.inputs if not g.node(i).shape.dyn
            and g.node(i).shape.static == row_forms(step.shape, k)[1]]
    if not rows:
        return step
    return ReduceKernel(step.nodes, step.inputs, step.outputs, step.shape, split=k,
                        levels=tuple(sorted((n, ELEMENT) for n in step.nodes)))


def _make_kernel(g: Graph, grp: _Group, nodes: list[int]) -> Step | None:
    """The loop computing ``nodes``, less those whose values no later step and no result
    reads (a reduction read only for its shape, as in ``zeros_like(sum(x))``); None
    when nothing is left to store."""
    inside = set(nodes)
    outs = set(g.outputs)
    used_outside = {n for n in nodes if n in outs or any(
        u not in inside and a == n and i not in PRIMITIVES[g.node(u).op].shape_only
        for u in g.users(n) for i, a in enumerate(g.node(u).args))}
    reads = nx.DiGraph()                  # n -> what n's value or run-time shape needs
    reads.add_nodes_from(nodes)
    reads.add_edges_from((n, a) for n in nodes
                         for a in (*value_args(g, n), *g.node(n).shape.dyn) if a in inside)
    live = set(used_outside).union(*(nx.descendants(reads, n) for n in used_outside))
    if not live:
        return None
    group, nodes = inside, [n for n in nodes if n in live]
    inside = live
    level = {n: grp.level[n] for n in nodes}
    ins = sorted({a for n in nodes for a in value_args(g, n) if a not in inside})
    if all(lv == ELEMENT for lv in level.values()) and all(
            PRIMITIVES[g.node(n).op].kind == ELEMENTWISE for n in nodes):
        stored = [n for n in nodes if n in outs or any(u not in group for u in g.users(n))]
        return Kernel(tuple(nodes), tuple(ins), tuple(stored), grp.loop)
    partials = tuple(n for n in nodes if level[n] == CHUNK and n in used_outside)
    stored = tuple(n for n in nodes if level[n] != CHUNK and n in used_outside)
    split = grp.split if grp.split is not None else grp.rank
    return ReduceKernel(tuple(nodes), tuple(ins), stored, grp.loop, split=split,
                        levels=tuple(sorted(level.items())), partials=partials,
                        chunk_kind=tuple(sorted(grp.kind.items())), flat=grp.split is None)
