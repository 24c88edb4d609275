"""Two compiled modules of the row-wise ops side by side: a kernel change, measured.

Compile ``examples/rowwise.grad`` before and after a change (``gradc compile ... -o
before.py``, the same with the change ``-o after.py``), then::

    python benchmarks/bench_ab.py before.py after.py --ops softmax_rows --shapes 4096x1024

times each op's fused ``fwd_bwd`` into ``out=`` buffers from both modules, interleaved
call by call, into the same buffers (with buffers of their own, the module timed second
was 5-30 % faster in each of four pairs of runs on 2026-12-06, whichever module it
was), and prints the medians and their ratio (> 1: the second module is faster).
``--serial`` runs the kernels on the calling thread and times its CPU time
(``time.thread_time``), which other processes' turns on the cores do not inflate: on a
shared machine the steadier figure for a change to a kernel's arithmetic or its
memory access (the caches and memory are still shared).  ``--fresh`` times calls
without ``out=`` (new outputs each call, as most callers make them): for small arrays,
where the wrappers' per-call work is most of a call.  The results of both modules
are checked against float64 NumPy first (``rowwise_cases.reference``).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rowwise_cases import make_inputs, reference  # noqa: E402


def load(path: Path):
    """The module at ``path``, imported under its file's stem (Numba's cache beside it
    is keyed by that name)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--ops", nargs="+", default=["softmax_rows", "log_softmax_rows",
                                                 "layer_norm", "rms_norm", "xent_rows"])
    ap.add_argument("--shapes", nargs="+", default=["4096x1024", "65536x64", "16x262144"],
                    metavar="RxC")
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--serial", action="store_true",
                    help="one thread, timed by its CPU time (run under `taskset -c N`)")
    ap.add_argument("--fresh", action="store_true",
                    help="calls without out= (new outputs each call)")
    args = ap.parse_args(argv)
    if args.before.stem == args.after.stem:
        ap.error("the two modules need different file names (Numba caches by module name)")
    mods = [load(args.before), load(args.after)]
    clock = time.thread_time if args.serial else time.perf_counter
    if args.serial:                       # every loop on the calling thread
        for m in mods:
            m._G_PARALLEL_MIN = 1 << 62
    print(f"{args.before.name} vs {args.after.name}: median ms of {args.repeat} interleaved "
          f"calls of fwd_bwd({'' if args.fresh else 'out='}), "
          f"{'serial, thread CPU time' if args.serial else 'wall'}")
    for op in args.ops:
        for text in args.shapes:
            shape = tuple(int(v) for v in text.lower().split("x"))
            params, ups = make_inputs(op, shape)
            want = reference(op, params, ups)
            calls, out = [], None
            for m in mods:
                fn = getattr(m, op).fwd_bwd
                got = fn(*params, *ups)
                for a, ref in zip(got, want):
                    np.testing.assert_allclose(a, ref, rtol=1e-3, atol=1e-3)
                out = got if out is None else out     # one set of outputs for both
                calls.append(lambda fn=fn: fn(*params, *ups) if args.fresh else
                             fn(*params, *ups, out=out))
            times: list[list[float]] = [[], []]
            for _ in range(args.repeat):
                for k, call in enumerate(calls):
                    t0 = clock()
                    call()
                    times[k].append(clock() - t0)
            a, b = (float(np.median(t)) * 1e3 for t in times)
            print(f"{op:17s} {text:10s} {a:8.4f} {b:8.4f}  after/before speed {a / b:5.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
