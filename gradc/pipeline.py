"""From a checked program to optimised graphs and kernel plans, per op and method.

For each op: lower the forward body to the primal graph; for ``vjp`` and
``fwd_bwd`` add one upstream (cotangent) parameter per output and run reverse
mode; for ``jvp`` add one tangent parameter per differentiable parameter and
run forward mode; then the pass pipeline and fusion, fused and unfused.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Mapping

from gradc import passes
from gradc.autodiff.core import zeros_like
from gradc.autodiff.forward import jvp
from gradc.autodiff.reverse import vjp
from gradc.errors import (GradcError, GradcWarning, GradientError, NameResolutionError,
                          NotSupportedError, raise_all)
from gradc.frontend import ast
from gradc.ir.builder import Builder
from gradc.ir.graph import FLOAT, Graph
from gradc.ir.lower import ParamInfo, lower_op, param_infos
from gradc.passes import row_plan
from gradc.passes.fuse import KernelPlan, plan_kernels
from gradc.passes.row_plan import RowVariant

METHODS = ("forward", "vjp", "fwd_bwd", "jvp")


@dataclass
class Method:
    name: str
    graph: Graph
    fused: KernelPlan
    unfused: KernelPlan
    # The custom regions of the graph as differentiated, before the passes dissolve
    # them (passes.dissolve_regions): where each custom op's forward body came from,
    # for tools (gradc graph); node ids the passes replaced are no longer in ``graph``.
    regions: tuple = ()


@dataclass
class CompiledOp:
    """Every method of one op, lowered, differentiated and planned."""

    op: ast.OpDef
    params: tuple[ParamInfo, ...]
    upstreams: tuple[str, ...]            # one cotangent name per output
    tangents: tuple[str, ...] = ()        # one tangent name per differentiable parameter
    methods: dict[str, Method] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)   # method -> why it is not there
    primal: Graph | None = None
    diagnostics: list = field(default_factory=list)    # GradcWarnings, in order found
    draws: bool = False           # it draws random numbers: every method takes seed=
    # Row plans of an op whose parameters have no declared shapes (gradc.passes.row_plan):
    # the same op with its arrays declared of rank 2 or 1, run on the collapsed arrays.
    rows: tuple = ()


def upstream_names(op: ast.OpDef) -> tuple[str, ...]:
    """``d<out>`` per output (the grad block's names when it has one)."""
    if op.grad is not None:
        return op.grad.upstreams
    taken = {p.name for p in op.params} | {s.target for s in op.body}
    names = []
    for o in op.outputs:
        n = f"d{o}"
        while n in taken:
            n = f"d{n}"
        names.append(n)
    return tuple(names)


def tangent_names(op: ast.OpDef) -> tuple[str, ...]:
    """``<param>_t`` per differentiable parameter (more ``_t`` while taken)."""
    taken = {p.name for p in op.params} | {s.target for s in op.body} | set(op.outputs)
    taken |= set(upstream_names(op))
    names = []
    for p in op.params:
        if p.differentiable:
            n = f"{p.name}_t"
            while n in taken:
                n = f"{n}_t"
            taken.add(n)
            names.append(n)
    return tuple(names)


def build_op(op: ast.OpDef, ops: Mapping[str, ast.OpDef], consts: Mapping[str, float],
             *, check: bool = False, custom: bool = True) -> CompiledOp:
    """Lower, differentiate, simplify and plan every method of ``op``.

    ``custom=False`` ignores grad blocks: the methods then compute the true
    derivative (used to audit custom gradients).
    """
    compiled = CompiledOp(op, param_infos(op, consts), upstream_names(op), tangent_names(op))
    primal = passes.stabilize(lower_op(op, ops, consts, custom=custom))
    compiled.primal = primal
    compiled.draws = any(n.op == "seed" for n in primal)
    taken = [p for p in op.params if p.name == "seed" and p.default is not None]
    if compiled.draws and taken:
        raise NameResolutionError(
            "a parameter with a default cannot be named 'seed' in an op that draws random "
            "numbers", taken[0].span, "E207",
            ["parameters with a default are keyword-only, and 'seed=' is the keyword of "
             "every method of an op that draws: rename the parameter"])
    compiled.methods["forward"] = _method("forward", primal.copy(), check)
    expanded = passes.expand_decompositions(primal)    # differentiated as decomposed
    joint = _differentiate(expanded, compiled)
    compiled.diagnostics = list(joint.diagnostics)
    grads_only = joint.copy()
    n_out = len(primal.outputs)
    grads_only.outputs = joint.outputs[n_out:]
    grads_only.output_shapes = joint.output_shapes[n_out:]
    grads_only.output_names = joint.output_names[n_out:]
    compiled.methods["vjp"] = _method("vjp", grads_only, check)
    compiled.methods["fwd_bwd"] = _method("fwd_bwd", joint, check)
    diff = [p for p, info in zip(primal.params, compiled.params) if info.differentiable]
    try:
        tangent = linearize(expanded, diff, compiled.tangents)
    except GradientError as exc:      # a grad block that cannot be transposed (E405)
        compiled.missing["jvp"] = exc.render()
        compiled.diagnostics.append(GradcWarning(
            exc.message + "; its jvp method raises this error", exc.span, "W405", exc.notes,
            intended=in_surrogate_rule(exc.span, ops)))
    else:
        compiled.methods["jvp"] = _method("jvp", tangent, check)
    return compiled


def in_surrogate_rule(span, ops: Mapping[str, ast.OpDef]) -> bool:
    """Whether ``span`` lies in a grad block marked ``surrogate`` (an intended rule)."""
    for op in ops.values():
        g = op.grad
        if g is not None and g.surrogate and span is not None and g.body and \
                span.file == g.span.file and g.span.line <= span.line <= g.body[-1].span.line:
            return True
    return False


def _differentiate(primal: Graph, compiled: CompiledOp) -> Graph:
    """The primal graph plus cotangent params and gradient outputs."""
    g = primal.copy()
    b = Builder(g)
    ups = [b.param(name, g.node(o).shape, FLOAT, g.node(o).span)
           for name, o in zip(compiled.upstreams, g.outputs)]
    g.params = g.params + ups
    diff = [p for p, info in zip(g.params, compiled.params) if info.differentiable]
    grads = vjp(g, g.outputs, ups, diff)
    for p, gr in zip(diff, grads):
        pnode = g.node(p)
        if gr is None:
            gr = zeros_like(b, p, pnode.span)
        elif g.node(gr).shape != pnode.shape:
            gr = b.apply("sum_to", (gr, p), span=pnode.span)
        g.set_output(gr, pnode.shape, name=f"grad_{pnode.attr('name')}")
    return g


def linearize(graph: Graph, wrt: list[int], names: tuple[str, ...]) -> Graph:
    """``graph`` plus one tangent param per ``wrt`` node (named ``names``, of its
    shape class, float) and one tangent output per output, after the outputs:
    ``graph.jvp(*params, *tangents)``.  A zero tangent is a zero array of its
    output's shape and dtype.  Raises GradientError (E405) for a grad block
    that cannot be transposed (:mod:`gradc.autodiff.forward`)."""
    g = graph.copy()
    b = Builder(g)
    ts = [b.param(name, g.node(p).shape, FLOAT, g.node(p).span) for name, p in zip(names, wrt)]
    g.params = g.params + ts
    outs, shapes, out_names = list(g.outputs), list(g.output_shapes), list(g.output_names)
    for o, shape, name, t in zip(outs, shapes, out_names, jvp(g, dict(zip(wrt, ts)), outs)):
        onode = g.node(o)
        if t is None:
            t = zeros_like(b, o, onode.span)
        elif g.node(t).shape != shape:
            t = b.apply("sum_to", (t, o), span=onode.span)
        g.set_output(t, shape, name=f"tangent_{name}")
    return g


def _method(name: str, graph: Graph, check: bool) -> Method:
    regions = tuple(graph.regions)
    graph = passes.run(graph, check=check)
    return Method(name, graph, plan_kernels(graph, True), plan_kernels(graph, False), regions)


def row_variants(cop: CompiledOp, ops: Mapping[str, ast.OpDef], consts: Mapping[str, float],
                 check: bool = False) -> tuple[RowVariant, ...]:
    """The row plans of ``cop`` (:mod:`gradc.passes.row_plan`): for each candidate way of
    declaring its parameters of undeclared shape (:func:`row_plan.candidate_forms`), the op
    compiled with those declarations, kept when it compiles and a CPU plan of it loops
    over rows."""
    if not row_plan.wanted(cop):
        return ()
    out = []
    for forms in row_plan.candidate_forms(cop):
        try:
            spec = build_op(row_plan.declared_op(cop.op, forms), ops, consts, check=check)
        except (GradcError, GradcWarning):
            continue
        if row_plan.worth_it(cop, spec):
            out.append(RowVariant(forms, spec, {name: row_plan.rank_rule(m.graph)
                                                     for name, m in cop.methods.items()}))
    return tuple(out)


def build_program(program, *, check: bool = False, fuse: bool = True
                  ) -> dict[str, CompiledOp | str]:
    """Every op of the main file, compiled; raises every user error together.

    An op that uses a construct this version cannot compile yet
    (:class:`NotSupportedError`) maps to the message its methods will raise.
    """
    out: dict[str, CompiledOp | str] = {}
    errors: list[GradcError] = []
    for name in program.main_ops:
        try:
            cop = build_op(program.ops[name], program.ops, program.consts, check=check)
        except NotSupportedError as exc:
            out[name] = exc.render()
            continue
        except GradcError as exc:
            errors.append(exc)
            continue
        if not fuse:
            for m in cop.methods.values():
                m.fused = m.unfused
        else:
            cop.rows = row_variants(cop, program.ops, program.consts, check)
        cop.diagnostics.extend(n for n in getattr(program, "diagnostics", ())
                               if n.span == program.ops[name].span)     # N203
        out[name] = cop
    raise_all(errors)
    return out


def compiler_warnings(compiled) -> list:
    """The compiler warnings (:class:`GradcWarning` of severity warning, not notes) of
    the compiled ops ``compiled`` (or strings, which have none), each once, in order."""
    found = {}
    for cop in compiled:
        for w in getattr(cop, "diagnostics", ()):
            if w.severity == "warning":
                found.setdefault(w.key(), w)
    return list(found.values())


def issue_warnings(compiled: Mapping[str, CompiledOp | str], stacklevel: int = 3) -> None:
    """Issue each op's compiler warnings once (:func:`compiler_warnings`), attributed to
    the caller of the caller of this function (``stacklevel`` 3), or further out."""
    for w in compiler_warnings(compiled.values()):
        warnings.warn(w, stacklevel=stacklevel)
