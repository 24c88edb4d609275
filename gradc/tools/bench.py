"""``gradc bench``: gradc's fused kernels against what users would otherwise use.

Every op whose parameters fit a flat benchmark (generic or rank-1 parameters
get ``n`` elements; rank-2 ones ``n / 1000`` rows of 1000, as ``add_bias`` or a
1000-class ``softmax_xent``; ops with ``@`` are left to
``benchmarks/bench_mlp.py``) is run at each size ``n`` in the float dtype of its
annotations (float32 when generic), ``fwd_bwd`` with upstreams of ones.  ``shapes``
(``--shape NAME=DIMS``) gives parameters' shapes instead (:func:`input_shapes`).
Each op is run as:

* ``fused+out``   gradc's fused ``fwd_bwd`` writing preallocated ``out=`` buffers;
* ``fused``       the same, allocating its results, as users call it;
* ``unfused``     one kernel per primitive, every intermediate stored (``out=``);
* ``numpy``       the graph evaluated op by op with NumPy (the IR interpreter), or
  a hand-written NumPy function where a caller supplies one;
* ``numexpr``     one numexpr expression per output, from the IR (``out=``);
* ``jax.jit``     the forward graph in ``jax.numpy``, ``jax.vjp`` (``custom_vjp``
  for grad blocks), jitted; ``torch`` / ``torch.compile``: the same with torch
  ops and ``torch.autograd`` (``autograd.Function`` for grad blocks).

Frameworks that are not installed are left out (``pip install gradc[bench]``).
Each result is checked against ``fused+out`` before timing (max relative
error).  Within each repeat every variant runs once, in an order rotating from
repeat to repeat, each once the threads the previous one woke have gone to sleep
(:func:`time_interleaved`), together with two STREAM-like references on arrays of ``n``
elements: a Numba kernel reading two arrays and writing two (the traffic of a
one-input op's fused ``fwd_bwd``) and ``np.copyto``; medians are reported.
Effective GB/s counts each input and upstream read once and each result written
once, and is also given as a share of the 2-read/2-write kernel's bandwidth.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from gradc.codegen.runtime_src import parallel_min
from gradc.frontend.check import load_program
from gradc.ir.interpret import interpret
from gradc.pipeline import build_op
from gradc.tools.bench_frameworks import (Unsupported, jax_functions, numexpr_function,
                                          to_torch, torch_functions)
from gradc.tools.bench_report import GRADC_VARIANTS, format_report, machine_info

VARIANTS = (*GRADC_VARIANTS, "numpy", "numexpr", "jax.jit", "torch", "torch.compile")
REFERENCES = ("copy 2r/2w", "np.copyto")
DEFAULT_SIZES = (10**6, 10**7)
ROW = 1000          # columns of rank-2 parameters
SETTLE = 0.01       # seconds slept before each timed call (see time_interleaved)
QUIET_LIMIT = 0.2   # the most seconds waited for other threads to sleep (wait_quiet)
_NEEDS = {"numexpr": "numexpr", "jax.jit": "jax", "torch": "torch", "torch.compile": "torch"}


class Skip(Exception):
    """This op (or this size) is not benchmarked; the message says why."""


def available_variants() -> tuple[str, ...]:
    """The variants whose framework is importable here."""
    return tuple(v for v in VARIANTS
                 if v not in _NEEDS or importlib.util.find_spec(_NEEDS[v]) is not None)


# -- inputs -----------------------------------------------------------------------


def select_op(cop, shapes: Mapping[str, tuple] | None = None) -> None:
    """Raise :class:`Skip` unless ``cop`` fits this benchmark (a parameter of rank
    > 2 only where ``shapes`` gives its shape)."""
    if any(n.op == "matmul" for n in cop.methods["fwd_bwd"].graph):
        raise Skip("uses @ (matmul), which gradc bench does not time (the repository's "
                   "benchmarks/bench_mlp.py times an MLP step)")
    given = _given(cop, shapes)
    if any(len(p.shape) > 2 for p in cop.params
           if p.shape is not None and p.name not in given):
        raise Skip("a parameter of rank > 2 (give its shape with --shape NAME=DIMS)")
    if input_rank(cop) > 2 and not any(p.shape is None for p in cop.params if p.name in given):
        raise Skip(f"reduces over axis {input_rank(cop) - 1}: inputs of rank > 2 are "
                   "benchmarked only with shapes given (--shape NAME=DIMS)")


def input_rank(cop) -> int:
    """The rank unannotated parameters need: 1, or more where a method reduces over a
    further axis (``sum(x, axis=(0, 1))`` needs 2)."""
    rank = 1
    for m in cop.methods.values():
        for node in m.graph:
            axis = node.attr("axis", None)
            for a in (axis if isinstance(axis, tuple) else () if axis is None else (axis,)):
                if isinstance(a, int):
                    rank = max(rank, a + 1 if a >= 0 else -a)
    return rank


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"x=4096,1024"`` or ``"x=4096x1024"`` -> ``("x", (4096, 1024))``; ValueError
    naming the problem for anything else."""
    name, eq, dims = (part.strip() for part in text.partition("="))
    if not eq:
        raise ValueError(f"{text!r} is not NAME=DIMS (e.g. x=4096,1024)")
    if not name:
        raise ValueError(f"{text!r}: no parameter name before '='")
    if not name.isidentifier():
        raise ValueError(f"{text!r}: {name!r} is not a parameter name")
    if not dims:
        raise ValueError(f"{text!r}: no dimensions after '=' (e.g. {name}=4096,1024)")
    out = []
    for d in dims.replace("\u00d7", ",").replace("x", ",").split(","):
        d = d.strip()
        if not d.isdigit() or not d.isascii():
            raise ValueError(f"{text!r}: dimension {d!r} is not a positive integer"
                             if d else f"{text!r}: an empty dimension")
        if int(d) == 0:
            raise ValueError(f"{text!r}: dimensions must be positive, got 0")
        out.append(int(d))
    return name, tuple(out)


class ShapeError(ValueError):
    """A ``shapes`` argument that is malformed or names no benchmarked parameter
    (``gradc bench`` exits 2)."""


def check_shapes(shapes: Mapping | None) -> dict[str, tuple[int, ...]]:
    """``shapes`` as ``{name: (dims...)}`` (an int for one dim); :class:`ShapeError`
    for a name that is not a string or dims that are not positive integers."""
    out = {}
    for name, dims in (shapes or {}).items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ShapeError(f"shape for {name!r}: not a parameter name")
        dims = (dims,) if isinstance(dims, (int, np.integer)) else dims
        try:
            dims = tuple(dims)
        except TypeError:
            raise ShapeError(f"shape of {name}: {dims!r} is not a tuple of dims") from None
        if not dims or any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer))
                           or d <= 0 for d in dims):
            raise ShapeError(f"shape of {name}: {dims!r}: dims must be positive integers "
                             "(at least one)")
        out[name] = tuple(int(d) for d in dims)
    return out


def _given(cop, shapes: Mapping[str, tuple] | None) -> dict[str, tuple]:
    """The shapes of ``shapes`` that apply to ``cop``: its parameters without a default
    (a default is passed as the scalar it is)."""
    return {p.name: tuple(shapes[p.name]) for p in cop.params
            if shapes and p.name in shapes and not p.has_default}


def input_shapes(cop, n: int, shapes: Mapping[str, tuple] | None = None) -> list:
    """The shape of each parameter, in order (None for one with a default, passed as
    its default): a shape in ``shapes`` as given; unannotated parameters ``(n,)``, or
    ``(n // ROW, ROW)`` where the op reduces over axis 1, or the shape given to another
    unannotated parameter (they broadcast together); rank <= 1 annotated ones ``n``
    elements per named dim, rank-2 ones ``(n // ROW, ROW)``; named dims kept consistent,
    those of given shapes first (a rank-2 parameter with one dim fixed by them gets
    about ``n`` elements)."""
    given = _given(cop, shapes)
    dims: dict = {}
    for p in cop.params:
        shape = given.get(p.name)
        if shape is not None and p.shape is not None and len(p.shape) == len(shape):
            for d, size in zip(p.shape, shape):
                if not isinstance(d, int):
                    dims.setdefault(d, size)
    fixed = dict(dims)
    for p in cop.params:
        if p.shape is not None and len(p.shape) == 2 and p.name not in given:
            rows, cols = (None if isinstance(d, int) else fixed.get(d) for d in p.shape)
            if rows is None and cols is not None:
                rows = max(n // cols, 1)
            elif cols is None and rows is not None:
                cols = max(n // rows, 1)
            else:
                rows, cols = max(n // ROW, 1), min(ROW, n)
            for d, size in zip(p.shape, (rows, cols)):
                dims.setdefault(d, size)
    follow = next((given[p.name] for p in cop.params if p.name in given and p.shape is None),
                  None)
    out = []
    for p in cop.params:
        if p.has_default:
            out.append(None)
        elif p.name in given:
            out.append(given[p.name])
        elif p.shape is None:
            out.append(follow if follow is not None else
                       (max(n // ROW, 1), min(ROW, n)) if input_rank(cop) == 2 else (n,))
        else:
            out.append(tuple(d if isinstance(d, int) else dims.setdefault(d, n)
                             for d in p.shape))
    return out


def make_inputs(cop, n: int, rng, shapes: Mapping[str, tuple] | None = None) -> list:
    """One value per parameter, in order: defaults as 0-d arrays, the others of the
    shapes of :func:`input_shapes`, values N(0, 3^2) (bool: random); integers uniform in
    [0, d) for ``d`` the smallest dim of the float arrays: valid indices into any of
    their axes (a cross-entropy's labels, which ``one_hot`` refuses below 0)."""
    all_shapes = input_shapes(cop, n, shapes)
    dims = [d for p, s in zip(cop.params, all_shapes)
            if not p.has_default and p.dtype not in ("i32", "i64", "bool") for d in s]
    out = []
    for p, shape in zip(cop.params, all_shapes):
        if p.has_default:
            out.append(np.asarray(p.default))
            continue
        if p.dtype in ("i32", "i64"):
            out.append(rng.integers(0, max(min(dims, default=3), 1), shape,
                                    dtype=np.int32 if p.dtype == "i32" else np.int64))
            continue
        x = rng.standard_normal(shape) * 3
        dt = {"f64": np.float64, "f16": np.float16, "bool": np.bool_}.get(p.dtype, np.float32)
        out.append((x > 0) if dt is np.bool_ else x.astype(dt))
    return out


def _positional(cop, args: list) -> list:
    return [a for a, p in zip(args, cop.params) if not p.has_default]


def _compute_dtype(args: list):
    floats = [a.dtype for a in args if a.ndim and np.issubdtype(a.dtype, np.floating)]
    return np.result_type(*floats) if floats else np.dtype(np.float32)


# -- timing --------------------------------------------------------------------------


def busy_threads() -> int | None:
    """How many threads of this process, the calling one aside, are running or waiting
    for a core (state R in ``/proc/self/task/*/stat``): a library's workers spinning
    after its last call (OpenMP's spin for milliseconds, OpenBLAS's for about 0.1 s);
    threads asleep in a wait are S.  None where there is no ``/proc`` (not Linux)."""
    me = threading.get_native_id()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    busy = 0
    for tid in tids:
        if tid == str(me):
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:                 # the thread has ended
            continue
        busy += stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] == b"R"
    return busy


def wait_quiet(limit: float | None = None, poll: float = 0.001,
               busy: Callable[[], int | None] = busy_threads,
               sleep: Callable[[float], object] = time.sleep,
               clock: Callable[[], float] = time.perf_counter) -> bool:
    """Sleep until no other thread of this process runs (:func:`busy_threads`), so that
    no library's workers spin while the next one is timed; False if some still ran
    after ``limit`` seconds (default :data:`QUIET_LIMIT`; a thread of the program's own
    that never sleeps), True also where threads cannot be seen."""
    end = clock() + (QUIET_LIMIT if limit is None else limit)
    while busy():
        if clock() >= end:
            return False
        sleep(poll)
    return True


def time_interleaved(variants: Mapping[str, Callable[[], object]], repeat: int,
                     settle: float = 0.0, wake: bool = True,
                     quiet: dict | None = None) -> dict[str, list[float]]:
    """Seconds of each callable per repeat; each repeat runs all, order rotating.

    Each visit sleeps ``settle`` seconds, then waits until no other thread of the
    process runs (:func:`wait_quiet`: the worker threads the previous library left
    spinning have gone to sleep; one process, so every library's inputs stay in
    memory once and a variant's threads are seen and waited for, which they would
    not be in another process), calls once untimed if ``wake`` (waking this
    library's workers: on a loaded machine a woken thread can wait milliseconds for
    a core, which a loop calling the same op never sees), then times one call.
    ``quiet``, where given, gets ``"busy"``: the names of the variants timed while
    another thread still ran after :data:`QUIET_LIMIT` seconds (one per visit)."""
    names = list(variants)
    samples: dict[str, list[float]] = {k: [] for k in names}
    busy = quiet.setdefault("busy", []) if quiet is not None else []
    for r in range(repeat):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn = variants[name]
            if settle:
                time.sleep(settle)
            if not wait_quiet():
                busy.append(name)
            if wake:
                fn()
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return samples


def max_rel_err(a, b) -> float:
    """max |a - b| / max(|b|, 1): a scale-aware worst-case difference."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a64.shape != b64.shape:
        return float("inf")
    if not a64.size:
        return 0.0
    d = np.atleast_1d(np.abs(a64 - b64) / np.maximum(np.abs(b64), 1.0))
    d[np.atleast_1d(np.isnan(a64) & np.isnan(b64))] = 0.0
    return float(np.max(d))


_COPY_KERNELS: list = []


def copy_kernel() -> Callable:
    """``y = x + dy, dx = x - dy``: two reads and two writes per element, no math;
    threaded from the size where gradc's kernels are (``GRADC_PARALLEL_MIN``)."""
    if not _COPY_KERNELS:
        import numba

        def two_in_two_out(x, dy, y, dx):
            for i in numba.prange(x.size):
                a = x[i]
                b = dy[i]
                y[i] = a + b
                dx[i] = a - b
        _COPY_KERNELS.extend([numba.njit(two_in_two_out), numba.njit(parallel=True)(two_in_two_out)])
    serial, parallel = _COPY_KERNELS
    threshold = parallel_min()
    return lambda *a: (parallel if a[0].size >= threshold else serial)(*a)


_TWO_PASS_KERNELS: list = []


def two_pass_kernel() -> Callable:
    """The least a row-wise ``fwd_bwd`` with a row statistic can do, written by hand:
    RMS norm without a weight over rows of ``n`` (``x``, ``dy``, ``y``, ``dx`` flat,
    float32 or float64; called as ``kernel(x, dy, y, dx, n)``), two passes per row: one
    summing ``x * x`` and ``x * dy`` (blocks of 256 in the dtype, added in float64; the
    kernel flagged ``reassoc``, as gradc's sums are, so that LLVM vectorises them: without
    it they were scalar, and the floor 10-35 points of the copy lower),
    one writing ``y = x * r`` and ``dx = r * dy - x * r**3 * mean(x * dy)``
    (``r = 1 / sqrt(mean(x * x) + 1e-5)``); threaded over rows.  The same reads and
    writes as the copy, each input read twice: the second read comes from the cache
    where a row fits, from the next level where it does not (rows of 262144 float32
    are 1 MB an array), so its share of the copy is what two passes allow at a shape
    on a machine."""
    if not _TWO_PASS_KERNELS:
        import numba

        @numba.njit(cache=True, error_model="numpy", fastmath={"reassoc"})
        def row(x, dy, y, dx, lo, n):
            # unsigned indices: a signed one (that could be negative) is wrapped around,
            # which keeps LLVM from vectorising; no slices (their reference counts are
            # atomic operations, much of a row of 64)
            t = x.dtype.type
            u = np.uintp
            ss = 0.0
            sd = 0.0
            for b in range(lo, lo + n, 256):
                e = min(b + 256, lo + n)
                fs = t(0.0)
                fd = t(0.0)
                for i in range(u(b), u(e)):
                    fs += x[i] * x[i]
                    fd += x[i] * dy[i]
                ss += fs
                sd += fd
            r = t(1.0 / np.sqrt(ss / n + 1e-5))
            c = t(r * r * r * (sd / n))
            for i in range(u(lo), u(lo + n)):
                y[i] = x[i] * r
                dx[i] = r * dy[i] - x[i] * c

        def rows(x, dy, y, dx, n):
            for k in numba.prange(x.size // n):
                row(x, dy, y, dx, k * n, n)
        _TWO_PASS_KERNELS.extend([numba.njit(rows), numba.njit(parallel=True)(rows)])
    serial, parallel = _TWO_PASS_KERNELS
    threshold = parallel_min()
    return lambda x, dy, y, dx, n: (parallel if x.size >= threshold else serial)(x, dy, y, dx, n)


# -- one op at one size ----------------------------------------------------------------


def _framework_runner(name: str, fn: Callable, args: list, ups: list, ref: Sequence):
    """A zero-argument call of ``name``'s fwd_bwd on these inputs, and a function
    giving its results as NumPy arrays."""
    if name == "numexpr":
        outs = [np.empty_like(r) for r in ref]
        return (lambda: fn(*args, *ups, out=outs)), list
    if name == "jax.jit":
        import jax
        import jax.numpy as jnp
        ja = [jnp.asarray(a) for a in args + ups]
        return (lambda: jax.block_until_ready(fn(*ja))), (lambda r: [np.asarray(x) for x in r])
    ta = to_torch(args + ups)
    return (lambda: fn(*ta)), (lambda r: [x.detach().numpy() for x in r])


def build_frameworks(cop, variants: Sequence[str], dtype) -> tuple[dict, dict]:
    """Each framework variant's functions for ``cop`` (built once per op; compiled
    on first call), and the reason for each that cannot be built."""
    fns, why = {}, {}
    builders = {"numexpr": lambda: numexpr_function(cop, dtype),
                "jax.jit": lambda: jax_functions(cop, dtype)[1],
                "torch": lambda: torch_functions(cop, dtype)[1],
                "torch.compile": lambda: torch_functions(cop, dtype, compile=True)[1]}
    for v in variants:
        if v not in builders:
            continue
        if v == "torch.compile":
            import torch._dynamo
            torch._dynamo.reset()       # one op's guards at a time (the recompile limit)
        try:
            fns[v] = builders[v]()
        except Unsupported as exc:
            why[v] = str(exc)
        except Exception as exc:        # a framework that cannot express this op
            why[v] = f"{type(exc).__name__}: {exc}"
    return fns, why


def bench_case(module, cop, args: list, variants: Sequence[str], fns: dict, why: dict,
               repeat: int, warmup: int, numpy_ref: Callable | None = None,
               settle: float = SETTLE) -> dict:
    """Time every variant of ``cop`` on ``args`` (one value per parameter) with the
    copy references, after checking each result against ``fused+out``'s."""
    op = getattr(module, cop.op.name)
    pos = _positional(cop, args)
    dtype = _compute_dtype(args)
    ys = op(*pos)
    ups = [np.ones_like(y) for y in (ys if isinstance(ys, tuple) else (ys,))]
    ref = op.fwd_bwd(*pos, *ups)
    ref = ref if isinstance(ref, tuple) else (ref,)
    outs, outs_u = (tuple(np.empty_like(r) for r in ref) for _ in range(2))
    graph = cop.methods["fwd_bwd"].graph
    calls: dict[str, tuple[Callable, Callable]] = {
        "fused+out": (lambda: op.fwd_bwd(*pos, *ups, out=outs), list),
        "fused": (lambda: op.fwd_bwd(*pos, *ups), list),
        "unfused": (lambda: op.unfused.fwd_bwd(*pos, *ups, out=outs_u), list),
        "numpy": ((lambda: numpy_ref(*pos, *ups)) if numpy_ref is not None else
                  (lambda: interpret(graph, args + ups, dtype=dtype)), list),
    }
    calls.update((v, _framework_runner(v, fns[v], args, ups, ref)) for v in variants
                 if v not in calls and v in fns)
    calls = {v: calls[v] for v in variants if v in calls}
    unavailable = {v: r for v, r in why.items() if v in variants}
    first, errs = _first_calls(calls, ref, unavailable)
    n = max(np.size(a) for a in args)
    ca = [np.ones(n, dtype) for _ in range(4)]
    kernel = copy_kernel()
    timed = {v: run for v, (run, _) in calls.items() if v in first}
    timed["copy 2r/2w"] = lambda: kernel(*ca)
    timed["np.copyto"] = lambda: np.copyto(ca[2], ca[0])
    for _ in range(warmup + 1):
        for fn in timed.values():
            fn()
    quiet: dict = {}
    samples = time_interleaved(timed, repeat, settle, quiet=quiet)
    med = {k: float(np.median(s)) for k, s in samples.items()}
    nbytes = sum(np.asarray(a).nbytes for a in args if np.ndim(a)) + \
        sum(u.nbytes for u in ups) + sum(r.nbytes for r in ref)
    copy_gbs = 4 * ca[0].nbytes / med["copy 2r/2w"] / 1e9
    res = {"op": cop.op.name, "n": int(n), "dtype": np.dtype(dtype).name,
           "shapes": {p.name: list(np.shape(a)) for p, a in zip(cop.params, args)},
           "bytes": int(nbytes), "variants": {}, "references": {}, "unavailable": unavailable,
           "busy": {v: quiet["busy"].count(v) for v in dict.fromkeys(quiet["busy"])}}
    for v in first:
        gbs = nbytes / med[v] / 1e9
        res["variants"][v] = {"median_s": med[v], "min_s": min(samples[v]),
                              "samples_s": samples[v], "first_call_s": first[v], "gbs": gbs,
                              "pct_copy": 100 * gbs / copy_gbs, "max_rel_err": errs[v]}
    for k, traffic in (("copy 2r/2w", 4), ("np.copyto", 2)):
        res["references"][k] = {"median_s": med[k], "samples_s": samples[k],
                                "gbs": traffic * ca[0].nbytes / med[k] / 1e9}
    res["traffic"] = plan_traffic(cop, dtype)
    return res


def plan_traffic(cop, dtype=np.float32) -> dict:
    """Bytes per element, at compute dtype ``dtype`` (float32 or float64), that
    ``fwd_bwd``'s fused CPU plan and its unfused plan move over the op's largest loop
    shape (:func:`gradc.tools.explain.element_traffic`): their ratio bounds how much faster
    fusion can make a memory-bound op."""
    from gradc.tools.explain import element_traffic
    from gradc.passes.fuse_reduce import cpu_plan
    method = cop.methods["fwd_bwd"]
    at = "float32" if np.dtype(dtype) == np.float16 else np.dtype(dtype).name  # T of float16
    fused = element_traffic(cpu_plan(method.fused), at)
    unfused = element_traffic(method.unfused, at)
    shape = max(unfused, key=lambda s: (len(s.static) + bool(s.dyn), unfused[s]))
    return {"shape": str(shape), "dtype": at, "fused_B": fused.get(shape, 0),
            "unfused_B": unfused[shape]}


def _first_calls(calls: dict, ref: Sequence, unavailable: dict) -> tuple[dict, dict]:
    """Each variant's first call (compiling, or loading from a cache): its seconds
    and its max relative error against ``ref``; a variant that fails goes to
    ``unavailable`` with the reason."""
    first, errs = {}, {}
    for v, (run, to_np) in calls.items():
        try:
            t0 = time.perf_counter()
            res = run()
            first[v] = time.perf_counter() - t0
            res = res if isinstance(res, (tuple, list)) else (res,)
            errs[v] = max(max_rel_err(a, b) for a, b in zip(to_np(res), ref))
        except Exception as exc:
            first.pop(v, None)
            unavailable[v] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return first, errs


# -- a whole file -------------------------------------------------------------------


def _memory_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_bench(path: str | Path, sizes: Sequence[int] = DEFAULT_SIZES, repeat: int = 11,
              warmup: int = 2, variants: Sequence[str] | None = None,
              ops: Sequence[str] | None = None, precise: bool = False,
              numpy_refs: Mapping[str, Callable] | None = None,
              progress: bool | None = None, settle: float = SETTLE,
              shapes: Mapping[str, Sequence[int]] | None = None) -> dict:
    """Benchmark every op of ``path`` that fits at every size; the report as a dict
    (what ``--json`` writes).  ``variants``: a subset of :data:`VARIANTS` (default:
    all available); ``progress``: a tqdm bar on stderr (default: when it is a TTY);
    ``shapes``: ``{parameter name: dims}`` used for every op with a parameter of that
    name, instead of a shape chosen from ``n`` (:func:`input_shapes`; an op whose
    shapes are all given runs once, not once per size; its results have
    ``shapes_given``); :class:`ShapeError` for a name no benchmarked op has."""
    import gradc
    load_before = _loadavg()
    shapes = check_shapes(shapes)
    variants = tuple(v for v in (variants or available_variants()) if v in VARIANTS)
    program = load_program(path)
    unknown = [n for n in ops or () if n not in program.main_ops]
    if unknown:
        from gradc.tools.explain import unknown_op_error
        raise unknown_op_error(path, unknown, program.main_ops)
    selected, skipped = [], []
    for name in program.main_ops:
        if ops is not None and name not in ops:
            continue
        try:
            cop = build_op(program.ops[name], program.ops, program.consts)
            select_op(cop, shapes)
            selected.append(cop)
        except Skip as exc:
            skipped.append({"op": name, "reason": str(exc)})
        except Exception as exc:        # an op this version cannot compile
            skipped.append({"op": name, "reason": f"{type(exc).__name__}: {exc}"})
    _check_shape_names(shapes, selected, skipped, program)
    module = gradc.load(path, **({"precise": True} if precise else {}))
    _set_threads(variants)
    rng = np.random.default_rng(0)
    bar = _progress(len(selected) * len(sizes), progress)
    results = []
    for cop in selected:
        dtype = _compute_dtype(make_inputs(cop, 2, rng))
        fns, why = build_frameworks(cop, variants, dtype)
        given = {k: list(v) for k, v in _given(cop, shapes).items()}
        done = set()
        for n in sizes:
            bar.set_postfix_str(f"{cop.op.name} n={n:.0e}")
            case = tuple(input_shapes(cop, n, shapes))
            if case in done:            # every shape given or fixed by them: run once
                bar.update(1)
                continue
            done.add(case)
            at = {"n": n, "shapes": given} if given else {"n": n}
            args = None
            try:
                args = make_inputs(cop, n, rng, shapes)
                _check_memory(cop, args)
                res = bench_case(module, cop, args, variants, fns, why, repeat, warmup,
                                 (numpy_refs or {}).get(cop.op.name), settle)
                results.append({**res, "shapes_given": given})
            except Skip as exc:
                skipped.append({"op": cop.op.name, **at, "reason": str(exc)})
            except MemoryError as exc:      # inputs too large to make (--sizes 1e12)
                skipped.append({"op": cop.op.name, **at, "reason":
                                f"its inputs do not fit in memory ({exc}): choose smaller "
                                f"--sizes or --shape"})
            except (ValueError, TypeError, IndexError) as exc:    # inputs the op refuses
                used = ", ".join(f"{p.name} {np.shape(a)}" for p, a in zip(cop.params, args)
                                 if np.ndim(a)) if args else "?"
                advice = ("the shapes given do not fit it: give shapes it accepts "
                          "(--shape NAME=DIMS for each parameter)" if given else
                          "annotate its parameters' shapes (x: f32[b, k]) or give them "
                          "(--shape NAME=DIMS)")
                skipped.append({"op": cop.op.name, **at, "reason":
                                f"the op refused inputs of shapes {used} ({exc}); {advice}"})
            args = None
            gc.collect()
            bar.update(1)
    bar.close()
    return {"spec": str(path), "sizes": list(sizes), "repeat": repeat, "warmup": warmup,
            "shapes": {k: list(v) for k, v in shapes.items()},
            "settle_s": settle, "variants": list(variants), "precise": precise,
            "numpy": "hand-written" if numpy_refs else "IR interpreter (op by op)",
            "machine": {**machine_info(variants), "loadavg_before": load_before,
                        "loadavg_after": _loadavg()},
            "results": results, "skipped": skipped}


def _check_shape_names(shapes: Mapping[str, tuple], selected: list, skipped: list,
                       program) -> None:
    """:class:`ShapeError` unless every name in ``shapes`` is a parameter (without a
    default) of a benchmarked op."""
    params = list(dict.fromkeys(p.name for cop in selected for p in cop.params
                                if not p.has_default))
    unknown = [k for k in shapes if k not in params]
    if not unknown:
        return
    notes = []
    for k in unknown:
        defaults = [cop.op.name for cop in selected
                    if any(p.name == k and p.has_default for p in cop.params)]
        if defaults:
            notes.append(f"{k} has a default in {', '.join(defaults)} (passed as that scalar)")
        notes += [f"{s['op']} has a parameter {k} but is not benchmarked: {s['reason']}"
                  for s in skipped if any(p.name == k for p in program.ops[s["op"]].params)]
    raise ShapeError(f"no benchmarked op has a parameter named {', '.join(unknown)} "
                     f"(their parameters: {', '.join(params) or 'none'})"
                     + "".join(f"; {note}" for note in notes))


def _loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages: other work competing for the cores."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _check_memory(cop, args: list) -> None:
    """Skip a size whose arrays would not fit: the NumPy interpreter, the unfused
    kernels and autograd's saved tensors may hold about one array per node of the
    fwd_bwd graph at once, besides the inputs, buffers and references (about 14)."""
    nodes = sum(1 for node in cop.methods["fwd_bwd"].graph if node.op != "const")
    need = (14 + nodes) * max(np.asarray(a).nbytes for a in args)
    avail = _memory_available()
    if avail is not None and need > 0.8 * avail:
        raise Skip(f"needs about {need / 1e9:.1f} GB, {avail / 1e9:.1f} GB available")


def _set_threads(variants: Sequence[str]) -> None:
    """Every library on the same threads as Numba's kernels."""
    import numba
    k = numba.get_num_threads()
    if any(v.startswith("torch") for v in variants):
        import torch
        torch.set_num_threads(k)
    if "numexpr" in variants:
        import numexpr
        numexpr.set_num_threads(k)


class _NoBar:
    def set_postfix_str(self, s: str) -> None:
        pass

    def update(self, k: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool | None):
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="gradc bench", unit="case", file=sys.stderr, leave=False)


def bench_file(path: str | Path, n: int | None = 10**7, repeat: int = 11,
               precise: bool = False, *, sizes: Sequence[int] | None = None,
               variants: Sequence[str] = (*GRADC_VARIANTS, "numpy"),
               progress: bool | None = False, color: bool = False, **kw) -> str:
    """The benchmark tables of ``path`` as text (gradc's variants and NumPy by
    default; :func:`run_bench` for the rest, ``shapes={"x": (4096, 1024)}`` among
    them; ``progress`` as there; ``color``: ANSI styles)."""
    sizes = sizes or ([n] if n else DEFAULT_SIZES)
    return format_report(run_bench(path, sizes, repeat, variants=variants, precise=precise,
                                   progress=progress, **kw), color=color)
