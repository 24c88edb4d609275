"""float64 trigonometric functions of the vectorisable math library (see :mod:`.mathlib`).

sin, cos and tan with an exact argument reduction for every float64 (Cody-Waite
below 2**20 pi/2, Payne-Hanek above, both branch-free), and asin, acos, atan and
atan2: fdlibm's algorithms (Sun, 1993; as in FreeBSD msun and musl) with every
case computed and one selected, as in :mod:`.mathlib_f64`; docs/mathlib.md has
the measured errors.

fdlibm's notice, for the functions derived from it: Copyright (C) 1993 by Sun
Microsystems, Inc. All rights reserved.  Permission to use, copy, modify, and
distribute this software is freely granted, provided that this notice is
preserved.
"""
from __future__ import annotations

import numpy as np

from gradc.codegen.mathlib_f64 import _g_f64_bits, _g_f64_int, _g_high_f64

# 2/pi in 24-bit limbs (2/pi = sum F[k] 2**(-24 (k + 1))), after two zeros: enough bits
# (1248) to reduce any float64. Generated with mpmath; the first limbs are fdlibm's ipio2.
_G_TWO_OVER_PI = np.array([
    0, 0, 10680707, 7228996, 1387004, 2578385, 16069853, 12639074, 9804092, 4427841,
    16666979, 11263675, 12935607, 2387514, 4345298, 14681673, 3074569, 13734428, 16653803,
    1880361, 10960616, 8533493, 3062596, 8710556, 7349940, 6258241, 3772886, 3769171,
    3798172, 8675211, 12450088, 3874808, 9961438, 366607, 15675153, 9132554, 7151469,
    3571407, 2607881, 12013382, 4155038, 6285869, 7677882, 13102053, 15825725, 473591,
    9065106, 15363067, 6271263, 9264392, 5636912, 4652155, 7056368, 13614112], dtype=np.float64)


def _g_carry24_f64(lo, hi):
    """The limb pair (lo, hi) with lo's multiples of 2**24 carried into hi (exact for
    integers below 2**53)."""
    c = np.floor(lo * 5.9604644775390625e-08)
    return lo - c * 16777216.0, hi + c


def _g_rem_pio2_large_f64(ax):
    """(n mod 4, y0, y1) with ax = n pi/2 + y0 + y1, |y0 + y1| <= pi/4 (+ 2**-20), for
    finite ax >= 2**20: Payne-Hanek, as fdlibm's ``__kernel_rem_pio2`` with a fixed
    number of terms (branch-free, enough for the worst case of every float64): ax's
    53-bit mantissa in three 24-bit limbs times the limbs of 2/pi that matter mod 4
    (gathered by exponent) gives eight 24-bit limbs of ax 2/pi, exact in float64
    after carry propagation; the integer part gives n, the fraction (negated limb by
    limb above 1/2) is summed into a double-double and multiplied by pi/2."""
    bits = _g_f64_int(ax)
    e = (bits >> 52) - 1023
    e = 20 if e < 20 else (1023 if e > 1023 else e)
    m = (bits & 0xFFFFFFFFFFFFF) | 0x10000000000000
    l0 = np.float64(m >> 48)
    l1 = np.float64((m >> 24) & 0xFFFFFF)
    l2 = np.float64(m & 0xFFFFFF)
    p0 = (e - 6) // 24
    w0 = e - 28 - 24 * p0                  # ax 2/pi = sum q_j 2**(w0 - 24 j) (mod 4)
    t = _G_TWO_OVER_PI
    b = p0 + 2
    f = (t[b - 2], t[b - 1], t[b], t[b + 1], t[b + 2], t[b + 3], t[b + 4], t[b + 5], t[b + 6],
         t[b + 7])
    q0 = l0 * f[2] + l1 * f[1] + l2 * f[0]
    q1 = l0 * f[3] + l1 * f[2] + l2 * f[1]
    q2 = l0 * f[4] + l1 * f[3] + l2 * f[2]
    q3 = l0 * f[5] + l1 * f[4] + l2 * f[3]
    q4 = l0 * f[6] + l1 * f[5] + l2 * f[4]
    q5 = l0 * f[7] + l1 * f[6] + l2 * f[5]
    q6 = l0 * f[8] + l1 * f[7] + l2 * f[6]
    q7 = l0 * f[9] + l1 * f[8] + l2 * f[7]
    q7, q6 = _g_carry24_f64(q7, q6)        # carries: every q below q0 in [0, 2**24)
    q6, q5 = _g_carry24_f64(q6, q5)
    q5, q4 = _g_carry24_f64(q5, q4)
    q4, q3 = _g_carry24_f64(q4, q3)
    q3, q2 = _g_carry24_f64(q3, q2)
    q2, q1 = _g_carry24_f64(q2, q1)
    q1, q0 = _g_carry24_f64(q1, q0)
    s0 = _g_f64_bits((w0 + 1023) << 52)
    s = s0 * 5.9604644775390625e-08
    v = q0 * s0
    fl = np.floor(v)
    top = (v - fl) + q1 * s                # the fraction's top 24+ bits, exact (< 2)
    b = np.floor(top)
    top = top - b
    n = (fl - 4.0 * np.floor(fl * 0.25)) + b
    up = top >= 0.5                        # round to nearest: the fraction becomes f - 1
    n = n + 1.0 if up else n
    g = -1.0 if up else 1.0
    k = 16777215.0 if up else 0.0          # limbs of 1 - f: 2**24 - 1 - q
    d1 = (1.0 - top - s) if up else top
    s = s * 5.9604644775390625e-08
    d2 = (k + g * q2) * s
    s = s * 5.9604644775390625e-08
    d3 = (k + g * q3) * s
    s = s * 5.9604644775390625e-08
    d4 = (k + g * q4) * s
    s = s * 5.9604644775390625e-08
    d5 = (k + g * q5) * s
    s = s * 5.9604644775390625e-08
    d6 = (k + g * q6) * s
    s = s * 5.9604644775390625e-08
    d7 = (k + g * q7) * s
    hi = (((((d7 + d6) + d5) + d4) + d3) + d2) + d1
    lo = (((((d1 - hi) + d2) + d3) + d4) + d5) + d6 + d7
    hh = _g_f64_bits(_g_f64_int(hi) & -134217728)
    hl = hi - hh
    p = hi * 1.5707963267948966
    err = ((hh * 1.5707963109016418 - p) + hh * 1.5893254712295857e-08 + hl * 1.5707963109016418) \
        + hl * 1.5893254712295857e-08
    tail = err + (hi * 6.123233995736766e-17 + lo * 1.5707963267948966)
    y0 = p + tail
    y1 = tail - (y0 - p)
    return np.int64(n) & 3, g * y0, g * y1


def _g_rem_pio2_f64(ax):
    """(n mod 4, y0, y1) with ax = n pi/2 + y0 + y1 for finite ax >= 0: below 2**20 pi/2,
    fdlibm's Cody-Waite with pi/2 in three 33-bit parts and a tail (n < 2**20, so
    the products are exact), the differences kept exactly (Knuth's TwoSum) instead
    of fdlibm's rounds on demand; above, :func:`_g_rem_pio2_large_f64` (both
    computed, one selected)."""
    fn = np.rint(ax * 6.36619772367581382433e-01)
    a = ax - fn * 1.57079632673412561417e+00
    b = fn * 6.07710050630396597660e-11
    s = a - b
    bb = s - a
    e = (a - (s - bb)) - (b + bb)
    c = fn * 2.02226624871116645580e-21
    s2 = s - c
    cc = s2 - s
    e2 = (s - (s2 - cc)) - (c + cc)
    tail = (e + e2) - fn * 8.47842766036889956997e-32
    y0 = s2 + tail
    y1 = tail - (y0 - s2)
    nl, yl0, yl1 = _g_rem_pio2_large_f64(ax)
    med = ax < 1647099.3291652855
    return (np.int64(fn) & 3) if med else nl, y0 if med else yl0, y1 if med else yl1


def _g_sin_kernel_f64(x, y):
    """sin(x + y) for |x + y| <= pi/4 (+ a little): fdlibm ``__kernel_sin`` (error
    < 2**-58.3 before rounding)."""
    z = x * x
    w = z * z
    r = 8.33333333332248946124e-03 + z * (-1.98412698298579493134e-04
                                          + z * 2.75573137070700676789e-06) \
        + z * w * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)
    v = z * x
    return x - ((z * (0.5 * y - v * r) - y) - v * -1.66666666666666324348e-01)


def _g_cos_kernel_f64(x, y):
    """cos(x + y) for |x + y| <= pi/4 (+ a little): fdlibm ``__kernel_cos``."""
    z = x * x
    w = z * z
    r = z * (4.16666666666666019037e-02 + z * (-1.38888888888741095749e-03
                                               + z * 2.48015872894767294178e-05)) \
        + w * w * (-2.75573143513906633035e-07 + z * (2.08757232129817482790e-09
                                                      + z * -1.13596475577881948265e-11))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + (z * r - x * y))


def _g_sin_f64(x):
    """sin: fdlibm ``sin`` (error < 1 ulp): |x| reduced by :func:`_g_rem_pio2_f64`, the sin
    or cos kernel by quadrant; |x| < 2**-26 returns x."""
    ax = abs(x)
    n, y0, y1 = _g_rem_pio2_f64(ax)
    s = _g_sin_kernel_f64(y0, y1)
    c = _g_cos_kernel_f64(y0, y1)
    r = c if (n & 1) == 1 else s
    r = -r if ((n & 2) == 2) != (x < 0.0) else r
    r = x if ax < 1.4901161193847656e-08 else r
    return r if ax < np.inf else x - x


def _g_cos_f64(x):
    """cos: fdlibm ``cos`` (error < 1 ulp), as :func:`_g_sin_f64`."""
    ax = abs(x)
    n, y0, y1 = _g_rem_pio2_f64(ax)
    s = _g_sin_kernel_f64(y0, y1)
    c = _g_cos_kernel_f64(y0, y1)
    r = s if (n & 1) == 1 else c
    r = -r if ((n + 1) & 2) == 2 else r
    return r if ax < np.inf else x - x


def _g_tan_kernel_f64(x0, y0, odd):
    """tan(x0 + y0), or -1/tan(x0 + y0) if ``odd``, for |x0 + y0| <= pi/4 (+ a little):
    fdlibm ``__kernel_tan``: a degree-27 odd polynomial below 0.6744, tan(pi/4 - y)
    above, -1/tan computed accurately (every case computed, one selected)."""
    big = abs(x0) >= 0.6743354797363281
    neg = x0 < 0.0
    xb = -x0 if neg else x0
    yb = -y0 if neg else y0
    u = (7.85398163397448278999e-01 - xb) + (3.06161699786838301793e-17 - yb)
    xs = u if big else x0
    ys = 0.0 if big else y0
    z = xs * xs
    w = z * z
    r = 1.33333333333201242699e-01 + w * (2.18694882948595424599e-02 + w * (
        3.59207910759131235356e-03 + w * (5.88041240820264096874e-04 + w * (
            7.81794442939557092300e-05 + w * -1.85586374855275456654e-05))))
    v = z * (5.39682539762260521377e-02 + w * (8.86323982359930005737e-03 + w * (
        1.45620945432529025516e-03 + w * (2.46463134818469906812e-04 + w * (
            7.14072491382608190305e-05 + w * 2.59073051863633712884e-05)))))
    s = z * xs
    r = ys + z * (s * (r + v) + ys)
    r = r + 3.33333333333334091986e-01 * s
    w = xs + r
    iy = -1.0 if odd else 1.0
    tb = iy - 2.0 * (xs - (w * w / (w + iy) - r))
    tb = -tb if neg else tb
    zh = _g_high_f64(w)
    vv = r - (zh - xs)
    a = -1.0 / w
    th = _g_high_f64(a)
    to = th + a * ((1.0 + th * zh) + th * vv)
    return tb if big else (to if odd else w)


def _g_tan_f64(x):
    """tan: fdlibm ``tan`` (error < 1 ulp): the reduction of :func:`_g_sin_f64`, then
    :func:`_g_tan_kernel_f64`; |x| < 2**-27 returns x."""
    ax = abs(x)
    n, x0, y0 = _g_rem_pio2_f64(ax)
    res = _g_tan_kernel_f64(x0, y0, (n & 1) == 1)
    res = -res if x < 0.0 else res
    res = x if ax < 3.725290298461914e-09 else res
    return res if ax < np.inf else x - x


def _g_asin_rational_f64(z):
    """fdlibm's ``R(z)`` with asin(s) = s + s R(s^2) for |s| <= 1/2 (degrees 6/4,
    error < 2**-58.75)."""
    p = z * (1.66666666666666657415e-01 + z * (-3.25565818622400915405e-01 + z * (
        2.01212532134862925881e-01 + z * (-4.00555345006794114027e-02 + z * (
            7.91534994289814532176e-04 + z * 3.47933107596021167570e-05)))))
    q = 1.0 + z * (-2.40339491173441421878e+00 + z * (2.02094576023350569471e+00 + z * (
        -6.88283971605453293030e-01 + z * 7.70381505559019352791e-02)))
    return p / q


def _g_asin_f64(x):
    """asin: fdlibm ``asin`` (error < 1 ulp): the rational below 1/2, ``pi/2 - 2 asin(s)``
    with s = sqrt((1 - |x|)/2) above, s split in head and tail below 0.975 (both
    computed, one selected); NaN outside [-1, 1]."""
    ax = abs(x)
    big = ax >= 0.5
    z = (1.0 - ax) * 0.5 if big else x * x
    r = _g_asin_rational_f64(z)
    s = np.sqrt(z)
    near1 = 1.57079632679489655800e+00 - (2.0 * (s + s * r) - 6.12323399573676603587e-17)
    f = _g_high_f64(s)
    c = (z - f * f) / (s + f)
    mid = 0.5 * 1.57079632679489655800e+00 - (2.0 * s * r - (6.12323399573676603587e-17 - 2.0 * c)
                                              - (0.5 * 1.57079632679489655800e+00 - 2.0 * f))
    res = (near1 if ax > 0.975 else mid) if big else ax + ax * r
    res = np.nan if ax > 1.0 else res
    res = res if x >= 0.0 else -res
    return x if (x != x) | (ax < 1.4901161193847656e-08) else res


def _g_acos_f64(x):
    """acos: fdlibm ``acos`` (error < 1 ulp): ``pi/2 - asin(x)`` below 1/2,
    ``2 asin(sqrt((1 - x)/2))`` (head and tail) above, ``pi - 2 asin(sqrt((1 + x)/2))``
    below -1/2; NaN outside [-1, 1]."""
    ax = abs(x)
    big = ax >= 0.5
    z = (1.0 - ax) * 0.5 if big else x * x
    r = _g_asin_rational_f64(z)
    s = np.sqrt(z)
    small = 1.57079632679489655800e+00 - (x - (6.12323399573676603587e-17 - x * r))
    neg = 2.0 * (1.57079632679489655800e+00 - (s + (r * s - 6.12323399573676603587e-17)))
    df = _g_high_f64(s)
    c = (z - df * df) / (s + df)
    pos = 2.0 * (df + (r * s + c))
    res = (pos if x > 0.0 else neg) if big else small
    res = 0.0 if x == 1.0 else res
    res = np.nan if ax > 1.0 else res
    return x if x != x else res


def _g_atan_f64(x):
    """atan: fdlibm ``atan`` (error < 1 ulp): |x| in one of five intervals is reduced to
    t with atan(|x|) = atan(c) + atan(t), c in {0, 1/2, 1, 3/2, inf} (every
    reduction computed, one selected), then an 11-term odd polynomial in t;
    |x| < 2**-27 returns x."""
    ax = abs(x)
    i1, i2, i3, i4 = ax >= 0.4375, ax >= 0.6875, ax >= 1.1875, ax >= 2.4375
    num = -1.0 if i4 else (ax - 1.5 if i3 else (ax - 1.0 if i2 else (
        2.0 * ax - 1.0 if i1 else ax)))
    den = ax if i4 else (1.0 + 1.5 * ax if i3 else (ax + 1.0 if i2 else (
        2.0 + ax if i1 else 1.0)))
    t = num / den
    hi = 1.57079632679489655800e+00 if i4 else (9.82793723247329054082e-01 if i3 else (
        7.85398163397448278999e-01 if i2 else (4.63647609000806093515e-01 if i1 else 0.0)))
    lo = 6.12323399573676603587e-17 if i4 else (1.39033110312309984516e-17 if i3 else (
        3.06161699786838301793e-17 if i2 else (2.26987774529616870924e-17 if i1 else 0.0)))
    z = t * t
    w = z * z
    s1 = z * (3.33333333333329318027e-01 + w * (1.42857142725034663711e-01 + w * (
        9.09088713343650656196e-02 + w * (6.66107313738753120669e-02 + w * (
            4.97687799461593236017e-02 + w * 1.62858201153657823623e-02)))))
    s2 = w * (-1.99999999998764832476e-01 + w * (-1.11111104054623557880e-01 + w * (
        -7.69187620504482999495e-02 + w * (-5.83357013379057348645e-02
                                           + w * -3.65315727442169155270e-02))))
    r = hi - ((t * (s1 + s2) - lo) - t)
    r = r if x >= 0.0 else -r
    return x if (x != x) | (ax < 7.450580596923828e-09) else r


def _g_atan2_f64(y, x):
    """atan2: fdlibm ``atan2``: atan(|y/x|) moved to the quadrant of (x, y) with pi in
    two parts, and C99's special cases (signed zeros, infinities) by select."""
    ay, ax = abs(y), abs(x)
    nx = _g_f64_int(x) < 0
    q = ay / ax
    z = _g_atan_f64(q)
    z = 0.0 if nx & (q < 5.421010862427522e-20) else z
    r = (3.1415926535897931160e+00 - (z - 1.2246467991473531772e-16)) if nx else z
    r = 1.5707963267948966192 if (ax == 0.0) | (ay == np.inf) | (q > 1.8446744073709552e19) \
        else r
    r = (3.1415926535897931160 if nx else 0.0) if (ay == 0.0) | (ax == np.inf) else r
    both_inf = (ax == np.inf) & (ay == np.inf)
    r = (2.356194490192344836998 if nx else 0.7853981633974483096157) if both_inf else r
    r = -r if _g_f64_int(y) < 0 else r
    return x + y if (x != x) | (y != y) else r
