#!/usr/bin/env python
"""A ``fwd_bwd`` larger than memory, streamed through Dask in chunks (docs/dask.md).

``swish.fwd_bwd(x, dy)`` of examples/activations.grad over ``--n`` float32
elements: ``x`` is generated per chunk by ``dask.array.random`` (so it never
exists whole), ``dy`` is ones, and the two results are reduced to their sums
(``--sink sum``) or written into ``np.memmap`` files (``--sink memmap``, in
``--dir``), so that only a few chunks are in memory at any time.  Each chunk is
one task: generate ``x``, run the op's fused kernel, reduce or store.

Reports the elapsed time of the compute beside that of the same graph without
the op (generating and summing the inputs: on these machines most of the time is
``x``'s random numbers), elements per second, the op's memory
traffic in GB/s (x and dy read, y and dx written: 16 B per element; generating
``x`` is not counted), the peak resident memory of the process (``ru_maxrss``,
which includes every scheduler thread) beside the size the four arrays would
have whole, and the largest difference between the streamed results and the
in-memory op on the first and last chunks (recomputed: Dask's random chunks are
deterministic).

Run::

    python benchmarks/bench_dask.py                    # 10^9 elements, chunks of 2^24
    python benchmarks/bench_dask.py --n 1000000 --chunk 250000
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np

import gradc

ROOT = Path(__file__).resolve().parents[1]


def rss_mib() -> float:
    """The process's peak resident set size so far, in MiB (Linux: KiB units)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def inputs(n: int, chunk: int):
    x = da.random.default_rng(0).standard_normal(n, dtype=np.float32, chunks=chunk)
    return x, da.ones(n, dtype=np.float32, chunks=chunk)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=1e9, help="elements (default 1e9)")
    ap.add_argument("--chunk", type=float, default=2 ** 24, help="elements per chunk")
    ap.add_argument("--sink", choices=("sum", "memmap"), default="sum")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where --sink memmap writes")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="scheduler threads")
    args = ap.parse_args(argv)
    n, chunk = int(args.n), int(args.chunk)
    act = gradc.load(ROOT / "examples" / "activations.grad")
    act.swish.fwd_bwd(np.ones(8, np.float32), np.ones(8, np.float32))   # JIT outside the timing
    x, dy = inputs(n, chunk)
    y, dx = act.swish.fwd_bwd(x, dy)
    before = rss_mib()
    files = []
    with dask.config.set(scheduler="threads", num_workers=args.workers):
        dask.compute(y.blocks[0].sum(), dx.blocks[0].sum())    # warm the scheduler's threads
        t0 = time.perf_counter()            # the same graph without the op: its inputs
        dask.compute(x.sum(dtype=np.float64), dy.sum(dtype=np.float64))
        alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        if args.sink == "sum":
            sums = dask.compute(y.sum(dtype=np.float64), dx.sum(dtype=np.float64))
        else:
            files = [Path(args.dir) / f"gradc_bench_dask_{k}.f32" for k in ("y", "dx")]
            maps = [np.memmap(f, dtype=np.float32, mode="w+", shape=(n,)) for f in files]
            da.store([y, dx], maps)
            for m in maps:
                m.flush()
            sums = tuple(float(np.sum(m[:chunk], dtype=np.float64)) for m in maps)
        elapsed = time.perf_counter() - t0
    peak = rss_mib()
    worst = 0.0
    for b in {0, x.npartitions - 1}:            # the streamed chunks against the in-memory op
        want = act.swish.fwd_bwd(x.blocks[b].compute(), dy.blocks[b].compute())
        got = dask.compute(y.blocks[b], dx.blocks[b])
        worst = max(worst, *(float(np.max(np.abs(g - w))) for g, w in zip(got, want)))
    for f in files:
        f.unlink()
    print("$ python benchmarks/bench_dask.py " + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"swish.fwd_bwd on {n:,} float32 elements in {x.npartitions} chunks of up to "
          f"{chunk:,} ({args.workers} threads, sink: {args.sink})")
    print(f"elapsed {elapsed:.2f} s; elements/s: {n / elapsed:.3e}; "
          f"GB/s: {16 * n / elapsed / 1e9:.2f} (16 B per element: x, dy read, y, dx written)")
    print(f"the inputs alone (generated and summed, no op): {alone:.2f} s; the op's share: "
          f"{max(elapsed - alone, 0):.2f} s")
    print(f"peak RSS {peak:.1f} MiB ({before:.1f} MiB before the compute); x, dy, y and dx "
          f"whole would be {16 * n / 2 ** 20:,.0f} MiB")
    print(f"sums (float64): y {sums[0]:.6g}, dx {sums[1]:.6g}" +
          (" (of the first chunk)" if args.sink == "memmap" else ""))
    print(f"max abs difference vs the in-memory op (first and last chunks): {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
