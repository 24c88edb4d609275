"""Semantic checks of a parsed .grad file and the files it imports (the rules of
docs/language.md).

:func:`check` resolves imports, evaluates constants, checks every op's names,
calls, outputs and grad block, rejects recursion, and reports all errors
together.  Error codes:

====  ==========================================================
E201  undefined name, unknown function or keyword
E202  name used before it is assigned
E203  name defined twice (parameter, output, assignment, op, const); an op named
      ``grad``; an op of a builtin's name where a file that does not see it calls
      the builtin
N203  (a note) an op takes a builtin's name: it shadows the builtin in its file and
      in the files that import it, as a Python def shadows a builtin
E204  output or gradient output never assigned
E205  imported file missing or unreadable
E206  recursion
E207  a parameter with a default named ``out`` or ``stream`` (keywords of the methods)
E302  unknown dtype
E303  wrong arguments in a call
E304  bad ``axis=`` / ``keepdims=`` value, tuple outside ``axis=``
E305  constant expression without a value
E306  op with several outputs called in an expression
E307  a default its parameter's dtype cannot hold (``n: i32 = 2.5``)
E401  grad block: wrong number of upstream names
E402  grad block: wrong number of gradient outputs
E403  grad block: a name shadows another
E404  ``grad(EXPR, NAME)`` whose NAME is not a local name
====  ==========================================================
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import networkx as nx

from gradc.errors import (GradcError, GradcWarning, GradientError, NameResolutionError, Span,
                          TypeError_, raise_all)
from gradc.frontend import ast, limits
from gradc.frontend.builtins import BUILTINS, CONSTANTS, DTYPES
from gradc.frontend.calls import CallChecker, Scope
from gradc.frontend.consts import ConstError, constant_subexpressions, did_you_mean, evaluate
from gradc.frontend.parser import parse, read_source

Loader = Callable[[str], ast.Module]


@dataclass(frozen=True)
class Program:
    """A checked program: every op and const of the main file and its imports."""

    ops: dict[str, ast.OpDef]        # imported files' ops first, then the main file's
    consts: dict[str, float]         # every const, evaluated
    files: tuple[str, ...]           # every source file involved, the main file first
    main_ops: tuple[str, ...]        # the ops defined in the main file, in order
    # The text of each of ``files``, as parsed: each file is read once, so a key or
    # hash of these is a key of what was compiled, whatever changes on disk meanwhile.
    sources: tuple[str, ...] = ()
    # Notes (GradcWarning, severity "note") by the op they are about: N203.
    diagnostics: tuple = ()


def check(module: ast.Module, *, loader: Loader | None = None) -> Program:
    """Check ``module`` and everything it imports; raise all errors found together.

    ``loader(path)`` returns the parsed module of an imported file (default:
    read and :func:`parse` it) and raises OSError when it cannot be read.
    """
    errors: list[GradcError] = []
    modules, imports = _load(module, loader or _read_module, errors)
    # an import that cannot be read or parsed is reported alone: the names it defines
    # are unknown, so every use of them would be an error too
    raise_all(errors)
    owners = _collect_definitions(modules, errors)
    notes = _shadowed_builtins(modules, owners, imports, errors)
    consts = _evaluate_consts(modules, owners, imports, errors)
    calls = nx.DiGraph()
    ops: dict[str, ast.OpDef] = {}
    for mod in modules:
        visible = _visible(mod.file, owners, imports)
        env_ops = {n: d for n, d in visible.items() if isinstance(d, ast.OpDef)}
        env_consts = {n for n, d in visible.items() if isinstance(d, ast.Const)}
        for op in mod.ops:
            if owners.get(op.name) is op:
                ops[op.name] = op
            calls.add_node(op.name)
            _OpChecker(op, CallChecker(env_ops, env_consts, calls, op.name, errors, op.dims),
                       {n: v for n, v in consts.items() if n in env_consts}).run()
    _check_recursion(calls, ops, errors)
    if not errors:          # callees first (there is no recursion now)
        order = reversed(list(nx.lexicographical_topological_sort(calls)))
        errors.extend(limits.check_inlined(ops, [n for n in order if n in ops]))
    raise_all(errors)
    main_first = [modules[-1], *modules[:-1]]
    return Program(ops, consts, tuple(m.file for m in main_first),
                   tuple(op.name for op in module.ops), tuple(m.text for m in main_first),
                   notes)


def check_source(text: str, file: str = "<string>", *, loader: Loader | None = None) -> Program:
    """Parse and check the .grad source ``text``."""
    return check(parse(text, file), loader=loader)


def load_program(path: str | os.PathLike[str]) -> Program:
    """Read, parse and check the .grad file at ``path`` and its imports."""
    name = os.fspath(path)
    return check(parse(read_source(name), name))


# ---- imports ------------------------------------------------------------------

def _read_module(path: str) -> ast.Module:
    # OSError and UnicodeDecodeError propagate: the import's span reports them.  Errors
    # in a file not named .grad (import "/etc/passwd") show no line of it, only the
    # offending token.
    return parse(limits.read_capped(path).decode("utf-8-sig"), path,
                 quote=path.endswith(".grad"))


def _key(path: str) -> str:
    return os.path.normcase(os.path.abspath(path))


def _load(main: ast.Module, loader: Loader,
          errors: list[GradcError]) -> tuple[list[ast.Module], nx.DiGraph]:
    """Every module involved, imports before importers (each file once), and the
    import graph over their files."""
    order: list[ast.Module] = []
    graph = nx.DiGraph()
    seen: dict[str, ast.Module | None] = {_key(main.file): main}
    try:
        top = os.path.dirname(os.path.realpath(main.file))
    except ValueError:              # a NUL in a file name given as text (compile_source)
        top = os.path.dirname(os.path.abspath(main.file))

    def visit(mod: ast.Module) -> None:
        graph.add_node(mod.file)
        for item in mod.items:
            if not isinstance(item, ast.Import):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(mod.file), item.path))
            key = _key(path)
            if key not in seen:
                shown = any(_inside(path, d) for d in (top, os.path.dirname(mod.file)))
                seen[key] = _load_one(path, item, loader, errors, shown)
                if seen[key] is not None:
                    visit(seen[key])
            if seen[key] is not None:
                graph.add_edge(mod.file, seen[key].file)
        order.append(mod)

    visit(main)
    return order, graph


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` (links resolved) lies in the folder tree of ``folder``."""
    try:
        folder = os.path.realpath(folder)
        return os.path.commonpath([os.path.realpath(path), folder]) == folder
    except ValueError:              # another drive (Windows), a NUL in the path
        return False


def _load_one(path: str, item: ast.Import, loader: Loader, errors: list[GradcError],
              shown: bool) -> ast.Module | None:
    """The module of the imported file ``path``, or None with its errors added.  When
    not ``shown`` (a file outside the importing file's folder tree: import
    "/etc/shadow"), a file that is not readable .grad gets one error at the import,
    with nothing of its content."""
    def error(message: str, notes=()) -> None:
        errors.append(NameResolutionError(message, item.span, "E205", notes))

    try:
        return loader(path)
    except FileNotFoundError:
        error(f"cannot find the imported file '{item.path}'", [f"looked for {path}"])
        return None
    except OSError as exc:
        error(f"cannot read the imported file '{item.path}': {exc.strerror or exc}")
        return None
    except (GradcError, UnicodeDecodeError) as exc:
        if not shown:
            error(f"cannot import '{item.path}': it is not a .grad file gradc can read, and "
                  "it lies outside the folder of the importing file, so nothing of it is "
                  "shown", [f"compile {path} on its own to see its errors"])
        elif isinstance(exc, GradcError):
            errors.append(exc)
        else:
            error(f"cannot read the imported file '{item.path}': it is not UTF-8 text "
                  f"(byte {exc.start})")
    except ValueError:              # from the OS layer: a path no file can have
        error(f"cannot import '{item.path}': no file can have this name (it holds a NUL "
              "character or a lone surrogate)")
    return None


# ---- definitions, visibility, constants -----------------------------------------

Definition = ast.OpDef | ast.Const


def _collect_definitions(modules: list[ast.Module],
                         errors: list[GradcError]) -> dict[str, Definition]:
    """The first definition of every op and const name; later ones are errors."""
    owners: dict[str, Definition] = {}
    for mod in modules:
        for item in mod.items:
            if isinstance(item, ast.Import):
                continue
            kind = "op" if isinstance(item, ast.OpDef) else "const"
            if kind == "op" and item.name == "grad":
                errors.append(NameResolutionError(
                    "an op cannot be named 'grad' (grad(EXPR, NAME) and grad blocks)",
                    item.span, "E203"))
            elif kind == "const" and item.name in CONSTANTS:
                errors.append(NameResolutionError(
                    f"const '{item.name}' redefines a builtin constant", item.span, "E203"))
            elif item.name in owners:
                errors.append(NameResolutionError(
                    f"'{item.name}' is defined twice", item.span, "E203",
                    [f"first defined at {owners[item.name].span}"]))
            else:
                owners[item.name] = item
    return owners


def _shadowed_builtins(modules: list[ast.Module], owners: dict[str, Definition],
                       imports: nx.DiGraph, errors: list[GradcError]) -> tuple:
    """A note (N203) for each op of a builtin's name: it shadows the builtin where it
    is seen.  A file of the program that does not see it (a file it imports) and calls
    the builtin is error E203: one program inlines ops by name, so the two could not
    be told apart there."""
    notes = []
    for name, op in owners.items():
        if not isinstance(op, ast.OpDef) or name not in BUILTINS:
            continue
        notes.append(GradcWarning(
            f"op '{name}' shadows the builtin function '{name}' in this file and the files "
            "that import it", op.span, "N203", severity="note"))
        for mod in modules:
            if op.span.file in {mod.file} | nx.descendants(imports, mod.file):
                continue
            call = next((e for o in mod.ops for e in ast.expressions(o)
                         if isinstance(e, ast.Call) and e.func == name), None)
            if call is not None:
                errors.append(NameResolutionError(
                    f"this file calls the builtin '{name}', which op '{name}' of a file "
                    "importing it shadows", call.span, "E203",
                    [f"op '{name}' is defined at {op.span}; rename it"]))
    return tuple(notes)


def _visible(file: str, owners: dict[str, Definition],
             imports: nx.DiGraph) -> dict[str, Definition]:
    """The definitions ``file`` sees: its own and those of the files it imports, transitively."""
    files = {file} | nx.descendants(imports, file)
    return {n: d for n, d in owners.items() if d.span.file in files}


def _evaluate_consts(modules: list[ast.Module], owners: dict[str, Definition],
                     imports: nx.DiGraph, errors: list[GradcError]) -> dict[str, float]:
    values: dict[str, float] = {}
    for mod in modules:
        visible = _visible(mod.file, owners, imports)
        consts = [i for i in mod.items if isinstance(i, ast.Const)]
        for i, const in enumerate(consts):
            scope = {n: v for n, v in values.items() if n in visible}
            later = {c.name: c for c in consts[i + 1:]}
            try:
                value = evaluate(const.value, scope, later)
            except ConstError as exc:
                errors.append(exc.error)
                value = float("nan")
            if owners.get(const.name) is const:
                values[const.name] = value
        for op in mod.ops:
            _check_defaults(op, {n: v for n, v in values.items() if n in visible}, errors)
    return values


_INT_RANGES = {"i32": (-2 ** 31, 2 ** 31 - 1), "i64": (-2 ** 63, 2 ** 63 - 1)}


def _check_defaults(op: ast.OpDef, consts: dict[str, float], errors: list[GradcError]) -> None:
    """Each default has a value (E305), which its parameter's dtype holds (E307: an
    ``i32`` default is an integer in range, a ``bool`` one 0 or 1)."""
    for p in op.params:
        if p.default is None:
            continue
        try:
            value = evaluate(p.default, consts)
        except ConstError as exc:
            errors.append(exc.error)
            continue
        dtype = p.type.dtype if p.type is not None else None
        if dtype in _INT_RANGES:
            lo, hi = _INT_RANGES[dtype]
            if math.isfinite(value) and value == int(value) and lo <= value <= hi:
                continue
            want = f"an integer in [{lo}, {hi}]"
        elif dtype == "bool":
            if value in (0, 1):
                continue
            want = "0 (false) or 1 (true)"
        else:
            continue
        errors.append(TypeError_(
            f"parameter '{p.name}' is {dtype}, so its default must be {want}, got {value:g}",
            getattr(p.default, "span", p.span), "E307"))


# ---- ops --------------------------------------------------------------------------

class _OpChecker:
    """Checks one op: parameters, forward body, outputs and grad block."""

    def __init__(self, op: ast.OpDef, calls: CallChecker, consts: dict[str, float]) -> None:
        self.op = op
        self.calls = calls
        self.consts = consts            # the values of the consts visible here
        self.errors = calls.errors

    def run(self) -> None:
        scope = self._params()
        scope = self._body(self.op.body, scope)
        self._outputs(scope)
        if self.op.grad is not None:
            forward = {n: ("forward" if k == "assignment" else k, s)
                       for n, (k, s) in scope.items()}
            self._grad(self.op.grad, forward)

    def _params(self) -> Scope:
        scope: Scope = {}
        for p in self.op.params:
            if p.name in scope:
                self._twice(f"parameter '{p.name}' is declared twice", p.span,
                            f"first declared at {scope[p.name][1]}")
            else:
                scope[p.name] = ("parameter", p.span)
            if p.name in ("out", "stream") and p.default is not None:
                what = ("of every method for its result buffers" if p.name == "out" else
                        "of the CUDA methods for their CUDA stream")
                self.errors.append(NameResolutionError(
                    f"a parameter with a default cannot be named '{p.name}'", p.span, "E207",
                    [f"parameters with a default are keyword-only, and '{p.name}=' is the "
                     f"keyword {what}: rename the parameter"]))
            if p.type is not None and p.type.dtype is not None and p.type.dtype not in DTYPES:
                self.errors.append(TypeError_(
                    f"unknown dtype '{p.type.dtype}'", p.type.span, "E302",
                    did_you_mean(p.type.dtype, DTYPES) or [f"dtypes: {', '.join(DTYPES)}"]))
        return scope

    def _body(self, body: tuple[ast.Assign, ...], scope: Scope) -> Scope:
        """Check statements in order; return the scope after the last one."""
        scope = dict(scope)
        later = {}
        for stmt in body:
            later.setdefault(stmt.target, stmt.span)
        for stmt in body:
            self.calls.expr(stmt.value, scope, later)
            self._constants(stmt.value, scope)
            if stmt.target in scope:
                self._reassigned(stmt, *scope[stmt.target])
            else:
                scope[stmt.target] = ("assignment", stmt.span)
        return scope

    def _constants(self, e: ast.Expr, scope: Scope) -> None:
        """Evaluate the constant subexpressions of ``e`` as a ``const`` is evaluated:
        one without a value (``exp(1000)``, ``1e308 * 10``, ``log(-1)``) is E305 here
        too, not an inf or NaN the kernels would compute silently."""
        is_const = lambda name: name not in scope and (name in self.consts or name in CONSTANTS)
        for sub in constant_subexpressions(e, is_const):
            try:
                evaluate(sub, self.consts)
            except ConstError as exc:
                self.errors.append(exc.error)

    def _reassigned(self, stmt: ast.Assign, kind: str, first: Span) -> None:
        name = stmt.target
        if kind in ("parameter", "upstream"):
            self._twice(f"{kind} '{name}' cannot be assigned", stmt.span,
                        f"'{name}' is declared at {first}")
        elif kind == "forward":
            self._twice(f"'{name}' is assigned twice", stmt.span,
                        f"first assigned in the forward body at {first}")
        else:
            self._twice(f"'{name}' is assigned twice", stmt.span, f"first assigned at {first}")

    def _twice(self, message: str, span: Span, note: str) -> None:
        self.errors.append(NameResolutionError(message, span, "E203", [note]))

    def _outputs(self, scope: Scope) -> None:
        op = self.op
        for i, out in enumerate(op.outputs):
            if out in op.outputs[:i]:
                self.errors.append(NameResolutionError(
                    f"output '{out}' of op '{op.name}' is declared twice", op.span, "E203"))
            elif scope.get(out, ("",))[0] != "assignment":
                self.errors.append(NameResolutionError(
                    f"output '{out}' of op '{op.name}' is never assigned", op.span, "E204"))

    def _grad(self, grad: ast.GradBlock, forward: Scope) -> None:
        op = self.op
        n_out, n_up = len(op.outputs), len(grad.upstreams)
        if n_up != n_out:
            self.errors.append(GradientError(
                f"op '{op.name}' has {_count(n_out, 'output')}, so its grad block takes "
                f"{_count(n_out, 'upstream name')}, got {n_up}", grad.span, "E401"))
        diff = [p.name for p in op.params if p.differentiable]
        if len(grad.outputs) != len(diff):
            notes = [f"parameter '{p.name}' is {_why_no_gradient(p)}, so it gets no gradient"
                     for p in op.params if not p.differentiable]
            self.errors.append(GradientError(
                f"op '{op.name}' has {_count(len(diff), 'differentiable parameter')}"
                f"{' (' + ', '.join(diff) + ')' if diff else ''}, so its grad block returns "
                f"{_count(len(diff), 'gradient')}, got {len(grad.outputs)}", grad.span, "E402",
                notes))
        scope = dict(forward)
        outputs: Scope = {}
        for names, kind in ((grad.upstreams, "upstream"), (grad.outputs, "gradient output")):
            for name in names:
                if name in scope or name in outputs:
                    self._shadows(kind, name, *(scope.get(name) or outputs[name]))
                elif kind == "upstream":
                    scope[name] = ("upstream", grad.span)
                else:
                    outputs[name] = ("gradient output", grad.span)
        scope = self._body(grad.body, scope)
        for out in outputs:
            if scope.get(out, ("",))[0] != "assignment":
                self.errors.append(NameResolutionError(
                    f"gradient output '{out}' is never assigned", grad.span, "E204"))

    def _shadows(self, kind: str, name: str, other: str, span: Span) -> None:
        what = f"'{name}' of the forward body" if other == "forward" else f"the {other} '{name}'"
        assert self.op.grad is not None
        self.errors.append(GradientError(
            f"{kind} '{name}' of the grad block shadows {what}",
            self.op.grad.span, "E403", [f"'{name}' is defined at {span}"]))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _check_recursion(calls: nx.DiGraph, ops: dict[str, ast.OpDef],
                     errors: list[GradcError]) -> None:
    """One error per group of ops that call each other, at the first call of the cycle."""
    order = {name: i for i, name in enumerate(ops)}
    for group in nx.strongly_connected_components(calls):
        first = min(group, key=lambda n: order.get(n, len(order)))
        if len(group) == 1 and not calls.has_edge(first, first):
            continue
        cycle = nx.find_cycle(calls.subgraph(group), source=first)
        path = " -> ".join([first, *(v for _, v in cycle)])
        what = f"op '{first}' calls itself" if len(group) == 1 else path
        errors.append(NameResolutionError(f"recursion is not allowed: {what}",
                                          calls.edges[cycle[0]]["span"], "E206"))


def _why_no_gradient(p: ast.Param) -> str:
    t = p.type
    return f"{t.dtype}" if t.dtype in ("i32", "i64", "bool") else "marked nograd"
