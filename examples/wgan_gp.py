#!/usr/bin/env python
"""Train a tiny WGAN-GP on a toy 2-D distribution with gradc's second-order gradients.

The custom-gradient guide (``seeds/custom-gradients-guide.txt``) writes a gradient
penalty for Wasserstein GANs whose custom gradient returns ``None`` for every input,
so the penalty never reaches the critic's weights.  ``examples/seed.grad`` writes it
with ``grad()``, and ``examples/wgan_gp.grad`` does the same for a critic with a
hidden layer::

    op penalty_mlp(real, fake, alpha, w1, b1, w2) -> p {
        xi = alpha * real + (1 - alpha) * fake
        g = grad(sum(critic_mlp(xi, w1, b1, w2)), xi)   # d critic / d input, per sample
        p = mean((norm(g, axis=1) - 1)^2)
    }

gradc derives ``d p / d (w1, b1, w2)``: a second-order derivative, since ``g`` is
itself a gradient.  This script trains with it (Gulrajani et al. 2017, "Improved
Training of Wasserstein GANs", Algorithm 1, with Adam(beta1 = 0.5, beta2 = 0.9)):

* real data: a 2-D Gaussian, mean ``(2, -1)``, covariance ``[[1, -0.24], [-0.24, 0.16]]``
  (``z @ L + mean`` for standard normal ``z``);
* generator: ``fake = z @ a + c``, six numbers, starting at ``a = I``, ``c = 0``: the
  right answer is known (mean ``c``, covariance ``a^T a``), so the script can say how
  close it got;
* critic: ``critic_mlp(x) = tanh(x @ w1 + b1) @ w2`` with ``--hidden`` units;
* per generator step, ``--n-critic`` critic steps on ``critic_loss`` (minus the
  critic's Wasserstein estimate, plus ``lam`` times the penalty), then one generator
  step on ``generator_loss = -mean(critic(fake))``; both learning rates decay
  linearly to 0.

Every loss and gradient comes from the module gradc compiles (float32):

* critic:    ``loss, dw1, db1, dw2 = m.critic_loss.fwd_bwd(real, fake, alpha, w1, b1, w2, 1)``
* generator: ``da, dc = m.generator_loss.vjp(z, a, c, w1, b1, w2, 1)``

Every ``--every`` generator steps it prints, on a fresh batch of 4096 samples, the
critic's Wasserstein estimate ``mean(critic(real)) - mean(critic(fake))``, the
penalty, and how far the generator's mean and covariance are from the real ones;
the last lines compare those distances with the ones at the start.

Run::

    python examples/wgan_gp.py                      # 300 generator steps
    python examples/wgan_gp.py --steps 100 --every 20 --quiet
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
WGAN_GRAD = HERE / "wgan_gp.grad"
"""The ``.grad`` file holding the critic, its penalty and the two losses."""

if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from train_digits import Adam  # noqa: E402  (the digits example's optimiser)

F32 = np.float32
REAL_MEAN = np.array([2.0, -1.0], F32)
REAL_L = np.array([[0.8, 0.0], [-0.6, 0.4]], F32)
"""Real samples are ``z @ REAL_L + REAL_MEAN``: covariance ``REAL_L.T @ REAL_L``."""


def real_batch(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal((n, 2)).astype(F32) @ REAL_L + REAL_MEAN


def distances(gen: dict[str, np.ndarray]) -> tuple[float, float]:
    """``|c - mean|`` and the Frobenius norm ``|a^T a - cov|`` (the generator's
    distribution against the real one, exactly: both are Gaussian)."""
    a, c = gen["a"].astype(np.float64), gen["c"].astype(np.float64)
    cov = REAL_L.T.astype(np.float64) @ REAL_L
    return float(np.linalg.norm(c - REAL_MEAN)), float(np.linalg.norm(a.T @ a - cov))


def measure(m: ModuleType, critic: dict[str, np.ndarray], gen: dict[str, np.ndarray],
            rng: np.random.Generator, n: int = 4096) -> tuple[float, float]:
    """The critic's Wasserstein estimate and the penalty, on fresh samples."""
    w = (critic["w1"], critic["b1"], critic["w2"])
    real = real_batch(rng, n)
    fake = rng.standard_normal((n, 2)).astype(F32) @ gen["a"] + gen["c"]
    alpha = rng.uniform(0, 1, (n, 1)).astype(F32)
    estimate = float(np.mean(m.critic_mlp(real, *w)) - np.mean(m.critic_mlp(fake, *w)))
    return estimate, float(m.penalty_mlp(real, fake, alpha, *w))


def train(m: ModuleType, *, steps: int = 300, n_critic: int = 5, batch: int = 256,
          hidden: int = 32, lam: float = 10.0, lr: float = 0.03, seed: int = 0,
          every: int = 50, quiet: bool = False) -> dict[str, Any]:
    """Train; return ``{"start", "end", "history", "seconds", "gen"}``: ``start`` and
    ``end`` are :func:`distances` before and after, ``history`` one row per ``every``
    steps: ``(step, estimate, penalty, mean distance, covariance distance)``."""
    rng = np.random.default_rng(seed)
    critic = {"w1": rng.standard_normal((2, hidden)).astype(F32),
              "b1": np.zeros(hidden, F32),
              "w2": (rng.standard_normal(hidden) / np.sqrt(hidden)).astype(F32)}
    gen = {"a": np.eye(2, dtype=F32), "c": np.zeros(2, F32)}
    opt_critic = Adam(critic, lr=lr, betas=(0.5, 0.9))
    opt_gen = Adam(gen, lr=lr, betas=(0.5, 0.9))
    start, history = distances(gen), []
    one = F32(1)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        opt_critic.lr = opt_gen.lr = lr * (1 - (step - 1) / steps)
        w = (critic["w1"], critic["b1"], critic["w2"])
        for _ in range(n_critic):
            real = real_batch(rng, batch)
            fake = rng.standard_normal((batch, 2)).astype(F32) @ gen["a"] + gen["c"]
            alpha = rng.uniform(0, 1, (batch, 1)).astype(F32)
            _, dw1, db1, dw2 = m.critic_loss.fwd_bwd(real, fake, alpha, *w, one, lam=lam)
            opt_critic.step({"w1": dw1, "b1": db1, "w2": dw2})
        z = rng.standard_normal((batch, 2)).astype(F32)
        da, dc = m.generator_loss.vjp(z, gen["a"], gen["c"], *w, one)
        opt_gen.step({"a": da, "c": dc})
        if step % every == 0 or step == steps:
            row = (step, *measure(m, critic, gen, rng), *distances(gen))
            history.append(row)
            if not quiet:
                print(f"step {row[0]:4d}  W estimate {row[1]:+.4f}  penalty {row[2]:.4f}  "
                      f"|mean - real| {row[3]:.3f}  |cov - real| {row[4]:.3f}", flush=True)
    return {"start": start, "end": distances(gen), "history": history,
            "seconds": time.perf_counter() - t0, "gen": gen}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, load ``examples/wgan_gp.grad``, train, print the result; return 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="generator steps (default 300)")
    p.add_argument("--n-critic", type=int, default=5,
                   help="critic steps per generator step (default 5)")
    p.add_argument("--batch", type=int, default=256, help="samples per batch (default 256)")
    p.add_argument("--hidden", type=int, default=32, help="critic's hidden units (default 32)")
    p.add_argument("--lam", type=float, default=10.0, help="penalty weight (default 10)")
    p.add_argument("--lr", type=float, default=0.03,
                   help="initial Adam learning rate, decayed linearly to 0 (default 0.03)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--every", type=int, default=50, help="print every N steps (default 50)")
    p.add_argument("--quiet", action="store_true", help="only the final lines")
    args = p.parse_args(argv)

    import gradc
    t0 = time.perf_counter()
    m = gradc.load(WGAN_GRAD)
    load = time.perf_counter() - t0
    res = train(m, steps=args.steps, n_critic=args.n_critic, batch=args.batch,
                hidden=args.hidden, lam=args.lam, lr=args.lr, seed=args.seed,
                every=args.every, quiet=args.quiet)
    (m0, c0), (m1, c1) = res["start"], res["end"]
    a, c = res["gen"]["a"].astype(np.float64), res["gen"]["c"]
    cov = a.T @ a
    print(f"generator: mean ({c[0]:.3f}, {c[1]:.3f}), covariance [[{cov[0, 0]:.3f}, "
          f"{cov[0, 1]:.3f}], [{cov[1, 0]:.3f}, {cov[1, 1]:.3f}]]; real: mean (2, -1), "
          "covariance [[1, -0.24], [-0.24, 0.16]]\n"
          f"distance to the real distribution: mean {m0:.3f} -> {m1:.3f}, covariance "
          f"{c0:.3f} -> {c1:.3f}; final W estimate {res['history'][-1][1]:+.4f}\n"
          f"time: gradc.load {load:.1f}s, training {res['seconds']:.1f}s "
          f"({args.steps} generator and {args.steps * args.n_critic} critic steps, "
          "first calls compile or load the kernels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
