"""Row plans for ops whose arrays have no declared shapes.

The CPU's reduce kernels (:mod:`gradc.passes.fuse_reduce`) need loop shapes of static
rank; ``op softmax_rows(x)`` gives ``x`` a shape known only at run time, so its
reductions would stay NumPy calls between loops.  A *row plan* is the same op compiled
again with its arrays declared of rank 2 or 1: each parameter of undeclared shape
takes a *form*,

* ``f`` (full): ``[_rows, _row]``, the argument with its leading dims collapsed into
  one (a view of a C-contiguous array; the wrapper has made every argument one);
* ``c`` (column): ``[_row]``, an argument of exactly the last dim of the full ones (a
  weight or bias ``w`` of shape ``(k,)`` against ``x`` of shape ``(n, k)``),

and parameters with a declared scalar shape (``eps = 1e-5``) stay as they are.  The
generic wrapper checks at call time that the arguments fit one of the op's row plans
(:func:`rank_rule` says for which ranks it means the same) and calls its wrapper on
the collapsed arrays, reshaping the results back; otherwise it runs the generic plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from gradc.frontend import ast
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES, REDUCTION

ROWS, ROW = "_rows", "_row"          # the dim names of the row plans' declarations
FULL, COL, DECLARED = "f", "c", "-"
ANY_RANK, RANK_2_UP, RANK_2 = 0, 1, 2
# Primitives that mean the same on the collapsed arrays (besides elementwise ones and
# reductions along the last axis or over everything).
_NEUTRAL = {"param", "const", "identity", "sum_to", "shape_check", "shape_check_of",
            "size_ratio"}
_FLOATS = (None, "f16", "f32", "f64")


@dataclass(frozen=True)
class RowVariant:
    """One row plan: the form of each parameter (``f``, ``c`` or ``-``), the op
    compiled so, and per method the ranks of the full arguments it serves
    (:func:`rank_rule`)."""

    forms: tuple[str, ...]
    cop: object          # gradc.pipeline.CompiledOp
    ranks: dict


def candidate_forms(cop) -> list[tuple[str, ...]]:
    """The forms tried, in the order the wrapper tries them: the first parameter of
    undeclared shape full and the others columns (softmax's ``x``, layer norm's
    ``x, w, b``), then every one full (cross-entropy's ``logits, target``).  None
    when a parameter has a declared non-scalar shape or an integer dtype."""
    params = cop.params
    if any(p.shape not in (None, ()) for p in params) or \
            any(p.shape is None and p.dtype not in _FLOATS for p in params):
        return []
    generic = [i for i, p in enumerate(params) if p.shape is None]
    if not generic:
        return []
    out = []
    for rest in (COL, FULL):
        forms = tuple(DECLARED if i not in generic else FULL if i == generic[0] else rest
                      for i in range(len(params)))
        if forms not in out:
            out.append(forms)
    return out


def declared_op(op: ast.OpDef, forms: tuple[str, ...]) -> ast.OpDef:
    """``op`` with each parameter of form ``f`` declared ``[_rows, _row]`` and each of
    form ``c`` declared ``[_row]`` (dtype and ``nograd`` kept)."""
    params = []
    for p, form in zip(op.params, forms):
        if form != DECLARED:
            t = p.type
            shape = (ROWS, ROW) if form == FULL else (ROW,)
            p = replace(p, type=ast.TypeAnn(t.dtype if t else None, shape,
                                            t.nograd if t else False, t.span if t else p.span))
        params.append(p)
    return replace(op, params=tuple(params))


def _axes(node) -> tuple | None:
    axis = node.attr("axis")
    return None if axis is None else tuple(axis)


def _summed_back(graph, nid: int) -> bool:
    """A ``sum(..., axis=0)`` whose value only a custom gradient's shape check and the
    sum back to its parameter's shape read (layer norm's ``dw``, ``db``): over the
    leading dims of a rank >= 2 array it sums what the collapsed rows do."""
    node = graph.node(nid)
    if node.op != "sum" or _axes(node) != (0,) or node.attr("keepdims"):
        return False
    checks = graph.users(nid)
    return bool(checks) and all(graph.node(c).op == "shape_check" and graph.users(c) and all(
        graph.node(s).op == "sum_to" for s in graph.users(c)) for c in checks)


def rank_rule(graph) -> int:
    """For which ranks of the full arguments a row plan of the method ``graph`` means
    what the method means: ``ANY_RANK`` (>= 1) when every primitive is elementwise, a
    reduction along the last axis (``axis=-1``) or over every axis, or one of
    ``_NEUTRAL``; ``RANK_2_UP`` when besides these a ``sum(..., axis=0)`` is summed back
    to a column parameter; ``RANK_2`` otherwise (the declarations add nothing at
    rank 2)."""
    rank = ANY_RANK
    for node in graph:
        kind = PRIMITIVES[node.op].kind
        if kind == ELEMENTWISE or node.op in _NEUTRAL:
            continue
        if kind == REDUCTION or node.op == "broadcast_in":
            axes = _axes(node)
            if axes is None or axes == (-1,):
                continue
            if _summed_back(graph, node.id):
                rank = max(rank, RANK_2_UP)
                continue
        return RANK_2
    return rank


def wanted(cop) -> bool:
    """Whether ``cop`` may have row plans: it reduces, and draws no random numbers."""
    return not cop.draws and any(PRIMITIVES[n.op].kind == REDUCTION
                                 for m in cop.methods.values() for n in m.graph)


def worth_it(cop, spec) -> bool:
    """Whether the row plan ``spec`` has every method of ``cop`` and loops over rows in
    one of them (a reduce kernel that is not flat)."""
    from gradc.passes.fuse_reduce import ReduceKernel, cpu_plan
    if set(spec.methods) != set(cop.methods):
        return False
    return any(isinstance(s, ReduceKernel) and not s.flat
               for m in spec.methods.values() for s in cpu_plan(m.fused).steps)
