"""Reductions fused into CPU loops (gradc.passes.fuse_reduce, gradc.codegen.cpu_reduce).

Every op below is checked fused against unfused (NumPy's reductions) and, for
the forward pass, against NumPy written by hand, in float64 and float32, on
shapes that run serially and in parallel, with rows of special values (±inf,
NaN, ties, huge, tiny, zeros), on empty arrays, with ``out=`` and on one and
two threads (the bits must not change).  The plans are checked too: which
steps fuse, which stay NumPy calls.
"""
from __future__ import annotations

import re

import numba
import numpy as np
import pytest

import gradc
from gradc.frontend.check import check_source
from gradc.passes.fuse import LibraryCall
from gradc.passes.fuse import Kernel, recompute_residuals, why_stored
from gradc.passes.fuse_reduce import ReduceKernel, cpu_plan, fuse_reductions
from gradc.pipeline import build_op
from row_sources import SOFTMAX_ROWS

SOURCE = """
op softmax(x: T[b, n]) -> y { y = exp(x - logsumexp(x, axis=1, keepdims=true)) }
op layernorm(x: T[b, n], g: T[n], h: T[n]) -> y {
    mu = mean(x, axis=1, keepdims=true)
    d = x - mu
    v = mean(d * d, axis=1, keepdims=true)
    y = d * rsqrt(v + 0.00001) * g + h
}
op rownorm(x: T[b, n]) -> y { y = x / norm(x, axis=1, keepdims=true) }
op total(x: T[b, n], w: T[n]) -> s { s = sum(tanh(x) * w) }
op extremes(x: T[b, n]) -> y { y = max(x, axis=1) + min(x, axis=-1) + prod(x, axis=1) }
op colmean(x: T[b, n]) -> y { y = mean(x * x, axis=0) }
op three(x: T[a, b, c]) -> y { y = sum(exp(x), axis=(1, 2)) }
op lead(x: T[a, b, c]) -> y { y = sum(x * 2, axis=(0, 1)) }
op middle(x: T[a, b, c]) -> y { y = sum(x, axis=1) }
op generic(x) -> y { y = x - logsumexp(x, axis=-1, keepdims=true) }
op xent(logits: T[b, o], onehot: nograd T[b, o]) -> loss {
    loss = mean(logsumexp(logits, axis=1) - sum(onehot * logits, axis=1))
}
op shifted(x: T[b], y: T[b]) -> (m, p) {
    s = sin(x) * 2 + 1
    m = mean(s * y)
    p = s * sum(y) + x
}
op costly(x: T[b], y: T[b]) -> (m, p) {
    s = exp(sin(cos(x)))
    m = mean(s * y)
    p = s * sum(y) + x
}
op stats(x: T[b, n]) -> (m, s) {
    m = max(x, axis=1)
    s = sum(exp(x - max(x, axis=1, keepdims=true)), axis=1)
}
op centred(x: T[b, n], z: T[b, n], h: T[n]) -> (c, v, k) {
    xc = x - mean(x, axis=1, keepdims=true)
    c = mean(xc * (z - mean(z, axis=1, keepdims=true)), axis=1)
    v = sum(xc^2, axis=1) * 0.5 + sum(h * xc * sum(z, axis=1, keepdims=true), axis=1)
    k = sum(h * xc * exp(z), axis=1)
}
"""

REFERENCE = {
    "softmax": lambda x: np.exp(x - np.log(np.sum(np.exp(x - x.max(1, keepdims=True)), 1,
                                                  keepdims=True)) - x.max(1, keepdims=True)),
    "layernorm": lambda x, g, h: (x - x.mean(1, keepdims=True)) / np.sqrt(
        x.var(1, keepdims=True) + 1e-5) * g + h,
    "rownorm": lambda x: x / np.linalg.norm(x, axis=1, keepdims=True),
    "total": lambda x, w: np.sum(np.tanh(x) * w),
    "extremes": lambda x: x.max(1) + x.min(1) + x.prod(1),
    "colmean": lambda x: np.mean(x * x, axis=0),
    "three": lambda x: np.exp(x).sum(axis=(1, 2)),
    "lead": lambda x: (x * 2).sum(axis=(0, 1)),
    "centred": lambda x, z, h: _centred(x, z, h),
}


def _centred(x, z, h):
    xc = x - x.mean(1, keepdims=True)
    zc = z - z.mean(1, keepdims=True)
    return ((xc * zc).mean(1), (xc * xc).sum(1) * 0.5 + (h * xc * z.sum(1, keepdims=True)).sum(1),
            (h * xc * np.exp(z)).sum(1))
ARGS = {
    "softmax": ["bn"], "layernorm": ["bn", "n", "n"], "rownorm": ["bn"], "total": ["bn", "n"],
    "extremes": ["bn"], "colmean": ["bn"], "three": ["abc"], "lead": ["abc"],
    "middle": ["abc"], "generic": ["bn"], "xent": ["bn", "bn"], "stats": ["bn"],
    "shifted": ["b", "b"], "costly": ["b", "b"], "centred": ["bn", "bn", "n"],
}
SHAPES = {"serial": dict(a=3, b=5, c=4, n=7), "parallel": dict(a=40, b=600, c=9, n=300),
          "one-row": dict(a=1, b=1, c=1, n=33), "one-column": dict(a=2, b=70, c=1, n=1),
          # rows long enough that the kernels prefetch the next row (cpu_reduce: rows of
          # more than 4 KB; in parallel float64's only), serial and in parallel: the last
          # row's prefetch points past the arrays
          "long-rows": dict(a=2, b=5, c=2, n=1100),
          "long-rows-parallel": dict(a=2, b=200, c=2, n=700)}


def source(dtype: str) -> str:
    return SOURCE.replace("T[", f"{dtype}[")


_MODULES: dict = {}


@pytest.fixture(scope="module")
def modules(import_module_text):
    """dtype name -> the module compiled from SOURCE with that dtype (on first use)."""
    def get(dt: str):
        if dt not in _MODULES:
            text = gradc.compile_source(source(dt), file="reduce.grad")
            _MODULES[dt] = import_module_text(text, f"reduce_{dt}")
        return _MODULES[dt], dt
    return get


@pytest.fixture(params=["f64", "f32"])
def mod(request, modules):
    return modules(request.param)


def make_args(op: str, dims: dict, dtype, rng) -> list[np.ndarray]:
    out = []
    for spec in ARGS[op]:
        shape = tuple(dims[c] for c in spec)
        x = rng.standard_normal(shape)
        if op == "extremes":        # products of many values stay finite
            x = 1 + 0.01 * x
        if op == "xent" and len(out) == 1:
            x = np.eye(shape[1])[rng.integers(0, shape[1], shape[0])]
        out.append(x.astype(dtype))
    return out


def close(dtype, want=None) -> dict:
    """Tolerances: float64 tight; float32 relative to the result's scale (a sum of
    many terms that cancel is exact to float32 rounding of the terms, not of
    the sum: the fused loops accumulate in float64, NumPy's steps in float32)."""
    if dtype == np.float64:
        return dict(rtol=1e-11, atol=1e-12)
    finite = np.abs(want[np.isfinite(want)]) if want is not None else np.zeros(0)
    scale = max(float(finite.max(initial=0.0)), 1.0)
    return dict(rtol=2e-5, atol=2e-5 * scale)


class serial_kernels:
    """Within it, module ``m`` runs every kernel's serial variant (its threshold
    ``_G_PARALLEL_MIN`` out of reach), whatever the size."""

    def __init__(self, m, on: bool = True):
        self.m, self.on = m, on

    def __enter__(self):
        self.before = self.m._G_PARALLEL_MIN
        if self.on:
            self.m._G_PARALLEL_MIN = 1 << 62

    def __exit__(self, *exc):
        self.m._G_PARALLEL_MIN = self.before


def check_methods(m, op: str, args: list, dtype, serial_reference: bool = False,
                  serial_fused: tuple = ()) -> None:
    """Fused against unfused, every method; ``serial_reference``: the unfused
    reference through its serial kernels (serial_kernels), at shapes where the fused
    kernels run in parallel; ``serial_fused``: these fused methods through their
    serial kernels too."""
    fn = getattr(m, op)
    with serial_kernels(m, "forward" in serial_fused):
        ys = fn(*args)
    with serial_kernels(m, serial_reference):
        yu = fn.unfused(*args)
    ys_t, yu_t = (ys, yu) if isinstance(ys, tuple) else ((ys,), (yu,))
    for a, b in zip(ys_t, yu_t):
        np.testing.assert_allclose(a, b, equal_nan=True, **close(dtype, b))
        assert np.asarray(a).dtype == dtype
    rng = np.random.default_rng(1)
    ups = [rng.standard_normal(np.shape(y)).astype(dtype) for y in ys_t]
    for method in ("vjp", "fwd_bwd"):
        with serial_kernels(m, method in serial_fused):
            got = getattr(fn, method)(*args, *ups)
        with serial_kernels(m, serial_reference):
            want = getattr(fn.unfused, method)(*args, *ups)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, equal_nan=True, **close(dtype, b))
            assert np.asarray(a).dtype == dtype


# Compiling is the cost: the parallel (prange) kernels, 10-20 s each, at float32
# only (their text does not depend on the dtype; float64 takes the serial ones on the
# other shapes, where its tight tolerance checks the loops' arithmetic), and for the
# ops with a reduce kernel (in NUMPY_CALL_OPS the reductions stay NumPy calls,
# test_other_axis_sets_and_generic_ranks_stay_numpy_calls: only elementwise kernels
# would run in parallel).  At the parallel shapes the unfused reference runs its
# serial kernels (check_methods), which the other shapes compile anyway: the same
# NumPy reductions, none of its elementwise kernels compiled a second time with
# prange.  The long rows (the prefetching kernels) for the ops whose kernels loop
# over rows of n.  At the parallel shapes every op runs its fused fwd_bwd in
# parallel (its forward's and its backward's loops, the chunks' partial sums of both),
# and its forward and vjp through their serial kernels (the same bodies as at the
# other shapes: the parallel kernel only hands chunks of rows to the body), but for
# PARALLEL_EVERY_METHOD, a row-wise op and one that sums over every row, whose forward
# and vjp run in parallel too: each op's parallel forward and vjp compiled a prange
# kernel for the same test again (about 50 s of this file).
LONG_ROWS_OPS = ("softmax", "layernorm", "rownorm", "total", "extremes", "colmean", "xent",
                 "stats", "centred")
NUMPY_CALL_OPS = ("middle", "generic")
PARALLEL_EVERY_METHOD = ("softmax", "total")
CASES = [(op, dt, shape) for op in sorted(ARGS)
         for dt, shape in [("f64", s) for s in sorted(SHAPES) if "parallel" not in s]
         + [("f32", "parallel"), ("f32", "one-row"), ("f32", "long-rows-parallel")]
         if ("long-rows" not in shape or op in LONG_ROWS_OPS)
         and ("parallel" not in shape or op not in NUMPY_CALL_OPS)]


@pytest.mark.slow
@pytest.mark.parametrize("op,dt,shape", CASES)
def test_fused_unfused_and_numpy_agree(modules, op, dt, shape) -> None:
    m, dt = modules(dt)
    dtype = np.float64 if dt == "f64" else np.float32
    args = make_args(op, SHAPES[shape], dtype, np.random.default_rng(0))
    parallel = "parallel" in shape
    serial_fused = ("forward", "vjp") if parallel and op not in PARALLEL_EVERY_METHOD else ()
    check_methods(m, op, args, dtype, serial_reference=parallel, serial_fused=serial_fused)
    if op in REFERENCE:
        want = REFERENCE[op](*[a.astype(np.float64) for a in args])
        with serial_kernels(m, "forward" in serial_fused):
            got = getattr(m, op)(*args)
        np.testing.assert_allclose(got, want, **(close(dtype) if dtype == np.float64
                                                 else dict(rtol=1e-4, atol=1e-4)))
    if parallel:
        # the body of the parallel kernel takes the types serial calls give it (a
        # signed chunk index, not prange's unsigned one): compiled once for both, not
        # twice (1-3 s of compiling each)
        for name in dir(m):
            if name.endswith("_chunks") and hasattr(getattr(m, name), "signatures"):
                sigs = getattr(m, name).signatures
                assert not any(isinstance(t, numba.types.Integer) and not t.signed
                               for sig in sigs for t in sig), (name, sigs)


SPECIAL_ROWS = [[np.inf, 1.0, 2.0], [-np.inf, -np.inf, -np.inf], [np.nan, 0.0, 1.0],
                [3.0, 3.0, 3.0], [1e300, 1e300, -1e300], [1e-300, 0.0, -1e-310],
                [0.0, 0.0, 0.0], [-np.inf, 0.0, np.inf], [710.0, 709.0, -745.0]]


@pytest.mark.parametrize("op", ["softmax", "rownorm", "extremes", "xent", "stats", "total",
                                "layernorm", "centred"])
def test_special_values_match_numpy_steps(mod, op) -> None:
    m, dt = mod
    dtype = np.float64 if dt == "f64" else np.float32
    with np.errstate(all="ignore"):
        x = np.array(SPECIAL_ROWS, dtype=dtype)
    args = [x] + [np.ones(x.shape if spec == "bn" else x.shape[1:], dtype) * 0.5
                  for spec in ARGS[op][1:]]
    with np.errstate(all="ignore"):
        check_methods(m, op, args, dtype)


@pytest.mark.parametrize("op,shape", [("softmax", (0, 4)), ("softmax", (3, 0)),
                                      ("xent", (0, 4)), ("total", (0, 3)), ("rownorm", (2, 0)),
                                      ("colmean", (0, 5)), ("layernorm", (4, 0)),
                                      ("centred", (0, 3)), ("centred", (3, 0))])
def test_empty_arrays(mod, op, shape) -> None:
    m, dt = mod
    dtype = np.float64 if dt == "f64" else np.float32
    args = [np.zeros(shape if spec == "bn" else shape[1:], dtype) for spec in ARGS[op]]
    with np.errstate(all="ignore"):
        check_methods(m, op, args, dtype)


def test_max_of_empty_rows_raises_as_numpy_does(mod) -> None:
    m, dt = mod
    x = np.zeros((3, 0), np.float64 if dt == "f64" else np.float32)
    for fn in (m.extremes, m.extremes.unfused):
        with pytest.raises(ValueError, match="zero-size array"):
            fn(x)


def test_out_buffers_take_row_and_chunk_results(mod) -> None:
    m, dt = mod
    dtype = np.float64 if dt == "f64" else np.float32
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 8)).astype(dtype)
    oh = np.eye(8, dtype=dtype)[rng.integers(0, 8, 50)]
    outs = (np.empty((), dtype), np.empty((50, 8), dtype))
    r = m.xent.fwd_bwd(x, oh, dtype(1), out=outs)
    assert r[0] is outs[0] and r[1] is outs[1]
    want = m.xent.unfused.fwd_bwd(x, oh, dtype(1))
    np.testing.assert_allclose(outs[1], want[1], **close(dtype))
    st = (np.empty(50, dtype), np.empty(50, dtype))
    got = m.stats(x, out=st)
    assert got[0] is st[0]
    np.testing.assert_allclose(st[0], x.max(1))


def test_results_do_not_depend_on_the_thread_count(modules) -> None:
    """In float32 only: these shapes run the parallel kernels, which CASES compiles
    in float32 only too (their text does not depend on the dtype)."""
    m, dt = modules("f32")
    dtype = np.float32
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3000, 90)).astype(dtype)
    w = rng.standard_normal(90).astype(dtype)
    before = numba.get_num_threads()
    try:
        runs = []
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            runs.append(m.total.fwd_bwd(x, w, dtype(1)) + m.colmean.fwd_bwd(x, np.ones(90, dtype)))
    finally:
        numba.set_num_threads(before)
    for a, b in zip(runs[0], runs[-1]):
        assert np.array_equal(a, b)


def _carved(arrays, gap: int, reverse: bool) -> list[np.ndarray]:
    """Copies of ``arrays`` (of one dtype) in one buffer, ``gap`` bytes apart, in order
    or in reverse order."""
    item = arrays[0].itemsize
    buf = np.zeros(sum(a.size for a in arrays) + gap // item * len(arrays) + 64,
                   arrays[0].dtype)
    out, at = [None] * len(arrays), 0
    for i in (reversed(range(len(arrays))) if reverse else range(len(arrays))):
        a = arrays[i]
        out[i] = buf[at:at + a.size].reshape(a.shape)
        out[i][...] = a
        at += a.size + gap // item
    return out


@pytest.mark.parametrize("op,method", [("softmax", "vjp"), ("softmax", "fwd_bwd"),
                                       ("layernorm", "fwd_bwd"), ("rownorm", "vjp"),
                                       ("total", "fwd_bwd"), ("shifted", "fwd_bwd"),
                                       ("xent", "fwd_bwd")])
@pytest.mark.parametrize("n", [3, 5, 8, 13])
def test_results_do_not_depend_on_where_the_arrays_lie(mod, op, method, n) -> None:
    """The bits of a row's sum do not change with the arrays' addresses: an output a
    few elements after an input (small arrays side by side on the heap) made LLVM run
    a pass's scalar loop instead of its vector one, which sums in another order
    (loop_ir.staged): PyTorch's gradgradcheck saw a softmax's second derivative
    change between two identical calls."""
    m, dt = mod
    dtype = np.float64 if dt == "f64" else np.float32
    rng = np.random.default_rng(5)
    args = make_args(op, dict(a=2, b=2, c=2, n=n), dtype, rng)
    fn = getattr(getattr(m, op), method)
    ys = getattr(m, op)(*args)
    ups = [rng.standard_normal(np.shape(y)).astype(dtype)
           for y in (ys if isinstance(ys, tuple) else (ys,))]
    want = fn(*args, *ups)
    want = list(want) if isinstance(want, tuple) else [want]
    arrays = [np.asarray(a) for a in [*args, *ups]]
    k = len(arrays)
    for gap in range(0, 264, dtype().itemsize):
        for reverse in (False, True):
            carved = _carved(arrays + [np.empty_like(w) for w in want], gap, reverse)
            got = fn(*carved[:k], out=tuple(carved[k:]))
            got = list(got) if isinstance(got, tuple) else [got]
            for a, b in zip(got, want):
                assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), (gap, reverse)


@pytest.mark.parametrize("op,method", [("generic", "vjp"), ("generic", "fwd_bwd"),
                                       ("generic", "jvp")])
def test_results_do_not_depend_on_which_row_holds_the_scratch(mod, op, method) -> None:
    """A kernel keeps its scratch row (log-softmax's exp) in an output's row where the
    call's outputs lie 1 KB or more from every other array, else in a row of its own
    (loop_ir.hosted): one row of 200 float32 (72 float64), which the vector loops run
    over, and arrays carved from one buffer nearer than that and farther: the same
    bits."""
    m, dt = mod
    dtype = np.float64 if dt == "f64" else np.float32
    rng = np.random.default_rng(6)
    dims = dict(a=1, b=1, c=1, n=1024 // dtype().itemsize - 56)
    args = make_args(op, dims, dtype, rng)
    fn = getattr(getattr(m, op), method)
    ys = getattr(m, op)(*args)
    ups = [rng.standard_normal(np.shape(y)).astype(dtype)
           for y in (ys if isinstance(ys, tuple) else (ys,))]
    if method == "jvp":
        ups = [rng.standard_normal(np.shape(a)).astype(dtype) for a in args]
    arrays = [np.asarray(a) for a in [*args, *ups]]
    k = len(arrays)
    want = None
    for gap in (0, 8, 128, 256, 512, 1024, 2048):
        for reverse in (False, True):
            outs = [np.empty_like(y) for y in (ys if isinstance(ys, tuple) else (ys,))]
            if method == "vjp":
                outs = [np.empty_like(a) for a in args[:1]]
            if method == "fwd_bwd":
                outs = [*outs, np.empty_like(args[0])]
            if method == "jvp":
                outs = [*outs, *[np.empty_like(y) for y in outs]]
            carved = _carved(arrays + outs, gap, reverse)
            got = fn(*carved[:k], out=tuple(carved[k:]))
            got = [np.asarray(a).tobytes() for a in (got if isinstance(got, tuple) else (got,))]
            want = want or got
            assert got == want, (gap, reverse)


def plan(op: str, method: str = "fwd_bwd"):
    program = check_source(source("f32"), "reduce.grad")
    cop = build_op(program.ops[op], program.ops, program.consts)
    return cpu_plan(cop.methods[method].fused)


@pytest.mark.parametrize("op", ["softmax", "rownorm", "total", "extremes", "three", "lead",
                                "xent", "stats"])
def test_reductions_fuse_into_one_loop(op) -> None:
    steps = plan(op).steps
    kernels = [s for s in steps if isinstance(s, ReduceKernel)]
    assert len(kernels) == 1
    # What is left is shape arithmetic (size_ratio), no reduction and no broadcast.
    g = plan(op).graph
    assert [g.node(s.node).op for s in steps if isinstance(s, LibraryCall)] in ([], ["size_ratio"])


def test_softmax_cross_entropy_reads_the_logits_once_per_pass() -> None:
    p = plan("xent")
    (k,) = [s for s in p.steps if isinstance(s, ReduceKernel)]
    g = p.graph
    assert [g.node(i).attr("name") for i in k.inputs if g.node(i).op == "param"] == \
        ["logits", "onehot", "dloss"]
    assert len(k.outputs) == 1 and len(k.partials) == 1       # dlogits; the mean's partials


PREFETCH_SOURCE = SOFTMAX_ROWS + """
op scale(x: f32[b, n]) -> y { y = x * rsqrt(mean(x * x, axis=1, keepdims=true) + 0.000001) }
"""


def kernel_text(text: str, name: str) -> str:
    """The function ``name`` of a generated module's text."""
    start = text.index(f"def {name}(")
    return text[start:text.index("\n@numba.njit", start)]


def test_the_next_row_is_prefetched_by_a_pass_that_reads_no_row_from_memory() -> None:
    text = gradc.compile_source(PREFETCH_SOURCE, file="prefetch.grad")
    # softmax's fwd_bwd: max (reads x), exp and sum (x again: in cache), y and its dot
    # with dy (reads dy), dx: the exp pass prefetches the next row of x and dy, and of
    # the outputs y and dx for writing
    body = kernel_text(text, "_gk_softmax_fwd_bwd_0_chunks")
    # the parallel kernel only hands chunks of rows to that body; serial calls run it
    assert text[text.index("def _gk_softmax_fwd_bwd_0("):].splitlines()[1:3] == [
        "    for _ch in numba.prange(_C):",
        "        _gk_softmax_fwd_bwd_0_chunks(_o0, _o1, _i0, _i1, _R, _N, _C, np.int64(_ch), "
        "np.int64(_ch) + 1, _w)"]
    assert "_gk_softmax_fwd_bwd_0_chunks(*_ka, 0, _C, " in text and "_fwd_bwd_0_serial" not in text
    # four passes; the two with sums in blocks, or as one loop where rows are short,
    # each summing in its own loop: the exp pass stores only to its scratch row, the
    # third keeps y there too, over the exp it read (loop_ir.deferred), and the fourth
    # stores y to its output with dx (its loop twice: below)
    assert body.count("for _c in range(_N)") == 5 and body.count("for _c in range(_e - _b)") == 2
    assert body.count("if _N <= 256:") == 2
    assert body.count("_k2b[_c] = v4") == 1 and body.count("_k2[_c] = v4") == 1
    fourth = body[body.rindex("u6 = "):]      # (its value read back in its loop over the group)
    assert fourth.count("v4 = _k2[_c]") == 2 and "_o0r" not in \
        body[:body.index("u6 = ")].replace("_o0r = _g_view", "").replace(
            "_k2 = _o0r if _ho else _g_view(_k2s, _q * _N, _q * _N + _N)", "")
    # the scratch row is y's own row where y lies apart from the other arrays (its
    # store then skipped: the row holds y already), else a row of the kernel's own
    # (loop_ir.hosted), a row per row of a group of short rows (loop_ir.ROW_GROUP)
    assert "_k2s = np.empty(_Q * _N + 2 * _ap, _w.dtype)[_ap:_ap + _Q * _N]" in body
    assert "_ho = _g_rows_far(_o0, _o1, 1024) and _g_rows_far(_o0, _i0, 1024) and " \
        "_g_rows_far(_o0, _i1, 1024)" in body
    assert "                _k2 = _o0r if _ho else _g_view(_k2s, _q * _N, _q * _N + _N)" in body
    # the last pass twice: a store under a branch would keep LLVM from vectorising it
    hosting, own = fourth.split("else:")
    assert hosting.split("\n")[1].strip() == "if _ho:"
    assert "_o0r[_c] = v4" not in hosting and "_o0r[_c] = v4" in own
    lines = [line.strip() for line in body.splitlines()]
    hints = [i for i, line in enumerate(lines) if line.startswith("_g_prefetch")]
    assert [lines[i] for i in hints] == ["_g_prefetch(_i0, _lo + _N + _b, _lo + _N + _e)",
                                         "_g_prefetch(_i1, _lo + _N + _b, _lo + _N + _e)",
                                         "_g_prefetch_w(_o0, _lo + _N + _b, _lo + _N + _e)",
                                         "_g_prefetch_w(_o1, _lo + _N + _b, _lo + _N + _e)"]
    max_done = next(i for i, line in enumerate(lines) if line.startswith("u0 = "))
    sum_done = next(i for i, line in enumerate(lines) if line.startswith("u3 = "))
    assert max_done < hints[0] < hints[-1] < sum_done
    # rows of more than a page, more than 1 KiB where the CPU has no 512-bit vectors,
    # up to 128 KiB: the module's pair, chosen at import (loop_ir.PREFETCH_ROWS)
    assert "_pf = _G_PREFETCH[0] < _N * _w.itemsize <= _G_PREFETCH[1]" in body
    assert "\n_G_PREFETCH = (4096 if _g_wide_vectors(numba.config) else 1024, 131072)\n" in text
    # one pass that streams the row, one that computes y: nothing to overlap
    assert "_g_prefetch" not in kernel_text(text, "_gk_scale_forward_0_chunks")


def test_prefetch_hints_never_fault_nor_write() -> None:
    from gradc.codegen import runtime_src

    @numba.njit
    def hint(a, bounds):
        for lo in bounds:
            for hi in bounds:
                runtime_src._g_prefetch(a, lo, hi)
                runtime_src._g_prefetch_w(a, lo, hi)
        return a.sum()

    far = np.array([-(1 << 62), -1, 0, 3, 4, 100, 1 << 40, (1 << 63) - 1], np.int64)
    assert hint(np.arange(4.0), far) == 6.0
    assert hint(np.arange(1000, dtype=np.float32), far) == 499500.0
    assert hint(np.zeros(0, np.float32), far) == 0.0


def test_views_are_the_slices_numpy_takes_clipped_to_the_array() -> None:
    """Reduce kernels take rows and blocks as ``_g_view`` (no reference count): the
    elements of ``a[lo:hi]`` for 0 <= lo (clipped as a slice, never past the array),
    of any stride (broadcast inputs have stride 0), read-only arrays included, and a
    view writes through to its array."""
    from gradc.codegen import runtime_src

    @numba.njit
    def copy(a, lo, hi):
        return runtime_src._g_view(a, lo, hi).copy()

    @numba.njit
    def negate(a, lo, hi):
        v = runtime_src._g_view(a, lo, hi)
        for i in range(v.size):
            v[i] = -v[i]

    readonly = np.arange(6.0)
    readonly.flags.writeable = False
    arrays = [np.arange(10, dtype=np.float32), np.arange(20.0)[::3], readonly,
              np.broadcast_to(np.array([2.5]), (7,)), np.zeros(0)]
    for a in arrays:
        for lo in (0, 1, 3, 6, 50):
            for hi in (-5, 0, 2, 4, 6, 7, 100):
                got = copy(a, lo, hi)
                assert got.dtype == a.dtype
                np.testing.assert_array_equal(got, a[lo:max(hi, lo)], err_msg=f"{lo}:{hi}")
    b = np.arange(8.0)
    negate(b, 2, 5)
    np.testing.assert_array_equal(b, [0, 1, -2, -3, -4, 5, 6, 7])


@pytest.mark.parametrize("op", ["middle", "generic"])
def test_other_axis_sets_and_generic_ranks_stay_numpy_calls(op) -> None:
    p = plan(op)
    g = p.graph
    assert not any(isinstance(s, ReduceKernel) for s in p.steps)
    assert any(isinstance(s, LibraryCall) and g.node(s.node).op in ("sum", "logsumexp")
               for s in p.steps)


def test_no_fuse_keeps_numpy_reductions() -> None:
    program = check_source(source("f32"), "reduce.grad")
    cop = build_op(program.ops["softmax"], program.ops, program.consts)
    p = fuse_reductions(cop.methods["fwd_bwd"].unfused)
    assert not any(isinstance(s, ReduceKernel) for s in p.steps)


def test_reassociation_does_not_reach_the_math_library(modules) -> None:
    """Reduce kernels are compiled with fastmath reassoc (vectorised sums); the math
    library's functions they call keep their own flags once inlined, so their
    range reductions give the same bits as in an ordinary loop."""
    m, _ = modules("f64")
    exp = m._g_exp

    @numba.njit(fastmath={"reassoc"}, error_model="numpy")
    def summed(x, out):
        s = 0.0
        for i in range(x.size):
            v = exp(x[i])
            out[i] = v
            s += v
        return s

    @numba.njit(error_model="numpy")
    def plain(x, out):
        for i in range(x.size):
            out[i] = exp(x[i])

    for dtype in (np.float32, np.float64):
        x = np.random.default_rng(0).uniform(-80, 80, 1 << 16).astype(dtype)
        a, b = np.empty_like(x), np.empty_like(x)
        summed(x, a)
        plain(x, b)
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_cheap_residuals_are_recomputed_where_they_are_read() -> None:
    """``s = sin(x) * 2 + 1`` is needed by the forward loop and by the backward
    loop, which reads x anyway: the backward recomputes it instead of reading it
    back, and the broadcast cotangent of the mean is never stored."""
    program = check_source(source("f32"), "reduce.grad")
    cop = build_op(program.ops["shifted"], program.ops, program.consts)
    fused = fuse_reductions(cop.methods["fwd_bwd"].fused)
    after = recompute_residuals(fused)
    g = after.graph
    stored = lambda p: sum(len(s.outputs) for s in p.steps if isinstance(s, Kernel))
    assert stored(after) < stored(fused)
    (last,) = [s for s in after.steps if type(s) is Kernel]
    assert "sin" in [g.node(n).op for n in last.nodes]
    assert all(g.node(o).op != "broadcast_in" for s in after.steps if isinstance(s, Kernel)
               for o in s.outputs)


def test_costly_residuals_are_stored() -> None:
    """exp(sin(cos(x))) has three transcendentals: storing it is cheaper."""
    p = plan("costly")
    g = p.graph
    (last,) = [s for s in p.steps if type(s) is Kernel]
    assert "exp" not in [g.node(n).op for n in last.nodes]
    # why_stored (gradc explain) gives the reason: the cone of exp, sin and cos
    (s_node,) = [n for n in g.topo_order() if g.node(n).op == "exp"]
    (k,) = [k for k, st in enumerate(p.steps) if s_node in getattr(st, "outputs", ())]
    assert why_stored(p, k, s_node).startswith("too costly to recompute in [")
    assert "3 primitive(s), 3 of them costly" in why_stored(p, k, s_node)


def test_empty_axis_tuple_reduces_nothing(import_module_text) -> None:
    """``axis=()`` is NumPy's identity reduction (a fresh user's crash report)."""
    text = gradc.compile_source("op a(x: f32[b, n]) -> y { y = sum(x, axis=()) * 2 }",
                                file="axes.grad")
    m = import_module_text(text, "empty_axes")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(m.a(x), 2 * x)


def test_reductions_read_only_for_their_shape_make_no_loop(import_module_text) -> None:
    """A reduction whose value is read only for its shape (``zeros_like(s)``) is dead:
    the fused plan drops its loop (it once gave an empty ``for`` body, a SyntaxError)."""
    src = ("op z(x: f32[b, o]) -> y { s = mean(logsumexp(x, axis=1) - sum(x, axis=1))\n"
           "  y = full_like(zeros_like(s), 0) }")
    program = check_source(src, "shape_only.grad")
    cop = build_op(program.ops["z"], program.ops, program.consts)
    for method in ("forward", "fwd_bwd"):
        steps = cpu_plan(cop.methods[method].fused).steps
        assert not any(isinstance(s, ReduceKernel) for s in steps)
    m = import_module_text(gradc.compile_source(src, file="shape_only.grad"), "shape_only")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for f in (m.z, m.z.unfused):
        assert f(x) == 0 and f(x).dtype == np.float32
    y, dx = m.z.fwd_bwd(x, np.float32(1))
    np.testing.assert_array_equal(dx, np.zeros_like(x))


@pytest.mark.parametrize("fast_math", [False, True])
def test_norm_of_subnormal_rows(import_module_text, fast_math) -> None:
    """The row norm's scale is at least the smallest normal number, so its reciprocal
    (which LLVM may use for x / scale) is finite: no NaN for a row whose
    largest element is subnormal."""
    text = gradc.compile_source("op rn(x: f32[b, n]) -> y { y = norm(x, axis=1) }\n"
                                "op rn64(x: f64[b, n]) -> y { y = norm(x, axis=1) }",
                                file="rn.grad", fast_math=fast_math)
    m = import_module_text(text, f"subnormal_norm_{int(fast_math)}")
    x = np.array([[1e-40, 0, -1e-40], [3, 4, 0], [0, 0, 0]], np.float32)
    np.testing.assert_allclose(m.rn(x), [np.sqrt(2) * 1e-40, 5, 0], rtol=1e-5, atol=0)
    x64 = np.array([[1e-310, 0, -1e-310], [3, 4, 0]])
    np.testing.assert_allclose(m.rn64(x64), [np.sqrt(2) * 1e-310, 5], rtol=1e-12, atol=0)


@pytest.mark.skipif(bool(numba.config.BOUNDSCHECK),
                    reason="NUMBA_BOUNDSCHECK=1: bounds checks keep loops scalar")
def test_a_max_and_a_sum_in_one_loop_of_blocks_vectorise(import_module_text) -> None:
    """Cross-entropy's forward takes the row's max (with its NaN flag) and the dot with
    the targets in one loop over each block of the row.  A NaN flag carried from block
    to block through that loop kept LLVM from vectorising it (scalar, unrolled: the
    forward 1.7-1.9x slower on rows of 1024-16384); each block's loop has a flag of its
    own.  In the LLVM IR of the row kernel (float32), each loop with a NaN flag leaves
    one scalar NaN test at most: its vector loop's remainder."""
    text = gradc.compile_source("""
op xent(logits, target: nograd) -> loss {
    loss = mean(logsumexp(logits, axis=-1) - sum(logits * target, axis=-1))
}""", file="xent.grad")
    m = import_module_text(text, "xent_flag_blocks")
    x = np.random.default_rng(3).standard_normal(4 * 1024).astype(np.float32)
    t = np.full_like(x, 1 / 1024)
    # the kernels for targets of the logits' shape, and for a row of them (broadcast)
    names = re.findall(r"def (_grk\d+_xent_forward_0_chunks)\(", text)
    assert len(names) == 2
    for name in names:
        flag_loops = kernel_text(text, name).count("!= a0")
        assert flag_loops == 2                       # rows of one block; rows in blocks
        kernel = getattr(m, name)
        fresh = numba.njit(**{k: v for k, v in kernel.targetoptions.items()
                              if k not in ("cache", "nopython")})(kernel.py_func)
        part = np.zeros(1)                           # the mean's partial, float64
        fresh(part, x, t, 4, 1024, 1, 0, 1, x[:1])
        np.testing.assert_allclose(part[0] / 4, m.xent(x.reshape(4, 1024), t.reshape(4, 1024)),
                                   rtol=1e-6)
        ir = fresh.inspect_llvm(fresh.signatures[0])
        assert len(re.findall(r"fcmp uno <\d+ x float>", ir)) >= flag_loops, name
        assert len(re.findall(r"fcmp un[oe] float", ir)) <= flag_loops, name


def test_only_the_accumulations_are_reassociated(import_module_text) -> None:
    """Reduce kernels carry no fast-math flag of their own: their sums are
    ``_g_radd``, one ``fadd`` flagged reassoc (LLVM vectorises them in lanes). With
    reassoc on the whole kernel LLVM computed RMS norm's ``x / s * w`` as
    ``x * w / s``: inf or NaN where x * w overflows, from the row plan only (4096
    elements and more), finite from the unfused method and below."""
    text = gradc.compile_source("""
op rms(x, w, eps: nograd = 1e-6) -> y {
    y = x / sqrt(mean(x^2, axis=-1, keepdims=true) + eps) * w
}""", file="rms.grad")
    assert "reassoc" not in text.split("# rms.forward")[1].split("@numba.njit(parallel")[0]
    assert "_g_radd(" in text
    m = import_module_text(text, "rms_reassoc")
    x = np.full((1024, 4), 3e38, np.float32)
    w = np.array([1, 2, 3, 4], np.float32)
    assert np.array_equal(m.rms(x, w), np.zeros_like(x))
    x = (np.random.default_rng(2).standard_normal((1024, 4)) * 1e18).astype(np.float32)
    w = np.full(4, 1e30, np.float32)
    want = m.rms.unfused(x, w)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(m.rms(x, w), want, rtol=1e-5)


def test_fast_math_does_not_regroup_the_subtractions_of_log_softmax(import_module_text) -> None:
    """--fast-math reduce kernels keep FMA but not nsz, and reassoc only on their
    accumulations: nsz and reassoc on the whole kernel let LLVM compute (x - m) - lse
    as x - (m + lse), which rounded float32 log_softmax of logits near 1e4 to 5e-4
    instead of 1e-6."""
    text = gradc.compile_source("op lsm(x: f32[b, n]) -> y { y = log_softmax(x, axis=1) }",
                                file="lsm.grad", fast_math=True)
    assert 'fastmath={"contract"}' in text and '"nsz"' not in text.split("# lsm.forward")[1]
    m = import_module_text(text, "fast_math_log_softmax")
    x = (np.random.default_rng(0).standard_normal((4096, 8)) * 3 + 1e4).astype(np.float32)
    xd = x.astype(np.float64) - x.max(1, keepdims=True)
    want = xd - np.log(np.exp(xd).sum(1, keepdims=True))
    assert np.abs(m.lsm(x) - want).max() < 1e-5


def _summing_loops_that_store(text: str) -> list[str]:
    """The innermost loops of ``text`` that sum (or multiply) into a scalar,
    reassociated, and store to an output (``_o...``; the kernel's own rows, scratch
    ``_k``, sums across rows ``_g`` and stage rows ``_z``, lie apart from every other
    array)."""
    import ast
    bad = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.For) or any(
                isinstance(n, ast.For) for s in node.body for n in ast.walk(s)):
            continue
        sums = [n for s in node.body for n in ast.walk(s)
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                and n.value.func.id in ("_g_radd", "_g_rmul")]
        stores = [t for s in node.body for n in ast.walk(s)
                  for t in (n.targets if isinstance(n, ast.Assign) else
                            [n.target] if isinstance(n, ast.AugAssign) else [])
                  if isinstance(t, ast.Subscript) and ast.unparse(t.value).startswith("_o")]
        if sums and stores:
            bad.append(ast.unparse(node))
    return bad


def test_no_loop_both_stores_and_sums() -> None:
    """Every sum of a reduce kernel that shares a pass with stores to an output runs in
    a loop of its own (loop_ir.staged), for every op of this file and the row-wise
    examples, in every method; the kernel's own rows are allocated apart."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sources = [source("f32"), SOFTMAX_ROWS, *((root / "examples" / f).read_text(encoding="utf-8")
                                             for f in ("rowwise.grad", "arrays.grad",
                                                       "wgan_gp.grad"))]
    for text in sources:
        module = gradc.compile_source(text, file="staged.grad")
        assert "_g_radd(" in module
        assert _summing_loops_that_store(module) == []
        assert "np.empty(_N, " not in module and "np.zeros(_N, " not in module


@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_centred_sums_combine_their_blocks_exactly(modules, dt) -> None:
    """A centred sum (variance, co-moment) of long rows far from 0, with a trend along
    the row (every block's mean differs): the fused one-pass kernels (block co-moments
    combined with Chan's formula) agree with float64 NumPy's two passes to the
    rounding of the inputs (a sum of squares less the square of the sum would lose
    every digit here)."""
    m, dt = modules(dt)
    dtype = np.float64 if dt == "f64" else np.float32
    rng = np.random.default_rng(3)
    n = 5000
    trend = np.linspace(-300, 300, n) * (np.arange(6)[:, None] > 2)   # 3 rows without
    offset = 1e4 if dtype == np.float32 else 1e8
    x = (offset + trend + rng.standard_normal((6, n))).astype(dtype)
    z = (-offset / 2 + trend[:, ::-1] * (np.arange(6)[:, None] - 1.5)
         + rng.standard_normal((6, n))).astype(dtype)
    h = rng.standard_normal(n).astype(dtype)
    wide = [a.astype(np.longdouble) for a in (x, z, h)]
    want = REFERENCE["centred"](*wide)
    got = m.centred(x, z, h)
    tol = dict(rtol=2e-6) if dtype == np.float32 else dict(rtol=1e-11)
    for a, b in zip(got[:2], want[:2]):        # c and v (k is not a centred sum)
        np.testing.assert_allclose(np.asarray(a, np.longdouble), b, **tol)
    y = m.layernorm(x, np.ones(n, dtype), np.zeros(n, dtype))
    # y = (x - mean) * rstd: the mean rounded to the dtype (1e4 in float32: to 5e-4)
    np.testing.assert_allclose(y, REFERENCE["layernorm"](wide[0], 1.0, 0.0),
                               rtol=0, atol=1e-3 if dtype == np.float32 else 1e-7)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_centred_sums_whose_pivots_are_far_are_taken_again(modules, monkeypatch, dt,
                                                          split) -> None:
    """Rows longer than a block take their centred sums about pivots, the means of their
    first 16 values (loop_ir.PIVOT), and so does each segment of a split row: good where
    a value's mean lies within its spread of its pivot.  Rows (segments) where it does
    not (a step after the first 16 values, a ramp, a spike among the first 16) take
    them again about their exact means, and keep their digits (without that, a step of
    1e4 in float32 loses about 6 of them); rows where it does agree with the exact sums
    as well."""
    m, dt = modules(dt)
    if split:                               # 4 segments of 256 a row
        monkeypatch.setattr(m, "_G_SPLIT", (8, 64, 256))
    dtype = np.float64 if dt == "f64" else np.float32
    rng = np.random.default_rng(16)
    n = 1024
    x = rng.standard_normal((6, n))
    z = rng.standard_normal((6, n))
    x[0, 16:] += 1e4                                   # a step
    z[1, 16:] -= 3e3                                   # a step in the other value only
    x[2] += np.linspace(0, 50, n)                      # a ramp
    x[3, 5] = 1e5                                      # a spike among the first 16
    x[4] += 1e3                                        # far from 0, a good pivot
    x, z = x.astype(dtype), z.astype(dtype)
    h = rng.standard_normal(n).astype(dtype)
    wide = [a.astype(np.longdouble) for a in (x, z, h)]
    want = REFERENCE["centred"](*wide)
    got = m.centred(x, z, h)
    # c, a covariance of values of spread 1, can be near 0: its digits are those of 1
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-15)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(np.asarray(a, np.longdouble), b, **tol)


@pytest.mark.parametrize("split", [False, True])
def test_a_row_taken_again_keeps_numpys_digits(modules, monkeypatch, split) -> None:
    """A row whose pivot is far (a value of 1e13 among the first 16 of float64 noise)
    takes its co-moments again about its exact mean, in blocks added with their
    rounding kept: layer norm's output keeps NumPy's digits (summed one element at a
    time, 1.6e-12 off where NumPy is 5e-16; blocks added plainly, 1e-14: helper 55)."""
    m, _ = modules("f64")
    if split:
        monkeypatch.setattr(m, "_G_SPLIT", (8, 64, 8192))
    rng = np.random.default_rng(55)
    x = rng.standard_normal((2, 40000))
    x[:, 3] = 1e13
    g, h = np.ones(40000), np.zeros(40000)
    want = REFERENCE["layernorm"](x.astype(np.longdouble), 1.0, 0.0)
    err = np.abs(np.asarray(m.layernorm(x, g, h), np.longdouble) - want).max() / np.abs(want).max()
    assert err < 4e-15, err


@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_centred_sums_that_are_not_finite_are_numpys(modules, dt) -> None:
    """Where a centred sum's co-moment is not finite (an infinity in a row, a block's sum
    overflowing, a square overflowing), the row's sum is taken again as written:
    NumPy's +-inf or NaN, and a finite value where the terms are finite."""
    m, dt = modules(dt)
    dtype = np.float64 if dt == "f64" else np.float32
    big = np.finfo(dtype).max / 4
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 600)).astype(dtype)
    z = rng.standard_normal((5, 600)).astype(dtype)
    h = rng.standard_normal(600).astype(dtype)
    x[0, 7] = np.inf                    # +-inf or NaN, as NumPy
    x[1, 300:] = big                    # the square overflows: inf
    z[2, 400] = -np.inf
    h[500] = big                        # h's block sum overflows; the terms do not
    x[3] *= 1e-30 if dtype == np.float32 else 1e-300
    with np.errstate(all="ignore"):
        got = m.centred(x, z, h)
        want = m.centred.unfused(x, z, h)
    for a, b in zip(got, want):
        assert np.array_equal(np.isfinite(a), np.isfinite(b))
        assert np.array_equal(np.sign(a[~np.isfinite(a)]), np.sign(b[~np.isfinite(b)]),
                              equal_nan=True)
        np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=1e-4, atol=0)


def test_partials_of_one_column_are_summed_as_numpy_sums_them(modules, monkeypatch) -> None:
    """Partials of one column (a sum across many rows of one element) are NumPy's to
    sum, whatever GRADC_PARALLEL_MIN says: NumPy sums a (C, 1) array pairwise, not in
    chunk order as the parallel combine does for wider ones (found by helper 39: the
    last bits of ``db`` at 100000 x 1 changed with the setting)."""
    m, _ = modules("f64")
    rng = np.random.default_rng(2)
    partials = (rng.standard_normal((24, 1)) * 10.0 ** rng.integers(-8, 9, (24, 1)))
    in_order = np.zeros(1)
    for row in partials:
        in_order += row
    want = partials.sum(axis=0)
    assert in_order.tobytes() != want.tobytes()       # the two orders differ here
    monkeypatch.setattr(m, "_G_PARALLEL_MIN", 1)
    got = m._g_combine("op", "sum", partials, 24, (1,), np.float64)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("rows, n", [(16, 70000), (48, 300), (2000, 8), (1, 5000), (0, 7)])
def test_sums_across_rows_gather_into_their_partial_where_chunks_are_short(modules, rows,
                                                                          n, dt) -> None:
    """A sum across rows (layer norm's ``dh``, the sum of ``dy`` over rows) is gathered
    in the compute dtype, 16 rows at a time, then added to the chunk's float64
    partial; where no chunk has more than 16 rows the partial is of the compute dtype
    and the kernel gathers straight into it.  Either way the partials are the model's
    below, bit for bit (no row counted twice or lost, no float32 sum across the
    chunk's groups), and ``dh`` is their float64 sum in chunk order."""
    m, _ = modules(dt)
    t = np.float32 if dt == "f32" else np.float64
    rng = np.random.default_rng(11)
    x, g, h = make_args("layernorm", dict(b=rows, n=n), t, rng)
    dy = rng.standard_normal((rows, n)).astype(t)
    seen = []
    combine = m._g_combine

    def spy(op, kind, partials, *args, **kw):
        seen.append(np.array(partials))
        return combine(op, kind, partials, *args, **kw)
    m._g_combine = spy
    try:
        _, _, _, dh = m.layernorm.fwd_bwd(x, g, h, dy)
    finally:
        m._g_combine = combine
    _, _, chunks, _ = m._g_rows("layernorm", (rows, n), 1, None, cols=True)
    model = np.zeros((chunks, n))
    for ch in range(chunks):
        r0, r1 = ch * rows // chunks, (ch + 1) * rows // chunks
        gathered = np.zeros(n, t)
        for r in range(r0, r1):
            gathered += dy[r]
            if (r - r0) % 16 == 15 or r == r1 - 1:
                model[ch] += gathered
                gathered[:] = 0
    matching = [p for p in seen if np.array_equal(p.astype(np.float64), model)]
    assert matching, "no partial is the model's"       # (both are zeros without rows)
    partials = matching[0]
    assert partials.dtype == (t if rows <= 16 * chunks else np.float64)
    assert dh.tobytes() == model.sum(axis=0).astype(t).tobytes()
    np.testing.assert_allclose(dh, dy.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("op", ["layernorm", "colmean"])
def test_partials_across_rows_combine_in_one_parallel_pass(modules, op) -> None:
    """Sums and means across rows of a row's length (dw, db; a mean over axis 0) whose
    partials are large are combined by one parallel kernel straight into the result
    (the wrapper's _g_sum_chunks), with the bits of NumPy's sum over the chunks."""
    m, _ = modules("f32")
    rng = np.random.default_rng(5)
    args = make_args(op, dict(b=16, n=70000), np.float32, rng)
    seen = []
    combine = m._g_sum_chunks

    def spy(partials, count, into):
        combine(partials, count, into)
        seen.append((partials.copy(), count, into.copy()))
    m._g_sum_chunks = spy
    try:
        ys = getattr(m, op)(*args)
        ys = ys if isinstance(ys, tuple) else (ys,)
        ups = [rng.standard_normal(np.shape(y)).astype(np.float32) for y in ys]
        got = getattr(m, op).fwd_bwd(*args, *ups)
    finally:
        m._g_sum_chunks = combine
    assert seen and all(p.shape[0] > 1 for p, _, _ in seen)
    assert {count == -1 for _, count, _ in seen} == ({True} if op == "layernorm" else {False})
    for partials, count, into in seen:
        total = partials.sum(axis=0, dtype=np.float64)
        want = total if count == -1 else total / count
        assert into.tobytes() == want.astype(np.float32).tobytes()
    want = getattr(m, op).unfused.fwd_bwd(*args, *ups)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, **close(np.float32, b))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("chunks, n", [(64, 5000), (3, 2048), (2, 4097), (1, 9)])
def test_sum_of_chunks_has_numpys_bits(modules, chunks, n, dt) -> None:
    """_g_sum_chunks adds the chunks' blocks of columns into float64 rows in chunk
    order: NumPy's sum(axis=0) in float64 bit for bit, and its mean, in any block
    and tail of a block."""
    m, _ = modules("f32")
    rng = np.random.default_rng(chunks * n)
    partials = (rng.standard_normal((chunks, n)) * 10.0 ** rng.integers(-6, 7, (chunks, n)))
    partials = partials.astype(dt)
    for count in (-1, 7):
        into = np.empty(n, dt)
        m._g_sum_chunks(partials, count, into)
        total = partials.sum(axis=0, dtype=np.float64)
        want = total if count == -1 else total / count
        assert into.tobytes() == want.astype(dt).tobytes(), count


CONSTANT_ROWS = """
op parts(x) -> (mu, var, xc) {
    mu = mean(x, axis=-1, keepdims=true)
    xc = x - mu
    var = mean(xc^2, axis=-1, keepdims=true)
}
op lnorm(x, eps: nograd = 1e-5) -> y {
    xc = x - mean(x, axis=-1, keepdims=true)
    y = xc * rsqrt(mean(xc^2, axis=-1, keepdims=true) + eps)
}
"""


@pytest.mark.parametrize("split", [False, True])
def test_a_centred_values_mean_is_the_rows_exact_mean(import_module_text, split):
    """The mean of a centred sum's value is the row's exact mean (Chan's, rounded once),
    where its sum rounds on the way: a constant row of -1e30 (4096 of them: the sum's
    mean is an ulp, 1.4e14, off) has its value as its mean, so x - mean(x) is 0 as its
    variance is, and layer norm's output 0, not 4.5e16 (helper 53 found 110 of 300
    constant float64 rows so); rows in blocks, and split rows; and every row's variance
    is the mean of x - mean(x) squared as computed to the mean's rounding, at most a
    quarter of its spacing squared (a row of one block is centred on its sum's mean,
    as two passes centre it: to the last bits)."""
    m = import_module_text(gradc.compile_source(CONSTANT_ROWS, file="constant.grad"),
                           "constant_rows")
    m._G_ROWS_MIN = 0
    if split:
        m._G_SPLIT = (8, 64, 16)
    rng = np.random.default_rng(53)
    for n in (100, 4096, 5000):
        c = np.concatenate([[-1e30, 6.443401982788268e+20, 1e-300, 3.0],
                            rng.choice([-1, 1], 8) * 10 ** rng.uniform(-3, 30, 8)])
        x = np.repeat(c[:, None], n, axis=1)
        for noise in (0.0, 1e-15):
            x = x + rng.standard_normal(x.shape) * np.abs(c[:, None]) * noise
            mu, var, xc = m.parts(x)
            gap = (xc ** 2).mean(-1) - var[:, 0]
            assert np.all(np.abs(gap) <= np.spacing(mu[:, 0]) ** 2 / 4 + 1e-9 * var[:, 0]), n
            assert np.abs(m.lnorm(x)).max() <= 2 * np.sqrt(n), n
            if noise == 0.0 and n > 256:            # in blocks: the exact mean
                np.testing.assert_array_equal(mu[:, 0], c)
                np.testing.assert_array_equal(xc, 0 * x)
                np.testing.assert_array_equal(var, 0 * mu)
                np.testing.assert_array_equal(m.lnorm(x), 0 * x)
