"""The polynomial fits of the float32 erf and erfc (gradc/codegen/mathlib_f32.py).

    python benchmarks/fit_minimax.py          # prints every coefficient set (~3 s; scipy)

Weighted minimax fits by Lawson's algorithm (iteratively reweighted least squares on
Chebyshev-distributed points, with a float64 reference: ``math.erf``/``math.erfc`` and
scipy's ``erfcx``).  For float32 coefficients, each one is rounded in turn and the
higher ones refitted around it.  The maximum errors printed are those of the fit at
the points (exact arguments, float64 evaluation); ``benchmarks/mathlib_errors.py
--exhaustive --only erf erfc`` measures the library functions over every float32.
"""
from __future__ import annotations

import math

import numpy as np


def lawson(V, f, w, iters=300):
    """Coefficients c minimising max_i w_i |(V c - f)_i|, and that maximum."""
    lam, best = np.full(len(f), 1.0 / len(f)), None
    for _ in range(iters):
        sw = np.sqrt(lam) * w
        c = np.linalg.lstsq(V * sw[:, None], f * sw, rcond=None)[0]
        e = np.abs(V @ c - f) * w
        if best is None or e.max() < best[1]:
            best = (c, e.max())
        lam = lam * e / (lam * e).sum()
    return best


def fit(u, f, w, deg, float32=True):
    """A degree-``deg`` polynomial in ``u``: (coefficients, max weighted error)."""
    V = np.stack([u ** k for k in range(deg + 1)], axis=1)
    if not float32:
        return lawson(V, f, w)
    fixed: list[float] = []
    while len(fixed) <= deg:
        k = len(fixed)
        c, _ = lawson(V[:, k:], f - V[:, :k] @ np.array(fixed, dtype=float).reshape(k), w)
        fixed.append(float(np.float32(c[0])))
    c = np.array(fixed)
    return c, float((np.abs(V @ c - f) * w).max())


def chebyshev_points(lo, hi, n=8000):
    return lo + (hi - lo) * (0.5 - 0.5 * np.cos(np.linspace(0, np.pi, n)))


def show(name, c, err, what):
    print(f"{name}: max {what} {err:.3g}")
    print("   ", ", ".join(repr(float(v)) for v in c))


def main() -> None:
    split = 0.921875
    # erf(x) = x + x P(x^2) below the split: P fitted to erf(x)/x - 1, relative to erf(x)/x
    x = chebyshev_points(0.0, split, 6000)
    x[0] = 1e-6
    q = np.array([math.erf(v) / v for v in x])
    c, e = fit(x * x, q - 1, 1 / q, 5)
    show("erf P (float32, degree 5)", c, e, "relative error")
    c, e = fit(x * x, q - 1, 1 / q, 6, float32=False)
    show("erfc P (float64, degree 6)", c, e, "relative error")
    # erf(t) = 1 - exp(R(t - 1)) above: R fitted to log(erfc(t)), weighted by erfc/erf
    t = chebyshev_points(split, 4.0)
    ec = np.array([math.erfc(v) for v in t])
    u = (t.astype(np.float32) - np.float32(1.0)).astype(np.float64)   # exact in float32
    c, e = fit(u, np.log(ec), ec / (1 - ec), 6)
    show("erf R (float32, degree 6)", c, e, "relative error of erf")
    # erfc(t) = exp(-t^2) G(1/t - 1/2) above: G fitted to erfcx(1/v), relative
    from scipy.special import erfcx
    v = chebyshev_points(1 / 10.0546875, 1 / split)
    g = erfcx(1 / v)
    c, e = fit(v - 0.5, g, 1 / g, 10, float32=False)
    show("erfc G (float64, degree 10)", c, e, "relative error")


if __name__ == "__main__":
    main()
