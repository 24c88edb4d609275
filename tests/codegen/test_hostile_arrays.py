"""Hostile array arguments: every generated method (forward, vjp, fwd_bwd, jvp, fused
and ``.unfused``) of a representative set of ops, called with wrong counts, dtypes, shapes,
layouts, ``out=`` buffers, empty, 0-d and huge arrays.

Each call gets the right result (checked against a NumPy reference, which also checks
fused against unfused) or a TypeError/ValueError whose message names the op.method and
the argument; inputs are never written; a rejected ``out=`` is left untouched.
``test_under_numba_boundscheck`` reruns a subset with Numba's bounds checking on, so a
read or write out of bounds would fail it; ``test_more_than_2_31_elements`` runs a real
>2^31-element call when ``GRADC_TEST_HUGE=1`` and memory allows.

The conventions tested here are docs/generated-module.md's ("Arguments").
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable

import numba
import numpy as np
import pytest

import gradc

SOURCE = """
op ew(x, y) -> r {
    r = x * y + sin(x)
}
op dense(x: f32[b, i], w: f32[i, o], bias: f32[o]) -> h {
    h = tanh(x @ w + bias)
}
op named(x: f64[n, k], s: f64[k]) -> r {
    r = x * s - 1
}
op red(x) -> (s, m) {
    s = sum(x * x, axis=1, keepdims=true)
    m = max(x, axis=0)
}
op two(x, y) -> (a, b) {
    a = x * y
    b = x - y
}
op params(x, n: i32, flag: bool, w: nograd, alpha: nograd = 0.5, k: i64 = 3) -> y {
    y = where(flag, x * n, alpha * x * w) + k
}
op custom(x) -> y {
    y = tanh(x)
} grad(dy) -> dx {
    dx = dy * (1 - y^2) * 0.5
}
op full(x) -> y {
    y = sum(x * 2)
}
op affine(x) -> y {
    y = x * 2 + 1
}
op tr(x, y) -> (a, b) {
    a = x.T
    b = x.T * y + y.T
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="hostile.grad"),
                              "gradc_test_hostile_gen")


# ---- the ops, with NumPy references ---------------------------------------------------

def sum_to(g, shape):
    g = np.asarray(g)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return np.broadcast_to(g.sum(axis=axes, keepdims=True), shape)


def dense_vjp(x, w, b, g):
    dz = g * (1 - np.tanh(x @ w + b) ** 2)
    return dz @ w.T, x.T @ dz, dz.sum(axis=0)


def red_vjp(x, gs, gm):
    tie = x == x.max(axis=0)
    return (2 * x * gs + tie * gm / tie.sum(axis=0)),


def params_fwd(x, n, flag, w, alpha=0.5, k=3):
    return np.where(flag, x * n, alpha * x * w) + k,


def params_vjp(x, n, flag, w, g, alpha=0.5, k=3):
    return sum_to(g * np.where(flag, n, alpha * w), np.shape(x)),


@dataclass(frozen=True)
class Case:
    op: str
    inputs: dict[str, Callable]              # name -> rng -> a clean argument (positional)
    ups: tuple[str, ...]                     # upstream names, one per output
    forward: Callable[..., tuple]            # NumPy reference (float64)
    vjp: Callable[..., tuple]                # (*inputs, *upstreams, **kwargs) -> gradients
    kwargs: dict = field(default_factory=dict)
    lists_ok: bool = True                    # nested lists convert to acceptable dtypes
    dtype: type = np.float64                 # of the results
    jvp: Callable | None = None              # (*inputs, *tangents) -> output tangents;
    #                                          None: from vjp, one basis cotangent at a time


def f64(*shape):
    return lambda rng: rng.uniform(-2, 2, shape)


def f32(*shape):
    return lambda rng: rng.uniform(-2, 2, shape).astype(np.float32)


CASES = [
    Case("ew", {"x": f64(2, 3), "y": f64(3)}, ("dr",),
         lambda x, y: (x * y + np.sin(x),),
         lambda x, y, g: (g * (y + np.cos(x)), sum_to(g * x, np.shape(y)))),
    Case("dense", {"x": f32(2, 3), "w": f32(3, 3), "bias": f32(3)}, ("dh",),
         lambda x, w, b: (np.tanh(x @ w + b),), dense_vjp, lists_ok=False, dtype=np.float32),
    Case("named", {"x": f64(2, 3), "s": f64(3)}, ("dr",),
         lambda x, s: (x * s - 1,), lambda x, s, g: (g * s, (g * x).sum(axis=0))),
    Case("red", {"x": f64(2, 3)}, ("ds", "dm"),
         lambda x: (np.sum(x * x, axis=1, keepdims=True), np.max(x, axis=0)), red_vjp),
    Case("two", {"x": f64(2, 3), "y": f64(2, 3)}, ("da", "db"),
         lambda x, y: (x * y, x - y),
         lambda x, y, ga, gb: (sum_to(ga * y + gb, np.shape(x)), sum_to(ga * x - gb, np.shape(y)))),
    Case("params", {"x": f64(2, 3), "n": lambda rng: np.array([1, -2, 3], np.int32),
                    "flag": lambda rng: np.array([True, False, True]), "w": f64(2, 3)},
         ("dy",), params_fwd, params_vjp, kwargs={"alpha": 0.25, "k": 2}),   # n: ints, i32
    Case("custom", {"x": f64(2, 3)}, ("dy",), lambda x: (np.tanh(x),),
         lambda x, g: (g * (1 - np.tanh(x) ** 2) * 0.5,)),
    Case("full", {"x": f64(2, 3)}, ("dy",), lambda x: (np.sum(x * 2),),
         lambda x, g: (np.broadcast_to(2 * g, x.shape),)),
    # transposes are views of the inputs: returned, read by kernels, written in place
    Case("tr", {"x": f64(3, 3), "y": f64(3, 3)}, ("da", "db"),
         lambda x, y: (x.T, x.T * y + y.T),
         lambda x, y, ga, gb: (ga.T + (gb * y).T, gb * x.T + gb.T),
         jvp=lambda x, y, xt, yt: (xt.T, xt.T * y + x.T * yt + yt.T)),
]
CASE = {c.op: c for c in CASES}
CASE["affine"] = Case("affine", {"x": f64(2, 3)}, ("dy",), lambda x: (x * 2 + 1,),
                      lambda x, g: (2 * g,))      # the >2^31 test's op
METHODS = ["forward", "vjp", "fwd_bwd", "jvp", "unfused.forward", "unfused.vjp",
           "unfused.fwd_bwd", "unfused.jvp"]
DIFFERENTIABLE = {"params": ("x",)}          # the others: every input


def tangent_names(case: Case) -> list[str]:
    """One tangent per differentiable input, named as the wrappers name them."""
    return [f"{n}_t" for n in DIFFERENTIABLE.get(case.op, list(case.inputs))]


def extra_names(case: Case, method: str) -> list[str]:
    """The positional arguments after the inputs: upstreams, tangents or none."""
    return {"forward": [], "jvp": tangent_names(case)}.get(base(method), list(case.ups))


def method_fn(m, op: str, method: str):
    fn = getattr(m, op)
    if method.startswith("unfused."):
        fn, method = fn.unfused, method.removeprefix("unfused.")
    return fn if method == "forward" else getattr(fn, method)


def base(method: str) -> str:
    return method.removeprefix("unfused.")


def make_args(case: Case, **shapes) -> dict[str, object]:
    """The case's clean inputs and upstreams by name; ``shapes`` overrides some shapes
    (same dtype, new values)."""
    rng = np.random.default_rng(0)
    args = {}
    for name, make in case.inputs.items():
        a = make(rng)
        if name in shapes:
            a = rng.uniform(-2, 2, shapes[name]).astype(a.dtype)
        args[name] = a
    try:
        outs = case.forward(*args.values(), **case.kwargs)
    except ValueError:                      # the reference rejects these shapes too
        outs = [np.zeros(())] * len(case.ups)
    for name, o in zip(case.ups, outs):
        args[name] = rng.uniform(-1, 1, np.shape(o)).astype(case.dtype)
    for name in tangent_names(case):
        x = args[name[:-2]]
        args[name] = rng.uniform(-1, 1, np.shape(x)).astype(x.dtype)
    return args


def split(case: Case, method: str, args: dict) -> list:
    """The positional arguments of ``method``: inputs, then upstreams or tangents."""
    return [args[n] for n in list(case.inputs) + extra_names(case, method)]


def call(m, case: Case, method: str, args: dict, **kw) -> tuple:
    r = method_fn(m, case.op, method)(*split(case, method, args), **{**case.kwargs, **kw})
    return r if isinstance(r, tuple) else (r,)


def reference(case: Case, method: str, args: dict) -> tuple:
    as64 = {n: (np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else a)
            for n, a in args.items()}
    ins = [as64[n] for n in case.inputs]
    fwd = case.forward(*ins, **case.kwargs)
    if base(method) == "forward":
        return fwd
    if base(method) == "jvp":
        return tuple(fwd) + jvp_reference(case, ins, [as64[t] for t in tangent_names(case)])
    grads = case.vjp(*ins, *(as64[u] for u in case.ups), **case.kwargs)
    return grads if base(method) == "vjp" else tuple(fwd) + tuple(grads)


def jvp_reference(case: Case, ins: list, ts: list) -> tuple:
    """The output tangents ``J t``: the case's own ``jvp``, else row by row from its
    VJP (``(J t)[e] = <vjp(e), t>`` for each basis cotangent ``e``)."""
    if case.jvp is not None:
        return case.jvp(*ins, *ts, **case.kwargs)
    outs = case.forward(*ins, **case.kwargs)
    tans = []
    for k, o in enumerate(outs):
        jt = np.zeros(np.shape(o))
        for e in np.ndindex(np.shape(o)):
            ups = [np.zeros(np.shape(p)) for p in outs]
            ups[k][e] = 1.0
            grads = case.vjp(*ins, *ups, **case.kwargs)
            jt[e] = sum(np.vdot(g, t) for g, t in zip(grads, ts))
        tans.append(jt)
    return tuple(tans)


def assert_results(got: tuple, want: tuple, dtype) -> None:
    assert len(got) == len(want)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray) and g.dtype == dtype and g.shape == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def snapshot(args: dict) -> dict:
    return {n: np.array(a, copy=True) for n, a in args.items() if isinstance(a, np.ndarray)}


def assert_unchanged(args: dict, before: dict) -> None:
    for n, a in before.items():
        np.testing.assert_array_equal(args[n], a, err_msg=f"input '{n}' was written")


def raises(exc, case: Case, method: str, *fragments: str):
    """pytest.raises whose message starts with op.method (``op.unfused.vjp``: the
    method as called) and contains ``fragments``."""
    pattern = rf"^{re.escape(case.op + '.' + method)}: " + \
        "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=pattern)


ids = dict(ids=lambda v: v.op if isinstance(v, Case) else None)


# ---- layouts: non-contiguous, negative strides, Fortran, read-only, lists ----------------

def _reversed(a):                   # the same values through negative strides
    return np.flip(np.flip(a).copy())


def _strided(a):                    # every other element of a larger buffer
    big = np.zeros(a.shape + (2,), a.dtype)
    big[..., 0] = a
    return big[..., 0]


def _readonly(a):
    a = a.copy()
    a.setflags(write=False)
    return a


def _swapped(a):                    # non-native byte order
    return a.astype(a.dtype.newbyteorder("S")) if a.dtype.kind != "b" else a


LAYOUTS = {
    "fortran": lambda a: np.asfortranarray(a) if a.ndim else a, "reversed": _reversed, "strided": _strided,
    "readonly": _readonly, "byteswapped": _swapped, "list": lambda a: a.tolist(),
    "broadcast": lambda a: np.broadcast_to(a, a.shape),      # read-only, not owning
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, **ids)
def test_layouts_give_the_reference_result(m, case, method, layout) -> None:
    args = make_args(case)
    clean = call(m, case, method, args)
    hostile = {n: LAYOUTS[layout](a) for n, a in args.items()}
    before = snapshot(hostile)
    if layout == "list" and not case.lists_ok:
        with raises(TypeError, case, method, "must be"):
            call(m, case, method, hostile)
        return
    got = call(m, case, method, hostile)
    assert_results(got, reference(case, method, args), case.dtype)
    for g, c in zip(got, clean):                    # the same kernels on the same values
        np.testing.assert_array_equal(g, c)
        assert g.flags.c_contiguous and g.flags.writeable
    assert_unchanged(hostile, before)


# ---- argument count ---------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, **ids)
def test_wrong_argument_count(m, case, method) -> None:
    pos = split(case, method, make_args(case))
    fn = method_fn(m, case.op, method)
    qual = "^" + re.escape(f"{case.op}.{method}()")
    with pytest.raises(TypeError, match=qual + " missing"):
        fn(*pos[:-1], **case.kwargs)
    with pytest.raises(TypeError, match=qual + " takes"):
        fn(*pos, pos[-1], **case.kwargs)
    with pytest.raises(TypeError, match=qual + " got an unexpected keyword"):
        fn(*pos, beta=1.0, **case.kwargs)


# ---- dtypes -------------------------------------------------------------------------------

def _like(dtype):
    return lambda a: np.ones(np.shape(a), dtype)


BAD_VALUES = {           # name -> (make from the good argument, dtypes of params it suits)
    "float16": (_like(np.float16), {None}),          # None: a generic float parameter
    "float32": (_like(np.float32), {None, "f32"}),
    "float64": (_like(np.float64), {None, "f64"}),
    "int64": (_like(np.int64), {"i64"}),
    "int32": (_like(np.int32), {"i32", "i64"}),         # widened for i64, as NumPy's "safe"
    "uint8": (_like(np.uint8), {"i32", "i64"}),
    "uint32": (_like(np.uint32), {"i64"}),
    "uint64": (_like(np.uint64), set()),                # int64 does not hold it
    "bool": (_like(np.bool_), {"bool"}),
    "complex": (_like(np.complex128), set()),
    "longdouble": (_like(np.longdouble), set()),
    "object": (lambda a: np.full(np.shape(a), 1.0, dtype=object), set()),
    "datetime": (_like("M8[s]"), set()),
    "str": (lambda a: "1.0", set()),
    "None": (lambda a: None, set()),
    "py-bool": (lambda a: True, {"bool"}),
    "py-complex": (lambda a: 1j, set()),
    "ragged": (lambda a: [[1.0], [1.0, 2.0]], set()),
    "dict": (lambda a: {}, set()),
}
PARAM_DTYPES = {("params", "n"): "i32", ("params", "flag"): "bool", ("params", "k"): "i64",
                ("dense", "x"): "f32", ("dense", "w"): "f32", ("dense", "bias"): "f32",
                ("named", "x"): "f64", ("named", "s"): "f64"}


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, **ids)
def test_wrong_dtype_is_a_type_error_naming_the_argument(m, case, method, bad) -> None:
    make, suits = BAD_VALUES[bad]
    args = make_args(case)
    names = list(case.inputs) + list(case.kwargs)
    ups = extra_names(case, method)
    for name in names + ups:
        if PARAM_DTYPES.get((case.op, name)) in suits or name in ups and None in suits:
            continue                    # upstreams and tangents take any float width
        good = args.get(name, case.kwargs.get(name))
        hostile = {**args, name: make(good)} if name not in case.kwargs else args
        kw = {name: make(good)} if name in case.kwargs else {}
        what = ("tangent" if base(method) == "jvp" else "upstream") if name in ups \
            else "argument"
        with raises(TypeError, case, method, f"{what} '{name}'"):
            call(m, case, method, hostile, **kw)


@pytest.mark.parametrize("method", ["forward", "vjp", "unfused.fwd_bwd"])
def test_scalar_and_mixed_dtypes(m, method) -> None:
    case = CASE["ew"]
    x32 = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    a32 = {"x": x32, "y": 2.0, "dr": np.ones((2, 3), np.float32)}
    assert all(r.dtype == np.float32 for r in call(m, case, method, a32))   # weak float
    a = {**a32, "y": 2}                                                       # weak int
    assert all(r.dtype == np.float32 for r in call(m, case, method, a))
    a = {**a32, "y": np.float64(2.0)}                      # a NumPy scalar is not weak
    assert all(r.dtype == np.float64 for r in call(m, case, method, a))
    a = {**a32, "x": x32.astype(np.float16), "y": np.float16(2)}
    got = call(m, case, method, {**a, "dr": a["dr"].astype(np.float16)})
    assert all(r.dtype == np.float16 for r in got)
    a = {**a32, "y": 2**70}                                # beyond int64: a float
    want = reference(case, method, {**a, "y": np.float64(2.0**70)})
    np.testing.assert_allclose(call(m, case, method, a)[0], want[0].astype(np.float32),
                               rtol=1e-6)
    with raises(OverflowError, case, method, "argument 'y'", "does not fit"):
        call(m, case, method, {**a32, "y": 10**400})
    with raises(TypeError, case, method, "argument 'y'", "got bool"):
        call(m, case, method, {**a32, "y": True})


def test_integer_parameters(m) -> None:
    case = CASE["params"]
    args = make_args(case)
    with raises(OverflowError, case, "forward", "argument 'k'", "does not fit int64"):
        call(m, case, "forward", args, k=2**70)
    with raises(OverflowError, case, "forward", "argument 'k'",
                "holds 1180591620717411303424, which does not fit int64"):   # a list's int
        call(m, case, "forward", args, k=[2**70])
    with raises(OverflowError, case, "forward", "argument 'n'",
                "holds 2147483648, which does not fit int32"):
        call(m, case, "forward", {**args, "n": [1, 2, 2**31]})
    # a list of Python ints is of the parameter's dtype, as a Python int is (helper 67)
    np.testing.assert_array_equal(call(m, case, "forward", {**args, "n": [1, -2, 3]})[0],
                                  call(m, case, "forward", args)[0])
    with raises(OverflowError, case, "vjp", "argument 'n'", "does not fit int32"):
        call(m, case, "vjp", {**args, "n": -2**31 - 1})
    with raises(TypeError, case, "forward", "argument 'n'",
                "must be int32, got float (pass an int)"):      # a Python float: no .astype
        call(m, case, "forward", {**args, "n": 2.0})
    with raises(TypeError, case, "forward", "argument 'flag'",
                "must be bool, got int (pass True or False)"):
        call(m, case, "forward", {**args, "flag": 1})
    with raises(TypeError, case, "forward", "argument 'n'",
                "must be int32, got float64 (convert with .astype(np.int32))"):
        call(m, case, "forward", {**args, "n": np.float64(2.0)})
    got = call(m, case, "forward", {**args, "n": np.int32(2), "flag": np.bool_(False)})
    assert_results(got, reference(case, "forward", {**args, "n": 2, "flag": False}),
                   np.float64)
    with raises(TypeError, case, "forward", "argument 'n'",
                "must be int32, got int64 (convert with .astype(np.int32))"):   # not narrowed
        call(m, case, "forward", {**args, "n": np.asarray(args["n"], np.int64)})
    for narrow in (np.int8, np.uint16, np.int32, np.uint32):     # widened: the same results
        for method in ("forward", "vjp", "fwd_bwd"):
            got = call(m, case, method, args, k=np.asarray(case.kwargs["k"], narrow))
            assert_results(got, reference(case, method, args), np.float64)


# ---- shapes -------------------------------------------------------------------------------

BAD_SHAPES = [     # (op, shapes of some inputs, what the message must contain)
    ("ew", {"y": (4,)}, ["do not broadcast", "'x' (2, 3)", "'y' (4,)"]),
    ("ew", {"x": (2, 3, 2)}, ["do not broadcast", "'x' (2, 3, 2)"]),
    ("dense", {"w": (4, 3)}, ["dim 'i' is 3 in argument 'x' but 4 in argument 'w'"]),
    ("dense", {"bias": (2,)}, ["dim 'o'", "argument 'bias'"]),
    ("dense", {"x": (3,)}, ["argument 'x' must have 2 dims"]),
    ("named", {"s": (4,)}, ["dim 'k'", "argument 's'"]),
    ("named", {"x": (2, 3, 1)}, ["argument 'x' must have 2 dims"]),
    ("red", {"x": (3,)}, ["axis", "out of bounds"]),
    ("two", {"y": (3, 2)}, ["do not broadcast", "'y' (3, 2)"]),
    ("params", {"w": (4,)}, ["do not broadcast", "'w' (4,)"]),
    ("params", {"flag": (2,)}, ["do not broadcast", "'flag' (2,)"]),
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("op, shapes, fragments", BAD_SHAPES,
                         ids=[f"{o}-{'-'.join(s)}" for o, s, _ in BAD_SHAPES])
def test_mismatched_shapes(m, op, shapes, fragments, method) -> None:
    case = CASE[op]
    args = make_args(case, **shapes)
    with raises(ValueError, case, method, *fragments):
        call(m, case, method, args)


@pytest.mark.parametrize("method", ["vjp", "fwd_bwd", "unfused.vjp", "unfused.fwd_bwd"])
@pytest.mark.parametrize("case", CASES, **ids)
def test_upstream_of_the_wrong_shape(m, case, method) -> None:
    args = make_args(case)
    for u in case.ups:
        for shape in (np.shape(args[u]) + (1,), (7,)):
            bad = {**args, u: np.ones(shape, case.dtype)}
            with raises(ValueError, case, method, f"upstream '{u}' must have the output's shape"):
                call(m, case, method, bad)


@pytest.mark.parametrize("method", ["jvp", "unfused.jvp"])
@pytest.mark.parametrize("case", CASES, **ids)
def test_tangent_of_the_wrong_shape(m, case, method) -> None:
    """A tangent has its parameter's shape or one that broadcasts to it."""
    args = make_args(case)
    for t in tangent_names(case):
        for shape in (np.shape(args[t]) + (2,), (7,)):
            bad = {**args, t: np.ones(shape, args[t].dtype)}
            with raises(ValueError, case, method, f"tangent '{t}' must have its parameter's "
                        f"shape {np.shape(args[t])} (or one that broadcasts to it)"):
                call(m, case, method, bad)
        ones = {**args, t: np.ones((1,) * np.ndim(args[t]), args[t].dtype)}
        assert_results(call(m, case, method, ones),
                       reference(case, method, {**ones, t: np.ones_like(args[t])}), case.dtype)


def test_nograd_scalar_parameter_must_be_a_scalar(m) -> None:
    case = CASE["params"]
    with raises(ValueError, case, "vjp", "argument 'alpha' must be a scalar"):
        call(m, case, "vjp", make_args(case), alpha=np.ones(3))


# ---- empty, 0-d and scalar arguments ------------------------------------------------------

EMPTY = {
    "ew": [{"x": (0, 3)}, {"x": (2, 0), "y": (0,)}, {"x": (0,), "y": ()}],
    "dense": [{"x": (0, 3)}, {"x": (2, 0), "w": (0, 3)}, {"w": (3, 0), "bias": (0,)}],
    "named": [{"x": (0, 3)}, {"x": (2, 0), "s": (0,)}],
    "red": [{"x": (3, 0)}, {"x": (0, 3)}],          # max over an empty axis: ValueError
    "two": [{"x": (0, 3), "y": (0, 3)}, {"x": (0,), "y": (1,)}],
    "params": [{"x": (0, 3), "w": (0, 3)}],
    "custom": [{"x": (0,)}, {"x": (0, 3)}],
    "full": [{"x": (0, 3)}, {"x": (0,)}],
}
EMPTY_CASES = [(op, s) for op, shapes in EMPTY.items() for s in shapes]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("op, shapes", EMPTY_CASES,
                         ids=[f"{o}-{s}" for o, s in EMPTY_CASES])
def test_empty_arrays(m, op, shapes, method) -> None:
    case = CASE[op]
    args = make_args(case, **shapes)
    try:
        want = reference(case, method, args)
    except ValueError as exc:              # NumPy's reduction of nothing: the same error
        # (or, where the upstreams are checked first, theirs: they got no valid shape)
        with pytest.raises(ValueError, match=rf"^{re.escape(case.op + '.' + method)}: "
                           rf"({re.escape(str(exc).split(' which')[0])}|upstream|tangent)"):
            call(m, case, method, args)
        return
    assert_results(call(m, case, method, args), want, case.dtype)


SCALARS = {           # how a scalar argument is passed
    "0-d": lambda v, dt: np.asarray(v, dt),
    "numpy-scalar": lambda v, dt: np.dtype(dt).type(v),
    "python": lambda v, dt: v.item() if isinstance(v, np.generic) else v,
}


@pytest.mark.parametrize("kind", SCALARS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, **ids)
def test_zero_dimensional_and_scalar_arguments(m, case, method, kind) -> None:
    rng = np.random.default_rng(1)
    args = {}
    for name, a in make_args(case).items():
        v = a.dtype.type(rng.uniform(0.1, 1)) if a.dtype.kind == "f" else a.flat[0]
        args[name] = SCALARS[kind](v, a.dtype)
    if case.op in ("dense", "named", "red"):
        # annotated ranks, and reductions over axis 1, need arrays of rank 2
        with raises(ValueError, case, method, "out of bounds" if case.op == "red" else "2 dims"):
            call(m, case, method, args)
        return
    assert_results(call(m, case, method, args), reference(case, method, args), case.dtype)


# ---- out= -------------------------------------------------------------------------------

def _nan(shape, dtype=np.float64):
    return np.full(shape, np.nan, dtype)


def nans(case: Case, shapes, dtype=None) -> list[np.ndarray]:
    return [_nan(x, dtype or case.dtype) for x in shapes]


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _overlap_input(case, args, shapes):
    """out[0] sharing memory with the first input without being it."""
    first = next(iter(case.inputs))
    x = args[first]
    big = np.zeros(max(x.size, _size(shapes[0])) + 1, x.dtype)
    big[:x.size] = x.reshape(-1)
    args[first] = big[:x.size].reshape(x.shape)
    return (big[1:1 + _size(shapes[0])].reshape(shapes[0]), *nans(case, shapes[1:]))


def _overlap_out(case, args, shapes):
    """The last out sharing one element with out[0]."""
    big = np.full(_size(shapes[0]) + _size(shapes[-1]), np.nan, case.dtype)
    first = big[:_size(shapes[0])].reshape(shapes[0])
    last = big[_size(shapes[0]) - 1:][:_size(shapes[-1])].reshape(shapes[-1])
    return (first, *nans(case, shapes[1:-1]), last)


def _typed(dtype):
    return lambda c, a, s: tuple(np.zeros(x, dtype) for x in s)


# name -> (out= from (case, args, result shapes), exception, message, applies to shapes)
BAD_OUTS = {
    "too-few": (lambda c, a, s: tuple(nans(c, s)[:-1]), TypeError, "out= must be",
                lambda s: True),
    "too-many": (lambda c, a, s: (*nans(c, s), _nan(3)), TypeError, "out= must be",
                 lambda s: True),
    "bare-array": (lambda c, a, s: nans(c, s)[0], TypeError, "arrays, got one array",
                   lambda s: len(s) > 1),
    "list-element": (lambda c, a, s: (_nan(s[0]).tolist(), *nans(c, s[1:])), TypeError,
                     "out[0] must be a numpy.ndarray", lambda s: True),
    "none-element": (lambda c, a, s: (*nans(c, s[:-1]), None), TypeError,
                     "must be a numpy.ndarray, got NoneType", lambda s: len(s) > 1),
    "shape": (lambda c, a, s: tuple(nans(c, [x + (1,) for x in s])), ValueError,
              "must have shape", lambda s: True),
    "last-shape": (lambda c, a, s: (*nans(c, s[:-1]), _nan(s[-1] + (2,), c.dtype)), ValueError,
                   "must have shape", lambda s: len(s) > 1),
    "first-shape": (lambda c, a, s: (_nan(s[0] + (2,), c.dtype), *nans(c, s[1:])), ValueError,
                    "out[0] must have shape", lambda s: len(s) > 1),
    "size-0": (lambda c, a, s: tuple(nans(c, [(0,)] * len(s))), ValueError,
               "must have shape", lambda s: True),
    "int": (_typed(np.int64), TypeError, "out[0] must be a floating-point array",
            lambda s: True),
    "complex": (_typed(complex), TypeError, "out[0] must be a floating-point array",
                lambda s: True),
    "bool": (_typed(bool), TypeError, "out[0] must be a floating-point array",
             lambda s: True),
    "non-contiguous": (lambda c, a, s: tuple(_strided(o) for o in nans(c, s)), ValueError,
                       "out[0] must be a writeable C-contiguous", lambda s: s[0] != ()),
    "fortran": (lambda c, a, s: tuple(np.asfortranarray(o) for o in nans(c, s)),
                ValueError, "out[0] must be a writeable C-contiguous",
                lambda s: sum(d > 1 for d in s[0]) > 1),
    "read-only": (lambda c, a, s: tuple(_readonly(o) for o in nans(c, s)), ValueError,
                  "out[0] must be a writeable C-contiguous", lambda s: True),
    "overlap-out": (_overlap_out, ValueError, "overlaps out[0]", lambda s: len(s) > 1),
    "overlap-input": (_overlap_input, ValueError, "out[0] overlaps input", lambda s: True),
}


def bad_out_params() -> list:
    """(case, method, bad) for every bad out= that applies to the method's results
    (a bare array is a valid out= for one result, a second shape needs two, ...):
    the shapes come from the NumPy references, at collection."""
    out = []
    for case in CASES:
        for method in METHODS:
            shapes = [np.shape(r) for r in reference(case, method, make_args(case))]
            out += [pytest.param(case, method, bad, id=f"{case.op}-{method}-{bad}")
                    for bad, (*_, applies) in BAD_OUTS.items() if applies(shapes)]
    return out


@pytest.mark.parametrize("case, method, bad", bad_out_params())
def test_bad_out_is_rejected_before_any_write(m, case, method, bad) -> None:
    make, exc, fragment, applies = BAD_OUTS[bad]
    args = make_args(case)
    shapes = [np.shape(r) for r in reference(case, method, args)]
    assert applies(shapes)
    out = make(case, args, shapes)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, np.ndarray)]
    before, kept = snapshot(args), [o.copy() for o in outs]
    with raises(exc, case, method, fragment):
        call(m, case, method, args, out=out)
    assert_unchanged(args, before)
    for o, k in zip(outs, kept):
        np.testing.assert_array_equal(o, k, err_msg="a rejected out= was written")


GOOD_OUTS = {    # name -> dtype of the out buffers (None: the result dtype)
    "exact": None, "float32": np.float32, "float16": np.float16, "float64": np.float64,
    "longdouble": np.longdouble, "as-list": None,
}


@pytest.mark.parametrize("kind", GOOD_OUTS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, **ids)
def test_out_is_written_and_returned(m, case, method, kind) -> None:
    args = make_args(case)
    want = reference(case, method, args)
    dtype = GOOD_OUTS[kind] or case.dtype
    outs = [_nan(np.shape(w), dtype) for w in want]
    out = outs if kind == "as-list" else (outs[0] if len(outs) == 1 else tuple(outs))
    got = call(m, case, method, args, out=out)
    assert len(got) == len(outs) and all(g is o for g, o in zip(got, outs))
    tol = 2e-3 if dtype == np.float16 else 2e-5 if np.float32 in (dtype, case.dtype) else 1e-12
    for o, w in zip(outs, want):
        np.testing.assert_allclose(o.astype(np.float64), w, rtol=tol, atol=tol)


# ---- out= aliasing an input: in place where the compiler proves it safe -------------------

def inplace_targets(case: Case, method: str, args: dict) -> list[tuple[int, str]]:
    """Every (out slot, argument) pair of equal shape and dtype."""
    want = reference(case, method, args)
    names = list(case.inputs) + extra_names(case, method)
    return [(k, n) for k, w in enumerate(want) for n in names
            if isinstance(args[n], np.ndarray) and args[n].shape == np.shape(w)
            and args[n].dtype == case.dtype]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, **ids)
def test_out_that_is_an_input(m, case, method) -> None:
    """out[k] = some input: the right result, or a ValueError saying it is in place
    and nothing written."""
    clean = make_args(case)
    want = reference(case, method, clean)
    for k, name in inplace_targets(case, method, clean):
        args = {n: np.array(a, copy=True) if isinstance(a, np.ndarray) else a
                for n, a in clean.items()}
        outs = [args[name] if j == k else _nan(np.shape(w), case.dtype)
                for j, w in enumerate(want)]
        try:
            got = call(m, case, method, args, out=tuple(outs))
        except ValueError as exc:
            assert f"out[{k}] overlaps input '{name}' (in place" in str(exc)
            np.testing.assert_array_equal(args[name], clean[name])
            continue
        assert got[k] is args[name]
        assert_results(got, want, case.dtype)


MUST_BE_IN_PLACE = [      # (op, method, {slot: argument}): what users write
    ("ew", "forward", {0: "x"}),
    ("ew", "unfused.forward", {0: "x"}),
    ("two", "forward", {0: "x", 1: "y"}),
    ("two", "forward", {0: "y", 1: "x"}),
    ("custom", "forward", {0: "x"}),
    ("custom", "fwd_bwd", {0: "x", 1: "dy"}),
    ("custom", "vjp", {0: "dy"}),
    ("custom", "unfused.vjp", {0: "dy"}),
    ("named", "forward", {0: "x"}),
    ("params", "forward", {0: "x"}),
    ("dense", "forward", {0: "x"}),
    ("affine", "forward", {0: "x"}),
    ("tr", "forward", {0: "x"}),            # x.T written over x: NumPy copies first
    ("tr", "forward", {0: "y"}),
]
MUST_NOT = [              # a later step still reads the argument
    ("two", "unfused.forward", {0: "x", 1: "y"}),
    # y = tanh(x) does not wait for dy: the threaded loop may store it over dy before it
    # reads dy (wrong dx from 2^17 elements: helper 61)
    ("custom", "fwd_bwd", {0: "dy", 1: "x"}),
    ("custom", "unfused.fwd_bwd", {0: "dy"}),
    ("ew", "fwd_bwd", {0: "x"}),
    ("tr", "forward", {1: "x"}),            # a = x.T, a view of x, is copied out after
]


@pytest.mark.parametrize("op, method, where", MUST_BE_IN_PLACE + MUST_NOT,
                         ids=[f"{o}-{m_}-{sorted(w.values())}"
                              for o, m_, w in MUST_BE_IN_PLACE + MUST_NOT])
def test_in_place(m, op, method, where) -> None:
    case = CASE[op]
    clean = make_args(case)
    want = reference(case, method, clean)
    args = {n: np.array(a, copy=True) for n, a in clean.items()}
    outs = tuple(args[where[k]] if k in where else _nan(np.shape(w)) for k, w in enumerate(want))
    if (op, method, where) in MUST_NOT:
        with raises(ValueError, case, method, "(in place"):
            call(m, case, method, args, out=outs)
        return
    got = call(m, case, method, args, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    assert_results(got, want, case.dtype)


def test_large_transposes_are_views(m) -> None:
    """From 2^16 elements a transpose is a view of its operand (small ones are C-order
    copies): returned, it is copied out; written over that operand in place, the
    result is still the transpose; every method agrees with the reference."""
    assert m._g_transpose(np.ones((300, 300))).base is not None
    assert m._g_transpose(np.ones((3, 3))).flags.c_contiguous
    case = CASE["tr"]
    rng = np.random.default_rng(2)
    args = {n: rng.uniform(-2, 2, (300, 300)) for n in ("x", "y", "da", "db", "x_t", "y_t")}
    for method in METHODS:
        got = call(m, case, method, args)
        assert_results(got, reference(case, method, args), np.float64)
        assert not any(np.may_share_memory(g, a) for g in got for a in args.values())
    want = reference(case, "forward", args)
    x = args["x"].copy()
    got = call(m, case, "forward", {**args, "x": x}, out=(x, _nan((300, 300))))
    assert got[0] is x
    assert_results(got, want, np.float64)


# ---- sizes beyond 2^31 ------------------------------------------------------------------

def test_kernels_index_with_64_bit_integers(m) -> None:
    """Every compiled loop (serial and threaded) counts with intp, 64 bits: no flat index
    or size in a kernel wraps at 2^31."""
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    m.ew.fwd_bwd(x, x[0], x)
    m.red.unfused.vjp(x, np.ones((2, 1)), np.ones(3))
    m.affine(x)
    m.named(x, x[0])                                # rows: s is read at the column index
    m._gk_affine_forward_0(np.empty(4), np.ones(4), np.empty(0))    # the threaded twin
    assert numba.types.intp.bitwidth == 64
    kernels = [v for k, v in vars(m).items() if k.startswith(("_gk_", "_gu_"))]
    checked = 0
    for disp in kernels:
        for cres in disp.overloads.values():
            typemap = cres.type_annotation.typemap
            # _lo: a loop over rows (_r * _n); _C: a reduce kernel's entries, which hand
            # chunks of rows to its body
            index = next(v for v in ("_i", "_lo", "_C") if v in typemap)
            assert typemap[index] == numba.types.intp, disp.py_func.__name__
            for var, t in typemap.items():
                if "parfor_index" in var:
                    assert t.bitwidth == 64, (disp.py_func.__name__, var, t)
            checked += 1
    assert checked >= 10


def test_wrapper_sizes_do_not_wrap(m) -> None:
    """The wrappers' flat sizes are Python integers: a 2^32-element broadcast view is
    flattened without a copy and without wrapping."""
    shape = (1 << 16, 1 << 16)
    flat = m._g_flat(np.ones(1), shape)
    assert flat.shape == (1 << 32,) and flat.strides == (0,)
    assert m._g_bshape("f", ("'x'", "'y'"), shape, (1,)) == shape
    assert m._g_reduce_shape(shape + (3,), axis=(2,)) == shape


@pytest.mark.skipif(not os.environ.get("GRADC_TEST_HUGE"),
                    reason="set GRADC_TEST_HUGE=1 to run (needs ~9 GB of free memory)")
def test_more_than_2_31_elements(m) -> None:
    n = (1 << 31) + 7
    avail = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    if avail < 4 * n + (1 << 30):
        pytest.skip(f"needs {(4 * n) >> 30} GiB free, {avail >> 30} GiB available")
    x = np.zeros(n, np.float32)
    x[-3:] = [1.0, 2.0, 3.0]
    x[(1 << 31) - 1] = 5.0
    r = m.affine(x, out=x)                   # in place: one 8.6 GB buffer
    assert r is x
    np.testing.assert_array_equal(x[-4:], [1.0, 3.0, 5.0, 7.0])
    assert x[(1 << 31) - 1] == 11.0 and x[0] == 1.0 and x[1 << 31] == 1.0
    (dx,) = m.affine.vjp(x, x, out=x)       # dy = x, written over in place
    assert dx is x
    np.testing.assert_array_equal(x[-4:], [2.0, 6.0, 10.0, 14.0])
    assert x[(1 << 31) - 1] == 22.0 and x[1 << 31] == 2.0


# ---- the same under Numba's bounds checking -----------------------------------------------

# The calls most likely to index wrongly (sizes 0 and 1, broadcasting, in place), within
# CI's time; docs/contributing.md (Bounds checking) has the command for the whole file.
BOUNDSCHECK_SUBSET = ("boundscheck_is_on or empty or in_place or out_that_is_an_input "
                      "or zero_dimensional and not dense")


@pytest.mark.skipif(os.environ.get("NUMBA_BOUNDSCHECK") != "1",
                    reason="runs inside test_under_numba_boundscheck")
def test_boundscheck_is_on(m) -> None:
    with pytest.raises(IndexError):
        m._gk_affine_forward_0_serial(np.empty(8), np.ones(4), np.empty(0))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NUMBA_BOUNDSCHECK") == "1", reason="already inside")
def test_under_numba_boundscheck(tmp_path) -> None:
    """A subset of this file with NUMBA_BOUNDSCHECK=1 and fresh Numba and gradc caches
    (kernels cached without the checks must not be reused): an index out of bounds in
    any kernel would raise IndexError and fail it."""
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "GRADC_CACHE_DIR": str(tmp_path / "gradc")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "--basetemp", str(tmp_path / "run"), __file__, "-k", BOUNDSCHECK_SUBSET]
    proc = subprocess.run(cmd + ["-rs"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "boundscheck_is_on" not in proc.stdout      # it ran (was not skipped)
