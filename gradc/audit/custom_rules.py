"""The custom-gradient audit: each op's ``grad`` block against the true derivative.

For every op of a program with a grad block of its own, gradc also derives the
gradient with every grad block ignored (``build_op(..., custom=False)``) and
compares the two VJPs, one gradient (block output) at a time:

1. **Symbolically**, after simplification: both optimised graphs are brought to
   a canonical form (products flattened with their constant factors collected,
   sums as sorted terms, commutative operands sorted, reverse mode's NaN-only
   zero-cotangent mask dropped), so ``rule = c * derivative`` for a constant
   ``c`` (``c = 1``: equal) and a derivative that is identically 0 are seen
   exactly.
2. **Numerically**, in the IR interpreter (float64), at random points and at
   edge points (every differentiable input filled with 0, 1, -1, 10 or -10, and
   a mix of those and 1e-3), at a second input shape where the op's shapes are
   not fixed (a factor that differs between the two is not a constant: a forgotten
   ``1/n``) and at other values of its nograd float parameters with a default
   (where the rule differs is said: ``exact at d = 1 (the default), not at d = 2``),
   each at the unit cotangent (all ones) and a random one.  At a kink of the
   derivative (it jumps between ``x - h`` and ``x + h``) any value between the
   one-sided derivatives counts as equal: the value there is a convention
   (``max(x, 0)`` has 0.5 at 0, ``dy * (x > 0)`` 0).

Each gradient is then ``exact``, ``scaled`` (a constant factor, everywhere, or
only at the unit cotangent when the rule ignores the cotangent; or a factor per
input shape or parameter setting, when it depends on them), ``clipped``
(``clip(derivative, lo, hi)``, or the derivative at a clipped cotangent, with a
clip of constant bounds in the rule) or ``surrogate`` (anything else, with
where and by how much).  An op not marked ``surrogate`` whose rule is not exact
gets warning W410 at the assignment of the gradient that differs (at its grad block
where several do; docs/audit.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from gradc.audit.canonical import clip_bounds, proportion, reads_params
from gradc.audit.gradcheck import (CustomRuleError, fitting_inputs, forward_if_fits,
                                   generic_shapes, sample_inputs)
from gradc.errors import GradcWarning, NotSupportedError, Span
from gradc.ir.interpret import interpret
from gradc.pipeline import CompiledOp, build_op

N_RANDOM = 12                      # random points (each at two cotangents)
N_OTHER_SHAPE = 4                  # random points at a second shape (generic, named dims)
N_PER_VALUE = 3                    # random points (and an edge mix) per other setting of
                                   # the nograd float parameters with a default
EDGE_FILLS = (0.0, 1.0, -1.0, 10.0, -10.0)
EDGE_MIX = np.array([-10.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 10.0])
RTOL, ATOL = 1e-7, 1e-11           # equal: |a - b| <= RTOL max(|a|, |b|) + ATOL scale
KINK_H, KINK_JUMP = 1e-7, 1e-3     # a jump of the derivative over [x - h, x + h]
KINDS = ("exact", "scaled", "clipped", "surrogate", "unaudited")   # from best to worst


@dataclass
class GradientAudit:
    """The verdict on one gradient of a grad block (``name``, for parameter ``param``)."""

    name: str
    param: str
    kind: str                          # one of KINDS
    summary: str                       # one line: how it differs (or equals)
    symbolic: bool = False             # decided symbolically (and confirmed numerically)
    factor: float | None = None        # scaled: rule = factor * derivative
    ignores_cotangent: bool = False    # the rule does not depend on the cotangent
    bounds: tuple[float, float] | None = None   # clipped: the clip's bounds
    clips: str | None = None           # clipped: "gradient" or "cotangent"
    factors: list | None = None        # scaled by a factor that is not one constant:
                                       # (where, factor) per input shape / parameter value
    max_rel_diff: float | None = None  # surrogate: max |rule - d| / |d| where d != 0
    max_abs_diff: float | None = None  # surrogate: max |rule - d|
    differs_fraction: float | None = None   # of the compared elements
    sample: str | None = None          # surrogate: where the largest difference is


@dataclass
class AuditResult:
    """The audit of one op's grad block; ``to_dict()`` for JSON."""

    op: str
    span: Span                         # the grad block ('grad' keyword)
    marked_surrogate: bool
    upstreams: tuple[str, ...] = ()    # the grad block's cotangent names
    gradients: list[GradientAudit] = field(default_factory=list)
    points: int = 0                    # sample points compared (random and edge)
    edge_points: int = 0
    elements: int = 0                  # gradient elements compared in all
    shapes: tuple[str, ...] = ()       # the input shapes sampled (of the differentiable ones)
    values: dict = field(default_factory=dict)  # nograd float parameter with a default:
                                                # its values sampled, the default first
    note: str = ""                     # why the op was not audited
    at: Span | None = None             # the assignment of the one gradient not exact

    @property
    def kind(self) -> str:
        """The worst kind of the gradients (``exact`` only if every one is)."""
        if not self.gradients:
            return "unaudited"
        return max((g.kind for g in self.gradients), key=KINDS.index)

    @property
    def summary(self) -> str:
        """``<kind>: <how>``; per gradient for several."""
        if not self.gradients:
            return f"unaudited: {self.note}"
        if len(self.gradients) == 1:
            return f"{self.kind}: {self.gradients[0].summary}"
        return f"{self.kind}: " + "; ".join(
            f"{g.name} {g.kind}" + (f" ({g.summary})" if g.kind != "exact" else "")
            for g in self.gradients)

    def how(self) -> str:
        where = f"; shapes {' and '.join(self.shapes)}" if len(self.shapes) > 1 else ""
        for name, vs in self.values.items():
            if len(vs) > 1:
                where += f"; {name} = {vs[0]:g} (the default), " + ", ".join(
                    f"{v:g}" for v in vs[1:])
        num = (f"at {self.points} points ({self.edge_points} of them edge points{where}) "
               f"x 2 cotangents, {self.elements} elements")
        if self.gradients and all(g.symbolic for g in self.gradients):
            return f"symbolically after simplification; confirmed numerically {num}"
        return f"numerically {num}"

    def lines(self, head: str = "audit of the custom rule: ") -> list[str]:
        """``<head><summary>`` and how it was decided (for ``gradc check``, ``explain``)."""
        mark = ""
        if self.marked_surrogate:
            mark = (" (marked surrogate, though it equals the derivative)"
                    if self.kind == "exact" else " (marked surrogate: intended)")
        out = [f"{head}{self.summary}{mark}"]
        if self.gradients:
            out.append(f"  decided {self.how()}")
        return out

    @property
    def warning(self) -> GradcWarning | None:
        """W410 for a rule that is not exact and not marked ``surrogate``."""
        if self.marked_surrogate or self.kind in ("exact", "unaudited"):
            return None
        outs = ", ".join(g.name for g in self.gradients)
        outs = outs if len(self.gradients) == 1 else f"({outs})"
        kind = "a surrogate" if self.kind == "surrogate" else self.kind
        detail = self.summary.split(": ", 1)[1]
        others = "; the other gradients are exact" if len(self.gradients) > 1 else ""
        where = [] if self.at is None else [
            f"the grad block begins at line {self.span.line}{others}"]
        return GradcWarning(
            f"the custom gradient of '{self.op}' is {kind}, not exact: {detail}",
            self.at or self.span, "W410",
            [*where, f"decided {self.how()} (docs/audit.md)",
             "if this is intended (a straight-through estimator, a scaled or clipped "
             f"gradient), write 'grad({', '.join(self.upstreams)}) -> {outs} surrogate {{' "
             "to say so"])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["span"] = str(self.span)
        d["at"] = None if self.at is None else str(self.at)
        d["kind"] = self.kind
        d["summary"] = self.summary
        return d


def audit_program(program, *, seed: int = 0) -> list[AuditResult]:
    """Audit every op of the main file of a checked program that has a grad block,
    then every imported op with one whose rule a main op's gradient uses (a main op's
    forward body calls it, at any depth: :func:`rule_users`)."""
    names = [n for n in program.main_ops if program.ops[n].grad is not None]
    names += [n for n, op in program.ops.items() if n not in program.main_ops
              and op.grad is not None and rule_users(program, n)]
    return [audit_op(program.ops[n], program.ops, program.consts, seed=seed) for n in names]


def rule_users(program, name: str) -> list[str]:
    """The main ops whose forward bodies call op ``name`` (directly or through other
    ops): its grad block is their gradient's there."""
    from gradc.frontend.ast import calls
    return [m for m in program.main_ops if m != name
            and calls(program.ops[m].body, name, program.ops)]


def audit_op(op, ops, consts, *, seed: int = 0) -> AuditResult:
    """Audit one op (an ``ast.OpDef`` with a grad block) of a checked program."""
    block = op.grad
    result = AuditResult(op.name, block.span, block.surrogate, block.upstreams)
    try:
        custom = build_op(op, ops, consts)
        true = build_op(op, ops, consts, custom=False)
    except NotSupportedError as exc:         # as gradc compile: the op is left out
        result.note = exc.message
        return result
    cg, tg = custom.methods["vjp"].graph, true.methods["vjp"].graph
    try:
        samples = _samples(custom, true, np.random.default_rng(seed))
    except CustomRuleError as exc:          # no shape to compare at
        result.note = str(exc)
        return result
    if not samples:
        result.note = "no input shapes tried fit the op, or no finite gradients at them"
        return result
    result.points = len({id(s.xs) for s in samples})
    result.edge_points = len({id(s.xs) for s in samples if s.edge})
    diff = [p.name for p in custom.params if p.differentiable]
    for j, (name, param) in enumerate(zip(block.outputs, diff)):
        c, t = cg.outputs[j], tg.outputs[j]
        sym = proportion(cg, c, tg, t)
        unit = proportion(cg, c, tg, t, unit=frozenset(block.upstreams))
        if unit is not None and reads_params(cg, c, set(block.upstreams)):
            unit = None                   # the rule depends on the cotangent
        result.gradients.append(_classify(j, name, param, block.upstreams, samples, sym, unit,
                                          clip_bounds(cg, c)))
    wrong = [g.name for g in result.gradients if g.kind != "exact"]
    assigned = [a.span for a in block.body if wrong == [a.target]]
    result.at = assigned[0] if assigned else None       # W410 points at it
    result.elements = sum(int(np.size(s.c[j])) for s in samples for j in range(len(diff)))
    result.shapes = tuple(dict.fromkeys(s.shape for s in samples))
    for s in samples:
        for name, v in s.values:
            result.values.setdefault(name, [])
            if v not in result.values[name]:
                result.values[name].append(v)
    return result


# --- numeric: the two VJPs at sample points -----------------------------------------

@dataclass
class _Sample:
    xs: list                   # the primal inputs (shared by the point's cotangents)
    vs: list                   # one cotangent per output
    unit: bool                 # the unit cotangent
    edge: bool
    c: list                    # the rule's gradients
    band: list                 # per gradient: (derivative, at x - h, at x + h)
    true: CompiledOp           # the op without grad blocks (re-run at clipped cotangents)
    diff: tuple[int, ...]      # positions of the differentiable inputs
    shape: str = ""            # the shapes of the differentiable inputs: "(5,)", "x (2, 3), w (3,)"
    values: tuple = ()         # ((name, value), ...) of the nograd float parameters with a default
    default: bool = True       # those are at their defaults


def _shift(xs: list, diff: list[int], h: float) -> list:
    out = list(xs)
    for k, i in enumerate(diff):
        out[i] = xs[i] + h * (1 + 0.5 * k)     # distinct per input: crosses x = y kinks
    return out


def _points(true: CompiledOp, rng: np.random.Generator,
            custom: CompiledOp) -> list[tuple[list, bool]]:
    """``(inputs, edge)`` of every sample point: random and edge points at the first
    shape that fits (as ``gradc check`` chooses it) with parameters at their defaults,
    random points at a second shape where one fits (larger generic shapes and named
    dims), and random points and an edge mix at other values of the nograd float
    parameters with a default (:func:`_other_values`)."""
    fit = fitting_inputs(true, rng, custom)
    if fit is None:
        return []
    sampling = fit[2]
    points = _draw(true, rng, N_RANDOM, (*EDGE_FILLS, None), (), **sampling)
    second = _second_shape(true, custom, rng, sampling, points[0][0])
    if second is not None:
        points += _draw(true, rng, N_OTHER_SHAPE, (), (), **second)
    for values in _other_values(true, rng):
        points += _draw(true, rng, N_PER_VALUE, (None,), values, **sampling)
    return points


def _draw(true: CompiledOp, rng: np.random.Generator, n: int, fills: tuple, values: tuple,
          **shape) -> list[tuple[list, bool]]:
    """``n`` random points (differentiable inputs from N(0, 2^2), or U(0.5, 2) where the
    forward pass is not finite), then one edge point per fill (None: ``EDGE_MIX``),
    with the parameters at positions ``i`` of ``values`` (``(i, value)``) set."""
    diff = [i for i, p in enumerate(true.params) if p.differentiable]
    fwd = true.methods["forward"].graph

    def fresh(**kw) -> list:
        xs = sample_inputs(true, rng, **shape, **kw)
        for i, v in values:
            xs[i] = np.asarray(v, dtype=np.float64)
        return xs

    points = []
    for _ in range(n):
        xs = fresh()
        for i in diff:
            xs[i] = 2 * xs[i]
        if not all(np.all(np.isfinite(y)) for y in interpret(fwd, xs)):
            xs = fresh(positive=True)
        points.append((xs, False))
    base = fresh() if fills else None
    for fill in fills:
        xs = list(base)
        for i in diff:
            size = np.shape(base[i])
            xs[i] = np.full(size, fill) if fill is not None else \
                EDGE_MIX[np.arange(int(np.prod(size))) % len(EDGE_MIX)].reshape(size)
        points.append((xs, True))
    return points


def _second_shape(true: CompiledOp, custom: CompiledOp, rng: np.random.Generator,
                  sampling: dict, first: list) -> dict | None:
    """The keywords of :func:`sample_inputs` for a second set of input shapes at which
    the op runs (generic shapes 2 larger in every axis, named dims 2 larger, or twice
    their sizes where they were chosen to fit: ``rope``'s d = 2 h), from those
    of the first (``sampling``); None when the op's shapes are fixed or no larger one
    fits."""
    generic = sampling["generic"]
    larger = tuple(tuple(d + 2 for d in shape) for shape in generic_shapes(generic))
    for gen, first_dim in ((larger, 4), (generic, 4), (larger, 2)):
        kw = {**sampling, "generic": gen, "first_dim": first_dim,
              "dims": {d: 2 * n for d, n in (sampling.get("dims") or {}).items()}}
        xs = sample_inputs(true, rng, **kw)
        if [np.shape(x) for x in xs] == [np.shape(x) for x in first]:
            continue
        if forward_if_fits(true, xs, sampling["ints"], custom) is None:
            continue
        return kw
    return None


def _defaulted(cop: CompiledOp) -> list[int]:
    """Positions of the nograd float parameters with a scalar default."""
    return [i for i, p in enumerate(cop.params) if p.has_default and not p.differentiable
            and (p.dtype is None or p.dtype.startswith("f")) and np.ndim(p.default) == 0]


def _other_values(cop: CompiledOp, rng: np.random.Generator) -> list[tuple]:
    """Settings ``((i, value), ...)`` of the parameters of :func:`_defaulted` besides their
    defaults: all at twice the default (1 for a default of 0), then all at a random value
    of the default's sign, 0.25 to 4 times its magnitude (1 for 0), to 3 digits.
    Integer and bool parameters stay at their defaults."""
    idx = _defaulted(cop)
    if not idx:
        return []
    ds = [float(cop.params[i].default) for i in idx]
    twice = [2 * d if d else 1.0 for d in ds]
    other = [float(f"{np.copysign(rng.uniform(0.25, 4.0) * (abs(d) or 1.0), d):.3g}")
             for d in ds]
    return [tuple(zip(idx, twice)), tuple(zip(idx, other))]


def _shape_text(cop: CompiledOp, xs: list, diff: list[int]) -> str:
    """The shapes of the differentiable inputs: one when they share it."""
    shapes = [tuple(np.shape(xs[i])) for i in diff]
    if len(set(shapes)) <= 1:
        return str(shapes[0]) if shapes else "()"
    return ", ".join(f"{cop.params[i].name} {sh}" for i, sh in zip(diff, shapes))


def _samples(custom: CompiledOp, true: CompiledOp, rng: np.random.Generator) -> list[_Sample]:
    cg, tg = custom.methods["vjp"].graph, true.methods["vjp"].graph
    fwd = true.methods["forward"].graph
    diff = [i for i, p in enumerate(true.params) if p.differentiable]
    out = []
    for xs, edge in _points(true, rng, custom):
        ys = interpret(fwd, xs)
        for unit in (True, False):
            vs = [np.ones(np.shape(y)) if unit else rng.normal(0.0, 2.0, np.shape(y))
                  for y in ys]
            c = interpret(cg, xs + vs)
            t, tm, tp = (interpret(tg, x + vs) for x in
                         (xs, _shift(xs, diff, -KINK_H), _shift(xs, diff, KINK_H)))
            if not any(np.any(np.isfinite(a) & np.isfinite(b)) for a, b in zip(c, t)):
                continue                            # outside the op's domain
            values = tuple((true.params[i].name, float(xs[i])) for i in _defaulted(true))
            default = all(v == float(true.params[i].default)
                          for i, (_, v) in zip(_defaulted(true), values))
            out.append(_Sample(xs, vs, unit, edge, c, list(zip(t, tm, tp)), true, tuple(diff),
                               _shape_text(true, xs, diff), values, default))
    return out


def _differs(c, band) -> tuple[np.ndarray, np.ndarray]:
    """(compared, differs): elements where both are finite, and where the rule is not
    the reference (nor, at a kink, between its one-sided values)."""
    c, t, tm, tp = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (c, *band)))
    fin = np.isfinite(c) & np.isfinite(t)
    scale = max(1.0, float(np.max(np.abs(t[fin]), initial=0.0)))
    with np.errstate(invalid="ignore", over="ignore"):
        tol = RTOL * np.maximum(abs(c), abs(t)) + ATOL * scale
        close = np.abs(c - t) <= tol
        jump = np.abs(tp - tm) > KINK_JUMP * (1 + np.abs(tp) + np.abs(tm))
        lo, hi = np.minimum(tm, tp), np.maximum(tm, tp)
        between = jump & (c >= lo - tol) & (c <= hi + tol)
    return fin, fin & ~(close | between)


def _holds(samples, j: int, ref, where=None) -> bool:
    """The rule's gradient ``j`` equals ``ref(sample)`` (a band) at every sample
    (where ``where(sample)`` is true, elementwise, when given)."""
    for s in samples:
        _, bad = _differs(s.c[j], ref(s))
        if where is not None:
            bad = bad & np.broadcast_to(where(s), bad.shape)
        if bad.any():
            return False
    return True


def _factor(samples, j: int) -> float | None:
    """rule / derivative at the element where the derivative is largest."""
    best, r = 0.0, None
    for s in samples:
        c, t = np.broadcast_arrays(s.c[j], s.band[j][0])
        ok = np.isfinite(c) & np.isfinite(t)
        if ok.any():
            k = np.argmax(np.where(ok, np.abs(t), -1.0))
            if abs(t.flat[k]) > best:
                best, r = abs(t.flat[k]), float(c.flat[k] / t.flat[k])
    return r


def _classify(j, name, param, ups, samples, sym, unit, bounds) -> GradientAudit:
    d = f"d/d{param}"
    up = ups[0] if len(ups) == 1 else "the cotangents"
    exact = lambda s: s.band[j]
    ga = lambda kind, summary, **kw: GradientAudit(name, param, kind, summary, **kw)
    if _holds(samples, j, exact):
        return ga("exact", "the rule equals the derivative", symbolic=_agrees(sym, 1.0))
    zero = all(not np.any(np.asarray(b[0])[np.isfinite(b[0])]) for s in samples
               for b in [s.band[j]])
    r = _factor(samples, j)
    if not zero and r and _holds(samples, j, lambda s: tuple(r * b for b in s.band[j])):
        agreed = _agrees(sym, r)
        r = sym[1] if agreed else r
        return ga("scaled", f"differs from {d} by a factor {r:.6g} everywhere",
                  symbolic=agreed, factor=r)
    groups = _groups(samples)
    factors = None if zero else _group_factors(groups, j)
    if factors is not None:
        return ga("scaled", _depends_text(d, factors, groups),
                  factors=[list(wf) for wf in _located(factors, groups)[0]])
    units = [s for s in samples if s.unit]
    ignores = _ignores_cotangent(samples, j)
    ru = _factor(units, j)
    if not zero and ignores and ru and abs(ru - 1) > 1e-9 and \
            _holds(units, j, lambda s: tuple(ru * b for b in s.band[j])):
        agreed = _agrees(unit, ru)
        ru = unit[1] if agreed else ru
        return ga("scaled", f"differs from {d} by a constant factor {ru:.6g} at the unit "
                  f"cotangent {up} = 1, and only there: the rule ignores {up} ({d} scales "
                  f"with {up})",
                  factor=ru, ignores_cotangent=True, symbolic=agreed)
    for lo, hi in bounds:
        clipped = _clipped(samples, j, lo, hi, up)
        if clipped is not None:
            how, region = clipped
            rest = (f"the derivative clipped to [{lo:g}, {hi:g}]" if how == "gradient" else
                    f"the derivative at {up} clipped to [{lo:g}, {hi:g}]")
            return _where_exact(ga("clipped", f"equals the derivative {region}, {rest} "
                                              "elsewhere", bounds=(lo, hi), clips=how),
                                groups, j)
    return _where_exact(_surrogate(samples, j, name, param, ups, up, ga, zero, sym, ignores),
                        groups, j)


# --- where the rule differs: per input shape and value of the defaulted parameters --------

def _groups(samples) -> dict[tuple, list]:
    """The samples by setting: ``(shape, values)``, in the order sampled."""
    out: dict[tuple, list] = {}
    for s in samples:
        out.setdefault((s.shape, s.values), []).append(s)
    return out


def _setting_text(key: tuple, part: str, groups: dict) -> str:
    """Where a setting is, in words: by its shape, its parameter values, or both."""
    shape, values = key
    at_shape = f"shape {shape}" if shape.startswith("(") else shape
    default = groups[key][0].default
    at_values = ", ".join(f"{n} = {v:g}" for n, v in values) + (
        (" (the default)" if len(values) == 1 else " (the defaults)") if default else "")
    return {"shape": at_shape, "values": at_values, "both": f"{at_shape}, {at_values}"}[part]


def _located(attr: dict, groups: dict) -> tuple[list[tuple[str, object]], str]:
    """``([(where, value), ...], part)``: the value of ``attr`` (per setting) by what it
    depends on: the input shape alone (``part`` "shape"), the parameter values alone
    ("values"), or both."""
    for part, k in (("shape", 0), ("values", 1)):
        by: dict = {}
        if all(by.setdefault(key[k], v) == v for key, v in attr.items()):
            first = {}
            for key, v in attr.items():
                first.setdefault(key[k], (_setting_text(key, part, groups), v))
            return list(first.values()), part
    return [(_setting_text(key, "both", groups), v) for key, v in attr.items()], "both"


def _group_factors(groups: dict, j: int) -> dict | None:
    """``{setting: factor}`` when the rule is a constant times the derivative at each
    setting but not the same constant at all; else None."""
    out = {}
    for key, group in groups.items():
        r = _factor(group, j)
        if not r or not _holds(group, j, lambda s: tuple(r * b for b in s.band[j])):
            return None
        out[key] = float(f"{r:.9g}")
    return out if len(set(out.values())) > 1 else None


def _sizes(s: _Sample) -> set[int]:
    """The element counts of the inputs at a sample and of every subset of their axes."""
    out = set()
    for x in s.xs:
        shape = np.shape(x)
        for mask in range(1, 2 ** len(shape)):
            out.add(int(np.prod([d for k, d in enumerate(shape) if mask >> k & 1])))
    return out - {1}


def _depends_text(d: str, factors: dict, groups: dict) -> str:
    """``differs from d/dx by a factor that depends on ...``, with the factor per setting
    and, for one that is the number of elements reduced (or its inverse), the likely
    mistake."""
    located, part = _located(factors, groups)
    names = " and ".join(dict.fromkeys(n for key in factors for n, _ in key[1]))
    what = {"shape": "the input size", "values": names,
            "both": f"the input size and {names}"}[part]
    text = (f"differs from {d} by a factor that depends on {what} ("
            + ", ".join(f"{r:.6g} at {where}" for where, r in located) + ")")
    if part == "shape":
        near = lambda r, ns: any(abs(r - n) <= 1e-9 * abs(n) for n in ns)
        sizes = {key: _sizes(groups[key][0]) for key in factors}
        if all(near(r, sizes[key]) for key, r in factors.items()):
            text += (": n times the derivative, n a number of elements reduced (the product of "
                     "some of the input's dims, as a mean divides by): a missing 1/n (mean)?")
        elif all(near(r, {1 / n for n in sizes[key]}) for key, r in factors.items()):
            text += (": 1/n times the derivative, n a number of elements reduced (the product "
                     "of some of the input's dims): an extra 1/n, or a missing n (sum)?")
    return text


def _where_exact(ga: GradientAudit, groups: dict, j: int) -> GradientAudit:
    """Says at which settings (shapes, parameter values) the rule is nonetheless exact."""
    exact = {key: _holds(group, j, lambda s: s.band[j]) for key, group in groups.items()}
    if any(exact.values()):
        located, _ = _located(exact, groups)
        yes = " and ".join(w for w, ok in located if ok)
        no = " or ".join(w for w, ok in located if not ok)
        ga.summary = f"exact at {yes}, not at {no}: {ga.summary}"
    return ga


def _agrees(sym: tuple[str, float] | None, factor: float) -> bool:
    """The symbolic verdict is ``rule = factor * derivative``."""
    return sym is not None and sym[0] == "scaled" and abs(sym[1] - factor) <= 1e-9 * abs(factor)


def _ignores_cotangent(samples, j: int) -> bool:
    """At every point, the rule's value at the random cotangent is its value at the unit one."""
    by_point: dict[int, list] = {}
    for s in samples:
        by_point.setdefault(id(s.xs), []).append(s)
    for group in by_point.values():
        for a in group[1:]:
            _, bad = _differs(a.c[j], (group[0].c[j],) * 3)
            if bad.any():
                return False
    return True


def _clipped(samples, j, lo, hi, up) -> tuple[str, str] | None:
    """How the rule clips (the gradient, or the cotangent before the derivative) and
    where it equals the derivative, or None when it is neither."""
    if _holds(samples, j, lambda s: tuple(np.clip(b, lo, hi) for b in s.band[j])):
        how, region = "gradient", f"where it lies in [{lo:g}, {hi:g}]"
    elif _holds(samples, j, lambda s: _at_clipped_cotangent(s, j, lo, hi)):
        how, region = "cotangent", f"where {up} lies in [{lo:g}, {hi:g}]"
    else:
        return None
    single = all(len(s.vs) == 1 and np.shape(s.vs[0]) == np.shape(s.c[j]) for s in samples)
    b = min(-lo, hi)
    if single and b > 0 and _holds(samples, j, lambda s: s.band[j],
                                   where=lambda s: np.abs(s.vs[0]) <= b):
        region = f"where |{up}| <= {b:g}"
    return how, region


def _at_clipped_cotangent(s: _Sample, j: int, lo: float, hi: float) -> tuple:
    tg = s.true.methods["vjp"].graph
    vs = [np.clip(v, lo, hi) for v in s.vs]
    return tuple(interpret(tg, x + vs)[j] for x in
                 (s.xs, _shift(s.xs, list(s.diff), -KINK_H), _shift(s.xs, list(s.diff), KINK_H)))


def _surrogate(samples, j, name, param, ups, up, ga, zero, sym, ignores) -> GradientAudit:
    """Where and by how much the rule differs: the fraction of elements, the relative
    difference in norm (over every sample) and elementwise (its largest, and where)."""
    n = differ = 0
    num = den = max_abs = max_rel = 0.0
    worst = (-1.0, None, 0, 0.0, 0.0)          # (size, sample, index, rule, derivative)
    for s in samples:
        fin, bad = _differs(s.c[j], s.band[j])
        c, t = (np.where(fin, a, 0.0) for a in np.broadcast_arrays(s.c[j], s.band[j][0]))
        n, differ = n + int(fin.sum()), differ + int(bad.sum())
        num, den = num + float(np.sum((c - t) ** 2)), den + float(np.sum(t ** 2))
        dabs = np.where(bad, np.abs(c - t), 0.0)
        drel = np.where(bad & (t != 0), dabs / np.where(t != 0, np.abs(t), 1.0), 0.0)
        max_abs, max_rel = max(max_abs, float(dabs.max())), max(max_rel, float(drel.max()))
        size = drel if drel.max() > 0 else dabs * 1e-300     # relative first
        k = int(np.argmax(size))
        if bad.any() and size.flat[k] > worst[0]:
            worst = (float(size.flat[k]), s, k, float(c.flat[k]), float(t.flat[k]))
    frac = differ / max(n, 1)
    _, s, k, cv, tv = worst
    where = _point_text(s, k, np.shape(s.c[j]), ups) if s is not None else ""
    passes = all(len(x.vs) == 1 and np.shape(x.vs[0]) == np.shape(x.c[j])
                 and _holds([x], j, lambda q: (q.vs[0],) * 3) for x in samples)
    nothing = all(not np.any(np.nan_to_num(x.c[j])) for x in samples)
    if zero:
        how = ("identically 0 after simplification" if sym and sym[0] == "zero"
               else "0 at every sampled point")
        rule = f"straight-through ({name} = {up})" if passes else \
            f"the rule is not 0 (|{name}| up to {max_abs:.3g})"
        text = f"{rule}; the derivative is 0 almost everywhere ({how})"
    elif nothing:
        text = "the rule is 0 (no gradient flows), the derivative is not"
    else:
        most = (f"at most {max_rel:.3g} relative elementwise" if max_rel else
                f"by up to {max_abs:.3g} elementwise where the derivative is 0")
        text = (f"differs from the derivative at {frac:.0%} of sampled elements, by "
                f"{(num / den) ** 0.5:.3g} relative in norm, {most} (at {where}: rule "
                f"{cv:.6g}, derivative {tv:.6g})")
        units = [x for x in samples if x.unit]
        if ignores and _holds(units, j, lambda x: x.band[j]):
            text = (f"equals the derivative at the unit cotangent {up} = 1, and only there: "
                    f"the rule ignores {up} (d/d{param} scales with {up})")
        elif ignores:
            text += f"; the rule ignores {up}"
    return ga("surrogate", text, symbolic=bool(zero and sym and sym[0] == "zero"),
              ignores_cotangent=ignores, max_rel_diff=None if zero else max_rel,
              max_abs_diff=max_abs, differs_fraction=frac, sample=where or None)


def _point_text(s: _Sample, k: int, shape: tuple, ups: tuple[str, ...]) -> str:
    """The inputs and cotangents at element ``k`` of a gradient of ``shape``: the element
    of each array of that shape, whole arrays (abridged) otherwise."""
    def show(a) -> str:
        a = np.asarray(a)
        if a.shape == shape and a.size > 1:
            return f"{a.flat[k]:.4g}"
        if a.ndim == 0:
            return f"{a:.4g}"
        return " ".join(np.array2string(a, precision=3, threshold=6, separator=", ").split())
    names = [p.name for p in s.true.params] + list(ups)
    return ", ".join(f"{n} = {show(a)}" for n, a in zip(names, list(s.xs) + list(s.vs)))
