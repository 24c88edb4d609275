"""Algebraic simplification: small rewrite rules keyed by op, run to a fixed point.

Every rewrite keeps the node's shape class and dtype (a rewrite that would
shrink a broadcast result is not applied), and none changes IEEE results for
finite inputs except ``x * 0`` is never rewritten (it is NaN for x = inf).
Rules run only after autodiff: ``stop_gradient`` and ``identity`` are no-ops
by then.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gradc.ir.builder import Builder
from gradc.ir.graph import Graph, Node
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES
from gradc.passes.dce import eliminate_dead_code


def _const(graph: Graph, nid: int) -> float | None:
    node = graph.node(nid)
    return node.value if node.op == "const" else None


def _same_shape(graph: Graph, a: int, node: Node) -> bool:
    other = graph.node(a)
    return other.shape == node.shape and other.dtype == node.dtype


def _fold(graph: Graph, node: Node) -> int | None:
    """An elementwise op of constants becomes a constant (computed in float64)."""
    prim = PRIMITIVES[node.op]
    if prim.kind != ELEMENTWISE or not node.args:
        return None
    values = [_const(graph, a) for a in node.args]
    if any(v is None for v in values):
        return None
    with np.errstate(all="ignore"):
        value = prim.ref(*(np.float64(v) for v in values))
    value = float(np.asarray(value).reshape(()))
    return Builder(graph, node.span).const(value, node.dtype)


def _operand_if(graph: Graph, node: Node, i: int, cond: Callable[[float | None], bool]):
    """Operand ``1 - i`` when operand ``i`` is a constant satisfying ``cond``."""
    other = node.args[1 - i]
    if cond(_const(graph, node.args[i])) and _same_shape(graph, other, node):
        return other
    return None


def _identities(graph: Graph, node: Node) -> int | None:
    op, args = node.op, node.args
    is0 = lambda v: v == 0
    is1 = lambda v: v == 1
    if op in ("identity", "stop_gradient") or (op == "cast" and
                                                graph.node(args[0]).dtype == node.dtype):
        return args[0]
    if op == "add":
        return _operand_if(graph, node, 0, is0) or _operand_if(graph, node, 1, is0)
    if op == "sub":
        return _operand_if(graph, node, 1, is0)
    if op == "mul":
        return _operand_if(graph, node, 0, is1) or _operand_if(graph, node, 1, is1)
    if op in ("div", "pow"):
        return _operand_if(graph, node, 1, is1)
    if op == "neg" and graph.node(args[0]).op == "neg":
        return graph.node(args[0]).args[0]
    if op in ("sum_to", "broadcast_in") and _same_shape(graph, args[0], node):
        return args[0]
    if op == "where" and args[1] == args[2]:
        return args[1]
    if op == "where" and _const(graph, args[0]) is not None:
        pick = args[1] if _const(graph, args[0]) != 0 else args[2]
        return pick if _same_shape(graph, pick, node) else None
    return None


def _negations(graph: Graph, node: Node) -> int | None:
    """``x + (-y)`` -> ``x - y``; ``x - (-y)`` -> ``x + y``; ``(-x) * y`` stays."""
    if node.op in ("add", "sub") and graph.node(node.args[1]).op == "neg":
        op = "sub" if node.op == "add" else "add"
        inner = graph.node(node.args[1]).args[0]
        return Builder(graph, node.span).apply(op, (node.args[0], inner))
    return None


RULES = (_fold, _identities, _negations)


def simplify(graph: Graph) -> Graph:
    """Rewrite to a fixed point; no rule of RULES applies to the result's live nodes."""
    out = eliminate_dead_code(graph)
    changed = True
    while changed:
        changed = False
        for nid in out.topo_order():
            if out.node(nid).op in ("param", "const") or not (
                    out.users(nid) or nid in out.outputs):
                continue
            for rule in RULES:
                new = rule(out, out.node(nid))
                if new is not None and new != nid:
                    out.replace_uses(nid, new)
                    changed = True
                    break
        out = eliminate_dead_code(out)
    return out
