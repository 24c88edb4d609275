"""Numba's threading layer in a generated module: TBB where the user chose none, the
user's choice kept, and the environment never changed (docs/frameworks.md, *Threads*).

Numba chooses its layer once per process, at the first parallel loop, so each case
runs in a fresh interpreter, which loads a module, runs its threaded kernel from four
threads at once (Dask's threaded scheduler does; the workqueue layer aborts there) and
prints what it found.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, sys, threading
import numpy as np
import gradc
env = dict(os.environ)
m = gradc.load(sys.argv[1])
x = np.linspace(-3.0, 3.0, 4096)
want = m.halved(x)                      # GRADC_PARALLEL_MIN=0: the threaded kernel
bad = []
def calls():
    for _ in range(20):
        bad.append(not np.array_equal(m.halved(x), want))
threads = [threading.Thread(target=calls) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
import numba
print(json.dumps({"layer": numba.threading_layer(), "threads": numba.get_num_threads(),
                  "why": m._G_THREADING, "same_env": dict(os.environ) == env,
                  "bad": sum(bad)}))
"""
CHOICES = ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY", "NUMBA_NUM_THREADS",
           "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")


def _tbb_installed() -> bool:
    try:
        importlib.metadata.distribution("tbb")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    """A .grad file and a gradc cache, shared by the cases (compiled once)."""
    root = tmp_path_factory.mktemp("threads")
    (root / "threads.grad").write_text("op halved(x) -> y { y = tanh(x) * 0.5 }\n",
                                       encoding="utf-8")
    return root


def _run(where, **env) -> dict:
    spec = where / "threads.grad"
    base = {k: v for k, v in os.environ.items() if k not in CHOICES}
    base.update(GRADC_CACHE_DIR=str(where / "cache"), GRADC_PARALLEL_MIN="0")
    out = subprocess.run([sys.executable, "-c", CHILD, str(spec)], env={**base, **env},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tbb_is_the_default(where):
    if not _tbb_installed():
        if sys.platform == "linux" and platform.machine() == "x86_64":
            pytest.fail("the tbb package, a dependency of gradc here, is not installed")
        pytest.skip("no tbb wheel for this platform: Numba's own choice stands")
    got = _run(where)
    assert got["layer"] == "tbb" and got["why"].startswith("tbb (")
    assert got["threads"] == len(os.sched_getaffinity(0))
    assert got["same_env"] and got["bad"] == 0


def test_the_users_choice_is_kept(where):
    got = _run(where, NUMBA_THREADING_LAYER="omp", NUMBA_NUM_THREADS="1",
               OMP_WAIT_POLICY="PASSIVE")
    assert got == {"layer": "omp", "threads": 1, "why": "NUMBA_THREADING_LAYER=omp",
                   "same_env": True, "bad": 0}
