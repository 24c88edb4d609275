#!/usr/bin/env python
"""Check and time gradc's CUDA kernels on a GPU (or, tiny, in Numba's CUDA simulator).

One run does everything a GPU session needs:

1. **Correctness**: every op of every module, ``forward``, ``vjp``,
   ``fwd_bwd`` and ``jvp`` (where the op has one), fused and ``.unfused``, in float32 and float64, on the
   device against gradc's IR interpreter (``gradc.ir.interpret``: each
   method's graph op by op with NumPy, in the same dtype) on the same inputs
   (maximum relative error; NaN must match NaN).
2. **Bandwidth**: each elementwise op's fused ``fwd_bwd`` (``out=``
   buffers), its ``.unfused.fwd_bwd``, and a device-to-device copy, at
   2^26 and 2^28 float32 elements: CUDA events around ``--calls``
   back-to-back calls (so Python's launch overhead hides behind the GPU's
   work), after warm-ups, median of ``--repeat``; bytes moved are the
   arrays read and written once each; GB/s and % of the copy's GB/s.
3. **Math**: the maximum error in ULP of the CUDA kernels' math
   (libdevice; and CUDA's fast intrinsics under ``--fast-math``) over a
   float32 sample (random bit patterns plus special values) against
   NumPy's float64, next to the tolerance of the CPU library (4 ULP).
4. **Row-wise**: each op of ``examples/rowwise.grad`` (softmax, log-softmax,
   layer norm, RMS norm, cross-entropy; one reduce kernel per fused group) at
   ``--row-shapes`` (4096x1024, 65536x64, 16x262144), float32, on the inputs of
   ``benchmarks/rowwise_cases.py``: the fused ``fwd_bwd`` (``out=`` buffers)
   against a device-to-device copy of the same traffic (2 reads + 2 writes of
   the rows) and PyTorch's native CUDA kernels with autograd (where torch has
   CUDA; else recorded as skipped, with the reason), timed like the bandwidth
   table; gradc's and torch's results against the float64 NumPy reference and
   against each other (max relative error; gradc's must be within 1e-4); where the
   shape splits rows (few long rows: a block per segment of a row), the same call
   keeping whole rows too, so that the run measures what splitting gains.

Modules come from ``.grad`` files compiled with ``--target all`` (needs
gradc importable), or pre-generated with ``--prepare DIR`` and passed with
``--modules DIR`` (a GPU machine without gradc's dependencies needs only
numpy, numba and numba-cuda; torch for the row-wise peer).

Run::

    python benchmarks/gpu_check.py --prepare .gpu     # here: write the modules
    python benchmarks/gpu_check.py --modules .gpu     # there: check and time
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/gpu_check.py --log2-sizes 8 --repeat 2 \\
        --calls 1 --dtypes float32 --math-samples 256 --row-shapes 2x16  # the simulator (CI)
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import os
import pickle
import re
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from rowwise_cases import SHAPES, make_inputs, reference, torch_math, torch_runner  # noqa: E402

SPECS = [ROOT / "examples" / "seed.grad", ROOT / "examples" / "activations.grad"]
ROWWISE = ROOT / "examples" / "rowwise.grad"
ROW_TOL = 1e-4      # rel_err of the row-wise results against float64 NumPy
# One op per function of the math table: name -> .grad expression in x.
MATH = {"exp": "exp(x)", "exp2": "exp2(x)", "expm1": "expm1(x)", "log": "log(x)",
        "log2": "log2(x)", "log10": "log10(x)", "log1p": "log1p(x)", "tanh": "tanh(x)",
        "sigmoid": "sigmoid(x)", "softplus": "softplus(x)", "erf": "erf(x)", "erfc": "erfc(x)",
        "sin": "sin(x)", "cos": "cos(x)", "atan": "atan(x)", "sqrt": "sqrt(x)",
        "rsqrt": "rsqrt(x)"}
REFERENCE = {"sigmoid": lambda x: 1 / (1 + np.exp(-x)),
             "softplus": lambda x: np.logaddexp(0, x), "rsqrt": lambda x: 1 / np.sqrt(x),
             "atan": np.arctan,
             "erf": lambda x: np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64),
             "erfc": lambda x: np.frompyfunc(math.erfc, 1, 1)(x).astype(np.float64)}


def math_source() -> str:
    return "\n".join(f"op m_{n}(x) -> y {{\n    y = {e}\n}}" for n, e in MATH.items()) + "\n"


def prepare(out_dir: Path, n: int = 1000, dtypes=(np.float32, np.float64),
            unroll_variants=(), references: bool = True) -> list[Path]:
    """Compile the examples (``--target all``), the row-wise example (``--target
    cuda``: its reference is NumPy's) and the math table into ``out_dir``, and save
    the IR interpreter's results on sampled inputs (``expected.pkl``; not with
    ``references=False``, for a run that checks nothing); ``unroll_variants`` adds the examples'
    CUDA kernels compiled with other unroll factors (``NAME_u4_gen.py``), which
    the bandwidth table compares."""
    import gradc
    from gradc.frontend.check import load_program
    from gradc.pipeline import build_program

    out_dir.mkdir(parents=True, exist_ok=True)
    paths, cases = [], []
    for spec in SPECS:
        path = Path(gradc.compile_file(spec, out_dir / f"{spec.stem}_gen.py", target="all"))
        paths.append(path)
        if references:
            cases += reference_cases(import_path(path), build_program(load_program(spec)), n,
                                     dtypes, np.random.default_rng(0))
    if references:
        with open(out_dir / "expected.pkl", "wb") as f:
            pickle.dump(cases, f)
    paths.append(Path(gradc.compile_file(ROWWISE, out_dir / "rowwise_gen.py", target="cuda")))
    for k in unroll_variants:                  # the same kernels, another unroll factor
        for spec in SPECS:
            os.environ["GRADC_CUDA_UNROLL"] = str(k)
            try:
                paths.append(Path(gradc.compile_file(
                    spec, out_dir / f"{spec.stem}_u{k}_gen.py", target="cuda")))
            finally:
                del os.environ["GRADC_CUDA_UNROLL"]
    for fast in (False, True):
        name = "math_fast_gen" if fast else "math_gen"
        text = gradc.compile_source(math_source(), file="math.grad", target="cuda",
                                    fast_math=fast)
        (out_dir / f"{name}.py").write_text(text, encoding="utf-8")
        paths.append(out_dir / f"{name}.py")
    return paths


def import_path(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module            # Numba's cache wants an importable module
    spec.loader.exec_module(module)
    return module


# -- inputs --------------------------------------------------------------------------


def positional(op, method: str = "forward") -> list[str]:
    """The positional parameters of ``op``'s ``method`` wrapper."""
    fn = op._methods[method] if op._methods else op.cuda._methods[method]
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind == p.POSITIONAL_ONLY]


def sample(module, name: str, op, n: int, dtype, rng) -> list[np.ndarray]:
    """Host inputs for ``op``'s positional parameters: unshaped ones of ``n``
    elements, named dims 3, 4, 5...; normal values (integers and bools random)."""
    sig = {p: (dt, shape) for p, dt, shape in getattr(module, f"_SIG_{name}")}
    dims: dict = {}
    out = []
    for p in positional(op):
        dt, shape = sig.get(p, (None, None))
        shp = (n,) if shape is None else tuple(
            d if isinstance(d, int) else dims.setdefault(d, 3 + len(dims)) for d in shape)
        x = rng.standard_normal(shp)
        if dt in ("i32", "i64"):
            out.append(np.rint(3 * x).astype(np.int32 if dt == "i32" else np.int64))
        elif dt == "bool":
            out.append(x > 0)
        else:
            out.append(x.astype({"f32": np.float32, "f64": np.float64}.get(dt, dtype)))
    return out


def as_tuple(r) -> tuple:
    return r if isinstance(r, tuple) else (r,)


def rel_err(want, got) -> float:
    """Max |got - want| / max(|want|, 1), with NaN matching NaN only."""
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    if want.shape != got.shape:
        return math.inf
    nan_w, nan_g = np.isnan(want), np.isnan(got)
    if (nan_w != nan_g).any():
        return math.inf
    ok = ~nan_w
    inf = np.isinf(want) & ok
    if (want[inf] != got[inf]).any():
        return math.inf
    ok &= ~inf
    if not ok.any():
        return 0.0
    return float(np.max(np.abs(got[ok] - want[ok]) / np.maximum(np.abs(want[ok]), 1.0)))


# -- 1. correctness ------------------------------------------------------------------


def reference_cases(module, compiled, n: int, dtypes, rng) -> list[dict]:
    """Inputs, upstreams and the expected results of every method of every op of
    ``module``: the IR interpreter's, on the graphs of ``compiled`` (the ops as
    ``gradc.pipeline.build_program`` builds them), in the inputs' dtype; what the
    device must reproduce (saved by ``--prepare``, so the GPU machine needs no
    gradc; no CPU kernel is compiled for them)."""
    from gradc.ir.interpret import interpret

    def run(cop, method, args, dtype) -> tuple:
        return tuple(interpret(cop.methods[method].graph, args, dtype))

    cases = []
    for name, op in module.OPS.items():
        if not op._methods:
            continue
        cop = compiled[name]
        for dtype in dtypes:
            xs = sample(module, name, op, n, dtype, rng)
            floats = [x.dtype for x in xs if x.dtype.kind == "f"]
            dt = np.result_type(*floats) if floats else np.dtype(dtype)
            params = iter(xs)                 # keyword parameters at their defaults
            args = [p.default if p.has_default else next(params) for p in cop.params]
            ys = run(cop, "forward", args, dt)
            ups = [rng.standard_normal(np.shape(y)).astype(y.dtype if y.dtype.kind == "f"
                                                            else dtype) for y in ys]
            want = {"forward": ys, "vjp": run(cop, "vjp", args + ups, dt),
                    "fwd_bwd": run(cop, "fwd_bwd", args + ups, dt)}
            ts = tangents(op, xs, rng)
            if ts is not None:
                want["jvp"] = run(cop, "jvp", args + ts, dt)
            got = next((y.dtype for y in ys if y.dtype.kind == "f"), np.dtype(dtype))
            if got != dtype:          # a declared dtype (f32) fixes it: one case is enough
                continue
            cases.append({"module": module.__name__, "op": name, "dtype": got.name,
                          "xs": xs, "ups": ups, "ts": ts, "want": want})
    return cases


def tangents(op, xs, rng) -> list | None:
    """One random tangent like each differentiable input (the jvp wrapper's
    positional parameters after the inputs), or None where the op has no jvp."""
    if "jvp" not in op._methods:
        return None
    names = positional(op)
    out = []
    for t in positional(op, "jvp")[len(names):]:
        base = t
        while base not in names:              # x_t (x_t_t where x_t is taken) -> x
            base = base[:-2]
        x = xs[names.index(base)]
        out.append(rng.standard_normal(x.shape).astype(x.dtype))
    return out


def check_cases(module, cuda, cases) -> list[dict]:
    """Run each case's methods on the device, fused and unfused; compare."""
    rows = []
    for case in cases:
        op = module.OPS[case["op"]]
        dxs = [cuda.to_device(x) for x in case["xs"]]
        dups = [cuda.to_device(u) for u in case["ups"]]
        dts = [cuda.to_device(t) for t in case.get("ts") or ()]
        err, what = 0.0, ""
        for variant, dev in (("fused", op.cuda), ("unfused", op.cuda.unfused)):
            for method, ref in case["want"].items():
                try:
                    fn = getattr(dev, "__call__" if method == "forward" else method)
                    extra = {"forward": [], "jvp": dts}.get(method, dups)
                    got = as_tuple(fn(*dxs, *extra))
                    cuda.synchronize()
                except Exception as exc:             # reported, and the run goes on
                    err, what = math.inf, f"{variant}.{method}: {type(exc).__name__}: {exc}"
                    continue
                if len(got) != len(ref):
                    err, what = math.inf, f"{variant}.{method}: {len(got)} results"
                for k, (w, g) in enumerate(zip(ref, got)):
                    e = rel_err(w, g.copy_to_host())
                    if e > err:
                        err, what = e, f"{variant}.{method}[{k}]"
        tol = 2e-5 if case["dtype"] == "float32" else 1e-12
        rows.append({"module": case["module"], "op": case["op"], "dtype": case["dtype"],
                     "max_rel_err": err, "where": what, "ok": err <= tol})
    return rows


# -- 2. bandwidth --------------------------------------------------------------------


def elementwise_ops(module, cuda, rng):
    """Ops whose forward maps unshaped float inputs to outputs of their shape (run
    on the device: no CPU kernel is compiled)."""
    out = []
    for name, op in module.OPS.items():
        if not op._methods:
            continue
        sig = {p: (dt, shape) for p, dt, shape in getattr(module, f"_SIG_{name}")}
        if any(sig.get(p, (None, None)) != (None, None) for p in positional(op)):
            continue
        xs = [cuda.to_device(x) for x in sample(module, name, op, 16, np.float32, rng)]
        if all(y.shape == (16,) for y in as_tuple(op.cuda(*xs))):
            out.append((name, op))
    return out


def variant_label(module) -> str:
    m = re.search(r"_u(\d+)_gen$", module.__name__)
    return f" u{m.group(1)}" if m else ""


def time_gpu(cuda, fn, calls: int, repeat: int) -> float:
    """Median seconds per call: CUDA events around ``calls`` back-to-back calls."""
    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = cuda.event(), cuda.event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def bandwidth(modules, cuda, log2_sizes, calls: int, repeat: int, rng,
              waves=(64,)) -> list[dict]:
    """Fused ``fwd_bwd`` of each elementwise op, a device-to-device copy, and the
    variants: the same kernels with other unroll factors (modules ``*_u<k>``)
    and launched with other caps on the grid (``waves`` times the blocks
    resident at full occupancy), timed round-robin (one sample of each per
    round, so that clock changes and neighbours touch all alike); then each
    op's ``.unfused.fwd_bwd``.  Every input is one random device array and
    every upstream one array of ones (the kernels only read them), so each
    size uploads two arrays in all."""
    names = {name for module in modules if not variant_label(module)
             for name, _ in elementwise_ops(module, cuda, rng)}
    ops = [(name + variant_label(module), op, module) for module in modules
           for name, op in module.OPS.items() if name in names]
    rows = []
    for lg in log2_sizes:
        n = 1 << lg
        x = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
        ones = cuda.to_device(np.ones(n, np.float32))
        dst = cuda.device_array(n, np.float32)
        cases = {"device-to-device copy": (lambda: dst.copy_to_device(x), 2 * 4 * n, None, None)}
        for w in (None, *waves):
            for label, op, module in ops:
                xs = [x] * len(positional(op))
                ups = [ones] * len(as_tuple(op.cuda(*xs)))
                bufs = tuple(cuda.device_array(n, np.float32)
                             for _ in as_tuple(op.cuda.fwd_bwd(*xs, *ups)))
                fn = (lambda op=op, xs=xs, ups=ups, bufs=bufs:
                      op.cuda.fwd_bwd(*xs, *ups, out=bufs))
                key = label + (f" w{w}" if w else "")
                cases[key] = (fn, 4 * n * (len(xs) + len(ups) + len(bufs)), module, w)
        samples = {k: [] for k in cases}
        for k, (fn, _, module, w) in cases.items():       # warm-up: compile, allocate
            with _waves(module, w):
                time_gpu(cuda, fn, 1, 1)
        for _ in range(repeat):
            for k, (fn, _, module, w) in cases.items():
                with _waves(module, w):
                    samples[k].append(time_gpu(cuda, fn, calls, 1))
        t = {k: statistics.median(v) for k, v in samples.items()}
        copy_gbs = cases["device-to-device copy"][1] / t["device-to-device copy"] / 1e9
        for k, (fn, moved, module, w) in cases.items():
            row = {"op": k if module is None else f"{k}.fwd_bwd", "n": n,
                   "fused_ms": t[k] * 1e3, "fused_gbs": moved / t[k] / 1e9}
            row["pct_copy"] = 100 * row["fused_gbs"] / copy_gbs
            if k in names:
                op = module.OPS[k]
                xs = [x] * len(positional(op))
                ups = [ones] * len(as_tuple(op.cuda(*xs)))
                bufs = tuple(cuda.device_array(n, np.float32)
                             for _ in as_tuple(op.cuda.fwd_bwd(*xs, *ups)))
                t_u = time_gpu(cuda, lambda: op.cuda.unfused.fwd_bwd(*xs, *ups, out=bufs),
                               calls, max(3, repeat // 3))
                row.update(unfused_ms=t_u * 1e3, speedup=t_u / t[k])
                del bufs
            rows.append(row)
        del x, ones, dst, cases
    return rows


class _waves:
    """Temporarily cap ``module``'s grids at ``w`` waves (None: its default)."""

    def __init__(self, module, w):
        self.module, self.w = module, w

    def __enter__(self):
        if self.module is not None and self.w is not None:
            st = self.module._GC_STATE
            self.saved = st.get("wave")
            if self.saved is None:
                self.module._gc_blocks(1)
                self.saved = st["wave"]
            st["wave"] = self.saved // self.module._gc_waves() * self.w

    def __exit__(self, *exc):
        if self.module is not None and self.w is not None:
            self.module._GC_STATE["wave"] = self.saved


# -- 3. math -------------------------------------------------------------------------


def ulp32(ref: np.ndarray) -> np.ndarray:
    """The spacing of float32 at each float64 value (subnormal spacing at 0)."""
    r = np.abs(ref).astype(np.float32)
    r = np.where(np.isfinite(r), r, np.float32(3.4e38))
    return np.spacing(r).astype(np.float64)


def math_errors(module, cuda, samples: int, rng, normal: bool = False) -> dict[str, float]:
    if module._GC_SIM:       # Python's math raises on overflow: moderate values only
        x = rng.uniform(-10, 10, samples).astype(np.float32)
        names = [f for f in MATH if not f.startswith("log") and "sqrt" not in f]
    else:
        bits = rng.integers(0, 2**32, size=samples, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.17549435e-38,
                            3.4028235e38, -3.4028235e38, 88.72, -87.3, -103.9, 1.0, -1.0, 0.5],
                           np.float32)
        x = np.concatenate([x[np.isfinite(x)], special])
        names = list(MATH)
    dx = cuda.to_device(x)
    return {f: _ulp_error(f, x, as_tuple(getattr(module, f"m_{f}").cuda(dx))[0].copy_to_host(),
                          normal) for f in names}


def _ulp_error(fname: str, x: np.ndarray, got: np.ndarray, normal: bool = False) -> float:
    """Max error of ``got = fname(x)`` in float32 ULP of the float64 reference
    (inf when a special value, NaN or ±inf, differs).  ``normal``: only where
    input and result are normal float32 numbers (or zero), and sin/cos on
    [-pi, pi], the domain CUDA documents its fast intrinsics on."""
    with np.errstate(all="ignore"):
        ref = REFERENCE.get(fname, getattr(np, fname, None))(x.astype(np.float64))
        ref32 = ref.astype(np.float32)
    bad_special = (np.isnan(ref32) != np.isnan(got)) | (np.isinf(ref32) & (ref32 != got))
    fin = np.isfinite(ref32) & np.isfinite(got)
    if normal:
        tiny = np.finfo(np.float32).tiny
        keep = ((np.abs(x) >= tiny) | (x == 0)) & ((np.abs(ref) >= tiny) | (ref == 0))
        if fname in ("sin", "cos"):
            keep &= np.abs(x) <= np.pi
        fin &= keep
        bad_special &= keep
    err = np.abs(got[fin].astype(np.float64) - ref[fin]) / ulp32(ref[fin])
    return math.inf if bad_special.any() else float(err.max(initial=0.0))


# -- 4. row-wise --------------------------------------------------------------------


def torch_cuda():
    """``(torch, "")`` where PyTorch can run on this GPU, else ``(None, why not)``."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return None, "Numba's CUDA simulator: no GPU for torch"
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    return torch, ""


def rowwise(module, cuda, shapes, calls: int, repeat: int, on_row=None) -> list[dict]:
    """Each op of ``examples/rowwise.grad`` at each shape, float32, on the inputs
    of ``rowwise_cases.make_inputs``: gradc's fused ``fwd_bwd`` (``out=`` buffers),
    a device-to-device copy of twice the elements (the traffic of a row-shaped
    input and upstream read and output and gradient written) and PyTorch's native
    CUDA kernels with autograd (``rowwise_cases.torch_runner``; torch's events),
    timed round-robin as in :func:`bandwidth`. Before timing, gradc's and torch's
    results are compared with the float64 NumPy reference and with each other; a
    torch that is missing or fails is recorded with the reason, not timed, and a
    case that raises otherwise with its error (so the other tables still come).
    ``on_row`` is called with each row as it is measured (a run cut short by a
    time limit still shows the rows it finished)."""
    torch, why = torch_cuda()
    rows = []
    for shape in shapes:
        n = math.prod(shape)
        src, dst = cuda.device_array(2 * n, np.float32), cuda.device_array(2 * n, np.float32)
        for name, op in module.OPS.items():
            row = {"op": name, "shape": list(shape), "torch_skipped": why or None}
            try:
                row.update(_rowwise_case(module, name, op, shape, cuda, torch, calls, repeat,
                                         lambda: dst.copy_to_device(src)))
            except Exception as exc:                # reported, and the run goes on
                row.update(error=f"{type(exc).__name__}: {exc}", max_rel_err=math.inf, ok=False)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


class WholeRows:
    """A context in which ``module``'s calls keep whole rows (its rule of split rows,
    ``_GC_SPLIT``, splits no call)."""

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.saved = self.module._GC_SPLIT
        self.module._GC_SPLIT = (0, *self.saved[1:])

    def __exit__(self, *exc):
        self.module._GC_SPLIT = self.saved


def _rowwise_case(module, name, op, shape, cuda, torch, calls, repeat, copy) -> dict:
    """:func:`rowwise`'s one op at one shape: errors, and times unless gradc's raised;
    where the shape splits rows (``_gc_row_grid``), the same call with whole rows too
    (``whole``), so a GPU's run says what splitting gains."""
    params, ups = make_inputs(name, shape)
    want = reference(name, params, ups)
    dparams = [cuda.to_device(a) for a in params]
    dups = [cuda.to_device(u) if np.ndim(u) else u for u in ups]
    bufs = tuple(cuda.device_array(r.shape, r.dtype)
                 for r in as_tuple(op.cuda.fwd_bwd(*dparams, *dups)))
    cases = {"gradc": (cuda, lambda: op.cuda.fwd_bwd(*dparams, *dups, out=bufs)),
             "copy": (cuda, copy)}
    got = [r.copy_to_host() for r in as_tuple(cases["gradc"][1]())]
    err = max(rel_err(w, g) for w, g in zip(want, got)) if len(got) == len(want) else math.inf
    row = {"max_rel_err": err, "ok": err <= ROW_TOL}
    if module._gc_row_grid(name, shape, 1, None, False, False, module._GC_SPLIT)[4]:
        def whole():
            with WholeRows(module):
                return op.cuda.fwd_bwd(*dparams, *dups, out=bufs)
        wgot = [r.copy_to_host() for r in as_tuple(whole())]
        row["whole_max_rel_err"] = max(rel_err(w, g) for w, g in zip(want, wgot))
        row["ok"] = row["ok"] and row["whole_max_rel_err"] <= ROW_TOL
        cases["whole"] = (cuda, whole)
    if torch is not None:
        try:
            run = torch_runner(name, params, ups, device="cuda")
            tgot = [r.cpu().numpy() for r in run()]
            row["torch_max_rel_err"] = max(rel_err(w, g) for w, g in zip(want, tgot))
            row["gradc_vs_torch"] = max(rel_err(t, g) for t, g in zip(tgot, got))
            row["torch_note"] = torch_math(name)[2] or None
            timer = types.SimpleNamespace(event=lambda: torch.cuda.Event(enable_timing=True),
                                          synchronize=torch.cuda.synchronize)
            cases["torch"] = (timer, run)
        except Exception as exc:                    # reported, and the run goes on
            msg = (str(exc).splitlines() or [""])[0][:120]
            row["torch_skipped"] = f"{type(exc).__name__}: {msg}"
    for timer, fn in cases.values():                # warm-up
        time_gpu(timer, fn, 1, 1)
    samples = {k: [] for k in cases}
    for _ in range(repeat):
        for k, (timer, fn) in cases.items():
            samples[k].append(time_gpu(timer, fn, calls, 1))
    t = {k: statistics.median(v) for k, v in samples.items()}
    row.update(gradc_ms=t["gradc"] * 1e3, copy_ms=t["copy"] * 1e3,
               pct_copy=100 * t["copy"] / t["gradc"])
    if "torch" in t:
        row.update(torch_ms=t["torch"] * 1e3, torch_vs_gradc=t["torch"] / t["gradc"])
    if "whole" in t:
        row.update(whole_ms=t["whole"] * 1e3, whole_vs_split=t["whole"] / t["gradc"])
    return row


def shape_arg(text: str) -> tuple[int, int]:
    """``ROWSxCOLS`` (``4096x1024``) for ``--row-shapes``."""
    try:
        shape = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"write a shape as ROWSxCOLS, e.g. 4096x1024 "
                                          f"(got {text!r})")
    return shape


# -- main ----------------------------------------------------------------------------


def main(argv=None) -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        from gradc.tools.cudasim import fast_simulator
        fast_simulator()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*", type=Path, help=".grad files (default: the examples)")
    ap.add_argument("--prepare", type=Path, help="write the modules to this folder and stop")
    ap.add_argument("--modules", type=Path, help="a folder written by --prepare")
    ap.add_argument("--log2-sizes", type=int, nargs="*", default=[26, 28])
    ap.add_argument("--check-size", type=int, default=1000)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--math-samples", type=int, default=1 << 22)
    ap.add_argument("--row-shapes", type=shape_arg, nargs="*", default=list(SHAPES),
                    metavar="RxC", help="shapes of the row-wise table (default: "
                    + " ".join("x".join(map(str, s)) for s in SHAPES) + "; none: no table)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--skip-check", action="store_true", help="time only")
    ap.add_argument("--unroll-variants", type=int, nargs="*", default=[],
                    help="with --prepare: also compile the examples' CUDA kernels with "
                         "these unroll factors, for the bandwidth table")
    args = ap.parse_args(argv)
    if args.modules and not args.skip_check and not (args.modules / "expected.pkl").exists():
        ap.error(f"no expected.pkl in {args.modules} (--prepare writes it, where gradc is): "
                 f"write it, or time only with --skip-check")
    if args.prepare:
        for p in prepare(args.prepare, args.check_size,
                         [getattr(np, d) for d in args.dtypes], args.unroll_variants):
            print("wrote", p)
        return 0
    if not hasattr(np, "row_stack"):
        # numba-cuda 0.30 registers an overload of np.row_stack, which NumPy 2.5 removed:
        # its first kernel compilation fails without this alias.
        np.row_stack = np.vstack
    from numba import cuda

    rng = np.random.default_rng(0)
    dtypes = [getattr(np, d) for d in args.dtypes]
    t0 = time.perf_counter()
    if args.modules:
        folder = args.modules
        paths = sorted(folder.glob("*_gen.py"))
    else:
        import tempfile
        # removed when this process exits (the modules are imported by then)
        workdir = tempfile.TemporaryDirectory(prefix="gradc-gpu-")
        folder = Path(workdir.name)
        paths = prepare(folder, args.check_size, dtypes, references=not args.skip_check)
    mods = {p.stem: import_path(p) for p in paths}
    math_mods = {k: mods.pop(k) for k in ("math_gen", "math_fast_gen") if k in mods}
    row_mod = mods.pop("rowwise_gen", None)
    dev = cuda.get_current_device()
    name = getattr(dev, "name", b"simulator")
    name = name.decode() if isinstance(name, bytes) else str(name)
    cc = tuple(getattr(dev, "compute_capability", ()))
    print(f"# device: {name}, compute capability {cc}; numba-cuda "
          f"{getattr(sys.modules.get('numba_cuda'), '__version__', '?')}")
    report = {"device": name, "cc": list(cc)}

    cases = []
    if not args.skip_check:
        with open(folder / "expected.pkl", "rb") as f:
            cases = [c for c in pickle.load(f) if c["dtype"] in args.dtypes]
    rows = [r for name, m in mods.items() if "_u" not in name
            for r in check_cases(m, cuda, [c for c in cases if c["module"] == name])]
    print(f"\n## correctness: CUDA vs the IR interpreter, {len(cases)} cases, every method, "
          f"fused and unfused ({time.perf_counter() - t0:.0f} s)")
    print(f"{'module':<16} {'op':<18} {'dtype':<8} {'max rel err':>12}  worst")
    for r in rows:
        print(f"{r['module']:<16} {r['op']:<18} {r['dtype']:<8} {r['max_rel_err']:>12.3g}  "
              f"{r['where']}{'' if r['ok'] else '  FAIL'}")
    report["correctness"] = rows

    bw = bandwidth(list(mods.values()), cuda, args.log2_sizes, args.calls, args.repeat, rng)
    print(f"\n## bandwidth: float32, fwd_bwd with out= buffers, median of {args.repeat} x "
          f"{args.calls} calls, round-robin ({time.perf_counter() - t0:.0f} s); 'u<k>': unrolled k "
          f"times, 'w<k>': grid capped at k waves (default: unroll "
          f"{getattr(next(iter(mods.values())), '_GC_UNROLL', '?')}, "
          f"{next(iter(mods.values()))._gc_waves()} waves)")
    print(f"{'op':<30} {'n':>11} {'fused ms':>9} {'unfused ms':>10} {'GB/s':>8} "
          f"{'% copy':>7} {'vs unfused':>10}")
    for r in bw:
        print(f"{r['op']:<30} {r['n']:>11} {r['fused_ms']:>9.3f} "
              f"{r.get('unfused_ms', float('nan')):>10.3f} {r['fused_gbs']:>8.0f} "
              f"{r['pct_copy']:>6.0f}% {r.get('speedup', float('nan')):>9.1f}x")
    report["bandwidth"] = bw

    if math_mods and args.math_samples:
        print(f"\n## math: max error in float32 ULP over {args.math_samples} random bit "
              f"patterns + specials ({time.perf_counter() - t0:.0f} s)")
        errs = {k: math_errors(m, cuda, args.math_samples, np.random.default_rng(1))
                for k, m in math_mods.items()}
        if "math_fast_gen" in math_mods:
            errs["fast_normal"] = math_errors(math_mods["math_fast_gen"], cuda,
                                              args.math_samples, np.random.default_rng(1),
                                              normal=True)
        cols = [("math_gen", "libdevice"), ("math_fast_gen", "fast-math"),
                ("fast_normal", "fast, normal")]
        print(f"{'function':<10}" + "".join(f"{title:>14}" for _, title in cols))
        for f in MATH:
            print(f"{f:<10}" + "".join(f"{errs.get(k, {}).get(f, math.nan):>14.3g}"
                                       for k, _ in cols))
        print("(fast, normal: inputs and results normal float32 or zero, sin/cos on [-pi, pi];"
              " fast-math flushes subnormals to zero)")
        report["math_ulp"] = errs
    row_failed = []
    if args.row_shapes and row_mod is None:
        print(f"\n## row-wise: no rowwise_gen.py in {args.modules} (written by --prepare "
              f"since the row-wise table exists): skipped")
    elif args.row_shapes:
        print(f"\n## row-wise: float32, fused fwd_bwd with out= buffers, a device copy of "
              f"2 reads + 2 writes of the rows, torch's CUDA kernels with autograd; median of "
              f"{args.repeat} x {args.calls} calls, round-robin ({time.perf_counter() - t0:.0f} "
              f"s); 'err': max rel err against float64 NumPy, 'vs torch': gradc's against "
              f"torch's; 'whole ms': the same call keeping whole rows where the shape splits "
              f"them (a block per segment of a row, each pass a kernel)")
        print(f"{'op':<18} {'shape':>11} {'gradc ms':>9} {'copy ms':>8} {'% copy':>7} "
              f"{'torch ms':>9} {'torch/gradc':>11} {'gradc err':>10} {'torch err':>10} "
              f"{'vs torch':>9} {'whole ms':>9}")
        cell = lambda r, k, fmt, w, unit="": (format(r[k], fmt) + unit if k in r else "-").rjust(w)

        def print_row(r):
            print(f"{r['op']:<18} {'x'.join(map(str, r['shape'])):>11} "
                  f"{cell(r, 'gradc_ms', '.3f', 9)} {cell(r, 'copy_ms', '.3f', 8)} "
                  f"{cell(r, 'pct_copy', '.0f', 7, '%')} {cell(r, 'torch_ms', '.3f', 9)} "
                  f"{cell(r, 'torch_vs_gradc', '.2f', 11)} {r['max_rel_err']:>10.2g} "
                  f"{cell(r, 'torch_max_rel_err', '.2g', 10)} "
                  f"{cell(r, 'gradc_vs_torch', '.2g', 9)} {cell(r, 'whole_ms', '.3f', 9)}"
                  f"{'' if r['ok'] else '  FAIL'}"
                  + (f"  {r['error'].splitlines()[0]}" if "error" in r else ""), flush=True)

        rw = rowwise(row_mod, cuda, args.row_shapes, args.calls, args.repeat, print_row)
        for msg in dict.fromkeys(r["torch_skipped"] for r in rw if r["torch_skipped"]):
            print(f"torch not timed: {msg}")
        for msg in dict.fromkeys(f"torch: {r['torch_note']}" for r in rw if r.get("torch_note")):
            print(msg)
        row_failed = [r for r in rw if not r["ok"]]
        vs_torch = [r["gradc_vs_torch"] for r in rw if "gradc_vs_torch" in r]
        print(f"row-wise: {len(rw) - len(row_failed)}/{len(rw)} gradc results within {ROW_TOL:g} "
              f"of float64 NumPy (max {max(r['max_rel_err'] for r in rw):.2g}); of torch's, "
              + (f"{sum(e <= ROW_TOL for e in vs_torch)}/{len(vs_torch)} (max "
                 f"{max(vs_torch):.2g})" if vs_torch else "none: torch not run"))
        report["rowwise"] = rw
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=float), encoding="utf-8")
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} correctness checks passed"
          + (f", {len(row_failed)} row-wise cases FAILED" if row_failed else "")
          + f" ({time.perf_counter() - t0:.0f} s)")
    return 1 if failed or row_failed else 0


if __name__ == "__main__":
    sys.exit(main())
