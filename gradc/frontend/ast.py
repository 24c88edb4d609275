"""The abstract syntax tree of a .grad file: frozen dataclasses with spans.

Built from Lark's parse tree by :mod:`gradc.frontend.to_ast`; consumed by
:mod:`gradc.frontend.check` and lowered to the graph IR by
:mod:`gradc.ir.lower`.  Operators are normalised: ``**`` becomes ``^``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Union

from gradc.errors import Span


@dataclass(frozen=True)
class Num:
    value: float
    text: str                # as written, e.g. "1e-3"
    span: Span
    is_int: bool = False     # written without '.', 'e' or 'E'


@dataclass(frozen=True)
class Name:
    id: str                  # also the constants pi, e, inf
    span: Span


@dataclass(frozen=True)
class BinOp:
    op: str                  # one of + - * / @ ^
    lhs: "Expr"
    rhs: "Expr"
    span: Span               # the operator token


@dataclass(frozen=True)
class Compare:
    op: str                  # one of < <= > >= == !=
    lhs: "Expr"
    rhs: "Expr"
    span: Span


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class Transpose:
    operand: "Expr"
    span: Span               # the '.T'


@dataclass(frozen=True)
class TupleExpr:
    items: tuple["Expr", ...]   # e.g. axis=(0, 1)
    span: Span


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple["Expr", ...]
    kwargs: tuple[tuple[str, "Expr"], ...]
    span: Span               # the function name
    # the keywords' names, in the order of kwargs (empty for a call not parsed)
    kwarg_spans: tuple[Span, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Slice:
    """``start:stop:step`` inside a subscript; an omitted part is None."""

    start: "Expr | None"
    stop: "Expr | None"
    step: "Expr | None"
    span: Span               # the first ':'


@dataclass(frozen=True)
class EllipsisIndex:
    """``...`` inside a subscript: as many ``:`` as the other items leave."""

    span: Span


@dataclass(frozen=True)
class Index:
    """``value[items]``: NumPy's indexing (docs/language.md, *Indexing*); each item an
    expression (an integer, or an integer array: advanced indexing), a Slice or ``...``."""

    value: "Expr"
    items: tuple["Expr | Slice | EllipsisIndex", ...]
    span: Span               # the '['


Expr = Union[Num, Name, BinOp, Compare, Neg, Transpose, TupleExpr, Call, Index]


def index_expressions(e: Index) -> tuple["Expr", ...]:
    """The expressions of ``e``'s subscript, in source order (a slice's bounds)."""
    out: list[Expr] = []
    for item in e.items:
        if isinstance(item, Slice):
            out.extend(b for b in (item.start, item.stop, item.step) if b is not None)
        elif not isinstance(item, EllipsisIndex):
            out.append(item)
    return tuple(out)


def children(e: Expr) -> tuple[Expr, ...]:
    """The operands of ``e``, in source order (keyword values after arguments)."""
    if isinstance(e, (BinOp, Compare)):
        return (e.lhs, e.rhs)
    if isinstance(e, (Neg, Transpose)):
        return (e.operand,)
    if isinstance(e, Call):
        return (*e.args, *(v for _, v in e.kwargs))
    if isinstance(e, TupleExpr):
        return e.items
    if isinstance(e, Index):
        return (e.value, *index_expressions(e))
    return ()


def expressions(op: "OpDef") -> Iterator[Expr]:
    """Every expression of ``op``'s forward body and grad block, subexpressions
    included (iteratively: no recursion limit on deep expressions)."""
    todo: list[Expr] = [s.value for s in (*op.body, *(op.grad.body if op.grad else ()))]
    while todo:
        e = todo.pop()
        yield e
        todo.extend(children(e))


def calls(stmts: tuple["Assign", ...], func: str,
          ops: Mapping[str, "OpDef"] | None = None) -> bool:
    """Whether an expression of ``stmts`` calls ``func``, there or in the forward body
    of an op of ``ops`` that it calls, at any depth (iteratively: no recursion limit on
    deep expressions)."""
    todo: list[Expr] = [s.value for s in stmts]
    seen: set[str] = set()
    while todo:
        e = todo.pop()
        if isinstance(e, Call):
            if e.func == func:
                return True
            if ops is not None and e.func in ops and e.func not in seen:
                seen.add(e.func)
                todo.extend(s.value for s in ops[e.func].body)
        todo.extend(children(e))
    return False


@dataclass(frozen=True)
class Assign:
    target: str
    value: Expr
    span: Span               # the target name


@dataclass(frozen=True)
class TypeAnn:
    dtype: str | None        # f16 f32 f64 i32 i64 bool, or None (generic float)
    shape: tuple[int | str, ...] | None   # None: any shape
    nograd: bool
    span: Span


@dataclass(frozen=True)
class Param:
    name: str
    type: TypeAnn | None
    default: Expr | None
    span: Span

    @property
    def differentiable(self) -> bool:
        t = self.type
        if t is None:
            return True
        return not t.nograd and t.dtype not in ("i32", "i64", "bool")


@dataclass(frozen=True)
class GradBlock:
    upstreams: tuple[str, ...]
    outputs: tuple[str, ...]
    body: tuple[Assign, ...]
    span: Span               # the 'grad' keyword
    surrogate: bool = False  # not meant to be the derivative: no W401/W410 (docs/audit.md)


@dataclass(frozen=True)
class OpDef:
    name: str
    params: tuple[Param, ...]
    outputs: tuple[str, ...]
    body: tuple[Assign, ...]
    grad: GradBlock | None
    span: Span               # the op's name
    source: str = ""         # the op's text, for NAME.spec
    primal_source: str = ""  # the same without its grad block (the forward body alone)

    @property
    def dims(self) -> dict[str, tuple[str, int]]:
        """The dim names of the signature (``x: [n, k]``), each with the first
        parameter annotated with it and its axis counted from the end (-1 for ``k``):
        in an expression a dim is that size, known at call time."""
        out: dict[str, tuple[str, int]] = {}
        for p in self.params:
            shape = p.type.shape if p.type is not None and p.type.shape else ()
            for i, d in enumerate(shape):
                if isinstance(d, str):
                    out.setdefault(d, (p.name, i - len(shape)))
        return out


@dataclass(frozen=True)
class Const:
    name: str
    value: Expr
    span: Span


@dataclass(frozen=True)
class Import:
    path: str                # as written, relative to the importing file
    span: Span


Item = Union[Import, Const, OpDef]


@dataclass(frozen=True)
class Module:
    file: str
    items: tuple[Item, ...]
    text: str = field(default="", repr=False, compare=False)     # what was parsed

    @property
    def ops(self) -> tuple[OpDef, ...]:
        return tuple(i for i in self.items if isinstance(i, OpDef))
