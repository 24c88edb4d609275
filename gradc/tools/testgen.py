"""``gradc testgen FILE.grad -o test_ops.py``: a pytest file for the user's own CI.

The file imports the module through :func:`gradc.load` (the .grad file is found
relative to the test file, by the relative path from the test file's directory
computed here) and checks every op of the main file, one parametrized test per
property with ids by op name:

* the VJP against central finite differences, where the gradient is derived (or
  the op's custom rules were found equal to the derivative here, or differ without
  being marked ``surrogate``: then that test fails, as ``gradc check`` does): a
  custom rule marked ``surrogate`` (scaled, clipped, straight-through) is meant to
  differ, so finite differences do not apply to it; such ops get the consistency
  checks below and, where the rule is linear in the cotangents, a linearity check;
* fused against unfused, every method; ``vjp`` against ``fwd_bwd``;
* the adjoint identity ``<jvp(t), u> = <t, vjp(u)>`` where the op has a ``jvp``;
* broadcasting: a generic parameter given as a Python float or with fewer dims,
  where the op's value does not change for it (checked here, in the IR
  interpreter), against the same value broadcast, its gradient summed back; and
  scalar calls of elementwise ops of one parameter;
* dtypes: float32 in, float32 out; float64 in, float64 out; the declared dtype
  for annotated parameters; an integer array for a generic float parameter, or
  another float width for an annotated one, is a TypeError (docs/generated-module.md, *Dtypes*).

Shapes are chosen as ``gradc check`` chooses them (:func:`gradc.audit.gradcheck.fitting_inputs`)
and written into the file, with the range of integer inputs (labels in [0, 1] where a
negative one is refused); values are drawn when the tests run, from a seed per op,
and an op that draws random numbers is called with a ``seed=`` of its own.
The text depends only on the .grad files, the output path and gradc's version.
"""
from __future__ import annotations

import os
import re
import string
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradc.codegen.quote import comment, docstring
from gradc.audit.gradcheck import (CustomRuleError, custom_difference, draw_mask,
                                   fitting_inputs, sample_inputs)
from gradc.ir.interpret import interpret
from gradc.pipeline import CompiledOp, build_op

EXACT = 1e-6         # a custom rule this close to the derivative is taken as exact
SEEDS = 10           # seeds tried for a point where finite differences cross no kink
# Per compute dtype: the finite-difference step, the relative tolerance of finite
# differences, and that of identities that hold up to rounding (written into the file).
TOLERANCES = {"float64": (1e-6, 1e-6, 1e-9), "float32": (3e-3, 5e-3, 1e-4),
              "float16": (1e-1, 1e-1, 1e-2)}
TEMPLATE = Path(__file__).with_name("testgen_template.py.txt")


@dataclass
class OpPlan:
    """What the generated file tests of one op, decided at generation time."""

    name: str
    params: list[tuple]                 # (name, shape, dtype or "float", differentiable)
    outputs: int
    positive: bool
    custom: str = ""                    # how a custom rule differs from the derivative
    unmarked: str = ""                  # a differing rule not marked surrogate: FD fails
    owners: list[str] = field(default_factory=list)   # the ops whose unmarked rules those are
    linear: bool = True                 # VJP linear in the cotangents (has a jvp)
    broadcast: list[tuple] = field(default_factory=list)     # (parameter, smaller shape)
    scalar: bool = False                # elementwise in its one parameter
    seed: int = 0                       # of the inputs the tests draw
    ints: tuple = (-3, 4)               # integer inputs drawn from range(*ints)
    no_fd: str = ""                     # why a derived gradient is not checked by FD
    draws: bool = False                 # draws random numbers: called with a seed


def plan_op(cop: CompiledOp, true: CompiledOp) -> OpPlan | str:
    """The plan of one op, or why it gets no tests."""
    rng = np.random.default_rng(zlib.crc32(cop.op.name.encode()))
    try:
        fitted = fitting_inputs(true, rng, cop)      # shapes as gradc check chooses them
    except CustomRuleError as exc:
        return str(exc)
    if fitted is None:
        return "no input shapes tried fit it (declare the shapes of its parameters)"
    xs, ys, sampling = fitted
    positive = not all(np.all(np.isfinite(y)) for y in ys)
    if positive:                                  # inputs in [0.5, 2], as gradc check
        xs = sample_inputs(true, rng, positive=True, **sampling)
        ys = interpret(true.methods["forward"].graph, xs)
    inputs = [(p, x) for p, x in zip(cop.params, xs) if not p.has_default]
    # integers where gradc check draws them: [-3, 3] where every use takes them, else
    # [0, 1] (labels a gather takes from the end but one_hot refuses)
    plan = OpPlan(cop.op.name, [(p.name, np.shape(x), p.dtype or "float", p.differentiable)
                                for p, x in inputs], len(ys), positive,
                  linear="jvp" in cop.methods, ints=tuple(sampling["ints"]),
                  draws=cop.draws)
    try:
        return _probed(plan, cop, true, xs, ys, rng)
    except (ValueError, IndexError, ArithmeticError) as exc:
        return (f"the op raised {type(exc).__name__} at the inputs the tests would draw: "
                f"{exc}")


def _probed(plan: OpPlan, cop: CompiledOp, true: CompiledOp, xs: list, ys: list,
            rng: np.random.Generator) -> OpPlan:
    """``plan`` completed by running the op (in the interpreter): how its custom rules
    differ from the derivative, the seed, broadcasting and scalar calls."""
    if cop.primal.regions:
        # Exact only if equal at several cotangents, large ones too (a clipped rule
        # equals the derivative for small ones).
        diff = max(custom_difference(cop, true, xs, [scale * rng.standard_normal(np.shape(y))
                                                     for y in ys])
                   for scale in (1.0, 10.0, 0.1, 100.0))
        # Only a rule marked 'surrogate' is meant to differ: an unmarked one that
        # differs gets the finite-difference test, which fails (as gradc check does,
        # W410), so the user's CI says what the audit says.
        marked = any(r.rule.surrogate for r in cop.primal.regions)
        if diff > EXACT and marked:
            plan.custom = (f"relative difference to the derivative up to {diff:.3g}"
                           if np.isfinite(diff) else "the derivative is 0, the rule is not")
        elif diff > EXACT:
            owners = sorted({r.rule.op for r in cop.primal.regions} - {cop.op.name})
            whose = ("its custom gradient" if cop.op.grad is not None else
                     "its gradient goes through the custom gradient of "
                     + ", ".join(f"'{o}'" for o in owners) + ", which")
            plan.unmarked = (f"{whose} differs from the derivative (relative difference "
                             f"up to {diff:.3g}) and is not marked 'surrogate'")
            plan.owners = [cop.op.name] if cop.op.grad is not None else owners
    if not plan.custom:
        # kinks are found with the derivative: an unmarked wrong rule never matches
        # finite differences, and its test is meant to fail
        probe = true if plan.unmarked else cop
        misses = set()
        for plan.seed in range(SEEDS):
            miss = _differences_miss(probe, plan, plan.seed)
            if not miss:
                break
            misses.add(miss)
        else:
            drawn = "from [0.5, 2]" if plan.positive else "from a standard normal"
            plan.seed, plan.no_fd = 0, (
                f"its values or gradients are NaN or inf at all {SEEDS} points tried (floats "
                f"drawn {drawn}: outside its domain?), so its tests compare NaNs"
                if misses == {"nonfinite"} else
                f"finite differences crossed a kink at all {SEEDS} points tried")
    free = [i for i, p in enumerate(cop.params) if not p.has_default]
    for i in free:
        p = cop.params[i]
        if p.shape is None and p.dtype is None and np.ndim(xs[i]) > 0:
            plan.broadcast += [(p.name, s) for s in _smaller(xs[i].shape)
                               if _broadcast_invariant(cop, xs, ys, i, s, rng, plan.positive)][:1]
    plan.scalar = (len(free) == 1 and cop.params[free[0]].shape is None
                   and cop.params[free[0]].dtype is None and _elementwise(cop, xs, ys, free[0], rng))
    return plan


def _quoted(names: list[str]) -> str:
    return " and of ".join(f"'{n}'" for n in names)


def drawn_inputs(cop: CompiledOp, plan: OpPlan, seed: int) -> list:
    """The inputs the generated ``make_inputs`` draws at float64 (every parameter's:
    those with a default take it), as float64 arrays."""
    rng = np.random.default_rng([zlib.crc32(plan.name.encode()), seed])
    shapes = {name: shape for name, shape, _, _ in plan.params}
    xs = []
    for p in cop.params:
        if p.has_default:
            xs.append(np.asarray(p.default, dtype=None if p.dtype and p.dtype[0] != "f"
                                 else np.float64))
        elif p.dtype in ("i32", "i64"):
            xs.append(rng.integers(*plan.ints, size=shapes[p.name]))
        elif p.dtype == "bool":
            xs.append(draw_mask(rng, shapes[p.name]))
        else:
            x = rng.uniform(0.5, 2.0, shapes[p.name]) if plan.positive else \
                rng.standard_normal(shapes[p.name])
            xs.append(np.asarray(x, dtype=_FLOATS.get(p.dtype, np.float64)).astype(np.float64))
    return xs


_FLOATS = {"f16": np.float16, "f32": np.float32, "f64": np.float64}


def _differences_miss(cop: CompiledOp, plan: OpPlan, seed: int) -> str:
    """Why the generated finite-difference test would fail at ``seed`` (in the IR
    interpreter, with a tenth of its tolerance): "nonfinite" where a value or a
    gradient is NaN or inf there, "kink" where a kink (``abs``, ``max``, ``where``)
    lies between ``x - h u`` and ``x + h u`` at the file's step; "" where it holds."""
    xs = drawn_inputs(cop, plan, seed)
    kinds = {p[2] for p in plan.params}
    dtype = np.result_type(*[_FLOATS[k] for k in kinds if k in _FLOATS],
                           *([np.float64] if "float" in kinds else [])).name
    step, rtol, _ = TOLERANCES[dtype if dtype in TOLERANCES else "float64"]
    diff = [i for i, p in enumerate(cop.params) if p.differentiable]
    forward = cop.methods["forward"].graph
    ys = interpret(forward, xs)
    us = [np.random.default_rng(2).standard_normal(np.shape(xs[i])) for i in diff]
    rng = np.random.default_rng(3)
    vs = [rng.standard_normal(np.shape(y)) for y in ys]

    def moved(sign: float) -> list:
        x = list(xs)
        for i, u in zip(diff, us):
            x[i] = xs[i] + sign * step * u
        return interpret(forward, x)

    with np.errstate(all="ignore"):
        fd = sum(float(np.vdot(v, (a - b) / (2 * step)))
                 for v, a, b in zip(vs, moved(1), moved(-1)))
        ad = sum(float(np.vdot(g, u)) for g, u in zip(_grads(cop, xs, vs), us))
    if not (np.isfinite(fd) and np.isfinite(ad)
            and all(np.isfinite(y).all() for y in ys if np.asarray(y).dtype.kind == "f")):
        return "nonfinite"
    return "" if abs(fd - ad) <= rtol / 10 * max(abs(fd), abs(ad), 1e-8) else "kink"


def _smaller(shape: tuple) -> list[tuple]:
    """Shapes that broadcast to ``shape``: a scalar, then its trailing dims."""
    return [()] + ([shape[1:]] if len(shape) > 1 else [])


def _grads(cop: CompiledOp, xs: list, vs: list) -> list:
    return interpret(cop.methods["vjp"].graph, xs + vs)


def _broadcast_invariant(cop, xs, ys, i, shape, rng, positive: bool) -> bool:
    """Whether the op's outputs are the same for parameter ``i`` of ``shape`` as for
    that value broadcast to its full shape (not so for ``sum(x)``, say), and its
    gradient is the full one's summed back (in the interpreter)."""
    small = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape)
    full = list(xs)
    full[i] = np.broadcast_to(small, np.shape(xs[i])).copy()
    part = list(xs)
    part[i] = small
    try:
        y_full = interpret(cop.methods["forward"].graph, full)
        y_part = interpret(cop.methods["forward"].graph, part)
        vs = [rng.standard_normal(np.shape(y)) for y in ys]
        g_full, g_part = _grads(cop, full, vs), _grads(cop, part, vs)
    except (ValueError, IndexError):
        return False
    j = [k for k, p in enumerate(cop.params) if p.differentiable]
    g_full = [_sum_to(g, shape) if k == i else g for k, g in zip(j, g_full)]
    return all(np.shape(a) == np.shape(b) and np.allclose(a, b, rtol=1e-9, atol=1e-12)
               for a, b in zip(y_full + g_full, y_part + g_part))


def _sum_to(g, shape: tuple):
    g = np.sum(g, axis=tuple(range(np.ndim(g) - len(shape))))
    return np.sum(g, axis=tuple(k for k, d in enumerate(shape) if d == 1), keepdims=True)


def _elementwise(cop, xs, ys, i, rng) -> bool:
    """Whether every output and the gradient at element k of parameter ``i`` (the op's
    only input) are those of the op at that element alone (in the interpreter)."""
    if any(np.shape(y) != np.shape(xs[i]) for y in ys):
        return False
    vs = [rng.standard_normal(np.shape(y)) for y in ys]
    whole = ys + _grads(cop, xs, vs)
    for k in range(min(3, np.size(xs[i]))):
        one = list(xs)
        one[i] = np.asarray(xs[i].flat[k])
        try:
            at = interpret(cop.methods["forward"].graph, one) + \
                _grads(cop, one, [np.asarray(v.flat[k]) for v in vs])
        except (ValueError, IndexError):
            return False
        if not all(np.shape(a) == () and np.allclose(a, w.flat[k], rtol=1e-12)
                   for a, w in zip(at, whole)):
            return False
    return True


def plan_program(spec: str | os.PathLike) -> tuple[list[OpPlan], dict[str, str]]:
    """Plans for every op of the main file of ``spec``, and the ops left out with why.
    Raises :class:`gradc.GradcError` for errors in the file."""
    from gradc.frontend.check import load_program
    from gradc.pipeline import build_program
    program = load_program(spec)
    compiled = build_program(program)
    plans, skipped = [], {}
    for name, cop in compiled.items():
        if isinstance(cop, str):                   # a construct this version cannot compile
            skipped[name] = cop.splitlines()[0]
            continue
        plan = plan_op(cop, build_op(program.ops[name], program.ops, program.consts,
                                     custom=False))
        if isinstance(plan, str):
            skipped[name] = plan
        else:
            plans.append(plan)
    return plans, skipped


def render(plans: list[OpPlan], skipped: dict[str, str], spec_path: str, spec_arg: str,
           out_arg: str) -> str:
    """The text of the test file; ``spec_path`` is the .grad file relative to it."""
    import gradc
    methods = [(p.name, m) for p in plans
               for m in ("forward", "vjp", "fwd_bwd") + (("jvp",) if p.linear else ())]
    dtypes = [(p.name, d) for p in plans
              for d in (("float32", "float64") if any(k == "float" for _, _, k, _ in p.params)
                        else ("declared",))]
    tables = {
        "CASES": {p.name: {"params": p.params, "outputs": p.outputs, "positive": p.positive,
                           "seed": p.seed, "ints": p.ints, "draws": p.draws}
                  for p in plans},
        "FINITE_DIFFERENCES": [p.name for p in plans if not p.custom and not p.no_fd],
        "CUSTOM": {p.name: p.custom for p in plans if p.custom},
        "LINEAR_CUSTOM": [p.name for p in plans if p.custom and p.linear],
        "METHODS": methods,
        "ADJOINT": [p.name for p in plans if p.linear],
        "BROADCAST": [(p.name, q, s) for p in plans for q, s in p.broadcast],
        "SCALAR": [p.name for p in plans if p.scalar],
        "DTYPES": dtypes,
        "WRONG_DTYPE": [p.name for p in plans if any(k[0] == "f" for _, _, k, _ in p.params)],
    }
    body = {k: _literal(v) for k, v in tables.items()}
    left_out = "".join(f"\n#   {name}: {comment(why)}" for name, why in skipped.items())
    left_out += "".join(f"\n#   {p.name}, from the finite-difference test: {comment(p.no_fd)}"
                        for p in plans if p.no_fd)
    # The template's tests each follow a line '# @tests TABLE': left out where TABLE is
    # empty (pytest would report an empty parametrisation as a skipped test).
    head, *sections = re.split(r"^# @tests (\w+)\n", TEMPLATE.read_text(encoding="utf-8"),
                               flags=re.M)
    text = head + "".join(code for table, code in zip(sections[::2], sections[1::2])
                          if tables[table])
    # File names go into the docstring escaped, the reasons ops were left out into
    # comments: no name can end either or start a line of code.
    return string.Template(text.rstrip("\n") + "\n").substitute(
        spec_name=docstring(Path(spec_arg).name), spec_arg=docstring(spec_arg),
        out_arg=docstring(out_arg),
        version=gradc.__version__, left_out=left_out or " none", GRAD_PATH=repr(spec_path),
        TOLERANCES=repr(TOLERANCES), **body)


def _literal(value: dict | list, width: int = 88) -> str:
    """A dict as one entry per line (CASES: its parameters packed below); a list
    packed into lines of at most ``width``."""
    if isinstance(value, dict):
        items = [f"    {k!r}: {_case(v, width) if isinstance(v, dict) else repr(v)},"
                 for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n}" if items else "{}"
    return "[\n" + "\n".join(_packed(value, "    ", width)) + "\n]" if value else "[]"


def _case(case: dict, width: int) -> str:
    rest = ", ".join(f"{k!r}: {v!r}" for k, v in case.items() if k != "params")
    return ("{" + rest + ", 'params': [\n" + "\n".join(_packed(case["params"], " " * 8, width))
            + "\n    ]}")


def _packed(items: list, indent: str, width: int) -> list[str]:
    lines: list[str] = []
    for item in map(repr, items):
        if lines and len(lines[-1]) + len(item) + 2 <= width:
            lines[-1] += f" {item},"
        else:
            lines.append(f"{indent}{item},")
    return lines


def write_tests(spec: str | os.PathLike, out: str | os.PathLike) -> tuple[Path, int]:
    """Write the test file of ``spec`` to ``out`` (atomically); returns the path and
    the number of tests it holds.  Raises :class:`gradc.GradcError` for errors in
    the file and OSError when it cannot be read or ``out`` written."""
    from gradc.loader.disk_cache import write_atomic
    import warnings

    from gradc.errors import GradcWarning
    spec, out = Path(spec), Path(out)
    plans, skipped = plan_program(spec)
    for p in plans:
        if p.unmarked:
            warnings.warn(GradcWarning(
                f"op '{p.name}': {p.unmarked}: its test_vjp_matches_finite_differences "
                f"will fail", None, "W410",
                ["if the rule is meant to differ (a straight-through estimator, a scaled or "
                 f"clipped gradient), mark the grad block of {_quoted(p.owners)} "
                 "'grad(...) -> ... surrogate {' and generate the file again; gradc check "
                 "reports the same (docs/audit.md)"]),
                stacklevel=2)
    for name, why in skipped.items():
        warnings.warn(GradcWarning(f"op '{name}' gets no tests: {why}"), stacklevel=2)
    for p in plans:
        if p.no_fd:
            warnings.warn(GradcWarning(f"op '{p.name}' gets no finite-difference test: "
                                       f"{p.no_fd}"), stacklevel=2)
    try:
        rel = Path(os.path.relpath(spec.resolve(), out.resolve().parent)).as_posix()
    except ValueError:                    # another drive (Windows): no relative path
        rel = spec.resolve().as_posix()
    text = render(plans, skipped, rel, spec.as_posix(), out.as_posix())
    write_atomic(out, text, keep=spec)
    return out, count_tests(plans)


def count_tests(plans: list[OpPlan]) -> int:
    """How many tests the file of ``plans`` holds (what pytest collects)."""
    per_op = lambda p: (1 + (not p.custom and not p.no_fd) + bool(p.custom and p.linear)
                        + 3 + 2 * p.linear                                 # methods, adjoint
                        + len(p.broadcast) + p.scalar
                        + (2 if any(k == "float" for _, _, k, _ in p.params) else 1)
                        + any(k[0] == "f" for _, _, k, _ in p.params))
    return sum(per_op(p) for p in plans)
