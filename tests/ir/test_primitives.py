"""Table-driven tests of the primitive registry (STYLE §7, SPEC §1).

Every primitive of :data:`gradc.ir.primitives.PRIMITIVES` is exercised through
a one-line ``.grad`` op (``op p_sin(x) -> r { r = sin(x) }``) generated from
the registry itself, so a new primitive is tested as soon as it is added
(internal helpers that ``.grad`` cannot spell are reached through ops that
use them).  For each op:

(a) its derivative rules parse and name only the documented rule scope;
(b) the derived VJP matches float64 central differences of the interpreter
    (random points of the primitive's domain, via hypothesis, and a table of
    edge points: 0, negative, large, tiny), and so does the JVP (forward mode:
    the directional derivative, and the adjoint identity with the VJP);
(c) kinks and ties follow SPEC §1 (and the choices documented in
    :mod:`gradc.ir.primitives`);
(d) the generated module's kernels, fused and unfused, in float64 and
    float32, agree with the interpreter (NumPy references), every method
    (forward, vjp, fwd_bwd, jvp).

The whole table compiles into ONE generated module per session: Numba
compiles each kernel on first call, so a module per primitive would not fit
the suite's time budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import gradc
from gradc.autodiff.rules import rule_ast
from gradc.frontend import ast
from gradc.frontend.builtins import BUILTINS, CONSTANTS
from gradc.frontend.check import check_source
from gradc.ir.interpret import interpret
from gradc.ir.expr import INTERNAL, parse_statements
from gradc.ir.primitives import (ABOVE_ONE, BINARY_OPS, COMPARE_OPS, COMPOSITE, ELEMENTWISE,
                                 NONZERO, POSITIVE, PRIMITIVES, REAL, REDUCTION, UNIT)
from gradc.pipeline import build_op

SOURCES = ("param", "const", "seed", "draw_offset")
EPS64 = np.finfo(np.float64).eps


# ---- the case table ------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One generated op: ``op NAME(PARAMS) -> r { BODY }``.

    ``prims``: the primitives this op exercises (checked against its graphs);
    ``shapes``/``domains``: per parameter, for sampling; ``kink``: a predicate
    on the inputs that is False where central differences would straddle a
    kink or a tie (those points are tested by the convention tests instead).
    """

    name: str
    prims: tuple[str, ...]
    params: str                       # the .grad parameter list
    body: str                         # statements; the output is ``r``
    shapes: tuple[tuple[int, ...], ...]
    domains: tuple[str, ...]
    kink: object = None
    ints: tuple[int, ...] = ()        # parameters that are integer arrays
    extra: str = ""                   # helper ops the body calls (emitted once)
    dtypes: tuple[str, ...] = ("f64", "f32")   # generated once per annotated dtype

    @property
    def source(self) -> str:
        return f"op {self.name}({self.params}) -> r {{\n{self.body}\n}}\n"


_INFIX = {v: k for k, v in {**BINARY_OPS, **COMPARE_OPS}.items()}
_SPELLED = {"maximum": "max", "minimum": "min"}


def _spell(prim) -> str:
    """The .grad expression applying ``prim`` to its parameter names."""
    p = prim.params
    if prim.name in _INFIX:
        return f"{p[0]} {_INFIX[prim.name]} {p[1]}"
    if prim.name == "neg":
        return f"-{p[0]}"
    return f"{_SPELLED.get(prim.name, prim.name)}({', '.join(p)})"


def _far_apart(*arrays_, gap=1e-3) -> bool:
    return all(np.all(np.abs(a - b) > gap) for i, a in enumerate(arrays_)
               for b in arrays_[i + 1:])


def _distinct(x, gap=1e-3) -> bool:
    v = np.sort(np.ravel(x))
    return bool(np.all(np.diff(v) > gap))


_KINKS = {
    "abs": lambda x: np.all(x != 0),
    "maximum": lambda x, y: _far_apart(x, y),
    "minimum": lambda x, y: _far_apart(x, y),
    "clip": lambda x, lo, hi: _far_apart(x, lo, hi) and np.all(lo < hi),
}


def _elementwise_cases() -> list[Case]:
    out = []
    for prim in PRIMITIVES.values():
        if prim.kind != ELEMENTWISE or prim.name in INTERNAL:
            continue
        params = list(prim.params)
        domains = [prim.domain] * len(params)
        if prim.name == "where":              # the condition is data: 0 or 1, no gradient
            params[0] = "c: nograd"
            domains[0] = "bool01"
        out.append(Case(f"p_{prim.name}", (prim.name,), ", ".join(params),
                        f"    r = {_spell(prim)}", ((4,),) * len(params), tuple(domains),
                        _KINKS.get(prim.name)))
    return out


# Reductions: axis variants on a (3, 4) input.
_AXES = {"": "", "a1": ", axis=1", "a0k": ", axis=0, keepdims=1", "a01": ", axis=(0, 1)",
         "ak": ", keepdims=1", "am1": ", axis=-1"}
_RED_VARIANTS = {"sum": ("", "a1", "a0k", "a01"), "mean": ("", "a1", "a0k"),
                 "prod": ("", "a1"), "max": ("", "a1", "ak"), "min": ("", "a0k"),
                 "logsumexp": ("", "a1", "am1"), "norm": ("", "a1", "a0k")}


def _reduction_cases() -> list[Case]:
    out = []
    for prim in PRIMITIVES.values():
        if prim.kind != REDUCTION:
            continue
        for v in _RED_VARIANTS.get(prim.name, ("", "a1")):
            name = f"p_{prim.name}" + (f"_{v}" if v else "")
            prims = (prim.name, "broadcast_in") + (("size_ratio",) if prim.name == "mean" else ())
            out.append(Case(name, prims, "x", f"    r = {prim.name}(x{_AXES[v]})", ((3, 4),),
                            (prim.domain,), _distinct if prim.name in ("max", "min") else None))
    return out


# An op whose output is its input, with a (correct) custom gradient: its call is
# marked with an 'identity' node.
_SAME = "op same(x) -> y {\n    y = x\n} grad(dy) -> dx {\n    dx = dy\n}\n"


INDEX3 = "index3"     # integer labels in [0, 3)


# A custom gradient of a parameter whose shape is known at run time only, where the
# gradient's shape class differs from it: checked at run time by a 'shape_check' (and in
# the JVP, on the tangent, by a 'shape_check_of').
_ROWS = ("op rowscale(x, w) -> y {\n    y = x * w\n} grad(dy) -> (dx, dw) {\n"
         "    dx = dy * w\n    dw = sum(dy * x, axis=0)\n}\n")


def _other_cases() -> list[Case]:
    """matmul and transpose (spelled '@' and '.T') and the internal helpers."""
    cases = []
    for dt in ("f64", "f32"):
        for tag, px, py, sx, sy in [("22", "[m, k]", "[k, n]", (2, 3), (3, 4)),
                                    ("21", "[m, k]", "[k]", (2, 3), (3,)),
                                    ("12", "[k]", "[k, n]", (3,), (3, 4)),
                                    ("11", "[k]", "[k]", (3,), (3,))]:
            prims = ("matmul", "transpose") if tag == "22" else ("matmul",)
            cases.append(Case(f"p_matmul_{tag}_{dt}", prims, f"x: {dt}{px}, y: {dt}{py}",
                              "    r = x @ y", (sx, sy), (REAL, REAL), dtypes=(dt,)))
    # batched (np.matmul): batch dims, broadcast batch dims (the VJP summed over them), a
    # 1-d operand against a batch, a matrix against a batch; the second order (a cubic:
    # sampled away from 0, as i_cumprod_second)
    for tag, px, py, sx, sy in [("b3", "[b, i, k]", "[b, k, j]", (2, 2, 3), (2, 3, 2)),
                                ("bc", "[1, h, i, k]", "[b, 1, k, j]", (1, 2, 2, 3), (2, 1, 3, 2)),
                                ("1b", "[k]", "[b, k, j]", (3,), (2, 3, 2)),
                                ("b1", "[b, i, k]", "[k]", (2, 2, 3), (3,)),
                                ("2b", "[i, k]", "[b, k, j]", (2, 3), (2, 3, 2))]:
        cases.append(Case(f"p_matmul_{tag}", ("matmul",), f"x: {px}, y: {py}", "    r = x @ y",
                          (sx, sy), (REAL, REAL)))
    cases.append(Case("i_matmul_second", ("matmul", "swapaxes", "sum_to"),
                      "x: [1, h, i, k], y: [b, 1, k, j]", "    r = grad(sum((x @ y) ^ 2), x)",
                      ((1, 2, 2, 3), (2, 1, 3, 2)), (NONZERO, NONZERO)))
    cases += [
        Case("p_transpose", ("transpose",), "x", "    r = x.T * 1", ((2, 3),), (REAL,)),
        Case("p_transpose_mm", ("transpose", "matmul"), "x: f64[m, k], y: f64[m, n]",
             "    r = x.T @ y", ((3, 2), (3, 4)), (REAL, REAL), dtypes=("f64",)),
        # sum_to: the gradient of a broadcast operand is reduced to its shape
        Case("i_sum_to_outer", ("sum_to", "mul"), "x, y", "    r = x * y",
             ((2, 1), (1, 3)), (REAL, REAL)),
        Case("i_sum_to_bias", ("sum_to", "add"), "x, b", "    r = sin(x + b)",
             ((3, 4), (4,)), (REAL, REAL)),
        # cast: an integer parameter meets a float
        Case("i_cast", ("cast", "mul"), "x, n: i32", "    r = x * n", ((4,), (4,)),
             (REAL, "int"), ints=(1,)),
        # identity: marks the result of a call of an op with a grad block
        Case("i_identity", ("identity",), "x", "    r = 3 * same(x)", ((4,),), (REAL,),
             extra=_SAME),
        Case("i_shape_check", ("shape_check", "shape_check_of", "mul"), "x, w",
             "    r = rowscale(x, w)", ((3, 4), (4,)), (REAL, REAL), extra=_ROWS),
        # cumsum: along each axis, forwards and (the alias, reverse=) backwards, 1-d
        Case("p_cumsum", ("cumsum",), "x", "    r = cumsum(x, axis=1)", ((3, 4),), (REAL,)),
        Case("p_cumsum_a0r", ("cumsum",), "x",
             "    r = cumulative_sum(x, axis=0, reverse=true)", ((3, 4),), (REAL,)),
        Case("p_cumsum_1d", ("cumsum",), "x", "    r = cumsum(x) * x", ((5,),), (REAL,)),
        # one_hot: integer labels in [0, 3) as rows (no gradient to the labels)
        Case("p_one_hot", ("one_hot", "one_hot_labels", "mul"), "x, n: i32", "    r = one_hot(n, 3) * x",
             ((4, 3), (4,)), (REAL, INDEX3), ints=(1,)),
        # dim_size: dims of the signature as values, and as one_hot's depth
        Case("i_dim_size", ("dim_size", "div"), "x: [n, k]", "    r = x / k * sqrt(n)",
             ((3, 4),), (REAL,)),
        Case("p_one_hot_dim", ("one_hot", "one_hot_labels", "mul"), "x: [n, k], t: i32[n]",
             "    r = one_hot(t, k) * x", ((4, 3), (4,)), (REAL, INDEX3), ints=(1,)),
        # argmax, argmin: int64 indices (no gradient), along an axis or of the flattened
        # array; as a one_hot's labels and as a factor
        Case("p_argmax", ("argmax", "one_hot", "mul"), "x",
             "    r = one_hot(argmax(x, axis=1), 4) * x", ((3, 4),), (REAL,), _distinct),
        Case("p_argmin", ("argmin", "mul"), "x", "    r = x * argmin(x, axis=0, keepdims=true)",
             ((3, 4),), (REAL,), _distinct),
        Case("p_argmax_flat", ("argmax", "mul"), "x", "    r = x * argmax(x)", ((3, 4),),
             (REAL,), _distinct),
        # the composite builtins: their decompositions (kind "decomposed") in every graph
        Case("p_relu", ("relu",), "x", "    r = relu(x)", ((4,),), (REAL,),
             lambda x: np.all(np.abs(x) > 1e-3)),
        Case("p_log_sigmoid", ("log_sigmoid",), "x", "    r = log_sigmoid(x)", ((4,),), (REAL,)),
        Case("p_softmax", ("softmax",), "x", "    r = softmax(x, axis=1)", ((3, 4),), (REAL,)),
        Case("p_softmax_a0", ("softmax",), "x", "    r = softmax(x, axis=0)", ((3, 4),), (REAL,)),
        Case("p_log_softmax", ("log_softmax",), "x", "    r = log_softmax(x)", ((3, 4),),
             (REAL,)),
        # layout: the VJP of a reshape is reshape_like (back to the operand's shape), of
        # broadcast_to a sum_to, of a permutation the inverse one
        Case("p_reshape", ("reshape", "reshape_like"), "x", "    r = reshape(x, (2, -1, 3))",
             ((3, 4),), (REAL,)),
        Case("p_reshape_dims", ("reshape",), "x: [n, k]", "    r = reshape(x, (k, n)) * 2",
             ((3, 4),), (REAL,)),
        Case("p_expand_dims", ("expand_dims", "reshape_like"), "x",
             "    r = expand_dims(x, (0, -1)) * expand_dims(x, 1)", ((3, 4),), (REAL,)),
        Case("p_squeeze", ("squeeze", "reshape_like"), "x", "    r = squeeze(x, (0, 2)) * 3",
             ((1, 4, 1),), (REAL,)),
        Case("p_broadcast_to", ("broadcast_to", "sum_to"), "x",
             "    r = sin(broadcast_to(x, (2, 3, 4)))", ((3, 1),), (REAL,)),
        Case("p_permute_dims", ("permute_dims",), "x", "    r = permute_dims(x, (2, 0, 1))",
             ((2, 3, 4),), (REAL,)),
        Case("p_permute_alias", ("permute_dims",), "x",
             "    r = transpose(x, (1, -1, 0)) * 2", ((2, 3, 4),), (REAL,)),
        Case("p_swapaxes", ("swapaxes",), "x", "    r = swapaxes(x, -1, 0) * 2", ((2, 3, 4),),
             (REAL,)),
        # gathers by integer indices (duplicates among them accumulate in the VJP, a
        # scatter-add); the second order differentiates the scatter-add (a gather)
        Case("p_take", ("take", "take_transpose"), "x, t: i32", "    r = take(x, t, axis=1)",
             ((3, 4), (5,)), (REAL, INDEX3), ints=(1,)),
        Case("p_take_flat", ("take", "take_transpose"), "x, t: i32", "    r = take(x, t)", ((3, 4), (2, 2)), (REAL, INDEX3), ints=(1,)),
        Case("p_take_along_axis", ("take_along_axis", "take_along_axis_transpose"),
             "x, t: i32", "    r = take_along_axis(x, t, axis=0)", ((3, 4), (5, 4)),
             (REAL, INDEX3), ints=(1,)),
        Case("p_take_along_bcast", ("take_along_axis", "take_along_axis_transpose"),
             "x, t: i32", "    r = take_along_axis(x, t, axis=-2)", ((3, 1), (2, 4)),
             (REAL, INDEX3), ints=(1,)),
        Case("i_take_second", ("take_transpose", "take"), "x, t: i32",
             "    r = grad(sum(take(x, t, axis=0) ^ 2), x)", ((3, 2), (4,)), (REAL, INDEX3),
             ints=(1,)),
        # sorting: argsort (int64, no gradient; stable, descending), sort and topk (their
        # decompositions: a gather by argsort, the VJP its scatter-add), k = n and k = 0
        Case("p_argsort", ("argsort", "mul"), "x", "    r = x * argsort(x, axis=0)",
             ((3, 4),), (REAL,), _distinct),
        Case("p_argsort_desc", ("argsort", "mul"), "x",
             "    r = x * argsort(x, descending=true)", ((3, 4),), (REAL,), _distinct),
        Case("p_sort", ("sort",), "x", "    r = sort(x, axis=1)", ((3, 4),), (REAL,),
             _distinct),
        Case("p_sort_desc", ("sort",), "x", "    r = sort(x, axis=0, descending=true) * 2",
             ((3, 4),), (REAL,), _distinct),
        Case("p_topk", ("topk",), "x", "    r = topk(x, 2)", ((3, 4),), (REAL,), _distinct),
        Case("p_topk_all", ("topk",), "x", "    r = topk(x, 3, axis=0)", ((3, 4),), (REAL,),
             _distinct),
        Case("p_topk_none", ("topk",), "x", "    r = sum(x, axis=1) + sum(topk(x, 0))",
             ((3, 4),), (REAL,)),
        # cumprod: a decomposition over shift and linear_scan (zero-safe derivatives), along
        # each axis, backwards, 1-d; the second order differentiates linear_scan in a (sampled
        # away from 0, where central differences of a cubic are all error; zeros are edges)
        Case("p_cumprod", ("cumprod",), "x", "    r = cumprod(x, axis=1)", ((3, 4),),
             (NONZERO,)),
        Case("p_cumprod_a0r", ("linear_scan", "shift"), "x",
             "    r = cumulative_prod(x, axis=0, reverse=true)", ((3, 4),), (NONZERO,)),
        Case("p_cumprod_1d", ("cumprod", "shift", "linear_scan"), "x", "    r = cumprod(x) * x",
             ((5,),), (NONZERO,)),
        Case("i_cumprod_second", ("shift", "linear_scan"), "x",
             "    r = grad(sum(cumprod(x, axis=1, reverse=true) ^ 2), x)", ((2, 4),), (NONZERO,)),
        # random numbers (a constant for differentiation: x's derivative is the draw's
        # value; lo's and hi's flow through lo + (hi - lo) u); the normal's two uniforms
        # of one block; a draw in a loop over rows with its reduction; seed 0 (the
        # interpreter's) in the kernels
        Case("p_random_uniform_like", ("random_uniform_like", "random_uniform"), "x, y",
             "    r = x * random_uniform_like(x) + random_uniform_like(x, -1, hi=y)",
             ((3, 4), (4,)), (REAL, REAL),
             # hi = lo is a kink: below it the draw is lo (JAX's max(lo, v)), constant
             kink=lambda x, y: bool(np.all(np.abs(y + 1) > 1e-6))),
        Case("p_random_normal_like", ("random_normal_like", "random_uniform"), "x",
             "    r = x * random_normal_like(x)", ((3, 4),), (REAL,)),
        Case("i_random_rows", ("random_uniform", "sum"), "x: [n, k]",
             "    r = x * sum(x * random_uniform_like(x), axis=1, keepdims=true)", ((3, 4),),
             (REAL,)),
        # indexing (gradc.ir.indexing): basic slices (negative steps, ints, '...', bounds by
        # dims), their VJP slice_transpose; integer-array indices, adjacent (in place, several
        # merged into one flat index) and apart (their dims first); concat and its parts,
        # stack; arange and eye (no gradient); the second order differentiates the transposes
        Case("p_slice", ("slice", "slice_transpose"), "x",
             "    r = x[1:, ::-2] * 2 + x[..., :2, -1:]", ((3, 4),), (REAL,)),
        Case("p_slice_dims", ("slice",), "x: [n, k]",
             "    r = x[:n - 1, k - 2] * x[0, ..., 1:3]", ((3, 4),), (REAL,)),
        Case("i_slice_second", ("slice_transpose", "slice"), "x",
             "    r = grad(sum(x[1:, :2] ^ 3), x)", ((3, 4),), (REAL,)),
        Case("p_index_array", ("wrap_index", "take", "take_transpose"), "x, t: i32",
             "    r = x[:, t] * 2", ((3, 4), (5,)), (REAL, INDEX3), ints=(1,)),
        Case("p_index_pairs", ("arange", "wrap_index", "merge_axes", "take"),
             "x: [n, k], t: i32[n]", "    r = x[arange(n), t] * x[-1, t]", ((4, 3), (4,)),
             (REAL, INDEX3), ints=(1,)),
        Case("p_index_apart", ("permute_dims", "merge_axes", "take"),
             "x: [a, b, c], t: i32[m]", "    r = x[t, 1:, t]", ((3, 2, 3), (4,)),
             (REAL, INDEX3), ints=(1,)),
        Case("p_concat", ("concat", "concat_part"), "x, y",
             "    r = concat(x, y * y, x, axis=1)", ((2, 3), (2, 2)), (REAL, REAL)),
        Case("i_concat_second", ("concat_part", "concat_part_transpose"), "x",
             "    r = grad(sum(stack(x, sin(x), axis=-1) ^ 3), x)", ((2, 3),), (REAL,)),
        Case("p_arange_eye", ("arange",), "x: [n, k]",
             "    r = x * arange(k) + eye(n, k, k=-1) + arange(0.5, 2, 0.5)", ((4, 3),),
             (REAL,)),
        # zero_masked: the NaN-safe products of a gradient (sin's and mul's rules), which
        # the derivatives of r differentiate in turn (second order)
        Case("i_zero_masked", ("zero_masked",), "x", "    r = grad(sum(sin(x) * x), x)",
             ((4,),), (REAL,)),
    ]
    return cases


CASES = _elementwise_cases() + _reduction_cases() + _other_cases()
BY_NAME = {c.name: c for c in CASES}
DIFF_CASES = [c for c in CASES if any(PRIMITIVES[p].differentiable for p in c.prims)]


def _module_source() -> str:
    extras = dict.fromkeys(c.extra for c in CASES if c.extra)
    return "".join(extras) + "\n".join(c.source for c in CASES)


# ---- building: graphs for the interpreter, one generated module ----------------------

@lru_cache(maxsize=None)
def _program():
    return check_source(_module_source(), "primitives.grad")


@lru_cache(maxsize=None)
def compiled(name: str):
    program = _program()
    return build_op(program.ops[name], program.ops, program.consts)


@pytest.fixture(scope="module")
def gen(import_module_text):
    """The generated module of every case (compiled lazily by Numba, kernel by kernel)."""
    return import_module_text(gradc.compile_source(_module_source(), file="primitives.grad"),
                              "gradc_test_primitives_gen")


def run_forward(case: Case, xs, dtype=np.float64) -> list[np.ndarray]:
    return interpret(compiled(case.name).methods["forward"].graph, xs, dtype)


def run_vjp(case: Case, xs, vs, dtype=np.float64) -> list[np.ndarray]:
    return interpret(compiled(case.name).methods["vjp"].graph, list(xs) + list(vs), dtype)


def run_jvp(case: Case, xs, ts, dtype=np.float64) -> list[np.ndarray]:
    """The outputs, then their tangents: one tangent per differentiable parameter."""
    return interpret(compiled(case.name).methods["jvp"].graph, list(xs) + list(ts), dtype)


def diff_params(case: Case) -> list[int]:
    return [i for i, p in enumerate(compiled(case.name).params) if p.differentiable]


# ---- sampling ----------------------------------------------------------------------

_ELEMENTS = {
    REAL: st.floats(-3, 3),
    POSITIVE: st.floats(0.1, 3),
    UNIT: st.floats(-0.9, 0.9),
    ABOVE_ONE: st.floats(1.1, 4),
    NONZERO: st.tuples(st.sampled_from([-1.0, 1.0]), st.floats(0.1, 3)).map(
        lambda t: t[0] * t[1]),
    "bool01": st.sampled_from([0.0, 1.0]),
}


def _draw_inputs(case: Case, data) -> list[np.ndarray]:
    xs = []
    for shape, dom in zip(case.shapes, case.domains):
        if dom == "int":
            xs.append(data.draw(arrays(np.int32, shape, elements=st.integers(-3, 3))))
        elif dom == INDEX3:
            xs.append(data.draw(arrays(np.int32, shape, elements=st.integers(0, 2))))
        elif case.kink is _distinct and dom == REAL:
            # distinct by construction (a grid of 2e-3), not by rejection: hypothesis's
            # arrays repeat values, and rejecting ties would cost dozens of draws each
            grid = st.integers(-1500, 1500).map(lambda i: i * 2e-3)
            xs.append(data.draw(arrays(np.float64, shape, elements=grid, unique=True)))
        else:
            xs.append(data.draw(arrays(np.float64, shape, elements=_ELEMENTS[dom])))
    if case.name == "p_clip":                      # lo < hi
        lo, hi = np.minimum(xs[1], xs[2]), np.maximum(xs[1], xs[2])
        xs[1], xs[2] = lo, hi
    return xs


def _fixed_inputs(case: Case, seed: int = 0) -> list[np.ndarray]:
    """Deterministic domain points (for the compiled-kernel comparisons)."""
    rng = np.random.default_rng(seed)
    xs = []
    for shape, dom in zip(case.shapes, case.domains):
        if dom in ("int", INDEX3):
            lo = -3 if dom == "int" else 0
            xs.append(rng.integers(lo, 4 if dom == "int" else 3, shape).astype(np.int32))
            continue
        u = rng.uniform(0.0, 1.0, shape)
        x = {REAL: -3 + 6 * u, POSITIVE: 0.1 + 2.9 * u, UNIT: -0.9 + 1.8 * u,
             ABOVE_ONE: 1.1 + 2.9 * u, "bool01": np.round(u),
             NONZERO: np.where(rng.uniform(size=shape) < 0.5, -1, 1) * (0.1 + 2.9 * u)}[dom]
        xs.append(x)
    if case.name == "p_clip":
        xs[1], xs[2] = np.minimum(xs[1], xs[2]) - 0.5, np.maximum(xs[1], xs[2]) + 0.5
    return xs


# ---- the finite-difference check --------------------------------------------------

def _central_steps(case: Case, xs, seed: int):
    """The inputs as arrays, the differentiable parameters, the forward values
    ``f0``, random cotangents ``vs`` and the central-difference points ``xp``,
    ``xm`` with their values ``fp``, ``fm``."""
    xs = [np.asarray(x) for x in xs]
    diff = diff_params(case)
    rng = np.random.default_rng(seed)
    f0 = run_forward(case, xs)
    vs = [rng.standard_normal(np.shape(o)) for o in f0]
    xp, xm = list(xs), list(xs)
    for i in diff:
        h = 1e-7 * np.where(xs[i] != 0, np.abs(xs[i]), 1.0) * rng.standard_normal(xs[i].shape)
        xp[i], xm[i] = xs[i] + h, xs[i] - h
    return xs, diff, f0, vs, xp, xm, run_forward(case, xp), run_forward(case, xm)


def check_vjp_fd(case: Case, xs, seed: int = 0, rtol: float = 1e-6) -> None:
    """<v, J u> by float64 central differences against <vjp(v), u>.

    The step is relative (``1e-7 |x|``, or ``1e-7`` at 0) so tiny points do not
    cross 0 and large ones are not lost to rounding; the effective direction
    is ``xp - xm`` as actually rounded.  The tolerance is ``rtol`` of the terms'
    magnitudes plus the rounding noise of the forward values themselves.
    """
    xs, diff, f0, vs, xp, xm, fp, fm = _central_steps(case, xs, seed)
    cts = run_vjp(case, xs, vs)
    assert len(cts) == len(diff)
    for ct, i in zip(cts, diff):
        assert ct.shape == xs[i].shape, (case.name, i, ct.shape, xs[i].shape)
    assert all(np.all(np.isfinite(c)) for c in cts), (case.name, xs, cts)
    lhs = sum(np.vdot(v, a - b) for v, a, b in zip(vs, fp, fm))
    rhs = sum(np.vdot(ct, xp[i] - xm[i]) for ct, i in zip(cts, diff))
    scale = (sum(np.vdot(np.abs(v), np.abs(a - b)) for v, a, b in zip(vs, fp, fm))
             + sum(np.vdot(np.abs(ct), np.abs(xp[i] - xm[i])) for ct, i in zip(cts, diff)))
    noise = 16 * EPS64 * sum(np.vdot(np.abs(v), np.abs(a) + np.abs(b))
                             for v, a, b in zip(vs, fp, fm))
    tiny = 1e-300          # subnormal results carry absolute, not relative, precision
    assert abs(lhs - rhs) <= rtol * scale + noise + tiny, (
        f"{case.name}: <v, fd> = {lhs!r} but <vjp(v), u> = {rhs!r} at {xs}")


def check_jvp_fd(case: Case, xs, seed: int = 0, rtol: float = 1e-6) -> None:
    """Forward mode against float64 central differences, as :func:`check_vjp_fd`:
    the same relative steps ``xp - xm`` (the direction as rounded), projected on a
    random ``v``: ``<v, f(xp) - f(xm)>`` against ``<v, jvp(x, xp - xm)>``.  Also the
    primal outputs of ``jvp`` against the forward pass, and the adjoint identity
    ``<v, J t> = <vjp(v), t>`` with the VJP (to rounding)."""
    xs, diff, f0, vs, xp, xm, fp, fm = _central_steps(case, xs, seed)
    ts = [xp[i] - xm[i] for i in diff]
    res = run_jvp(case, xs, ts)
    outs, tans = res[:len(f0)], res[len(f0):]
    assert len(tans) == len(f0), case.name
    for o, y, jt in zip(outs, f0, tans):
        np.testing.assert_array_equal(o, y, err_msg=f"{case.name}: jvp's primal output")
        assert jt.shape == y.shape, (case.name, jt.shape, y.shape)
    assert all(np.all(np.isfinite(t)) for t in tans), (case.name, xs, tans)
    lhs = sum(np.vdot(v, a - b) for v, a, b in zip(vs, fp, fm))
    rhs = sum(np.vdot(v, jt) for v, jt in zip(vs, tans))
    scale = sum(np.vdot(np.abs(v), np.abs(a - b) + np.abs(jt))
                for v, a, b, jt in zip(vs, fp, fm, tans))
    noise = 16 * EPS64 * sum(np.vdot(np.abs(v), np.abs(a) + np.abs(b))
                             for v, a, b in zip(vs, fp, fm))
    assert abs(lhs - rhs) <= rtol * scale + noise + 1e-300, (
        f"{case.name}: <v, fd> = {lhs!r} but <v, jvp(t)> = {rhs!r} at {xs}")
    cts = run_vjp(case, xs, vs)
    adj = sum(np.vdot(ct, t) for ct, t in zip(cts, ts))
    size = sum(np.vdot(np.abs(v), np.abs(jt)) for v, jt in zip(vs, tans)) + \
        sum(np.vdot(np.abs(ct), np.abs(t)) for ct, t in zip(cts, ts))
    assert abs(rhs - adj) <= 1e-12 * size + 1e-300, (
        f"{case.name}: <v, jvp(t)> = {rhs!r} but <vjp(v), t> = {adj!r} at {xs}")


# ---- (0) the table covers the registry ------------------------------------------

@pytest.mark.parametrize("prim", [p for p in PRIMITIVES.values() if p.name not in SOURCES],
                         ids=attrgetter("name"))
def test_every_primitive_has_a_case(prim) -> None:
    """Every primitive with operands (not param and const) is exercised by a case."""
    users = [c for c in CASES if prim.name in c.prims]
    assert users, f"no test case exercises primitive '{prim.name}'; add one to CASES"
    if prim.kind == "decomposed":       # never a node: each case spells it
        assert all(f"{prim.name}(" in c.body for c in users), prim.name
        return
    # the claim is checked: some graph of some case holds the primitive
    seen = set()
    for c in users:
        cop = compiled(c.name)
        for g in [cop.primal] + [m.graph for m in cop.methods.values()]:
            seen.update(n.op for n in g)
    assert prim.name in seen, f"'{prim.name}' appears in no graph of {[c.name for c in users]}"


def test_every_backend_lowers_every_primitive() -> None:
    """The registry walked through every backend: the module of every case (so of
    every primitive, by the test above) renders for the CPU, CUDA and Dask (each
    printer raises CodegenError for a primitive it cannot lower, at compile time, not
    at call time), and every method graph lowers to JAX and PyTorch operations."""
    from gradc.adapters.framework_lowering import jax_framework, lower_graph, torch_framework
    text = gradc.compile_source(_module_source(), file="primitives.grad", target="all")
    assert "CUDA_KERNELS" in text and "_gd_sum(" in text
    frameworks = [jax_framework()]
    try:
        import torch  # noqa: F401
        frameworks.append(torch_framework())
    except ImportError:
        pass
    for c in CASES:
        for method in compiled(c.name).methods.values():
            g = method.graph
            for fw in frameworks:
                lower_graph(g, g.params, g.outputs, fw, np.float64)


@pytest.mark.parametrize("prim", [p for p in PRIMITIVES.values() if p.name not in SOURCES],
                         ids=attrgetter("name"))
def test_registry_entry_is_consistent(prim) -> None:
    if prim.kind == "decomposed":       # its decomposition is its lowering and derivative
        assert prim.ref is not None and prim.decomposition is not None and prim.public
        assert not (prim.vjp or prim.jvp or prim.cpu or prim.lib), prim.name
        return
    assert len(prim.vjp) == len(prim.params), prim.name
    assert prim.differentiable == any(r is not None for r in prim.vjp), prim.name
    assert prim.ref is not None, prim.name
    if prim.kind == ELEMENTWISE:
        assert prim.cpu is not None, f"'{prim.name}' has no cpu template"
    else:
        assert prim.lib is not None, f"'{prim.name}' has no library call"
    assert prim.domain in (REAL, POSITIVE, UNIT, NONZERO, ABOVE_ONE), prim.name


@pytest.mark.parametrize("case", CASES, ids=attrgetter("name"))
def test_graphs_verify_after_every_pass(case) -> None:
    program = _program()
    build_op(program.ops[case.name], program.ops, program.consts, check=True)


# ---- (a) rule strings parse and name only the rule scope --------------------------

def _free_names(e: ast.Expr) -> tuple[set[str], set[str], set[str]]:
    """(names read, functions called, keyword names) of a rule expression."""
    names, funcs, kws = set(), set(), set()

    def walk(e):
        match e:
            case ast.Name(id=i):
                names.add(i)
            case ast.Num():
                pass
            case ast.BinOp(lhs=a, rhs=b) | ast.Compare(lhs=a, rhs=b):
                walk(a), walk(b)
            case ast.Neg(operand=a) | ast.Transpose(operand=a):
                walk(a)
            case ast.TupleExpr(items=items):
                for i in items:
                    walk(i)
            case ast.Call(func=f, args=args, kwargs=kwargs):
                funcs.add(f)
                for a in args:
                    walk(a)
                for k, v in kwargs:
                    kws.add(k)
                    walk(v)
            case _:
                raise AssertionError(f"unexpected node {e!r}")
    walk(e)
    return names, funcs, kws


RULES = [(p, i, r) for p in PRIMITIVES.values() for i, r in enumerate(p.vjp)
         if r is not None and r != COMPOSITE]


@pytest.mark.parametrize("prim, i, rule", RULES,
                         ids=[f"{p.name}-{p.params[i]}" for p, i, _ in RULES])
def test_vjp_rule_parses_and_names_only_its_scope(prim, i, rule) -> None:
    names, funcs, kws = _free_names(rule_ast(rule))
    allowed = set(prim.params) | {"out", "g"} | set(CONSTANTS)
    if prim.kind == REDUCTION:
        allowed |= {"axis", "keepdims"}
    allowed |= set(prim.attrs)
    assert names <= allowed, f"'{prim.name}' rule {rule!r} names {names - allowed}"
    callable_ = set(BUILTINS) | set(PRIMITIVES)
    assert funcs <= callable_, f"'{prim.name}' rule {rule!r} calls {funcs - callable_}"
    assert "grad" not in funcs, prim.name
    assert kws <= _keywords(prim, funcs), f"'{prim.name}' rule {rule!r} passes {kws}"


def _keywords(prim, funcs) -> set[str]:
    """The keywords a rule of ``prim`` may pass: ``prim``'s attributes (``axis=axis``) and
    those of the primitives it calls (concat's VJP: ``concat_part(g, x, part=0)``)."""
    return {"axis", "keepdims", *prim.attrs,
            *(a for f in funcs if f in PRIMITIVES for a in PRIMITIVES[f].attrs)}


JVPS = [(p, i, r) for p in PRIMITIVES.values() for i, r in enumerate(p.jvp) if r is not None]


@pytest.mark.parametrize("prim", [p for p in PRIMITIVES.values() if p.name not in SOURCES],
                         ids=attrgetter("name"))
def test_every_differentiable_operand_has_a_jvp_rule(prim) -> None:
    """One forward rule per operand that has a reverse rule, and none where no
    gradient flows (an index, a shape source, data); a decomposed builtin has none."""
    if prim.kind == "decomposed":
        return
    assert len(prim.jvp) == len(prim.params), prim.name
    for i, (fwd, rev) in enumerate(zip(prim.jvp, prim.vjp)):
        assert (fwd is None) == (rev is None), f"'{prim.name}' operand {prim.params[i]}"


@pytest.mark.parametrize("prim, i, rule", JVPS, ids=[f"{p.name}-{p.params[i]}" for p, i, _ in JVPS])
def test_jvp_rule_parses_and_names_only_its_scope(prim, i, rule) -> None:
    """A rule names the operands, ``out``, its own operand's tangent (only that one:
    the engine sums the operands' contributions) and a reduction's attributes."""
    names, funcs, kws = _free_names(rule_ast(rule))
    allowed = set(prim.params) | {f"{prim.params[i]}_t", "out"} | set(CONSTANTS)
    if prim.kind == REDUCTION or prim.name == "broadcast_in":
        allowed |= {"axis", "keepdims"}
    allowed |= set(prim.attrs)
    assert names <= allowed, f"'{prim.name}' jvp {rule!r} names {names - allowed}"
    assert f"{prim.params[i]}_t" in names, f"'{prim.name}' jvp {rule!r} ignores its tangent"
    assert funcs <= set(BUILTINS) | set(PRIMITIVES), prim.name
    assert kws <= _keywords(prim, funcs), f"'{prim.name}' jvp {rule!r} passes {kws}"


DECOMPOSED = [p for p in PRIMITIVES.values() if p.decomposition is not None]


@pytest.mark.parametrize("prim", DECOMPOSED, ids=attrgetter("name"))
def test_decomposition_parses_and_names_only_its_scope(prim) -> None:
    """A decomposition reads the operands, the attributes and its own earlier names,
    assigns ``out`` last, and does not call the primitive it stands for."""
    stmts = parse_statements(prim.decomposition)
    assert stmts[-1].target == "out", prim.name
    known = set(prim.params) | set(CONSTANTS) | set(prim.attrs) | {"axis", "keepdims", "true",
                                                                    "false"}
    known |= {"seed", "offset", "stream"} if prim.draws else set()
    for s in stmts:
        names, funcs, _ = _free_names(s.value)
        assert names <= known, f"'{prim.name}' decomposition names {names - known}"
        assert funcs <= set(BUILTINS) | set(PRIMITIVES) and prim.name not in funcs, prim.name
        known.add(s.target)


@pytest.mark.parametrize("call", ["softmax(x, axis=2)", "log_softmax(x, axis=-3)"])
def test_a_builtin_whose_steps_do_not_fit_names_itself(call) -> None:
    """A decomposed builtin's error names the builtin written, not the primitive of the
    step that failed (softmax's max)."""
    name = call.split("(")[0]
    with pytest.raises(gradc.GradcError) as err:
        gradc.compile_source(f"op f(x: [n, m]) -> y {{\n    y = {call}\n}}\n", file="f.grad")
    text = str(err.value)
    assert f"f.grad:2:9: error[E301]: shapes (n, m) do not fit '{name}': " in text, text
    assert "out of bounds for array of dimension 2" in text and "'max'" not in text, text


_ONE_AXIS = ["cumsum(x, axis=2)", "cumprod(x, axis=-3)", "argmax(x, axis=2)",
             "argmin(x, axis=-3, keepdims=true)", "sort(x, axis=2)", "argsort(x, axis=-3)",
             "topk(x, 1, axis=2)", "take(x, arange(2), axis=2)",
             "take_along_axis(x, argsort(x, axis=1), axis=-3)"]


@pytest.mark.parametrize("call", _ONE_AXIS)
def test_an_axis_out_of_range_is_a_compile_error(call) -> None:
    """Builtins along one axis check it where the rank is known (E301 with a caret),
    as the reductions do: argmax's crashed the compiler, a scan's failed at call time."""
    name = call.split("(")[0]
    with pytest.raises(gradc.GradcError) as err:
        gradc.compile_source(f"op f(x: [n, m]) -> y {{\n    y = {call}\n}}\n", file="f.grad")
    text = str(err.value)
    assert "f.grad:2:9: error[E301]: shapes (n, m)" in text and f"'{name}'" in text, text
    assert "out of bounds for array of dimension 2" in text and "^" in text, text


@pytest.mark.parametrize("call", ["cumsum(x, axis=(1, 0))", "cumprod(x, axis=(1, 0))",
                                  "cumsum(x, axis=())", "argmax(x, axis=(0, 1))",
                                  "sort(x, axis=(0, 1))"])
@pytest.mark.parametrize("sig", ["x", "x: [n, m]"])
def test_a_tuple_of_axes_is_refused_where_one_axis_is_taken(call, sig) -> None:
    """cumsum(x, axis=(1, 0)) ran along axis 1 alone (a silent wrong answer); NumPy
    refuses a tuple there, and so does gradc, at compile time, whatever it knows of x."""
    with pytest.raises(gradc.GradcError) as err:
        gradc.compile_source(f"op f({sig}) -> y {{\n    y = {call}\n}}\n", file="f.grad")
    text = str(err.value)
    assert "error[E301]" in text and "take one axis (NumPy's), got (" in text, text
    assert "⊔" not in text, text                # no IR notation in a user's error


def test_composite_rules_have_composites() -> None:
    from gradc.autodiff.rules import COMPOSITES
    for p in PRIMITIVES.values():
        if COMPOSITE in p.vjp:
            assert p.name in COMPOSITES, p.name


# ---- (b) VJP against central differences ------------------------------------------

_CHECKS = {"vjp": check_vjp_fd, "jvp": check_jvp_fd}


# Cases declared float32 only are differenced through their float64 variant.
_F64_CASES = [c for c in DIFF_CASES if not ("f32" in c.dtypes and "f64" not in c.dtypes)]


@pytest.mark.parametrize("mode", list(_CHECKS))
@pytest.mark.parametrize("case", _F64_CASES, ids=attrgetter("name"))
# 10 drawn examples per primitive and mode (the edge points below are checked apart):
# each runs the interpreter's VJP/JVP and its differences, ~0.1 s
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@pytest.mark.slow
@given(data=st.data())
def test_derivative_matches_central_differences(case, mode, data) -> None:
    """Reverse mode (``vjp``) and forward mode (``jvp``) of every primitive."""
    xs = _draw_inputs(case, data)
    if case.kink is not None:
        assume(case.kink(*xs))
    _CHECKS[mode](case, xs, seed=data.draw(st.integers(0, 2**16)))


def _a(*v):
    return np.array(v, dtype=np.float64)


# Edge points where the derivative is defined: 0, negative, large (1e3 .. 1e4 where
# the function is finite), tiny (1e-30).  One tuple of arrays per point set.
_BIG = _a(1e3, -1e3, 1e4, -1e4)
_UNARY_EDGES = {
    "neg": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "abs": _a(-2.5, 1e3, -1e4, 1e-30, -1e-30, 3),
    "exp": _a(0, -2.5, -1e3, 700, 1e-30, -1e-30),
    "exp2": _a(0, -2.5, -1e3, 1e3, 1e-30, -1e-30),
    "expm1": _a(0, -2.5, -1e3, 700, 1e-30, -1e-30),
    "log": _a(1e-30, 0.5, 1e3, 1e4, 2.5, 1e300),
    "log2": _a(1e-30, 0.5, 1e3, 1e4, 2.5, 1e300),
    "log10": _a(1e-30, 0.5, 1e3, 1e4, 2.5, 1e300),
    "log1p": _a(0, -0.5, 1e-30, -1e-30, 1e3, 1e4),
    "sqrt": _a(1e-30, 0.5, 1e3, 1e4, 2.5, 1e300),
    "rsqrt": _a(1e-30, 0.5, 1e3, 1e4, 2.5, 1e300),
    "square": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "reciprocal": _a(-2.5, 1e3, -1e4, 1e-30, -1e-30, 0.5),
    "sin": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "cos": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "tan": _a(0, -1.2, 1e3, -1e4, 1e-30, -1e-30),
    "asin": _a(0, -0.5, 0.999, -0.999, 1e-30, -1e-30),
    "acos": _a(0, -0.5, 0.999, -0.999, 1e-30, -1e-30),
    "atan": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "sinh": _a(0, -2.5, 700, -700, 1e-30, -1e-30),
    "cosh": _a(0, -2.5, 700, -700, 1e-30, -1e-30),
    "tanh": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "sigmoid": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "softplus": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "erf": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
    "erfc": _a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30),
}
_BINARY_EDGES = {   # (x, y) columns
    "add": (_a(0, -2.5, 1e3, 1e-30, -1e4), _a(-2.5, 0, 1e4, 1e-30, 1e-30)),
    "sub": (_a(0, -2.5, 1e3, 1e-30, -1e4), _a(-2.5, 0, 1e4, 1e-30, 1e-30)),
    "mul": (_a(0, -2.5, 1e3, 1e-30, -1e4), _a(-2.5, 0, 1e4, 1e-30, 1e-30)),
    "div": (_a(0, -2.5, 1e3, 1e-30, -1e4), _a(-2.5, 1e-30, 1e4, 1e-30, -1e3)),
    "pow": (_a(1e-30, 2.5, 1e3, 1e4, 0.5), _a(2, -1.5, 3, 0.5, 1e-30)),
    "maximum": (_a(0, -2.5, 1e3, 1e-30, -1e4), _a(-2.5, 0, 1e4, -1e-30, 1e-30)),
    "minimum": (_a(0, -2.5, 1e3, 1e-30, -1e4), _a(-2.5, 0, 1e4, -1e-30, 1e-30)),
    "atan2": (_a(0, -2.5, 1e3, 1e-30, -1e4), _a(2.5, 1e-30, -1e4, 1e-30, 0.5)),
}
_EDGES: dict[str, list[tuple[np.ndarray, ...]]] = {
    **{f"p_{k}": [(v,)] for k, v in _UNARY_EDGES.items()},
    **{f"p_{k}": [v] for k, v in _BINARY_EDGES.items()},
    "p_where": [(_a(0, 1, 1, 0, 1), _a(0, -2.5, 1e4, 1e-30, -1e3), _a(1e3, 0, -1e4, 5, 1e-30))],
    "p_clip": [(_a(0, -1e4, 1e3, 1e-30, -2.5), _a(-1, -1, -1, 0.5e-30, -3), _a(1, 1, 1, 2, 0))],
    "p_full_like": [(_a(0, 1, 2), _a(0, 1e4, -1e-30))],
    "p_sum": [(_a(0, -2.5, 1e3, 1e-30, -1e4),)],
    "p_mean": [(_a(0, -2.5, 1e3, 1e-30, -1e4),)],
    "p_prod": [(_a(-2.5, 1e3, 1e-30, -1e4),), (_a(1e-30, 1e-30, 1e4, 1e4),)],
    "p_max": [(_a(0, -2.5, 1e3, 1e-30, -1e4),), (_a(1e-30, -1e-30, 5e-31),)],
    "p_min": [(_a(0, -2.5, 1e3, 1e-30, -1e4),), (_a(1e-30, -1e-30, 5e-31),)],
    "p_logsumexp": [(_a(0, -2.5, 1e3, 1e-30, -1e4),), (_a(-1e4, -1e4 + 1),)],
    "p_norm": [(_a(0, -2.5, 1e3, 1e-30, -1e4),), (_a(1e-30, -1e-30),), (_a(1e200, 1e200),)],
    "p_matmul_22_f64": [(np.array([[0, 1e3, 1e-30], [-2.5, 0, 1e4]]),
                         np.array([[1, 0, -1e3, 1e-30], [2, 0, 0, 1], [0, 1, 1, 1]]))],
    # batched: huge and tiny, an empty batch, an empty contracted dim (the product zeros)
    "p_matmul_b3": [(np.array([[[0, 1e3, 1e-30], [-2.5, 0, 1e4]]] * 2),
                     np.array([[[1, 0], [-1e3, 1e-30], [2, 0]]] * 2)),
                    (np.zeros((0, 2, 3)), np.zeros((0, 3, 2))),
                    (np.zeros((2, 2, 0)), np.zeros((2, 0, 2)))],
    "p_matmul_bc": [(np.zeros((1, 0, 2, 3)), np.ones((2, 1, 3, 2))),
                    (np.ones((1, 2, 2, 0)), np.ones((2, 1, 0, 2)))],
    "p_matmul_1b": [(np.zeros(0), np.zeros((2, 0, 2)))],
    "p_matmul_b1": [(np.ones((0, 2, 3)), np.ones(3))],
    "p_transpose": [(np.array([[0, 1e3, 1e-30], [-2.5, 0, 1e4]]),)],
    "i_sum_to_outer": [(np.array([[0.0], [1e4]]), np.array([[1e-30, -2.5, 1e3]]))],
    # huge and tiny neighbours (1e4 + 1e-30 rounds), and an empty axis
    "p_one_hot": [(np.array([[0, -2.5, 1e3], [1e-30, -1e4, 0], [1, 2, 3], [0, 0, 0]]),
                   np.array([0, 2, 1, 2]))],
    "p_cumsum": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, 0]]),),
                 (np.zeros((2, 0)),)],
    # layout: empty axes; gathers: negative indices, duplicates, empty index arrays
    "p_reshape": [(np.arange(12.0).reshape(3, 4) - 5,), (np.zeros((0, 4)),)],
    "p_expand_dims": [(np.zeros((0, 4)),)],
    "p_squeeze": [(np.array([[[1e3], [-1e-30], [0], [-2.5]]]),)],
    "p_broadcast_to": [(np.array([[0], [1e3], [-2.5]]),)],
    "p_permute_dims": [(np.zeros((2, 0, 4)),)],
    "p_swapaxes": [(np.zeros((2, 0, 4)),)],
    "p_take": [(np.arange(12.0).reshape(3, 4), np.array([-1, -4, 3, 3, 0])),
               (np.zeros((3, 4)), np.zeros(0, int)), (np.zeros((0, 4)), np.array([1, -1]))],
    "p_take_along_axis": [(np.arange(12.0).reshape(3, 4), np.array([[-1, 0, 2, -3]] * 5)),
                          (np.zeros((3, 4)), np.zeros((0, 4), int))],
    # no ties here (a tie's index may change under the steps): test_index_reductions
    "p_argmax": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, 0], [1, 2, 3, 4]]),)],
    "p_argmin": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-31, 1e4, 1]]),)],
    "p_argmax_flat": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-31, 1e4, 1]]),)],
    # sorting: huge, tiny, signed zeros (distinct values: a tie's permutation may change
    # under the steps; ties, NaN and infinities are tested in test_sorting.py), empty axes
    # (0 and 1e-30 never share a line: the step at 0 is absolute, so they would swap)
    "p_argsort": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, -1e-30],
                             [1, 2, 3, 4]]),)],
    "p_sort": [(np.array([[0, -2.5, 1e3, -1e4], [-1e4, 1e-30, 1e4, -1e-30], [4, 3, 2, 1]]),),
               (np.zeros((3, 0)),)],
    "p_topk": [(np.array([[0, -2.5, 1e3, -1e4], [-1e4, 1e-30, 1e4, -1e-30], [4, 3, 2, 1]]),),
               (np.zeros((0, 4)),)],
    "p_topk_none": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, -1e-30]]),)],
    # zeros among the factors (one, two, leading, trailing), huge and tiny, an empty axis
    "p_cumprod": [(np.array([[0, -2.5, 3, 1e-30], [2, 0, 0, 1.5], [1e3, -1e3, 1e-3, 0]]),),
                  (np.zeros((2, 0)),)],
    "p_cumprod_a0r": [(np.array([[0, -2.5, 3, 1e-30], [2, 0, 0, 1.5], [1e3, -1e3, 1e-3, 0]]),)],
    "i_cumprod_second": [(np.array([[0, -2.5, 3, 1e-30], [2, 0, 0, 1.5]]),)],
    # indexing: huge and tiny values move unchanged; empty axes
    "p_slice": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, 0], [1, 2, 3, 4]]),),
                (np.zeros((3, 0)),)],
    "p_concat": [(np.array([[0, -2.5, 1e3], [-1e4, 1e-30, 1e4]]), np.array([[1e-30, 3],
                                                                             [-1e3, 0]])),
                 (np.zeros((0, 3)), np.zeros((0, 2)))],
    "p_relu": [(_a(-2.5, 1e3, -1e4, 1e-30, -1e-30, 3),)],
    "p_random_uniform_like": [(np.array([[0, -2.5, 1e3, 1e-30]] * 3), _a(1e4, -1e-30, 0, 2)),
                              (np.zeros((0, 4)), _a(1, 2, 3, 4))],
    "p_random_normal_like": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, 0]]),)],
    "p_log_sigmoid": [(_a(0, -2.5, 1e3, -1e4, 1e-30, -1e-30, 40, -40),)],
    # huge, tiny and tied logits, a slice of one element, an empty axis
    "p_softmax": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, 0], [1, 1, 1, 1]]),),
                  (np.array([[3.0], [-1e4]]),), (np.zeros((2, 0)),)],
    "p_log_softmax": [(np.array([[0, -2.5, 1e3, 1e-30], [-1e4, 1e-30, 1e4, 0], [1, 1, 1, 1]]),),
                      (np.array([[3.0], [-1e4]]),), (np.zeros((2, 0)),)],
}
EDGE_PARAMS = [pytest.param(BY_NAME[name], k, id=f"{name}-{k}")
               for name, points in _EDGES.items() for k in range(len(points))]


@pytest.mark.parametrize("mode", list(_CHECKS))
@pytest.mark.parametrize("case, k", EDGE_PARAMS)
def test_derivative_matches_central_differences_at_edges(case, k, mode) -> None:
    _CHECKS[mode](case, _EDGES[case.name][k], seed=k)


def test_edge_table_covers_every_differentiable_primitive_case() -> None:
    for c in DIFF_CASES:
        if c.name == f"p_{c.prims[0]}":
            assert c.name in _EDGES, f"no edge points for {c.name}"


# ---- (c) kinks and ties (SPEC §1; choices documented in gradc.ir.primitives) -------

def _vjp_everywhere(gen, name: str, xs, vs=None):
    """The VJP by the interpreter (float64) and by the generated module (fused and
    unfused, float64 and float32): a list of (label, grads)."""
    case = BY_NAME[name]
    xs = [np.asarray(x, dtype=np.int32 if i in case.ints else np.float64)
          for i, x in enumerate(xs)]
    if vs is None:
        vs = [np.ones(np.shape(o)) for o in run_forward(case, xs)]
    out = [("interpret", run_vjp(case, xs, vs))]
    op = getattr(gen, name)
    for dt in (np.float64, np.float32):
        cx = [x if i in case.ints else x.astype(dt) for i, x in enumerate(xs)]
        cv = [np.asarray(v, dtype=dt) for v in vs]
        out.append((f"fused-{dt.__name__}", op.vjp(*cx, *cv)))
        out.append((f"unfused-{dt.__name__}", op.unfused.vjp(*cx, *cv)))
    return out


def assert_grads(gen, name, xs, expected, vs=None) -> None:
    for label, grads in _vjp_everywhere(gen, name, xs, vs):
        assert len(grads) == len(expected), (name, label)
        for k, (got, want) in enumerate(zip(grads, expected)):
            np.testing.assert_allclose(got, np.asarray(want, dtype=np.float64), rtol=1e-6,
                                       atol=0, err_msg=f"{name} grad {k} ({label})")


def test_sign_has_zero_derivative(gen) -> None:
    assert_grads(gen, "p_sign", [_a(-2, 0, 3, -1e-30)], [_a(0, 0, 0, 0)])


def test_abs_derivative_is_zero_at_zero(gen) -> None:
    assert_grads(gen, "p_abs", [_a(-2, 0, 3, -0.0)], [_a(-1, 0, 1, 0)])


@pytest.mark.parametrize("name", ["p_maximum", "p_minimum"])
def test_elementwise_max_min_split_a_tie(gen, name) -> None:
    x, y = _a(1, 0, 2, -3), _a(1, 0, -2, 5)
    big = 1.0 if name == "p_maximum" else 0.0
    assert_grads(gen, name, [x, y], [_a(0.5, 0.5, big, 1 - big), _a(0.5, 0.5, 1 - big, big)])


@pytest.mark.parametrize("name, x, dx", [
    ("p_max", _a(3, 1, 3, 2), _a(0.5, 0, 0.5, 0)),
    ("p_max", _a(7, 7, 7), _a(1, 1, 1) / 3),
    ("p_min_a0k", [[1, 1, 5], [4, 1, 2]], [[1, 0.5, 0], [0, 0.5, 1]]),
    ("p_max_a1", [[1, 4, 4, 0], [2, 2, 2, 2], [-1, 0, -5, -1]],
     [[0, 0.5, 0.5, 0], [0.25] * 4, [0, 1, 0, 0]]),
    ("p_max_ak", [[2, 2], [1, 2]], [[1 / 3, 1 / 3], [0, 1 / 3]]),
    # a NaN in a slice: NaN to its every element (as JAX and torch.amax)
    ("p_max_a1", [[1, np.nan, 3], [1, 2, 3]], [[np.nan] * 3, [0, 0, 1]]),
    ("p_min_a0k", [[1, np.nan, 5], [4, 1, 2]], [[1, np.nan, 0], [0, np.nan, 1]]),
])
def test_reduction_max_min_split_evenly_among_ties(gen, name, x, dx) -> None:
    assert_grads(gen, name, [np.asarray(x, dtype=np.float64)], [dx])


@pytest.mark.parametrize("name", ["p_lt", "p_le", "p_gt", "p_ge", "p_eq", "p_ne"])
def test_comparisons_have_zero_derivative(gen, name) -> None:
    x, y = _a(1, 2, 3, 0), _a(1, 3, -1, 0)
    assert_grads(gen, name, [x, y], [np.zeros(4), np.zeros(4)])


@pytest.mark.parametrize("name", ["p_floor", "p_ceil", "p_round", "p_stop_gradient"])
def test_piecewise_constant_ops_have_zero_derivative(gen, name) -> None:
    assert_grads(gen, name, [_a(-1.5, 0, 0.5, 2.7)], [np.zeros(4)])


def test_clip_passes_the_gradient_on_the_closed_interval(gen) -> None:
    # x at lo, inside, at hi, below, above
    x, lo, hi = _a(-1, 0.5, 1, -2, 3), _a(-1, -1, -1, -1, -1), _a(1, 1, 1, 1, 1)
    assert_grads(gen, "p_clip", [x, lo, hi],
                 [_a(1, 1, 1, 0, 0), _a(0, 0, 0, 1, 0), _a(0, 0, 0, 0, 1)])


@pytest.mark.parametrize("name, x, dx", [
    ("p_norm", np.zeros(3), np.zeros(3)),
    ("p_norm_a1", [[0, 0, 0, 0], [3, 4, 0, 0], [0, 0, 0, 0]],
     [[0, 0, 0, 0], [0.6, 0.8, 0, 0], [0, 0, 0, 0]]),
])
def test_norm_has_gradient_zero_at_zero(gen, name, x, dx) -> None:
    assert_grads(gen, name, [np.asarray(x, dtype=np.float64)], [dx])


def test_pow_at_zero_base(gen) -> None:
    # d/dx x^y = y x^(y-1), d/dy = x^y log x, taken as 0 where x = 0: (0, 1) -> (1, 0)
    assert_grads(gen, "p_pow", [_a(0, 0, 2), _a(1, 2, 3)], [_a(1, 0, 12), _a(0, 0, 8 * np.log(2))])


def test_pow_negative_base_integer_exponent(gen) -> None:
    # (-2)^3: d/dx = 3 * (-2)^2 = 12; d/dy is not real, taken as 0 (no NaN)
    assert_grads(gen, "p_pow", [_a(-2, -1), _a(3, 2)], [_a(12, -2), _a(0, 0)])


def test_zero_masked_is_zero_only_for_a_zero_scale_and_a_nan_value(gen) -> None:
    """``zero_masked(x, u)``: 0 where u == 0 and x is NaN, else x (-0.0 and inf kept)."""
    ref = PRIMITIVES["zero_masked"].ref
    x, u = _a(np.nan, np.nan, 1, np.inf, -0.0, np.nan), _a(0, 1, 0, 0, 0, -0.0)
    got = ref(x, u)
    np.testing.assert_array_equal(got, _a(0, np.nan, 1, np.inf, -0.0, 0))
    assert np.signbit(got[4]) and not np.signbit(got[5])
    # sqrt's VJP dy * 0.5 / sqrt(x): a zero dy gives 0 at x = 0 (0 * inf) and at a NaN
    # sqrt (x = -1); a nonzero dy gives inf and NaN there, the true values
    assert_grads(gen, "p_sqrt", [_a(0, 0, -1, -1, 4)], [_a(0, np.inf, 0, np.nan, 0.5)],
                 vs=[_a(0, 1, 0, 1, 2)])


# Derived gradients must be finite where the forward value is (SPEC §1): the unused
# branch of where() must not leak NaN or inf, and prod() is differentiable at 0.
SAFETY_SOURCE = """
op s_where_sqrt(x) -> r { r = where(x > 0, sqrt(x), 0) }
op s_where_log(x) -> r { r = where(x > 0, log(x), 0) }
op s_where_recip(x) -> r { r = where(x != 0, 1 / x, 0) }
op s_prod(x) -> r { r = prod(x) }
op s_pow00(x, y) -> r { r = x ^ y }
"""
_SAFETY = [
    ("s_where_sqrt", [_a(-1, 0, 4)], [_a(0, 0, 0.25)]),
    ("s_where_log", [_a(-1, 0, 4)], [_a(0, 0, 0.25)]),
    ("s_where_recip", [_a(0, 2)], [_a(0, -0.25)]),
    ("s_prod", [_a(0, 2, 3)], [_a(6, 0, 0)]),
    ("s_pow00", [_a(0, 0), _a(0, 1)], [_a(0, 1), _a(0, 0)]),
]


@lru_cache(maxsize=None)
def _safety_program():
    return check_source(SAFETY_SOURCE, "safety.grad")


@pytest.mark.parametrize("name, xs, want", _SAFETY, ids=[s[0] for s in _SAFETY])
def test_derived_gradients_are_finite_where_the_forward_is(name, xs, want) -> None:
    program = _safety_program()
    cop = build_op(program.ops[name], program.ops, program.consts)
    f = interpret(cop.methods["forward"].graph, xs)
    assert all(np.all(np.isfinite(o)) for o in f)
    grads = interpret(cop.methods["vjp"].graph, xs + [np.ones_like(o) for o in f])
    for got, w in zip(grads, want):
        np.testing.assert_allclose(got, w, rtol=1e-12, err_msg=name)


# ---- (d) generated kernels against the interpreter ---------------------------------

_DTYPES = {"f64": np.float64, "f32": np.float32}
COMPILED_PARAMS = [pytest.param(c, dt, id=f"{c.name}-{dt}") for c in CASES for dt in c.dtypes]


def _tol(dt):
    """Element by element: the kernels evaluate the references' formulas in the same
    order, so only libm differences (float32: a few ulp) remain."""
    return dict(rtol=1e-12, atol=1e-300) if dt == np.float64 else dict(rtol=2e-5, atol=1e-30)


def _close(got, want, dt, what) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if got.dtype.kind == "f":
        assert got.dtype == dt, f"{what}: dtype {got.dtype}, expected {np.dtype(dt)}"
    np.testing.assert_allclose(got, want, **_tol(dt), err_msg=what)


@pytest.mark.parametrize("case, dtname", COMPILED_PARAMS)
def test_kernels_match_the_interpreter(gen, case, dtname) -> None:
    dt = _DTYPES[dtname]
    points = [_fixed_inputs(case, 1)] + list(_EDGES.get(case.name, []))
    op = getattr(gen, case.name)
    for xs in points:
        with np.errstate(over="ignore"):        # 1e300 is inf in float32: still compared
            xs = [np.asarray(x, dtype=np.int32 if i in case.ints else dt)
                  for i, x in enumerate(xs)]
        ref = run_forward(case, xs, dt)
        kw = {"seed": 0} if compiled(case.name).draws else {}   # the interpreter's
        rng = np.random.default_rng(2)
        vs = [rng.standard_normal(np.shape(o)).astype(dt) for o in ref]
        gref = run_vjp(case, xs, vs, dt)
        ts = [rng.standard_normal(np.shape(xs[i])).astype(dt) for i in diff_params(case)]
        jref = run_jvp(case, xs, ts, dt)
        with np.errstate(all="ignore"):
            results = {
                "forward": (op(*xs, **kw), op.unfused(*xs, **kw)),
                "vjp": (op.vjp(*xs, *vs, **kw), op.unfused.vjp(*xs, *vs, **kw)),
                # the fused fwd_bwd kernel is one more compilation per op and dtype:
                # float64 only, to keep the suite's compile time in budget
                "fwd_bwd": ((op.fwd_bwd(*xs, *vs, **kw) if dt == np.float64 else None),
                            op.unfused.fwd_bwd(*xs, *vs, **kw)),
                "jvp": ((op.jvp(*xs, *ts, **kw) if dt == np.float64 else None),
                        op.unfused.jvp(*xs, *ts, **kw)),
            }
        for variant, k in (("fused", 0), ("unfused", 1)):
            _close(results["forward"][k], ref[0], dt, f"{case.name} forward {variant}")
            for j, (got, want) in enumerate(zip(results["vjp"][k], gref)):
                _close(got, want, dt, f"{case.name} vjp {variant} grad {j}")
            for method, want in (("fwd_bwd", ref + gref), ("jvp", jref)):
                got = results[method][k]
                if got is None:
                    continue
                assert len(got) == len(want), (case.name, method)
                for j, (g, w) in enumerate(zip(got, want)):
                    _close(g, w, dt, f"{case.name} {method} {variant} result {j}")


def test_clip_kernel_matches_the_reference_when_lo_exceeds_hi(gen) -> None:
    x, lo, hi = _a(0, 5, -5), np.full(3, 1.0), np.full(3, -1.0)
    (ref,) = run_forward(BY_NAME["p_clip"], [x, lo, hi])
    np.testing.assert_array_equal(ref, np.clip(x, lo, hi))
    np.testing.assert_array_equal(gen.p_clip(x, lo, hi), ref)


@pytest.mark.parametrize("name", ["p_relu", "p_log_sigmoid", "p_softmax", "p_softmax_a0",
                                  "p_log_softmax"])
def test_decomposed_builtins_match_their_numpy_references(name) -> None:
    """The decomposition a composite builtin lowers to computes its reference, at
    sampled and edge points (float64, to rounding)."""
    case = BY_NAME[name]
    prim = PRIMITIVES[case.prims[0]]
    axis = {"p_softmax": (1,), "p_softmax_a0": (0,)}.get(name)
    for (x,) in [_fixed_inputs(case, 3)] + list(_EDGES.get(name, [])):
        want = prim.ref(x) if axis is None else prim.ref(x, axis=axis)
        np.testing.assert_allclose(run_forward(case, [x])[0], want, rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("axis, keepdims", [(None, False), (-1, False), (0, True), ((0, 1), False)])
def test_framework_norms_are_scaled_as_the_reference(axis, keepdims) -> None:
    """JAX's and PyTorch's ``norm`` agree with the module's (scaled by the largest |x|):
    float32 rows near 1e20 and 1e-25, whose squares overflow or vanish, zeros, an inf,
    and an empty slice."""
    fns = [PRIMITIVES["norm"].jax]
    try:
        import torch
        fns.append(lambda x, **kw: PRIMITIVES["norm"].torch(torch.from_numpy(x), **kw).numpy())
    except ImportError:
        pass
    x = np.array([[3e20, 4e20, 0], [3e-25, 0, 4e-25], [0, 0, 0], [np.inf, 1, 2]], np.float32)
    for a in (x, x[:, :0]):
        want = PRIMITIVES["norm"].ref(a, axis=axis, keepdims=keepdims)
        for fn in fns:
            got = np.asarray(fn(a, axis=axis, keepdims=keepdims))
            assert got.shape == np.shape(want)
            np.testing.assert_allclose(got, want, rtol=1e-6)
