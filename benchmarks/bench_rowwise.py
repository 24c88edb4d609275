#!/usr/bin/env python
"""Row-wise ops: gradc's fused fwd_bwd against a copy, jax.jit, PyTorch eager and torch.compile.

Every op of ``examples/rowwise.grad`` (softmax, log-softmax, layer norm, RMS norm and
cross-entropy over the last axis), float32, at (4096, 1024), (65536, 64) and
(16, 262144), ``fwd_bwd`` with random upstreams, as:

* ``fused+out``      gradc's fused ``fwd_bwd`` writing preallocated ``out=`` buffers;
* ``fused``          the same, allocating its results;
* ``unfused``        ``.unfused.fwd_bwd``: one kernel per primitive (``out=``);
* ``jax.jit``        the op written with ``jax.nn``/``jax.numpy`` as a JAX user would,
  ``jax.vjp``, jitted;
* ``torch``          PyTorch eager's native kernels with autograd: ``torch.softmax``,
  ``torch.log_softmax``, ``F.layer_norm``, ``F.rms_norm`` (the formula where this
  torch has none, labelled), ``F.cross_entropy`` with soft targets;
* ``torch.compile``  the same forward under ``torch.compile`` (``dynamic=False``),
  autograd's backward compiled with it.

Before timing, every variant's outputs and gradients are compared with a float64
NumPy reference at a small shape and again at each timed shape; a variant that
disagrees (or fails) is not timed and is listed with the reason. Each case times
a Numba 2-read/2-write copy over the op's own arrays (its inputs ``x`` and ``dy``
into its ``out=`` buffers ``y`` and ``dx``: ``gradc.tools.bench.copy_kernel``)
and a *2-pass floor*, RMS norm without a weight written by hand as two passes per row
over the same arrays (``gradc.tools.bench.two_pass_kernel``: the copy's reads and
writes, each input read twice, the second time from the cache where a row fits in it;
its share of the copy is what two passes per row allow at that shape on that machine),
in the same interleaved repeats (``gradc.tools.bench.time_interleaved``: order rotating;
before each timed call a short sleep, a wait until no other thread of the process
runs, so that no library's workers spin while another is timed, and an untimed
call). Each case's arrays are allocated ``--allocations`` times (default 3), one
after the other, each allocation timed so: on this 2-core virtual machine a fresh
allocation of the same arrays ran the same kernel 1.8-2.0 ms or 3.6-4.0 ms, where the
copy over them moved 1.3x (memory just handed out, before the kernel's background
work settles it; session 46), so one allocation can hold a case's times for a whole
run. Medians over the samples of every allocation are printed, with each variant's
share of the copy (copy's time over its time) and the fastest peer's time over its
time (> 1: faster than every peer); the json keeps each allocation's medians too;
then warnings where the load average shows other work or a variant was
timed while another thread still ran (``gradc.tools.bench_report.interference``).

Run::

    python benchmarks/bench_rowwise.py
    python benchmarks/bench_rowwise.py --ops softmax_rows --shapes 4096x1024 --repeat 5
    python benchmarks/bench_rowwise.py --variants fused+out fused torch --json out.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rowwise_cases import SHAPES, make_inputs, reference, torch_math, torch_runner  # noqa: E402

from gradc.tools.bench import (SETTLE, available_variants, copy_kernel,  # noqa: E402
                               max_rel_err, time_interleaved, two_pass_kernel)

SPEC = ROOT / "examples" / "rowwise.grad"
CHECK_SHAPE = (6, 37)
GRADC = ("fused+out", "fused", "unfused")
PEERS = ("jax.jit", "torch", "torch.compile")
FLOOR = "2-pass floor"    # gradc.tools.bench.two_pass_kernel, timed beside the copy
VARIANTS = (*GRADC, *PEERS)
TOL_CHECK = 1e-4    # max |a - b| / max(|b|, 1) against float64, at CHECK_SHAPE
TOL_TIMED = 1e-3    # the same at the timed shapes (sums over up to 262144 float32)


# -- the variants ------------------------------------------------------------------------


def _jax_math(op: str) -> tuple[Callable, int]:
    """The op in jax.numpy, and how many leading parameters are differentiated."""
    import jax
    import jax.numpy as jnp
    if op == "softmax_rows":
        return (lambda x: jax.nn.softmax(x, axis=-1)), 1
    if op == "log_softmax_rows":
        return (lambda x: jax.nn.log_softmax(x, axis=-1)), 1
    if op == "layer_norm":
        def layer_norm(x, w, b):
            mu = jnp.mean(x, -1, keepdims=True)
            var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
            return (x - mu) * jax.lax.rsqrt(var + 1e-5) * w + b
        return layer_norm, 3
    if op == "rms_norm":
        return (lambda x, w: x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w), 2
    if op == "xent_rows":
        return (lambda x, t: jnp.mean(jax.nn.logsumexp(x, -1) - jnp.sum(x * t, -1))), 1
    raise ValueError(op)


def jax_runner(op: str, params: list, ups: list) -> Callable[[], list]:
    """``jax.jit`` of the forward and its ``jax.vjp`` on these inputs."""
    import jax
    import jax.numpy as jnp
    f, n_diff = _jax_math(op)

    @jax.jit
    def fwd_bwd(params, ups):
        diff, fixed = params[:n_diff], params[n_diff:]
        y, pull = jax.vjp(lambda *d: f(*d, *fixed), *diff)
        return (y, *pull(ups[0]))

    ja, ju = [jnp.asarray(a) for a in params], [jnp.asarray(u) for u in ups]
    return lambda: jax.block_until_ready(fwd_bwd(ja, ju))


def gradc_runner(fn, variant: str, params: list, ups: list,
                 outs: tuple | None = None) -> Callable[[], object]:
    """gradc's ``fwd_bwd``: fused into ``out=`` buffers (``outs``, else its own), fused
    with fresh outputs, or unfused into ``out=`` buffers."""
    if variant == "fused":
        return lambda: fn.fwd_bwd(*params, *ups)
    if outs is None:
        outs = tuple(np.empty_like(np.asarray(r)) for r in fn.fwd_bwd(*params, *ups))
    call = fn.fwd_bwd if variant == "fused+out" else fn.unfused.fwd_bwd
    return lambda: call(*params, *ups, out=outs)


def build_variants(module, op: str, names: Sequence[str], params: list, ups: list,
                   outs: tuple | None = None
                   ) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """A zero-argument ``fwd_bwd`` call per variant, and why any could not be built;
    ``outs``: the ``out=`` buffers of gradc's fused+out and unfused."""
    fn = getattr(module, op)
    runs, why = {}, {}
    for v in names:
        try:
            if v in GRADC:
                runs[v] = gradc_runner(fn, v, params, ups, outs)
            elif v not in available_variants():
                why[v] = f"{'jax' if v == 'jax.jit' else 'torch'} is not installed"
            elif v == "jax.jit":
                runs[v] = jax_runner(op, params, ups)
            else:
                runs[v] = torch_runner(op, params, ups, compile=v == "torch.compile")
        except Exception as exc:        # a framework that cannot express this op
            why[v] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return runs, why


def _numpy(r) -> np.ndarray:
    return r.detach().numpy() if hasattr(r, "detach") else np.asarray(r)


def check_variants(runs: dict[str, Callable[[], object]], want: Sequence[np.ndarray],
                   tol: float) -> tuple[dict[str, float], dict[str, str]]:
    """Call each variant once: the max relative error of each that agrees with
    ``want`` (outputs then gradients), and the reason for each that does not (it
    raised, or returned other shapes, or differs by more than ``tol``)."""
    errs, wrong = {}, {}
    for v, run in runs.items():
        try:
            got = [_numpy(r) for r in run()]
        except Exception as exc:
            wrong[v] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            continue
        if len(got) != len(want):
            wrong[v] = f"{len(got)} results, expected {len(want)}"
            continue
        e = [max_rel_err(g, w) for g, w in zip(got, want)]
        if not np.all(np.array(e) <= tol):     # NaN disagrees too
            k = int(np.nanargmax(np.where(np.isnan(e), np.inf, e)))
            wrong[v] = f"result {k} differs from float64 NumPy by {e[k]:.2g} (tolerance {tol:g})"
        else:
            errs[v] = max(e)
    return errs, wrong


# -- one case ----------------------------------------------------------------------------


def copy_arrays(inputs: Sequence, outs: Sequence, shape: tuple[int, int]) -> list:
    """The copy's and the floor's arrays, flat: the op's first two inputs and first two
    outputs of the case's shape (x and dy, y and dx; cross-entropy's one output of that
    shape and an array of its own), so that they move through the very memory the op's
    kernels do: on a virtual machine the same work ran 0.80-1.31 ms over one set of
    4 x 16 MB and another, allocated one after the other (session 31)."""
    n = int(np.prod(shape))
    like = lambda arrays: [np.asarray(a).reshape(-1) for a in arrays
                           if np.shape(a) == tuple(shape) and np.asarray(a).dtype == np.float32]
    reads, writes = like(inputs)[:2], like(outs)[:2]
    own = lambda k: [np.ones(n, np.float32) for _ in range(k)]
    return reads + own(2 - len(reads)) + writes + own(2 - len(writes))


def bench_case(module, op: str, shape: tuple[int, int], names: Sequence[str], repeat: int,
               settle: float, warmup: int = 2, allocations: int = 1) -> dict:
    """Medians of every variant that agrees with the float64 reference, and the copy's,
    over ``allocations`` allocations of the case's arrays in turn, ``repeat`` interleaved
    repeats each (the samples of all taken together; each allocation's medians kept)."""
    if "torch.compile" in names:
        import torch._dynamo
        torch._dynamo.reset()           # one op and shape's guards at a time
    samples: dict[str, list[float]] = {}
    per: dict[str, list[float]] = {}
    busy: list[str] = []
    worst: dict[str, float] = {}
    not_timed: dict[str, str] = {}
    for _ in range(allocations):
        params, ups = make_inputs(op, shape)
        outs = tuple(np.empty_like(np.asarray(r))
                     for r in getattr(module, op).fwd_bwd(*params, *ups))
        runs, why = build_variants(module, op, names, params, ups, outs)
        errs, wrong = check_variants(runs, reference(op, params, ups), TOL_TIMED)
        not_timed.update({**why, **wrong})
        for v, e in errs.items():
            worst[v] = max(worst.get(v, 0.0), e)
        timed = {v: runs[v] for v in names if v in errs and v not in not_timed}
        arrays = copy_arrays(params + ups, outs, shape)
        kernel, floor = copy_kernel(), two_pass_kernel()
        timed["copy"] = lambda: kernel(*arrays)
        timed[FLOOR] = lambda: floor(*arrays, shape[-1])
        for _ in range(warmup):
            for run in timed.values():
                run()
        quiet: dict = {}
        got = time_interleaved(timed, repeat, settle, quiet=quiet)
        busy += quiet["busy"]
        for v, s in got.items():
            samples.setdefault(v, []).extend(s)
            per.setdefault(v, []).append(float(np.median(s)))
        del runs, timed, params, ups, outs, arrays
    errs = {v: e for v, e in worst.items() if v not in not_timed}   # right in every one
    med = {v: float(np.median(s)) for v, s in samples.items()}
    peers = [v for v in PEERS if v in errs]
    fastest = min(peers, key=med.get) if peers else None
    return {"op": op, "shape": list(shape), "copy_s": med["copy"], "floor_s": med[FLOOR],
            "copy_per_allocation_s": per["copy"], "floor_per_allocation_s": per[FLOOR],
            "fastest_peer": fastest,
            "variants": {v: {"median_s": med[v], "samples_s": samples[v],
                             "per_allocation_s": per[v],
                             "pct_copy": 100 * med["copy"] / med[v],
                             "vs_fastest_peer": med[fastest] / med[v] if fastest else None,
                             "max_rel_err": errs[v]} for v in errs},
            "not_timed": not_timed,
            "busy": {v: busy.count(v) for v in dict.fromkeys(busy)}}


# -- report ------------------------------------------------------------------------------


def _shape(s: Sequence[int]) -> str:
    return "x".join(map(str, s))


def tables(results: list[dict], names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Two tables, one row per op and shape: median ms (% of copy), and the fastest
    peer's time over each variant's."""
    head = ["op", "shape", "copy ms", FLOOR, *names]
    ms = [[r["op"], _shape(r["shape"]), f"{r['copy_s'] * 1e3:.2f}",
           f"{r['floor_s'] * 1e3:.2f} ({100 * r['copy_s'] / r['floor_s']:.0f}%)",
           *(f"{r['variants'][v]['median_s'] * 1e3:.2f} ({r['variants'][v]['pct_copy']:.0f}%)"
             if v in r["variants"] else "-" for v in names)] for r in results]
    ratio = [[r["op"], _shape(r["shape"]), r["fastest_peer"] or "-",
              *(f"{r['variants'][v]['vs_fastest_peer']:.2f}x"
                if v in r["variants"] and r["fastest_peer"] else "-" for v in names)]
             for r in results]
    return _table(head, ms), _table(["op", "shape", "fastest peer", *names], ratio)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
    line = lambda r: "  ".join(s.ljust(w) if c < 2 else s.rjust(w)
                               for c, (s, w) in enumerate(zip(r, widths))).rstrip()
    return [line(head), "-" * len(line(head)), *map(line, rows)]


def _notes(results: list[dict], labels: Sequence[str]) -> list[str]:
    notes = [f"not timed: {v} for {r['op']} {_shape(r['shape'])}: {why}"
             for r in results for v, why in r["not_timed"].items()]
    return notes + [f"note: torch and torch.compile: {label}" for label in labels if label]


def _loadavg() -> list[float]:
    """The 1, 5 and 15-minute load averages, to 2 decimals (as printed)."""
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", type=Path, default=SPEC, help="the .grad file (default: %(default)s)")
    p.add_argument("--ops", nargs="+", help="only these ops (default: every op of the file)")
    p.add_argument("--shapes", nargs="+", metavar="RxC", help="shapes (default: "
                   + " ".join(map(_shape, SHAPES)) + ")")
    p.add_argument("--repeat", type=int, default=11,
                   help="timed repeats per allocation (default 11)")
    p.add_argument("--allocations", type=int, default=3, metavar="K",
                   help="allocations of each case's arrays, timed in turn, their samples "
                   "taken together (default 3)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   metavar="V", help=f"of {', '.join(VARIANTS)} (default: all)")
    p.add_argument("--settle", type=float, default=SETTLE,
                   help=f"seconds slept before each timed call (default {SETTLE})")
    p.add_argument("--note", default="", help="a line printed in the header and stored")
    p.add_argument("--json", help="write every sample, the errors and the machine here")
    args = p.parse_args(argv)
    try:
        shapes = [tuple(int(d) for d in s.lower().split("x")) for s in args.shapes or
                  map(_shape, SHAPES)]
    except ValueError:
        p.error(f"--shapes: write each shape as ROWSxCOLS, e.g. 4096x1024 (got {args.shapes})")
    if args.repeat < 1 or args.allocations < 1:
        p.error("--repeat and --allocations: 1 or more")
    if any(len(s) != 2 or min(s) < 1 for s in shapes):
        p.error(f"--shapes: two positive sizes each, ROWSxCOLS (got {args.shapes})")

    import numba

    import gradc
    from gradc.frontend.check import load_program
    from gradc.tools.bench_report import interference, machine_info, write_json
    in_file = load_program(args.spec).main_ops
    ops = args.ops or list(in_file)
    unknown = [o for o in ops if o not in in_file]
    if unknown:
        p.error(f"--ops: {', '.join(unknown)} not in {args.spec} ({', '.join(in_file)})")
    module = gradc.load(args.spec)
    names = [v for v in VARIANTS if v in args.variants]
    threads = numba.get_num_threads()
    labels = []
    if any(v.startswith("torch") for v in names) and "torch" in available_variants():
        import torch
        torch.set_num_threads(threads)
        labels = sorted({torch_math(op)[2] for op in ops} - {""})
    load_before = _loadavg()
    print(f"row-wise fwd_bwd, float32, {args.spec.name}: median of {args.repeat} interleaved "
          f"repeats over each of {args.allocations} allocations of the arrays; "
          f"{os.cpu_count()} cores, Numba and torch on {threads} threads; "
          f"load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    if args.note:
        print(args.note)

    check = {}
    for op in ops:        # every variant against float64 NumPy at a small shape
        params, ups = make_inputs(op, CHECK_SHAPE, seed=1)
        runs, _ = build_variants(module, op, names, params, ups)
        errs, wrong = check_variants(runs, reference(op, params, ups), TOL_CHECK)
        check[op] = {"max_rel_err": errs, "wrong": wrong}
        for v, why in wrong.items():
            print(f"check at {_shape(CHECK_SHAPE)}: {v} for {op} disagrees: {why}; not timed")
    results = []
    t0 = time.perf_counter()
    for op in ops:
        wrong = check[op]["wrong"]
        for shape in shapes:
            r = bench_case(module, op, shape, [v for v in names if v not in wrong],
                           args.repeat, args.settle, allocations=args.allocations)
            r["not_timed"].update((v, f"disagreed at the check shape: {why}")
                                  for v, why in wrong.items())
            results.append(r)
            print(f"  {op} {_shape(shape)} done ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    load_after = _loadavg()
    ms, ratio = tables(results, names)
    print("\nmedian ms (% of copy: the copy's time over the variant's)", *ms, sep="\n")
    if any(r["fastest_peer"] for r in results):
        print("\nfastest peer's time over each variant's (> 1: faster than every peer of "
              f"{', '.join(v for v in PEERS if v in names)})", *ratio, sep="\n")
    print(f"\ncopy: a Numba 2-read/2-write loop over the op's own arrays (x, dy into the "
          f"out= buffers y, dx); {FLOOR}: RMS norm without a weight by hand in Numba, two "
          "passes per row over the same arrays (what two passes allow here at each "
          "shape); results agree with "
          f"float64 NumPy to {TOL_CHECK:g} at {_shape(CHECK_SHAPE)}, {TOL_TIMED:g} at the "
          f"timed shapes; load average after {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f}")
    report = {"spec": str(args.spec), "shapes": [list(s) for s in shapes],
              "repeat": args.repeat, "allocations": args.allocations,
              "settle_s": args.settle, "variants": names,
              "note": args.note, "check_shape": list(CHECK_SHAPE), "check": check,
              "tolerance": {"check": TOL_CHECK, "timed": TOL_TIMED},
              "machine": {**machine_info(names), "loadavg_before": load_before,
                          "loadavg_after": load_after},
              "torch_labels": labels, "results": results}
    for line in [*_notes(results, labels), *interference(report)]:
        print(line)
    if args.json:
        write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
