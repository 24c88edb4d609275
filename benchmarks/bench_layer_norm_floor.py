#!/usr/bin/env python
"""How close layer norm's ``fwd_bwd`` can come to the copy on this machine: gradc's fused
kernel against the least a layer norm written by hand in Numba does.

``bench_rowwise.py`` asks every row-wise op for 70 % of a 2-read/2-write copy.  Layer
norm's ``fwd_bwd`` reads ``x`` and ``dy`` and writes ``y`` and ``dx`` as the copy does,
but per row it needs two statistics before it can write anything (the mean and the
variance, then the means of ``dy * w`` and of ``dy * w * xhat``), and it gathers ``dw``
and ``db`` across rows. This script times, side by side in one process (interleaved
repeats, medians, as ``bench_rowwise.py``):

* ``copy``         the 2-read/2-write copy (``gradc.tools.bench.copy_kernel``);
* ``2-pass floor`` RMS norm without a weight by hand (``two_pass_kernel``);
* ``gradc``        gradc's fused ``layer_norm.fwd_bwd`` of ``examples/rowwise.grad`` into
  ``out=`` buffers;
* ``hand 3-pass``  layer norm by hand, three passes over each row, each over the whole
  row: the sums of ``x`` and ``dy * w`` (and ``db``); the centred sums of squares and
  of ``dy * w * (x - mean)``; ``y``, ``dx`` (and ``dw``) (the float32 sums flagged
  ``reassoc`` as gradc's are, so LLVM vectorises them; no blocks, no checks for
  non-finite rows, no prefetch hints: less work than gradc's kernel does);
* ``hand pipelined`` the same with the next row's first pass fused into this row's
  last loop, so that the loads from memory of the next row overlap the arithmetic of
  this one.

Each thread takes a contiguous chunk of rows with its own ``dw``/``db`` partials, as
gradc's kernel does. Before timing, the hand kernels' results are compared with
gradc's (a kernel that disagrees is not timed). Threads: Numba's (``NUMBA_NUM_THREADS``).

Run::

    python benchmarks/bench_layer_norm_floor.py
    python benchmarks/bench_layer_norm_floor.py --shapes 4096x1024 --repeat 21
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradc.tools.bench import (SETTLE, copy_kernel, max_rel_err,  # noqa: E402
                               time_interleaved, two_pass_kernel)

SPEC = ROOT / "examples" / "rowwise.grad"
SHAPES = ((4096, 1024), (65536, 64), (16384, 256))
EPS = 1e-5
TOL = 1e-3      # max |a - b| / max(|b|, 1) against gradc's results (float32 sums)


def hand_kernels() -> dict:
    """The two hand-written layer norms, each ``kernel(x, dy, w, b, y, dx, dwp, dbp, n)``
    over rows of ``n`` (``x``, ``dy``, ``y``, ``dx`` flat; ``dwp``, ``dbp`` one partial
    row per thread, to be summed)."""
    import numba

    # unsigned indices, as two_pass_kernel's: LLVM does not vectorise a loop whose signed
    # index could wrap around
    flags = dict(cache=True, error_model="numpy", fastmath={"reassoc"})

    @numba.njit(**flags)
    def first(x, dy, w, db, lo, n):
        """The first pass: the sums of x and of dy * w; db gathers dy."""
        t = x.dtype.type
        sx = t(0.0)
        sg = t(0.0)
        for c in range(np.uintp(n)):
            d = dy[lo + c]
            sx += x[lo + c]
            sg += d * w[c]
            db[c] += d
        return sx, sg

    @numba.njit(**flags)
    def centred(x, dy, w, lo, n, mu):
        """The second pass: sum((x - mu)^2) and sum(dy * w * (x - mu))."""
        t = x.dtype.type
        sxx = t(0.0)
        sgx = t(0.0)
        for c in range(np.uintp(n)):
            xc = x[lo + c] - mu
            sxx += xc * xc
            sgx += dy[lo + c] * w[c] * xc
        return sxx, sgx

    @numba.njit(**flags)
    def stats(sx, sg, sxx, sgx, n):
        t = type(sx)
        rstd = t(1.0) / np.sqrt(t(sxx / n) + t(EPS))
        return t(sx / n), t(sg / n), rstd, t(sgx / n * rstd)

    @numba.njit(**flags)
    def three_pass_rows(x, dy, w, b, y, dx, dw, db, r0, r1, n):
        for r in range(r0, r1):
            lo = np.uintp(r * n)
            sx, sg = first(x, dy, w, db, lo, n)
            mu = x.dtype.type(sx / n)
            sxx, sgx = centred(x, dy, w, lo, n, mu)
            mu, mg, rstd, mgx = stats(sx, sg, sxx, sgx, n)
            for c in range(np.uintp(n)):
                d = dy[lo + c]
                xh = (x[lo + c] - mu) * rstd
                y[lo + c] = xh * w[c] + b[c]
                dx[lo + c] = rstd * ((d * w[c] - mg) - xh * mgx)
                dw[c] += d * xh

    @numba.njit(**flags)
    def pipelined_rows(x, dy, w, b, y, dx, dw, db, r0, r1, n):
        t = x.dtype.type
        if r0 >= r1:
            return
        sx, sg = first(x, dy, w, db, np.uintp(r0 * n), n)
        for r in range(r0, r1):
            lo = np.uintp(r * n)
            sxx, sgx = centred(x, dy, w, lo, n, t(sx / n))
            mu, mg, rstd, mgx = stats(sx, sg, sxx, sgx, n)
            sx = t(0.0)
            sg = t(0.0)
            nx = lo + np.uintp(n) if r + 1 < r1 else lo     # the next row (this one at
            gather = r + 1 < r1          # the end, its sums not used, db not gathered)
            for c in range(np.uintp(n)):
                d = dy[lo + c]
                xh = (x[lo + c] - mu) * rstd
                y[lo + c] = xh * w[c] + b[c]
                dx[lo + c] = rstd * ((d * w[c] - mg) - xh * mgx)
                dw[c] += d * xh
                d2 = dy[nx + c]
                sx += x[nx + c]
                sg += d2 * w[c]
                db[c] += d2 if gather else t(0.0)

    def threaded(rows):
        @numba.njit(parallel=True)
        def kernel(x, dy, w, b, y, dx, dwp, dbp, n):
            chunks = dwp.shape[0]
            total = x.size // n
            for k in numba.prange(chunks):
                rows(x, dy, w, b, y, dx, dwp[k], dbp[k], k * total // chunks,
                     (k + 1) * total // chunks, n)
        return kernel

    return {"hand 3-pass": threaded(three_pass_rows),
            "hand pipelined": threaded(pipelined_rows)}


def run_shape(module, kernels: dict, shape: tuple[int, int], repeat: int,
              settle: float) -> dict:
    """Medians (ms) of every variant at ``shape``, and the variants left out, why."""
    import numba
    rows, n = shape
    rng = np.random.default_rng(0)
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
    x, dy = f32(rng.standard_normal(shape) * 2), f32(rng.standard_normal(shape))
    w, b = f32(1 + 0.2 * rng.standard_normal(n)), f32(0.2 * rng.standard_normal(n))
    want = module.layer_norm.fwd_bwd(x, w, b, dy)
    outs = tuple(np.empty_like(a) for a in want)
    y, dx = np.empty_like(x), np.empty_like(x)
    chunks = min(numba.get_num_threads(), rows)
    dwp, dbp = np.zeros((chunks, n), np.float32), np.zeros((chunks, n), np.float32)
    copy, floor = copy_kernel(), two_pass_kernel()
    flat = [a.reshape(-1) for a in (x, dy, y, dx)]
    runs = {"copy": lambda: copy(*flat),
            "2-pass floor": lambda: floor(*flat, n),
            "gradc": lambda: module.layer_norm.fwd_bwd(x, w, b, dy, out=outs)}
    left_out = {}
    for name, kernel in kernels.items():
        dwp[:] = 0
        dbp[:] = 0
        kernel(flat[0], flat[1], w, b, flat[2], flat[3], dwp, dbp, n)
        got = (y, dx, dwp.sum(0), dbp.sum(0))
        err = max(max_rel_err(a, r) for a, r in zip(got, want))
        if not err <= TOL:
            left_out[name] = f"disagrees with gradc by {err:.2g} (> {TOL})"
            continue
        runs[name] = (lambda k=kernel: k(flat[0], flat[1], w, b, flat[2], flat[3], dwp, dbp, n))
    times = time_interleaved(runs, repeat, settle=settle)
    return {"ms": {k: float(np.median(v)) * 1e3 for k, v in times.items()},
            "left_out": left_out}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=[f"{r}x{c}" for r, c in SHAPES],
                   help="ROWSxCOLS (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=11)
    p.add_argument("--settle", type=float, default=SETTLE,
                   help="seconds slept before each timed call (default: %(default)s)")
    args = p.parse_args(argv)
    import numba

    import gradc
    module = gradc.load(SPEC)
    kernels = hand_kernels()
    print(f"layer norm fwd_bwd, float32, {numba.get_num_threads()} threads; median ms of "
          f"{args.repeat} interleaved repeats (% of the copy: its time over the variant's)")
    for text in args.shapes:
        shape = tuple(int(v) for v in text.lower().split("x"))
        result = run_shape(module, kernels, shape, args.repeat, args.settle)
        ms = result["ms"]
        cells = "  ".join(f"{k} {v:.2f} ({100 * ms['copy'] / v:.0f}%)" for k, v in ms.items()
                          if k != "copy")
        print(f"{text:>11}  copy {ms['copy']:.2f}  {cells}")
        for name, why in result["left_out"].items():
            print(f"{'':>11}  {name}: not timed, {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
