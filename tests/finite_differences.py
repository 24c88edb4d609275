"""Helpers shared by tests that compare gradients with finite differences (imported
by name: pytest puts ``tests/``, the folder of the root conftest.py, on ``sys.path``)."""
from __future__ import annotations

import numpy as np


def close(got, want, rtol=1e-12, atol=1e-12) -> None:
    """``got`` has ``want``'s shape and values, within the tolerances."""
    got = np.asarray(got)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def fd_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function ``f`` at ``x``, per element (float64)."""
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        out[i] = (f(x + e) - f(x - e)) / (2 * h)
    return out
