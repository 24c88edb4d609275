"""float64 implementations of the vectorisable math library (see :mod:`.mathlib`).

Straight-line float64 arithmetic (selects, no branches, no calls), so that
LLVM vectorises the kernel loops that inline it.  Most are the algorithms of
fdlibm (Sun, 1993; as in FreeBSD msun and musl) with every branch computed and
one result selected; each docstring names its source, and docs/mathlib.md has
the measured errors.  Plain Python over NumPy scalars: they also run without
Numba, through the bit-cast stand-ins below.

fdlibm's notice, for the functions derived from it: Copyright (C) 1993 by Sun
Microsystems, Inc. All rights reserved.  Permission to use, copy, modify, and
distribute this software is freely granted, provided that this notice is
preserved.
"""
from __future__ import annotations

import numpy as np

def _g_f64_bits(i):
    """The float64 whose bits are the int64 ``i`` (stand-in for the bit-cast intrinsic)."""
    return np.asarray(i).astype(np.int64).view(np.float64)[()]


def _g_f64_int(x):
    """The bits of the float64 ``x`` as an int64 (stand-in for the bit-cast intrinsic)."""
    return np.asarray(x, dtype=np.float64).view(np.int64)[()]


def _g_ldexp_f64(y, n):
    """``y * 2**n`` for integer ``n`` in [-2044, 2046], as two exact power-of-two
    factors (a subnormal result is rounded once)."""
    h = n >> 1
    return (y * _g_f64_bits((h + 1023) << 52)) * _g_f64_bits((n - h + 1023) << 52)


def _g_high_f64(x):
    """x with its low 32 bits cleared (a 21-bit head whose products are exact)."""
    return _g_f64_bits(_g_f64_int(x) & -4294967296)


def _g_exp_kernel_f64(hi, lo):
    """``exp(hi - lo)`` for |hi - lo| <= ln2/2, fdlibm ``__ieee754_exp``: ``1 + r + r c
    / (2 - c)``, c from a degree-5 Remez polynomial in r^2 (error < 2**-59)."""
    r = hi - lo
    t = r * r
    c = r - t * (1.66666666666666019037e-01 + t * (-2.77777777770155933842e-03 + t * (
        6.61375632143793436117e-05 + t * (-1.65339022054652515390e-06
                                          + t * 4.13813679705723846039e-08))))
    return 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)


def _g_exp_scaled_f64(x, s):
    """``exp(x) * 2**s`` (s a small integer) for non-NaN x: fdlibm's reduction x = k ln2
    + r with ln2 in two parts (k ln2_hi is exact), x clamped to [-746, 711]."""
    xc = x if x < 711.0 else 711.0
    xc = -746.0 if xc < -746.0 else xc
    k = np.rint(xc * 1.44269504088896338700e+00)
    y = _g_exp_kernel_f64(xc - k * 6.93147180369123816490e-01, k * 1.90821492927058770002e-10)
    return _g_ldexp_f64(y, np.int64(k) + s)


def _g_exp_f64(x):
    """exp: fdlibm's algorithm (see :func:`_g_exp_kernel_f64`), 2**k in two steps."""
    e = _g_exp_scaled_f64(x, 0)
    return x if x != x else e


def _g_exp2_f64(x):
    """exp2: x = n + r (exact), then ``exp(r ln2)`` with the product r ln2 carried as an
    exact double-double (Dekker's product, bit-mask splits, ln2 in three parts) into
    the fdlibm kernel of :func:`_g_exp_kernel_f64`."""
    xc = x if x < 1025.0 else 1025.0
    xc = -1076.0 if xc < -1076.0 else xc
    n = np.rint(xc)
    r = xc - n
    rh = _g_f64_bits(_g_f64_int(r) & -134217728)
    rl = r - rh
    p = r * 0.6931471805599453
    err = ((rh * 0.6931471675634384 - p) + rh * 1.299650687069942e-08
           + rl * 0.6931471675634384) + rl * 1.299650687069942e-08
    err = err + r * 2.3190468138462996e-17
    e = _g_ldexp_f64(_g_exp_kernel_f64(p, -err), np.int64(n))
    return x if x != x else e


def _g_expm1_f64(x):
    """expm1: fdlibm ``expm1`` (error < 1 ulp), every case of its final step computed
    and one selected by k; |x| < 2**-54 returns x (keeps -0)."""
    xc = x if x < 711.0 else 711.0
    xc = -40.0 if xc < -40.0 else xc
    k = np.rint(xc * 1.44269504088896338700e+00)
    hi = xc - k * 6.93147180369123816490e-01
    lo = k * 1.90821492927058770002e-10
    r = hi - lo
    c = (hi - r) - lo
    hfx = 0.5 * r
    hxs = r * hfx
    r1 = 1.0 + hxs * (-3.33333333333331316428e-02 + hxs * (1.58730158725481460165e-03 + hxs * (
        -7.93650757867487942473e-05 + hxs * (4.00821782732936239552e-06
                                             + hxs * -2.01099218183624371326e-07))))
    t = 3.0 - r1 * hfx
    e = hxs * ((r1 - t) / (6.0 - r * t))
    y0 = r - (r * e - hxs)
    e = (r * (e - c) - c) - hxs
    ki = np.int64(k)
    ym1 = 0.5 * (r - e) - 0.5
    yp1 = -2.0 * (e - (r + 0.5)) if r < -0.25 else 1.0 + 2.0 * (r - e)
    kc = 2 if ki < 2 else (56 if ki > 56 else ki)
    twopk = _g_f64_bits((kc + 1023) << 52)
    twomk = _g_f64_bits((1023 - kc) << 52)
    ymid = (r - e + (1.0 - twomk)) * twopk if ki < 20 else (r - (e + twomk) + 1.0) * twopk
    yfar = _g_ldexp_f64(r - e + 1.0, ki) - 1.0
    y = ymid if (ki >= 2) & (ki <= 56) else yfar
    y = yp1 if ki == 1 else y
    y = ym1 if ki == -1 else y
    y = y0 if ki == 0 else y
    return x if (x != x) | (abs(x) < 5.551115123125783e-17) else y


def _g_log_parts_f64(x):
    """(f, hfsq, s (hfsq + R), k) with ``log(x) = f - hfsq + s (hfsq + R) + k ln2`` for
    finite x > 0: fdlibm's reduction to m = 1 + f in [sqrt(1/2), sqrt(2)) (musl's
    form), s = f / (2 + f), R a degree-14 Remez polynomial in s (error < 2**-58.45).
    Subnormal x is scaled by 2**54 first."""
    sub = x < 2.2250738585072014e-308
    xs = x * 18014398509481984.0 if sub else x
    bits = _g_f64_int(xs)
    hx = (bits >> 32) + (0x3FF00000 - 0x3FE6A09E)
    k = (hx >> 20) - 0x3FF - (54 if sub else 0)
    m = _g_f64_bits((((hx & 0x000FFFFF) + 0x3FE6A09E) << 32) | (bits & 0xFFFFFFFF))
    f, hfsq, sr = _g_log_poly_f64(m - 1.0)
    return f, hfsq, sr, np.float64(k)


def _g_log_poly_f64(f):
    """(f, hfsq, s (hfsq + R)) of :func:`_g_log_parts_f64` for a given f."""
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (3.999999999940941908e-01 + w * (2.222219843214978396e-01
                                              + w * 1.531383769920937332e-01))
    t2 = z * (6.666666666666735130e-01 + w * (2.857142874366239149e-01 + w * (
        1.818357216161805012e-01 + w * 1.479819860511658591e-01)))
    return f, hfsq, s * (hfsq + t2 + t1)


def _g_log_special_f64(x, r):
    """``r`` where x is finite and > 0; else log's value at 0, < 0, +inf and NaN."""
    r = -np.inf if x == 0.0 else r
    r = np.nan if x < 0.0 else r
    return x if (x != x) | (x == np.inf) else r


def _g_log_f64(x):
    """log: fdlibm ``__ieee754_log`` (error < 1 ulp), ln2 in two parts."""
    f, hfsq, sr, dk = _g_log_parts_f64(x)
    r = sr + dk * 1.90821492927058770002e-10 - hfsq + f + dk * 6.93147180369123816490e-01
    return _g_log_special_f64(x, r)


def _g_log_hilo_f64(f, hfsq, sr):
    """log(1 + f) as hi + lo, hi with 21 bits (FreeBSD ``e_log2.c``/``e_log10.c``)."""
    hi = _g_high_f64(f - hfsq)
    return hi, f - hi - hfsq + sr


def _g_log2_f64(x):
    """log2: FreeBSD ``e_log2.c`` (k_log: log(1+f) as hi + lo, times 1/ln2 in two
    parts, added to k in extra precision)."""
    f, hfsq, sr, dk = _g_log_parts_f64(x)
    hi, lo = _g_log_hilo_f64(f, hfsq, sr)
    val_hi = hi * 1.44269504072144627571e+00
    val_lo = (lo + hi) * 1.67517131648865118353e-10 + lo * 1.44269504072144627571e+00
    w = dk + val_hi
    val_lo = val_lo + ((dk - w) + val_hi)
    return _g_log_special_f64(x, val_lo + w)


def _g_log10_f64(x):
    """log10: FreeBSD ``e_log10.c`` (as log2, with 1/ln10 and log10(2) in two parts)."""
    f, hfsq, sr, dk = _g_log_parts_f64(x)
    hi, lo = _g_log_hilo_f64(f, hfsq, sr)
    val_hi = hi * 4.34294481878168880939e-01
    y = dk * 3.01029995663611771306e-01
    val_lo = (dk * 3.69423907715893078616e-13 + (lo + hi) * 2.50829467116452752298e-11
              + lo * 4.34294481878168880939e-01)
    w = y + val_hi
    val_lo = val_lo + ((y - w) + val_hi)
    return _g_log_special_f64(x, val_lo + w)


def _g_log1p_f64(x):
    """log1p: fdlibm ``log1p`` (error < 1 ulp): u = 1 + x reduced as in log, with the
    correction c = (x - (u - 1)) / u for u's rounding; f = x exactly where
    1 + x is in [sqrt(1/2), sqrt(2)); |x| < 2**-53 returns x."""
    u = 1.0 + x
    bits = _g_f64_int(u)
    hu = (bits >> 32) + (0x3FF00000 - 0x3FE6A09E)
    k = (hu >> 20) - 0x3FF
    c = (1.0 - (u - x)) if k >= 2 else (x - (u - 1.0))
    c = c / u if k < 54 else 0.0
    m = _g_f64_bits((((hu & 0x000FFFFF) + 0x3FE6A09E) << 32) | (bits & 0xFFFFFFFF))
    f = x if k == 0 else m - 1.0
    c = 0.0 if k == 0 else c
    f, hfsq, sr = _g_log_poly_f64(f)
    dk = np.float64(k)
    r = sr + (dk * 1.90821492927058770002e-10 + c) - hfsq + f + dk * 6.93147180369123816490e-01
    r = -np.inf if x == -1.0 else r
    r = np.nan if x < -1.0 else r
    r = x if abs(x) < 1.1102230246251565e-16 else r
    return x if (x != x) | (x == np.inf) else r


def _g_tanh_f64(x):
    """tanh, Cephes ``tanh``: ``x + x^3 P(x^2)/Q(x^2)`` (degrees 2/3) for |x| < 0.625,
    else ``1 - 2 / (exp(2|x|) + 1)`` with |x| clamped to 22 (where tanh rounds to 1);
    |x| < 2**-27 returns x (keeps -0)."""
    ax = abs(x)
    z = x * x
    p = (-9.64399179425052238628e-1 * z - 9.92877231001918586564e1) * z \
        - 1.61468768441708447952e3
    q = ((z + 1.12811678491632931402e2) * z + 2.23548839060100448583e3) * z \
        + 4.84406305325125486048e3
    small = x + x * (z * p / q)
    e = _g_exp_f64(2.0 * (ax if ax < 22.0 else 22.0))
    big = 1.0 - 2.0 / (e + 1.0)
    big = big if x >= 0.0 else -big
    r = small if ax < 0.625 else big
    return x if (x != x) | (ax < 7.450580596923828e-09) else r


def _g_sigmoid_f64(x):
    """sigmoid: with e = exp(-|x|), ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below
    (relative accuracy down to the subnormals), the rounding error of s = 1 + e
    (exact, Fast2Sum) taken out of the quotient: ``q - q (err / s)``."""
    e = _g_exp_f64(-abs(x))
    s = 1.0 + e
    err = (1.0 - s) + e
    q = (1.0 if x >= 0.0 else e) / s
    return q - q * (err / s)


def _g_softplus_f64(x):
    """softplus: ``max(x, 0) + log1p(exp(-|x|))`` (the stable form of
    docs/language.md)."""
    return (x if x > 0.0 else 0.0) + _g_log1p_f64(_g_exp_f64(-abs(x)))


def _g_sinh_f64(x):
    """sinh, musl ``sinh``: with t = expm1(|x|), ``(2t - t^2/(t + 1))/2`` below 1 and
    ``(t + t/(t + 1))/2`` above; ``exp(|x|)/2`` (scaled, no overflow) from 709;
    |x| < 2**-26 returns x."""
    ax = abs(x)
    t = _g_expm1_f64(ax if ax < 709.0 else 709.0)
    r = 0.5 * (2.0 * t - t * t / (t + 1.0)) if ax < 1.0 else 0.5 * (t + t / (t + 1.0))
    r = _g_exp_scaled_f64(ax, -1) if ax >= 709.0 else r
    r = r if x >= 0.0 else -r
    return x if (x != x) | (ax < 1.4901161193847656e-08) else r


def _g_cosh_f64(x):
    """cosh, musl ``cosh``: ``1 + t^2/(2(1 + t))`` with t = expm1(|x|) below ln2,
    ``(e + 1/e)/2`` with e = exp(|x|) below 709, ``exp(|x|)/2`` (scaled) above."""
    ax = abs(x)
    t = _g_expm1_f64(ax if ax < 1.0 else 1.0)
    small = 1.0 + t * t / (2.0 * (1.0 + t))
    e = _g_exp_f64(ax if ax < 709.0 else 709.0)
    r = small if ax < 0.6931471805599453 else 0.5 * (e + 1.0 / e)
    r = _g_exp_scaled_f64(ax, -1) if ax >= 709.0 else r
    return ax if ax != ax else r


def _g_erf_rational_f64(ax):
    """fdlibm's rational approximations near 0 and 1, evaluated once: for |x| < 0.84375
    ``R(x^2)`` with erf(x) = x + x R, for |x| in [0.84375, 1.25) ``R(|x| - 1)`` with
    erf = 0.845062911510467529297 + R (coefficients selected per lane)."""
    a = ax < 0.84375
    v = ax * ax if a else ax - 1.0
    n = 0.0 if a else -2.16637559486879084300e-03
    n = n * v + (0.0 if a else 3.54783043256182359371e-02)
    n = n * v + (-2.37630166566501626084e-05 if a else -1.10894694282396677476e-01)
    n = n * v + (-5.77027029648944159157e-03 if a else 3.18346619901161753674e-01)
    n = n * v + (-2.84817495755985104766e-02 if a else -3.72207876035701323847e-01)
    n = n * v + (-3.25042107247001499370e-01 if a else 4.14856118683748331666e-01)
    n = n * v + (1.28379167095512558561e-01 if a else -2.36211856075265944077e-03)
    d = 0.0 if a else 1.19844998467991074170e-02
    d = d * v + (-3.96022827877536812320e-06 if a else 1.36370839120290507362e-02)
    d = d * v + (1.32494738004321644526e-04 if a else 1.26171219808761642112e-01)
    d = d * v + (5.08130628187576562776e-03 if a else 7.18286544141962662868e-02)
    d = d * v + (6.50222499887672944485e-02 if a else 5.40397917702171048937e-01)
    d = d * v + (3.97917223959155352819e-01 if a else 1.06420880400844228286e-01)
    return n / (d * v + 1.0)


def _g_erfc_tail_f64(ax):
    """erfc(|x|) for |x| in [1.25, 28]: fdlibm's ``exp(-z^2 - 0.5625) exp((z - x)(z + x)
    + R/S) / x``, z the 21-bit head of x (so z^2 is exact) and R/S its rational in
    1/x^2 on [1.25, 1/0.35) or [1/0.35, 28] (coefficients selected per lane); the two
    exponentials as one, the small term added after the exact reduction of the large."""
    s = 1.0 / (ax * ax)
    a = ax < 2.857142857142857
    r = -9.81432934416914548592e+00 if a else 0.0
    r = r * s + (-8.12874355063065934246e+01 if a else -4.83519191608651397019e+02)
    r = r * s + (-1.84605092906711035994e+02 if a else -1.02509513161107724954e+03)
    r = r * s + (-1.62396669462573470355e+02 if a else -6.37566443368389627722e+02)
    r = r * s + (-6.23753324503260060396e+01 if a else -1.60636384855821916062e+02)
    r = r * s + (-1.05586262253232909814e+01 if a else -1.77579549177547519889e+01)
    r = r * s + (-6.93858572707181764372e-01 if a else -7.99283237680523006574e-01)
    r = r * s + (-9.86494403484714822705e-03 if a else -9.86494292470009928597e-03)
    q = -6.04244152148580987438e-02 if a else 0.0
    q = q * s + (6.57024977031928170135e+00 if a else -2.24409524465858183362e+01)
    q = q * s + (1.08635005541779435134e+02 if a else 4.74528541206955367215e+02)
    q = q * s + (4.29008140027567833386e+02 if a else 2.55305040643316442583e+03)
    q = q * s + (6.45387271733267880336e+02 if a else 3.19985821950859553908e+03)
    q = q * s + (4.34565877475229228821e+02 if a else 1.53672958608443695994e+03)
    q = q * s + (1.37657754143519042600e+02 if a else 3.25792512996573918826e+02)
    q = q * s + (1.96512716674392571292e+01 if a else 3.03380607434824582924e+01)
    q = q * s + 1.0
    z = _g_high_f64(ax)
    a = -z * z - 0.5625                    # exact
    b = (z - ax) * (z + ax) + r / q        # small
    k = np.rint((a + b) * 1.44269504088896338700e+00)
    y = _g_exp_kernel_f64((a - k * 6.93147180369123816490e-01) + b,
                          k * 1.90821492927058770002e-10)
    return _g_ldexp_f64(y, np.int64(k)) / ax


def _g_erf_f64(x):
    """erf: fdlibm ``erf`` (error < 1 ulp), branch-free: the rational near 0, near 1,
    or 1 - erfc(|x|) from :func:`_g_erfc_tail_f64`, by |x|; ±1 from 6."""
    ax = abs(x)
    y = _g_erf_rational_f64(ax)
    small = x + x * y
    near1 = 8.45062911510467529297e-01 + y
    tail = 1.0 - _g_erfc_tail_f64(ax if ax < 6.0 else 6.0)
    r = near1 if ax < 1.25 else (tail if ax < 6.0 else 1.0)
    r = r if x >= 0.0 else -r
    return small if (ax < 0.84375) | (x != x) else r


def _g_erfc_f64(x):
    """erfc: fdlibm ``erfc`` (error < 1 ulp), branch-free as :func:`_g_erf_f64`;
    2 - erfc(|x|) for x < 0, 0 and 2 beyond 28."""
    ax = abs(x)
    y = _g_erf_rational_f64(ax)
    small = 1.0 - (x + x * y) if x < 0.25 else 0.5 - (x * y + (x - 0.5))
    near1 = (1.0 - 8.45062911510467529297e-01) - y if x > 0.0 \
        else 1.0 + (8.45062911510467529297e-01 + y)
    t = _g_erfc_tail_f64(ax if ax < 28.0 else 28.0)
    tail = t if x > 0.0 else 2.0 - t
    r = small if ax < 0.84375 else (near1 if ax < 1.25 else tail)
    r = (0.0 if x > 0.0 else 2.0) if ax >= 28.0 else r
    return x if x != x else r


def _g_log2_dd_f64(ax):
    """log2(ax) as t1 + t2 (t1 with 21 bits, together ~2**-64 relative) for finite
    ax > 0: fdlibm ``pow``'s logarithm (ax = 2**n m, m near 1 or 1.5, s = (m - b)/(m + b)
    in extra precision, a degree-12 Remez polynomial in s^2), and for |ax - 1| <= 2**-20
    its series, selected where |y| > 2**31 (:func:`_g_pow_f64`)."""
    sub = ax < 2.2250738585072014e-308
    xs = ax * 9007199254740992.0 if sub else ax
    bits = _g_f64_int(xs)
    ix = bits >> 32
    j = ix & 0x000FFFFF
    k1 = j > 0x3988E
    k2 = j >= 0xBB67A
    n = (ix >> 20) - 0x3FF - (53 if sub else 0) + (1 if k2 else 0)
    ix = (j | 0x3FF00000) - (0x00100000 if k2 else 0)
    k = k1 & (not k2)                      # interval: m near 1 (k false) or 1.5
    m = _g_f64_bits((ix << 32) | (bits & 0xFFFFFFFF))
    bp = 1.5 if k else 1.0
    u = m - bp
    v = 1.0 / (m + bp)
    ss = u * v
    s_h = _g_high_f64(ss)
    t_h = _g_f64_bits((((ix >> 1) | 0x20000000) + 0x00080000 + (0x40000 if k else 0)) << 32)
    t_l = m - (t_h - bp)
    s_l = v * ((u - s_h * t_h) - s_h * t_l)
    s2 = ss * ss
    r = s2 * s2 * (5.99999999999994648725e-01 + s2 * (4.28571428578550184252e-01 + s2 * (
        3.33333329818377432918e-01 + s2 * (2.72728123808534006489e-01 + s2 * (
            2.30660745775561754067e-01 + s2 * 2.06975017800338417784e-01)))))
    r = r + s_l * (s_h + ss)
    s2 = s_h * s_h
    t_h = _g_high_f64(3.0 + s2 + r)
    t_l = r - ((t_h - 3.0) - s2)
    u = s_h * t_h
    v = s_l * t_h + t_l * ss
    p_h = _g_high_f64(u + v)
    p_l = v - (p_h - u)
    z_h = 9.61796700954437255859e-01 * p_h
    dp_h = 5.84962487220764160156e-01 if k else 0.0
    z_l = -7.02846165095275826516e-09 * p_h + p_l * 9.61796693925975554329e-01 \
        + (1.35003920212974897128e-08 if k else 0.0)
    t = np.float64(n)
    t1 = _g_high_f64(((z_h + z_l) + dp_h) + t)
    t2 = z_l - (((t1 - t) - dp_h) - z_h)
    # |ax - 1| <= 2**-20: log by its series (t with 20 trailing zero bits)
    d = ax - 1.0
    w = (d * d) * (0.5 - d * (0.3333333333333333333333 - d * 0.25))
    u = 1.44269502162933349609e+00 * d
    v = d * 1.92596299112661746887e-08 - w * 1.44269504088896338700e+00
    c1 = _g_high_f64(u + v)
    c2 = v - (c1 - u)
    return t1, t2, c1, c2


def _g_pow_f64(x, y):
    """pow: fdlibm ``pow`` (error < 1 ulp, branch-free): log2|x| in extra precision
    (:func:`_g_log2_dd_f64`), times y split in head and tail, then 2**z with the exp
    kernel and a two-step scaling; C99's special cases (NaN, ±0, ±inf, |x| = 1,
    negative x with integer or other y) by select."""
    ax = abs(x)
    t1, t2, c1, c2 = _g_log2_dd_f64(ax)
    near1 = (abs(y) > 2147483648.0) & (abs(ax - 1.0) <= 9.5367431640625e-07)
    t1 = c1 if near1 else t1
    t2 = c2 if near1 else t2
    y1 = _g_high_f64(y)
    p_l = (y - y1) * t1 + y * t2
    p_h = y1 * t1
    zy = p_l + p_h                         # y log2|x|
    n = np.rint(1100.0 if zy > 1100.0 else (-1100.0 if zy < -1100.0 else zy))
    p_h = p_h - n
    t = _g_high_f64(p_l + p_h)
    u = t * 6.93147182464599609375e-01
    v = (p_l - (t - p_h)) * 6.93147180559945286227e-01 + t * -1.90465429995776804525e-09
    z = u + v
    w = v - (z - u)
    t = z * z
    c = z - t * (1.66666666666666019037e-01 + t * (-2.77777777770155933842e-03 + t * (
        6.61375632143793436117e-05 + t * (-1.65339022054652515390e-06
                                          + t * 4.13813679705723846039e-08))))
    e = 1.0 - (((z * c) / (c - 2.0) - (w + z * w)) - z)
    r = _g_ldexp_f64(e, np.int64(n))       # (0 or inf beyond |y log2|x|| = 1100)
    r = (np.inf if (ax > 1.0) == (y > 0.0) else 0.0) \
        if (abs(y) > 1.8446744073709552e19) & (ax != 1.0) else r
    yint = np.rint(y) == y
    odd = yint & (np.rint(y * 0.5) != y * 0.5)
    # x = ±0 or ±inf: 0 or inf by the signs of y and log|x|; then the sign of x**odd
    r = (np.inf if (y < 0.0) == (ax == 0.0) else 0.0) if (ax == 0.0) | (ax == np.inf) else r
    r = -r if odd & (_g_f64_int(x) < 0) else r
    r = np.nan if (x < 0.0) & (ax != np.inf) & (not yint) else r
    r = (1.0 if ax == 1.0 else ((np.inf if (y > 0.0) == (ax > 1.0) else 0.0))) \
        if abs(y) == np.inf else r
    r = x + y if (x != x) | (y != y) else r
    return 1.0 if (y == 0.0) | (x == 1.0) else r
