"""Runs the simulator tests (``sim/``) and ``benchmarks/gpu_check.py`` in fresh
processes with NUMBA_ENABLE_CUDASIM=1 (the switch is read when numba.cuda is
first imported, so it cannot be turned on inside this process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from optional import missing

ROOT = Path(__file__).resolve().parents[2]


def _simulator_env(tmp_path: Path) -> dict:
    try:
        import numba.cuda  # noqa: F401  (numba-cuda, the cuda extra)
    except ImportError as exc:
        missing("cuda", f"numba-cuda is needed: {exc}")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONHASHSEED="0")
    env.setdefault("GRADC_CACHE_DIR", str(tmp_path / "cache"))
    return env


# The simulator's test files, each run in a process of its own and a group of its own
# (tests/conftest.py ranks them): the two workers share them, where one process
# running all three took 138 s of one worker.
SIM_FILES = ("test_sim_ops.py", "test_sim_split_rows.py", "test_sim_rowwise_special.py")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(f, marks=pytest.mark.xdist_group(f"simulator {f}"))
                                  for f in SIM_FILES])
def test_simulator_suite(tmp_path, name) -> None:
    assert sorted(SIM_FILES) == sorted(p.name for p in (ROOT / "tests" / "cuda" / "sim").glob(
        "test_*.py")), "a new file in tests/cuda/sim belongs in SIM_FILES"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         str(ROOT / "tests" / "cuda" / "sim" / name)],
        cwd=ROOT, env=_simulator_env(tmp_path), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_in_the_simulator(tmp_path) -> None:
    """Every op of the examples through every CUDA method against the IR
    interpreter (no CPU kernel is compiled), the bandwidth table, the math table
    and the row-wise table (gradc's results against float64 NumPy; torch, which
    has no GPU here, skipped with its reason), on tiny sizes: on a GPU it only has to be run (``python
    benchmarks/gpu_check.py``)."""
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--log2-sizes", "6",
         "--repeat", "1", "--calls", "1", "--dtypes", "float32", "--check-size", "6",
         "--math-samples", "32", "--row-shapes", "2x16", "--json", str(out)],
        cwd=ROOT, env=_simulator_env(tmp_path), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    ops = {(r["module"], r["op"]) for r in report["correctness"]}
    assert len(ops) == 15 and all(r["ok"] for r in report["correctness"]), report
    assert {r["op"] for r in report["bandwidth"]} >= {"device-to-device copy",
                                                     "swish.fwd_bwd", "gelu_tanh.fwd_bwd"}
    assert set(report["math_ulp"]["math_gen"]) >= {"exp", "tanh", "sigmoid", "erf"}
    assert all(v < 4 for v in report["math_ulp"]["math_gen"].values())
    rows = {r["op"]: r for r in report["rowwise"]}
    assert set(rows) == {"softmax_rows", "log_softmax_rows", "layer_norm", "rms_norm",
                         "xent_rows"} and len(report["rowwise"]) == 5, report["rowwise"]
    for r in rows.values():
        assert r["shape"] == [2, 16] and {"gradc_ms", "copy_ms", "pct_copy"} <= set(r), r
        assert r["ok"] and r["max_rel_err"] <= 1e-4, r
        assert "whole_ms" in r and r["whole_max_rel_err"] <= 1e-4, r      # 2x16 splits
        assert "simulator" in r["torch_skipped"] and "torch_ms" not in r, r
