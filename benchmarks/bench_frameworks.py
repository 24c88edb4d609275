#!/usr/bin/env python
"""gradc's fused fwd_bwd against hand-written NumPy, numexpr, JAX and PyTorch.

``gradc bench`` (``gradc/tools/bench.py``) on ``examples/seed.grad`` and
``examples/activations.grad``, with the ``numpy`` variant the hand-written NumPy
forward + backward of ``benchmarks/bench_fusion.py`` wherever one exists (the IR
interpreter for the other ops, listed under the tables). numexpr, JAX (``jax.jit``)
and PyTorch (eager and ``torch.compile``) run gradc's IR, each where installed;
every result is checked against gradc's before timing. Interleaved repeats,
medians, effective GB/s next to a Numba 2-read/2-write copy and ``np.copyto``
measured in the same repeats.

Run::

    python benchmarks/bench_frameworks.py                         # n = 1e6 and 1e7
    python benchmarks/bench_frameworks.py --sizes 1e4 1e5 1e6 1e7 1e8 --json bench.json \\
        --plot bench.png                                          # bench-seed.png, ...
    python benchmarks/bench_frameworks.py --skip torch.compile --files activations.grad
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fusion import NUMPY_REFS  # noqa: E402

from gradc.tools.bench import DEFAULT_SIZES, SETTLE, VARIANTS, available_variants, run_bench  # noqa: E402
from gradc.tools.bench_report import format_report, plot_report, stdout_is_tty  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", nargs="+", default=["seed.grad", "activations.grad"],
                   help="example files (in examples/) or paths")
    p.add_argument("--sizes", type=lambda s: int(float(s)), nargs="+",
                   default=list(DEFAULT_SIZES), help="elements per array (default 1e6 1e7)")
    p.add_argument("--repeat", type=int, default=11)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ops", nargs="+", help="only these ops")
    p.add_argument("--skip", nargs="+", default=[], choices=VARIANTS, metavar="V",
                   help=f"leave variants out ({', '.join(VARIANTS)})")
    p.add_argument("--settle", type=float, default=SETTLE)
    p.add_argument("--json", help="write both reports to this file")
    p.add_argument("--plot", help="FILE.png: one plot per file, FILE-<stem>.png")
    args = p.parse_args(argv)
    variants = [v for v in available_variants() if v not in args.skip]
    reports = {}
    for f in args.files:
        path = ROOT / "examples" / f if (ROOT / "examples" / f).exists() else Path(f)
        report = run_bench(path, args.sizes, args.repeat, args.warmup, variants, args.ops,
                           numpy_refs=NUMPY_REFS, settle=args.settle)
        interpreted = sorted({r["op"] for r in report["results"]} - set(NUMPY_REFS))
        report["numpy"] = ("hand-written (benchmarks/bench_fusion.py)" +
                           (f"; the IR interpreter for {', '.join(interpreted)}"
                            if interpreted else ""))
        print(format_report(report, color=stdout_is_tty()), end="\n\n", flush=True)
        reports[path.name] = report
        if args.plot:
            out = Path(args.plot)
            plot_report(report, out.with_name(f"{out.stem}-{path.stem}{out.suffix}"))
    if args.json:
        from gradc.tools.bench_report import write_json
        write_json(reports, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
