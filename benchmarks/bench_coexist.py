#!/usr/bin/env python
"""A gradc op inside a PyTorch and a JAX training step: does gradc slow the framework?

Two questions, for one threading setting per process (Numba picks its threading layer
once per process, so each setting runs in child processes of its own):

1. A training step (batch 4096, an MLP 784 -> 1024 -> 10, cross-entropy, backward)
   with gradc's ``swish`` (``as_torch`` / ``as_jax`` of ``examples/activations.grad``:
   its forward and VJP kernels for PyTorch; for JAX, the default lowering, which XLA
   fuses, and gradc's kernels in callbacks, ``lowering="kernels"``) against the same
   step with the framework's own activation (``F.silu``, ``jax.nn.silu``): the ratio
   of their medians.
2. The framework's own small ops (a 512x512 matmul, a fwd+bwd of ``tanh`` on 256x256),
   the ones a spinning thread pool slows most, and its native step: timed in rounds
   before any gradc call, then in the same rounds with gradc's step added (once gradc
   ran); and, within those, right after gradc's activation on 4096x1024 (its threaded
   kernel, Numba's workers just done; for JAX the "kernels" lowering) next to right
   after the framework's own.

Within a child, every round runs every variant once, in an order rotating from
round to round, and medians are reported; the parent alternates the settings
(``--settings``) child after child, ``--children`` times each, and prints the median
of the children's medians with the load average around each child (the machine is
shared: a load above the core count means other work competed for the cores).

Run::

    python benchmarks/bench_coexist.py                       # the default vs OpenMP
    python benchmarks/bench_coexist.py --settings default --children 3 --rounds 41
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> environment variables of the child (the default: nothing set)
SETTINGS = {"default": {}, "omp": {"NUMBA_THREADING_LAYER": "omp"},
            "omp-passive": {"NUMBA_THREADING_LAYER": "omp", "OMP_WAIT_POLICY": "PASSIVE"},
            "workqueue": {"NUMBA_THREADING_LAYER": "workqueue"},
            "tbb": {"NUMBA_THREADING_LAYER": "tbb"}}
BATCH, IN, HIDDEN, OUT = 4096, 784, 1024, 10


def rounds(variants: dict, n: int) -> dict[str, float]:
    """Median seconds of each variant over ``n`` rounds, order rotating. A variant is
    a callable, or a pair (setup, timed): setup runs untimed right before.  Unlike
    :func:`gradc.tools.bench.time_interleaved`, nothing waits for the threads of one variant
    to sleep before the next: how much they get in each other's way is measured."""
    names = list(variants)
    samples = {k: [] for k in names}
    for r in range(n):
        for name in names[r % len(names):] + names[:r % len(names)]:
            v = variants[name]
            setup, fn = v if isinstance(v, tuple) else (None, v)
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(s) for k, s in samples.items()}


def load_swish():
    import gradc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradc.GradcWarning)
        return gradc.load(ROOT / "examples" / "activations.grad").swish


def child_torch(n: int) -> dict:
    import torch
    import torch.nn.functional as F
    from gradc.adapters.torch import as_torch
    torch.manual_seed(0)
    x, t = torch.randn(BATCH, IN), torch.randint(0, OUT, (BATCH,))
    l1, l2 = torch.nn.Linear(IN, HIDDEN), torch.nn.Linear(HIDDEN, OUT)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    xs = torch.randn(256, 256, requires_grad=True)
    big = torch.randn(BATCH, HIDDEN)

    def step(act):
        loss = F.cross_entropy(l2(act(l1(x))), t)
        l1.zero_grad()
        l2.zero_grad()
        loss.backward()

    own = {"matmul 512": lambda: a @ b,
           "fwd+bwd 256x256": lambda: torch.tanh(xs).sum().backward()}
    swish = as_torch(load_swish())
    return phases(own, lambda: step(F.silu), lambda: F.silu(big), lambda: step(swish),
                  lambda: swish(big), "torch", n)


def child_jax(n: int) -> dict:
    import jax
    import jax.numpy as jnp
    from gradc.adapters.jax import as_jax
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    x = jax.random.normal(k[0], (BATCH, IN))
    t = jax.random.randint(k[1], (BATCH,), 0, OUT)
    params = (jax.random.normal(k[2], (IN, HIDDEN)) * 0.03, jnp.zeros(HIDDEN),
              jax.random.normal(k[3], (HIDDEN, OUT)) * 0.03, jnp.zeros(OUT))
    a, b = jax.random.normal(k[4], (512, 512)), jax.random.normal(k[5], (512, 512))
    xs, big = jax.random.normal(k[4], (256, 256)), jax.random.normal(k[5], (BATCH, HIDDEN))

    def make_step(act):
        def loss(p):
            w1, b1, w2, b2 = p
            logits = act(x @ w1 + b1) @ w2 + b2
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), t[:, None], 1))
        grad = jax.jit(jax.value_and_grad(loss))
        return lambda: jax.block_until_ready(grad(params))

    mm_j = jax.jit(lambda a, b: a @ b)
    fb_j = jax.jit(jax.grad(lambda v: jnp.tanh(v).sum()))
    own = {"matmul 512": lambda: mm_j(a, b).block_until_ready(),
           "fwd+bwd 256x256": lambda: fb_j(xs).block_until_ready()}
    # the default lowering (XLA fuses the op's jax.numpy graphs) in the step; gradc's
    # threaded kernels (lowering="kernels", host callbacks) in a step of their own
    # and as the call the framework's own ops are timed right after
    swish, kernels = as_jax(load_swish()), as_jax(load_swish(), lowering="kernels")
    kernels_j, silu_j = jax.jit(kernels), jax.jit(jax.nn.silu)
    return phases(own, make_step(jax.nn.silu), lambda: silu_j(big).block_until_ready(),
                  make_step(swish), lambda: kernels_j(big).block_until_ready(), "jax", n,
                  {"step, gradc swish, kernels": make_step(kernels)})


def phases(own: dict, native, native_call, mine, gradc_call, fw: str, n: int,
           extra: dict | None = None) -> dict:
    """The framework's ``own`` ops, its step with its activation (``native``) and its
    ``own`` ops right after its activation on 4096x1024 (``native_call``), timed before
    any gradc call, then again with gradc's step (``mine``), the ``extra`` steps, and
    the ``own`` ops right after gradc's activation on 4096x1024 (``gradc_call``, the
    threaded kernel) added to the rounds: the same work in both phases, but for
    gradc's."""
    framework = {f"step, {fw} silu": native, **own,
                 **{f"{k} after a {fw} silu": (native_call, f) for k, f in own.items()}}
    for f in (native, native_call, *own.values()):
        f()
    before = rounds(framework, n)
    extra = extra or {}
    for f in (mine, gradc_call, *extra.values()):
        f()
    after = rounds({**framework, "step, gradc swish": mine, **extra,
                    **{f"{k} after a gradc call": (gradc_call, f) for k, f in own.items()}}, n)
    return {"before": before, "after": after}


def child(framework: str, n: int) -> None:
    import numba
    load = os.getloadavg()[0]
    res = (child_torch if framework == "torch" else child_jax)(n)
    res.update(layer=numba.threading_layer(), numba_threads=numba.get_num_threads(),
               load_before=load, load_after=os.getloadavg()[0])
    print(json.dumps(res))


def run_child(framework: str, setting: str, n: int) -> dict:
    env = {**os.environ, **SETTINGS[setting]}
    for k in ("NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY"):
        if k not in SETTINGS[setting]:
            env.pop(k, None)
    out = subprocess.run([sys.executable, __file__, "--child", framework, "--rounds", str(n)],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{framework} child ({setting}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(framework: str, setting: str, runs: list[dict]) -> list[str]:
    """The median over children of each figure, with the ratios the criteria name."""
    med = lambda phase, k: statistics.median(r[phase][k] for r in runs)
    other = "torch" if framework == "torch" else "jax"
    loads = ", ".join(f"{r['load_before']:.1f}-{r['load_after']:.1f}" for r in runs)
    step_native, step_gradc = med("after", f"step, {other} silu"), med("after", "step, gradc swish")
    lines = [f"{framework}, {setting}: Numba layer {runs[0]['layer']} "
             f"({runs[0]['numba_threads']} threads); load average per child {loads}",
             f"  training step: {other} silu {step_native * 1e3:.2f} ms, gradc swish "
             f"{step_gradc * 1e3:.2f} ms, ratio {step_gradc / step_native:.3f} "
             f"({'within' if step_gradc <= 1.10 * step_native else 'NOT within'} 10 %)"]
    for k in runs[0]["after"]:
        if k.startswith("step, gradc swish, "):
            t = med("after", k)
            lines.append(f"  training step with gradc swish, {k[19:]}: {t * 1e3:.2f} ms, "
                         f"ratio {t / step_native:.3f}")
    b, a = med("before", f"step, {other} silu"), step_native
    lines.append(f"  {other} step alone {b * 1e3:.2f} ms, once gradc ran {a * 1e3:.2f} "
                 f"({a / b:.2f}x)")
    for op in ("matmul 512", "fwd+bwd 256x256"):
        b, a = med("before", op), med("after", op)
        ag, an = med("after", f"{op} after a gradc call"), med("after", f"{op} after a {other} silu")
        lines.append(f"  {op:16s} before any gradc call {b * 1e3:.3f} ms, once gradc ran "
                     f"{a * 1e3:.3f} ({a / b:.2f}x); right after gradc's swish "
                     f"{ag * 1e3:.3f}, after {other}'s silu {an * 1e3:.3f} ({ag / an:.2f}x)")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="+", default=["default", "omp"], choices=list(SETTINGS))
    p.add_argument("--frameworks", nargs="+", default=["torch", "jax"], choices=["torch", "jax"])
    p.add_argument("--children", type=int, default=2, help="child processes per setting")
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds per child")
    p.add_argument("--json", help="write every child's figures here")
    p.add_argument("--child", choices=["torch", "jax"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.rounds)
    print(f"bench_coexist: {os.cpu_count()} CPUs, {args.rounds} rounds per child, "
          f"{args.children} children per setting, alternating; environment: "
          + (", ".join(f"{k}={v}" for k, v in os.environ.items()
                       if k.startswith(("NUMBA_", "OMP_", "GOMP_", "MKL_", "GRADC_"))) or "none"))
    runs = {}
    for fw in args.frameworks:
        for _ in range(args.children):
            for s in args.settings:
                runs.setdefault((fw, s), []).append(run_child(fw, s, args.rounds))
        for s in args.settings:
            print("\n".join(summary(fw, s, runs[fw, s])), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {f"{fw}/{s}": r for (fw, s), r in runs.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
