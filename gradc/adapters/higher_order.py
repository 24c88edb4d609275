"""What the framework adapters need to know about an op, and its VJP as an op.

:func:`op_info` reads an op's parameters from its source (``op.spec``) and
signature.  :func:`vjp_op` compiles, once per op and from the op's own ``.grad``
source, the auxiliary op

    op NAME__vjp(params..., ct_OUT) -> (d_P, ...) {
        l__ = sum(NAME(params...) * ct_OUT)
        d_P = grad(l__, P)              # one per differentiable parameter P
    }

whose forward is ``NAME.vjp`` (the cotangent contracted with the Jacobian, or the
grad block's rule where the op has one) and whose own ``vjp`` is therefore the
derivative of the VJP: with respect to the cotangent ``ct`` it is the JVP of the
rule's transpose, with respect to the parameters a Hessian-vector contraction;
``grad()`` differentiates a grad block's expressions as written
(docs/second_order.md).  Applied to ``NAME__vjp`` itself it gives the third order,
and so on.  The auxiliary file imports the op's source and lives in the cache
directory; it is compiled with the options of the op's module.
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace


@dataclass(frozen=True)
class ParamInfo:
    """One parameter: its name, its text in the signature (``x: f32[b, i]``,
    ``alpha: nograd = 0.01``), whether it gets a gradient, its dtype annotation
    (None for a generic float) and whether it has a default (keyword-only)."""
    name: str
    text: str
    differentiable: bool
    dtype: str | None
    keyword: bool


@dataclass(frozen=True)
class OpInfo:
    """An op's name, parameters (in declared order), outputs and whether it has a
    grad block of its own."""
    name: str
    params: tuple[ParamInfo, ...]
    outputs: tuple[str, ...]
    custom: bool

    @cached_property
    def positional(self) -> tuple[ParamInfo, ...]:
        return tuple(p for p in self.params if not p.keyword)

    @cached_property
    def keywords(self) -> tuple[ParamInfo, ...]:
        return tuple(p for p in self.params if p.keyword)

    @cached_property
    def differentiable(self) -> tuple[ParamInfo, ...]:
        return tuple(p for p in self.params if p.differentiable)


_INFO: dict[int, OpInfo] = {}
_VJP_OPS: dict[int | str, object] = {}   # by id(op), and module names tried


def op_info(op) -> OpInfo:
    """The :class:`OpInfo` of ``op`` (an op of a generated module), parsed from
    ``op.spec`` and ``op.signature``."""
    info = _INFO.get(id(op))
    if info is None:
        info = _INFO[id(op)] = _parse_info(op)
    return info


def _parse_info(op) -> OpInfo:
    from gradc.frontend import ast
    from gradc.frontend.parser import parse
    defs = [d for d in parse(op.spec, file=f"<spec of {op.__name__}>").items
            if isinstance(d, ast.OpDef)]
    (opdef,) = defs
    texts = _split_params(op.signature)
    params = tuple(ParamInfo(p.name, text, p.differentiable, p.type and p.type.dtype,
                             p.default is not None)
                   for p, text in zip(opdef.params, texts))
    return OpInfo(opdef.name, params, opdef.outputs, opdef.grad is not None)


def _split_params(signature: str) -> list[str]:
    """The parameter texts of ``(a: f32[n, k], b = 1) -> y``, split at the commas
    outside brackets."""
    depth, start, parts = 0, 1, []
    for i, ch in enumerate(signature):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                parts.append(signature[start:i])
                break
        elif ch == "," and depth == 1:
            parts.append(signature[start:i])
            start = i + 1
    return [p.strip() for p in parts if p.strip()]


def module_of(op) -> SimpleNamespace:
    """What the adapters read of the generated module that defines ``op``: its
    ``__name__``, ``OPS``, and the ``__gradc_source__`` and ``__gradc_options__``
    that :func:`gradc.load` records (None and ``{}`` otherwise).  Read from the
    globals of the module's own ``_GradcOp`` class, so it works for a module that
    was imported without a ``sys.modules`` entry too."""
    g = type(op).__init__.__globals__
    return SimpleNamespace(__name__=g["__name__"], OPS=g["OPS"],
                           __gradc_source__=g.get("__gradc_source__"),
                           __gradc_options__=g.get("__gradc_options__", {}))


def vjp_op(op):
    """The op ``NAME__vjp`` of ``op`` (see the module docstring), compiled once.

    The first call for an op of a module compiles the auxiliary ops of all its
    ops with one output, in one file (one compile, one module); where that fails,
    each op on its own, so that one op's error stays its own.  Needs the op's
    ``.grad`` source: modules from :func:`gradc.load` record it
    (``__gradc_source__``).  Raises NotImplementedError for an op with several
    outputs (it cannot be called inside another op, E306) and for a module without
    a recorded source, and RuntimeError when gradc cannot compile the auxiliary op
    (the compiler's error attached).
    """
    aux = _VJP_OPS.get(id(op))
    if aux is None:
        module = module_of(op)
        if module.__name__ not in _VJP_OPS:     # once per module: all its ops together
            _VJP_OPS[module.__name__] = module
            ops = [o for o in module.OPS.values()
                   if len(op_info(o).outputs) == 1 and op_info(o).differentiable]
            try:
                for o, a in zip(ops, _compile_vjp_ops(ops, module)):
                    _VJP_OPS[id(o)] = a
            except (RuntimeError, NotImplementedError):
                pass
        aux = _VJP_OPS.get(id(op))
        if aux is None:
            aux = _VJP_OPS[id(op)] = _compile_vjp_ops([op], module)[0]
    return aux


def _compile_vjp_ops(ops, module) -> list:
    import gradc
    from gradc.runtime.cache import cache_dir, write_atomic
    names = ", ".join(f"'{op_info(op).name}'" for op in ops)
    what = f"the VJP of gradc op {names} as a differentiable op (double backward)"
    source = module.__gradc_source__
    if source is None:
        raise NotImplementedError(
            f"{what} needs the op's .grad source: load the module with gradc.load(path) "
            f"(module {module.__name__} was imported from a file gradc did not record)")
    for op in ops:
        if len(op_info(op).outputs) != 1:
            raise NotImplementedError(
                f"{what}: ops with several outputs cannot be called inside another op "
                f"(E306), so gradc cannot differentiate the VJP of '{op_info(op).name}'")
    parts = [vjp_source(op_info(op), source) for op in ops]
    text = "\n".join([f'import "{source}"', ""] + [t for _, t in parts])
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = cache_dir() / "adapters" / f"{Path(source).stem}__vjp_{digest}.grad"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    try:
        with warnings.catch_warnings():     # the source's own warnings, seen already
            warnings.simplefilter("ignore", gradc.GradcWarning)
            aux = gradc.load(path, **module.__gradc_options__)
    except gradc.GradcError as exc:
        raise RuntimeError(f"{what}: gradc could not compile it:\n{exc}") from exc
    return [aux.OPS[name] for name, _ in parts]


def vjp_source(info: OpInfo, source: str) -> tuple[str, str]:
    """The name and ``.grad`` text of the auxiliary op of ``info`` (one output), to
    follow ``import "SOURCE"``."""
    used = {p.name for p in info.params} | set(info.outputs) | {info.name}
    fresh = lambda base: next(base + "_" * k for k in range(len(used) + 2)  # noqa: E731
                              if base + "_" * k not in used)
    (out,) = info.outputs
    ct, loss, name = fresh(f"ct_{out}"), fresh("l__"), fresh(f"{info.name}__vjp")
    used |= {ct, loss, name}
    grads = []
    for p in info.differentiable:
        grads.append(fresh(f"d_{p.name}"))
        used.add(grads[-1])
    args = [p.name for p in info.positional] + [f"{p.name}={p.name}" for p in info.keywords]
    params = [p.text for p in info.positional] + [ct] + [p.text for p in info.keywords]
    outs = grads[0] if len(grads) == 1 else f"({', '.join(grads)})"
    lines = [f"op {name}({', '.join(params)}) -> {outs} {{",
             f"    {loss} = sum({info.name}({', '.join(args)}) * {ct})"]
    lines += [f"    {g} = grad({loss}, {p.name})" for g, p in zip(grads, info.differentiable)]
    return name, "\n".join(lines + ["}", ""])
