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

# the split rows' tests (CPU and CUDA): ROW_OPS, and ops whose kernels hold the other
# accumulators a segment leaves (two-pass maxima and sums, NaN-flagged maxima and minima,
# norms, a max across rows, a sum of all elements, a row product, a draw)
SPLIT_OPS = ROW_OPS + """
op lsmax(x) -> y {
    y = x - logsumexp(x, axis=-1, keepdims=true)
}
op rms(x, w, eps: nograd = 1e-6) -> y {
    y = x * rsqrt(mean(x * x, axis=-1, keepdims=true) + eps) * w
}
op ext(x) -> (hi, lo, n, cm) {
    hi = max(x, axis=-1)
    lo = min(x, axis=-1, keepdims=true)
    n = norm(x, axis=-1)
    cm = max(x, axis=0)
}
op prodrow(x) -> y {
    y = x * prod(x, axis=-1, keepdims=true)
}
op lnorm2(x: f64[r, n], w: f64[n], b: f64[n]) -> y {
    xc = x - mean(x, axis=-1, keepdims=true)
    y = xc * rsqrt(mean(xc^2, axis=-1, keepdims=true) + 1e-5) * w + b
}
op dropmax(x: f64[r, n], p: nograd = 0.5) -> y {
    keep = random_uniform_like(x) >= p
    e = exp(x - max(x, axis=-1, keepdims=true))
    y = e / sum(e, axis=-1, keepdims=true) * keep
}
op sdot(x, t: nograd) -> s {
    e = exp(x - max(x, axis=-1, keepdims=true))
    s = sum(e / sum(e, axis=-1, keepdims=true) * t)
}
"""

def split_rows_module(import_module_text):
    """SPLIT_OPS as one module for every file that runs it (its kernels compiled once,
    Numba's cache beside it shared), its row plan taken by rows of any count."""
    import gradc
    module = import_module_text(gradc.compile_source(SPLIT_OPS, file="split.grad"),
                                "split_rows_ops")
    module._G_ROWS_MIN = 0
    return module


# the online form's tests (sums of exp(x - max(x)) in the pass of the max): SPLIT_OPS
# (softmax, log-softmax, cross-entropy, a draw, a sum of all elements), a log-softmax of
# an element value (kept in a stage row for the block's second loop) and a mean whose
# shift is not the max (its sum scaled by exp(max - h) after the pass), and shifts far
# from the max of a row of -inf or with +inf (a sum of 0 or inf kept: helper 42); the
# built-in log_softmax and logsumexps of x less a shift of its max (log(sum) + k - h),
# a sum of exp of x less two shifts in turn (the built-in log_softmax's gradient's), and
# two shifts far apart in size (subtracted in turn, not added first: helper 44)
ONLINE_OPS = SPLIT_OPS + """
op lsm2(x, w) -> y {
    z = x * w
    y = z - logsumexp(z, axis=-1, keepdims=true)
}
op mexp(x) -> y {
    h = max(x, axis=-1, keepdims=true) + 1.5
    y = x * mean(exp(x - h), axis=-1, keepdims=true)
}
op wfloor(x) -> y {
    m = max(x, axis=-1, keepdims=true)
    y = sum(exp(x - where(m > -inf, m, -1000)), axis=-1)
}
op wcap(x) -> y {
    y = mean(exp(x - min(max(x, axis=-1, keepdims=true), 1000)), axis=-1)
}
op lseh(x) -> y {
    y = logsumexp(x - (max(x, axis=-1, keepdims=true) + 2), axis=-1)
}
op lsefloor(x) -> y {
    m = max(x, axis=-1, keepdims=true)
    y = logsumexp(x - where(m > -inf, m, -1000), axis=-1)
}
op lsecap(x) -> y {
    y = logsumexp(x - min(max(x, axis=-1, keepdims=true), 1000), axis=-1)
}
op twoshift(x) -> y {
    m = max(x, axis=-1, keepdims=true)
    y = sum(exp((x - (m + 1)) - (m * 0.5 + 2)), axis=-1)
}
op twoprec(x) -> (a, b, c) {
    m = max(x, axis=-1, keepdims=true)
    a = logsumexp((x - m) - m * 1e-16, axis=-1)
    b = sum(exp((x - m) - m * 1e-16), axis=-1)
    c = logsumexp((x - m) - m, axis=-1)
}
"""

# logsumexps whose max is the row's less the shift (row_schedule.known_maxima): the
# built-in log_softmax, JAX's log_softmax written out, lse(x - max(x)) with the max's
# gradient
KNOWN_MAX_OPS = """
op lsmb(x) -> y {
    y = log_softmax(x, axis=-1)
}
op jlsm(x) -> y {
    s = x - stop_gradient(max(x, axis=-1, keepdims=true))
    y = s - logsumexp(s, axis=-1, keepdims=true)
}
op lkd(x) -> y {
    y = logsumexp(x - max(x, axis=-1, keepdims=true), axis=-1)
}
op bsmax(x) -> y {
    y = softmax(x, axis=-1)
}
op wrow(x, t: nograd) -> y {
    e = exp(x - max(x, axis=-1, keepdims=true))
    y = sum(-t * e * mean(x, axis=-1, keepdims=true) / sum(e, axis=-1, keepdims=true), axis=-1)
}
"""
ONLINE_OPS += KNOWN_MAX_OPS
