"""``gradc bench``: fused vs unfused vs NumPy, time and GB/s per op.

Each op whose parameters all accept a flat vector (generic, or annotated
with a single dim) is run at ``n`` elements in the float dtype of its
annotation (float32 when generic): the fused ``fwd_bwd`` and the unfused one
(one kernel per primitive, every intermediate stored), both writing into
preallocated ``out=`` buffers, and NumPy evaluating the same graph op by op
(the IR interpreter, which allocates every result).  The
variants are interleaved within each repeat, so machine noise hits all
alike; medians are reported, with GB/s counting each input read once and
each result written once.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from gradc.frontend.check import load_program
from gradc.ir.interpret import interpret
from gradc.pipeline import build_op


def _flat_inputs(cop, n: int, rng) -> list | None:
    xs = []
    for p in cop.params:
        if p.has_default:
            continue
        if p.shape is not None and len(p.shape) != 1:
            return None
        dt = {"f64": np.float64, "i32": np.int32, "i64": np.int64}.get(p.dtype, np.float32)
        xs.append(rng.standard_normal(n).astype(dt))
    return xs


def _median_ms(samples: list[float]) -> float:
    return float(np.median(samples)) * 1e3


def bench_op(module, cop, n: int, repeat: int, rng) -> dict | None:
    xs = _flat_inputs(cop, n, rng)
    if xs is None:
        return None
    op = getattr(module, cop.op.name)
    ys = op(*xs)
    ys = ys if isinstance(ys, tuple) else (ys,)
    ups = [np.ones_like(y) for y in ys]
    res = op.fwd_bwd(*xs, *ups)
    outs = tuple(np.empty_like(r) for r in res)
    graph = cop.methods["fwd_bwd"].graph
    defaults = [np.asarray(p.default) for p in cop.params if p.has_default]
    variants = {
        "fused": lambda: op.fwd_bwd(*xs, *ups, out=outs),
        "unfused": lambda: op.unfused.fwd_bwd(*xs, *ups, out=outs),
        "numpy": lambda: interpret(graph, xs + defaults + ups, dtype=xs[0].dtype),
    }
    for fn in variants.values():        # warm-up (and JIT compilation)
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeat):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    med = {k: _median_ms(v) for k, v in times.items()}
    nbytes = sum(x.nbytes for x in xs) + sum(u.nbytes for u in ups) + sum(o.nbytes for o in outs)
    return {"op": cop.op.name, **med, "gbs": nbytes / (med["fused"] * 1e-3) / 1e9}


def bench_file(path: str | Path, n: int = 10**7, repeat: int = 11, precise: bool = False) -> str:
    """The benchmark table of every flat-vector op of ``path``, as text (``precise``:
    the module compiled with libm for every function)."""
    import gradc
    program = load_program(path)
    module = gradc.load(path, **({"precise": True} if precise else {}))
    rng = np.random.default_rng(0)
    rows, skipped = [], []
    for name in program.main_ops:
        cop = build_op(program.ops[name], program.ops, program.consts)
        r = bench_op(module, cop, n, repeat, rng)
        (rows.append(r) if r else skipped.append(name))
    head = (f"{'op':<18} {'fused ms':>9} {'unfused ms':>11} {'numpy ms':>9} "
            f"{'unfused/fused':>14} {'numpy/fused':>12} {'fused GB/s':>11}")
    lines = [f"fwd_bwd at n = {n:,} elements, median of {repeat} interleaved runs; fused and "
             "unfused write into preallocated out= buffers, numpy (op by op) allocates", head]
    for r in rows:
        lines.append(f"{r['op']:<18} {r['fused']:>9.2f} {r['unfused']:>11.2f} {r['numpy']:>9.2f} "
                     f"{r['unfused'] / r['fused']:>13.2f}x {r['numpy'] / r['fused']:>11.2f}x "
                     f"{r['gbs']:>11.1f}")
    lines.append(copy_bandwidth_line(n, repeat))
    if skipped:
        lines.append(f"skipped (parameters of rank > 1): {', '.join(skipped)}")
    return "\n".join(lines)


def copy_bandwidth_line(n: int, repeat: int) -> str:
    """The memory-bandwidth yardstick: np.copyto of n float32, read + write."""
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t0)
    ms = _median_ms(ts)
    return f"memory bandwidth yardstick: np.copyto of {n:,} float32 = {ms:.2f} ms, " \
           f"{2 * a.nbytes / (ms * 1e-3) / 1e9:.1f} GB/s (read + write)"
