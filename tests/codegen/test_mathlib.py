"""The vectorised math library of the CPU kernels (gradc.codegen.mathlib).

(a) Accuracy, table-driven over every (function, dtype) the library makes the
    default: benchmarks/mathlib_errors.py's measurement on its CI sample (every
    16411th float32 bit pattern, the function's range, special values and
    thresholds; float64 bit patterns over every binade and the range, against
    np.longdouble or mpmath), bounded by 4 ulp (float32) and 2 ulp (float64),
    the bounds that make an implementation the default.  The exhaustive float32
    sweep is ``python benchmarks/mathlib_errors.py --exhaustive`` (docs/mathlib.md).
(b) Special values through a generated module: exactly NumPy's (signed zeros,
    infinities, NaN, overflow and underflow thresholds).
(c) The kernels vectorise: no libm call and vector types in the loop's LLVM IR.
(d) ``precise=True`` / ``--precise`` calls libm everywhere and keys the cache.
"""
from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

import gradc
from gradc.codegen import mathlib, mathlib_f32, mathlib_f64
from gradc.ir.primitives import PRIMITIVES

ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"f32": np.float32, "f64": np.float64}


def _errors_module():
    spec = importlib.util.spec_from_file_location("mathlib_errors",
                                                  ROOT / "benchmarks" / "mathlib_errors.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


E = _errors_module()
UNARY = {f.name: f for f in E.UNARY}
DEFAULTS = [(name, dt) for name, (_, f32, f64) in mathlib.FUNCTIONS.items()
            for dt, impl in (("f32", f32), ("f64", f64)) if impl]


@pytest.fixture(scope="module")
def harness():
    return E.harness([n for n, _ in DEFAULTS], parallel=False)


# ---- (a) accuracy ---------------------------------------------------------------------

@pytest.mark.parametrize("name, dt", DEFAULTS, ids=[f"{n}-{d}" for n, d in DEFAULTS])
def test_error_within_bound_on_the_ci_sample(harness, name, dt):
    if dt == "f64" and name in ("erf", "erfc"):
        pytest.importorskip("mpmath")
    if name in E.BINARY:
        r = E.measure_binary(harness, name, dt, n=100_000)
    else:
        r = E.measure_unary(harness, UNARY[name], dt, ci=True)
    bound = E.F32_BOUND if dt == "f32" else E.F64_BOUND
    assert r.max_ulp <= bound, f"{name} {dt}: {r.max_ulp:.3f} ulp at {r.worst} ({r.tested})"


def test_ulp_error_counts_non_finite_disagreements():
    got = np.float32([np.inf, np.inf, 3.4028235e38, np.nan, 1.0, 0.0])
    ref = np.float64([np.inf, 3.4028235e38, 3.4028236e38, np.nan, np.nan, 2.0**-150])
    err = E.ulp_error(got, ref, np.float32)
    assert err[0] == 0 and err[1] == np.inf and err[2] < 1 and err[3] == 0
    assert err[4] == np.inf and err[5] == 0.5


# ---- (b) special values through a generated module ------------------------------------

UNARY_NAMES = [n for n in mathlib.FUNCTIONS if n not in ("pow", "atan2")]
SOURCE = "\n".join(f"op f_{n}(x) -> y {{ y = {n}(x) }}" for n in UNARY_NAMES) + """
op f_pow(x, z) -> y { y = pow(x, z) }
op f_atan2(y, x) -> r { r = atan2(y, x) }
""" + "".join(  # per dtype, kernels of every function the library implements for it
    f"op every_{dt}(x) -> y {{ y = {k + 2} * ("   # (the factor keeps the kernels apart)
    + " + ".join(f"{n}(x)" for n, d in DEFAULTS if d == dt and n not in E.BINARY) + ") }\n"
    f"op every2_{dt}(x, z) -> y {{ y = {k + 2} * ("
    + " + ".join(f"{n}(x, z)" for n, d in DEFAULTS if d == dt and n in E.BINARY) + ") }\n"
    for k, dt in enumerate(DTYPES))


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="mathlib.grad"),
                              "gradc_test_mathlib")


def _want(name, x, dt):
    """NumPy's value (float64 math.erf for erf/erfc, the primitive's reference for
    sigmoid and softplus), in dt."""
    with np.errstate(all="ignore"):
        if name in ("erf", "erfc"):
            return np.asarray([getattr(math, name)(float(v)) for v in x], dt)
        return np.asarray(PRIMITIVES[name].ref(x), dt)


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan]
THRESHOLDS = {"exp": {"f32": [88.72, 89.0, -103.0, -104.0, -87.4],
                      "f64": [709.78, 709.79, -745.1, -745.2, -708.5]},
              "exp2": {"f32": [127.99, 128.0, -149.0, -150.0], "f64": [1023.99, 1024.0, -1074.0,
                                                                       -1075.0]},
              "expm1": {"f32": [88.72, 89.0, -17.0, -18.0], "f64": [709.78, 709.79, -37.0]},
              "log": {"f32": [1e-45, 1.17549435e-38, 3.4028235e38],
                      "f64": [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308]},
              "sinh": {"f32": [89.4, 89.5, -89.5], "f64": [710.47, 710.48, -710.48]},
              "cosh": {"f32": [89.4, 89.5, -89.5], "f64": [710.47, 710.48, -710.48]},
              "sigmoid": {"f32": [-88.0, -103.0, -104.0], "f64": [-708.0, -745.0, -746.0]},
              # float32 erf and erfc: either side of the split and of the clamps, the last
              # float32 whose erfc rounds to the smallest subnormal and the first to 0
              "erf": {"f32": [0.921875, 0.92187494, -0.921875, 3.92, 4.0, -4.0, 1e-40]},
              "erfc": {"f32": [10.0, 10.1, -10.0, 10.054194, 10.054195, 0.921875,
                               0.92187494, -0.921875, -0.92187494, 1e-40],
                       "f64": [26.5, 27.3, -27.0]}}


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("name", UNARY_NAMES)
def test_special_values_are_numpys(m, name, dt):
    t = DTYPES[dt]
    x = np.asarray(SPECIAL + THRESHOLDS.get(name, {}).get(dt, []), t)
    got = getattr(m, f"f_{name}")(x)
    want = _want(name, x, t)
    assert got.dtype == t
    k = len(SPECIAL)
    np.testing.assert_array_equal(got[:k], want[:k], err_msg=f"{name} {dt}")
    num = ~np.isnan(want[:k])           # the sign of a NaN means nothing
    assert (np.signbit(got[:k]) == np.signbit(want[:k]))[num].all(), (name, dt, got[:k])
    # thresholds: overflow, underflow to zero and subnormal results as the exact function's
    if len(x) > k:
        if dt == "f64" and name in ("erf", "erfc"):
            pytest.importorskip("mpmath")
        f = UNARY[name]
        with np.errstate(all="ignore"):
            ref = f.ref32(x[k:].astype(np.float64)) if dt == "f32" else f.ref64(x[k:].astype(E.LD))
            exact = ref.astype(t)
        np.testing.assert_array_equal(np.isinf(got[k:]), np.isinf(exact), err_msg=name)
        np.testing.assert_array_equal(got[k:] == 0, exact == 0, err_msg=name)
        assert E.ulp_error(got[k:], ref, t).max() <= (E.F32_BOUND if dt == "f32" else E.F64_BOUND)


@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_pow_and_atan2_special_values_are_numpys(m, dt):
    t = DTYPES[dt]
    s = np.asarray([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0, -3.0, np.inf, -np.inf, np.nan], t)
    x, y = (a.ravel() for a in np.meshgrid(s, s))
    with np.errstate(all="ignore"):
        for op, ref in ((m.f_pow, np.power), (m.f_atan2, np.arctan2)):
            got, want = op(x, y), ref(x, y)
            np.testing.assert_allclose(got, want, rtol=2 * np.finfo(t).eps, atol=0)
            exact = (want == 0) | np.isinf(want)
            assert (np.signbit(got[exact]) == np.signbit(want[exact])).all(), ref.__name__


def test_tanh_derivative_keeps_its_tail(m):
    # 1 - tanh(x)^2 at 8 is 4.5e-7: float32 resolves it (not 0).
    (dx,) = m.f_tanh.vjp(np.float32([8.0]), np.float32([1.0]))
    assert 4.0e-7 < dx[0] < 5.0e-7


def test_python_versions_run_without_numba():
    assert mathlib_f32._g_exp_f32(np.float32(1.0)) == pytest.approx(np.e, rel=1e-7)
    assert mathlib_f32._g_log_f32(np.float32(10.0)) == pytest.approx(np.log(10), rel=1e-7)
    assert mathlib_f64._g_erf_f64(0.5) == pytest.approx(math.erf(0.5), rel=1e-15)
    assert mathlib_f64._g_log1p_f64(1e-10) == pytest.approx(math.log1p(1e-10), rel=1e-15)


# ---- (c) vectorisation ------------------------------------------------------------------

_LIBM = re.compile(r"call [^\n]*@(llvm\.)?(exp|exp2|log|log2|log10|pow|sin|cos|tan|atan|erf)"
                   r"[a-z0-9.]*\(")


def _serial_llvm(module, op, *x):
    """The LLVM IR of op's serial forward kernel for arguments ``x``, compiled here:
    code loaded from Numba's cache (another worker's, which imported the same module
    file) has none to inspect (a warning and a stub, which failed these tests now and
    then under xdist)."""
    getattr(module, op)(*x)         # compiles the serial kernel (small n)
    name = re.search(rf"def (_gk_{op}_forward_0)_serial", Path(module.__file__).read_text()).group(1)
    kernel = getattr(module, name + "_serial")
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = numba.njit(**options)(kernel.py_func)
    dtype = numba.from_dtype(x[0].dtype)
    signature = next(s for s in kernel.signatures      # the one for these arguments' dtype
                     if all(getattr(t, "dtype", dtype) == dtype for t in s))
    fresh.compile(signature)
    return fresh.inspect_llvm(signature)


@pytest.mark.skipif(bool(numba.config.BOUNDSCHECK),
                    reason="NUMBA_BOUNDSCHECK=1: bounds checks keep loops scalar")
# Vector widths: 256-bit or more; float32 at 4 lanes too, which LLVM picks on AVX2 (AMD
# Zen 2) where some float32 functions compute in float64 (sin, erfc: <4 x double> is 256
# bits), and where there is AVX-512 it picks 8 or 16.
@pytest.mark.parametrize("dt, vec", [("f32", r"<(4|8|16) x float>"),
                                     ("f64", r"<(4|8) x double>")])
def test_a_kernel_of_every_function_vectorises_without_libm_calls(m, dt, vec):
    x = np.linspace(0.1, 0.9, 64).astype(DTYPES[dt])
    for ir in (_serial_llvm(m, f"every_{dt}", x), _serial_llvm(m, f"every2_{dt}", x, x)):
        assert re.search(vec, ir), "the loop was not vectorised"
        assert not _LIBM.search(ir), _LIBM.search(ir).group(0)



def _host_has_avx512() -> bool:
    import llvmlite.binding as llvm
    return "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")


@pytest.mark.skipif(bool(numba.config.BOUNDSCHECK),
                    reason="NUMBA_BOUNDSCHECK=1: bounds checks keep loops scalar")
def test_library_kernels_prefer_512_bit_vectors(m):
    """A loop that calls the library carries clang's -mprefer-vector-width=512
    attributes; on an AVX-512 host (the CI machines) LLVM then vectorises the float32
    loop 16 wide instead of its default 8; elsewhere it takes the widest it has."""
    x = np.linspace(0.1, 0.9, 64).astype(np.float32)
    ir = _serial_llvm(m, "f_softplus", x)    # float32 throughout (erfc, sin... use float64)
    assert '"prefer-vector-width"="512"' in ir
    wide = re.search(r"<16 x float>", ir)
    assert bool(wide) == _host_has_avx512(), "16-wide float32 vectors iff the host has AVX-512"


def test_library_is_compiled_with_contraction_only():
    """The library's own flags: ``contract`` (FMA) and nothing that changes results
    otherwise (no reassoc/nnan/ninf/arcp/afn), whatever --fast-math says."""
    assert 'fastmath={"contract"}' in mathlib._INLINE
    assert "reassoc" not in mathlib._INLINE and "fastmath=True" not in mathlib._INLINE

# ---- (d) precise ------------------------------------------------------------------------

def test_precise_uses_libm_everywhere(import_module_text):
    text = gradc.compile_source("op f(x) -> y { y = exp(x) * tanh(x) }", file="p.grad",
                                precise=True)
    assert "_g_inline" not in text and "_g_exp_f32" not in text
    p = import_module_text(text, "gradc_test_mathlib_precise")
    x = np.linspace(-3, 3, 64).astype(np.float32)
    ir = _serial_llvm(p, "f", x)
    assert _LIBM.search(ir)
    np.testing.assert_allclose(p.f(x), np.exp(x) * np.tanh(x), rtol=3e-7)


@pytest.fixture(scope="module")
def libm(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="mathlib.grad", precise=True),
                              "gradc_test_mathlib_libm")


@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_precise_kernels_are_libms(libm, dt):
    p, t = libm, DTYPES[dt]
    x = np.linspace(-0.99, 0.99, 101).astype(t)
    z = np.linspace(0.3, 3.0, 101).astype(t)
    with np.errstate(all="ignore"):
        for name in UNARY_NAMES:
            got = getattr(p, f"f_{name}")(z if name.startswith("log") else x)
            want = _want(name, z if name.startswith("log") else x, t)
            np.testing.assert_allclose(got, want, rtol=4 * np.finfo(t).eps, err_msg=name)
        np.testing.assert_allclose(p.f_atan2(x, z), np.arctan2(x, z), rtol=4 * np.finfo(t).eps)
        np.testing.assert_allclose(p.f_pow(z, x), np.power(z, x), rtol=4 * np.finfo(t).eps)


def test_fast_math_does_not_change_the_library(m, import_module_text):
    fast = import_module_text(gradc.compile_source("op f(x) -> y { y = sin(x) + erf(x) }",
                                                   file="fm.grad", fast_math=True),
                              "gradc_test_mathlib_fast")
    x = np.linspace(-4, 4, 1001).astype(np.float32)
    np.testing.assert_array_equal(fast.f(x), m.f_sin(x) + m.f_erf(x))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fast_math_keeps_sqrt_and_rsqrt_exact_at_zero_inf_and_subnormals(import_module_text, dt):
    """--fast-math's flags must not let LLVM replace sqrt or 1/sqrt(x) by a reciprocal
    square root estimate and a Newton step (``arcp``/``afn`` did on an AVX-512 Zen 5:
    NaN at +-0 and inf, -inf at subnormals in float32)."""
    text = "op sq(x) -> y { y = sqrt(x) }\nop rs(x) -> y { y = rsqrt(x) }\n" \
           "op dv(x, z) -> y { y = x / sqrt(z) }"
    fast, plain = (import_module_text(gradc.compile_source(text, file="fs.grad", fast_math=f),
                                      f"gradc_test_fast_sqrt_{int(f)}") for f in (True, False))
    x = np.array([0.0, -0.0, 1e-40, 1e-310, 4.0, 2.0, 7.0, 1e-30, np.inf], dt)
    ones = np.ones_like(x)
    with np.errstate(all="ignore"):
        want_sq, want_rs = np.sqrt(x), dt(1) / np.sqrt(x)
        for op, want in ((fast.sq, want_sq), (fast.rs, want_rs)):
            np.testing.assert_allclose(op(x), want, rtol=2 * np.finfo(dt).eps)
        np.testing.assert_allclose(fast.dv(ones, x), want_rs, rtol=2 * np.finfo(dt).eps)
        for name in ("sq", "rs"):
            got, ref = getattr(fast, name).vjp(x, ones)[0], getattr(plain, name).vjp(x, ones)[0]
            np.testing.assert_allclose(got, ref, rtol=4 * np.finfo(dt).eps, err_msg=name)


def test_precise_is_an_option_of_load_and_of_the_cache_key(tmp_path):
    spec = tmp_path / "a.grad"
    spec.write_text("op f(x) -> y { y = exp(x) }\n", encoding="utf-8")
    fast, precise = gradc.load(spec), gradc.load(spec, precise=True)
    assert fast is not precise
    assert "_g_inline" in Path(fast.__file__).read_text()
    assert "_g_inline" not in Path(precise.__file__).read_text()


def test_precise_on_the_command_line(tmp_path):
    from gradc.tools.cli import main
    spec = tmp_path / "c.grad"
    spec.write_text("op f(x) -> y { y = tanh(x) }\n", encoding="utf-8")
    assert main(["compile", str(spec), "-o", str(tmp_path / "p.py"), "--precise"]) == 0
    assert main(["compile", str(spec), "-o", str(tmp_path / "d.py")]) == 0
    assert "_g_tanh_f32" not in (tmp_path / "p.py").read_text()
    assert "_g_tanh_f32" in (tmp_path / "d.py").read_text()
    assert main(["check", str(spec), "--precise"]) == 0


def test_only_the_functions_a_module_uses_are_carried():
    text = gradc.compile_source("op f(x) -> y { y = exp(x) }", file="e.grad")
    assert "def _g_exp_f32" in text and "def _g_exp_f64" in text
    assert "_g_log_f32" not in text and "def _g_tanh" not in text
