#!/usr/bin/env python
"""Train the custom-gradient guide's classifier in PyTorch, with gradc's ops in the model.

The guide's model (``examples/seed.grad``, ``docs/tutorial.md``) is a two-layer
classifier whose hidden layer is ``scaled_tanh``: ``tanh`` forward, custom gradient
``dy * (1 - y^2) * 0.5``.  Here it is trained with PyTorch's ``nn.Linear``, Adam and
cross-entropy on scikit-learn's bundled digits (1,797 8x8 images, no download), in
three variants that compute the same function and the same gradients:

* ``gradc scaled_tanh``: ``nn.Linear -> as_torch(m.scaled_tanh) -> nn.Linear``, the
  hidden activation's forward and backward in gradc's fused kernels
  (``gradc.adapters.torch``);
* ``gradc mlp``: the whole classifier as gradc's ``mlp`` op (both matmuls, the bias
  adds and scaled_tanh in one op, its VJP from gradc), parameters held by PyTorch;
* ``PyTorch``: the same model in plain PyTorch, scaled_tanh a
  ``torch.autograd.Function`` (``torch.tanh`` forward, the rule by hand backward).

All three start from the same weights and see the same batches; the script prints
the time per training step (median over the steps, after a warm-up step that
compiles or loads the kernels) and the held-out accuracy of each.

Run::

    python examples/torch_digits.py                  # 600 steps, batch 64, hidden 128
    python examples/torch_digits.py --steps 20 --quiet
    python examples/torch_digits.py --threads 2     # PyTorch's intra-op threads
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from train_digits import load_data  # noqa: E402  (examples/ is not a package)

import gradc  # noqa: E402
from gradc.adapters.torch import as_torch  # noqa: E402


class ScaledTanh(torch.autograd.Function):
    """The guide's scaled_tanh in plain PyTorch: tanh forward, ``dy (1 - y^2) / 2``."""

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return dy * (1 - y * y) * 0.5


class Classifier(torch.nn.Module):
    """``linear2(activation(linear1(x)))``; ``whole`` (gradc's mlp op) replaces all
    three when given."""

    def __init__(self, hidden: int, activation, whole=None, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear1, self.linear2 = torch.nn.Linear(64, hidden), torch.nn.Linear(hidden, 10)
        self.activation, self.whole = activation, whole

    def forward(self, x):
        if self.whole is not None:      # mlp(x, w1: [64, h], b1, w2: [h, 10], b2)
            return self.whole(x, self.linear1.weight.t(), self.linear1.bias,
                              self.linear2.weight.t(), self.linear2.bias)
        return self.linear2(self.activation(self.linear1(x)))


def train(models: dict, x_tr, y_tr, steps: int, batch: int, lr: float = 3e-3,
          seed: int = 0) -> dict[str, list[float]]:
    """Train every model on the same batches, one step each in turn (so that load
    on the machine affects all alike); returns each model's step times in seconds
    (the first step, which compiles or loads kernels, left out)."""
    opts = {k: torch.optim.Adam(m.parameters(), lr=lr) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    rng = np.random.default_rng(seed)
    labels = y_tr.argmax(1)
    for step in range(steps + 1):
        idx = rng.integers(0, len(x_tr), batch)
        xb, yb = torch.from_numpy(x_tr[idx]), torch.from_numpy(labels[idx])
        for k, model in models.items():
            t0 = time.perf_counter()
            opts[k].zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opts[k].step()
            if step:
                times[k].append(time.perf_counter() - t0)
    return times


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y.argmax(1)).mean())


def main(argv: list[str] | None = None) -> tuple[dict[str, tuple[float, float]], dict]:
    """Train and print the table; returns ``{variant: (ms per step, test accuracy)}``
    and the trained models."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: at batch 64 a step is well under "
                         "a millisecond, and PyTorch's OpenMP threads, spinning on a shared "
                         "machine, can stall each step for tens of milliseconds)")
    ap.add_argument("--quiet", action="store_true", help="print only the table")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    x_tr, y_tr, x_te, y_te = load_data()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradc.GradcWarning)
        m = gradc.load(HERE / "seed.grad")
    if not args.quiet:
        print(f"gradc.load(examples/seed.grad): {time.perf_counter() - t0:.1f} s")
    models = {
        "gradc scaled_tanh": Classifier(args.hidden, as_torch(m.scaled_tanh)),
        "gradc mlp": Classifier(args.hidden, None, whole=as_torch(m.mlp)),
        "PyTorch": Classifier(args.hidden, ScaledTanh.apply),
    }
    times = train(models, x_tr, y_tr, args.steps, args.batch)
    results = {}
    print(f"{'model':<20} {'ms/step':>8} {'test acc.':>9}   ({args.steps} steps, batch "
          f"{args.batch}, hidden {args.hidden}, {torch.get_num_threads()} torch threads)")
    for k, model in models.items():
        ms = 1e3 * statistics.median(times[k]) if times[k] else float("nan")
        results[k] = (ms, accuracy(model, x_te, y_te))
        print(f"{k:<20} {ms:8.3f} {results[k][1]:9.3f}")
    return results, models


if __name__ == "__main__":
    main()
