"""Measured errors, in ulp, of the vectorised math library of the CPU kernels.

    python benchmarks/mathlib_errors.py                       # the sampled table (~1 min)
    python benchmarks/mathlib_errors.py --exhaustive          # every float32, 10x float64 (~40 min)
    python benchmarks/mathlib_errors.py --exhaustive --write docs/mathlib.md
    python benchmarks/mathlib_errors.py --exhaustive --dtypes f64 --write docs/mathlib.md

Every implementation of :mod:`gradc.codegen.mathlib` (``_g_exp_f32``...), whether or
not the table there makes it the default, is compiled into a small Numba module
(the same source text and ``_g_inline`` as a generated module) and compared
with a reference:

* float32: NumPy/libm in float64 (glibc, within 1 float64 ulp, 2**-29 float32
  ulp), or ``math.erf``/``math.erfc`` in float64; either every float32 (2**32,
  ``--exhaustive``) or every 4099th bit pattern (all binades, both signs, NaNs)
  plus the function's own range, special values and thresholds;
* float64: ``np.longdouble`` (x87 80-bit, glibc's ``expl``... within 2**-11
  float64 ulp) or mpmath at 80 bits (erf, erfc): bit patterns spread over every
  binade, log-uniform samples over the function's range, special values and
  thresholds;
* two-argument functions (pow, atan2): random pairs (log-uniform magnitudes,
  both signs, integer exponents for pow) and every pair of special values.

The error of a result is ``|got - ref| / ulp(ref)`` with ulp(ref) the spacing of
the dtype at ref (subnormal spacing below the normal range); a result that is
±inf where the correctly rounded reference is, or NaN where it is, counts 0,
any other non-finite disagreement counts inf.  tests/codegen/test_mathlib.py
runs the sampled measurement in CI and asserts the bounds (4 ulp float32,
2 ulp float64) for every function the table makes the default.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gradc.codegen import mathlib

F32_BOUND, F64_BOUND = 4.0, 2.0
LD = np.longdouble


# ---- references ------------------------------------------------------------------------

def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _mp(fn):
    """An mpmath function at 80 bits applied elementwise, as np.longdouble (|x| > 30 is
    given as the limit: erf and erfc are within 2**-1300 of it there)."""
    def ref(x):
        import mpmath
        mpmath.mp.prec = 80
        out = np.empty(np.shape(x), LD)
        for i, v in enumerate(np.asarray(x, np.float64).ravel()):
            v = v if abs(v) <= 30 or v != v else math.copysign(np.inf, v)
            out.flat[i] = LD(mpmath.nstr(fn(mpmath.mpf(float(v))), 24)) if np.isfinite(v) \
                else LD(float(fn(mpmath.mpf(float(v)))))
        return out
    return ref


@dataclass(frozen=True)
class Fn:
    """A library function: its references, the Numba code of its float64 reference
    (for the float32 sweep), its range for focused samples and its source."""
    name: str
    ref32: object                 # float64 array -> float64 array
    ref64: object                 # longdouble array -> longdouble array
    nb: str                       # Numba expression of the float64 reference in ``r``
    lo: float                     # magnitudes sampled log-uniformly in [lo, hi], both signs
    hi: float
    source: tuple[str, str]       # float32, float64
    positive: bool = False        # only x > 0 is interesting (the rest is NaN)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[np.float64])(x)


def _mpfun(name):
    def f(v):
        import mpmath
        return getattr(mpmath, name)(v)
    return f


UNARY = [
    Fn("exp", np.exp, np.exp, "np.exp(r)", 2**-30, 746.0, ("Cephes expf", "fdlibm exp")),
    Fn("exp2", np.exp2, np.exp2, "np.exp2(r)", 2**-30, 1076.0,
       ("Cephes exp2f", "fdlibm exp kernel, exact r ln2")),
    Fn("expm1", np.expm1, np.expm1, "np.expm1(r)", 2**-30, 710.0,
       ("Cephes expf kernel", "fdlibm expm1")),
    Fn("log", np.log, np.log, "np.log(r)", 2**-1074, 1.7e308, ("Cephes logf", "fdlibm log"),
       positive=True),
    Fn("log2", np.log2, np.log2, "np.log2(r)", 2**-1074, 1.7e308, ("Cephes log2f", "FreeBSD log2"),
       positive=True),
    Fn("log10", np.log10, np.log10, "np.log10(r)", 2**-1074, 1.7e308,
       ("Cephes log10f", "FreeBSD log10"), positive=True),
    Fn("log1p", np.log1p, np.log1p, "np.log1p(r)", 2**-60, 1.7e308,
       ("Cephes logf + correction", "fdlibm log1p")),
    Fn("tanh", np.tanh, np.tanh, "np.tanh(r)", 2**-30, 30.0, ("Cephes tanhf", "Cephes tanh")),
    Fn("sigmoid", _sigmoid, _sigmoid,
       "1.0 / (1.0 + np.exp(-r)) if r >= 0 else np.exp(r) / (1.0 + np.exp(r))",
       2**-30, 760.0, ("via exp", "via exp")),
    Fn("softplus", _softplus, _softplus, "max(r, 0.0) + np.log1p(np.exp(-abs(r)))",
       2**-30, 760.0, ("via exp, log1p on [0, 1] (degree 9)", "via exp, log1p")),
    Fn("erf", _erf, _mp(_mpfun("erf")), "math.erf(r)", 2**-30, 6.5,
       ("our fits, after Juffa erff", "fdlibm erf")),
    Fn("erfc", _erfc, _mp(_mpfun("erfc")), "math.erfc(r)", 2**-30, 28.0,
       ("float64: exp(-t^2) erfcx(t), our fits", "fdlibm erfc")),
    Fn("sin", np.sin, np.sin, "np.sin(r)", 2**-30, 1e6,
       ("glibc sinf reduction, fdlibm kernel in float64", "fdlibm kernel, exact reduction")),
    Fn("cos", np.cos, np.cos, "np.cos(r)", 2**-30, 1e6,
       ("glibc sinf reduction, fdlibm kernel in float64", "fdlibm kernel, exact reduction")),
    Fn("tan", np.tan, np.tan, "np.tan(r)", 2**-30, 1e6,
       ("glibc sinf reduction, fdlibm kernel in float64", "fdlibm kernel, exact reduction")),
    Fn("asin", np.arcsin, np.arcsin, "np.arcsin(r)", 2**-30, 1.0, ("Cephes asinf", "fdlibm asin")),
    Fn("acos", np.arccos, np.arccos, "np.arccos(r)", 2**-30, 1.0, ("Cephes acosf", "fdlibm acos")),
    Fn("atan", np.arctan, np.arctan, "np.arctan(r)", 2**-30, 2.0**70, ("Cephes atanf", "fdlibm atan")),
    Fn("sinh", np.sinh, np.sinh, "np.sinh(r)", 2**-30, 711.0,
       ("(e - 1/e)/2 in float64", "musl sinh (fdlibm expm1)")),
    Fn("cosh", np.cosh, np.cosh, "np.cosh(r)", 2**-30, 711.0,
       ("(e + 1/e)/2 in float64", "musl cosh (fdlibm expm1)")),
]
BINARY = {"pow": (np.power, np.power, ("exp(y log x) in float64", "fdlibm pow")),
          "atan2": (np.arctan2, np.arctan2, ("float64, rounded", "fdlibm atan2"))}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0,
           1e-45, -1e-45, 5e-324, -5e-324, 1.17549435e-38, 2.2250738585072014e-308,
           88.72, 88.7228, 89.0, -87.0, -103.0, -104.0, 709.78, 710.0, -745.0, -746.0,
           1e30, -1e30, 3.4028235e38, -3.4028235e38, 1.7976931348623157e308]


def _impl(name: str, dt: str) -> str | None:
    for impl in mathlib.FUNCTIONS[name][1:]:
        if impl and impl.endswith("_" + dt):
            return impl
    cand = f"_g_{name}_{dt}"
    return cand if cand in mathlib._IMPLS else None


# ---- the compiled harness ---------------------------------------------------------------

def harness(names=None, parallel: bool = True):
    """A module with, for every implementation: ``k<impl>(out, *args)`` (elementwise),
    and for float32 unary ones ``sweep<impl>(start, err)`` writing the ulp errors of
    the bit patterns from ``start`` (the float64 reference computed in Numba)."""
    fns = [f for f in UNARY if names is None or f.name in names]
    impls32 = [(f, _impl(f.name, "f32")) for f in fns]
    impls = [i for f in fns for i in (_impl(f.name, "f32"), _impl(f.name, "f64")) if i]
    impls += [i for n in BINARY if names is None or n in names
              for i in (_impl(n, "f32"), _impl(n, "f64")) if i]
    text = ["import math\n\nimport numba\nimport numba.extending\nimport numpy as np\n",
            mathlib.implementation_source(impls), _ULP32]
    for impl in impls:
        args = ", ".join("xyz"[:mathlib._IMPLS[impl].__code__.co_argcount])
        ix = ", ".join(f"{a}[i]" for a in args.split(", "))
        text.append(f"@numba.njit(parallel={parallel}, error_model='numpy')\n"
                    f"def k{impl}(out, {args}):\n    for i in numba.prange(out.size):\n"
                    f"        out[i] = {impl}({ix})\n")
    for f, impl in impls32:
        if impl:
            text.append(f"@numba.njit(parallel=True, error_model='numpy')\n"
                        f"def sweep{impl}(start, err):\n"
                        f"    for i in numba.prange(err.size):\n"
                        f"        x = _g_f32_bits(np.int32(np.uint32(start + i)))\n"
                        f"        r = np.float64(x)\n"
                        f"        err[i] = _g_ulp32({impl}(x), {f.nb})\n")
    for name in ("_g_f32_bits", "_g_f64_bits", "_g_f64_int"):
        if f"def {name}" not in text[1]:
            text.insert(2, mathlib._intrinsic(name))
    with tempfile.TemporaryDirectory(prefix="gradc_mathlib_") as folder:
        path = Path(folder) / "mathlib_harness.py"
        path.write_text("\n\n".join(text), encoding="utf-8")
        spec = importlib.util.spec_from_file_location("mathlib_harness", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)        # compiled from memory on first call
    return module


_ULP32 = '''@numba.njit(error_model="numpy")
def _g_ulp32(g, r):
    """ulp error of the float32 result g against the float64 reference r."""
    rr = np.float32(r)
    if r != r or g != g:
        return 0.0 if (r != r and g != g) else np.inf
    if abs(g) == np.inf or abs(r) == np.inf:
        return 0.0 if g == rr else np.inf
    e = max(((_g_f64_int(r) >> 52) & 0x7FF) - 1023, -126) - 23
    return abs(np.float64(g) - r) / _g_f64_bits((e + 1023) << 52)'''


def ulp_error(got, ref, dtype):
    """Elementwise ulp error of ``got`` (dtype) against ``ref`` (a wider float array)."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    info = np.finfo(dtype)
    with np.errstate(all="ignore"):
        rounded = ref.astype(dtype)
        _, e = np.frexp(ref)
        ulp = np.ldexp(np.ones_like(ref), np.maximum(e - 1, info.minexp) - info.nmant)
        err = np.abs(got.astype(ref.dtype) - ref) / ulp
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    inf = np.isinf(got) | np.isinf(ref)
    err = np.where(inf, np.where(got == rounded, 0.0, np.inf), err)
    return np.where(nan_g | nan_r, np.where(nan_g & nan_r, 0.0, np.inf), err)


# ---- samples ----------------------------------------------------------------------------

def samples32(f: Fn, stride: int = 4099, n_range: int = 200_000, seed: int = 0):
    """float32 inputs: every ``stride``-th bit pattern, the function's range
    (log-uniform magnitudes, both signs) and the special values."""
    rng = np.random.default_rng(seed)
    bits = np.arange(0, 2**32, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mags = np.exp(rng.uniform(np.log(max(f.lo, 1e-38)), np.log(min(f.hi, 3e38)), n_range))
    signs = np.ones(n_range) if f.positive else rng.choice([-1.0, 1.0], n_range)
    with np.errstate(over="ignore"):
        return np.concatenate([bits, (mags * signs).astype(np.float32),
                               np.asarray(SPECIAL, np.float32)])


def samples64(f: Fn, n_bits: int = 1 << 17, n_range: int = 400_000, seed: int = 0):
    """float64 inputs: ``n_bits`` bit patterns spread over every binade and sign, the
    function's range (log-uniform magnitudes, both signs) and the special values."""
    rng = np.random.default_rng(seed)
    step = 2**64 // n_bits
    bits = (np.arange(n_bits, dtype=np.uint64) * np.uint64(step)
            + rng.integers(0, 2**40, n_bits, dtype=np.uint64)).view(np.float64)
    mags = np.exp(rng.uniform(np.log(f.lo), np.log(f.hi), n_range))
    signs = np.ones(n_range) if f.positive else rng.choice([-1.0, 1.0], n_range)
    near1 = rng.uniform(0.5, 2.0, n_range // 8) if f.positive else np.zeros(0)
    return np.concatenate([bits, mags * signs, near1, np.asarray(SPECIAL, np.float64)])


def pairs(dtype, n: int = 400_000, seed: int = 0, pow_like: bool = False):
    """Two-argument inputs: random pairs and every pair of special values."""
    rng = np.random.default_rng(seed)
    big = 100.0 if dtype == np.float32 else 700.0
    x = np.exp(rng.uniform(-big, big, n)) * rng.choice([-1.0, 1.0], n)
    y = np.exp(rng.uniform(-big, big, n)) * rng.choice([-1.0, 1.0], n)
    if pow_like:    # exponents that keep x**y in range, integer ones for negative x
        x = np.abs(x)
        y = rng.uniform(-1, 1, n) * big / np.maximum(np.abs(np.log(x)), 1e-3)
        neg = rng.random(n) < 0.25
        x = np.where(neg, -x, x)
        y = np.where(neg, np.round(y), y)
    s = np.asarray(SPECIAL, np.float64)
    sx, sy = np.meshgrid(s, s)
    with np.errstate(over="ignore"):
        return (np.concatenate([x, sx.ravel()]).astype(dtype),
                np.concatenate([y, sy.ravel()]).astype(dtype))


# ---- measurement ------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    dtype: str
    impl: str | None
    default: bool
    max_ulp: float
    worst: tuple
    tested: str
    source: str


def _run(h, impl, *args):
    out = np.empty_like(args[0])
    getattr(h, "k" + impl)(out, *args)
    return out


def measure_unary(h, f: Fn, dt: str, exhaustive: bool = False, ci: bool = False) -> Result | None:
    """The largest error of f's implementation for dt: every float32 (``exhaustive``),
    the sample, or the smaller CI sample (``ci``)."""
    impl = _impl(f.name, dt)
    if impl is None:
        return None
    default = mathlib.FUNCTIONS[f.name][1 if dt == "f32" else 2] == impl
    if dt == "f32" and exhaustive:
        worst, arg, chunk = 0.0, 0, 1 << 24
        err = np.empty(chunk)
        for start in range(0, 2**32, chunk):
            getattr(h, "sweep" + impl)(start, err)
            k = int(np.argmax(err))
            if err[k] > worst:
                worst, arg = float(err[k]), start + k
        x = np.uint32(arg).view(np.float32)
        return Result(f.name, dt, impl, default, worst, (float(x),), "all 2^32 float32",
                      f.source[0])
    if dt == "f32":
        stride = 16411 if ci else 4099
        x = samples32(f, stride, 50_000 if ci else 200_000)
        got = _run(h, impl, x)
        with np.errstate(all="ignore"):
            ref = f.ref32(x.astype(np.float64))
        tested = f"{x.size:,} float32 (every {stride}th + range + special)"
    else:
        slow = f.name in ("erf", "erfc")          # their reference is mpmath's
        if ci:
            sizes = (1 << 12, 10_000) if slow else (1 << 15, 100_000)
        elif exhaustive:
            sizes = (1 << 14, 60_000) if slow else (1 << 20, 4_000_000)
        else:
            sizes = (1 << 13, 20_000) if slow else (1 << 17, 400_000)
        x = samples64(f, *sizes)
        got = _run(h, impl, x)
        with np.errstate(all="ignore"):
            ref = f.ref64(x.astype(LD))
        tested = f"{x.size:,} float64 (bit patterns + range + special)"
    err = ulp_error(got, ref, np.float32 if dt == "f32" else np.float64)
    k = int(np.argmax(err))
    return Result(f.name, dt, impl, default, float(err[k]), (float(x[k]),), tested,
                  f.source[0 if dt == "f32" else 1])


def measure_binary(h, name: str, dt: str, n: int = 400_000) -> Result | None:
    impl = _impl(name, dt)
    if impl is None:
        return None
    ref32, ref64, source = BINARY[name]
    dtype = np.float32 if dt == "f32" else np.float64
    x, y = pairs(dtype, n, pow_like=(name == "pow"))
    got = _run(h, impl, x, y)
    with np.errstate(all="ignore"):
        ref = ref32(x.astype(np.float64), y.astype(np.float64)) if dt == "f32" else \
            ref64(x.astype(LD), y.astype(LD))
    err = ulp_error(got, ref, dtype)
    k = int(np.argmax(err))
    default = mathlib.FUNCTIONS[name][1 if dt == "f32" else 2] == impl
    return Result(name, dt, impl, default, float(err[k]), (float(x[k]), float(y[k])),
                  f"{x.size:,} pairs (random + special)", source[0 if dt == "f32" else 1])


def measure_all(names=None, exhaustive=False, log=None, dtypes=("f32", "f64")):
    h = harness(names)
    out = []
    for f in UNARY:
        if names is None or f.name in names:
            for dt in dtypes:
                t0 = time.time()
                r = measure_unary(h, f, dt, exhaustive)
                if r:
                    out.append(r)
                    if log:
                        log(f"{r.name:9} {r.dtype} {r.max_ulp:8.3f} ulp at {r.worst}  "
                            f"({time.time() - t0:.0f} s)")
    for name in BINARY:
        if names is None or name in names:
            for dt in dtypes:
                r = measure_binary(h, name, dt, 4_000_000 if exhaustive else 400_000)
                if r:
                    out.append(r)
                    if log:
                        log(f"{r.name:9} {r.dtype} {r.max_ulp:8.3f} ulp at {r.worst}")
    return out


_HEAD = ["| function | dtype | default | max error (ulp) | worst input | tested | source |",
         "| --- | --- | --- | --- | --- | --- | --- |"]


def rows(results) -> dict:
    """Table rows keyed by (function, dtype)."""
    out = {}
    for r in results:
        worst = ", ".join(f"{v:.9g}" for v in r.worst)
        out[r.name, r.dtype] = (f"| {r.name} | {r.dtype} | {'library' if r.default else 'libm'} "
                                f"| {r.max_ulp:.3f} | {worst} | {r.tested} | {r.source} |")
    return out


def table(by_key: dict) -> str:
    """The markdown table, in the library's order (float32 before float64)."""
    order = [(n, dt) for n in mathlib.FUNCTIONS for dt in ("f32", "f64")]
    return "\n".join(_HEAD + [by_key[k] for k in order if k in by_key])


def write(path: Path, new: dict) -> None:
    """Replace the rows of ``new`` in the table between the markers of ``path`` (the
    other rows stay: a partial run, ``--only`` or ``--dtypes``, updates its own)."""
    doc = path.read_text(encoding="utf-8")
    begin, end = "<!-- table:begin -->", "<!-- table:end -->"
    head, rest = doc.split(begin)
    old, tail = rest.split(end)
    keep = {}
    for line in old.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        keep[cells[0], cells[1]] = line
    path.write_text(f"{head}{begin}\n{table({**keep, **new})}\n{end}{tail}", encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exhaustive", action="store_true",
                   help="every float32, ten times the float64 samples (~40 min)")
    p.add_argument("--only", nargs="*", help="function names")
    p.add_argument("--dtypes", nargs="*", default=["f32", "f64"], choices=["f32", "f64"])
    p.add_argument("--write", help="put the rows in the table of this markdown file "
                                   "(docs/mathlib.md), replacing those of the same function "
                                   "and dtype")
    a = p.parse_args(argv)
    results = measure_all(a.only, a.exhaustive, log=lambda s: print(s, flush=True),
                          dtypes=a.dtypes)
    print(table(rows(results)))
    if a.write:
        write(Path(a.write), rows(results))
    bad = [r for r in results if r.default and r.max_ulp > (F32_BOUND if r.dtype == "f32"
                                                              else F64_BOUND)]
    for r in bad:
        print(f"OUT OF BOUNDS: {r.name} {r.dtype} {r.max_ulp:.3f} ulp", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
