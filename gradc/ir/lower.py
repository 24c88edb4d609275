"""Lowering: the AST of an op to the graph IR.

Calls of other ops are inlined; a call of an op with a ``grad`` block is
recorded as a :class:`~gradc.ir.graph.CustomRegion`, so autodiff uses the
custom rule there.  The same :class:`Lowerer` instantiates derivative rules
of the primitive table and custom ``grad`` blocks, so built-in rules and user
overrides share one parser and one instantiation routine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gradc.errors import GradientError, NameResolutionError, ShapeError, Span
from gradc.frontend import ast
from gradc.frontend.builtins import CONSTANTS
from gradc.frontend.limits import GraphSize
from gradc.ir.builder import Builder
from gradc.ir.graph import FLOAT, CustomRegion, Graph
from gradc.ir.primitives import BINARY_OPS, COMPARE_OPS, PRIMITIVES
from gradc.ir.shapes import Shape

# Primitives that derivative rules may call but .grad files may not.
INTERNAL = ("broadcast_in", "sum_to", "size_ratio", "transpose", "matmul", "cast", "identity",
            "zero_masked")
_RENAMED = {"max": "maximum", "min": "minimum"}
_DTYPE_OF = {"f16": FLOAT, "f32": FLOAT, "f64": FLOAT, "i32": "i32", "i64": "i64",
             "bool": "bool", None: FLOAT}

Scope = dict[str, Any]     # name -> node id, or an Attr for a rule's node attribute


@dataclass(frozen=True)
class Attr:
    """A node attribute (``axis``, ``keepdims``) in a derivative rule's scope."""

    value: Any


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a compiled op, as the generated wrappers see it."""

    name: str
    dtype: str | None            # annotation: f16 f32 f64 i32 i64 bool, or None
    shape: tuple | None          # annotated dims, or None for any shape
    default: float | int | bool | None
    has_default: bool
    differentiable: bool


def declared_shape(p: ast.Param) -> tuple | None:
    """The dims a parameter must have: its annotation's, ``()`` for a parameter with
    a default and no shape (a scalar, like ``alpha = 0.01``), else None (any)."""
    if p.type is not None and p.type.shape is not None:
        return tuple(p.type.shape)
    return () if p.default is not None else None


def param_infos(op: ast.OpDef, consts: Mapping[str, float]) -> tuple[ParamInfo, ...]:
    out = []
    for p in op.params:
        t = p.type
        default = None if p.default is None else eval_const(p.default, consts)
        if default is not None and t is not None and t.dtype in ("i32", "i64", "bool"):
            default = bool(default) if t.dtype == "bool" else int(default)   # E307: exact
        out.append(ParamInfo(p.name, t.dtype if t else None, declared_shape(p),
                             default, p.default is not None, p.differentiable))
    return tuple(out)


def eval_const(e: ast.Expr, consts: Mapping[str, float]) -> float:
    """Value of a compile-time constant expression (defaults, axis, keepdims)."""
    if isinstance(e, ast.Num):
        return int(e.value) if e.is_int and math.isfinite(e.value) else e.value
    if isinstance(e, ast.Neg):
        return -eval_const(e.operand, consts)
    if isinstance(e, ast.Name):
        if e.id in consts:
            return consts[e.id]
        if e.id in CONSTANTS:
            return CONSTANTS[e.id]
        if e.id in ("true", "false", "True", "False"):
            return e.id in ("true", "True")
    if isinstance(e, ast.TupleExpr):
        return tuple(eval_const(i, consts) for i in e.items)
    if isinstance(e, ast.BinOp) and e.op in "+-*/^":
        a, b = eval_const(e.lhs, consts), eval_const(e.rhs, consts)
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "^": a ** b}[e.op]
    raise ShapeError("expected a constant here (a number, a const name, or a tuple of ints)",
                     getattr(e, "span", None))


class Lowerer:
    """Lowers expressions of a program's ops into one graph."""

    def __init__(self, graph: Graph, ops: Mapping[str, ast.OpDef], consts: Mapping[str, float],
                 *, rules: bool = False, span: Span | None = None, custom: bool = True,
                 size: GraphSize | None = None) -> None:
        self.graph = graph
        self.size = size                 # MAX_GRAPH_SIZE, checked after each grad()
        self.custom = custom             # False: ignore grad blocks (the true derivative)
        self.ops = ops
        self.consts = consts
        self.rules = rules               # lowering a derivative rule: internals allowed
        self.b = Builder(graph, span)

    # -- statements ---------------------------------------------------------
    def body(self, stmts: Sequence[ast.Assign], scope: Scope) -> Scope:
        for s in stmts:
            scope[s.target] = self.expr(s.value, scope)
        return scope

    def expr(self, e: ast.Expr, scope: Scope) -> int:
        method = getattr(self, f"_{type(e).__name__.lower()}")
        return method(e, scope)

    # -- expressions --------------------------------------------------------
    def _num(self, e: ast.Num, scope: Scope) -> int:
        return self.b.const(e.value, FLOAT, e.span)

    def _name(self, e: ast.Name, scope: Scope) -> int:
        if e.id in scope and not isinstance(scope[e.id], Attr):
            return scope[e.id]
        if e.id in self.consts:
            return self.b.const(self.consts[e.id], FLOAT, e.span)
        if e.id in CONSTANTS:
            return self.b.const(CONSTANTS[e.id], FLOAT, e.span)
        raise NameResolutionError(f"undefined name '{e.id}'", e.span)

    def _binop(self, e: ast.BinOp, scope: Scope) -> int:
        args = (self.expr(e.lhs, scope), self.expr(e.rhs, scope))
        return self.b.apply(BINARY_OPS[e.op], args, span=e.span)

    def _compare(self, e: ast.Compare, scope: Scope) -> int:
        args = (self.expr(e.lhs, scope), self.expr(e.rhs, scope))
        return self.b.apply(COMPARE_OPS[e.op], args, span=e.span)

    def _neg(self, e: ast.Neg, scope: Scope) -> int:
        return self.b.apply("neg", (self.expr(e.operand, scope),), span=e.span)

    def _transpose(self, e: ast.Transpose, scope: Scope) -> int:
        return self.b.apply("transpose", (self.expr(e.operand, scope),), span=e.span)

    def _tupleexpr(self, e: ast.TupleExpr, scope: Scope) -> int:
        raise ShapeError("a tuple is only allowed as the value of axis=", e.span)

    def _call(self, e: ast.Call, scope: Scope) -> int:
        if e.func in self.ops and not self.rules:
            return self.call_op(self.ops[e.func], e, scope)
        if e.func == "grad":
            return self._grad(e, scope)
        kw = {k: self._attr(k, v, scope) for k, v in e.kwargs}
        args = [self.expr(a, scope) for a in e.args]
        name = e.func
        if name in ("max", "min") and len(args) == 2:
            name = _RENAMED[name]
        elif name in ("ones_like", "zeros_like"):
            args.append(self.b.const(1.0 if name == "ones_like" else 0.0, FLOAT, e.span))
            name = "full_like"
        if name in PRIMITIVES and PRIMITIVES[name].kind == "reduction":
            kw = {"axis": kw.get("axis"), "keepdims": bool(kw.get("keepdims", False))}
        if name not in PRIMITIVES or (name in INTERNAL and not self.rules):
            raise NameResolutionError(f"unknown function '{e.func}'", e.span)
        return self.b.apply(name, args, kw or None, span=e.span)

    def _attr(self, key: str, v: ast.Expr, scope: Scope) -> Any:
        if isinstance(v, ast.Name) and isinstance(scope.get(v.id), Attr):
            return scope[v.id].value                 # a rule's attribute: axis=axis
        value = eval_const(v, self.consts)
        if key == "axis":
            axes = tuple(int(a) for a in value) if isinstance(value, tuple) else (int(value),)
            if len(set(axes)) != len(axes):
                raise ShapeError(f"axis {axes} repeats an axis", getattr(v, "span", None))
            return axes
        return value

    # -- calls of ops -------------------------------------------------------
    def call_op(self, op: ast.OpDef, call: ast.Call, scope: Scope) -> int:
        """Inline ``op`` at ``call``; record a CustomRegion if it has a grad block."""
        bound = self._bind(op, call, scope)
        start = self.graph.next_id
        inner: Scope = dict(bound)
        inner = Lowerer(self.graph, self.ops, self.consts, custom=self.custom,
                        size=self.size).body(op.body, inner)
        outs = [inner[o] for o in op.outputs]
        if len(outs) != 1:
            raise ShapeError(f"op '{op.name}' returns {len(outs)} outputs and cannot be "
                             "used inside an expression", call.span)
        if op.grad is None or not self.custom:
            return outs[0]
        outs = [o if o >= start else self.b.apply("identity", (o,), span=call.span) for o in outs]
        nodes = frozenset(range(start, self.graph.next_id))
        self.graph.regions.append(CustomRegion(
            op, tuple(bound[p.name] for p in op.params), tuple(outs),
            dict(inner), nodes, call.span, self.ops, self.consts))
        return outs[0]

    def _bind(self, op: ast.OpDef, call: ast.Call, scope: Scope) -> Scope:
        bound: Scope = {}
        for p, a in zip(op.params, call.args):
            bound[p.name] = self.expr(a, scope)
        for k, v in call.kwargs:
            bound[k] = self.expr(v, scope)
        for p in op.params:
            if p.name not in bound:
                if p.default is None:
                    raise NameResolutionError(
                        f"call of '{op.name}' is missing the argument '{p.name}'", call.span)
                bound[p.name] = self.b.const(eval_const(p.default, self.consts), FLOAT, p.span)
        return bound

    def _grad(self, e: ast.Call, scope: Scope) -> int:
        from gradc.autodiff.higher import gradient     # autodiff builds on the IR
        target = e.args[1]
        if not isinstance(target, ast.Name) or target.id not in scope:
            raise NameResolutionError("the second argument of grad() must be a parameter or "
                                      "a name assigned earlier", getattr(target, "span", e.span))
        f = self.expr(e.args[0], scope)
        shape = self.graph.node(f).shape
        if shape.rank != 0:
            what = "a shape known only at run time" if shape.dyn else f"shape {shape}"
            raise ShapeError(f"grad() needs a scalar expression (reduce it, e.g. with sum()); "
                             f"this one has {what}", e.span)
        wrt = scope[target.id]
        if self.graph.node(wrt).dtype != FLOAT:
            raise GradientError(f"grad() with respect to '{target.id}', which is not a float "
                                "value (integer and bool values have no gradient)", target.span)
        g = gradient(self.graph, f, wrt, self.b.const(1.0, FLOAT, e.span))
        if self.size is not None:       # None inside a grad block: checked by the caller
            self.size.check(self.graph, e.span)
        return g


def lower_op(op: ast.OpDef, ops: Mapping[str, ast.OpDef], consts: Mapping[str, float],
             *, custom: bool = True) -> Graph:
    """The primal graph of ``op``: its params, body and outputs.

    ``custom=False`` ignores every ``grad`` block, so that differentiating the
    graph gives the true derivative (for the custom-gradient report of
    ``gradc check``).
    """
    graph = Graph()
    b = Builder(graph)
    scope: Scope = {}
    for p in op.params:
        t = p.type
        dims = declared_shape(p)
        shape = None if dims is None else Shape(dims)
        scope[p.name] = b.param(p.name, shape, _DTYPE_OF[t.dtype if t else None], p.span)
        graph.params.append(scope[p.name])
    size = GraphSize(op.name)
    lowerer = Lowerer(graph, ops, consts, custom=custom, size=size)
    start = graph.next_id
    scope = lowerer.body(op.body, scope)
    size.check(graph, op.span, at_grad=False)     # inlined calls without grad() too
    outs = [scope[o] for o in op.outputs]
    if op.grad is not None and custom:    # the op's own grad block replaces its derivative
        outs = [o if o >= start else lowerer.b.apply("identity", (o,), span=op.span)
                for o in outs]
        graph.regions.append(CustomRegion(
            op, tuple(graph.params), tuple(outs), dict(scope),
            frozenset(range(start, graph.next_id)), op.span, ops, consts))
    for name, o in zip(op.outputs, outs):
        graph.set_output(o, name=name)
    return graph
