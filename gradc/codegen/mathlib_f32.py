"""float32 implementations of the vectorisable math library (see :mod:`.mathlib`).

Every function is straight-line float32 arithmetic (selects, no branches, no
calls) so that LLVM vectorises the kernel loops that inline it.  Each
docstring names its source; the measured errors are in docs/mathlib.md.
Functions whose float32 result is rounded from the float64 implementation
(:mod:`.mathlib_f64`, :mod:`.mathlib_trig`) are at the end: there the float64 code is
the source.

These are plain Python functions over NumPy scalars, so they also run (slowly)
without Numba; the bit casts below are stand-ins for the generated module's
``@numba.extending.intrinsic`` versions.
"""
from __future__ import annotations

import numpy as np

from gradc.codegen.mathlib_f64 import _g_exp_f64, _g_f64_int, _g_log_f64
from gradc.codegen.mathlib_trig import (_g_atan2_f64, _g_cos_kernel_f64, _g_sin_kernel_f64,
                                        _g_tan_kernel_f64)


def _g_f32_bits(i):
    """The float32 whose bits are the int32 ``i`` (stand-in for the bit-cast intrinsic)."""
    return np.asarray(i).astype(np.int32).view(np.float32)[()]


def _g_f32_int(x):
    """The bits of the float32 ``x`` as an int32 (stand-in for the bit-cast intrinsic)."""
    return np.asarray(x, dtype=np.float32).view(np.int32)[()]


def _g_ldexp_f32(y, n):
    """``y * 2**n`` for integer ``n`` in [-252, 254], as two exact power-of-two factors
    (so that a subnormal result is rounded once)."""
    h = n >> 1
    return (y * _g_f32_bits((h + 127) << 23)) * _g_f32_bits((n - h + 127) << 23)


def _g_expm1_kernel_f32(r):
    """``exp(r) - 1`` for |r| <= ln2/2: ``r + r^2 P(r)``, P the degree-5 polynomial of
    Cephes ``expf`` (theoretical peak relative error 4.2e-9), evaluated by Estrin's
    scheme (pairs of terms, then powers of r^2), whose shorter dependency chains make
    the compute-bound softplus, gelu, swish and log_sigmoid ``fwd_bwd`` kernels
    8-10 % faster than Horner's rule on AVX2 (Zen 2, 10^7 float32, measured side by
    side in one process)."""
    r2 = r * r
    p01 = np.float32(1.6666665459e-1) * r + np.float32(5.0000001201e-1)
    p23 = np.float32(8.3334519073e-3) * r + np.float32(4.1665795894e-2)
    p45 = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)
    p = (p45 * r2 + p23) * r2 + p01
    return p * r2 + r


def _g_exp_f32(x):
    """exp, after Cephes ``expf``: ``x = n ln2 + r`` (Cody-Waite, ln2 in two parts),
    ``exp(r) = 1 + r + r^2 P(r)``, ``2**n`` from bit casts in two steps, so results
    down to the smallest subnormal are rounded once.  x is clamped to [-104, 89]
    first (beyond, the result is 0 or inf anyway; a NaN becomes 89 there, so that the
    clamp is one min instruction, and the last select returns it)."""
    xc = x if x < np.float32(89.0) else np.float32(89.0)
    xc = np.float32(-104.0) if xc < np.float32(-104.0) else xc
    n = np.rint(xc * np.float32(1.44269504088896341))
    r = xc - n * np.float32(0.693359375)
    r = r - n * np.float32(-2.12194440e-4)
    e = _g_ldexp_f32(_g_expm1_kernel_f32(r) + np.float32(1.0), np.int32(n))
    return x if x != x else e


def _g_exp_mid_f32(x):
    """exp for finite x in [-80, 80] (callers guarantee it): the reduction and kernel
    of :func:`_g_exp_f32` (the same result there), but 2**n in one bit cast, and no
    clamps or NaN select, which it does not need; 10 fewer vector instructions
    for tanh's ``exp(2|x|)``."""
    n = np.rint(x * np.float32(1.44269504088896341))
    r = x - n * np.float32(0.693359375)
    r = r - n * np.float32(-2.12194440e-4)
    return (_g_expm1_kernel_f32(r) + np.float32(1.0)) * _g_f32_bits((np.int32(n) + np.int32(127)) << np.int32(23))


def _g_exp2_f32(x):
    """exp2, after Cephes ``exp2f``: ``x = n + r`` (exact), ``2**r = 1 + r P(r)`` on
    [-1/2, 1/2] (degree-5 P), scaled as in :func:`_g_exp_f32`."""
    xc = x if x < np.float32(129.0) else np.float32(129.0)
    xc = np.float32(-151.0) if xc < np.float32(-151.0) else xc
    n = np.rint(xc)
    r = xc - n
    p = np.float32(1.535336188319500e-4)
    p = p * r + np.float32(1.339887440266574e-3)
    p = p * r + np.float32(9.618437357674640e-3)
    p = p * r + np.float32(5.550332471162809e-2)
    p = p * r + np.float32(2.402264791363012e-1)
    p = p * r + np.float32(6.931472028550421e-1)
    e = _g_ldexp_f32(p * r + np.float32(1.0), np.int32(n))
    return x if x != x else e


def _g_expm1_f32(x):
    """expm1: the reduction of :func:`_g_exp_f32`, then ``(2**n - 1) + 2**n expm1(r)``
    (both terms exact scalings, one rounding) for n <= 24, else ``2**n (1 + expm1(r))
    - 1``; |x| < 2**-25 returns x (keeps -0)."""
    xc = x if x < np.float32(89.0) else np.float32(89.0)
    xc = np.float32(-30.0) if xc < np.float32(-30.0) else xc
    n = np.rint(xc * np.float32(1.44269504088896341))
    r = xc - n * np.float32(0.693359375)
    r = r - n * np.float32(-2.12194440e-4)
    em = _g_expm1_kernel_f32(r)
    ni = np.int32(n)
    ns = ni if ni < 24 else np.int32(24)
    s = _g_f32_bits((ns + 127) << 23)
    small = (s - np.float32(1.0)) + s * em
    big = _g_ldexp_f32(em + np.float32(1.0), ni) - np.float32(1.0)
    y = small if ni <= 24 else big
    return x if (x != x) | (abs(x) < np.float32(2.9802322e-08)) else y


def _g_log_parts_f32(x):
    """(f, y, e) with ``log(x) = f + y + e ln2`` for finite x > 0, after Cephes
    ``logf``: x = 2**e m, m in [sqrt(1/2), sqrt(2)), f = m - 1, and
    ``y = f^3 P(f) - f^2/2`` with Cephes' degree-8 P.  Subnormal x is scaled by
    2**23 first."""
    sub = x < np.float32(1.17549435e-38)
    xs = x * np.float32(8388608.0) if sub else x
    bits = _g_f32_int(xs)
    # int32 throughout (a Python int literal would widen the exponent to int64 and
    # cost the vector loop 64-bit lanes and an int64 -> float conversion)
    e = ((bits >> np.int32(23)) & np.int32(0xFF)) - np.int32(126) - (np.int32(23) if sub else np.int32(0))
    m = _g_f32_bits((bits & np.int32(0x007FFFFF)) | np.int32(0x3F000000))
    low = m < np.float32(0.707106781186547524)
    f = (m + m - np.float32(1.0)) if low else (m - np.float32(1.0))
    fe = np.float32(e - np.int32(1) if low else e)
    z = f * f
    p = np.float32(7.0376836292e-2)
    p = p * f + np.float32(-1.1514610310e-1)
    p = p * f + np.float32(1.1676998740e-1)
    p = p * f + np.float32(-1.2420140846e-1)
    p = p * f + np.float32(1.4249322787e-1)
    p = p * f + np.float32(-1.6668057665e-1)
    p = p * f + np.float32(2.0000714765e-1)
    p = p * f + np.float32(-2.4999993993e-1)
    p = p * f + np.float32(3.3333331174e-1)
    y = p * f * z - np.float32(0.5) * z
    return f, y, fe


def _g_log_special_f32(x, r):
    """``r`` where x is finite and > 0; else log's value at 0, < 0, +inf and NaN."""
    r = np.float32(-np.inf) if x == np.float32(0.0) else r
    r = np.float32(np.nan) if x < np.float32(0.0) else r
    return x if (x != x) | (x == np.float32(np.inf)) else r


def _g_log_f32(x):
    """log, Cephes ``logf``: ``f + y + e ln2`` summed with ln2 in two parts."""
    f, y, fe = _g_log_parts_f32(x)
    r = (y + fe * np.float32(-2.12194440e-4)) + f + fe * np.float32(0.693359375)
    return _g_log_special_f32(x, r)


def _g_log2_f32(x):
    """log2, Cephes ``log2f``: ``(f + y) log2(e) + e`` with log2(e) = 1 + 0.4427...,
    so the multiplication by 1 is exact."""
    f, y, fe = _g_log_parts_f32(x)
    c = np.float32(0.44269504088896340736)
    r = y * c + f * c + y + f + fe
    return _g_log_special_f32(x, r)


def _g_log10_f32(x):
    """log10, Cephes ``log10f``: log10(e) and log10(2) each split in two parts."""
    f, y, fe = _g_log_parts_f32(x)
    eb, ea = np.float32(7.00731903251827651129e-4), np.float32(4.3359375e-1)
    r = y * eb + f * eb + fe * np.float32(2.48745663981195213739e-4)
    r = r + y * ea + f * ea + fe * np.float32(3.0078125e-1)
    return _g_log_special_f32(x, r)


def _g_log1p_f32(x):
    """log1p: ``log(u) + (x - (u - 1)) / u`` with u = fl(1 + x), the second term the
    first-order correction for the rounding of u (as in Goldberg 1991, Thm. 4, and
    musl's log1pf); |x| < 2**-24 returns x."""
    u = x + np.float32(1.0)
    f, y, fe = _g_log_parts_f32(u)
    c = (x - (u - np.float32(1.0))) / u
    r = (y + fe * np.float32(-2.12194440e-4)) + c + f + fe * np.float32(0.693359375)
    r = np.float32(-np.inf) if u == np.float32(0.0) else r
    r = np.float32(np.nan) if x < np.float32(-1.0) else r
    r = x if abs(x) < np.float32(5.9604645e-08) else r
    return x if (x != x) | (x == np.float32(np.inf)) else r


def _g_tanh_f32(x):
    """tanh, Cephes ``tanhf``: ``x + x^3 P(x^2)`` (degree 4) for |x| < 0.625, else
    ``1 - 2 / (exp(2|x|) + 1)`` with |x| clamped to 10 (where tanh rounds to 1; NaN
    becomes 10 there, so :func:`_g_exp_mid_f32` sees only [0, 20]);
    |x| < 2**-13 returns x (keeps -0)."""
    ax = abs(x)
    z = x * x
    p = np.float32(-5.70498872745e-3)
    p = p * z + np.float32(2.06390887954e-2)
    p = p * z + np.float32(-5.37397155531e-2)
    p = p * z + np.float32(1.33314422036e-1)
    p = p * z + np.float32(-3.33332819422e-1)
    small = p * z * x + x
    e = _g_exp_mid_f32(np.float32(2.0) * (ax if ax < np.float32(10.0) else np.float32(10.0)))
    big = np.float32(1.0) - np.float32(2.0) / (e + np.float32(1.0))
    big = big if x >= np.float32(0.0) else -big
    r = small if ax < np.float32(0.625) else big
    return x if (x != x) | (ax < np.float32(1.2207031e-4)) else r


def _g_sigmoid_f32(x):
    """sigmoid: with e = exp(-|x|), ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below
    (relative accuracy down to the subnormals), the rounding error of s = 1 + e
    (exact, Fast2Sum) taken out of the quotient: ``q - q (err / s)``."""
    e = _g_exp_f32(-abs(x))
    s = np.float32(1.0) + e
    err = (np.float32(1.0) - s) + e
    q = (np.float32(1.0) if x >= np.float32(0.0) else e) / s
    return q - q * (err / s)


def _g_log1p_unit_f32(e):
    """log1p(e) for e in [0, 1] (or NaN): ``e + e^2 Q(e)``, ``1 + e Q(e)`` of degree 9
    fitted to log1p(e)/e on [0, 1] (minimax relative error 0.09 float32 ulp with the
    float32 coefficients, each fitted after rounding the lower ones), Q evaluated by
    Estrin's scheme; the final ``+ e`` is rounded once (FMA), so Q's rounding errors
    are scaled by e Q <= 0.31.  No range reduction, bit casts or division: softplus's
    argument ``exp(-|x|)`` is always in [0, 1], and a subnormal e gives e exactly."""
    e2 = e * e
    e4 = e2 * e2
    p12 = np.float32(0.3333048) * e + np.float32(-0.4999993)
    p34 = np.float32(0.19694024) * e + np.float32(-0.24958293)
    p56 = np.float32(0.10674703) * e + np.float32(-0.15351719)
    p78 = np.float32(0.020176627) * e + np.float32(-0.057609588)
    q = (np.float32(-0.0033124962) * e4 + (p78 * e2 + p56)) * e4 + (p34 * e2 + p12)
    return (e * q) * e + e


def _g_softplus_f32(x):
    """softplus: ``max(x, 0) + log1p(exp(-|x|))`` (the stable form of
    docs/language.md), the log1p :func:`_g_log1p_unit_f32`."""
    return (x if x > np.float32(0.0) else np.float32(0.0)) + _g_log1p_unit_f32(_g_exp_f32(-abs(x)))


def _g_atan_f32(x):
    """atan, Cephes ``atanf``: |x| > tan(3pi/8) reduced by pi/2 - atan(1/|x|), |x| >
    tan(pi/8) by pi/4 + atan((|x| - 1)/(|x| + 1)) (both computed, one selected),
    then ``t + t^3 P(t^2)`` (degree 3); the pi/2 and pi/4 in two parts."""
    ax = abs(x)
    big = ax > np.float32(2.414213562373095)
    mid = ax > np.float32(0.4142135623730950)
    t = (np.float32(-1.0) / ax) if big else ((ax - np.float32(1.0)) / (ax + np.float32(1.0))
                                             if mid else ax)
    hi = np.float32(1.5707963705062866) if big else (np.float32(0.7853981852531433) if mid
                                                    else np.float32(0.0))
    lo = np.float32(-4.371139000186243e-08) if big else (np.float32(-2.1855694e-08) if mid
                                                        else np.float32(0.0))
    z = t * t
    p = np.float32(8.05374449538e-2)
    p = p * z + np.float32(-1.38776856032e-1)
    p = p * z + np.float32(1.99777106478e-1)
    p = p * z + np.float32(-3.33329491539e-1)
    r = hi + ((p * z * t + lo) + t)
    r = r if x >= np.float32(0.0) else -r
    return x if (x != x) | (ax < np.float32(1e-4)) else r


def _g_asin_kernel_f32(s, z):
    """asin(s) for |s| <= 1/2, z = s^2: Cephes ``asinf``'s ``s + s z P(z)`` (degree 4)."""
    p = np.float32(4.2163199048e-2)
    p = p * z + np.float32(2.4181311049e-2)
    p = p * z + np.float32(4.5470025998e-2)
    p = p * z + np.float32(7.4953002686e-2)
    p = p * z + np.float32(1.6666752422e-1)
    return p * z * s + s


def _g_asin_f32(x):
    """asin, Cephes ``asinf``: the kernel below 1/2, ``pi/2 - 2 asin(sqrt((1 - |x|)/2))``
    above (pi/2 in two parts); NaN outside [-1, 1]."""
    ax = abs(x)
    big = ax > np.float32(0.5)
    z = np.float32(0.5) * (np.float32(1.0) - ax) if big else ax * ax
    p = _g_asin_kernel_f32(np.sqrt(z) if big else ax, z)
    r = (np.float32(1.5707963705062866) - np.float32(2.0) * p) \
        + np.float32(-4.371139000186243e-08) if big else p
    r = np.float32(np.nan) if ax > np.float32(1.0) else r
    r = r if x >= np.float32(0.0) else -r
    return x if (x != x) | (ax < np.float32(1e-4)) else r


def _g_acos_f32(x):
    """acos, Cephes ``acosf``: ``pi/2 - asin(x)`` on [-1/2, 1/2], ``2 asin(sqrt((1 - x)/2))``
    above and ``pi - 2 asin(sqrt((1 + x)/2))`` below (pi in two parts)."""
    ax = abs(x)
    big = ax > np.float32(0.5)
    z = np.float32(0.5) * (np.float32(1.0) - ax) if big else x * x
    p = _g_asin_kernel_f32(np.sqrt(z) if big else x, z)
    r = np.float32(2.0) * p if x > np.float32(0.0) else \
        (np.float32(3.1415927410125732) - np.float32(2.0) * p) + np.float32(-8.742278e-08)
    r = r if big else (np.float32(1.5707963705062866) - p) + np.float32(-4.371139000186243e-08)
    r = np.float32(np.nan) if ax > np.float32(1.0) else r
    return x if x != x else r


# ---- rounded from the float64 implementations ------------------------------------


def _g_erf_f32(x):
    """erf in float32 arithmetic, branch-free (our fits; the split and forms of
    N. Juffa's ``erff``): for |x| < 0.921875 ``x + x P(x^2)``, P of degree 5 fitted
    to erf(x)/x - 1 (relative minimax 1.6e-8 with the float32 coefficients); above,
    ``1 - exp(R(|x| - 1))``, R of degree 6 a minimax fit to log(erfc(t)) on
    [0.921875, 4] weighted by erfc/erf (erf's relative error, 3.3e-8), |x| clamped
    to 4, where erf rounds to 1 (NaN becomes 4 there, so :func:`_g_exp_mid_f32`
    sees only [-18, -1.6]).  ``t - 1`` is exact for t >= 0.5, so R's argument
    carries no rounding error, and R is a sum of small terms near the split, where
    1 - exp(R) magnifies R's error most; erf(-0) = -0."""
    ax = abs(x)
    s = x * x
    p = np.float32(-5.994505e-4)
    p = p * s + np.float32(4.994038e-3)
    p = p * s + np.float32(-2.6767349e-2)
    p = p * s + np.float32(1.12818435e-1)
    p = p * s + np.float32(-3.7612498e-1)
    p = p * s + np.float32(1.2837915e-1)
    small = p * x + x
    u = (ax if ax < np.float32(4.0) else np.float32(4.0)) - np.float32(1.0)
    r = np.float32(3.9250773e-4)
    r = r * u + np.float32(-2.4565172e-3)
    r = r * u + np.float32(1.051316e-2)
    r = r * u + np.float32(-4.1725706e-2)
    r = r * u + np.float32(-8.430965e-1)
    r = r * u + np.float32(-2.638966)
    r = r * u + np.float32(-1.8496056)
    big = np.float32(1.0) - _g_exp_mid_f32(r)
    big = big if x >= np.float32(0.0) else -big
    return small if (ax < np.float32(0.921875)) | (x != x) else big


def _g_erfc_f32(x):
    """erfc, branch-free (our fits), in float64 and rounded once: for |x| < 0.921875
    ``(1 - x) - x P(x^2)``, P of degree 6 fitted to erf(x)/x - 1 (relative minimax
    4.1e-10; in float32, P's error and the cancellation cost 2.6 ulp near 0.92); above,
    ``erfc(t) = exp(-t^2) erfcx(t)``, with t = |x| clamped to [0.921875, 10.0546875]
    (beyond, erfc(t) rounds to 0; NaN becomes 10.05 there): t^2 is exact in float64 and exp(-t^2) >= 1e-44 normal there, so a subnormal
    result is rounded once; erfcx(t) is G(1/t - 1/2), G of degree 10 a relative
    minimax fit to erfcx(1/v) on [1/10.0546875, 1/0.921875] (2.8e-8; scipy's
    ``erfcx`` as reference).  ``2 - erfc(|x|)`` below -0.921875 (in float64); 0 from
    10.0546875 (erfc(10.054195) is under half the smallest subnormal), 2 at -inf.
    Measured in float32 alone (fdlibm's split of t^2 and two exp factors) the products
    of rounded factors cost 4.8 ulp near the top of binades."""
    ax = abs(x)
    xd = np.float64(x)
    s = xd * xd
    p = 8.370126243507914e-05
    p = p * s + -0.0008142711522256957
    p = p * s + 0.005201033068579941
    p = p * s + -0.02685939866201184
    p = p * s + 0.1128369550398362
    p = p * s + -0.3761263373618062
    p = p * s + 0.12837916663776738
    small = np.float32((1.0 - xd) - xd * p)
    t = ax if ax < np.float32(10.0546875) else np.float32(10.0546875)
    t = np.float64(t if t > np.float32(0.921875) else np.float32(0.921875))
    w = 1.0 / t - 0.5
    g = -0.043694587517920686
    g = g * w + 0.08544909860586022
    g = g * w + -0.055553576672637064
    g = g * w + -0.0108498483575618
    g = g * w + 0.06430453411850535
    g = g * w + -0.08763898464715039
    g = g * w + 0.06449996364424052
    g = g * w + 0.022853616743302003
    g = g * w + -0.1855257828047589
    g = g * w + 0.4271857980600976
    g = g * w + 0.255395669415452
    tail = _g_exp_f64(-(t * t)) * g
    tail = tail if ax < np.float32(10.0546875) else 0.0
    big = np.float32(tail if x > np.float32(0.0) else 2.0 - tail)
    return small if (ax < np.float32(0.921875)) | (x != x) else big


# 2/pi with 64 zero bits in front, as 32-bit windows at every 8-bit offset (window k:
# bits 8k .. 8k + 31; generated with mpmath; the windows of glibc's __inv_pio4).
_G_TWO_OVER_PI_32 = np.array([
    0, 0, 0, 0, 0, 162, 41721, 10680707, 2734261102, 4186140238, 2205044292, 1850622997,
    1313084713, 1142237692, 355073063, 704390999, 4230436817, 660066805, 1473377588,
    3522507997, 4113882560, 886948059, 3720403810, 3235603093, 3680671129, 1653971260,
    2509847619, 2570863504, 1011060801, 1133527550,
], dtype=np.uint64)


def _g_rem_pio2_f32(ax):
    """(n mod 4, r) with ax = n pi/2 + r, |r| <= pi/4, r in float64, for the float32
    ax >= 0: glibc's ``sinf`` reduction (Szabolcs Nagy, ARM optimized-routines):
    the 24-bit mantissa, shifted by the exponent mod 8, times a 96-bit window of
    2/pi chosen by the exponent, kept mod 2**64 in integers: the top 2 bits are n,
    the next 62 the fraction.  Below pi/4, r = ax."""
    b = np.uint64(_g_f32_int(ax)) & np.uint64(0x7FFFFFFF)
    e = b >> np.uint64(23)
    e = np.uint64(126) if e < np.uint64(126) else e
    m = (b & np.uint64(0x7FFFFF)) | np.uint64(0x800000)
    j = e - np.uint64(88)
    k = j >> np.uint64(3)
    mm = m << (j & np.uint64(7))
    t = _G_TWO_OVER_PI_32
    res = ((mm * t[k]) << np.uint64(32)) + mm * t[k + np.uint64(4)] \
        + ((mm * t[k + np.uint64(8)]) >> np.uint64(32))
    n = (res + np.uint64(2305843009213693952)) >> np.uint64(62)
    f = np.int64(res - (n << np.uint64(62)))
    small = ax < np.float32(0.7853981633974483)
    r = np.float64(ax) if small else np.float64(f) * 3.4061215800865545e-19
    return np.int64(0) if small else np.int64(n & np.uint64(3)), r


def _g_sin_f32(x):
    """sin: :func:`_g_rem_pio2_f32`, then fdlibm's float64 sin or cos kernel by quadrant,
    rounded to float32; |x| < 2**-12 returns x."""
    ax = abs(x)
    n, r = _g_rem_pio2_f32(ax)
    v = _g_cos_kernel_f64(r, 0.0) if (n & 1) == 1 else _g_sin_kernel_f64(r, 0.0)
    v = -v if ((n & 2) == 2) != (x < np.float32(0.0)) else v
    v = np.float64(x) if ax < np.float32(2.4414062e-4) else v
    return np.float32(v) if ax < np.float32(np.inf) else x - x


def _g_cos_f32(x):
    """cos: as :func:`_g_sin_f32`."""
    ax = abs(x)
    n, r = _g_rem_pio2_f32(ax)
    v = _g_sin_kernel_f64(r, 0.0) if (n & 1) == 1 else _g_cos_kernel_f64(r, 0.0)
    v = -v if ((n + 1) & 2) == 2 else v
    return np.float32(v) if ax < np.float32(np.inf) else x - x


def _g_tan_f32(x):
    """tan: :func:`_g_rem_pio2_f32`, then fdlibm's float64 tan kernel, rounded to
    float32; |x| < 2**-12 returns x."""
    ax = abs(x)
    n, r = _g_rem_pio2_f32(ax)
    v = _g_tan_kernel_f64(r, 0.0, (n & 1) == 1)
    v = -v if x < np.float32(0.0) else v
    v = np.float64(x) if ax < np.float32(2.4414062e-4) else v
    return np.float32(v) if ax < np.float32(np.inf) else x - x


def _g_sinh_f32(x):
    """sinh: ``(e - 1/e)/2`` with e = exp(|x|) in float64 (the cancellation costs at most
    12 of its 53 bits above 2**-12), rounded to float32; |x| < 2**-12 returns x."""
    ax = abs(x)
    e = _g_exp_f64(np.float64(ax if ax < np.float32(90.0) else np.float32(90.0)))
    v = 0.5 * (e - 1.0 / e)
    v = -v if x < np.float32(0.0) else v
    return x if (x != x) | (ax < np.float32(2.4414062e-4)) else np.float32(v)


def _g_cosh_f32(x):
    """cosh: ``(e + 1/e)/2`` with e = exp(|x|) in float64, rounded to float32."""
    ax = abs(x)
    e = _g_exp_f64(np.float64(ax if ax < np.float32(90.0) else np.float32(90.0)))
    return ax if ax != ax else np.float32(0.5 * (e + 1.0 / e))


def _g_atan2_f32(y, x):
    """atan2: the float64 implementation, rounded to float32."""
    return np.float32(_g_atan2_f64(np.float64(y), np.float64(x)))


def _g_pow_f32(x, y):
    """pow: ``exp(y log|x|)`` in float64 (whose relative error, ~1e-16 times the
    exponent, is far below float32's), the sign and C99's special cases by select."""
    xd, yd = np.float64(x), np.float64(y)
    r = _g_exp_f64(yd * _g_log_f64(abs(xd)))
    yint = np.rint(yd) == yd
    odd = yint & (np.rint(yd * 0.5) != yd * 0.5)
    neg = _g_f64_int(xd) < 0
    r = -r if neg & odd else r
    r = np.nan if (xd < 0.0) & (abs(xd) != np.inf) & (np.rint(yd) != yd) else r
    r = 1.0 if (xd == -1.0) & (abs(yd) == np.inf) else r
    r = 1.0 if (yd == 0.0) | (xd == 1.0) else r
    return np.float32(r)
