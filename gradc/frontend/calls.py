"""Name resolution and call checks inside op bodies (used by :mod:`gradc.frontend.check`).

A name in an expression is a local (parameter, earlier assignment, upstream,
forward name in a grad block), a dim of the signature (``k`` of ``x: [n, k]``: its
size), a const, or ``pi``/``e``/``inf``/``true``/``false``.  A call names an op the
file can see or a builtin of :data:`BUILTINS` (an op of a builtin's name shadows it).  Calls of builtins are
checked against the table (arity, ``axis=``, ``keepdims=``), calls of ops
against the callee's parameters, bound like Python: positional arguments in
declared order (a parameter with a default may be passed either way),
keywords by name, every parameter without a default bound once.
"""
from __future__ import annotations

from typing import Mapping

import networkx as nx

from gradc.errors import GradcError, GradientError, NameResolutionError, Span, TypeError_
from gradc.frontend import ast
from gradc.frontend.builtins import BUILTINS, CONSTANTS, MAX_JOINED
from gradc.frontend.consts import PYTHON_NAMES, did_you_mean, undefined_name
from gradc.frontend.to_ast import leftmost_span

# name -> (kind, where it is defined); kind is parameter, assignment, upstream or forward.
Scope = dict[str, tuple[str, Span]]

KEEPDIMS_NAMES = ("true", "false")
_MAX_AXIS = 64          # NumPy's most dims


class CallChecker:
    """Checks the expressions of one op, recording its calls of ops in ``calls``."""

    def __init__(self, ops: Mapping[str, ast.OpDef], consts: set[str], calls: nx.DiGraph,
                 caller: str, errors: list[GradcError], dims: Mapping[str, object] = {}) -> None:
        self.ops = ops
        self.dims = dims            # the dim names of the caller's signature
        self.consts = consts
        self.calls = calls
        self.caller = caller
        self.errors = errors

    def expr(self, e: ast.Expr, scope: Scope, later: Mapping[str, Span]) -> None:
        """Check ``e`` where ``scope`` is defined and ``later`` will be assigned later."""
        match e:
            case ast.Name():
                self._name(e, scope, later)
            case ast.BinOp() | ast.Compare():
                self.expr(e.lhs, scope, later)
                self.expr(e.rhs, scope, later)
            case ast.Neg() | ast.Transpose():
                self.expr(e.operand, scope, later)
            case ast.TupleExpr():
                self._error(TypeError_, "a tuple can only be an axis= value", e.span, "E304")
            case ast.Index():
                self._index(e, scope, later)
            case ast.Call():
                self._call(e, scope, later)

    def _name(self, n: ast.Name, scope: Scope, later: Mapping[str, Span]) -> None:
        if n.id in scope:
            return
        if n.id in later:
            self._error(NameResolutionError, f"name '{n.id}' is used before it is assigned",
                        n.span, "E202", [f"'{n.id}' is assigned at {later[n.id]}"])
        elif n.id in self.dims or n.id in self.consts or n.id in CONSTANTS:
            return
        elif n.id in self.ops or n.id in BUILTINS:
            self._error(NameResolutionError, f"'{n.id}' is a function: call it as {n.id}(...)",
                        n.span, "E201")
        else:
            self._undefined(n, scope)

    def _undefined(self, n: ast.Name, scope: Scope) -> None:
        self.errors.append(undefined_name(n.id, n.span,
                                          [*scope, *self.dims, *self.consts, *CONSTANTS]))

    def _error(self, cls: type[GradcError], message: str, span: Span, code: str,
               notes: list[str] | tuple[str, ...] = ()) -> None:
        self.errors.append(cls(message, span, code, notes))

    # ---- calls -------------------------------------------------------------------

    def _call(self, c: ast.Call, scope: Scope, later: Mapping[str, Span]) -> None:
        if c.func == "grad":
            self._grad_call(c, scope, later)
        elif c.func in self.ops:
            self._op_call(c, self.ops[c.func], scope, later)
        elif c.func in BUILTINS:
            self._builtin_call(c, scope, later)
        else:
            self._error(NameResolutionError, f"unknown function '{c.func}'", c.span, "E201",
                        did_you_mean(c.func, [*BUILTINS, *self.ops]))
            for arg in (*c.args, *(v for _, v in c.kwargs)):
                self.expr(arg, scope, later)

    def _builtin_call(self, c: ast.Call, scope: Scope, later: Mapping[str, Span]) -> None:
        b = BUILTINS[c.func]
        n = len(c.args)
        first = b.max_args - len(b.attrs)           # the position of the first attribute
        keyed = [k for k, _ in c.kwargs if k in b.attrs and first + b.attrs.index(k) >= n]
        count = n + len(keyed)                      # with the attributes given by keyword
        if not b.min_args <= count <= b.max_args:
            takes = (f"{b.min_args}" if b.min_args == b.max_args else
                     f"{b.min_args} or {b.max_args}" if b.max_args == b.min_args + 1 else
                     f"at least {b.min_args}" if b.max_args >= MAX_JOINED else
                     f"{b.min_args} to {b.max_args}")
            notes = [f"pass the axis as {c.func}(x, axis=...)"] if b.kwargs and n == 2 else []
            self._error(TypeError_, f"'{c.func}' takes {takes} argument"
                        f"{'' if b.max_args == 1 else 's'}, got {count}", c.span, "E303",
                        notes)
        for i, arg in enumerate(c.args):            # operands, then attributes
            kind = b.arg_kinds[i - first] if first <= i < first + len(b.arg_kinds) else None
            if kind is None and isinstance(arg, ast.TupleExpr) and b.max_args >= MAX_JOINED:
                self._error(TypeError_, f"'{c.func}' takes its arrays as separate arguments, "
                            "not a tuple", arg.span, "E304",
                            [f"write {c.func}(x1, x2, ..., axis=k), not a tuple of them as "
                             f"NumPy's np.{'stack' if c.func == 'stack' else 'concatenate'}"])
            elif kind is None:
                self.expr(arg, scope, later)
            else:
                self._attribute(c.func, kind, arg, scope)
        seen = {k for k, _ in b.kwarg_kinds                   # optional operands given
                if b.position(k) is not None and b.position(k) < n}   # positionally
        seen |= {a for a in b.attrs if a not in keyed}       # attributes given positionally
        for k, (key, value) in enumerate(c.kwargs):
            named = _keyword_span(c, k)
            if key in seen:
                self._error(TypeError_, f"keyword argument '{key}' is given twice",
                            named, "E303")
            elif key in b.attrs:
                self._attribute(c.func, dict(zip(b.attrs, b.arg_kinds))[key], value, scope)
            elif key not in b.kwargs:
                names = b.attrs + b.kwargs
                takes = (f"only {' and '.join(k + '=' for k in names)}" if names
                         else "no keyword arguments")
                self._error(NameResolutionError, f"'{c.func}' has no keyword argument '{key}'",
                            named, "E201", [f"'{c.func}' takes {takes}"])
            elif n == 2 and b.kind == "special":    # elementwise max/min
                self._error(TypeError_, f"'{c.func}' of two arguments is elementwise and "
                            "takes no axis= or keepdims=", named, "E303")
            elif dict(b.kwarg_kinds)[key] == "axis":
                self._axis(value)
            elif dict(b.kwarg_kinds)[key] == "value":
                self.expr(value, scope, later)
            else:
                self._bool(key, value)
            seen.add(key)

    def _attribute(self, func: str, kind: str, value: ast.Expr, scope: Scope) -> None:
        """A constant argument of ``func`` of ``kind`` (``Builtin.arg_kinds``); a name
        defined nowhere is that error (E201), not one of the argument's kind."""
        name = value.operand if isinstance(value, ast.Neg) else value
        if isinstance(name, ast.Name) and not (
                name.id in scope or name.id in self.dims or name.id in self.consts
                or name.id in CONSTANTS or name.id in self.ops or name.id in BUILTINS):
            self._undefined(name, scope)
            return
        if kind == "axis":
            self._axis(value)
        elif kind == "shape":
            self._shape(value)
        else:
            self._int(func, value)

    def _axis(self, value: ast.Expr) -> None:
        """An integer, a const (whose value must be one: checked as it is lowered) or
        a tuple of them."""
        items = value.items if isinstance(value, ast.TupleExpr) else (value,)
        if not all(_is_int(i) or self._is_const(i) for i in items):
            self._error(TypeError_, "axis= must be an integer, a const or a tuple of them",
                        leftmost_span(value), "E304")
        elif any(abs((i.operand if isinstance(i, ast.Neg) else i).value) >= _MAX_AXIS
                 for i in items if _is_int(i)):
            self._error(TypeError_, f"axis= out of range (arrays have fewer than "
                        f"{_MAX_AXIS} dims)", leftmost_span(value), "E304")

    def _int(self, func: str, value: ast.Expr) -> None:
        """An integer argument (one_hot's depth, swapaxes' axes, topk's k): an integer,
        a dim of the signature or a const (whose value must be one: checked as it is
        lowered)."""
        if not (_is_int(value) or self._is_const(value)
                or isinstance(value, ast.Name) and value.id in self.dims):
            self._error(TypeError_, f"'{func}' takes an integer here (an integer, a dim or a "
                        "const)", leftmost_span(value), "E304")

    def _is_const(self, e: ast.Expr) -> bool:
        """A const's name, or its negation."""
        e = e.operand if isinstance(e, ast.Neg) else e
        return isinstance(e, ast.Name) and e.id in self.consts

    def _index(self, e: ast.Index, scope: Scope, later: Mapping[str, Span]) -> None:
        """``x[...]``: its expressions, and what is wrong whatever the array (a float
        literal, a step of 0, two '...'); the rest is checked as it is lowered."""
        self.expr(e.value, scope, later)
        ellipses = [i for i in e.items if isinstance(i, ast.EllipsisIndex)]
        if len(ellipses) > 1:
            self._error(TypeError_, "an index can only have a single ellipsis ('...')",
                        ellipses[1].span, "E309")
        for item in e.items:
            if isinstance(item, ast.Slice) and _is_int(item.step) and \
                    (item.step.operand if isinstance(item.step, ast.Neg) else item.step).value == 0:
                self._error(TypeError_, "slice step cannot be zero", item.step.span, "E309")
        for sub in ast.index_expressions(e):
            bare = sub.operand if isinstance(sub, ast.Neg) else sub
            if isinstance(bare, ast.Num) and not bare.is_int:
                self._error(TypeError_, f"an index must be an integer, got {bare.text}",
                            bare.span, "E309")
            else:
                self.expr(sub, scope, later)

    def _shape(self, value: ast.Expr) -> None:
        """A shape: an integer, a dim of the signature or a const (whose value must be
        an integer: checked as it is lowered), or a tuple of them."""
        items = value.items if isinstance(value, ast.TupleExpr) else (value,)
        if not all(_is_int(i) or self._is_const(i) or isinstance(i, ast.Name) and
                   i.id in self.dims for i in items):
            self._error(TypeError_, "a shape must be an integer, a dim of the signature, a "
                        "const or a tuple of them", leftmost_span(value), "E304")

    def _bool(self, key: str, value: ast.Expr) -> None:
        ok = (isinstance(value, ast.Num) and value.is_int and value.value in (0, 1)) or (
            isinstance(value, ast.Name) and value.id in KEEPDIMS_NAMES)
        if not ok:
            python = isinstance(value, ast.Name) and value.id in PYTHON_NAMES
            self._error(TypeError_, f"{key}= must be 0, 1, true or false",
                        leftmost_span(value), "E304", [PYTHON_NAMES[value.id]] if python else [])

    def _grad_call(self, c: ast.Call, scope: Scope, later: Mapping[str, Span]) -> None:
        if len(c.args) != 2 or c.kwargs:
            self._error(TypeError_, "'grad' takes 2 arguments: grad(EXPR, NAME), got "
                        f"{len(c.args) + len(c.kwargs)}", c.span, "E303")
        for arg in c.args[:1]:
            self.expr(arg, scope, later)
        if len(c.args) < 2:
            return
        wrt = c.args[1]
        if isinstance(wrt, ast.Name) and wrt.id in later and wrt.id not in scope:
            self._name(wrt, scope, later)
        elif not isinstance(wrt, ast.Name) or wrt.id not in scope:
            self._error(GradientError, "the second argument of grad() must be a parameter "
                        "or an assigned name", leftmost_span(wrt), "E404")

    def _op_call(self, c: ast.Call, callee: ast.OpDef, scope: Scope,
                 later: Mapping[str, Span]) -> None:
        if not self.calls.has_edge(self.caller, callee.name):
            self.calls.add_edge(self.caller, callee.name, span=c.span)
        if len(callee.outputs) != 1:
            self._error(TypeError_, f"op '{callee.name}' returns {len(callee.outputs)} outputs; "
                        "only an op with one output can be called in an expression",
                        c.span, "E306")
        names = [p.name for p in callee.params]
        if len(c.args) > len(names):
            self._error(TypeError_, f"op '{callee.name}' takes at most {len(names)} "
                        f"argument{'' if len(names) == 1 else 's'}, got {len(c.args)}",
                        c.span, "E303")
        bound = set(names[:len(c.args)])
        for k, (key, value) in enumerate(c.kwargs):
            if key not in names:
                self._error(NameResolutionError, f"op '{callee.name}' has no parameter '{key}'",
                            _keyword_span(c, k), "E201", did_you_mean(key, names))
            elif key in bound:
                self._error(TypeError_, f"argument '{key}' of op '{callee.name}' is given twice",
                            _keyword_span(c, k), "E303")
            bound.add(key)
        missing = [p.name for p in callee.params if p.default is None and p.name not in bound]
        if missing:
            self._error(TypeError_, f"call of op '{callee.name}' is missing "
                        f"{'the argument' if len(missing) == 1 else 'the arguments'} "
                        f"{', '.join(repr(m) for m in missing)}", c.span, "E303")
        for arg in (*c.args, *(v for _, v in c.kwargs)):
            self.expr(arg, scope, later)


def _keyword_span(c: ast.Call, k: int) -> Span:
    """Where keyword argument ``k`` of ``c`` is named (its value's first token in a
    call that was not parsed)."""
    return c.kwarg_spans[k] if c.kwarg_spans else leftmost_span(c.kwargs[k][1])


def _is_int(e: ast.Expr) -> bool:
    if isinstance(e, ast.Neg):
        e = e.operand
    return isinstance(e, ast.Num) and e.is_int
