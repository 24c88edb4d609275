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
