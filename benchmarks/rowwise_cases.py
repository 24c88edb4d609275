"""The row-wise benchmark cases, shared by ``bench_rowwise.py`` (CPU) and
``gpu_check.py`` (CUDA): the shapes, each op's float32 inputs, its outputs and
gradients in float64 NumPy, and the op with PyTorch's native kernels.  NumPy
only at import (torch when a torch function is called), so that a GPU machine
without gradc's dependencies can run ``gpu_check.py``."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

SHAPES = ((4096, 1024), (65536, 64), (16, 262144))


# -- inputs and the float64 reference -------------------------------------------


def make_inputs(op: str, shape: tuple[int, int], seed: int = 0) -> tuple[list, list]:
    """``(params, upstreams)``, float32: the op's array parameters (defaults left
    out) and one upstream per output."""
    rng = np.random.default_rng(seed)
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
    x = f32(rng.standard_normal(shape) * 2)
    dy = f32(rng.standard_normal(shape))
    k = shape[-1]
    if op == "layer_norm":
        return [x, f32(1 + 0.2 * rng.standard_normal(k)), f32(0.2 * rng.standard_normal(k))], [dy]
    if op == "rms_norm":
        return [x, f32(1 + 0.2 * rng.standard_normal(k))], [dy]
    if op == "xent_rows":
        t = np.exp(rng.standard_normal(shape))
        return [x, f32(t / t.sum(-1, keepdims=True))], [np.float32(0.75)]  # soft targets
    return [x], [dy]


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logsumexp(x):
    m = x.max(-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(-1, keepdims=True))


def reference(op: str, params: Sequence, ups: Sequence) -> list[np.ndarray]:
    """The op's outputs and gradients in float64 NumPy, written from the math."""
    (x, *rest), g = [np.asarray(a, np.float64) for a in params], np.float64(ups[0])
    mean = lambda a: a.mean(-1, keepdims=True)
    if op == "softmax_rows":
        y = _softmax(x)
        return [y, y * (g - (y * g).sum(-1, keepdims=True))]
    if op == "log_softmax_rows":
        return [x - _logsumexp(x), g - _softmax(x) * g.sum(-1, keepdims=True)]
    if op == "layer_norm":
        w, b = rest
        xc = x - mean(x)
        rstd = 1 / np.sqrt(mean(xc**2) + 1e-5)
        xhat = xc * rstd
        gw = g * w
        return [xhat * w + b, rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),
                (g * xhat).sum(0), g.sum(0)]
    if op == "rms_norm":
        (w,) = rest
        r = 1 / np.sqrt(mean(x**2) + 1e-6)
        gw = g * w
        return [x * r * w, r * gw - r**3 * x * mean(gw * x), (g * x * r).sum(0)]
    if op == "xent_rows":
        (t,) = rest
        return [np.mean(_logsumexp(x)[..., 0] - (x * t).sum(-1)),
                g / x.shape[0] * (_softmax(x) - t)]
    raise ValueError(f"no NumPy reference for op '{op}'")


# -- PyTorch ------------------------------------------------------------------------


def torch_math(op: str) -> tuple[Callable, int, str]:
    """The op with PyTorch's native kernels, how many leading parameters are
    differentiated, and a label ('' or what stands in for a missing kernel)."""
    import torch
    import torch.nn.functional as F
    if op == "softmax_rows":
        return (lambda x: torch.softmax(x, -1)), 1, ""
    if op == "log_softmax_rows":
        return (lambda x: torch.log_softmax(x, -1)), 1, ""
    if op == "layer_norm":
        return (lambda x, w, b: F.layer_norm(x, w.shape, w, b, eps=1e-5)), 3, ""
    if op == "rms_norm":
        if hasattr(F, "rms_norm"):
            return (lambda x, w: F.rms_norm(x, w.shape, w, eps=1e-6)), 2, ""
        return ((lambda x, w: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w),
                2, "rms_norm as its formula (no F.rms_norm in this torch)")
    if op == "xent_rows":      # soft targets whose rows sum to 1: the op's loss
        return (lambda x, t: F.cross_entropy(x, t)), 1, ""
    raise ValueError(op)


def torch_runner(op: str, params: list, ups: list, compile: bool = False,
                 device: str = "cpu") -> Callable[[], list]:
    """Eager (or compiled) forward and ``torch.autograd.grad`` on these inputs,
    copied once to ``device`` ("cpu" or "cuda"); the call returns tensors there."""
    import torch
    f, n_diff, _ = torch_math(op)
    if compile:
        f = torch.compile(f, dynamic=False)
    ta = [torch.from_numpy(a).to(device) for a in params]
    tu = [torch.from_numpy(np.asarray(u)).to(device) for u in ups]

    def fwd_bwd():
        diff = [a.detach().requires_grad_() for a in ta[:n_diff]]
        y = f(*diff, *ta[n_diff:])
        return [y.detach(), *torch.autograd.grad(y, diff, tu[0])]
    return fwd_bwd
