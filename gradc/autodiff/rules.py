"""Derivative rules: the table's rule strings parsed once, and the composites.

Rules are .grad expressions (see :mod:`gradc.ir.primitives` for their scope),
parsed by the same parser as user files and instantiated by the same
:class:`~gradc.ir.expr.ExprLowerer` that lowers the expressions of custom
``grad`` blocks.  Rules whose shape depends on operand ranks are Python
composites here (``COMPOSITES``): they build nodes with a
:class:`~gradc.ir.builder.Builder`.
"""
from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import Callable

from gradc.errors import GradientError
from gradc.frontend import ast
from gradc.ir.builder import Builder
from gradc.ir.expr import parse_statements
from gradc.ir.graph import Node


@lru_cache(maxsize=None)
def rule_ast(text: str) -> ast.Expr:
    """Parse a rule expression with the .grad grammar (wrapped in a dummy op)."""
    return parse_statements(f"_r = {text}")[0].value


def _matmul_vjp(b: Builder, node: Node, g: int, i: int) -> int:
    """Cotangent of operand ``i`` of ``x @ y`` (``np.matmul``), which the engine then
    sums to the operand's shape (``sum_to``: over the batch dims it was broadcast on).

    Rank 2 @ 2: gx = g @ y.T, gy = x.T @ g.  A rank-1 operand is a row (left)
    or column (right) vector, so its cotangent is a matrix-vector product and
    the other's is an outer product, written as a broadcast multiply.  With batch
    dims (an operand of rank 3 or more), :func:`_batched_matmul_vjp`.
    """
    graph = b.graph
    x, y = node.args
    rx, ry = graph.node(x).shape.rank, graph.node(y).shape.rank
    if rx is None or ry is None:
        raise GradientError("the gradient of '@' needs operands of known rank; annotate "
                            "the parameters' shapes (e.g. x: f32[n, k])", node.span)
    if max(rx, ry) > 2:
        return _batched_matmul_vjp(b, node, g, i, rx, ry)

    def t(v: int) -> int:
        return b.apply("transpose", (v,))

    def col(v: int, like: int) -> int:     # v[:, None] broadcast to like's shape
        return b.apply("broadcast_in", (v, like), {"axis": (1,), "keepdims": False})

    mm = lambda p, q: b.apply("matmul", (p, q))
    if i == 0:
        if rx == 2 and ry == 2:
            return mm(g, t(y))
        if rx == 2 and ry == 1:          # g: (m,), y: (k,) -> outer(g, y)
            return b.apply("mul", (col(g, x), y))
        if rx == 1 and ry == 2:          # g: (n,), y: (k, n) -> y @ g
            return mm(y, g)
        return b.apply("mul", (g, y))    # rank 1 @ rank 1: g is 0-d
    if rx == 2 and ry == 2:
        return mm(t(x), g)
    if rx == 2 and ry == 1:              # x: (m, k), g: (m,) -> x.T @ g
        return mm(t(x), g)
    if rx == 1 and ry == 2:              # x: (k,), g: (n,) -> outer(x, g)
        return b.apply("mul", (col(x, y), g))
    return b.apply("mul", (g, x))


def _batched_matmul_vjp(b: Builder, node: Node, g: int, i: int, rx: int, ry: int) -> int:
    """The cotangent of operand ``i`` of a batched ``x @ y`` (ranks ``rx``, ``ry``, one
    of them 3 or more), before the engine's sum over broadcast batch dims:

    - ``x`` (..., m, k), ``y`` (..., k, n): gx = g @ mT(y), gy = mT(x) @ g, where mT
      swaps the last two axes (``transpose`` at rank 2, a view; ``swapaxes`` above);
    - ``x`` (k,): g (..., n); gx = (y @ g[..., None])[..., 0], gy = x[:, None] * g[..., None, :];
    - ``y`` (k,): g (..., m); gx = g[..., None] * y, gy = (g[..., None, :] @ x)[..., 0, :].
    """
    x, y = node.args
    mm = lambda p, q: b.apply("matmul", (p, q))
    ex = lambda v, ax: b.apply("expand_dims", (v,), {"axis": (ax,)})
    sq = lambda v, ax: b.apply("squeeze", (v,), {"axis": (ax,)})

    def mt(v: int) -> int:
        if b.graph.node(v).shape.rank == 2:
            return b.apply("transpose", (v,))
        return b.apply("swapaxes", (v,), {"axis1": -1, "axis2": -2})

    if rx == 1:
        return sq(mm(y, ex(g, -1)), -1) if i == 0 else b.apply("mul", (ex(x, -1), ex(g, -2)))
    if ry == 1:
        return b.apply("mul", (ex(g, -1), y)) if i == 0 else sq(mm(ex(g, -2), x), -2)
    return mm(g, mt(y)) if i == 0 else mm(mt(x), g)


def _broadcast_in_vjp(b: Builder, node: Node, g: int, i: int) -> int:
    """The adjoint of broadcasting a reduced value back: sum over the same axes."""
    x, like = node.args
    axis, keepdims = node.attr("axis"), node.attr("keepdims")
    if axis is None and keepdims:
        return b.apply("sum_to", (g, x))
    return b.apply("sum", (g,), {"axis": axis, "keepdims": keepdims})


COMPOSITES: MappingProxyType[str, Callable[[Builder, Node, int, int], int]] = MappingProxyType({
    "matmul": _matmul_vjp,
    "broadcast_in": _broadcast_in_vjp,
})
