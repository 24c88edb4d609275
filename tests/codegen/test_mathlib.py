"""The vectorisable float32 math of generated kernels against float64 NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.codegen.mathlib import _g_exp_f32, _g_tanh_f32


@pytest.fixture(scope="module")
def m(import_module_text):
    src = "op t(x) -> y { y = tanh(x) }\n"
    return import_module_text(gradc.compile_source(src, file="t.grad"), "gradc_test_mathlib")


def _ulp(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)


def test_tanh_f32_within_4_ulp(m):
    x = np.linspace(-12, 12, 400_001, dtype=np.float32)
    got = m.t(x)
    assert got.dtype == np.float32
    ulp = _ulp(got, np.tanh(x.astype(np.float64)))
    assert ulp.max() <= 4.0
    assert ulp[np.abs(x) >= 0.625].max() <= 1.5


def test_tanh_f32_special_values(m):
    x = np.float32([0.0, -0.0, 1e-30, -1e-30, np.inf, -np.inf, np.nan, 9.5, 50.0])
    got = m.t(x)
    np.testing.assert_array_equal(got[:4], x[:4])
    assert np.signbit(got[1])
    np.testing.assert_array_equal(got[4:6], [1.0, -1.0])
    assert np.isnan(got[6])
    assert got[8] == 1.0


def test_tanh_derivative_keeps_its_tail(m):
    # 1 - tanh(x)^2 at 8 is 4.5e-7: float32 resolves it (not 0).
    (dx,) = m.t.vjp(np.float32([8.0]), np.float32([1.0]))
    assert 4.0e-7 < dx[0] < 5.0e-7


def test_python_versions_of_the_helpers_agree():
    assert _g_exp_f32(np.float32(1.0)) == pytest.approx(np.e, rel=1e-7)
    assert _g_tanh_f32(np.float32(1.0)) == pytest.approx(np.tanh(1.0), rel=1e-7)
