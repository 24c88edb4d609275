#!/usr/bin/env python
"""What fusion buys: gradc's fused fwd_bwd kernels vs unfused vs hand-written NumPy.

For each elementwise op of ``examples/seed.grad`` and
``examples/activations.grad`` this times, on ``n`` float32 elements
(default 10^7, about 40 MB per array):

* ``fused+out``  ``op.fwd_bwd(x, dy, out=(y, dx))`` into preallocated buffers;
* ``fused``      ``op.fwd_bwd(x, dy)``, allocating ``y`` and ``dx``;
* ``unfused``    ``op.unfused.fwd_bwd(x, dy)``, one kernel per primitive;
* ``numpy``      a hand-written NumPy forward + backward of the same op.

The unfused/fused and NumPy/fused ratios compare like with like (every one of
those calls allocates its results); NumPy is also compared with the
preallocated fused call, the fastest way to use the generated module.

Each repeat runs every variant once, in an order that rotates from repeat to
repeat, so machine noise hits all variants alike; the table reports medians
(after warm-ups, which also trigger Numba's compile or cache load). It also
prints the fused kernel's effective bandwidth, counting two reads (``x``,
``dy``) and two writes (``y``, ``dx``) of 4 bytes per element, next to two
measured references: ``np.copyto`` (one read + one write per element) and a
plain Numba kernel with the same 2-in/2-out memory traffic and trivial
arithmetic, the practical limit for a memory-bound fused kernel here. That
kernel is also timed inside every op's repeats, and ``%lim`` is its time over
the fused kernel's.

Only the public API of the generated modules is used. This is not a test:
nothing is asserted about time. Each NumPy reference is checked against the
fused result first (max relative error printed) so the comparison is fair.

Run::

    python benchmarks/bench_fusion.py                  # n = 10^7, 15 repeats
    python benchmarks/bench_fusion.py --n 1000000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEED_GRAD = ROOT / "examples" / "seed.grad"
ACTIVATIONS_GRAD = ROOT / "examples" / "activations.grad"

OPS: tuple[tuple[str, str], ...] = (
    ("seed", "scaled_tanh"),
    ("seed", "clipped_relu"),
    ("seed", "sign_ste"),
    ("seed", "custom_linear"),
    ("activations", "softplus_stable"),
    ("activations", "gelu_tanh"),
    ("activations", "swish"),
    ("activations", "huber"),
    ("activations", "log_sigmoid"),
    ("activations", "leaky_relu"),
)
"""(module, op) pairs benchmarked, in table order."""

VARIANTS = ("fused+out", "fused", "unfused", "numpy")

F32 = np.float32
FwdBwd = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


# --------------------------------------------------------------------------
# Hand-written NumPy forward + backward. Each takes x, dy: f32[n] and returns
# (y, dx): f32[n], written the way a careful NumPy user would (float32
# constants, no float64 promotion), with the same kink conventions as gradc.

_SQRT_2_OVER_PI = F32(0.7978845608028654)
_GELU_A = F32(0.044715)


def np_scaled_tanh(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.tanh(x)
    return y, dy * (F32(1) - y * y) * F32(0.5)


def np_clipped_relu(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.maximum(x, F32(0)), np.clip(dy * (x > 0), F32(-1), F32(1))


def np_sign_ste(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.sign(x), dy.copy()


def np_custom_linear(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return F32(2) * x, np.ones_like(dy)


def np_softplus_stable(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    e = np.exp(-np.abs(x))
    y = np.log1p(e) + np.maximum(x, F32(0))
    sig = np.where(x >= 0, F32(1), e) / (F32(1) + e)  # sigmoid(x), stably
    return y, dy * sig


def np_gelu_tanh(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x2 = x * x
    t = np.tanh(_SQRT_2_OVER_PI * (x + _GELU_A * x2 * x))
    y = F32(0.5) * x * (F32(1) + t)
    dt = (F32(1) - t * t) * _SQRT_2_OVER_PI * (F32(1) + F32(3) * _GELU_A * x2)
    return y, dy * (F32(0.5) * (F32(1) + t) + F32(0.5) * x * dt)


def np_swish(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = F32(1) / (F32(1) + np.exp(-x))
    return x * s, dy * (s + x * s * (F32(1) - s))


def np_huber(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.abs(x)
    small = a <= 1
    y = np.where(small, F32(0.5) * x * x, a - F32(0.5))
    return y, dy * np.where(small, x, np.sign(x))


def np_log_sigmoid(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    e = np.exp(-np.abs(x))
    y = -(np.log1p(e) + np.maximum(-x, F32(0)))
    sig_neg = np.where(x >= 0, e, F32(1)) / (F32(1) + e)  # sigmoid(-x), stably
    return y, dy * sig_neg


def np_leaky_relu(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pos = x > 0
    return np.where(pos, x, F32(0.01) * x), dy * np.where(pos, F32(1), F32(0.01))


NUMPY_REFS: dict[str, FwdBwd] = {
    "scaled_tanh": np_scaled_tanh,
    "clipped_relu": np_clipped_relu,
    "sign_ste": np_sign_ste,
    "custom_linear": np_custom_linear,
    "softplus_stable": np_softplus_stable,
    "gelu_tanh": np_gelu_tanh,
    "swish": np_swish,
    "huber": np_huber,
    "log_sigmoid": np_log_sigmoid,
    "leaky_relu": np_leaky_relu,
}


# --------------------------------------------------------------------------
# Bandwidth references


@numba.njit(parallel=True, cache=True)
def _two_in_two_out(x: np.ndarray, dy: np.ndarray, y: np.ndarray, dx: np.ndarray) -> None:
    """y = x + dy, dx = x - dy over f32[n]: the fused kernels' memory traffic, no math."""
    for i in numba.prange(x.size):
        a = x[i]
        b = dy[i]
        y[i] = a + b
        dx[i] = a - b


# --------------------------------------------------------------------------
# Timing


def _time_once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_interleaved(
    variants: dict[str, Callable[[], object]], repeat: int, warmup: int
) -> dict[str, float]:
    """Median seconds of each callable; each repeat runs all, order rotating."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(_time_once(variants[name]))
    return {name: statistics.median(ts) for name, ts in samples.items()}


def max_rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(|b|, 1): a scale-aware worst-case difference."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.max(np.abs(a64 - b64) / np.maximum(np.abs(b64), 1.0)))


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


# --------------------------------------------------------------------------
# Main


def load_modules() -> dict[str, ModuleType]:
    """Compile (or load from gradc's cache) the two example files."""
    import gradc

    return {"seed": gradc.load(SEED_GRAD), "activations": gradc.load(ACTIVATIONS_GRAD)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="fused vs unfused vs NumPy fwd_bwd timings")
    p.add_argument("--n", type=float, default=1e7, help="float32 elements per array (default 1e7)")
    p.add_argument("--repeat", type=int, default=15, help="timed repeats per variant (default 15)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per variant first (default 2)")
    p.add_argument("--ops", nargs="*", default=None, help="only these ops (default: all ten)")
    args = p.parse_args(argv)
    n = int(args.n)
    if n <= 0 or args.repeat <= 0 or args.warmup < 0:
        p.error("--n and --repeat must be positive, --warmup non-negative")

    t0 = time.perf_counter()
    mods = load_modules()
    load_s = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n, dtype=F32) * F32(3)).astype(F32)
    dy = rng.standard_normal(n, dtype=F32)
    y = np.empty_like(x)
    dx = np.empty_like(x)
    traffic = 4.0 * 4 * n  # x, dy read; y, dx written
    _two_in_two_out(x, dy, y, dx)  # compile / load from cache; picks the threading layer

    print(f"gradc fusion benchmark: n = {n:,} float32 elements ({4 * n / 1e6:.0f} MB per array), "
          f"median of {args.repeat} after {args.warmup} warm-ups")
    print(f"numpy {np.__version__}, numba {numba.__version__} "
          f"({numba.get_num_threads()} threads, layer {_threading_layer()}), "
          f"{os.cpu_count()} CPUs; modules loaded in {load_s:.1f}s")

    # Bandwidth references.
    dst = np.empty_like(x)
    ref_t = time_interleaved(
        {"copyto": lambda: np.copyto(dst, x), "2in2out": lambda: _two_in_two_out(x, dy, y, dx)},
        args.repeat, args.warmup,
    )
    copy_gbps = gbps(2 * 4.0 * n, ref_t["copyto"])
    limit_gbps = gbps(traffic, ref_t["2in2out"])
    print(f"memory reference: np.copyto {ref_t['copyto'] * 1e3:.2f} ms = {copy_gbps:.1f} GB/s "
          f"(read+write); numba 2-in/2-out x+dy, x-dy {ref_t['2in2out'] * 1e3:.2f} ms = "
          f"{limit_gbps:.1f} GB/s")
    print()

    header = (f"{'op':<16}{'fused+out':>10}{'fused':>9}{'unfused':>9}{'numpy':>9}"
              f"{'unf/fus':>9}{'np/fus':>8}{'np/f+o':>8}{'GB/s':>7}{'%lim':>7}{'np err':>9}")
    print(header)
    print(f"{'':<16}{'ms':>10}{'ms':>9}{'ms':>9}{'ms':>9}")
    print("-" * len(header))

    selected = [(m, o) for m, o in OPS if args.ops is None or o in args.ops]
    for mod_name, op_name in selected:
        op = getattr(mods[mod_name], op_name)
        ref = NUMPY_REFS.get(op_name)
        variants: dict[str, Callable[[], object]] = {
            "fused+out": lambda op=op: op.fwd_bwd(x, dy, out=(y, dx)),
            "fused": lambda op=op: op.fwd_bwd(x, dy),
            "unfused": lambda op=op: op.unfused.fwd_bwd(x, dy),
        }
        if ref is not None:
            variants["numpy"] = lambda ref=ref: ref(x, dy)
        # Same traffic, trivial math, timed alongside so %lim sees the same noise.
        variants["limit"] = lambda: _two_in_two_out(x, dy, y, dx)

        # Correctness first (these calls also compile or load the kernels).
        fy, fdx = op.fwd_bwd(x, dy)
        uy, udx = op.unfused.fwd_bwd(x, dy)
        unf_err = max(max_rel_err(uy, fy), max_rel_err(udx, fdx))
        np_err = float("nan")
        if ref is not None:
            ry, rdx = ref(x, dy)
            np_err = max(max_rel_err(ry, fy), max_rel_err(rdx, fdx))
            del ry, rdx
        del fy, fdx, uy, udx

        t = time_interleaved(variants, args.repeat, args.warmup)
        fo, fa = t["fused+out"], t["fused"]
        np_t = t.get("numpy", float("nan"))
        bw = gbps(traffic, fo)
        print(f"{op_name:<16}{fo * 1e3:>10.2f}{fa * 1e3:>9.2f}{t['unfused'] * 1e3:>9.2f}"
              f"{np_t * 1e3:>9.2f}{t['unfused'] / fa:>8.2f}x{np_t / fa:>7.2f}x{np_t / fo:>7.2f}x"
              f"{bw:>7.1f}{100 * t['limit'] / fo:>6.0f}%{np_err:>9.1e}"
              + ("" if unf_err < 1e-5 else f"  (unfused differs from fused by {unf_err:.1e})"))

    print()
    print("fused+out (f+o): fwd_bwd(x, dy, out=(y, dx)) into preallocated buffers; fused: fwd_bwd(x, dy),")
    print("allocating y and dx; unfused: unfused.fwd_bwd(x, dy), one kernel per primitive; numpy:")
    print("hand-written NumPy forward + backward. unf/fus and np/fus compare like with like (all")
    print("allocate their results); np/f+o is NumPy against the preallocated fused call. GB/s: fused+out,")
    print("16 bytes per element (x, dy in; y, dx out); %lim: time of the numba 2-in/2-out kernel")
    print("(timed within the same repeats) / time of fused+out, i.e. the share of the practical limit.")
    print("np err: max |numpy - fused| / max(|fused|, 1) over y and dx.")
    return 0


def _threading_layer() -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        return "not yet chosen"


if __name__ == "__main__":
    sys.exit(main())
