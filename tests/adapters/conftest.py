"""Fixtures shared by the adapter tests: the float64 twins of the spec examples.

check_grads (JAX) and gradcheck (PyTorch) compare with finite differences, which
need float64, and the ops annotated ``f32[...]`` demand float32: the twins are
the example files with ``f32`` written ``f64``.  Both adapters' tests use the same
twins, written at a fixed path in gradc's cache directory, so that the twins and
the derived ops of their ops (whose text imports the twin by name) are one cache
entry each: compiled once for both files, and once for the pytest-xdist workers
that share a cache directory (.ci/run sets GRADC_CACHE_DIR).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import gradc
from gradc.loader.disk_cache import cache_dir, write_atomic

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def float64_twin(file: str):
    """The module of ``examples/FILE`` with its f32 annotations as f64, written
    as ``tests/FILE64.grad`` in the cache directory (rewritten only when its text
    is not that)."""
    text = (EXAMPLES / file).read_text(encoding="utf-8").replace("f32", "f64")
    path = cache_dir() / "tests" / file.replace(".grad", "64.grad")
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradc.GradcWarning)   # W405 of two seed ops
        return gradc.load(path)


@pytest.fixture(scope="session")
def seed64(_gradc_cache_dir):
    """examples/seed.grad in float64."""
    return float64_twin("seed.grad")


@pytest.fixture(scope="session")
def act64(_gradc_cache_dir):
    """examples/activations.grad in float64."""
    return float64_twin("activations.grad")
