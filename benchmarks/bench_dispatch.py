#!/usr/bin/env python
"""Per-call overhead of a generated op: a 1-element call next to a NumPy ufunc call.

What a user pays for the Python wrapper (argument checks, dtype and shape
resolution, ``out=`` handling, the kernel launch) when the arrays are tiny.
Every variant is timed with ``timeit`` in the same process, interleaved over
``--repeat`` rounds; the table gives the median microseconds per call and the
ratio to ``np.tanh(x)`` on the same 1-element float32 array.  Plain calls
(C-contiguous float32 or float64 arrays of one dtype, no ``out=``) take the
wrappers' fast paths; the ``out=`` rows and the float16 row take the full
checks.  The last rows are row-wise ops of ``examples/rowwise.grad`` at 8x1024, the
smallest arrays their row plans take: shape algebra, the row plan's dispatch and the
row kernel (about 10 us of theirs).

Run::

    python benchmarks/bench_dispatch.py            # 9 rounds of 20,000 calls
"""
from __future__ import annotations

import argparse
import os
import statistics
import timeit
from pathlib import Path

import numpy as np

import gradc

ROOT = Path(__file__).resolve().parents[1]


def variants() -> dict:
    seed = gradc.load(ROOT / "examples" / "seed.grad")
    act = gradc.load(ROOT / "examples" / "activations.grad")
    st, lr, ab = seed.scaled_tanh, act.leaky_relu, act.add_bias
    x, dy = np.ones(1, np.float32), np.ones(1, np.float32)
    x64, dy64 = np.ones(1), np.ones(1)
    x0, dy0 = np.ones((), np.float32), np.ones((), np.float32)
    x16 = np.ones(1, np.float16)
    y, dx = np.empty_like(x), np.empty_like(x)
    xm, b = np.ones((1, 1), np.float32), np.ones(1, np.float32)
    # row-wise ops at 8x1024, the smallest arrays their row plans take (4096 elements
    # and up): the row kernels themselves take about 10 us here
    rw = gradc.load(ROOT / "examples" / "rowwise.grad")
    rx, rdy = np.ones((8, 1024), np.float32), np.ones((8, 1024), np.float32)
    rw_w, rw_b = np.ones(1024, np.float32), np.zeros(1024, np.float32)
    rs_out = rw.softmax_rows.fwd_bwd(rx, rdy)
    ln_out = rw.layer_norm.fwd_bwd(rx, rw_w, rw_b, rdy)
    return {
        "np.tanh(x)": lambda: np.tanh(x),
        "np.tanh(x, out=y)": lambda: np.tanh(x, out=y),
        "scaled_tanh(x)": lambda: st(x),
        "scaled_tanh(x) float64": lambda: st(x64),
        "scaled_tanh(x) 0-d": lambda: st(x0),
        "scaled_tanh(x) float16": lambda: st(x16),
        "scaled_tanh(x, out=y)": lambda: st(x, out=y),
        "scaled_tanh.vjp(x, dy)": lambda: st.vjp(x, dy),
        "scaled_tanh.vjp(x, dy) float64": lambda: st.vjp(x64, dy64),
        "scaled_tanh.vjp(x, dy) 0-d": lambda: st.vjp(x0, dy0),
        "scaled_tanh.fwd_bwd(x, dy)": lambda: st.fwd_bwd(x, dy),
        "scaled_tanh.fwd_bwd(x, dy) float64": lambda: st.fwd_bwd(x64, dy64),
        "scaled_tanh.fwd_bwd(x, dy, out=)": lambda: st.fwd_bwd(x, dy, out=(y, dx)),
        "scaled_tanh.unfused.fwd_bwd(x, dy)": lambda: st.unfused.fwd_bwd(x, dy),
        "leaky_relu.fwd_bwd(x, dy)": lambda: lr.fwd_bwd(x, dy),
        "add_bias(x[1, 1], b[1])": lambda: ab(xm, b),
        "softmax_rows.fwd_bwd 8x1024": lambda: rw.softmax_rows.fwd_bwd(rx, rdy),
        "softmax_rows.fwd_bwd 8x1024 out=": lambda: rw.softmax_rows.fwd_bwd(rx, rdy, out=rs_out),
        "layer_norm.fwd_bwd 8x1024": lambda: rw.layer_norm.fwd_bwd(rx, rw_w, rw_b, rdy),
        "layer_norm.fwd_bwd 8x1024 out=": lambda: rw.layer_norm.fwd_bwd(rx, rw_w, rw_b, rdy,
                                                                          out=ln_out),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--number", type=int, default=20_000)
    args = ap.parse_args()
    calls = variants()
    for fn in calls.values():           # compile / load from Numba's cache
        fn()
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(args.repeat):
        for name, fn in calls.items():
            n = max(1, args.number // 20) if "8x1024" in name else args.number
            times[name].append(timeit.timeit(fn, number=n) / n * 1e6)
    base = statistics.median(times["np.tanh(x)"])
    print(f"{'call (1 float32 element unless noted)':38} {'median us':>10} {'x np.tanh':>10}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:38} {med:10.2f} {med / base:10.1f}")
    print(f"({args.repeat} interleaved rounds of {args.number:,} calls, a 20th of that "
          f"at 8x1024; load average "
          f"{load:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
