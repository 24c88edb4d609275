#!/usr/bin/env python
"""Per-call overhead of a generated op: a 1-element call next to a NumPy ufunc call.

What a user pays for the Python wrapper (argument checks, dtype and shape
resolution, ``out=`` handling, the kernel launch) when the arrays are tiny.
Every variant is timed with ``timeit`` in the same process, interleaved over
``--repeat`` rounds; the table gives the median microseconds per call and the
ratio to ``np.tanh(x)`` on the same 1-element float32 array.

Run::

    python benchmarks/bench_dispatch.py            # 9 rounds of 20,000 calls
"""
from __future__ import annotations

import argparse
import statistics
import timeit
from pathlib import Path

import numpy as np

import gradc

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--number", type=int, default=20_000)
    args = ap.parse_args()
    seed = gradc.load(ROOT / "examples" / "seed.grad")
    x = np.ones(1, np.float32)
    dy = np.ones(1, np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    op = seed.scaled_tanh
    variants = {
        "np.tanh(x)": lambda: np.tanh(x),
        "np.tanh(x, out=y)": lambda: np.tanh(x, out=y),
        "scaled_tanh(x)": lambda: op(x),
        "scaled_tanh(x, out=y)": lambda: op(x, out=y),
        "scaled_tanh.vjp(x, dy)": lambda: op.vjp(x, dy),
        "scaled_tanh.fwd_bwd(x, dy)": lambda: op.fwd_bwd(x, dy),
        "scaled_tanh.fwd_bwd(x, dy, out=)": lambda: op.fwd_bwd(x, dy, out=(y, dx)),
        "scaled_tanh.unfused.fwd_bwd(x, dy)": lambda: op.unfused.fwd_bwd(x, dy),
    }
    for fn in variants.values():          # compile / load from Numba's cache
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeat):
        for name, fn in variants.items():
            times[name].append(timeit.timeit(fn, number=args.number) / args.number * 1e6)
    base = statistics.median(times["np.tanh(x)"])
    print(f"{'call (1 float32 element)':38} {'median us':>10} {'x np.tanh':>10}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:38} {med:10.2f} {med / base:10.1f}")


if __name__ == "__main__":
    main()
