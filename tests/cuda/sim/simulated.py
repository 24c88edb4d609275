"""What the simulator's tests share: a .grad file compiled for CUDA alone, and its
methods on the (simulated) device against the IR interpreter."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import cuda

import gradc
from gradc.frontend.check import check_source
from gradc.ir.interpret import interpret
from gradc.pipeline import build_program

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


class Ops:
    """A .grad file compiled for CUDA only (no CPU kernel to JIT: the simulator
    runs are slow enough), with its compiled ops for the NumPy reference."""

    def __init__(self, path: Path, **options) -> None:
        self.module = gradc.load(path, target="cuda", **options)
        program = check_source(path.read_text(encoding="utf-8"), str(path))
        self.compiled = build_program(program)

    def __getattr__(self, name):
        return getattr(self.module, name)


def load(text: str, tmp_path: Path, name: str, **options) -> Ops:
    path = tmp_path / f"{name}.grad"
    path.write_text(text, encoding="utf-8")
    return Ops(path, **options)


def agree(want, got, dtype) -> None:
    got = got if isinstance(got, tuple) else (got,)
    assert len(want) == len(got)
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    for w, g in zip(want, got):
        g = g.copy_to_host()
        assert g.shape == np.shape(w), (g.shape, np.shape(w))
        assert g.dtype == dtype, g.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


def every_method(ops: Ops, name: str, xs, ups, dtype, methods=("forward", "vjp", "fwd_bwd", "jvp"),
                 unfused: bool = True, **kw) -> None:
    """``name``'s forward, vjp, fwd_bwd and jvp, fused and (``unfused``) unfused, on
    the (simulated) device against the IR interpreter (NumPy, float64) on the same
    values (jvp: a tangent like each differentiable input, scalars as scalars)."""
    cop = ops.compiled[name]
    params = list(xs) + [kw.get(p.name, p.default) for p in cop.params if p.has_default]
    rng = np.random.default_rng(len(xs))
    ts = [0.25 if isinstance(x, float) else rng.standard_normal(np.shape(x)).astype(dtype)
          for x, p in zip(xs, cop.params) if p.differentiable]
    extra = {"forward": [], "vjp": list(ups), "fwd_bwd": list(ups), "jvp": ts}
    ref = {m: interpret(cop.methods[m].graph, params + extra[m]) for m in methods}
    dev_array = lambda v: v if isinstance(v, float) else cuda.to_device(v)
    dx, du, dt = ([dev_array(v) for v in vs] for vs in (xs, ups, ts))
    op = ops.OPS[name]
    args = {"forward": dx, "vjp": dx + du, "fwd_bwd": dx + du, "jvp": dx + dt}
    for dev in (op.cuda, op.cuda.unfused) if unfused else (op.cuda,):
        for m in methods:
            agree(ref[m], (dev if m == "forward" else getattr(dev, m))(*args[m], **kw), dtype)
