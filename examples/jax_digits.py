#!/usr/bin/env python
"""The guide's scaled-tanh classifier trained in JAX, with gradc ops inside the model.

The model of ``examples/train_digits.py`` (two layers, hidden layer ``scaled_tanh``:
``tanh`` forward, gradient ``dy * (1 - y^2) * 0.5``) on scikit-learn's digits, trained
with Adam under ``jax.jit``, four ways:

* ``gradc scaled_tanh``: a JAX model whose hidden activation is the gradc op
  (``as_jax(m.scaled_tanh)``: its forward and its rule as gradc plans them, lowered
  to ``jax.numpy`` and fused by XLA with the matmuls and the loss);
* ``gradc scaled_tanh, kernels``: the same with ``lowering="kernels"``: forward and
  backward in gradc's fused kernels, called back from XLA;
* ``gradc mlp + xent``: the whole model and loss as gradc ops (``as_jax(m.mlp)``,
  ``as_jax(m.softmax_xent)``);
* ``pure JAX``: the same model written in JAX, ``scaled_tanh`` a ``jax.custom_vjp``
  scaling ``tanh'`` by 0.5.

All four compute the same function and gradients (float32), so they follow the same
trajectory up to rounding; the script prints the time per training step of each and
their held-out accuracy.  With gradc's kernels an op costs a host callback per call
(``jax.pure_callback``), which XLA cannot fuse into its own kernels: at this size that
is slower than pure JAX, which the default lowering matches.

Run::

    python examples/jax_digits.py                    # 10 epochs, hidden 128, batch 64
    python examples/jax_digits.py --steps 20 --quiet # a few steps (what the tests run)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from train_digits import init_params, load_data  # noqa: E402

PARAM_NAMES = ("w1", "b1", "w2", "b2")


def models(module):
    """``{name: loss(params, x, onehot)}`` for the four ways of writing the model."""
    import jax
    import jax.numpy as jnp

    from gradc.adapters.jax import as_jax

    st, mlp, xent = as_jax(module.scaled_tanh), as_jax(module.mlp), as_jax(module.softmax_xent)
    st_kernels = as_jax(module.scaled_tanh, lowering="kernels")

    def jax_xent(logits, onehot):
        return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.sum(onehot * logits, axis=1))

    @jax.custom_vjp
    def scaled_tanh(x):
        return jnp.tanh(x)

    def st_fwd(x):
        y = jnp.tanh(x)
        return y, y

    def st_bwd(y, dy):
        return (dy * (1 - y ** 2) * 0.5,)

    scaled_tanh.defvjp(st_fwd, st_bwd)

    def layers(act):
        def loss(p, x, onehot):
            return jax_xent(act(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], onehot)
        return loss

    return {
        "gradc scaled_tanh": layers(st),
        "gradc scaled_tanh, kernels": layers(st_kernels),
        "gradc mlp + xent": lambda p, x, onehot: xent(mlp(x, *(p[k] for k in PARAM_NAMES)),
                                                      onehot),
        "pure JAX": layers(scaled_tanh),
    }


def adam_step(loss, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
    """A jitted Adam step ``(params, m, v, t, x, onehot) -> (params, m, v, loss)``."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(params, m, v, t, x, onehot):
        value, grads = jax.value_and_grad(loss)(params, x, onehot)
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        scale = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps),
                              params, m, v)
        return params, m, v, value

    return step


def train(loss, data, *, hidden: int, epochs: int, batch: int, steps: int | None,
          seed: int = 0) -> dict:
    """Train from the same initial weights and batches; the seconds per step after
    the first (which traces and compiles), the last loss and the test accuracy."""
    import jax
    import jax.numpy as jnp

    x_tr, y_tr, x_te, y_te = data
    params = {k: jnp.asarray(v) for k, v in init_params(64, hidden, 10, seed).items()}
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    step = adam_step(loss)
    rng = np.random.default_rng(seed)
    t, times, value = 0, [], float("nan")
    for _ in range(epochs):
        order = rng.permutation(len(x_tr))
        for lo in range(0, len(order) - batch + 1, batch):
            idx = order[lo:lo + batch]
            t += 1
            start = time.perf_counter()
            params, m, v, value = step(params, m, v, t, x_tr[idx], y_tr[idx])
            value.block_until_ready()
            times.append(time.perf_counter() - start)
            if steps is not None and t >= steps:
                break
        if steps is not None and t >= steps:
            break
    hidden_te = np.tanh(x_te @ np.asarray(params["w1"]) + np.asarray(params["b1"]))
    pred = np.argmax(hidden_te @ np.asarray(params["w2"]) + np.asarray(params["b2"]), axis=1)
    acc = float(np.mean(pred == np.argmax(y_te, axis=1)))
    return {"step_s": float(np.median(times[1:])) if len(times) > 1 else float("nan"),
            "first_s": times[0], "loss": float(value), "accuracy": acc, "steps": t}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="print only the table")
    args = ap.parse_args(argv)
    import gradc
    module = gradc.load(HERE / "seed.grad")
    data = load_data()
    results = {}
    for name, loss in models(module).items():
        results[name] = train(loss, data, hidden=args.hidden, epochs=args.epochs,
                              batch=args.batch, steps=args.steps, seed=args.seed)
        if not args.quiet:
            r = results[name]
            print(f"{name}: {r['steps']} steps, last loss {r['loss']:.4f}, "
                  f"test accuracy {r['accuracy']:.3f}", flush=True)
    print(f"{'model':<28} {'ms/step':>9} {'first step s':>13} {'loss':>8} {'accuracy':>9}")
    for name, r in results.items():
        print(f"{name:<28} {r['step_s'] * 1e3:9.3f} {r['first_s']:13.2f} {r['loss']:8.4f} "
              f"{r['accuracy']:9.3f}")
    return results


if __name__ == "__main__":
    main()
