"""Evaluate ``const`` items and parameter defaults at compile time.

A constant expression uses numbers, ``+ - * / ^``, unary minus, ``pi``, ``e``,
``inf``, earlier constants, and elementwise builtins of one or two numbers
(``sqrt(2)``, ``log(10)``, ``max(a, b)``).  Values are Python floats (float64);
code generation casts them to the dtype they meet.
"""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import numpy as np

from gradc.errors import GradcError, NameResolutionError, Span, TypeError_
from gradc.frontend import ast
from gradc.frontend.builtins import BUILTINS, CONSTANTS
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES


def _number_functions() -> dict[str, Callable[..., float]]:
    """The public elementwise primitives of numbers only (not ``where``'s condition, not
    ``full_like``'s shape source), by their names and aliases, with their NumPy
    references, and ``max``/``min`` of two numbers (``maximum``/``minimum``)."""
    found = {name: p.ref for p in PRIMITIVES.values()
             if p.public and p.kind == ELEMENTWISE and not p.shape_only
             and p.value_operands is None for name in (p.name, *p.aliases)}
    return {**found, "max": PRIMITIVES["maximum"].ref, "min": PRIMITIVES["minimum"].ref}


FUNCTIONS: Mapping[str, Callable[..., float]] = MappingProxyType(_number_functions())

_BINOPS: Mapping[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "^": math.pow,
}


class ConstError(Exception):
    """Why a constant expression has no value; becomes a GradcError at its span."""

    def __init__(self, error: GradcError) -> None:
        super().__init__(error.message)
        self.error = error


def evaluate(expr: ast.Expr, consts: Mapping[str, float],
             later: Mapping[str, ast.Const] | None = None) -> float:
    """The value of the constant expression ``expr``; raise ConstError if it has none.

    ``consts`` holds the constants it may use; ``later`` the constants of the same
    file defined after it, for a clearer message.
    """
    match expr:
        case ast.Num(value=value):
            return value
        case ast.Name(id=name, span=span):
            if name in consts:
                return consts[name]
            if name in CONSTANTS:
                return CONSTANTS[name]
            if later and name in later:
                raise ConstError(NameResolutionError(
                    f"const '{name}' is used before it is defined", span, "E202",
                    [f"'{name}' is defined at {later[name].span}"]))
            raise ConstError(undefined_name(name, span, [*consts, *CONSTANTS]))
        case ast.Neg(operand=operand):
            return -evaluate(operand, consts, later)
        case ast.BinOp(op=op, span=span) if op in _BINOPS:
            lhs = evaluate(expr.lhs, consts, later)
            rhs = evaluate(expr.rhs, consts, later)
            return _apply(_BINOPS[op], (lhs, rhs), f"'{op}'", span)
        case ast.Call(func=func, span=span) if func in FUNCTIONS:
            if expr.kwargs or len(expr.args) not in _arity(func):
                raise ConstError(TypeError_(
                    f"'{func}' in a constant expression takes {_arity_words(func)}",
                    span, "E305"))
            args = tuple(evaluate(a, consts, later) for a in expr.args)
            return _apply(FUNCTIONS[func], args, f"'{func}'", span)
        case ast.Call(func=func, span=span) if func not in BUILTINS:
            raise ConstError(NameResolutionError(
                f"unknown function '{func}'", span, "E201", did_you_mean(func, FUNCTIONS)))
    raise ConstError(TypeError_(
        f"{_describe(expr)} cannot be used in a constant expression", expr.span, "E305",
        ["a constant uses numbers, + - * / ^, pi, e, inf, other constants "
         "and elementwise functions such as sqrt(2)"]))


def _arity(func: str) -> range:
    b = BUILTINS[func]
    return range(2, 3) if func in ("max", "min") else range(b.min_args, b.max_args + 1)


def _arity_words(func: str) -> str:
    n = _arity(func).start
    return f"{n} number{'s' if n > 1 else ''} and no keyword arguments"


def _apply(fn: Callable[..., float], args: tuple[float, ...], what: str, span: Span) -> float:
    """``fn(*args)`` in float64; an exception, or an inf or NaN from finite operands
    (``1e308 * 10``, which Python computes silently), is E305 at ``span``.  NumPy's
    invalid operations and poles (``log(-1)``, ``log(0)``) raise here; an overflow
    inside a function that still has a finite value (``sigmoid(-1000)``) does not."""
    try:
        with np.errstate(divide="raise", invalid="raise", over="ignore", under="ignore"):
            value = float(fn(*args))
    except (ArithmeticError, ValueError) as exc:
        why = ("division by zero" if isinstance(exc, ZeroDivisionError) else
               "overflow: beyond float64's range" if isinstance(exc, OverflowError) else
               "outside the function's domain" if isinstance(exc, FloatingPointError)
               or str(exc) == "math domain error" else str(exc))
    else:
        if math.isfinite(value) or not all(math.isfinite(a) for a in args):
            return value
        why = "overflow: beyond float64's range" if math.isinf(value) else "not a number"
    raise ConstError(TypeError_(
        f"{what} has no value here ({why})", span, "E305",
        ["constant expressions are computed in float64 when compiling; where an infinity "
         "is meant, write inf or -inf"])) from None


def constant_subexpressions(e: ast.Expr, is_const: Callable[[str], bool]) -> list[ast.Expr]:
    """The largest subexpressions of ``e`` that are constant expressions (in
    ``x * exp(1000) + 2``: ``exp(1000)`` and ``2``), in source order; ``is_const(name)``
    says whether a name is a constant there (not shadowed by a local name)."""
    found, todo = [], [e]
    while todo:
        sub = todo.pop()
        if _is_constant(sub, is_const):
            found.append(sub)
        else:
            todo.extend(reversed(ast.children(sub)))
    return found


def _is_constant(e: ast.Expr, is_const: Callable[[str], bool]) -> bool:
    match e:
        case ast.Num():
            return True
        case ast.Name(id=name):
            return is_const(name)
        case ast.Neg(operand=operand):
            return _is_constant(operand, is_const)
        case ast.BinOp(op=op) if op in _BINOPS:
            return _is_constant(e.lhs, is_const) and _is_constant(e.rhs, is_const)
        case ast.Call(func=func) if func in FUNCTIONS:
            return (not e.kwargs and len(e.args) in _arity(func)
                    and all(_is_constant(a, is_const) for a in e.args))
    return False


def _describe(expr: ast.Expr) -> str:
    match expr:
        case ast.Call(func=func):
            return f"'{func}'"
        case ast.BinOp(op=op) | ast.Compare(op=op):
            return f"'{op}'"
        case ast.Transpose():
            return "'.T'"
        case ast.TupleExpr():
            return "a tuple"
    return "this"


# Functions users reach for that are not builtins: how to write each (the note replaces
# a spelling suggestion, which for 'silu' would be 'sin', for 'var' 'tan').
WRITE_AS = {
    "silu": "x * sigmoid(x)",
    "swish": "x * sigmoid(x)",
    "gelu": "0.5 * x * (1 + erf(x / sqrt(2)))",
    "logit": "log(x) - log1p(-x)",
    "logaddexp": "max(a, b) + log1p(exp(-abs(a - b)))",
    "var": "mean((x - mean(x, axis=-1, keepdims=true))^2, axis=-1)",
}


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance with transpositions (optimal string alignment)."""
    prev2, prev = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            row.append(min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb)))
            if prev2 is not None and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def did_you_mean(name: str, candidates: Iterable[str]) -> list[str]:
    """A note on how to write ``name`` (WRITE_AS), or suggesting the candidate a typo
    away from it (edits at most a third of its length, at least one), or no note."""
    if name in WRITE_AS:
        return [f"'{name}' is not a builtin function: write {WRITE_AS[name]}"]
    limit = max(1, len(name) // 3)
    near = sorted((edit_distance(name, c), c) for c in set(candidates))
    return [f"did you mean '{near[0][1]}'?"] if near and near[0][0] <= limit else []


# Python's names a user of NumPy writes, and what gradc spells instead.
PYTHON_NAMES = {
    "None": "gradc has no None: add an axis with expand_dims (x[:, None] is "
            "expand_dims(x, axis=1)); leave out an argument for its default",
    "True": "write true (lowercase)",
    "False": "write false (lowercase)",
}


def undefined_name(name: str, span: Span, candidates: Iterable[str]) -> NameResolutionError:
    """The error for a name that is defined nowhere."""
    notes = [PYTHON_NAMES[name]] if name in PYTHON_NAMES else did_you_mean(name, candidates)
    return NameResolutionError(f"undefined name '{name}'", span, "E201", notes)
