"""Lowering expressions of primitives: what derivative rules and decompositions need.

:class:`ExprLowerer` turns a .grad expression over named nodes into graph
nodes: numbers, names, operators and calls of primitives, nothing that needs
a program (calls of ops, ``grad()``: :class:`gradc.ir.lower.Lowerer` adds
those).  Autodiff instantiates the rules of the primitive table with it, and
:func:`gradc.passes.simplify.expand_decompositions` the decompositions, so
neither imports the lowering of ops, which imports autodiff (``grad()``
differentiates as it is lowered).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from gradc.errors import GradcWarning, NameResolutionError, ShapeError, Span
from gradc.frontend import ast
from gradc.frontend.builtins import CONSTANTS
from gradc.ir.builder import Builder, misfit
from gradc.ir.graph import FLOAT, Graph, Node
from gradc.ir.indexing import SPECIAL_CALLS, lower_index, lower_special
from gradc.ir.primitives import ALIASES, BINARY_OPS, COMPARE_OPS, DECOMPOSED, PRIMITIVES
from gradc.ir.shapes import DimRef

# Primitives that derivative rules may call but .grad files may not.
INTERNAL = ("broadcast_in", "sum_to", "shape_check", "shape_check_of", "size_ratio", "transpose",
            "matmul", "cast", "identity", "zero_masked", "dim_size", "reshape_like",
            "take_transpose", "shift", "linear_scan", "take_along_axis_transpose",
            "random_uniform", "one_hot_labels",
            # reached by x[...] (gradc.ir.indexing), not by name
            "slice", "slice_transpose", "concat_part", "concat_part_transpose", "wrap_index",
            "merge_axes")
_RENAMED = {"max": "maximum", "min": "minimum"}
_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "^": operator.pow}

Scope = dict[str, Any]     # name -> node id, or an Attr for a rule's node attribute


@dataclass(frozen=True)
class Attr:
    """A node attribute (``axis``, ``keepdims``) in a derivative rule's scope."""

    value: Any


@lru_cache(maxsize=None)
def parse_statements(text: str) -> tuple[ast.Assign, ...]:
    """Statements in .grad syntax (a rule as ``_r = RULE``, a decomposition), one per
    line, parsed once by the parser of user files, inside a dummy op."""
    from gradc.frontend.parser import parse      # loads the grammar on first use
    body = "".join(f"    {line.strip()}\n" for line in text.strip().splitlines())
    return tuple(parse(f"op _rule(g) -> _r {{\n{body}}}\n", file="<rule>").ops[0].body)


def operand_scope(node: Node) -> Scope:
    """What a rule or decomposition of ``node``'s primitive reads: the node's
    operands by parameter name and its attributes (``axis``, ``keepdims``)."""
    scope: Scope = dict(zip(PRIMITIVES[node.op].params, node.args))
    scope.update({k: Attr(v) for k, v in node.attrs})
    return scope


def dim_scope(b: Builder, op: ast.OpDef, scope: Scope) -> Scope:
    """The dims of ``op``'s signature that its bodies name (``eps / k`` for
    ``x: [n, k]``), each a ``dim_size`` node of its parameter's node in ``scope``;
    a name ``scope`` already holds (a parameter) wins, and an assignment later."""
    named = {e.id for e in ast.expressions(op) if isinstance(e, ast.Name)}
    return {d: b.apply("dim_size", (scope[p],), {"index": i})
            for d, (p, i) in op.dims.items() if d in named and d not in scope}


def lower_decomposition(graph: Graph, op: str, scope: Scope, span: Span | None) -> int:
    """The ``out`` of primitive ``op``'s decomposition, lowered into ``graph`` over
    ``scope`` (its operands by parameter name, its attributes as :class:`Attr`)."""
    text = PRIMITIVES[op].decomposition
    return ExprLowerer(graph, {}, rules=True, span=span).body(parse_statements(text), scope)["out"]


def next_stream(graph: Graph) -> int:
    """A stream of random numbers that no draw of ``graph`` (nor of the custom rules it
    holds) uses: one per call of a drawing builtin, in the order the op is lowered."""
    nodes = [*graph, *(n for r in graph.regions if r.rule.backward is not None
                       for n in r.rule.backward.nodes)]
    return 1 + max((n.attr("stream") for n in nodes if n.attr("stream") is not None),
                   default=-1)


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
        return _ARITH[e.op](a, b)
    raise ShapeError("expected a constant here (a number, a const name, or a tuple of ints)",
                     getattr(e, "span", None))


class ExprLowerer:
    """Lowers expressions of primitives into one graph.

    ``rules``: lowering a derivative rule or a decomposition, which may call the
    internal primitives and give a reduction its ``initial``; ``span``: the span
    of every node made (a rule's nodes point at the primal's source)."""

    def __init__(self, graph: Graph, consts: Mapping[str, float], *, rules: bool = False,
                 span: Span | None = None) -> None:
        self.graph = graph
        self.consts = consts
        self.rules = rules
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
        if e.id in CONSTANTS:           # true and false: bool constants
            v = CONSTANTS[e.id]
            return self.b.const(v, "bool" if isinstance(v, bool) else FLOAT, e.span)
        raise NameResolutionError(f"undefined name '{e.id}'", e.span)

    def _binop(self, e: ast.BinOp, scope: Scope) -> int:
        args = (self.expr(e.lhs, scope), self.expr(e.rhs, scope))
        a, b = (self.graph.node(x) for x in args)
        if e.op in "+-*" and a.op == b.op == "const" and \
                all(isinstance(n.value, int) or float(n.value).is_integer() for n in (a, b)):
            # integers of literals stay a literal (weak): labels + (0 - 100) is an i64
            return self.b.const(_ARITH[e.op](a.value, b.value), FLOAT, e.span)
        return self.b.apply(BINARY_OPS[e.op], args, span=e.span)

    def _compare(self, e: ast.Compare, scope: Scope) -> int:
        args = (self.expr(e.lhs, scope), self.expr(e.rhs, scope))
        return self.b.apply(COMPARE_OPS[e.op], args, span=e.span)

    def _neg(self, e: ast.Neg, scope: Scope) -> int:
        x = self.expr(e.operand, scope)
        node = self.graph.node(x)
        if node.op == "const" and node.dtype != "bool":   # -1 is a literal (weak) too
            return self.b.const(-node.value, FLOAT, e.span)
        return self.b.apply("neg", (x,), span=e.span)

    def _transpose(self, e: ast.Transpose, scope: Scope) -> int:
        return self.b.apply("transpose", (self.expr(e.operand, scope),), span=e.span)

    def _index(self, e: ast.Index, scope: Scope) -> int:
        return lower_index(self, e, scope)

    def _tupleexpr(self, e: ast.TupleExpr, scope: Scope) -> int:
        raise ShapeError("a tuple is only allowed as the value of axis=", e.span)

    def _call(self, e: ast.Call, scope: Scope) -> int:
        if e.func in SPECIAL_CALLS and not (self.rules and e.func in PRIMITIVES):
            return lower_special(self, e, scope)        # arange, eye, concat, stack
        if e.func == "transpose" and not self.rules and len(e.args) == 1 and not e.kwargs:
            return self.b.apply("transpose", (self.expr(e.args[0], scope),), span=e.span)  # x.T
        # a rule names primitives (transpose), a .grad file builtins (transpose: permute_dims)
        name = e.func if self.rules and e.func in PRIMITIVES else ALIASES.get(e.func, e.func)
        optional = dict(PRIMITIVES[name].optional) if name in PRIMITIVES else {}
        kinds = {k: kind for k, kind, _ in PRIMITIVES[name].keywords} \
            if name in PRIMITIVES else {}
        kw = {k: self._attr(k, v, scope, kinds.get(k)) for k, v in e.kwargs
              if k not in optional}
        positional = list(e.args)
        if name in PRIMITIVES and PRIMITIVES[name].attr_params:    # one_hot(idx, depth)
            n = len(PRIMITIVES[name].params)
            kw.update((k, self._attr(k, v, scope, kinds.get(k)))
                      for k, v in zip(PRIMITIVES[name].attr_params, positional[n:]))
            positional = positional[:n]
        args = [self.expr(a, scope) for a in positional]
        if optional:                # random_uniform_like(x, lo=-1): the others' defaults
            given = dict(e.kwargs)
            args += [self.expr(given[p], scope) if p in given else
                     self.b.const(optional[p], FLOAT, e.span)
                     for p in PRIMITIVES[name].params[len(args):]]
        if name in ("max", "min") and len(args) == 2:
            if not self.rules and self.graph.node(args[0]).shape.rank != 0:
                self._axis_like(e)          # (a 0-d array has no axis -1 to mean)
            name = _RENAMED[name]
        elif name in ("ones_like", "zeros_like"):
            args.append(self.b.const(1.0 if name == "ones_like" else 0.0, FLOAT, e.span))
            name = "full_like"
        if name in PRIMITIVES and PRIMITIVES[name].kind == "reduction":
            initial = {"initial": kw["initial"]} if self.rules and "initial" in kw else {}
            kw = {"axis": kw.get("axis"), "keepdims": bool(kw.get("keepdims", False)), **initial}
        if name not in PRIMITIVES or (name in INTERNAL and not self.rules):
            raise NameResolutionError(f"unknown function '{e.func}'", e.span)
        if PRIMITIVES[name].kind == DECOMPOSED:      # relu, softmax...: its statements
            self.b.check_indices(name, args, e.span)        # one_hot's labels
            scope = dict(zip(PRIMITIVES[name].params, args))
            scope.update((k, Attr(v)) for k, v in {**PRIMITIVES[name].defaults, **kw}.items())
            if PRIMITIVES[name].draws:
                scope.update(seed=self.b.source("seed"), offset=self.b.source("draw_offset"),
                             stream=Attr(next_stream(self.graph)))
            try:
                return lower_decomposition(self.graph, name, scope, self.b.span or e.span)
            except ShapeError as exc:          # a step of the builtin: name the builtin
                if not hasattr(exc, "why"):
                    raise
                shapes = [self.graph.node(a).shape for a in args]
                raise misfit(e.func, shapes, exc.why, exc.span) from None
        return self.b.apply(name, args, kw or None, span=e.span)

    def _axis_like(self, e: ast.Call) -> None:
        """Warn (W301) at ``max(x, -1)``: elementwise (NumPy's ``maximum``) here, but the
        largest along axis -1 in NumPy, JAX and PyTorch (``jnp.max(x, -1)``), a silent
        wrong answer for their users.  An integer literal other than 0 (``max(x, 0)`` is
        relu) written without a point; ``-1.0`` says the number is meant."""
        lit = e.args[1].operand if isinstance(e.args[1], ast.Neg) else e.args[1]
        if not (isinstance(lit, ast.Num) and lit.is_int and lit.value != 0):
            return
        axis = ("-" if isinstance(e.args[1], ast.Neg) else "") + lit.text
        number = axis + ".0"
        warning = GradcWarning(
            f"'{e.func}' of two arguments is elementwise: this is the {e.func}imum of its "
            f"first argument and the number {axis}, not the "
            f"{'largest' if e.func == 'max' else 'smallest'} element along axis {axis}, as "
            f"NumPy, JAX and PyTorch read {e.func}(x, {axis})", e.span, "W301",
            [f"along an axis, write {e.func}(x, axis={axis}); for the number, write "
             f"{e.func}(x, {number}) to say so"])
        if warning.key() not in {w.key() for w in self.graph.diagnostics}:
            self.graph.diagnostics.append(warning)

    def _attr(self, key: str, v: ast.Expr, scope: Scope, kind: str | None = None) -> Any:
        """The value of constant argument ``key`` (of ``kind``, the primitive's keyword
        kind): an int, a tuple of axes, a shape, a number, a dim of the signature."""
        if isinstance(v, ast.Name) and isinstance(scope.get(v.id), Attr):
            return scope[v.id].value                 # a rule's attribute: axis=axis
        if isinstance(v, ast.Name) and isinstance(scope.get(v.id), int) and \
                self.graph.node(scope[v.id]).op == "dim_size":
            return self._dim_attr(scope[v.id], v)    # one_hot(t, k)
        if key == "shape":                  # reshape(x, (n, -1)), reshape(x, -1)
            items = v.items if isinstance(v, ast.TupleExpr) else (v,)
            return tuple(self._attr("a shape's size", i, scope, "int") for i in items)
        attrs = {k: a.value for k, a in scope.items() if isinstance(a, Attr)}
        value = eval_const(v, {**self.consts, **attrs})   # reverse=1 - reverse in a rule
        if kind == "int" and isinstance(value, float):    # a const: const D = 2
            if not value.is_integer():
                raise ShapeError(f"{key} must be an integer, got {value}",
                                 getattr(v, "span", None))
            return int(value)
        if key == "axis":
            values = value if isinstance(value, tuple) else (value,)
            bad = next((a for a in values if not float(a).is_integer()), None)
            if bad is not None:                 # a const: const AX = 1.5
                raise ShapeError(f"axis= must be an integer, got {bad}",
                                 getattr(v, "span", None))
            axes = tuple(int(a) for a in values)
            if len(set(axes)) != len(axes):
                raise ShapeError(f"axis {axes} repeats an axis", getattr(v, "span", None))
            return axes
        return value

    def _dim_attr(self, nid: int, v: ast.Name) -> int | DimRef:
        """A dim of the signature as a constant argument: its size where the shape
        class of its parameter knows it (an int, or a dim name the call binds)."""
        node = self.graph.node(nid)
        shape, i = self.graph.node(node.args[0]).shape, node.attr("index")
        if shape.dyn or len(shape.static) < -i:
            raise ShapeError(f"'{v.id}' is a dim of an argument whose shape is not known "
                             "here: a constant argument needs a number or a dim of the "
                             "signature", v.span)
        d = shape.static[i]
        return d if isinstance(d, int) else DimRef(d)
