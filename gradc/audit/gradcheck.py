"""Gradient checking: derived VJPs against float64 central finite differences.

For an op, random float64 inputs are drawn (annotated dims get small sizes,
generic parameters a short vector), one random direction ``u`` per
differentiable input and one random cotangent ``v`` per output, and the
identity ``<v, (f(x + eps u) - f(x - eps u)) / 2 eps> = <vjp(v), u>`` is
checked (JAX's ``check_vjp``).  Everything runs in the IR interpreter, so
this checks the compiler's derivatives independently of code generation.

For an op whose gradient involves a custom rule, the derivative gradc
derives with every ``grad`` block ignored is checked this way, and the
custom rule is compared with it: the report says whether the rule equals the
true derivative, and if not, how far it is (information, not a failure).

Forward mode is checked against reverse mode by the adjoint identity
``<J t, u> = <t, J^T u>`` (:func:`check_jvp`; with the op's custom rules, so a
transposed grad block is checked against the block itself), and second order
by forward mode over the reverse-mode graph: the tangent of ``vjp(x, u)``
along ``t`` against central differences of ``vjp`` (:func:`check_second_order`,
on the true derivative).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from gradc.ir.interpret import interpret
from gradc.pipeline import CompiledOp, build_op, compiler_warnings, linearize

EPS = 1e-6
TOL = 1e-5            # first order: central differences of float64 values
TOL_SECOND = 1e-4     # second order: differences of a derivative (its rounding is larger)
TOL_ADJOINT = 1e-9    # <J t, u> = <t, J^T u> holds to rounding: no differences taken


@dataclass
class CheckResult:
    op: str
    ok: bool                   # the derived gradient matches finite differences
    error: float               # relative error of the directional derivative
    custom: bool               # the op's gradient uses a custom rule
    custom_rel_diff: float = 0.0   # |custom - true| / |true| over random cotangents
    note: str = ""
    jvp_error: float | None = None      # adjoint identity, relative; None: no jvp
    jvp_missing: str = ""               # why the op has no jvp (E405's first line)
    second_error: float = 0.0           # d/dt vjp by forward mode vs differences
    stopped: tuple[str, ...] = ()       # outputs written as stop_gradient(...), not checked
    audit: object = None                # gradc.audit.custom_rules.AuditResult of the op's own grad block
    warnings: tuple = ()                # the compiler's warnings on the op (GradcWarning)

    @property
    def passed(self) -> bool:
        """Every check passed: first order, forward vs reverse, second order, and the
        audit: a custom rule that is not the derivative must be marked ``surrogate``
        (as ``torch.autograd.gradcheck`` fails a wrong custom backward)."""
        return self.ok and (self.jvp_error is None or self.jvp_error < TOL_ADJOINT) and \
            self.second_error < TOL_SECOND and not self.unmarked_surrogate

    @property
    def unmarked_surrogate(self) -> bool:
        """The op's own grad block is not the derivative and not marked ``surrogate``
        (the audit's warning W410)."""
        return self.audit is not None and getattr(self.audit, "warning", None) is not None

    def line(self) -> str:
        mark = "ok  " if self.passed else "FAIL"
        what = "true derivative (grad blocks ignored)" if self.custom else "derivative"
        audit = "".join(f"\n       {line}" for line in self.audit.lines()) if self.audit else ""
        if self.error != self.error and self.note:      # NaN: nothing was computed; why
            return f"{mark} {self.op}: not checked: {self.note}" + "".join(
                f"\n{line}" for line in audit.split("\n")[1:] if self.note not in line)
        text = f"{mark} {self.op}: {what} vs finite differences, rel. error {self.error:.1e}"
        if self.ok and self.unmarked_surrogate:     # the figures pass: say what failed
            text = (f"{mark} {self.op}: its custom gradient is not the derivative and not "
                    f"marked 'surrogate' (the audit below, W410); {what} vs finite "
                    f"differences, rel. error {self.error:.1e}")
        if self.custom and self.audit is None:
            if self.custom_rel_diff == float("inf"):
                text += "; the true derivative is 0 where the custom gradient is not"
            elif self.custom_rel_diff < 1e-6:
                text += "; custom gradient equals the true derivative"
            else:
                text += (f"; custom gradient differs from the true derivative "
                         f"(relative difference {self.custom_rel_diff:.3g})")
        text += f" [{self.note}]" if self.note else ""
        if self.stopped:
            text += (f" (not differentiated, left out: {', '.join(self.stopped)}, written "
                     f"as stop_gradient)")
        if self.error != self.error:           # NaN: nothing was computed
            return text + audit
        if self.jvp_error is not None:
            jvp = f"jvp vs vjp (adjoint identity) rel. error {self.jvp_error:.1e}"
        else:
            jvp = f"no jvp: {self.jvp_missing}"
        return (text + f"\n       {jvp}; second order (jvp of vjp vs finite differences "
                f"of vjp) rel. error {self.second_error:.1e}" + audit)


# Shapes tried, in order, for parameters without a declared shape: the first at
# which the forward pass (and a custom rule's VJP) runs.  Each entry gives the
# shapes of those parameters in order, the last repeated: all a vector, a matrix
# (reductions over axis 1), a scalar next to shaped parameters, then a matrix with
# vectors after it (a norm's ``x`` with its weights ``w``, ``b``; logits with a label
# per row), then 3-D.
GENERIC_SHAPES = (((5,),), ((4, 5),), ((),), ((4, 5), (5,)), ((4, 5), (4,)), ((3, 4, 5),),
                  ((3, 4, 5), (5,)))
# The same for ops that reduce or otherwise work along an axis (an ``axis`` attribute in
# the op or its custom rule): matrices first, of unequal dims, so that a rule summing
# along the wrong axis or dropping a kept dim cannot pass on a vector, where axis 0 is
# axis -1 and a row's cotangent is a scalar.
AXIS_SHAPES = (((4, 5),), ((4, 5), (5,)), ((4, 5), (4,)), ((5,),), ((),), ((3, 4, 5),),
               ((3, 4, 5), (5,)))
# Sizes tried for named dims where 2, 3, 4, ... in order of appearance do not fit.
DIM_SIZES = (2, 4, 3, 6)


def generic_shapes(generic) -> tuple[tuple[int, ...], ...]:
    """``generic`` (one shape, or one per parameter without a declared shape) as the
    shapes of those parameters in order, the last repeated."""
    return generic if generic and isinstance(generic[0], tuple) else (tuple(generic),)


def draw_mask(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A random bool array of ``shape`` holding both values where it has two elements or
    more (one element flipped where the draw gave one value only): a check of
    ``where(mask, f(x), 0)`` never compares zeros alone.  ``gradc testgen``'s generated
    files draw their masks by the same rule."""
    mask = rng.random(shape) < 0.5
    if mask.size >= 2 and (mask.all() or not mask.any()):
        mask.flat[rng.integers(mask.size)] ^= True
    return mask


def sample_inputs(cop: CompiledOp, rng: np.random.Generator, positive: bool = False,
                  generic: tuple = ((5,),), first_dim: int = 2,
                  ints: tuple[int, int] = (-3, 4), dims: dict[str, int] | None = None) -> list:
    """Random float64 inputs for every parameter (defaults for those with one);
    parameters without a declared shape get the shapes ``generic``
    (:func:`generic_shapes`), named dims the sizes ``dims`` gives, else ``first_dim``,
    ``first_dim + 1``, ... in order of appearance; integer parameters values in
    ``range(*ints)``."""
    dims = dict(dims or {})
    undeclared = iter(generic_shapes(generic))
    last: tuple[int, ...] = ()
    out = []
    for p in cop.params:
        if p.has_default:
            out.append(np.asarray(p.default, dtype=np.float64 if p.dtype is None
                                  or p.dtype.startswith("f") else None))
            continue
        if p.shape is None:
            shape = last = next(undeclared, last)
        else:
            shape = tuple(d if isinstance(d, int) else dims.setdefault(d, first_dim + len(dims))
                          for d in p.shape)
        if p.dtype in ("i32", "i64"):
            out.append(rng.integers(*ints, size=shape))
        elif p.dtype == "bool":
            out.append(draw_mask(rng, shape))
        elif positive:
            out.append(rng.uniform(0.5, 2.0, size=shape))
        else:
            out.append(rng.standard_normal(shape))
    return out


def fitting_inputs(cop: CompiledOp, rng: np.random.Generator,
                   custom: CompiledOp | None = None):
    """``(xs, ys, sampling)``: :func:`sample_inputs` at the first of ``GENERIC_SHAPES`` for
    parameters without a declared shape at which the forward pass runs, and its
    outputs ``ys``; None when none fits (:class:`CustomRuleError` where the forward pass
    runs at some but the custom VJP at none, with the rule's error).  Integer parameters
    are tried in [-3, 3] (all of it: a range fits only if the forward pass runs at both
    its ends too), then as indices, from [0, 1] (valid for any dim of 2 or more:
    ``one_hot``, gathers) to the widest ``[0, k)`` that fits, ``k`` up to the inputs'
    largest dim (every class of a cross-entropy's labels, not only the first two).
    ``custom``: the op with its custom rules, whose VJP must run too (a layer norm's
    ``db = sum(dy, axis=0)`` is a gradient of ``b``'s shape only for a matrix ``x``).
    ``sampling``: the keywords of :func:`sample_inputs` that fit (``generic``, ``ints``,
    ``dims``: other sizes of the named dims, where 2, 3, 4, ... in order do not fit),
    for more points of the same kind."""
    names = list(dict.fromkeys(d for p in cop.params for d in p.shape or ()
                               if isinstance(d, str)))
    # named dims 2, 3, 4, ... in order of appearance, then other sizes (rope's d = 2 h)
    sizes = [{}, *(dict(zip(names, v)) for v in itertools.islice(
        itertools.product(DIM_SIZES, repeat=len(names)), 1, 64))]
    failed = []                     # (rank, shapes, error): the forward ran, the rule did not
    for dims, generic, ints in itertools.product(sizes, shapes_to_try(cop, custom),
                                                 ((-3, 4), (0, 2))):
        xs = sample_inputs(cop, rng, generic=generic, ints=ints, dims=dims)
        ys = forward_if_fits(cop, xs, ints, custom, failed)
        if ys is not None and ints[0] == 0:             # indices: as many as fit
            largest = max((max(np.shape(x), default=0) for x in xs), default=0)
            for hi in range(ints[1] + 1, largest + 1):
                more = sample_inputs(cop, rng, generic=generic, ints=(0, hi), dims=dims)
                got = forward_if_fits(cop, more, (0, hi), custom)
                if got is None:
                    break
                xs, ys, ints = more, got, (0, hi)
        if ys is not None:
            rank = max((np.ndim(x) for x in xs), default=0)
            worse = [f for f in failed if f[0] > rank]
            if worse:
                raise _rule_fails(worse[0])
            return xs, ys, {"generic": generic, "ints": ints, "dims": dims}
    if failed:          # the rule's own error (a gradient's shape), not "declare shapes"
        raise _rule_fails(failed[0])
    return None


class CustomRuleError(ValueError):
    """A custom rule that fails at inputs of a higher rank than the ones it runs at,
    or at every input it was tried at, where the forward pass runs at both
    (:func:`fitting_inputs`)."""


def _rule_fails(failure: tuple) -> CustomRuleError:
    """The error for ``(rank, shapes, error)``, a custom VJP failing where the forward runs."""
    _, shapes, exc = failure
    return CustomRuleError(f"the custom rule fails at {shapes}, where the forward pass "
                           f"runs: {exc}")


def shapes_to_try(cop: CompiledOp, custom: CompiledOp | None = None) -> tuple:
    """``AXIS_SHAPES`` for an op with an ``axis`` (in its forward pass or in the custom
    rules of ``custom``), else ``GENERIC_SHAPES``."""
    graphs = [cop.methods["forward"].graph]
    if custom is not None and custom.primal.regions:
        graphs.append(custom.methods["vjp"].graph)
    along = any(node.attr("axis") is not None for g in graphs for node in g)
    return AXIS_SHAPES if along else GENERIC_SHAPES


def forward_if_fits(cop: CompiledOp, xs: list, ints: tuple[int, int],
                    custom: CompiledOp | None = None, failed: list | None = None) -> list | None:
    """The outputs of the forward pass at ``xs``, or None where the inputs do not fit
    the op (a ValueError or IndexError): its forward pass, and the VJP of ``custom``
    (the op with its custom rules) where it has some, at ``xs`` and with every integer
    parameter at each end of ``range(*ints)`` (labels a gather takes from the end may
    be refused by a rule's ``one_hot``), each with every bool parameter all true and all
    false.  ``failed`` gets ``(rank, shapes, error)``
    where the forward pass ran and the custom VJP did not."""
    fwd = cop.methods["forward"].graph
    # the integers at each end, with every bool parameter all true and all false (a
    # mask decides which labels reach a one_hot: where(mask, labels, 0))
    ends = [[np.full_like(x, end) if p.dtype in ("i32", "i64") else
             np.full_like(x, fill) if p.dtype == "bool" else x
             for p, x in zip(cop.params, xs)]
            for end in (ints[0], ints[1] - 1) for fill in (True, False)]
    try:
        with np.errstate(all="ignore"):
            ys = interpret(fwd, xs)
            for at in ends:
                interpret(fwd, at)
    except (ValueError, IndexError):      # shapes that do not fit the op
        return None
    if custom is not None and custom.primal.regions:
        try:
            with np.errstate(all="ignore"):
                for at in [xs, *ends]:
                    interpret(custom.methods["vjp"].graph,
                              at + [np.ones(np.shape(y)) for y in ys])
        except (ValueError, IndexError) as exc:
            if failed is not None:
                shapes = ", ".join(f"{p.name} {np.shape(x)}" for p, x in zip(cop.params, xs)
                                   if not p.has_default)
                failed.append((max((np.ndim(x) for x in xs), default=0), shapes, exc))
            return None
    return ys


def _stop_gradient_note(true: CompiledOp) -> str:
    """Why a derivative may differ from finite differences by design: the forward
    pass writes ``stop_gradient`` (a straight-through estimator's idiom), which makes
    the gradient a surrogate that finite differences cannot check."""
    written = [n.span for n in true.primal if n.op == "stop_gradient" and n.span is not None
               and n.span.file == true.op.span.file]
    # a call's span is its function's name: the user's own stop_gradient, not a builtin's
    # (softmax's shift by its maximum) that carries the span of the builtin's call
    where = next((sp for sp in written if sp.end_line == sp.line
                  and sp.end_column is not None
                  and sp.end_column - sp.column == len("stop_gradient")), None)
    if where is None:
        return ""
    return (f"the forward uses stop_gradient (line {where.line}, column {where.column}): "
            "a gradient that is not the derivative by design is a surrogate; write it "
            "as a grad block marked surrogate to have it audited instead")


def stopped_outputs(true: CompiledOp) -> list[int]:
    """The outputs whose value is ``stop_gradient(...)`` as a whole (a batch norm's running
    statistics): not differentiable by declaration, as PyTorch's
    ``ctx.mark_non_differentiable``; their derivative is zero where finite differences
    see the value move, so the check gives them a zero cotangent."""
    primal = true.primal
    return [i for i, o in enumerate(primal.outputs) if primal.node(o).op == "stop_gradient"]


def _vjp_dot(cop: CompiledOp, xs: list, vs: list, us: list) -> float:
    grads = interpret(cop.methods["vjp"].graph, xs + vs)
    return float(sum(np.vdot(g, u) for g, u in zip(grads, us)))


def custom_difference(cop: CompiledOp, true: CompiledOp, xs: list, vs: list) -> float:
    """``|custom - true| / |true|`` of the VJPs at ``xs`` for the cotangents ``vs``
    (all gradients together, 2-norm); inf where the true derivative is 0 and the
    custom gradient is not."""
    g_custom = interpret(cop.methods["vjp"].graph, xs + vs)
    g_true = interpret(true.methods["vjp"].graph, xs + vs)
    num = sum(float(np.sum((a - b) ** 2)) for a, b in zip(g_custom, g_true)) ** 0.5
    den = sum(float(np.sum(b ** 2)) for b in g_true) ** 0.5
    return num / den if den > 1e-12 else (0.0 if num < 1e-12 else float("inf"))


def check_op(op, ops, consts, *, seed: int = 0) -> CheckResult:
    """Check one op (an ``ast.OpDef`` of a checked program), with the warnings its
    compilation gives (W301, W401, ...: what ``gradc compile`` shows), but W405 (no
    forward mode), which the result reports as ``jvp_missing``."""
    cop = build_op(op, ops, consts)
    result = _check_op(op, cop, build_op(op, ops, consts, custom=False), seed)
    result.warnings = tuple(w for w in compiler_warnings([cop]) if w.code != "W405")
    return result


def _check_op(op, cop: CompiledOp, true: CompiledOp, seed: int) -> CheckResult:
    rng = np.random.default_rng(seed)
    custom = bool(cop.primal.regions)
    try:
        fit = fitting_inputs(true, rng, cop)
    except CustomRuleError as exc:
        return CheckResult(op.name, False, float("nan"), custom, note=str(exc))
    if fit is None:
        tried = ", ".join(" then ".join(map(str, g)) for g in shapes_to_try(true, cop))
        return CheckResult(op.name, False, float("nan"), custom,
                           note=f"no input shapes tried fit the op (parameters without a "
                                f"declared shape were tried as {tried}): declare their shapes")
    xs, ys, sampling = fit
    if not all(np.all(np.isfinite(y)) for y in ys):
        xs = sample_inputs(true, rng, positive=True, **sampling)
        ys = interpret(true.methods["forward"].graph, xs)
    diff = [i for i, p in enumerate(true.params) if p.differentiable]
    us = [rng.standard_normal(np.shape(xs[i])) for i in diff]
    vs = [rng.standard_normal(np.shape(y)) for y in ys]
    stopped = stopped_outputs(true)
    for i in stopped:
        vs[i] = np.zeros(np.shape(ys[i]))

    def f(sign: float) -> list:
        moved = list(xs)
        for i, u in zip(diff, us):
            moved[i] = xs[i] + sign * EPS * u
        return interpret(true.methods["forward"].graph, moved)

    fd = sum(float(np.vdot(v, (a - b) / (2 * EPS))) for v, a, b in zip(vs, f(1.0), f(-1.0)))
    ad = _vjp_dot(true, xs, vs, us)
    err = abs(fd - ad) / max(abs(fd), abs(ad), 1e-8)
    result = CheckResult(op.name, bool(err < TOL), err, custom,
                         stopped=tuple(true.primal.output_names[i] for i in stopped))
    if custom:
        result.custom_rel_diff = custom_difference(cop, true, xs, vs)
    if not np.isfinite(fd):
        result.ok, result.note = False, "non-finite values at the sampled point"
    elif not result.ok:
        result.note = _stop_gradient_note(true)
    if "jvp" in cop.methods:
        result.jvp_error = check_jvp(cop, xs, rng)
    else:
        result.jvp_missing = cop.missing["jvp"].splitlines()[0].replace("error[E405]: ", "")
    result.second_error = check_second_order(true, xs, rng)
    return result


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-8)


def check_jvp(cop: CompiledOp, xs: list, rng: np.random.Generator) -> float:
    """The relative error of ``<J t, u> = <t, J^T u>`` at ``xs`` (float64, one random
    tangent ``t`` per differentiable parameter and cotangent ``u`` per output,
    both of their primal's shape); the primal outputs of ``jvp`` must equal the
    forward pass's (else the error is inf).  Needs ``cop.methods["jvp"]``."""
    diff = [i for i, p in enumerate(cop.params) if p.differentiable]
    ts = [rng.standard_normal(np.shape(xs[i])) for i in diff]
    ys = interpret(cop.methods["forward"].graph, xs)
    res = interpret(cop.methods["jvp"].graph, xs + ts)
    outs, tangents = res[:len(ys)], res[len(ys):]
    if any(np.shape(a) != np.shape(b) or not np.allclose(a, b, rtol=1e-12, atol=0,
                                                         equal_nan=True)
           for a, b in zip(outs, ys)):
        return float("inf")
    us = [rng.standard_normal(np.shape(y)) for y in ys]
    lhs = sum(float(np.vdot(jt, u)) for jt, u in zip(tangents, us))
    rhs = _vjp_dot(cop, xs, us, ts)
    return _rel(lhs, rhs)


def check_second_order(cop: CompiledOp, xs: list, rng: np.random.Generator) -> float:
    """The relative error of forward mode over the VJP graph: the tangent of
    ``vjp(x, u)`` along ``t`` (a Hessian-vector product for a scalar output)
    against central differences of ``vjp`` along ``t``, projected on a random
    ``w`` (float64).  Use the true derivative (``custom=False``): a custom rule
    need not be the derivative of anything."""
    diff = [i for i, p in enumerate(cop.params) if p.differentiable]
    if not diff:
        return 0.0
    graph = cop.methods["vjp"].graph
    ys = interpret(cop.methods["forward"].graph, xs)
    us = [rng.standard_normal(np.shape(y)) for y in ys]
    ts = [rng.standard_normal(np.shape(xs[i])) for i in diff]
    second = linearize(graph, [graph.params[i] for i in diff],
                       tuple(f"_t{i}" for i in diff))
    res = interpret(second, xs + us + ts)
    n = len(graph.outputs)
    grads, ad = res[:n], res[n:]

    def moved(sign: float) -> list:
        x = list(xs)
        for i, t in zip(diff, ts):
            x[i] = xs[i] + sign * EPS * t
        return interpret(graph, x + us)

    fd = [(a - b) / (2 * EPS) for a, b in zip(moved(1.0), moved(-1.0))]
    ws = [rng.standard_normal(np.shape(g)) for g in grads]
    return _rel(sum(float(np.vdot(w, a)) for w, a in zip(ws, ad)),
                sum(float(np.vdot(w, f)) for w, f in zip(ws, fd)))


def check_program(program, *, seed: int = 0) -> list[CheckResult]:
    """Check every op of the main file of a checked program."""
    return [check_op(program.ops[n], program.ops, program.consts, seed=seed)
            for n in program.main_ops]
