#!/usr/bin/env python
"""An MLP training step through gradc's generated ops, against NumPy and PyTorch eager.

One step is the forward and backward pass of the mean softmax cross-entropy of
``examples/seed.grad``'s classifier (``h = scaled_tanh(x @ w1 + b1)``,
``logits = h @ w2 + b2``; scaled_tanh's custom gradient halves tanh's), float32,
giving the loss and the gradients of ``x, w1, b1, w2, b2``:

* ``gradc``  ``examples/train_digits.py``'s ``loss_and_grads``: ``m.mlp``, then
  ``m.softmax_xent.fwd_bwd``, then ``m.mlp.vjp`` (fused elementwise kernels,
  NumPy's BLAS for the matmuls); ``mlp.vjp`` takes no residuals, so it computes
  ``x @ w1`` again;
* ``gradc 1-op``  one op, ``mlp_xent = softmax_xent(mlp(...), onehot)`` (written
  here, importing ``seed.grad``), called once: ``mlp_xent.fwd_bwd`` gives the loss
  and every gradient from one forward pass;
* ``numpy``  ``train_digits.numpy_reference_grads`` in float32, hand-written;
* ``torch``  PyTorch eager, written as a PyTorch user would: an
  ``autograd.Function`` for scaled_tanh (saving ``y``), ``torch.logsumexp``,
  ``torch.autograd.grad``.

All three compute ``dx`` too, as ``mlp.vjp`` does (``x`` is a differentiable
parameter of ``mlp``), so they do the same work. Two steps:

* ``digits``  a batch of 64 of scikit-learn's 8x8 digits, 64 -> 128 -> 10, as the
  training script runs it;
* ``large``   a batch of 4096, 784 -> 1024 -> 10 (random data).

Each runs with every library on all cores (Numba's threads, the BLAS threads via
threadpoolctl, ``torch.set_num_threads``) and again on one thread. Within each
block the three variants are interleaved, order rotating, each timed call after
a short sleep and (for the digits step) an untimed call; medians are reported.
Before timing, each variant's loss and gradients are compared with a float64
NumPy reference (max relative error). Nothing is asserted about time.

``--baseline DIR`` adds both gradc variants as compiled by the gradc source tree
``DIR`` (another checkout, e.g. ``git worktree add /tmp/base COMMIT``), timed in the
same interleaved rotation: before/after figures that a busy machine cannot skew
one way.

Run::

    python benchmarks/bench_mlp.py                    # both steps, both thread counts
    python benchmarks/bench_mlp.py --steps large --threads 2
    python benchmarks/bench_mlp.py --baseline /tmp/base   # also an older gradc
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples import train_digits  # noqa: E402

from gradc.tools.bench import max_rel_err, time_interleaved  # noqa: E402

STEPS = {"digits": (64, 64, 128, 10), "large": (4096, 784, 1024, 10)}
"""name -> (batch, inputs, hidden, classes)."""


def make_data(step: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    """``x: f32[b, i]``, ``onehot: f32[b, o]`` and Glorot-initialised parameters."""
    batch, n_in, hidden, n_out = STEPS[step]
    rng = np.random.default_rng(seed)
    if step == "digits":
        x_tr, y_tr, _, _ = train_digits.load_data()
        idx = rng.permutation(len(x_tr))[:batch]
        x, onehot = np.ascontiguousarray(x_tr[idx]), np.ascontiguousarray(y_tr[idx])
    else:
        x = rng.random((batch, n_in), dtype=np.float32)
        onehot = np.eye(n_out, dtype=np.float32)[rng.integers(0, n_out, batch)]
    return x, onehot, train_digits.init_params(n_in, hidden, n_out, seed=seed)


def gradc_step(module, x, onehot, params) -> Callable[[], tuple]:
    def run():
        w = [params[k] for k in train_digits.PARAM_NAMES]
        logits = module.mlp(x, *w)
        loss, dlogits = module.softmax_xent.fwd_bwd(logits, onehot, 1.0)
        return (float(loss), *module.mlp.vjp(x, *w, dlogits))
    return run


MLP_XENT = """import "{seed}"
op mlp_xent(x: f32[b, i], onehot: nograd f32[b, o], w1: f32[i, h], b1: f32[h],
            w2: f32[h, o], b2: f32[o]) -> loss {{
    loss = softmax_xent(mlp(x, w1, b1, w2, b2), onehot)
}}
"""


def load_one_op():
    """gradc's module of ``mlp_xent`` (the classifier and its loss as one op)."""
    import tempfile

    import gradc
    path = Path(tempfile.mkdtemp(prefix="gradc-bench-mlp-")) / "mlp_xent.grad"
    path.write_text(MLP_XENT.format(seed=train_digits.SEED_GRAD.as_posix()), encoding="utf-8")
    return gradc.load(path)


def load_baseline(tree: Path) -> tuple:
    """``examples/seed.grad`` and the ``mlp_xent`` op compiled by the gradc in the
    source tree ``tree`` (in a subprocess), imported as modules of this process."""
    import importlib.util
    import subprocess
    import tempfile
    out = Path(tempfile.mkdtemp(prefix="gradc-bench-mlp-base-"))
    (out / "mlp_xent.grad").write_text(MLP_XENT.format(seed=train_digits.SEED_GRAD.as_posix()),
                                       encoding="utf-8")
    code = ("import sys, gradc; gradc.compile_file(sys.argv[1], sys.argv[2]); "
            "gradc.compile_file(sys.argv[3], sys.argv[4])")
    paths = [str(train_digits.SEED_GRAD), str(out / "base_seed.py"),
             str(out / "mlp_xent.grad"), str(out / "base_mlp_xent.py")]
    subprocess.run([sys.executable, "-c", code, *paths], cwd=tree, check=True,
                   env={**os.environ, "PYTHONPATH": str(tree)})
    modules = []
    for name in ("base_seed", "base_mlp_xent"):
        spec = importlib.util.spec_from_file_location(name, out / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return tuple(modules)


def gradc_one_op_step(module, x, onehot, params) -> Callable[[], tuple]:
    w = [params[k] for k in train_digits.PARAM_NAMES]
    return lambda: module.mlp_xent.fwd_bwd(x, onehot, *w, 1.0)


def numpy_step(x, onehot, params) -> Callable[[], tuple]:
    w = [params[k] for k in train_digits.PARAM_NAMES]
    return lambda: train_digits.numpy_reference_grads(x, onehot, *w, dtype=np.float32)


def torch_step(x, onehot, params) -> Callable[[], tuple]:
    import torch

    class ScaledTanh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            y = torch.tanh(z)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            return dy * (1 - y * y) * 0.5

    xt, yt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(onehot)
    w = [torch.from_numpy(params[k]).requires_grad_() for k in train_digits.PARAM_NAMES]

    def run():
        w1, b1, w2, b2 = w
        logits = ScaledTanh.apply(xt @ w1 + b1) @ w2 + b2
        loss = (torch.logsumexp(logits, dim=1) - (yt * logits).sum(dim=1)).mean()
        grads = torch.autograd.grad(loss, (xt, *w))
        return (float(loss.detach()), *(g.numpy() for g in grads))
    return run


def set_threads(k: int) -> None:
    import numba
    numba.set_num_threads(k)
    try:
        import torch
        torch.set_num_threads(k)
    except ImportError:
        pass


def bench_block(step: str, threads: int, module, one_op, repeat: int, settle: float,
                baseline: tuple | None = None) -> dict:
    """Medians (seconds) and errors of the variants of one step on ``threads``."""
    from threadpoolctl import threadpool_limits
    x, onehot, params = make_data(step)
    want = train_digits.numpy_reference_grads(x, onehot, *(params[k] for k in
                                                            train_digits.PARAM_NAMES))
    variants = {"gradc": gradc_step(module, x, onehot, params),
                "gradc 1-op": gradc_one_op_step(one_op, x, onehot, params)}
    if baseline:
        variants["base"] = gradc_step(baseline[0], x, onehot, params)
        variants["base 1-op"] = gradc_one_op_step(baseline[1], x, onehot, params)
    variants["numpy"] = numpy_step(x, onehot, params)
    try:
        variants["torch"] = torch_step(x, onehot, params)
    except ImportError:
        pass
    set_threads(threads)
    with threadpool_limits(limits=threads, user_api="blas"):
        errs = {}
        for name, run in variants.items():
            got = run()
            errs[name] = max(max_rel_err(g, w) for g, w in zip(got, want))
        samples = time_interleaved(variants, repeat, settle, wake=step == "digits")
    return {"median_s": {k: statistics.median(v) for k, v in samples.items()},
            "max_rel_err": errs}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS))
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="thread counts to run (default: the core count, then 1)")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed repeats (default 51 for digits, 11 for large)")
    p.add_argument("--settle", type=float, default=0.01,
                   help="seconds slept before each timed call (default 0.01)")
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="a gradc source tree whose modules are timed too ('base' columns)")
    args = p.parse_args(argv)
    import numba

    import gradc
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = args.threads or sorted({cores, 1}, reverse=True)
    module, one_op = gradc.load(train_digits.SEED_GRAD), load_one_op()
    baseline = load_baseline(args.baseline) if args.baseline else None
    versions = f"numpy {np.__version__}, numba {numba.__version__}"
    try:
        import torch
        versions += f", torch {torch.__version__}"
    except ImportError:
        versions += ", torch not installed"
    print(f"MLP step (forward + backward of mean softmax cross-entropy, float32): "
          f"{cores} cores, {versions}; load average {os.getloadavg()[0]:.2f}")
    names = ["gradc", "gradc 1-op", *(["base", "base 1-op"] if baseline else []), "numpy",
             "torch"]
    head = (f"{'step':<27}{'threads':>8}" + "".join(f"{v + ' ms':>14}" for v in names)
            + f"{'numpy/gradc':>13}{'torch/gradc':>13}" + (f"{'base/gradc':>13}" if baseline else "")
            + "   max rel err vs float64")
    print(head)
    print("-" * len(head))
    for step in args.steps:
        b, i, h, o = STEPS[step]
        for k in threads:
            repeat = args.repeat or (51 if step == "digits" else 11)
            r = bench_block(step, k, module, one_op, repeat, args.settle, baseline)
            med, err = r["median_s"], r["max_rel_err"]
            best = min(med["gradc"], med["gradc 1-op"])
            ms = "".join(f"{med[v] * 1e3:>14.3f}" if v in med else f"{'-':>14}" for v in names)
            base = f"{min(med['base'], med['base 1-op']) / best:>12.2f}x" if baseline else ""
            print(f"{f'{step} b={b} {i}-{h}-{o}':<27}{k:>8}{ms}"
                  f"{med['numpy'] / best:>12.2f}x{med.get('torch', math.nan) / best:>12.2f}x{base}   "
                  + ", ".join(f"{v} {err[v]:.0e}" for v in err))
    print("\nmedians of interleaved repeats; threads: Numba, BLAS (threadpoolctl) and "
          "torch.set_num_threads alike. numpy/gradc and torch/gradc: over the faster gradc "
          "variant (> 1: gradc is faster)."
          + (f" base: the gradc of {args.baseline}; base/gradc: its faster variant over "
             "gradc's." if baseline else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
