#!/usr/bin/env python
"""Where the time of a CUDA row-wise call goes: the host (Python wrappers, Numba's
launches and allocations) or the kernels. For a session lent a GPU, after
``gpu_check.py`` (whose row-wise table times whole calls).

1. **Host cost per call**: each op of ``examples/rowwise.grad``, fused ``fwd_bwd``
   into ``out=`` buffers, at a tiny shape (``--tiny``, 2x64: the kernels take
   microseconds), wall time per call over ``--calls`` calls, next to PyTorch's
   native CUDA kernels with autograd; and Numba's own floor: an empty kernel
   launched with 12 array arguments, one ``cuda.device_array`` of 8 MB.
2. **cProfile** of ``--profile`` ops at the tiny shape: the wrapper's Python
   functions, by cumulative and own time.
3. **Kernels**: ``torch.profiler`` (CUPTI sees every kernel of the process,
   Numba's too) around 5 calls of each op at ``--shapes``: each kernel's GPU time.

Run::

    python benchmarks/gpu_check.py --prepare .gpu             # here: the modules
    python benchmarks/gpu_profile.py --modules .gpu           # there
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
from rowwise_cases import make_inputs, torch_runner  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", type=Path, required=True,
                    help="a folder written by gpu_check.py --prepare (its rowwise_gen.py)")
    ap.add_argument("--tiny", type=gpu_check.shape_arg, default=(2, 64), metavar="RxC")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--profile", nargs="*", default=["softmax_rows", "layer_norm"])
    ap.add_argument("--shapes", type=gpu_check.shape_arg, nargs="*", metavar="RxC",
                    default=[(4096, 1024), (65536, 64), (16, 262144)])
    args = ap.parse_args(argv)
    if not hasattr(np, "row_stack"):        # numba-cuda 0.30 with NumPy 2.5 (gpu_check.py)
        np.row_stack = np.vstack
    from numba import cuda
    torch, why = gpu_check.torch_cuda()      # (None, the reason) without CUDA torch

    mod = gpu_check.import_path(args.modules / "rowwise_gen.py")

    def call(name, shape):
        op = mod.OPS[name]
        params, ups = make_inputs(name, shape)
        dp = [cuda.to_device(a) for a in params]
        du = [cuda.to_device(u) if np.ndim(u) else u for u in ups]
        bufs = tuple(cuda.device_array(r.shape, r.dtype)
                     for r in gpu_check.as_tuple(op.cuda.fwd_bwd(*dp, *du)))
        return (lambda: op.cuda.fwd_bwd(*dp, *du, out=bufs)), params, ups

    def per_call(fn, sync):
        fn()
        sync()
        t = time.perf_counter()
        for _ in range(args.calls):
            fn()
        sync()
        return (time.perf_counter() - t) / args.calls * 1e6

    print(f"## host cost per call at {args.tiny[0]}x{args.tiny[1]}, wall, "
          f"{args.calls} calls (us)", flush=True)
    for name in mod.OPS:
        fn, params, ups = call(name, args.tiny)
        ours = per_call(fn, cuda.synchronize)
        theirs = (per_call(torch_runner(name, params, ups, device="cuda"),
                           torch.cuda.synchronize) if torch else float("nan"))
        print(f"{name:<18} gradc {ours:8.1f}   torch {theirs:8.1f}", flush=True)
    if torch is None:
        print(f"torch not timed: {why}")

    @cuda.jit
    def nothing(a, b, c, d, e, f, g, h, i, j, k, m):
        pass

    arrays = [cuda.device_array(64, np.float32) for _ in range(12)]
    print(f"Numba, an empty kernel with 12 array arguments: "
          f"{per_call(lambda: nothing[1, 256](*arrays), cuda.synchronize):.1f} us/launch")
    print(f"Numba, cuda.device_array of 8 MB: "
          f"{per_call(lambda: cuda.device_array(1 << 20, np.float64), cuda.synchronize):.1f} us",
          flush=True)

    for name in args.profile:
        fn, _, _ = call(name, args.tiny)
        fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        cuda.synchronize()
        prof.disable()
        for key in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats(key).print_stats(25)
            print(f"\n## cProfile of {name}.cuda.fwd_bwd, {args.calls} calls, by {key}")
            print(text.getvalue().split("\n\n", 1)[-1], flush=True)

    if torch is None:
        print(f"\n## kernels: not profiled ({why})")
        return 0
    from torch.profiler import ProfilerActivity, profile
    for shape in args.shapes:
        for name in mod.OPS:
            fn, _, _ = call(name, shape)
            for _ in range(3):
                fn()
            cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn()
                cuda.synchronize()
            print(f"\n## kernels of {name} {shape[0]}x{shape[1]}, 5 calls", flush=True)
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=10,
                                            max_name_column_width=60), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
