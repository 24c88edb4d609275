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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradc.ir.interpret import interpret
from gradc.pipeline import CompiledOp, build_op

EPS = 1e-6


@dataclass
class CheckResult:
    op: str
    ok: bool                   # the derived gradient matches finite differences
    error: float               # relative error of the directional derivative
    custom: bool               # the op's gradient uses a custom rule
    custom_rel_diff: float = 0.0   # |custom - true| / |true| over random cotangents
    note: str = ""

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        text = f"{mark} {self.op}: derivative vs finite differences, rel. error {self.error:.1e}"
        if self.custom:
            if self.custom_rel_diff == float("inf"):
                text += "; the true derivative is 0 where the custom gradient is not"
            elif self.custom_rel_diff < 1e-6:
                text += "; custom gradient equals the true derivative"
            else:
                text += (f"; custom gradient differs from the true derivative "
                         f"(relative difference {self.custom_rel_diff:.3g})")
        return text + (f" [{self.note}]" if self.note else "")


def sample_inputs(cop: CompiledOp, rng: np.random.Generator, positive: bool = False) -> list:
    """Random float64 inputs for every parameter (defaults for those with one)."""
    dims: dict[str, int] = {}
    out = []
    for p in cop.params:
        if p.has_default:
            out.append(np.asarray(p.default, dtype=np.float64 if p.dtype is None
                                  or p.dtype.startswith("f") else None))
            continue
        shape = (5,) if p.shape is None else tuple(
            d if isinstance(d, int) else dims.setdefault(d, 2 + len(dims)) for d in p.shape)
        if p.dtype in ("i32", "i64"):
            out.append(rng.integers(-3, 4, size=shape))
        elif p.dtype == "bool":
            out.append(rng.random(shape) < 0.5)
        elif positive:
            out.append(rng.uniform(0.5, 2.0, size=shape))
        else:
            out.append(rng.standard_normal(shape))
    return out


def _vjp_dot(cop: CompiledOp, xs: list, vs: list, us: list) -> float:
    grads = interpret(cop.methods["vjp"].graph, xs + vs)
    return float(sum(np.vdot(g, u) for g, u in zip(grads, us)))


def check_op(op, ops, consts, *, seed: int = 0) -> CheckResult:
    """Check one op (an ``ast.OpDef`` of a checked program)."""
    rng = np.random.default_rng(seed)
    cop = build_op(op, ops, consts)
    true = build_op(op, ops, consts, custom=False)
    custom = bool(cop.primal.regions)
    xs = sample_inputs(true, rng)
    ys = interpret(true.methods["forward"].graph, xs)
    if not all(np.all(np.isfinite(y)) for y in ys):
        xs = sample_inputs(true, rng, positive=True)
        ys = interpret(true.methods["forward"].graph, xs)
    diff = [i for i, p in enumerate(true.params) if p.differentiable]
    us = [rng.standard_normal(np.shape(xs[i])) for i in diff]
    vs = [rng.standard_normal(np.shape(y)) for y in ys]

    def f(sign: float) -> list:
        moved = list(xs)
        for i, u in zip(diff, us):
            moved[i] = xs[i] + sign * EPS * u
        return interpret(true.methods["forward"].graph, moved)

    fd = sum(float(np.vdot(v, (a - b) / (2 * EPS))) for v, a, b in zip(vs, f(1.0), f(-1.0)))
    ad = _vjp_dot(true, xs, vs, us)
    err = abs(fd - ad) / max(abs(fd), abs(ad), 1e-8)
    result = CheckResult(op.name, bool(err < 1e-5), err, custom)
    if custom:
        g_custom = interpret(cop.methods["vjp"].graph, xs + vs)
        g_true = interpret(true.methods["vjp"].graph, xs + vs)
        num = sum(float(np.sum((a - b) ** 2)) for a, b in zip(g_custom, g_true)) ** 0.5
        den = sum(float(np.sum(b ** 2)) for b in g_true) ** 0.5
        result.custom_rel_diff = num / den if den > 1e-12 else (0.0 if num < 1e-12
                                                                 else float("inf"))
    if not np.isfinite(fd):
        result.ok, result.note = False, "non-finite values at the sampled point"
    return result


def check_program(program, *, seed: int = 0) -> list[CheckResult]:
    """Check every op of the main file of a checked program."""
    return [check_op(program.ops[n], program.ops, program.consts, seed=seed)
            for n in program.main_ops]
