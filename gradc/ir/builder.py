"""Emitting IR nodes: shape and dtype inference and the implicit casts.

:class:`Builder` is the only way nodes are created, by lowering, by autodiff
and by passes, so every node gets its shape class and dtype from one place:
the kind of its primitive (:mod:`gradc.ir.primitives`).  Literals are weak:
a ``const`` takes the dtype of the arrays it meets, as docs/language.md says of
numbers (float32 in, float32 math, float32 out).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from gradc.errors import ShapeError, Span, TypeError_
from gradc.ir.graph import FLOAT, Graph
from gradc.ir.primitives import BINARY_OPS, ELEMENTWISE, PRIMITIVES
from gradc.ir.shapes import SCALAR, BroadcastError, Shape, broadcast

_INT_RANK = {"bool": 0, "i32": 1, "i64": 2}
_ORDINAL = ("first", "second", "third")


def misfit(op: str, shapes: Sequence[Shape], why: str, span: Span | None,
           notes: Sequence[str] = ()) -> ShapeError:
    """The error of operands of ``shapes`` that do not fit ``op`` (as spelled in the
    source) for the reason ``why``, kept as the error's ``why`` (a builtin whose steps
    fail names itself with it: :class:`gradc.ir.expr.ExprLowerer`)."""
    desc = " and ".join(_shown(s) for s in shapes)
    err = ShapeError(f"shapes {desc} do not fit '{op}': {why}", span, notes=notes)
    err.why = why
    return err


def _shown(s: Shape) -> str:
    """Shape ``s`` as an error shows it to a user: a shape known only at run time (an
    operand without dims in its signature) said so, not in the IR's notation."""
    if not s.dyn:
        return str(s)
    return f"{Shape(s.static)} broadcast with shapes known at run time" if s.static else \
        "(known at run time)"


class Builder:
    """Adds nodes to ``graph``; ``span`` overrides the span of every node made."""

    def __init__(self, graph: Graph, span: Span | None = None) -> None:
        self.graph = graph
        self.span = span

    def const(self, value: float, dtype: str = FLOAT, span: Span | None = None) -> int:
        if dtype in _INT_RANK and float(value).is_integer():
            value = int(value)
        else:
            value, dtype = float(value), FLOAT
        return self.graph.add("const", (), {"value": value}, SCALAR, dtype, self.span or span)

    def param(self, name: str, shape: Shape | None, dtype: str, span: Span | None) -> int:
        nid = self.graph.next_id
        shape = Shape((), frozenset([nid])) if shape is None else shape
        return self.graph.add("param", (), {"name": name}, shape, dtype, span)

    def source(self, op: str) -> int:
        """The graph's node of source primitive ``op`` (``seed``, ``draw_offset``: one
        value per call of the op), added if it has none."""
        for node in self.graph:
            if node.op == op:
                return node.id
        return self.graph.add(op, (), None, SCALAR, PRIMITIVES[op].dtype, self.span)

    def apply(self, op: str, args: Sequence[int], attrs: Mapping[str, Any] | None = None,
              span: Span | None = None) -> int:
        prim = PRIMITIVES[op]
        span = self.span or span
        args = list(args)
        if len(args) != len(prim.params):
            raise ShapeError(f"'{op}' takes {len(prim.params)} operands, got {len(args)}", span)
        if prim.keywords:       # defaults filled in; bool keywords as bools (1 - reverse)
            attrs = {**prim.defaults, **(attrs or {})}
            attrs.update({k: bool(attrs[k]) for k, kind, _ in prim.keywords if kind == "bool"})
        self.check_indices(op, args, span)
        value_args = ([i for i in range(len(args)) if i not in prim.index_operands]
                      if prim.value_operands is None else prim.value_operands)
        dtype = FLOAT if prim.float_only else self._unify([args[i] for i in value_args])
        for i in value_args:
            args[i] = self._coerce(args[i], dtype, span)
        shape = self._infer_shape(op, args, attrs or {}, span)
        if prim.dtype == "float" and not prim.float_only:
            dtype = FLOAT
        elif prim.dtype == "i64":           # dim_size, argmax
            dtype = "i64"
        return self.graph.add(op, args, attrs, shape, dtype, span)

    def check_indices(self, op: str, args: Sequence[int], span: Span | None) -> None:
        """E308 where an operand of ``op`` that must be integer indices is a float or a
        bool (as an index array, E309; PyTorch's one_hot refuses bool too)."""
        for i in PRIMITIVES[op].index_operands:
            dtype = self.graph.node(args[i]).dtype
            if dtype in (FLOAT, "bool"):
                raise TypeError_(f"'{op}' takes integer indices as its {_ORDINAL[i]} argument "
                                 f"(annotate the parameter i32 or i64), got a "
                                 f"{'float' if dtype == FLOAT else 'bool'} value",
                                 self.span or span, "E308")

    # -- dtypes -------------------------------------------------------------
    def _unify(self, args: Sequence[int]) -> str:
        real = [self.graph.node(a).dtype for a in args if self.graph.node(a).op != "const"]
        if not real or FLOAT in real:
            return FLOAT
        if any(self.graph.node(a).op == "const" and isinstance(self.graph.node(a).value, float)
               and not self.graph.node(a).value.is_integer() for a in args):
            return FLOAT
        best = max(real, key=_INT_RANK.__getitem__)
        return "i32" if best == "bool" else best

    def _coerce(self, nid: int, dtype: str, span: Span | None) -> int:
        node = self.graph.node(nid)
        if node.dtype == dtype:
            return nid
        if node.op == "const":
            return self.const(node.value, dtype, node.span)
        return self.graph.add("cast", (nid,), None, node.shape, dtype, self.span or span)

    # -- shapes -------------------------------------------------------------
    def _infer_shape(self, op: str, args: Sequence[int], attrs: Mapping[str, Any],
                     span: Span | None) -> Shape:
        """The primitive's shape rule: the operands' broadcast (elementwise), an
        operand's shape (``shape_like``), ``static_shape``, or ``np_shape`` of static
        shapes; opaque where the rule gives None or a run-time shape takes part."""
        prim = PRIMITIVES[op]
        shapes = [self.graph.node(a).shape for a in args]
        opaque = Shape((), frozenset([self.graph.next_id]))
        try:
            if prim.kind == ELEMENTWISE:
                return broadcast(shapes)
            if prim.static_shape is not None:          # (with shape_like: its checks)
                return prim.static_shape(shapes, attrs) or opaque
            if prim.shape_like is not None:
                return shapes[prim.shape_like]
            if prim.np_shape is not None:
                if any(s.dyn for s in shapes):
                    return opaque
                kw = {k: attrs.get(k) for k in prim.attr_names}
                return Shape(prim.np_shape(*(s.static for s in shapes), **kw))
        except BroadcastError as exc:
            spelled = {v: k for k, v in BINARY_OPS.items()}.get(op, op)
            reversed_ = op == "matmul" and any(
                self.graph.node(a).op == "transpose" and (s.rank or 0) >= 3
                for a, s in zip(args, shapes))
            notes = ["'.T' reverses every axis, as NumPy's does: to swap the last two, "
                     "write swapaxes(x, -1, -2)"] if reversed_ else []
            raise misfit(spelled, shapes, str(exc), span, notes) from None
        raise AssertionError(f"no shape rule for {op} ({prim.kind})")
