#!/usr/bin/env python
"""How long the first calls of the row-wise ops take: Numba compiling their kernels.

Each compiled module is imported in a fresh process with an empty Numba cache
(``NUMBA_CACHE_DIR`` a new temporary folder), which then times, in this order, the first
call of softmax's four methods on few long rows (16x262144: the split rows' kernels),
then layer norm's ``fwd_bwd`` on 8 rows (its serial kernel) and on 4096 rows (its
parallel kernel, whose body the serial call compiled already). float32, seconds.

Run::

    python benchmarks/bench_first_calls.py                      # examples/rowwise.grad
    python benchmarks/bench_first_calls.py --modules OLD.py NEW.py --runs 2

``--modules``: modules compiled already (``gradc compile examples/rowwise.grad -o
OLD.py`` at another commit), to compare side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "rowwise.grad"

CHILD = r"""
import importlib.util, json, sys, time
import numpy as np
spec = importlib.util.spec_from_file_location("first_calls_module", sys.argv[1])
m = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = m
spec.loader.exec_module(m)
rng = np.random.default_rng(0)
times = {}
def first(label, call):
    t = time.perf_counter()
    call()
    times[label] = round(time.perf_counter() - t, 2)
x = rng.standard_normal((16, 262144)).astype(np.float32)
first("softmax split forward", lambda: m.softmax_rows(x))
for method in ("vjp", "fwd_bwd", "jvp"):
    first(f"softmax split {method}", lambda: getattr(m.softmax_rows, method)(x, x))
x = rng.standard_normal((4096, 1024)).astype(np.float32)
w = np.ones(1024, np.float32)
first("layer_norm fwd_bwd 8x1024", lambda: m.layer_norm.fwd_bwd(x[:8], w, w, x[:8]))
first("layer_norm fwd_bwd 4096x1024", lambda: m.layer_norm.fwd_bwd(x, w, w, x))
print(json.dumps(times))
"""


def first_calls(module: Path) -> dict:
    """The first calls' seconds of ``module`` in a fresh process, Numba's cache empty."""
    with tempfile.TemporaryDirectory(prefix="gradc-first-calls-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", CHILD, str(module)], env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", nargs="+", type=Path,
                    help="compiled modules to time (default: examples/rowwise.grad now)")
    ap.add_argument("--runs", type=int, default=1, help="fresh processes per module")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gradc-first-calls-") as tmp:
        modules = args.modules
        if not modules:
            import gradc
            path = Path(tmp, "rowwise_now.py")
            path.write_text(gradc.compile_source(SPEC.read_text(encoding="utf-8"),
                                                 file=str(SPEC)), encoding="utf-8")
            modules = [path]
        for run in range(args.runs):
            for module in modules:
                times = first_calls(module)
                print(f"{module.name} (run {run + 1}): "
                      + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
