"""CUDA tests run without a GPU: kernels compiled to PTX (numba-cuda's NVVM) and
run in Numba's CUDA simulator (``sim/``, collected only in a process started
with ``NUMBA_ENABLE_CUDASIM=1``: ``test_simulator.py`` starts one).

Without numba-cuda (the ``cuda`` extra) these tests skip, unless
``GRADC_REQUIRE_CUDA=1`` (CI sets it), which turns a missing toolchain into a
failure.
"""
from __future__ import annotations

import os

import pytest
from optional import missing

collect_ignore = [] if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else ["sim"]
if not collect_ignore:
    # a short switch interval, and shared arrays shared (gradc.tools.cudasim)
    from gradc.tools.cudasim import fast_simulator
    fast_simulator()


def require_cuda_toolchain() -> None:
    """Skip (or fail, under GRADC_REQUIRE_CUDA=1) without numba-cuda and NVVM."""
    try:
        from numba import cuda, types
        cuda.compile_ptx(lambda a: None, (types.float32[::1],), cc=(8, 0))
    except Exception as exc:                    # ImportError, NVVM not found...
        missing("cuda", f"numba-cuda with NVVM is needed: {exc}")


@pytest.fixture(scope="session")
def cuda_toolchain() -> None:
    require_cuda_toolchain()
