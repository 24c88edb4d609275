"""Sources of row-wise ops shared by the tests of the reduce kernels' stages."""
from __future__ import annotations

# softmax along rows with its hand-written gradient: the fused fwd_bwd's kernel is four
# passes per row on the CPU (max; exp and its sum; y and its dot with dy; dx)
SOFTMAX_ROWS = """
op softmax(x: f32[b, n]) -> y {
    m = max(x, axis=1, keepdims=true)
    e = exp(x - m)
    y = e / sum(e, axis=1, keepdims=true)
} grad(dy) -> dx {
    dx = y * (dy - sum(y * dy, axis=1, keepdims=true))
}
"""

# layer norm along rows with its hand-written backward (rowwise.grad's): on the CPU the
# fused fwd_bwd's kernel is two passes per row (its statistics, with the variance and
# mean(g * xhat) as centred sums; then y, dx, and the sums across rows dw and db)
LAYER_NORM_ROWS = """
op layer_norm(x: f32[n, k], w: f32[k], b: f32[k], eps: nograd = 1e-5) -> y {
    mu = mean(x, axis=-1, keepdims=true)
    xc = x - mu
    rstd = rsqrt(mean(xc^2, axis=-1, keepdims=true) + eps)
    xhat = xc * rstd
    y = xhat * w + b
} grad(dy) -> (dx, dw, db) {
    g = dy * w
    dx = rstd * (g - mean(g, axis=-1, keepdims=true) - xhat * mean(g * xhat, axis=-1, keepdims=true))
    dw = sum(dy * xhat, axis=0)
    db = sum(dy, axis=0)
}
"""

# softmax, layer norm and cross-entropy of any rank (row plans: rows along the last axis),
# the row plan's and split rows' tests
ROW_OPS = """
op smax(x) -> y {
    e = exp(x - max(x, axis=-1, keepdims=true))
    y = e / sum(e, axis=-1, keepdims=true)
} grad(dy) -> dx {
    dx = y * (dy - sum(y * dy, axis=-1, keepdims=true))
}
op lnorm(x, w, b, eps: nograd = 1e-5) -> y {
    xc = x - mean(x, axis=-1, keepdims=true)
    rstd = rsqrt(mean(xc^2, axis=-1, keepdims=true) + eps)
    y = xc * rstd * w + b
} grad(dy) -> (dx, dw, db) {
    xhat = xc * rstd
    g = dy * w
    dx = rstd * (g - mean(g, axis=-1, keepdims=true) - xhat * mean(g * xhat, axis=-1, keepdims=true))
    dw = sum(dy * xhat, axis=0)
    db = sum(dy, axis=0)
}
op xent(x, t: nograd) -> loss {
    loss = mean(logsumexp(x, axis=-1) - sum(x * t, axis=-1))
}
"""
