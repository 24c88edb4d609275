"""Optional parts of the test environment (PyTorch, Graphviz's ``dot``, numba-cuda).

A test that needs a part the machine lacks skips, saying what is missing and how to
install it, unless the part's ``GRADC_REQUIRE_*`` variable is ``1``: then it fails.
The README's test command requires CUDA (the ``cuda`` extra it installs); CI's command
requires all three (README.md, "Tests"; tests/test_ci.py).
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE = {"torch": "GRADC_REQUIRE_TORCH", "graphviz": "GRADC_REQUIRE_GRAPHVIZ",
           "cuda": "GRADC_REQUIRE_CUDA"}
INSTALL = {"torch": "pip install -e '.[torch]'", "graphviz": "apt-get install graphviz",
           "cuda": "pip install -e '.[cuda]'"}


def missing(part: str, why: str) -> None:
    """Skip for the missing ``part``, or fail when its GRADC_REQUIRE_* variable is 1."""
    var = REQUIRE[part]
    msg = f"{why} ({INSTALL[part]})"
    if os.environ.get(var) == "1":
        pytest.fail(f"{msg}, and {var}=1 requires it", pytrace=False)
    pytest.skip(msg, allow_module_level=True)      # also from a module's top level


def import_optional(module: str, part: str | None = None) -> ModuleType:
    """``module`` imported, or the test skipped (failed under GRADC_REQUIRE_*)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(part or module, f"{module} is not installed: {exc}")
        raise                                  # unreachable: missing() skips or fails
