"""Run-time helpers copied verbatim into every generated module that uses them.

Generated modules never import gradc, so :mod:`gradc.codegen.module` copies
the source of the helpers a module needs (``inspect.getsource``).  The IR
interpreter calls the same functions, so the oracle and the generated code
share one implementation.  Each helper uses only ``np`` (NumPy).
"""
from __future__ import annotations

import numpy as np


def _g_sum_to(g, shape):
    """Sum ``g`` down to ``shape`` (NumPy's un-broadcast), or broadcast it up.

    The adjoint of ``np.broadcast_to(x, g.shape)``: leading dims are summed
    away and dims where ``shape`` has 1 are summed with ``keepdims``.  A Dask
    array stays one (its sums are Dask's tree reductions, nothing computed).
    """
    shape = tuple(shape)
    if type(g) is not np.ndarray and not hasattr(g, "__dask_graph__"):
        g = np.asarray(g)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    # g's dims are shape's last ones (fewer: broadcast up, as NumPy aligns them; a
    # (5,) tangent to (1, 5) was summed over its 5 when aligned from the left)
    off = len(shape) - g.ndim
    axes = tuple(i - off for i, n in enumerate(shape)
                 if i >= off and n == 1 and g.shape[i - off] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    if type(g) is np.ndarray and g.shape == shape:
        return g                            # the sum's own array (broadcast_to: 3 us)
    return np.broadcast_to(g, shape)


def _g_shape_check(x, shape, message, got=None):
    """``x`` itself, after checking that ``shape`` broadcasts to ``got`` (``x``'s shape
    unless given).

    A custom gradient must have its parameter's shape, or a shape the parameter
    was broadcast to (it is then summed back): where shapes are known only at
    run time, this is the check (a smaller gradient would otherwise be broadcast
    up to the parameter, silently wrong).  Forward mode checks the gradient's shape
    ``got`` before its tangent ``x`` meets it: the transposed grad block broadcasts
    the tangent to that shape first, which would fail with NumPy's message.
    ``message`` names the gradient and the parameter, with ``{got}`` and ``{want}``
    fields for the shapes."""
    got, want = tuple(np.shape(x) if got is None else got), tuple(shape)
    if got == want:
        return x
    try:
        ok = np.broadcast_shapes(got, want) == got
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(message.format(got=got, want=want))
    return x


def _g_transpose(x):
    """``x`` transposed: a view (np.matmul passes it to BLAS as a transposed operand,
    where a copy of a 4096 x 1024 float32 array took 30 ms), copied to C order when
    it has fewer than 2^16 elements.  OpenBLAS multiplies small C-ordered matrices
    on one thread, but threads some small products with a transposed operand:
    (64, 128) @ (128, 64).T took 7-16 ms instead of 0.09 ms on a shared 2-core
    machine, where a woken thread waits for a core."""
    t = np.transpose(x)
    return t if t.size >= 65536 else np.asarray(t, order="C")


def _g_broadcast_in(a, shape, axis, keepdims):
    """Broadcast a reduction's result (or cotangent) back to the reduced shape.

    The adjoint of ``sum(x, axis, keepdims)``: re-insert the reduced axes when
    ``keepdims`` is false, then ``np.broadcast_to`` (a view, not a copy).
    """
    a = np.asarray(a)
    if not keepdims:
        ndim = len(shape)
        axes = range(ndim) if axis is None else sorted(ax % ndim for ax in axis)
        if a.ndim + len(axes) == ndim:      # np.expand_dims's shape, in a tenth of its time
            s = a.shape
            for ax in axes:
                s = (*s[:ax], 1, *s[ax:])
            a = a.reshape(s)
        else:
            for ax in axes:
                a = np.expand_dims(a, ax)
    return np.broadcast_to(a, tuple(shape))


def _g_logsumexp(x, axis, keepdims):
    """``log(sum(exp(x)))`` without overflow: the max is subtracted first.

    All-``-inf`` slices give ``-inf`` (not NaN); ``+inf`` anywhere gives ``+inf``.
    Source: the standard max-shift identity, as in ``scipy.special.logsumexp``.
    """
    x = np.asarray(x)
    m = np.max(x, axis=axis, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
    shift = np.where(np.isfinite(m), m, np.zeros_like(m))
    with np.errstate(divide="ignore"):
        s = np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift
    return s if keepdims else np.squeeze(s, axis=axis) if axis is not None else s.reshape(())


def _g_mean(x, axis, keepdims):
    """``np.mean(x, axis=axis, keepdims=keepdims)``; a mean over no elements is NaN
    without NumPy's "Mean of empty slice" RuntimeWarning (PyTorch's and JAX's means of
    an empty batch warn of nothing either).  For float32 and float64 arrays, NumPy's own
    steps without ``np.mean``'s dispatch (a fifth of its time at (8, 64), where the
    generic plan calls it between its kernels): ``add.reduce``, then a division by the
    count in place, in the array's dtype (NumPy divides by an ``intp`` in float64 and
    rounds: the same bits while the count is exact in the dtype, as a quotient of two
    float32 values rounded to float64 and then to float32 is the float32 quotient)."""
    x = np.asarray(x)
    n = 1
    for a in range(x.ndim) if axis is None else axis:
        n *= x.shape[a]
    if not n:
        with np.errstate(invalid="ignore"):
            return np.true_divide(np.sum(x, axis=axis, keepdims=keepdims), 0)
    if x.dtype.kind == "f" and x.dtype.itemsize >= 4 and n <= 1 << 24:
        s = np.add.reduce(x, axis=axis, keepdims=keepdims)
        if type(s) is np.ndarray:
            return np.divide(s, n, out=s)
        return s.dtype.type(s / n)          # a scalar, as np.mean's
    return np.mean(x, axis=axis, keepdims=keepdims)


def _g_norm(x, axis, keepdims):
    """Euclidean (Frobenius) norm over ``axis``, scaled so squares do not overflow."""
    x = np.asarray(x)
    scale = np.max(np.abs(x), axis=axis, keepdims=True) if x.size else np.ones((1,) * x.ndim, x.dtype)
    safe = np.where((scale > 0) & np.isfinite(scale), scale, np.ones_like(scale))
    r = np.sqrt(np.sum((x / safe) ** 2, axis=axis, keepdims=True)) * safe
    r = np.where(np.isinf(scale), scale, r)
    return r if keepdims else np.squeeze(r, axis=axis) if axis is not None else r.reshape(())


def _g_reduce(fn, x, axis, keepdims, dtype):
    """``fn(x, axis, keepdims)`` as an array of ``dtype`` (0-d for full reductions)."""
    return np.asarray(fn(x, axis=axis, keepdims=keepdims), dtype=dtype)


# The helpers the IR's registry uses as NumPy references (gradc.ir.primitives), so that
# the oracle and the generated code share one implementation, under public names: the
# ``_g_`` names are the generated module's namespace, for gradc/codegen alone.
sum_to = _g_sum_to
shape_check = _g_shape_check
broadcast_in = _g_broadcast_in
transpose = _g_transpose
logsumexp = _g_logsumexp
mean = _g_mean
norm = _g_norm
