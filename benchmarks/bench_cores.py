#!/usr/bin/env python
"""What a second thread buys on this machine: compute, memory, and the row-wise kernels.

The row-wise ``fwd_bwd`` kernels spend about 1 ns per element on arithmetic in one
thread with their rows in cache, more than the copy's 0.7 ns per element of memory
time: they reach the copy's speed only if the threads add compute.  This prints,
for 1 and 2 threads, interleaved medians of

* ``compute``  a loop that keeps a row of 1024 float32 in L1 per thread and does
  softmax-like work on it (max, exp, sum, scale): no memory traffic;
* ``copy``     the 2-read/2-write copy over 2^22 float32 (``gradc.tools.bench``);
* ``re-read xK``  per row, the row of ``x`` and ``dy`` read K times (a sum), then
  ``y`` and ``dx`` written from them once, at each shape: the memory traffic of a
  row-wise kernel with K passes before its last, and no arithmetic (K = 1, 2);
* ``norm traffic``  at each shape, the loads and stores of layer norm's fused
  ``fwd_bwd`` kernel at long rows with adds for its arithmetic: per row four passes
  (``x, dy, w`` and the ``db`` row accumulator; ``x``; ``x, dy, w, b``, ``y`` and the
  ``dw`` row accumulator; ``x, dy, w``, ``dx``), the rows in two chunks, each with its
  own float32 accumulator rows; ``no acc``: the same without the two accumulators.
  The difference is what reading and writing a row-length accumulator once per row
  costs when rows leave the L2;
* each op of ``examples/rowwise.grad``: fused ``fwd_bwd`` into ``out=`` at the
  given shapes (default 4096x1024, 65536x64, 16x262144),

and the speedup of 2 threads over 1, and each case's time over the copy's on as many
threads (``% copy``).  On a machine with two real cores ``compute``
gains about 2x and ``copy`` what memory allows; two hyperthreads of one core, or
cores shared with other guests, give ``compute`` far less.

Run::

    python benchmarks/bench_cores.py
    python benchmarks/bench_cores.py --repeat 11 --ops softmax_rows --shapes 4096x1024
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rowwise_cases import make_inputs  # noqa: E402

import gradc  # noqa: E402
from gradc.tools.bench import copy_kernel  # noqa: E402


@numba.njit(parallel=True, fastmath={"reassoc"}, cache=False)
def compute(rows: np.ndarray, reps: int) -> float:
    """Softmax-like arithmetic on each thread's own row of ``rows`` (one per chunk),
    ``reps`` times: max, exp, sum, scale, all in L1."""
    total = np.zeros(rows.shape[0])
    for t in numba.prange(rows.shape[0]):
        x = rows[t]
        y = np.empty_like(x)
        acc = 0.0
        for _ in range(reps):
            m = x[0]
            for c in range(x.size):
                m = max(m, x[c])
            s = np.float32(0)
            for c in range(x.size):
                e = np.exp(x[c] - m)
                y[c] = e
                s += e
            r = np.float32(1) / s
            for c in range(x.size):
                y[c] *= r
            acc += y[0]
        total[t] = acc
    return total.sum()


@numba.njit(parallel=True, fastmath={"reassoc"}, cache=False)
def reread(x: np.ndarray, dy: np.ndarray, y: np.ndarray, dx: np.ndarray, n: int,
           k: int) -> float:
    """Per row of ``n`` elements: ``x`` and ``dy`` read ``k`` times (a sum), then ``y``
    and ``dx`` written from them once."""
    rows = x.size // n
    total = np.zeros(rows)
    for r in numba.prange(rows):
        xr, dyr = x[r * n:(r + 1) * n], dy[r * n:(r + 1) * n]
        yr, dxr = y[r * n:(r + 1) * n], dx[r * n:(r + 1) * n]
        s = np.float32(0)
        for _ in range(k):
            for c in range(n):
                s += xr[c] * dyr[c]
        s *= np.float32(1e-30)
        for c in range(n):
            yr[c] = xr[c] + s
            dxr[c] = dyr[c] - s
        total[r] = s
    return total.sum()


@numba.njit(parallel=True, fastmath={"reassoc"}, cache=False)
def norm_traffic(x: np.ndarray, dy: np.ndarray, w: np.ndarray, b: np.ndarray, y: np.ndarray,
                 dx: np.ndarray, acc: np.ndarray, n: int, with_acc: bool) -> float:
    """Layer norm ``fwd_bwd``'s memory traffic over rows of ``n`` elements in
    ``acc.shape[0]`` chunks, adds for its arithmetic (the module docstring's passes);
    ``acc``: per chunk the ``db`` and ``dw`` accumulator rows (float32)."""
    rows, chunks = x.size // n, acc.shape[0]
    total = np.zeros(chunks)
    for ch in numba.prange(chunks):
        db, dw = acc[ch, 0, :n], acc[ch, 1, :n]
        db[:] = 0
        dw[:] = 0
        s = np.float32(0)
        for r in range(ch * rows // chunks, (ch + 1) * rows // chunks):
            xr, dyr = x[r * n:(r + 1) * n], dy[r * n:(r + 1) * n]
            yr, dxr = y[r * n:(r + 1) * n], dx[r * n:(r + 1) * n]
            u, s1, s2 = np.float32(r), np.float32(0), np.float32(0)
            for c in range(n):
                s1 += xr[c] + dyr[c] * w[c]
                if with_acc:
                    db[c] += dyr[c]
            for c in range(n):
                s1 += xr[c]
            for c in range(n):
                v = xr[c] + u
                yr[c] = v * w[c] + b[c]
                s2 += dyr[c] * v
                if with_acc:
                    dw[c] += dyr[c] * v
            for c in range(n):
                dxr[c] = xr[c] + dyr[c] * w[c] + u
            s += s1 + s2
        total[ch] = s + db[0] + dw[0]
    return total.sum()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--ops", nargs="+", default=["softmax_rows", "log_softmax_rows",
                                                 "layer_norm", "rms_norm", "xent_rows"])
    ap.add_argument("--shapes", nargs="+", default=["4096x1024", "65536x64", "16x262144"])
    args = ap.parse_args(argv)
    module = gradc.load(ROOT / "examples" / "rowwise.grad")
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((2, 1024)).astype(np.float32)
    x, dy = (rng.standard_normal(1 << 22).astype(np.float32) for _ in range(2))
    y, dx = np.empty_like(x), np.empty_like(x)
    copy = copy_kernel()
    cases = {"compute (2 rows of 1024 in L1)": lambda: compute(rows, 2048),
             "copy 2r/2w 2^22": lambda: copy(x, dy, y, dx)}
    for text in args.shapes:
        n = int(text.lower().split("x")[1])
        for k in (1, 2):
            cases[f"re-read x{k} {text}"] = lambda n=n, k=k: reread(x, dy, y, dx, n, k)
    w, b = (rng.standard_normal(max(int(t.lower().split("x")[1]) for t in args.shapes))
            .astype(np.float32) for _ in range(2))
    acc = np.zeros((2, 2, w.size), np.float32)
    for text in args.shapes:
        n = int(text.lower().split("x")[1])
        for with_acc, tag in ((True, ""), (False, " no acc")):
            cases[f"norm traffic{tag} {text}"] = (lambda n=n, a=with_acc:
                                                  norm_traffic(x, dy, w, b, y, dx, acc, n, a))
    for op in args.ops:
        for text in args.shapes:
            shape = tuple(int(v) for v in text.lower().split("x"))
            params, ups = make_inputs(op, shape)
            fn = getattr(module, op).fwd_bwd
            out = fn(*params, *ups)
            cases[f"{op} {text}"] = (lambda fn=fn, params=params, ups=ups, out=out:
                                     fn(*params, *ups, out=out))
    threads = (1, 2) if numba.config.NUMBA_NUM_THREADS >= 2 else (1,)
    times: dict[tuple[str, int], list[float]] = {}
    for name, call in cases.items():                # compiled, caches warm
        for t in threads:
            numba.set_num_threads(t)
            call()
    for _ in range(args.repeat):
        for name, call in cases.items():
            for t in threads:
                numba.set_num_threads(t)
                t0 = time.perf_counter()
                call()
                times.setdefault((name, t), []).append(time.perf_counter() - t0)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    print(f"median ms of {args.repeat} interleaved repeats; threads {threads}; "
          f"NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}")
    print(f"{'case':34s} {'1 thread':>9s} {'2 threads':>10s} {'speedup':>8s} {'% copy':>7s}")
    copy_ms = float(np.median(times[("copy 2r/2w 2^22", threads[-1])])) * 1e3
    for name in cases:
        a = float(np.median(times[(name, 1)])) * 1e3
        b = float(np.median(times[(name, threads[-1])])) * 1e3
        speedup = f"{b:10.2f} {a / b:7.2f}x" if len(threads) == 2 else ""
        print(f"{name:34s} {a:9.2f} {speedup} {copy_ms / b:7.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
