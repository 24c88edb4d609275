"""Build the AST of :mod:`gradc.frontend.ast` from Lark's parse tree.

Spans point at the token a user would look for: the operator of a BinOp,
Compare or Neg, the function name of a Call, the target of an Assign, the
name of a Param and of an OpDef.  ``**`` is normalised to ``^``.  A grad
block is its own item in the grammar; :meth:`ToAst.start` attaches it to the
op whose body it follows and sets ``OpDef.source`` to the op's whole text
(``OpDef.primal_source``: the same up to the grad block).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from lark import Token, Transformer, v_args
from lark.tree import Meta

from gradc.errors import GradcError, ParseError, Span
from gradc.frontend import ast


@dataclass(frozen=True)
class _OpItem:
    op: ast.OpDef
    start: int               # character offsets of the op in the source
    end: int
    body_end: int = -1       # where its body ends (before a grad block); -1: at ``end``


@dataclass(frozen=True)
class _GradItem:
    block: ast.GradBlock
    end: int


@dataclass(frozen=True)
class _Kwarg:
    name: str
    value: ast.Expr
    span: Span


def _is_int_literal(text: str) -> bool:
    return not any(c in text for c in ".eE")


class ToAst(Transformer):
    """Transform a parse tree of ``file`` (whose text is ``text``) into an ast.Module.

    Errors found while building (a stray grad block, a positional argument
    after a keyword one) are collected in ``errors``; the caller raises them.
    """

    def __init__(self, file: str, text: str) -> None:
        super().__init__()
        self.file = file
        self.text = text
        self.errors: list[GradcError] = []

    def span(self, tok: Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column)

    # ---- items -----------------------------------------------------------

    def start(self, items: list[Any]) -> ast.Module:
        out: list[Any] = []
        for item in items:
            if isinstance(item, _GradItem):
                prev = out[-1] if out else None
                if not isinstance(prev, _OpItem) or prev.op.grad is not None:
                    self.errors.append(ParseError(
                        "a grad block must directly follow the body of an op",
                        item.block.span, "E102"))
                    continue
                op = dataclasses.replace(prev.op, grad=item.block)
                item = _OpItem(op, prev.start, item.end, prev.end)
                out[-1] = item
            else:
                out.append(item)
        return ast.Module(self.file, tuple(self._finish(i) for i in out), self.text)

    def _finish(self, item: Any) -> ast.Item:
        if isinstance(item, _OpItem):
            body_end = item.end if item.body_end < 0 else item.body_end
            return dataclasses.replace(item.op, source=self.text[item.start:item.end],
                                       primal_source=self.text[item.start:body_end])
        return item

    @v_args(inline=True)
    def import_item(self, kw: Token, path: Token) -> ast.Import:
        return ast.Import(path[1:-1], self.span(path))

    @v_args(inline=True)
    def const_item(self, kw: Token, name: Token, value: ast.Expr) -> ast.Const:
        return ast.Const(str(name), value, self.span(name))

    @v_args(meta=True, inline=True)
    def op_def(self, meta: Meta, kw: Token, name: Token, params: tuple | None,
               outputs: tuple[str, ...], body: tuple[ast.Assign, ...]) -> _OpItem:
        op = ast.OpDef(str(name), params or (), outputs, body, None, self.span(name))
        return _OpItem(op, meta.start_pos, meta.end_pos)

    @v_args(meta=True, inline=True)
    def grad_block(self, meta: Meta, kw: Token, upstreams: tuple[str, ...],
                   outputs: tuple[str, ...], surrogate: Token | None,
                   body: tuple[ast.Assign, ...]) -> _GradItem:
        block = ast.GradBlock(upstreams, outputs, body, self.span(kw), surrogate is not None)
        return _GradItem(block, meta.end_pos)

    # ---- op headers -------------------------------------------------------

    def params(self, items: list[ast.Param]) -> tuple[ast.Param, ...]:
        return tuple(items)

    @v_args(inline=True)
    def param(self, name: Token, type_ann: ast.TypeAnn | None,
              default: ast.Expr | None) -> ast.Param:
        return ast.Param(str(name), type_ann, default, self.span(name))

    @v_args(inline=True)
    def nograd_type(self, kw: Token, dtype: ast.TypeAnn | None) -> ast.TypeAnn:
        if dtype is None:
            return ast.TypeAnn(None, None, True, self.span(kw))
        return dataclasses.replace(dtype, nograd=True)

    @v_args(inline=True)
    def plain_type(self, dtype: ast.TypeAnn) -> ast.TypeAnn:
        return dtype

    @v_args(inline=True)
    def dtype(self, name: Token, shape: tuple[int | str, ...] | None) -> ast.TypeAnn:
        return ast.TypeAnn(str(name), shape, False, self.span(name))

    @v_args(meta=True, inline=True)
    def dims(self, meta: Meta, shape: tuple[int | str, ...]) -> ast.TypeAnn:
        """``x: [n, k]``: dims without a dtype, a generic float of that rank."""
        span = Span(self.file, meta.line, meta.column, meta.end_line, meta.end_column)
        return ast.TypeAnn(None, shape, False, span)

    def shape(self, dims: list[Token | None]) -> tuple[int | str, ...]:
        for d in dims:
            if d is not None and d.type == "INT" and (len(d) > 19 or int(d) >= 2**63):
                self.errors.append(ParseError("a dimension must be less than 2^63",
                                              self.span(d), "E104"))
                return ()
        return tuple(int(d) if d.type == "INT" else str(d) for d in dims if d is not None)

    def outputs(self, items: list[Any]) -> tuple[str, ...]:
        (item,) = items
        return item if isinstance(item, tuple) else (str(item),)

    def names(self, items: list[Token]) -> tuple[str, ...]:
        return tuple(str(t) for t in items)

    def body(self, stmts: list[ast.Assign]) -> tuple[ast.Assign, ...]:
        return tuple(stmts)

    @v_args(inline=True)
    def stmt(self, target: Token, value: ast.Expr) -> ast.Assign:
        return ast.Assign(str(target), value, self.span(target))

    # ---- expressions -------------------------------------------------------

    @v_args(inline=True)
    def compare(self, lhs: ast.Expr, op: Token, rhs: ast.Expr) -> ast.Compare:
        return ast.Compare(str(op), lhs, rhs, self.span(op))

    @v_args(inline=True)
    def binop(self, lhs: ast.Expr, op: Token, rhs: ast.Expr) -> ast.BinOp:
        sym = "^" if op == "**" else str(op)
        return ast.BinOp(sym, lhs, rhs, self.span(op))

    @v_args(inline=True)
    def neg(self, op: Token, operand: ast.Expr) -> ast.Neg:
        return ast.Neg(operand, self.span(op))

    @v_args(inline=True)
    def pos(self, op: Token, operand: ast.Expr) -> ast.Expr:
        return operand

    @v_args(inline=True)
    def transpose(self, operand: ast.Expr, tok: Token) -> ast.Transpose:
        return ast.Transpose(operand, self.span(tok))

    @v_args(inline=True)
    def index(self, value: ast.Expr, tok: Token, items: tuple) -> ast.Index:
        return ast.Index(value, items, self.span(tok))

    def subscripts(self, items: list[Any]) -> tuple:
        return tuple(items)

    def slice(self, items: list[Any]) -> ast.Slice:
        # [start] ':' [stop] [':' [step]]: placeholders are None
        start, colon, stop, *rest = items
        step = rest[-1] if len(rest) == 2 else None
        return ast.Slice(start, stop, step, self.span(colon))

    @v_args(inline=True)
    def ellipsis(self, tok: Token) -> ast.EllipsisIndex:
        return ast.EllipsisIndex(self.span(tok))

    @v_args(inline=True)
    def number(self, tok: Token) -> ast.Num:
        text = str(tok)
        value = float(text)
        mantissa = re.split(r"[eE]", text)[0]
        if math.isinf(value):
            self.errors.append(ParseError(
                f"the number {text} is too large for float64 (it would be inf); "
                f"write inf, or a number below 1.8e308", self.span(tok), "E105"))
        elif value == 0 and re.search(r"[1-9]", mantissa):
            self.errors.append(ParseError(
                f"the number {text} is too small for float64 (it would be 0); write 0, "
                f"or a number above 4.9e-324", self.span(tok), "E105"))
        return ast.Num(value, text, self.span(tok), _is_int_literal(text))

    @v_args(inline=True)
    def name(self, tok: Token) -> ast.Name:
        return ast.Name(str(tok), self.span(tok))

    def tuple_expr(self, items: list[Any]) -> ast.TupleExpr:
        lpar, *rest = items
        flat: list[ast.Expr] = []
        for item in rest:
            if isinstance(item, list):
                flat.extend(item)
            elif item is not None:
                flat.append(item)
        return ast.TupleExpr(tuple(flat), self.span(lpar))

    def exprs(self, items: list[ast.Expr]) -> list[ast.Expr]:
        return list(items)

    @v_args(inline=True)
    def call(self, name: Token, args: list[Any] | None) -> ast.Call:
        positional: list[ast.Expr] = []
        kwargs: list[tuple[str, ast.Expr]] = []
        names: list[Span] = []
        for arg in args or ():
            if isinstance(arg, _Kwarg):
                kwargs.append((arg.name, arg.value))
                names.append(arg.span)
            elif kwargs:
                self.errors.append(ParseError(
                    "a positional argument cannot follow a keyword argument",
                    leftmost_span(arg), "E103"))
            else:
                positional.append(arg)
        return ast.Call(str(name), tuple(positional), tuple(kwargs), self.span(name),
                        tuple(names))

    def args(self, items: list[Any]) -> list[Any]:
        return list(items)

    @v_args(inline=True)
    def kwarg(self, name: Token, value: ast.Expr) -> _Kwarg:
        return _Kwarg(str(name), value, self.span(name))


def operands_span(expr: ast.Expr) -> Span:
    """The span of ``expr`` from its first token to its last where that is a name or a
    number on the same line (``labels != 0``), else of its first token."""
    first, last = leftmost_span(expr), expr
    while isinstance(last, (ast.BinOp, ast.Compare)):
        last = last.rhs
    end = last.span if isinstance(last, (ast.Name, ast.Num)) else None
    if end is None or end.end_column is None or end.line != first.line \
            or end.end_line not in (None, first.line):
        return first
    return Span(first.file, first.line, first.column, first.line, end.end_column)


def leftmost_span(expr: ast.Expr) -> Span:
    """The span of the first token of ``expr`` (operators' spans point at the operator)."""
    while isinstance(expr, (ast.BinOp, ast.Compare, ast.Transpose, ast.Index)):
        expr = (expr.operand if isinstance(expr, ast.Transpose) else
                expr.value if isinstance(expr, ast.Index) else expr.lhs)
    return expr.span
