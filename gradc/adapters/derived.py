"""Derived ops: an op's VJP and JVP written as ops of their own, for the adapters.

A framework that differentiates a gradc op twice (``jax.grad`` of ``jax.grad``,
``check_grads(order=2)``) needs the derivatives of the op's ``vjp`` and ``jvp``
methods.  gradc compiles them from .grad source like any op.  The VJP of
``f(x, w) -> y`` is

    op f__vjp(x, w, dy) -> (grad_x, grad_w) {
        y = f(x, w)
        grad_x = grad(sum(y * dy), x)
        grad_w = grad(sum(y * dy), w)
    }

whose own ``vjp`` is the VJP's VJP: with respect to ``x`` and ``w`` the second
derivative through the custom rules as docs/second_order.md defines it (the rule
differentiated as written, residuals through the forward body: JAX's semantics
for a ``custom_vjp`` whose ``bwd`` is differentiable), with respect to ``dy``
the JVP.  The JVP of ``f`` is ``J t``, written as the gradient in ``dy`` of
``<J^T dy, t>``:

    op f__jvp(x, w, x_t, w_t) -> y_t {
        y = f(x, w)
        dy = zeros_like(y)
        grad_x = grad(sum(y * dy), x)
        grad_w = grad(sum(y * dy), w)
        y_t = grad(sum(grad_x * x_t) + sum(grad_w * w_t), dy)
    }

which does not depend on the value of ``dy`` because the VJP is linear in it:
an op whose grad block is not linear in its upstream (E405) has no JVP op.  The
text imports the op's own file, so every custom rule applies; it is compiled on
first use, through the cache of :func:`gradc.loader.load.load_text`.  A
derived op of a derived op (third order and up) extends the text.

The positional arguments of a derived op are the op's parameters without a
default, in order, then the upstream (VJP) or the tangents (JVP); the ones with
a default stay keyword-only.  :func:`signature_of` reads an op's parameters
from the signature its module records, for an adapter that needs them without
the source (first order).

Limits: an op with several outputs cannot be called inside an expression
(E306), so it has no derived ops (its first-order methods work as ever).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from gradc.codegen.module import param_text
from gradc.frontend.check import Program, check_source
from gradc.frontend.parser import read_source
from gradc.ir.lower import ParamInfo, param_infos
from gradc.pipeline import CompiledOp, build_op, tangent_names, upstream_names

KINDS = ("vjp", "jvp")


@dataclass(frozen=True)
class Source:
    """The .grad source of one op: ``text`` as if it were the file ``file``
    (imports resolve beside it), the op's ``name``, the module's ``options``,
    and ``derived``: whether the text is gradc's (a derived op's) or the user's."""

    text: str
    file: str
    name: str
    options: tuple = ()
    derived: bool = False

    @cached_property
    def program(self) -> Program:
        return check_source(self.text, self.file)

    @cached_property
    def params(self) -> tuple[ParamInfo, ...]:
        return param_infos(self.program.ops[self.name], self.program.consts)

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.program.ops[self.name].outputs

    @cached_property
    def compiled(self) -> CompiledOp:
        """The op's methods as gradc plans them (lowered, differentiated, simplified):
        the graphs its kernels compute, for an adapter that lowers them itself."""
        program = self.program
        return build_op(program.ops[self.name], program.ops, program.consts)


def require_op(op, adapter: str) -> None:
    """TypeError unless ``op`` is an op of a generated module (``gradc.load(path).NAME``,
    not one of its methods, a NumPy function or a lambda)."""
    if not (isinstance(getattr(op, "signature", None), str)
            and isinstance(getattr(op, "_methods", None), dict)
            and callable(getattr(op, "vjp", None))):
        what = getattr(op, "__qualname__", None) or type(op).__name__
        raise TypeError(f"{adapter}() expects an op of a gradc module (gradc.load(path).NAME, "
                        f"not one of its methods), got {what!r}")


def source_of(op, file: str | Path | None = None) -> Source:
    """The source of ``op``, an op of a generated module: the module's
    ``__gradc_origin__`` (``gradc.load`` records it) or the .grad ``file`` given.

    Raises ValueError when neither is known, and when the source on disk is not
    the one the module was compiled from (its ``SOURCE_SHA256``)."""
    from gradc.codegen.module import program_sha256
    name = op.__name__
    module = sys.modules.get(type(op).__module__)
    origin = origin_of(op)
    if file is not None:
        text, path, options = read_source(Path(file)), str(Path(file).resolve()), {}
    elif origin is not None:
        text, path, options = origin.text, origin.file, origin.options
    else:
        raise ValueError(f"{name}: the .grad file this op was compiled from is not known "
                         f"(modules from gradc.load record it); pass source='FILE.grad'")
    src = Source(text, path, name, tuple(sorted(options.items())))
    sha = getattr(module, "SOURCE_SHA256", None)
    if sha is not None and sha != program_sha256(src.program):
        raise ValueError(f"{name}: {path} (or a file it imports) is not the source this "
                         f"module was compiled from; reload the module")
    if name not in src.program.main_ops:
        raise ValueError(f"{name}: no op of that name in {path}")
    return src


def origin_of(op):
    """The :class:`gradc.loader.load.Origin` (file, text, options) that
    ``gradc.load`` records on the module of ``op``; None for a module it did not
    load (``gradc compile -o``, imported by hand)."""
    return getattr(sys.modules.get(type(op).__module__), "__gradc_origin__", None)


def signature_of(op) -> tuple[tuple[ParamInfo, ...], tuple[str, ...]]:
    """The parameters and the outputs of ``op``, an op of a generated module, read
    from the signature the module records (``op.signature``): no source needed."""
    from gradc.frontend import ast
    from gradc.frontend.parser import parse
    text = f"op {op.__name__}{op.signature} {{\n}}\n"
    (opdef,) = [d for d in parse(text, file=f"<signature of {op.__name__}>").items
                if isinstance(d, ast.OpDef)]
    return param_infos(opdef, {}), opdef.outputs     # defaults: numbers in the signature


def draws(op) -> bool:
    """Whether ``op``, an op of a generated module, draws random numbers: its
    methods then take ``seed=`` (keyword-only, in every method: the forward's
    signature says so), and so do its derived ops, which call it."""
    import inspect
    forward = op._methods.get("forward")
    if forward is None:
        return False
    param = inspect.signature(forward).parameters.get("seed")
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def derive(src: Source, kind: str) -> Source:
    """The source of the VJP (``kind="vjp"``) or JVP (``"jvp"``) op of ``src``'s op.

    Raises NotImplementedError for an op with several outputs (E306: it cannot
    be called inside an expression) or without differentiable parameters."""
    opdef = src.program.ops[src.name]
    if len(opdef.outputs) != 1:
        raise NotImplementedError(
            f"{src.name}: its {kind} cannot be differentiated: the op has "
            f"{len(opdef.outputs)} outputs, and ops with several outputs cannot be "
            f"called inside another op (E306), so gradc cannot differentiate the "
            f"{kind.upper()} of '{src.name}'")
    params = src.params
    diff = [p.name for p in params if p.differentiable]
    if not diff:
        raise NotImplementedError(f"{src.name}: no differentiable parameter")
    name = src.name + "__" + kind
    while name in src.program.ops:
        name += "_"
    y, = opdef.outputs
    u, = upstream_names(opdef)
    taken = {p.name for p in params} | {y, u}
    grads = [_fresh(f"grad_{p}", taken) for p in diff]
    call = f"{src.name}(" + ", ".join(      # positional arguments first, then keywords
        [p.name for p in params if not p.has_default]
        + [f"{p.name}={p.name}" for p in params if p.has_default]) + ")"
    body = [f"{y} = {call}"]
    if kind == "vjp":
        outs = grads[0] if len(grads) == 1 else f"({', '.join(grads)})"
        head = f"op {name}({_params(params, [u])}) -> {outs}"
        body += [f"{g} = grad(sum({y} * {u}), {p})" for g, p in zip(grads, diff)]
    else:
        ts = list(tangent_names(opdef))
        y_t = _fresh(f"{y}_t", taken | set(ts))
        head = f"op {name}({_params(params, ts)}) -> {y_t}"
        body += [f"{u} = zeros_like({y})"]
        body += [f"{g} = grad(sum({y} * {u}), {p})" for g, p in zip(grads, diff)]
        inner = " + ".join(f"sum({g} * {t})" for g, t in zip(grads, ts))
        body += [f"{y_t} = grad({inner}, {u})"]
    text = head + " {\n" + "".join(f"    {s}\n" for s in body) + "}\n"
    return _beside(src, text, name)


def _beside(src: Source, text: str, name: str) -> Source:
    """The Source of op ``name`` defined by ``text`` in a file that sees every op of
    ``src``'s: after a derived op's text, or importing the user's file."""
    if src.derived:
        return Source(src.text + "\n" + text, src.file, name, src.options, True)
    base = Path(src.file).name
    if '"' in base:
        raise NotImplementedError(f"{src.name}: cannot import {base!r} in a derived op")
    pseudo = Path(src.file).with_name(f"{Path(src.file).stem}__derived.grad")
    return Source(f'import "{base}"\n\n' + text, str(pseudo), name, src.options, True)


def primal(src: Source) -> Source | None:
    """The source of ``src``'s op without its grad block (None when it has none):
    the forward body alone, named ``NAME__primal``, whose derivatives are those of
    the body (inner ops keep their custom rules).

    This is what JAX differentiates for the primal output of a ``custom_vjp``'s
    ``fwd`` at second order: ``jax.grad(jax.grad(lambda x: sum(f(x) ** 2)))``
    takes the derivative of ``f(x)`` inside ``rule(x, dy = 2 f(x))`` through the
    forward body, not through the rule again."""
    if src.derived:                        # gradc's ops have no grad block
        return None
    opdef = src.program.ops[src.name]
    if opdef.grad is None:
        return None
    name = src.name + "__primal"
    while name in src.program.ops:
        name += "_"
    head = re.match(r"op\b(?:\s|#[^\n]*)*" + re.escape(src.name) + r"\b", opdef.primal_source)
    if head is None:                       # the text of an OpDef starts "op NAME"
        raise AssertionError(f"{src.name}: unexpected op text {opdef.primal_source[:40]!r}")
    text = f"op {name}" + opdef.primal_source[head.end():].rstrip() + "\n"
    return _beside(src, text, name)


def arity_error(name: str, positional: list[str], keywords: list[str], got: int) -> TypeError:
    """The TypeError for ``got`` positional arguments to an op taking ``positional``:
    where too many were given, it names the keyword-only parameters (those with a
    default), as the generated module's own error does."""
    msg = (f"{name}() takes {len(positional)} positional argument(s) "
           f"({', '.join(positional)}), got {got}")
    if keywords and got > len(positional):
        msg += (f": {', '.join(keywords)} {'is' if len(keywords) == 1 else 'are'} "
                f"keyword-only, as every parameter with a default: "
                f"{name}(..., {keywords[0]}=...)")
    return TypeError(msg)


INTEGER_DTYPES = {"i32": np.int32, "i64": np.int64, "bool": np.bool_}


def integer_array_fits(have: np.dtype, want: np.dtype) -> bool:
    """Whether an array of dtype ``have`` may be given for a parameter of integer or
    bool dtype ``want``, as the generated module takes it: ``want`` itself, or a
    narrower integer dtype that ``want`` holds exactly (widened; never from bool)."""
    return have == want or (have.kind in "iu" and want.kind in "iu"
                            and np.can_cast(have, want, "safe"))


def integer_scalar(name: str, param: ParamInfo, value):
    """``value`` as given for ``param``, checked where it is a Python number for an
    ``i32``/``i64``/``bool`` parameter, as the generated module checks it: exactly an
    ``int`` (a ``bool`` for ``bool``), within the dtype's range.  Raises TypeError
    (a float, say: never truncated) or OverflowError."""
    if param.dtype not in INTEGER_DTYPES or type(value) not in (bool, int, float, complex):
        return value
    want = np.dtype(INTEGER_DTYPES[param.dtype])
    if type(value) is not (bool if want.kind == "b" else int):
        raise TypeError(f"{name}: argument '{param.name}' must be {want.name}, "
                        f"got {type(value).__name__}")
    if want.kind != "b" and not np.iinfo(want).min <= value <= np.iinfo(want).max:
        raise OverflowError(f"{name}: argument '{param.name}' = {value} does not fit "
                            f"{want.name}")
    return value


def compile_op(src: Source):
    """The op object of ``src``, compiled (or read from the cache) and imported.
    Raises :class:`gradc.GradcError` where gradc cannot compile it."""
    import warnings

    from gradc.errors import GradcWarning
    from gradc.loader.load import load_text
    with warnings.catch_warnings():     # the imported file's, seen when it was loaded
        warnings.simplefilter("ignore", GradcWarning)
        return load_text(src.text, src.file, **dict(src.options)).OPS[src.name]


def _params(params: tuple[ParamInfo, ...], extra: list[str]) -> str:
    """The parameter list of a derived op: ``params`` without defaults, the ``extra``
    (upstreams or tangents), then those with defaults (keyword-only, as in every op)."""
    return ", ".join([param_text(p) for p in params if not p.has_default] + extra
                     + [param_text(p) for p in params if p.has_default])


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name
