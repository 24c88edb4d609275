#!/usr/bin/env python
"""What the vectorised math library buys: each function's fused kernel, library vs libm.

The same ``.grad`` source (one op per function, plus the activations of issue 4:
softplus, swish, gelu) is compiled twice in this process, by default and with
``precise=True`` (libm everywhere), and each op's ``fwd_bwd`` (forward and
backward fused in one loop) and forward are timed into preallocated ``out=``
buffers on ``n`` elements (default 10^7 float32, inputs in each function's
typical range).  Every repeat runs both variants, alternating which goes
first, and a 2-in/2-out Numba copy kernel (what ``fwd_bwd`` moves, the
memory-bound yardstick); the table shows medians in ns per element, the
speedup, and the copy's time over the library's ``fwd_bwd`` (``%limit``).
Results are checked to agree (the largest difference of the two, relative to the
largest value of that result, printed).  Nothing is
asserted: this is a measurement.

Run::

    python benchmarks/bench_mathlib.py                     # float32, n = 10^7, 11 repeats
    python benchmarks/bench_mathlib.py --dtype f64 --n 1000000
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

import gradc

# name -> (.grad body of ``y`` in x (and z), input range of x (and z))
CASES = {
    "exp": ("exp(x)", (-10, 10)), "exp2": ("exp2(x)", (-10, 10)),
    "expm1": ("expm1(x)", (-3, 3)), "log": ("log(x)", (1e-3, 1e3)),
    "log2": ("log2(x)", (1e-3, 1e3)), "log10": ("log10(x)", (1e-3, 1e3)),
    "log1p": ("log1p(x)", (-0.9, 100)), "tanh": ("tanh(x)", (-5, 5)),
    "sigmoid": ("sigmoid(x)", (-10, 10)), "softplus": ("softplus(x)", (-10, 10)),
    "erf": ("erf(x)", (-4, 4)), "erfc": ("erfc(x)", (-4, 4)),
    "sin": ("sin(x)", (-10, 10)), "cos": ("cos(x)", (-10, 10)), "tan": ("tan(x)", (-1.5, 1.5)),
    "asin": ("asin(x)", (-0.99, 0.99)), "acos": ("acos(x)", (-0.99, 0.99)),
    "atan": ("atan(x)", (-10, 10)), "sinh": ("sinh(x)", (-5, 5)), "cosh": ("cosh(x)", (-5, 5)),
    "sqrt": ("sqrt(x)", (1e-3, 1e3)), "rsqrt": ("rsqrt(x)", (1e-3, 1e3)),
    "pow": ("pow(x, z)", ((0.1, 10), (-3, 3))), "atan2": ("atan2(x, z)", ((-10, 10), (-10, 10))),
    "swish": ("x * sigmoid(x)", (-10, 10)),
    "gelu": ("0.5 * x * (1 + erf(x * 0.7071067811865476))", (-5, 5)),
}


def source() -> str:
    lines = []
    for name, (body, rng) in CASES.items():
        params = "x, z" if "z" in body else "x"
        lines.append(f"op b_{name}({params}) -> y {{ y = {body} }}")
    return "\n".join(lines) + "\n"


def load(text: str, name: str):
    path = Path(tempfile.mkdtemp(prefix="gradc_bench_mathlib_")) / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@numba.njit(parallel=True)
def _copy2(a, b, c, d):
    for i in numba.prange(a.size):
        c[i] = a[i]
        d[i] = b[i]


def bench(n: int, repeat: int, dtype, only=None) -> str:
    text = source()
    fast = load(gradc.compile_source(text, file="bench_mathlib.grad"), "bench_mathlib_lib")
    libm = load(gradc.compile_source(text, file="bench_mathlib.grad", precise=True),
                "bench_mathlib_libm")
    rng = np.random.default_rng(0)
    a, b = np.ones(n, dtype), np.ones(n, dtype)
    c, d = np.empty_like(a), np.empty_like(a)
    _copy2(a, b, c, d)
    rows = [f"{np.dtype(dtype).name}, n = {n:,}, median of {repeat} (ns per element); %limit: "
            "a 2-in/2-out Numba copy kernel (fwd_bwd's traffic), timed in the same repeats, "
            "over the library's fwd_bwd",
            f"{'function':10} {'fwd_bwd libm':>13} {'library':>8} {'speedup':>8} {'%limit':>7}"
            f"   {'forward libm':>12} {'library':>8} {'speedup':>8}   {'max diff':>12}"]
    for name, (body, r) in CASES.items():
        if only and name not in only:
            continue
        ranges = r if isinstance(r[0], tuple) else (r,)
        xs = [rng.uniform(lo, hi, n).astype(dtype) for lo, hi in ranges]
        dy = np.ones(n, dtype)
        res = {}
        for label, mod in (("lib", fast), ("libm", libm)):
            op = getattr(mod, f"b_{name}")
            outs = tuple(np.empty(n, dtype) for _ in range(1 + len(xs)))
            y = np.empty(n, dtype)
            op.fwd_bwd(*xs, dy, out=outs)            # compile (or load) before timing
            op(*xs, out=y)
            res[label] = (op, outs, y)
        times = {k: ([], []) for k in res}
        copies = []
        for i in range(repeat):
            t0 = time.perf_counter()
            _copy2(a, b, c, d)
            copies.append(time.perf_counter() - t0)
            for label in (("lib", "libm") if i % 2 else ("libm", "lib")):
                op, outs, y = res[label]
                t0 = time.perf_counter()
                op.fwd_bwd(*xs, dy, out=outs)
                t1 = time.perf_counter()
                op(*xs, out=y)
                t2 = time.perf_counter()
                times[label][0].append(t1 - t0)
                times[label][1].append(t2 - t1)
        med = {k: [statistics.median(v) / n * 1e9 for v in times[k]] for k in times}
        copy = statistics.median(copies) / n * 1e9
        with np.errstate(all="ignore"):     # per result, relative to its largest value
            diff = max(float(np.nanmax(np.abs(u.astype(np.float64) - v)) /
                             np.nanmax(np.abs(v.astype(np.float64))))
                       for u, v in zip(res["lib"][1], res["libm"][1]))
        (fb_lib, fw_lib), (fb_libm, fw_libm) = med["lib"], med["libm"]
        rows.append(f"{name:10} {fb_libm:13.2f} {fb_lib:8.2f} {fb_libm / fb_lib:7.1f}x "
                    f"{100 * copy / fb_lib:6.0f}%   {fw_libm:12.2f} {fw_lib:8.2f} "
                    f"{fw_libm / fw_lib:7.1f}x   {diff:12.1e}")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10**7)
    p.add_argument("--repeat", type=int, default=11)
    p.add_argument("--dtype", choices=("f32", "f64"), default="f32")
    p.add_argument("--only", nargs="*", help="function names")
    a = p.parse_args(argv)
    print(bench(a.n, a.repeat, np.float32 if a.dtype == "f32" else np.float64, a.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
