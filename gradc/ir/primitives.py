"""The one registry of primitives: shapes, NumPy references, derivative rules
and code templates, as data.

Rule scope (as in PyTorch's derivatives.yaml header): a rule is a .grad
expression that may name the primitive's operands by parameter name, ``out``
(the primitive's result), ``g`` (the cotangent of ``out``) and the node's
attributes (``axis``, ``keepdims``).  ``vjp`` holds one rule per operand, or
None where no gradient flows (the operand is data, an index or a shape
source).  The engine un-broadcasts every rule's result to its operand's shape
and drops symbolic-zero cotangents before a rule runs, so rules handle
neither.  Rules whose form depends on static ranks (matmul) are composites in
:mod:`gradc.autodiff.rules`; their entry here is ``COMPOSITE``.

``jvp`` holds one forward-mode rule per operand (JAX's ``defjvp``): that
operand's contribution to the tangent of ``out``, linear in the operand's
tangent ``<param>_t`` (``x_t``); the engine sums the contributions of the
operands whose tangent is not a symbolic zero and broadcasts the sum to
``out``'s shape.  An elementwise primitive's Jacobian is diagonal, so where
its ``jvp`` is not written it is derived from its ``vjp`` with ``g`` read as
the operand's tangent (PyTorch's ``auto_element_wise``); the derived rules
are filled in when the table is built, so every primitive has its entry here.

Templates: ``cpu`` is a fully parenthesised Numba scalar expression; ``{x}``
fields are operand names and ``{dt}`` is the constructor of the node's dtype
(``_T`` for the float compute dtype).  ``lib`` is a NumPy expression used in
the host wrapper for primitives that are kernel boundaries (reductions,
matmul, layout).  Derivative sources: standard calculus; the tie and kink
conventions (``sign'(0) = 0``, ``abs'(0) = 0``, ties split evenly for
``maximum``/``minimum`` and the ``max``/``min`` reductions) follow PyTorch and
JAX (docs/numerics.md, *Kinks, ties and plateaus*); ``clip`` passes the gradient
on the closed interval ``[lo, hi]`` (``torch.clamp``); ``norm`` has gradient 0 at
0 (the minimum-norm subgradient).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import numpy as np

from gradc.codegen import prelude as P
from gradc.ir.shapes import (SCALAR, BroadcastError, Shape, affine, broadcast_static,
                             checked_axes, dim_op, matmul_static, reduce_static)

COMPOSITE = "<composite>"

# Kinds: how shape inference, fusion and code generation treat a primitive.
ELEMENTWISE = "elementwise"   # fusable into one loop
REDUCTION = "reduction"       # axis/keepdims attrs; a kernel boundary
LIBRARY = "library"           # matmul and layout: a kernel boundary
SOURCE = "source"             # param, const
DECOMPOSED = "decomposed"     # a builtin that is its decomposition in every graph (never a node)

# Test-sampling domains.
REAL, POSITIVE, UNIT, ABOVE_ONE, NONZERO = "real", "positive", "unit", "above_one", "nonzero"


@dataclass(frozen=True)
class Primitive:
    name: str
    params: tuple[str, ...]
    kind: str
    ref: Callable | None
    vjp: tuple[str | None, ...] = ()
    jvp: tuple[str | None, ...] = ()   # per operand; derived from vjp when elementwise
    # The Numba scalar template; or a function of NumPy values whose body the printers
    # inline as statements (printer.inline_body; random_uniform's generator), which is
    # then also the reference's code.
    cpu: str | Callable | None = None
    lib: str | None = None
    float_only: bool = True        # operands are cast to the float dtype first
    dtype: str = "float"           # "float" | "same" (of the operands) | "i64"
    domain: str = REAL
    differentiable: bool = True    # False: no gradient flows (nothing to test)
    shape_only: tuple[int, ...] = ()   # operands whose values are never read, only shapes
    # Linearity (for checking and transposing VJPs): the operands in which the
    # primitive is linear when every other operand is held fixed. Jointly
    # linear (``add``: f(a + b) = f(a) + f(b) in all of them together) unless
    # ``multilinear`` (``mul``, ``matmul``: linear in each one separately).
    linear: tuple[int, ...] = ()
    multilinear: bool = False
    # Operands read only by a test that scaling them by a nonzero number does not
    # change (``zero_masked``'s ``u == 0``): linearity in the other operands is kept
    # where these depend on the same sources linearly.
    scale_tested: tuple[int, ...] = ()
    # Attributes (beyond a reduction's axis and keepdims) passed to ``ref``, the
    # library template and every lowering as keywords: (name, kind, default); kinds
    # "axis" (an int or tuple), "bool", "internal" (rules only, never a .grad keyword).
    keywords: tuple[tuple[str, str, object], ...] = ()
    # A builtin of the .grad language under its own name and these aliases
    # (frontend.builtins derives its table, and so the syntax files, from these).
    public: bool = False
    aliases: tuple[str, ...] = ()
    # The result has operand ``shape_like``'s shape class (else the kind's rule, or
    # ``static_shape``: a function of the operands' Shapes and the attributes giving
    # the result's Shape, None where it is known only at run time; ``np_shape``
    # computes it then from the operands' shape tuples and the attributes, in the
    # wrappers of generated modules, which it is copied into).
    shape_like: int | None = None
    static_shape: Callable | None = None
    np_shape: Callable | None = None
    # Takes a reduction's ``axis`` and ``keepdims`` attributes (the reductions, and
    # broadcast_in, their adjoint); passed to ``ref``, the templates and the lowerings.
    axis_keepdims: bool = False
    # Trailing operands with a default, which a call may leave out or pass by keyword
    # (``random_uniform_like(x, lo=-1)``): (name, default).
    optional: tuple[tuple[str, float], ...] = ()
    # A builtin that draws random numbers: its decomposition's scope also holds the op's
    # ``seed`` and ``offset`` source nodes and a ``stream`` of its own (ir.expr).
    draws: bool = False
    # The operands whose dtypes a "same"-dtype primitive unifies (None: all), the
    # others being a condition or read for their shapes only (``where``'s ``c``).
    value_operands: tuple[int, ...] | None = None
    # A bound on ``|out|`` for every operand that is not NaN, ±inf included (sigmoid: 1),
    # for simplify's interval arithmetic (passes.simplify.bound).
    value_bound: float | None = None
    # Attributes passed as trailing positional arguments (``one_hot(idx, depth)``):
    # constant expressions, each also one of ``keywords``.
    attr_params: tuple[str, ...] = ()
    index_operands: tuple[int, ...] = ()  # operands that must be integer arrays
    # Whether the library call may refuse a call whose arguments passed the wrapper's
    # checks (NumPy: an empty max, a custom gradient's shape check, a matmul's shapes).
    # False for those that only move values between shapes they were broadcast from or
    # to, a shape ratio, a cast, a transpose: a result computed before them may go
    # straight into ``out=`` (codegen.wrappers).
    may_refuse: bool = True
    # A library primitive whose result is operand ``passes_operand``'s very array where
    # their shapes match, else a new array (never a view that moves elements): a kernel
    # reading the result element by element reads that operand's, so out= may be the
    # operand's array where it may be the operand's own (codegen.wrappers).
    passes_operand: int | None = None
    # Lowerings of a library primitive, beside ``lib`` (the CPU host call):
    helpers: tuple[Callable, ...] = ()   # run-time functions ``lib`` and ``dask`` call (copied)
    cuda: str | None = None              # the call on device arrays (``stream`` in scope)
    cuda_helpers: tuple[Callable, ...] = ()   # host functions ``cuda`` calls (copied)
    # CUDA kernels (copied under @cuda.jit), each with its PTX signatures: a function
    # of (numba.types, the float type) giving argument-type tuples.
    cuda_kernels: tuple[tuple[Callable, Callable], ...] = ()
    # The function of Dask arrays (copied into modules): (compute dtype, *operands, **attrs).
    dask: Callable | None = None
    # The function of jax.numpy arrays and of torch tensors, or its dotted name
    # ("jnp.tanh", "torch.tanh"; adapters.framework_lowering resolves it).
    jax: Callable | str | None = None
    torch: Callable | str | None = None

    @property
    def attrs(self) -> tuple[str, ...]:
        """The names of the keyword attributes (see ``keywords``)."""
        return tuple(k for k, _, _ in self.keywords)

    @property
    def attr_names(self) -> tuple[str, ...]:
        """Every attribute the lowerings take: ``axis`` and ``keepdims`` (see
        ``axis_keepdims``), then the keywords."""
        return ("axis", "keepdims") * self.axis_keepdims + self.attrs

    @property
    def defaults(self) -> dict[str, object]:
        return {k: d for k, _, d in self.keywords}

    # Statements in .grad syntax over the operands (by parameter name) and attributes,
    # assigning ``out``: the primitive written in others, which the graphs that are
    # differentiated use instead (passes.simplify.expand_decompositions).
    decomposition: str | None = None

    def __post_init__(self) -> None:
        if not self.jvp and self.kind == ELEMENTWISE:
            object.__setattr__(self, "jvp", tuple(
                None if r is None else re.sub(r"\bg\b", f"{p}_t", r)
                for p, r in zip(self.params, self.vjp)))

    @property
    def masks_zero_cotangent(self) -> bool:
        """Whether a zero cotangent must give a zero contribution even where the
        local derivative is inf or NaN (0 * inf = NaN would otherwise leak from
        the unselected branch of a ``where``); false for bounded derivatives.
        Reduction rules are written safe instead (see ``prod``, ``logsumexp``)."""
        return self.kind == ELEMENTWISE and self.differentiable and self.name not in _BOUNDED


# Primitives whose local derivatives are finite for every non-NaN operand,
# ±inf included: their cotangent needs no zero mask. (Not sin/cos: cos(inf) is
# NaN; not square: 2 * inf.)
_BOUNDED = frozenset("""add sub neg identity cast where clip full_like abs maximum minimum
    atan tanh sigmoid softplus erf erfc sum mean max min transpose sum_to
    broadcast_in matmul shape_check shape_check_of zero_masked""".split())


def _ew(name, params, ref, vjp, cpu, **kw) -> Primitive:
    return Primitive(name, tuple(params.split()), ELEMENTWISE, ref, tuple(vjp), cpu=cpu, **kw)


def _unary(name, ref, vjp, cpu, **kw) -> Primitive:
    kw.setdefault("public", True)       # a builtin of the language, but for neg, cast, identity
    return _ew(name, "x", ref, (vjp,), cpu, **kw)


def _cmp(name, ufunc, sym) -> Primitive:
    return _ew(name, "x y", lambda x, y: ufunc(x, y).astype(np.result_type(x, y)),
               (None, None), f"{{dt}}({{x}} {sym} {{y}})", float_only=False, dtype="same",
               differentiable=False, value_bound=1.0, jax=f"jnp.{ufunc.__name__}",
               torch=f"torch.{name}")


def _red(name, ref, local, lib, helpers=(), **kw) -> Primitive:
    """A reduction whose derivative is ``local`` (d out / d x, elementwise over
    ``x``, ``bc(...)`` for reduced values broadcast back): VJP ``bc(g) * local``,
    JVP ``sum(x_t * (local))`` over the reduced axes (``local`` first: the
    tangent times ``x`` may overflow where their quotient by the norm would not).
    ``local`` is None where ``kw`` give both rules.  Every reduction has the shape
    rules and the Dask run time of reductions, and the CUDA run time's reduction of its
    name."""
    rules = {"public": True}
    if local is not None:
        rules |= {"vjp": (_bc(f"bc(g) * {local}"),),
                  "jvp": (_bc(f"sum(x_t * ({local}), axis=axis, keepdims=keepdims)"),)}
    return Primitive(name, ("x",), REDUCTION, ref, lib=lib, **{**rules, **kw},
                     axis_keepdims=True, static_shape=_reduce_static, np_shape=_g_reduce_shape,
                     helpers=(_gd_array, _gd_reduce, _gd_kept, *helpers),
                     cuda=f"_gc_reduce({name!r}, {{x}}, {{axis!r}}, {{keepdims!r}}, stream)")


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.asarray(x).dtype])(x)


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[np.asarray(x).dtype])(x)


def _where(c, x, y):
    return np.where(np.asarray(c) != 0, x, y)


def _maximum(x, y):
    return np.maximum(x, y)


_BC = "broadcast_in({v}, x, axis=axis, keepdims=keepdims)"
_ALONG = "axis=axis, keepdims=keepdims"


def _bc(expr: str) -> str:
    """Expand ``bc(v)``: broadcast a reduced value back to the operand's shape."""
    out = expr
    while "bc(" in out:
        i = out.index("bc(")
        depth, j = 0, i + 2
        while True:
            depth += {"(": 1, ")": -1}.get(out[j], 0)
            if depth == 0:
                break
            j += 1
        out = out[:i] + _BC.format(v=out[i + 3:j]) + out[j + 1:]
    return out


# max and min: k tied extremes share the cotangent (1/k each). The cotangent is
# selected, not multiplied by the 0/1 tie mask, so an infinite one does not give
# inf * 0 = NaN to the elements that are not the extreme. A slice whose extreme is
# NaN has no element equal to it (n = 0): its gradient is NaN (n / n), as JAX and
# torch.amax give.
_TIES = "sum(x == bc(out), axis=axis, keepdims=keepdims)"
_TIE_RULES = {
    "vjp": (_bc(f"where(x == bc(out), bc(g / {_TIES}), bc(where({_TIES} > 0, 0, "
                f"{_TIES} / {_TIES})))"),),
    "jvp": (_bc(f"sum(where(x == bc(out), x_t, 0), axis=axis, keepdims=keepdims) / {_TIES}"),)}


# --- shapes of the reductions, matmul and layout, and their Dask lowerings -------
# ``static_shape`` works on shape classes at compile time; ``np_shape`` (a ``_g_``
# function, copied into modules) on shape tuples at run time: in the wrappers, for a
# value needed only for its shape, and in the CUDA and Dask run times.


def _reduce_static(shapes, attrs):
    (s,) = shapes
    if attrs.get("axis") is None and not attrs.get("keepdims"):
        return SCALAR
    return None if s.dyn else Shape(reduce_static(s.static, attrs.get("axis"),
                                                  attrs.get("keepdims")))


def _g_reduce_shape(x, axis=None, keepdims=False):
    """The shape of a reduction over ``axis`` of an array of shape ``x``; ValueError as
    NumPy's for an axis out of bounds."""
    nd = len(x)
    if axis == (-1,) and nd:                # a row reduction's, at every call of one
        return (*x[:-1], 1) if keepdims else tuple(x[:-1])
    for ax in axis or ():
        if not -nd <= ax < nd:          # NumPy's AxisError (a ValueError, an IndexError)
            raise getattr(np, "exceptions", np).AxisError(
                f"axis {ax} is out of bounds for array of dimension {nd}")
    axes = range(nd) if axis is None else [ax % nd for ax in axis]
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(x))
    return tuple(d for i, d in enumerate(x) if i not in axes)


def _matmul_static(shapes, attrs):
    x, y = shapes
    return None if x.dyn or y.dyn else Shape(matmul_static(x.static, y.static))


def _g_matmul_shape(x, y):
    """The shape of ``np.matmul(a, b)`` for ``a``, ``b`` of shapes ``x``, ``y`` (rank 1
    or more; a 1-d operand promoted and its added dim removed, batch dims broadcast);
    ValueError for a 0-d operand, contracted dims that differ, batch dims that do not
    broadcast."""
    x, y = tuple(int(n) for n in x), tuple(int(n) for n in y)
    if not x or not y:
        raise ValueError(f"matmul: operands of shapes {x} and {y}: a 0-d operand has no "
                         f"dim to contract")
    x2 = (1,) + x if len(x) == 1 else x
    y2 = y + (1,) if len(y) == 1 else y
    if x2[-1] != y2[-2]:
        raise ValueError(f"matmul: operands of shapes {x} and {y}: contracted dims "
                         f"{x2[-1]} and {y2[-2]} differ")
    try:
        batch = np.broadcast_shapes(x2[:-2], y2[:-2])
    except ValueError:
        raise ValueError(f"matmul: operands of shapes {x} and {y}: batch dims {x2[:-2]} "
                         f"and {y2[:-2]} do not broadcast") from None
    return tuple(batch) + x2[-2:-1] * (len(x) > 1) + y2[-1:] * (len(y) > 1)


def _g_transpose_shape(x):
    """The shape of an array of shape ``x`` transposed (also its static rule)."""
    return tuple(x)[::-1]


def _scalar_static(shapes, attrs):
    return SCALAR


def _g_scalar_shape(x, y):
    """A 0-d result's shape (``size_ratio``)."""
    return ()


def _gd_array(x):
    """``x`` as a Dask array (a NumPy value as one chunk)."""
    import dask.array as da
    return x if hasattr(x, "__dask_graph__") else da.asarray(x)


def _gd_named(*args, fn, op, **kwargs):
    """``fn(*args, **kwargs)`` in a Dask task (``map_blocks``' or ``blockwise``'s
    keywords ``fn`` and ``op``): a ValueError or IndexError it raises when the task
    runs (an index out of range) named after the op's method ``op``, as the in-memory
    methods name theirs."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, IndexError) as exc:
        if op is None or str(exc).startswith(f"{op}: "):
            raise
        raise (IndexError if isinstance(exc, IndexError) else ValueError)(f"{op}: {exc}") \
            from exc


def _gd_reduce(fn, x, axis, keepdims, empty):
    """``np.<fn>`` (sum, mean, prod, max, min) of an array as a Dask array (tree
    reductions), in its dtype; ``empty``: the value of a max or min of nothing
    (NumPy's ``initial=``; None: Dask's error).  Of an empty array the result is an
    empty array where its shape is empty too (a max of each of 0 rows, which Dask's
    ``max`` refuses, NumPy's not), else ``empty``."""
    import dask.array as da
    x = _gd_array(x)
    if x.size == 0:
        shape = _g_reduce_shape(x.shape, axis, keepdims)
        if empty is not None or 0 in shape:
            return da.full(shape, 0 if empty is None else empty, dtype=x.dtype)
        if fn in ("max", "min"):        # at the call, as in memory: the shapes are known
            raise ValueError(f"zero-size array to reduction operation "
                             f"{fn}imum which has no identity")
    return getattr(da, fn)(x, axis=axis, keepdims=keepdims).astype(x.dtype)


def _gd_sum(t, x, axis=None, keepdims=False):
    return _gd_reduce("sum", x, axis, keepdims, None)


def _gd_mean(t, x, axis=None, keepdims=False):
    return _gd_reduce("mean", x, axis, keepdims, None)


def _gd_prod(t, x, axis=None, keepdims=False):
    return _gd_reduce("prod", x, axis, keepdims, None)


def _gd_max(t, x, axis=None, keepdims=False, empty_ok=False):
    return _gd_reduce("max", x, axis, keepdims, -np.inf if empty_ok else None)


def _gd_min(t, x, axis=None, keepdims=False, empty_ok=False):
    return _gd_reduce("min", x, axis, keepdims, np.inf if empty_ok else None)


def _gd_kept(r, axis, keepdims):
    """``r``, reduced with keepdims over ``axis``, without those dims unless ``keepdims``."""
    import dask.array as da
    if keepdims:
        return r
    return da.squeeze(r, axis=axis) if axis is not None else r.reshape(())


def _gd_logsumexp(t, x, axis=None, keepdims=False):
    """:func:`_g_logsumexp` of a Dask array."""
    import dask.array as da
    x = _gd_array(x)
    m = da.max(x, axis=axis, keepdims=True) if x.size else da.zeros((1,) * x.ndim, x.dtype)
    shift = da.where(da.isfinite(m), m, 0).astype(x.dtype)
    return _gd_kept(da.log(da.sum(da.exp(x - shift), axis=axis, keepdims=True)) + shift,
                    axis, keepdims)


def _gd_norm(t, x, axis=None, keepdims=False):
    """:func:`_g_norm` of a Dask array."""
    import dask.array as da
    x = _gd_array(x)
    scale = da.max(abs(x), axis=axis, keepdims=True) if x.size else \
        da.ones((1,) * x.ndim, x.dtype)
    safe = da.where((scale > 0) & da.isfinite(scale), scale, 1).astype(x.dtype)
    r = da.sqrt(da.sum((x / safe) ** 2, axis=axis, keepdims=True)) * safe
    return _gd_kept(da.where(da.isinf(scale), scale, r), axis, keepdims)


def _gd_matmul(t, x, y):
    """``np.matmul`` of Dask arrays (batch dims broadcast, blockwise), the contracted
    axes rechunked whole: each block of the product is one matrix product."""
    import dask.array as da
    x, y = _gd_array(x), _gd_array(y)
    _g_matmul_shape(x.shape, y.shape)          # NumPy's ValueError before any graph
    return da.matmul(x.rechunk({x.ndim - 1: -1}), y.rechunk({max(y.ndim - 2, 0): -1}))


def _gd_transpose(t, x):
    import dask.array as da
    return da.transpose(_gd_array(x))


def _gd_sum_to(t, x, like):
    return _g_sum_to(_gd_array(x), tuple(like.shape))


def _gd_broadcast_in(t, x, like, axis=None, keepdims=False):
    import dask.array as da
    x = _gd_array(x)
    shape = tuple(like.shape)
    if not keepdims:
        for ax in range(len(shape)) if axis is None else sorted(a % len(shape) for a in axis):
            x = da.expand_dims(x, ax)
    return da.broadcast_to(x, shape)


def _gd_size_ratio(t, x, y):
    return t(math.prod(x.shape) / max(math.prod(y.shape), 1))


def _gd_shape_check(t, x, like, message=None):
    return _g_shape_check(x, tuple(like.shape), message)


def _gd_shape_check_of(t, x, got, like, message=None):
    return _g_shape_check(x, tuple(like.shape), message, tuple(got.shape))


# --- JAX and PyTorch: the functions that are not one of the frameworks' own --------
# (those are named by their dotted names, "jnp.tanh"; adapters.framework_lowering
# resolves them). Each imports its framework when called: both are optional.


def _same(x):
    return x


def _jax_clip(x, lo, hi):
    import jax.numpy as jnp
    return jnp.minimum(jnp.maximum(x, lo), hi)


def _torch_clip(x, lo, hi):
    import torch
    return torch.minimum(torch.maximum(x, lo), hi)


def _jax_full_like(x, v):
    import jax.numpy as jnp
    return jnp.broadcast_to(v, jnp.shape(x))


def _torch_full_like(x, v):
    return v.expand(x.shape).contiguous()


def _torch_stop_gradient(x):
    return x.detach()


def _jax_zero_masked(x, u):
    import jax.numpy as jnp
    return jnp.where((u == 0) & jnp.isnan(x), jnp.zeros_like(x), x)


def _torch_zero_masked(x, u):
    import torch
    return torch.where((u == 0) & torch.isnan(x), torch.zeros_like(x), x)


def _torch_dims(fn, x, axis, keepdims):
    """``fn`` (a torch reduction taking ``dim``) over ``axis`` (None: all)."""
    dim = tuple(range(x.ndim)) if axis is None else tuple(axis)
    return fn(x, dim=dim, keepdim=keepdims) if dim else x


def _torch_sum(x, axis=None, keepdims=False):
    import torch
    return _torch_dims(torch.sum, x, axis, keepdims)


def _torch_mean(x, axis=None, keepdims=False):
    import torch
    return _torch_dims(torch.mean, x, axis, keepdims)


def _torch_extreme(fn, x, axis, keepdims, initial):
    """``fn`` (torch.amax, torch.amin) over ``axis``, with NumPy's ``initial=`` (the value
    of an empty slice, and a bound on the others: softmax's shift, -inf)."""
    import torch
    if initial is not None and x.numel() == 0:
        shape = _g_reduce_shape(tuple(x.shape), None if axis is None else tuple(axis), keepdims)
        return torch.full(shape, initial, dtype=x.dtype, device=x.device)
    r = _torch_dims(fn, x, axis, keepdims)
    if initial is None:
        return r
    return torch.clamp(r, min=initial) if fn is torch.amax else torch.clamp(r, max=initial)


def _torch_max(x, axis=None, keepdims=False, initial=None):
    import torch
    return _torch_extreme(torch.amax, x, axis, keepdims, initial)


def _torch_min(x, axis=None, keepdims=False, initial=None):
    import torch
    return _torch_extreme(torch.amin, x, axis, keepdims, initial)


def _torch_logsumexp(x, axis=None, keepdims=False):
    import torch
    return _torch_dims(torch.logsumexp, x, axis, keepdims)


def _torch_prod(x, axis=None, keepdims=False):
    if axis is None:
        out = x.prod()
        return out.reshape((1,) * x.ndim) if keepdims else out
    for ax in sorted((a % x.ndim for a in axis), reverse=True):
        x = x.prod(dim=ax, keepdim=keepdims)
    return x


def _jax_norm(x, axis=None, keepdims=False):
    """``norm`` in JAX as :func:`gradc.codegen.prelude._g_norm` computes it: scaled by
    the largest |x| (a constant to JAX's derivatives), so that squares of 1e20 in
    float32 do not overflow nor those of 1e-25 underflow (``jnp.linalg.vector_norm``
    squares first)."""
    import jax
    import jax.numpy as jnp
    scale = jax.lax.stop_gradient(jnp.max(jnp.abs(x), axis=axis, keepdims=True, initial=0))
    safe = jnp.where((scale > 0) & jnp.isfinite(scale), scale, jnp.ones_like(scale))
    r = jnp.where(jnp.isinf(scale), scale,
                  jnp.sqrt(jnp.sum((x / safe) ** 2, axis=axis, keepdims=True)) * safe)
    return r if keepdims else r.reshape(()) if axis is None else jnp.squeeze(r, axis=axis)


def _torch_norm(x, axis=None, keepdims=False):
    """``norm`` in PyTorch, scaled as :func:`_jax_norm` (``torch.linalg.vector_norm``
    squares first)."""
    import torch
    dims = tuple(range(x.ndim)) if axis is None else \
        tuple(d % x.ndim for d in ((axis,) if isinstance(axis, int) else axis))
    if all(x.shape[d] for d in dims):
        scale = torch.amax(x.detach().abs(), dim=dims, keepdim=True)
    else:                                   # an empty slice: norm 0, as NumPy's
        scale = x.new_zeros([1 if d in dims else n for d, n in enumerate(x.shape)])
    safe = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
    r = torch.where(torch.isinf(scale), scale,
                    torch.sqrt(torch.sum((x / safe) ** 2, dim=dims, keepdim=True)) * safe)
    return r if keepdims else r.reshape(()) if axis is None else r.squeeze(dims)


def _torch_transpose(x):
    return x.permute(*reversed(range(x.ndim)))


def unbroadcast(g, shape: tuple, total, broadcast_to):
    """Sum ``g`` down to ``shape`` (leading dims, and dims of size 1), or broadcast up:
    ``sum_to`` with a framework's ``total(a, axes, keepdims)`` and ``broadcast_to``."""
    gshape = tuple(g.shape)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    if lead > 0:
        g = total(g, tuple(range(lead)), False)
    axes = tuple(i for i, n in enumerate(shape)
                 if n == 1 and i < len(g.shape) and g.shape[i] != 1)
    if axes:
        g = total(g, axes, True)
    return g if tuple(g.shape) == shape else broadcast_to(g, shape)


def jax_sum_to(g, shape: tuple):
    """NumPy's un-broadcast of a JAX array ``g`` to ``shape``."""
    import jax.numpy as jnp
    return unbroadcast(g, tuple(shape), lambda a, axes, kd: jnp.sum(a, axis=axes, keepdims=kd),
                       jnp.broadcast_to)


def torch_sum_to(g, shape: tuple):
    """NumPy's un-broadcast of a tensor ``g`` to ``shape``."""
    return unbroadcast(g, tuple(shape), lambda a, axes, kd: a.sum(dim=axes, keepdim=kd),
                       lambda a, s: a.expand(s).contiguous())


def _jax_sum_to(x, like):
    import jax.numpy as jnp
    return jax_sum_to(x, jnp.shape(like))


def _torch_sum_to(x, like):
    return torch_sum_to(x, tuple(like.shape))


def _expand(x, ndim: int, axis, keepdims: bool, expand_dims):
    """A reduction's result with its reduced dims back (as 1s) unless ``keepdims``."""
    if keepdims:
        return x
    for ax in range(ndim) if axis is None else sorted(a % ndim for a in axis):
        x = expand_dims(x, ax)
    return x


def _jax_broadcast_in(x, like, axis=None, keepdims=False):
    import jax.numpy as jnp
    return jnp.broadcast_to(_expand(x, jnp.ndim(like), axis, keepdims, jnp.expand_dims),
                            jnp.shape(like))


def _torch_broadcast_in(x, like, axis=None, keepdims=False):
    import torch
    return _expand(x, like.ndim, axis, keepdims, torch.unsqueeze).expand(like.shape)


def _jax_size_ratio(x, y):
    """mean's 1/n, in float64 (cast to the graph's float dtype where it is used: a
    float32 constant here rounded float64 gradients to float32's 1/3)."""
    return np.float64(np.size(x) / max(np.size(y), 1))


def _torch_size_ratio(x, y):
    import torch
    return torch.tensor(x.numel() / max(y.numel(), 1), dtype=torch.float64)


def _jax_shape_check(x, like, message=None):
    import jax.numpy as jnp
    return P.shape_check(x, jnp.shape(like), message)


def _torch_shape_check(x, like, message=None):
    return P.shape_check(x, tuple(like.shape), message)


def _jax_shape_check_of(x, got, like, message=None):
    import jax.numpy as jnp
    return P.shape_check(x, jnp.shape(like), message, jnp.shape(got))


def _torch_shape_check_of(x, got, like, message=None):
    return P.shape_check(x, tuple(like.shape), message, tuple(got.shape))


# Computed on the host from shapes, device arrays too (their CUDA call is the same).
_SIZE_RATIO = "_T({x}.size / max({y}.size, 1))"
_SHAPE_CHECK = "_g_shape_check({x}, {like}.shape, {message!r})"
_SHAPE_CHECK_OF = "_g_shape_check({x}, {like}.shape, {message!r}, {got}.shape)"

# max(x, lo) of clip's template, NaN when x or lo is (np.maximum's rule).
_CLIP_LO = "({lo} if ({x} < {lo} or {lo} != {lo}) else {x})"

# --- cumsum: the inclusive scan along one axis ------------------------------------
# Everything about the primitive is here: the NumPy reference (also the CPU run
# time), the CUDA kernel and its host call, the Dask, JAX and PyTorch lowerings,
# and the entry with its derivative rules.  The VJP of a scan is the scan of the
# cotangent in the other direction (JAX's cumsum transpose: reverse=not reverse).


def _g_scan_axis(ndim, axis):
    """The axis a scan runs along, from ``axis`` (a 1-tuple, or None for a 1-d array),
    non-negative; ValueError as NumPy's for one out of bounds."""
    if axis is None:
        if ndim != 1:
            raise ValueError(f"cumsum of an array of rank {ndim} needs axis= (only a 1-d "
                             "array may leave it out)")
        return 0
    if not -ndim <= axis[0] < ndim:
        raise getattr(np, "exceptions", np).AxisError(
            f"axis {axis[0]} is out of bounds for array of dimension {ndim}")
    return axis[0] % ndim


def _g_cumsum(x, axis, reverse):
    """Inclusive cumulative sum of ``x`` along ``axis`` (a 1-tuple, or None for a
    1-d ``x``), from the last element when ``reverse``, in ``x``'s dtype (as
    ``np.cumsum``: sequential, not pairwise, summation)."""
    return _g_flip_scan(np.cumsum, x, axis, reverse)


def _g_flip_scan(scan, x, axis, reverse):
    """``scan`` (``np.cumsum``, ``np.cumprod``) of ``x`` along ``axis`` in ``x``'s dtype,
    from the last element when ``reverse``."""
    x = np.asarray(x)
    ax = _g_scan_axis(x.ndim, axis)
    if reverse:
        return np.ascontiguousarray(np.flip(scan(np.flip(x, ax), axis=ax, dtype=x.dtype), ax))
    return scan(x, axis=ax, dtype=x.dtype)


def _one_axis(what, s, axis):
    """Check at compile time the ``axis`` of a primitive that runs along one axis (a
    scan, a sort, argmax, a gather): one axis (NumPy's raises for a tuple), inside
    ``s``'s rank where it is known (BroadcastError: the builder's E301)."""
    if axis is not None and len(axis) != 1:
        raise BroadcastError(f"{what} take one axis (NumPy's), got {axis}")
    if axis is not None and not s.dyn:
        _statically(_g_scan_axis, len(s.static), axis)


def _scan_static(shapes, attrs):
    """A scan's result: its last operand's shape (``shape_like``), its one axis checked."""
    _one_axis("cumsum and cumprod", shapes[-1], attrs["axis"])
    return shapes[-1]


def _gck_scan(out, a, x, lines, n, inner, reverse, scaled):
    """One thread per line of ``n`` elements (stride ``inner``) of the C-ordered
    ``x``: the running sum in float64 (``scaled``: the recurrence of ``linear_scan``,
    the sum so far times ``a``'s element first), stored in ``out``'s dtype."""
    i = cuda.grid(1)
    if i < lines:
        base = (i // inner) * n * inner + i % inner
        acc = 0.0
        for j in range(n):
            k = base + (n - 1 - j if reverse else j) * inner
            acc = x[k] + (a[k] * acc if scaled and j else acc)
            out[k] = acc


def _gc_cumsum(x, axis, reverse, stream):
    """:func:`_g_cumsum` on the device (``_gck_scan``)."""
    x = _gc_dev(x, stream)
    ax = _g_scan_axis(x.ndim, axis)
    n = x.shape[ax]
    inner = math.prod(x.shape[ax + 1:])
    out = _gc_empty(x.shape, x.dtype, stream)
    lines = x.size // n if n else 0
    if lines:
        flat = _gc_ravel(x)
        _gck_scan[_gc_blocks(lines), _GC_BLOCK, stream](
            _gc_ravel(out), flat, flat, lines, n, inner, bool(reverse), False)
    return out


def _gd_cumsum(t, x, axis, reverse):
    """:func:`_g_cumsum` of a Dask array (Dask's blocked scan)."""
    import dask.array as da
    ax = _g_scan_axis(x.ndim, axis)
    if reverse:
        return da.flip(da.cumsum(da.flip(x, ax), axis=ax, dtype=x.dtype), ax)
    return da.cumsum(x, axis=ax, dtype=x.dtype)


def _jax_cumsum(x, axis, reverse):
    import jax
    return jax.lax.cumsum(x, axis=0 if axis is None else axis[0] % x.ndim, reverse=bool(reverse))


def _torch_cumsum(x, axis, reverse):
    import torch
    ax = 0 if axis is None else axis[0] % x.ndim
    if reverse:
        return torch.flip(torch.cumsum(torch.flip(x, (ax,)), ax), (ax,))
    return torch.cumsum(x, ax)


def _scan_signatures(types, t):
    flat = types.Array(t, 1, "C")
    return [(flat, flat, flat, types.int64, types.int64, types.int64, types.boolean,
             types.boolean)]


CUMSUM = Primitive(
    "cumsum", ("x",), LIBRARY, _g_cumsum,
    vjp=("cumsum(g, axis=axis, reverse=1 - reverse)",),
    jvp=("cumsum(x_t, axis=axis, reverse=reverse)",),
    lib="_g_cumsum({x}, {axis!r}, {reverse!r})",
    helpers=(_g_scan_axis, _g_flip_scan, _g_cumsum),
    cuda="_gc_cumsum({x}, {axis!r}, {reverse!r}, stream)", cuda_helpers=(_gc_cumsum,),
    cuda_kernels=((_gck_scan, _scan_signatures),),
    dask=_gd_cumsum, jax=_jax_cumsum, torch=_torch_cumsum,
    float_only=False, dtype="same", linear=(0,), shape_like=0, static_shape=_scan_static,
    keywords=(("axis", "axis", None), ("reverse", "bool", False)),
    public=True, aliases=("cumulative_sum",))


# --- one_hot: integer labels as rows of an identity ------------------------------
# one_hot(idx, depth)[..., j] = (idx == j), in the float compute dtype (as
# jax.nn.one_hot); an index outside [0, depth) is an IndexError (as
# torch.nn.functional.one_hot; JAX's XLA lowering gives a row of zeros there, as
# jax.nn.one_hot does, since a jitted function cannot raise).  No gradient flows to
# integer indices.  A builtin that is its decomposition, as eye is: the comparison of
# the checked labels with arange(depth), which fuses into the kernel that reads it (a
# cross-entropy's gradient never holds the n x depth one-hot).  one_hot_labels checks
# the labels (a library call on n integers) and passes them on.


def _g_one_hot_labels(idx, depth):
    """The NumPy array ``idx`` itself; IndexError unless its every index is in
    [0, depth)."""
    idx = np.asarray(idx)
    if idx.size:
        lo, hi = idx.min(), idx.max()
        if lo < 0 or hi >= depth:
            raise IndexError(f"one_hot: index {lo if lo < 0 else hi} is out of range for "
                             f"depth {depth} (indices must be in [0, {depth}))")
    return idx


def _np_one_hot(idx, depth):
    """The reference: ``one_hot(idx, depth)`` as NumPy computes it (float64)."""
    return (_g_one_hot_labels(idx, depth)[..., None] == np.arange(depth)).astype(np.float64)


def _gc_one_hot_labels(idx, depth, stream):
    """:func:`_g_one_hot_labels` of a device array: the indices read back to the host
    (one integer per row: small beside the rows they select), the array passed on."""
    idx = _gc_dev(idx, stream)
    _g_one_hot_labels(idx.copy_to_host(stream=stream), depth)
    return idx


def _gd_one_hot_labels(t, idx, depth, *, op=None):
    """:func:`_g_one_hot_labels` of a Dask array, block by block (its IndexError named
    after the method ``op`` when the block is computed)."""
    import dask.array as da
    return da.map_blocks(_gd_named, idx, depth, fn=_g_one_hot_labels, op=op, dtype=idx.dtype)


def _jax_one_hot_labels(idx, depth):
    return idx          # unchecked: the comparison gives jax.nn.one_hot's zero row


def _torch_one_hot_labels(idx, depth):
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= depth):
        _g_one_hot_labels(idx.detach().cpu().numpy(), depth)      # its IndexError
    return idx


def _one_hot_static(shapes, attrs):
    (s,) = shapes
    depth = attrs["depth"]
    if not hasattr(depth, "name") and (isinstance(depth, bool) or not isinstance(depth, int)
                                       or depth < 0):
        raise BroadcastError(f"one_hot: depth must be a non-negative integer, got {depth!r}")
    return s


_ONE_HOT_DEPTH = (("depth", "int", None),)
ONE_HOT = (
    Primitive("one_hot", ("idx",), DECOMPOSED, _np_one_hot, decomposition="""
    labels = expand_dims(one_hot_labels(idx, depth=depth), axis=-1)
    out = cast(labels == arange(start=0, stop=depth, step=1))""",
              float_only=False, index_operands=(0,), keywords=_ONE_HOT_DEPTH,
              attr_params=("depth",), public=True),
    Primitive("one_hot_labels", ("idx",), LIBRARY, _g_one_hot_labels, vjp=(None,), jvp=(None,),
              lib="_g_one_hot_labels({idx}, {depth!r})", helpers=(_g_one_hot_labels, _gd_named),
              cuda="_gc_one_hot_labels({idx}, {depth!r}, stream)",
              cuda_helpers=(_gc_one_hot_labels,), dask=_gd_one_hot_labels,
              jax=_jax_one_hot_labels, torch=_torch_one_hot_labels, float_only=False,
              dtype="same", differentiable=False, index_operands=(0,), value_operands=(0,),
              shape_like=0, static_shape=_one_hot_static, keywords=_ONE_HOT_DEPTH,
              passes_operand=0),
)


# --- argmax, argmin: index reductions ----------------------------------------------
# The index of the largest (smallest: attribute ``is_min``) element along one axis, or
# of the flattened array without axis=, as NumPy: int64, the first index of tied
# extrema and of the first NaN (NaN wins, as in np.maximum); an empty axis is NumPy's
# ValueError.  Integer data, no gradient.  One builder makes both entries.


def _g_index_shape(x, axis, keepdims, is_min=False):
    """The shape of ``argmax`` (``argmin``) of an array of shape ``x``, as NumPy's."""
    if axis is None:
        return (1,) * len(x) if keepdims else ()
    ax = _g_scan_axis(len(x), axis)
    return tuple(1 if i == ax else d for i, d in enumerate(x) if keepdims or i != ax)


def _g_index_lines(shape, axis):
    """(lines, n, inner): the slices of ``n`` elements (stride ``inner``) an index
    reduction runs along, as ``cumsum``'s; ValueError as NumPy's for empty ones."""
    ax = None if axis is None else _g_scan_axis(len(shape), axis)
    n = math.prod(shape) if ax is None else shape[ax]
    if n == 0:
        raise ValueError("attempt to get argmax or argmin of an empty sequence")
    inner = 1 if ax is None else math.prod(shape[ax + 1:])
    return math.prod(shape) // n, n, inner


def _g_arg_index(x, axis, keepdims, is_min):
    """``np.argmin`` (``is_min``) or ``np.argmax`` of ``x`` along ``axis`` (a 1-tuple,
    or None: the flattened array), int64."""
    x = np.asarray(x)
    _g_index_lines(x.shape, axis)
    ax = None if axis is None else _g_scan_axis(x.ndim, axis)
    out = (np.argmin if is_min else np.argmax)(x, axis=ax)
    return np.asarray(out, np.int64).reshape(_g_index_shape(x.shape, axis, keepdims))


def _gck_arg_index(out, x, lines, n, inner, is_min):
    """One thread per line of ``n`` elements (stride ``inner``) of the C-ordered ``x``:
    the first index of its extremum, or of its first NaN."""
    i = cuda.grid(1)
    if i < lines:
        base = (i // inner) * n * inner + i % inner
        best = x[base]
        k = 0
        for j in range(1, n):
            v = x[base + j * inner]
            if best == best and ((v < best if is_min else v > best) or v != v):
                best = v
                k = j
        out[i] = k


def _gc_arg_index(x, axis, keepdims, is_min, stream):
    """:func:`_g_arg_index` on the device (``_gck_arg_index``)."""
    x = _gc_dev(x, stream)
    lines, n, inner = _g_index_lines(tuple(x.shape), axis)
    out = _gc_empty(_g_index_shape(tuple(x.shape), axis, keepdims), np.int64, stream)
    if lines:
        _gck_arg_index[_gc_blocks(lines), _GC_BLOCK, stream](
            _gc_ravel(out), _gc_ravel(x), lines, n, inner, bool(is_min))
    return out


def _gd_arg_index(t, x, axis, keepdims, is_min):
    """:func:`_g_arg_index` of a Dask array (Dask's blocked arg reductions)."""
    import dask.array as da
    _g_index_lines(x.shape, axis)
    flat = x.ravel() if axis is None else x
    ax = 0 if axis is None else _g_scan_axis(x.ndim, axis)
    out = (da.argmin if is_min else da.argmax)(flat, axis=ax).astype(np.int64)
    return out.reshape(_g_index_shape(x.shape, axis, keepdims))


def _jax_arg_index(x, axis, keepdims, is_min):
    import jax.numpy as jnp
    out = (jnp.argmin if is_min else jnp.argmax)(x, axis=None if axis is None else axis[0])
    return out.reshape(_g_index_shape(x.shape, axis, keepdims))


def _torch_arg_index(x, axis, keepdims, is_min):
    import torch
    _g_index_lines(tuple(x.shape), axis)          # NumPy's ValueError for an empty slice
    flat = x.reshape(-1) if axis is None else x
    out = (torch.argmin if is_min else torch.argmax)(flat, dim=0 if axis is None else axis[0])
    return out.reshape(_g_index_shape(tuple(x.shape), axis, keepdims))


def _arg_index_signatures(types, t):
    flat = types.Array(t, 1, "C")
    return [(types.Array(types.int64, 1, "C"), flat, types.int64, types.int64, types.int64,
             types.boolean)]


def _arg_index_static(shapes, attrs):
    (s,) = shapes
    _one_axis("argmax and argmin", s, attrs["axis"])
    return None if s.dyn else Shape(_g_index_shape(s.static, attrs["axis"], attrs["keepdims"]))


def _arg_index(name, is_min) -> Primitive:
    return Primitive(
        name, ("x",), LIBRARY, _g_arg_index, vjp=(None,), jvp=(None,),
        lib="_g_arg_index({x}, {axis!r}, {keepdims!r}, {is_min!r})",
        helpers=(_g_scan_axis, _g_index_shape, _g_index_lines, _g_arg_index),
        cuda="_gc_arg_index({x}, {axis!r}, {keepdims!r}, {is_min!r}, stream)",
        cuda_helpers=(_gc_arg_index,), cuda_kernels=((_gck_arg_index, _arg_index_signatures),),
        dask=_gd_arg_index, jax=_jax_arg_index, torch=_torch_arg_index,
        float_only=False, dtype="i64", differentiable=False,
        static_shape=_arg_index_static, np_shape=_g_index_shape,
        keywords=(("axis", "axis", None), ("keepdims", "bool", False),
                  ("is_min", "internal", is_min)), public=True)


ARGMAX, ARGMIN = _arg_index("argmax", False), _arg_index("argmin", True)


# --- layout: reshape, expand_dims, squeeze, broadcast_to, permute_dims, swapaxes --
# NumPy's (the Array API's) layout functions.  Each result's shape is a function of its
# operand's shape and its attributes: ``_g_*_shape`` (``np_shape``, copied into the
# wrappers, which call it before any work) raises NumPy's ValueError for sizes that do
# not fit, and the static rule says the same at compile time (E301) where shapes are
# known.  Materialised copies between kernels for now (reshape of a C-contiguous array
# is a view).  The VJPs are the inverse layouts: a reshape back to the operand's shape
# (``reshape_like``, internal), the inverse permutation, and for ``broadcast_to`` the
# sum back (``sum_to``).

_g_axes = checked_axes          # NumPy's axis checks, shared with the shape rules



def _g_reshape_shape(x, shape):
    """The shape ``reshape`` of an array of shape ``x`` to ``shape`` (one -1 allowed) gives."""
    shape = tuple(int(d) for d in shape)
    size, known = math.prod(x), math.prod(d for d in shape if d != -1)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"reshape: bad shape {shape} (sizes >= 0, one -1 at most)")
    if -1 in shape and known and size % known == 0:
        shape = tuple(size // known if d == -1 else d for d in shape)
    if math.prod(shape) != size or -1 in shape:
        raise ValueError(f"reshape: cannot reshape an array of shape {tuple(x)} "
                         f"(size {size}) into shape {shape}")
    return shape


def _g_expand_dims_shape(x, axis):
    """The shape of ``expand_dims`` of an array of shape ``x`` at ``axis`` (a tuple)."""
    axes = _g_axes(len(x) + len(axis), axis, "expand_dims")
    rest = iter(x)
    return tuple(1 if i in axes else next(rest) for i in range(len(x) + len(axis)))


def _g_squeeze_shape(x, axis):
    """The shape of ``squeeze`` of an array of shape ``x`` along ``axis`` (a tuple)."""
    axes = _g_axes(len(x), axis, "squeeze")
    for a in axes:
        if x[a] != 1:
            raise ValueError(f"squeeze: cannot squeeze axis {a} of an array of shape "
                             f"{tuple(x)}: its size is {x[a]}, not 1")
    return tuple(d for i, d in enumerate(x) if i not in axes)


def _g_broadcast_to_shape(x, shape):
    """``shape``, once an array of shape ``x`` broadcasts to it (NumPy's rule)."""
    shape = tuple(int(d) for d in shape)
    lead = len(shape) - len(x)
    if lead < 0 or any(m != 1 and m != n for m, n in zip(x, shape[lead:])):
        raise ValueError(f"broadcast_to: cannot broadcast an array of shape {tuple(x)} "
                         f"to shape {shape}")
    return shape


def _g_permutation(ndim, axes, inverse, axis1, axis2):
    """The axes of ``permute_dims`` (``axes``; the inverse permutation when ``inverse``)
    or of ``swapaxes`` (``axes`` None: ``axis1`` and ``axis2`` swapped)."""
    if axes is None:
        a, b = _g_axes(ndim, (axis1,), "swapaxes") + _g_axes(ndim, (axis2,), "swapaxes")
        perm = list(range(ndim))
        perm[a], perm[b] = b, a
        return tuple(perm)
    if len(axes) != ndim:
        raise ValueError(f"permute_dims: axes {tuple(axes)} do not match an array of "
                         f"dimension {ndim}")
    perm = _g_axes(ndim, axes, "permute_dims")
    return tuple(int(i) for i in np.argsort(perm)) if inverse else perm


def _g_permute_shape(x, axes=None, inverse=False, axis1=0, axis2=0):
    return tuple(x[p] for p in _g_permutation(len(x), axes, inverse, axis1, axis2))


def _g_reshape(x, shape):
    x = np.asarray(x)
    return np.reshape(x, _g_reshape_shape(x.shape, shape))


def _g_expand_dims(x, axis):
    x = np.asarray(x)
    return np.reshape(x, _g_expand_dims_shape(x.shape, axis))


def _g_squeeze(x, axis):
    x = np.asarray(x)
    return np.reshape(x, _g_squeeze_shape(x.shape, axis))


def _g_broadcast_to(x, shape):
    """``np.broadcast_to``, materialised (a C-contiguous copy)."""
    x = np.asarray(x)
    return np.ascontiguousarray(np.broadcast_to(x, _g_broadcast_to_shape(x.shape, shape)))


def _g_permute(x, axes=None, inverse=False, axis1=0, axis2=0):
    """``np.transpose(x, perm)`` (:func:`_g_permutation`), materialised."""
    x = np.asarray(x)
    return np.ascontiguousarray(np.transpose(x, _g_permutation(x.ndim, axes, inverse,
                                                               axis1, axis2)))


def _gc_layout(x, shape_fn, stream, **attrs):
    """A reshape of a (C-contiguous) device array to ``shape_fn(x.shape, **attrs)``: a view."""
    x = _gc_dev(x, stream)
    new = shape_fn(tuple(x.shape), **attrs)
    return x.reshape(new) if x.size else _gc_empty(new, x.dtype, stream)


def _gc_permute(x, stream, **attrs):
    """:func:`_g_permute` on the device, materialised (one gather)."""
    x = _gc_dev(x, stream)
    perm = _g_permutation(len(x.shape), attrs.get("axes"), attrs.get("inverse", False),
                          attrs.get("axis1", 0), attrs.get("axis2", 0))
    st = _gc_strides(x.shape)
    return _gc_gather(x, tuple(x.shape[p] for p in perm), tuple(st[p] for p in perm),
                      x.dtype, stream)


def _gd_reshape_to(x, new):
    """A Dask array reshaped to ``new``: made one chunk first where Dask's reshape (which
    only merges or splits dims evenly) cannot."""
    new = tuple(new)
    if tuple(x.shape) == new:
        return x
    try:
        return x.reshape(new)
    except NotImplementedError:
        return x.rechunk(-1).reshape(new)


def _gd_reshape(t, x, shape):
    return _gd_reshape_to(x, _g_reshape_shape(x.shape, shape))


def _gd_expand_dims(t, x, axis):
    return _gd_reshape_to(x, _g_expand_dims_shape(x.shape, axis))


def _gd_squeeze(t, x, axis):
    return _gd_reshape_to(x, _g_squeeze_shape(x.shape, axis))


def _gd_reshape_like(t, x, like):
    return _gd_reshape_to(x, like.shape)


def _gd_broadcast_to(t, x, shape):
    import dask.array as da
    return da.broadcast_to(x, _g_broadcast_to_shape(x.shape, shape))


def _gd_permute(t, x, axes=None, inverse=False, axis1=0, axis2=0):
    import dask.array as da
    return da.transpose(x, _g_permutation(x.ndim, axes, inverse, axis1, axis2))


def _fw_reshaped(shape_fn):
    """The JAX and PyTorch lowering of a reshape whose shape is ``shape_fn``'s."""
    return lambda x, **attrs: x.reshape(shape_fn(tuple(x.shape), **attrs))


def _fw_permute(x, axes=None, inverse=False, axis1=0, axis2=0):
    perm = _g_permutation(len(x.shape), axes, inverse, axis1, axis2)
    return x.permute(perm) if hasattr(x, "permute") else x.transpose(perm)


def _fw_broadcast_to(x, shape):
    new = _g_broadcast_to_shape(tuple(x.shape), shape)
    if hasattr(x, "expand"):                 # a torch tensor
        return x.expand(new)
    import jax.numpy as jnp
    return jnp.broadcast_to(x, new)


def _statically(fn, *args, **kw):
    """``fn``'s result, its ValueError a BroadcastError (the builder's E301)."""
    try:
        return fn(*args, **kw)
    except ValueError as exc:
        raise BroadcastError(str(exc)) from None


def _named(dims):
    """An attribute's dims as a shape class spells them (a DimRef by its name)."""
    return tuple(getattr(d, "name", d) for d in dims)


def _reshape_static(shapes, attrs):
    (s,), shape = shapes, _named(attrs["shape"])
    if s.dyn or not all(isinstance(d, int) for d in s.static + shape):
        # checked at run time; n * k is not a dim a class can name
        return None if -1 in shape else Shape(shape)
    return Shape(_statically(_g_reshape_shape, s.static, shape))


def _expand_dims_static(shapes, attrs):
    (s,) = shapes
    return None if s.dyn else Shape(_statically(_g_expand_dims_shape, s.static, attrs["axis"]))


def _squeeze_static(shapes, attrs):
    (s,) = shapes
    if s.dyn:
        return None
    axes = _statically(_g_axes, len(s.static), attrs["axis"], "squeeze")
    named = tuple(1 if isinstance(d, str) and i in axes else d for i, d in enumerate(s.static))
    return Shape(_statically(_g_squeeze_shape, named, attrs["axis"]))


def _broadcast_to_static(shapes, attrs):
    (s,), shape = shapes, _named(attrs["shape"])
    if not s.dyn and (len(s.static) > len(shape) or broadcast_static(s.static, shape) != shape):
        raise BroadcastError(f"broadcast_to: cannot broadcast an array of shape {s} to "
                             f"shape {Shape(shape)}")
    return Shape(shape)


def _permute_static(shapes, attrs):
    (s,) = shapes
    for k in ("axis1", "axis2"):                    # swapaxes'
        v = attrs.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int):
            raise BroadcastError(f"swapaxes: {k} must be an integer, got {v!r}")
    return None if s.dyn else Shape(_statically(_g_permute_shape, s.static, **attrs))


_LAYOUT_HELPERS = (_g_axes, _g_reshape_shape, _g_expand_dims_shape, _g_squeeze_shape,
                   _g_broadcast_to_shape, _g_permutation, _g_permute_shape)


def _layout(name, params, ref, vjp, jvp, lib, cuda, dask, fw, keywords, **kw) -> Primitive:
    kw.setdefault("helpers", _LAYOUT_HELPERS + (_gd_reshape_to, ref))
    return Primitive(name, params, LIBRARY, ref, vjp=vjp, jvp=jvp, lib=lib, cuda=cuda,
                     cuda_helpers=(_gc_layout, _gc_permute), dask=dask, jax=fw, torch=fw,
                     float_only=False, dtype="same", linear=(0,), keywords=keywords, **kw)


_PERMUTE_KW = (("axes", "axis", None), ("inverse", "internal", False))
_SWAP_KW = (("axis1", "int", 0), ("axis2", "int", 0))
LAYOUT = (
    _layout("reshape", ("x",), _g_reshape, ("reshape_like(g, x)",),
            ("reshape(x_t, shape=shape)",), "_g_reshape({x}, {shape!r})",
            "_gc_layout({x}, _g_reshape_shape, stream, shape={shape!r})", _gd_reshape,
            _fw_reshaped(_g_reshape_shape), (("shape", "shape", None),),
            attr_params=("shape",), static_shape=_reshape_static, np_shape=_g_reshape_shape,
            public=True),
    _layout("expand_dims", ("x",), _g_expand_dims, ("reshape_like(g, x)",),
            ("expand_dims(x_t, axis=axis)",), "_g_expand_dims({x}, {axis!r})",
            "_gc_layout({x}, _g_expand_dims_shape, stream, axis={axis!r})", _gd_expand_dims,
            _fw_reshaped(_g_expand_dims_shape), (("axis", "axis", None),),
            attr_params=("axis",), static_shape=_expand_dims_static,
            np_shape=_g_expand_dims_shape, public=True),
    _layout("squeeze", ("x",), _g_squeeze, ("reshape_like(g, x)",),
            ("squeeze(x_t, axis=axis)",), "_g_squeeze({x}, {axis!r})",
            "_gc_layout({x}, _g_squeeze_shape, stream, axis={axis!r})", _gd_squeeze,
            _fw_reshaped(_g_squeeze_shape), (("axis", "axis", None),),
            attr_params=("axis",), static_shape=_squeeze_static, np_shape=_g_squeeze_shape,
            public=True),
    # reshape_like(x, like): x as like's shape; the VJP of the reshapes (internal).
    _layout("reshape_like", ("x", "like"), lambda x, like: np.reshape(x, np.shape(like)),
            ("reshape_like(g, x)", None), ("reshape_like(x_t, like)", None),
            "np.reshape({x}, {like}.shape)",
            "_gc_layout({x}, _g_reshape_shape, stream, shape=tuple({like}.shape))",
            _gd_reshape_like, lambda x, like: x.reshape(tuple(like.shape)), (),
            shape_like=1, shape_only=(1,), helpers=_LAYOUT_HELPERS + (_gd_reshape_to,)),
    _layout("broadcast_to", ("x",), _g_broadcast_to, ("sum_to(g, x)",),
            ("broadcast_to(x_t, shape=shape)",), "_g_broadcast_to({x}, {shape!r})",
            "_gc_broadcast({x}, {shape!r}, stream)", _gd_broadcast_to, _fw_broadcast_to,
            (("shape", "shape", None),), attr_params=("shape",),
            static_shape=_broadcast_to_static, np_shape=_g_broadcast_to_shape, public=True),
    # permute_dims(x, axes), alias transpose(x, axes); inverse (internal): by the
    # inverse permutation, its VJP.
    _layout("permute_dims", ("x",), _g_permute,
            ("permute_dims(g, axes=axes, inverse=1 - inverse)",),
            ("permute_dims(x_t, axes=axes, inverse=inverse)",),
            "_g_permute({x}, axes={axes!r}, inverse={inverse!r})",
            "_gc_permute({x}, stream, axes={axes!r}, inverse={inverse!r})", _gd_permute,
            _fw_permute, _PERMUTE_KW, attr_params=("axes",), static_shape=_permute_static,
            np_shape=_g_permute_shape, public=True, aliases=("transpose",)),
    _layout("swapaxes", ("x",), _g_permute, ("swapaxes(g, axis1, axis2)",),
            ("swapaxes(x_t, axis1, axis2)",),
            "_g_permute({x}, axis1={axis1!r}, axis2={axis2!r})",
            "_gc_permute({x}, stream, axis1={axis1!r}, axis2={axis2!r})", _gd_permute,
            _fw_permute, _SWAP_KW, attr_params=("axis1", "axis2"),
            static_shape=_permute_static, np_shape=_g_permute_shape, public=True),
)


# --- take, take_along_axis: gathers by integer indices -----------------------------
# NumPy's take(x, idx, axis=) (x's axis replaced by idx's dims) and take_along_axis(x,
# idx, axis=) (idx of x's rank; its other dims broadcast against x's), of the flattened
# x without axis=.  Negative indices count from the end (NumPy's); one outside [-n, n)
# is an IndexError at call time, checked before any read (Numba and CUDA kernels do not
# check bounds).  The VJP is the transpose, a scatter-add of the cotangent into zeros
# of x's shape where duplicate indices accumulate (take_transpose,
# take_along_axis_transpose: internal), whose own VJP is the gather again.  One builder
# makes the four entries (``along``: take_along_axis's).


def _g_take_geometry(x, idx, axis, along):
    """(axis, the shape x is read as, the result's shape) of a gather of an array of
    shape ``x`` by indices of shape ``idx``; ValueError as NumPy's."""
    op = "take_along_axis" if along else "take"
    xs = (math.prod(x),) if axis is None else tuple(x)
    if axis is not None and len(axis) != 1:
        raise ValueError(f"{op} takes one axis, got {tuple(axis)}")
    ax = 0 if axis is None else _g_axes(len(xs), axis, op)[0]
    if not along:
        return ax, xs, xs[:ax] + tuple(idx) + xs[ax + 1:]
    if len(idx) != len(xs):
        raise ValueError(f"take_along_axis: indices of dimension {len(idx)} for an array "
                         f"of dimension {len(xs)} (they must be equal)")
    out = []
    for i, (m, n) in enumerate(zip(xs, idx)):
        if i != ax and m != n and 1 not in (m, n):
            raise ValueError(f"take_along_axis: indices of shape {tuple(idx)} do not "
                             f"broadcast against an array of shape {xs} (but on axis {ax})")
        out.append(n if i == ax or m == 1 else m)
    return ax, xs, tuple(out)


def _g_take_shape(x, idx, axis, along):
    """The shape of ``take`` (``take_along_axis``: ``along``) of arrays of these shapes."""
    return _g_take_geometry(x, idx, axis, along)[2]


def _g_take_index(idx, n, along, axis=None):
    """The indices ``idx`` (a NumPy array) as non-negative int64 for an axis of size
    ``n``; IndexError for one outside [-n, n) (NumPy's indexing message where ``axis``,
    the axis indexed, is given: x[idx])."""
    idx = np.asarray(idx)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -n or hi >= n:
            bad = lo if lo < -n else hi
            if axis is not None:
                raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {n}")
            raise IndexError(f"{'take_along_axis' if along else 'take'}: index "
                             f"{bad} is out of bounds for an axis of size {n}")
    return np.where(idx < 0, idx + n, idx).astype(np.int64)


def _g_take(x, idx, axis, along):
    """``np.take(x, idx, axis)`` (``np.take_along_axis`` when ``along``); ``axis`` a
    1-tuple or None (the flattened ``x``)."""
    x, idx = np.asarray(x), np.asarray(idx)
    ax, xs, shape = _g_take_geometry(x.shape, idx.shape, axis, along)
    i, x = _g_take_index(idx, xs[ax], along), x.reshape(xs)
    if along:
        full = shape[:ax] + (xs[ax],) + shape[ax + 1:]
        return np.take_along_axis(np.broadcast_to(x, full), np.broadcast_to(i, shape), ax)
    return np.take(x, i, axis=ax)


def _g_take_transpose(g, idx, like, axis, along):
    """The adjoint of :func:`_g_take` in ``x``: ``g`` added into zeros of ``like``'s
    shape at the indices (duplicates accumulate)."""
    g, idx, shape = np.asarray(g), np.asarray(idx), tuple(np.shape(like))
    ax, xs, out = _g_take_geometry(shape, idx.shape, axis, along)
    i, g = _g_take_index(idx, xs[ax], along), np.broadcast_to(g, out)
    if not along:
        acc = np.zeros(xs, g.dtype)
        np.add.at(acc, (slice(None),) * ax + (i,), g)
        return acc.reshape(shape)
    full = out[:ax] + (xs[ax],) + out[ax + 1:]
    acc = np.zeros(full, g.dtype)
    where = list(np.indices(out, sparse=True))
    where[ax] = np.broadcast_to(i, out)
    np.add.at(acc, tuple(where), g)
    spread = tuple(k for k, (m, n) in enumerate(zip(xs, full)) if m != n)
    return (acc.sum(axis=spread, keepdims=True) if spread else acc).reshape(shape)


def _gck_take(out, x, idx, n, m, inner, along):
    """``out[(o m + j) inner + i] = x[(o n + k) inner + i]``, ``k`` the index of ``out``'s
    element (``along``) or ``idx[j]``, from ``n`` + ``k`` when negative."""
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        j = (t // inner) % m
        k = idx[t] if along else idx[j]
        if k < 0:
            k += n
        out[t] = x[((t // (inner * m)) * n + k) * inner + t % inner]


def _gck_take_transpose(acc, g, idx, n, m, inner, along):
    """The adjoint of ``_gck_take``: ``acc[...] += g[t]`` by atomic adds."""
    for t in range(cuda.grid(1), g.size, cuda.gridsize(1)):
        j = (t // inner) % m
        k = idx[t] if along else idx[j]
        if k < 0:
            k += n
        cuda.atomic.add(acc, ((t // (inner * m)) * n + k) * inner + t % inner, g[t])


def _gc_zeros(shape, dtype, stream):
    """A new device array of zeros (a broadcast of a cached 0: nothing uploaded;
    not an uploaded array of zeros, which for one element is a cached scalar, shared)."""
    return _gc_broadcast(_gc_upload(np.zeros((), dtype), stream), tuple(shape), stream)


def _gc_take_operands(shape, idx, axis, along, stream):
    """(device indices, axis, the shape read, result shape, the full shape of the
    gather, n, m, inner) of a gather on the device, its indices checked on the host
    (copied back: small beside the data)."""
    idx = _gc_dev(idx, stream)
    ax, xs, out = _g_take_geometry(shape, tuple(idx.shape), axis, along)
    _g_take_index(idx.copy_to_host(stream=stream), xs[ax], along)
    full = out[:ax] + (xs[ax],) + out[ax + 1:] if along else xs
    if along and tuple(idx.shape) != out:
        idx = _gc_broadcast(idx, out, stream)
    m = out[ax] if along else max(idx.size, 1)
    return idx, ax, xs, out, full, xs[ax], m, math.prod(full[ax + 1:])


def _gc_take(x, idx, axis, along, stream):
    """:func:`_g_take` on the device (``_gck_take``)."""
    x = _gc_dev(x, stream)
    idx, ax, xs, out, full, n, m, inner = _gc_take_operands(tuple(x.shape), idx, axis,
                                                            along, stream)
    res = _gc_empty(out, x.dtype, stream)
    if res.size:
        x = x.reshape(xs)
        x = _gc_broadcast(x, full, stream) if full != xs else x
        _gck_take[_gc_blocks(res.size), _GC_BLOCK, stream](
            _gc_ravel(res), _gc_ravel(x), _gc_ravel(idx), n, m, inner, bool(along))
    return res


def _gc_take_transpose(g, idx, like, axis, along, stream):
    """:func:`_g_take_transpose` on the device (``_gck_take_transpose``)."""
    g, shape = _gc_dev(g, stream), tuple(like.shape)
    idx, ax, xs, out, full, n, m, inner = _gc_take_operands(shape, idx, axis, along, stream)
    acc = _gc_zeros(full, g.dtype, stream)
    if g.size:
        g = _gc_broadcast(g, out, stream) if tuple(g.shape) != out else g
        _gck_take_transpose[_gc_blocks(g.size), _GC_BLOCK, stream](
            _gc_ravel(acc), _gc_ravel(g), _gc_ravel(idx), n, m, inner, bool(along))
    if full != xs:
        acc = _gc_sum_to(acc, xs, stream)
    return _gc_layout(acc, _g_reshape_shape, stream, shape=shape)


def _gd_take(t, x, idx, axis, along, *, op=None):
    """:func:`_g_take` of Dask arrays: the gathered axis made whole (one chunk); an index
    out of range raised when its block is computed, named after the method ``op``."""
    import dask.array as da
    ax, xs, out = _g_take_geometry(x.shape, idx.shape, axis, along)
    x, idx = _gd_reshape_to(x, xs).rechunk({ax: -1}), da.asarray(idx)
    if along:
        full = out[:ax] + (xs[ax],) + out[ax + 1:]
        x = da.broadcast_to(x, full).rechunk({ax: -1})
        idx = da.broadcast_to(idx, out).rechunk(x.chunks[:ax] + (-1,) + x.chunks[ax + 1:])
        return da.map_blocks(_gd_named, x, idx, (ax,), True, fn=_g_take, op=op,
                             dtype=x.dtype, chunks=idx.chunks)
    xi = tuple(range(len(xs)))
    ii = tuple(range(len(xs), len(xs) + idx.ndim))
    return da.blockwise(_gd_named, xi[:ax] + ii + xi[ax + 1:], x, xi, idx.rechunk(-1), ii,
                        dtype=x.dtype, fn=_g_take, op=op, axis=(ax,), along=False,
                        concatenate=True)


def _gd_take_transpose_block(g, idx, n, ax, along, k):
    """One block of :func:`_gd_take_transpose`: ``k`` index dims from ``ax`` on."""
    like = g.shape[:ax] + (n,) + g.shape[ax + k:]
    return _g_take_transpose(g, idx, np.broadcast_to(np.zeros((), g.dtype), like), (ax,),
                             along)


def _gd_take_transpose(t, g, idx, like, axis, along, *, op=None):
    """:func:`_g_take_transpose` of Dask arrays, block by block (the axis whole; an
    index out of range named after the method ``op``)."""
    import dask.array as da
    shape = tuple(like.shape)
    ax, xs, out = _g_take_geometry(shape, idx.shape, axis, along)
    g, idx, n = da.broadcast_to(da.asarray(g), out), da.asarray(idx), xs[ax]
    k = 1 if along else idx.ndim
    g = g.rechunk({d: -1 for d in range(ax, ax + k)})
    if along:
        idx = da.broadcast_to(idx, out).rechunk(g.chunks)
        acc = da.map_blocks(_gd_named, g, idx, n, ax, True, 1, fn=_gd_take_transpose_block,
                            op=op, dtype=g.dtype,
                            chunks=g.chunks[:ax] + ((n,),) + g.chunks[ax + 1:])
        acc = _g_sum_to(acc, xs)
    else:
        gi = tuple(range(g.ndim))
        oi = gi[:ax] + (g.ndim,) + gi[ax + k:]
        acc = da.blockwise(_gd_named, oi, g, gi, idx.rechunk(-1), gi[ax:ax + k],
                           fn=_gd_take_transpose_block, op=op, n=n, ax=ax, along=False, k=k,
                           dtype=g.dtype, new_axes={g.ndim: n}, concatenate=True)
    return _gd_reshape_to(acc, shape)


def _fw_take(x, idx, axis, along):
    """:func:`_g_take` of jax.numpy arrays or torch tensors.  JAX's (no check: a jitted
    function cannot raise) is ``jnp.take``'s and ``jnp.take_along_axis``'s default
    (mode "fill"): an index outside [-n, n) reads the fill value (NaN for floats), not
    another row's element, and its cotangent is dropped."""
    ax, xs, out = _g_take_geometry(tuple(x.shape), tuple(idx.shape), axis, along)
    x, n = x.reshape(xs), xs[ax]
    full = out[:ax] + (n,) + out[ax + 1:]
    if hasattr(x, "index_select"):              # torch
        import torch
        idx = idx + n * (idx < 0)
        if along:
            return torch.gather(x.expand(full), ax, idx.long().expand(out))
        flat = torch.index_select(x, ax, idx.long().reshape(-1))
        return flat.reshape(out)
    import jax.numpy as jnp
    if along:       # negative indices count from the end once, in jnp's own gathers
        return jnp.take_along_axis(jnp.broadcast_to(x, full), jnp.broadcast_to(idx, out), ax,
                                   mode="fill")
    return jnp.take(x, idx, axis=ax, mode="fill")


def _fw_take_transpose(g, idx, like, axis, along):
    """:func:`_g_take_transpose` in JAX or PyTorch: the VJP of their gather."""
    shape = tuple(like.shape)
    zeros = like * 0
    if hasattr(g, "index_select"):              # torch
        import torch
        with torch.enable_grad():
            x = zeros.detach().requires_grad_(True)
            (r,) = torch.autograd.grad(_fw_take(x, idx, axis, along), x, g)
        return r.reshape(shape)
    import jax
    return jax.vjp(lambda v: _fw_take(v, idx, axis, along), zeros)[1](g)[0]


def _take_signatures(types, t):
    flat = types.Array(t, 1, "C")
    return [(flat, flat, types.Array(i, 1, "C"), types.int64, types.int64, types.int64,
             types.boolean) for i in (types.int32, types.int64)]


def _take_static(shapes, attrs):
    """The gather's shape where both operands' are static, with named dims too
    (``x[labels]`` of ``x: [n, k]``, ``labels: i64[n]`` is ``(n, k)``, which then does
    not broadcast against an ``(n,)`` at compile time: at ``n == k`` it would, silently;
    found by helper 50); not over a flattened array of named dims (its size is their
    product)."""
    s, i = shapes
    axis, along = attrs["axis"], attrs["along"]
    _one_axis("take and take_along_axis", s, axis)
    if s.dyn or i.dyn:
        return None
    if all(isinstance(d, int) for d in s.static + i.static):
        return Shape(_statically(_g_take_shape, s.static, i.static, axis, along))
    if axis is None:
        return None
    ax = _statically(_g_axes, len(s.static), axis, "take")[0]
    if not along:
        return Shape(s.static[:ax] + i.static + s.static[ax + 1:])
    if len(i.static) != len(s.static):
        raise BroadcastError(f"take_along_axis: indices of dimension {len(i.static)} for "
                             f"an array of dimension {len(s.static)} (they must be equal)")
    return Shape(tuple(n if k == ax else broadcast_static((m,), (n,))[0]
                       for k, (m, n) in enumerate(zip(s.static, i.static))))


def _gathers(name, along) -> tuple[Primitive, Primitive]:
    kw = (("axis", "axis", None), ("along", "internal", along))
    common = dict(float_only=False, dtype="same", linear=(0,), index_operands=(1,),
                  keywords=kw, helpers=(_g_axes, _g_take_geometry, _g_take_shape,
                                        _g_take_index, _g_take, _g_take_transpose,
                                        _gd_reshape_to, _gd_take_transpose_block, _gd_named),
                  cuda_helpers=(_gc_zeros, _gc_take_operands, _gc_take, _gc_take_transpose,
                                _gc_layout))
    gather = Primitive(
        name, ("x", "idx"), LIBRARY, _g_take,
        vjp=(f"{name}_transpose(g, idx, x, axis=axis)", None),
        jvp=(f"{name}(x_t, idx, axis=axis)", None),
        lib="_g_take({x}, {idx}, {axis!r}, {along!r})",
        cuda="_gc_take({x}, {idx}, {axis!r}, {along!r}, stream)",
        cuda_kernels=((_gck_take, _take_signatures),), dask=_gd_take, jax=_fw_take,
        torch=_fw_take, static_shape=_take_static, np_shape=_g_take_shape, public=True,
        **common)
    scatter = Primitive(
        f"{name}_transpose", ("x", "idx", "like"), LIBRARY, _g_take_transpose,
        vjp=(f"{name}(g, idx, axis=axis)", None, None),
        jvp=(f"{name}_transpose(x_t, idx, like, axis=axis)", None, None),
        lib="_g_take_transpose({x}, {idx}, {like}, {axis!r}, {along!r})",
        cuda="_gc_take_transpose({x}, {idx}, {like}, {axis!r}, {along!r}, stream)",
        cuda_kernels=((_gck_take_transpose, _take_signatures),), dask=_gd_take_transpose,
        jax=_fw_take_transpose, torch=_fw_take_transpose, shape_like=2, shape_only=(2,),
        **common)
    return gather, scatter


TAKE, TAKE_TRANSPOSE = _gathers("take", False)
TAKE_ALONG, TAKE_ALONG_TRANSPOSE = _gathers("take_along_axis", True)


# --- composite builtins: relu, softmax, log_softmax, log_sigmoid -------------------
# Each is its decomposition wherever it is called (ExprLowerer lowers the statements in
# its place), so every backend gets it for free and its derivative is the derivative
# of the decomposition; ``ref`` is the NumPy reference the tests compare with.  The
# shift of softmax and log_softmax is the slice's maximum (0 for an empty or all -inf
# slice, or one with a NaN), under stop_gradient: softmax is invariant to it, so its
# gradient is exactly 0 (as jax.nn.softmax).  A slice with +inf is NaN throughout
# (inf - inf), as jax.nn.softmax's and torch.softmax's; a shift of 0 there gave NaN
# at the +inf and 0 elsewhere, which read as probabilities.

_SHIFT = """
    m = max(x, axis=axis, keepdims=true, initial=-inf)
    h = broadcast_in(stop_gradient(where(m > -inf, m, 0)), x, axis=axis, keepdims=true)"""


def _np_shifted(x, axis):
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    return x - np.where(m > -np.inf, m, 0)


def _np_softmax(x, axis=(-1,)):
    e = np.exp(_np_shifted(x, axis))
    return e / np.sum(e, axis=axis, keepdims=True)


def _np_log_softmax(x, axis=(-1,)):
    s = _np_shifted(x, axis)
    with np.errstate(divide="ignore"):          # an empty slice: log(0) = -inf
        return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


def _composite(name, ref, decomposition, **kw) -> Primitive:
    return Primitive(name, ("x",), DECOMPOSED, ref, decomposition=decomposition,
                     float_only=False, public=True, **kw)


_SOFTMAX_AXIS = (("axis", "axis", (-1,)),)
COMPOSITES = (
    # relu'(0) = 0 (as JAX and PyTorch); NaN stays NaN.
    _composite("relu", lambda x: np.where(x <= 0, 0, x), "out = where(x <= 0, 0, x)"),
    # -softplus(-x): no overflow, and exact 0 (not a rounding error) for large x.
    _composite("log_sigmoid", lambda x: -np.logaddexp(0, -x), "out = -softplus(-x)"),
    # e / sum(e), e = exp(x - shift) <= 1 (no zero mask: its derivative is bounded).
    _composite("softmax", _np_softmax, _SHIFT + """
    e = exp(x - h, zero_mask=false)
    out = e / broadcast_in(sum(e, axis=axis, keepdims=true), x, axis=axis, keepdims=true)""",
               keywords=_SOFTMAX_AXIS),
    # s - logsumexp(s), s = x - shift (jax.nn.log_softmax's form: the difference of
    # the shifted values is exact, not rounded to the size of the maximum).
    _composite("log_softmax", _np_log_softmax, _SHIFT + """
    s = x - h
    out = s - broadcast_in(logsumexp(s, axis=axis, keepdims=true), x, axis=axis, keepdims=true)""",
               keywords=_SOFTMAX_AXIS),
)


# --- argsort, sort, topk: sorting along one axis --------------------------------------
# argsort(x, axis=-1, descending=false): the int64 permutation of a stable sort (NumPy's
# kind="stable": equal values keep their order), NaN last as NumPy's (NaN is the largest
# value; -0.0 and 0.0 are equal).  descending=true is the ascending order reversed but
# for ties (jnp.argsort(descending=True, stable=True)): NaN first, equal values still in
# their order.  No gradient (integer data).  The internal attribute ``k`` keeps the first
# k indices of each line (topk's).  sort and topk are decompositions over it: the values
# gathered by the permutation (take_along_axis), so their VJP scatters the cotangent back
# to where each value came from (take_along_axis_transpose) and their JVP gathers the
# tangent by the permutation, in every backend.  topk(x, k, axis=-1): the k largest
# values in descending order (torch.topk, jax.lax.top_k; ties: the lower index first,
# NaN counts as the largest); 0 <= k <= n, checked at compile time where n is known
# (E301), else at call time (ValueError).


def _g_argsort_shape(x, axis, descending=False, k=None):
    """The shape of ``argsort`` of an array of shape ``x`` (``k`` per line when given);
    ValueError for an axis out of bounds or a ``k`` outside [0, n]."""
    ax = _g_scan_axis(len(x), axis)
    if k is None:
        return tuple(x)
    n = x[ax]
    if isinstance(k, int) and (k < 0 or isinstance(n, int) and k > n):
        raise ValueError(f"topk: k = {k} is out of range for an axis of size {n} "
                         f"(0 <= k <= {n})")
    return tuple(x[:ax]) + (k,) + tuple(x[ax + 1:])


def _g_argsort(x, axis, descending, k=None):
    """The stable ``argsort`` of ``x`` along ``axis`` (a 1-tuple), int64, its first
    ``k`` per line when given; descending: reversed, ties still in their order."""
    x = np.asarray(x)
    shape = _g_argsort_shape(x.shape, axis, descending, k)
    ax = _g_scan_axis(x.ndim, axis)
    if descending:
        idx = x.shape[ax] - 1 - np.flip(np.argsort(np.flip(x, ax), axis=ax, kind="stable"), ax)
    else:
        idx = np.argsort(x, axis=ax, kind="stable")
    return np.ascontiguousarray(idx[(slice(None),) * ax + (slice(0, shape[ax]),)], np.int64)


def _gck_argsort(out, x, n, inner, k, descending):
    """One thread per element of the C-ordered ``x`` (lines of ``n``, stride ``inner``):
    its rank in the stable sort of its line (the elements before it, and its equals
    at lower indices), its index stored at that rank of ``out`` (``k`` per line) when
    the rank is below ``k``.  NaN is the largest value; O(n) per element."""
    for t in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        i = t % inner
        j = (t // inner) % n
        o = t // (inner * n)
        v = x[t]
        rank = 0
        for m in range(n):
            u = x[(o * n + m) * inner + i]
            if descending:
                before = u > v or (u != u and v == v)
                after = v > u or (v != v and u == u)
            else:
                before = u < v or (v != v and u == u)
                after = v < u or (u != u and v == v)
            if before or (m < j and not after):
                rank += 1
        if rank < k:
            out[(o * k + rank) * inner + i] = j


def _gc_argsort(x, axis, descending, k, stream):
    """:func:`_g_argsort` on the device (``_gck_argsort``)."""
    x = _gc_dev(x, stream)
    shape = _g_argsort_shape(tuple(x.shape), axis, descending, k)
    ax = _g_scan_axis(x.ndim, axis)
    out = _gc_empty(shape, np.int64, stream)
    if out.size:
        _gck_argsort[_gc_blocks(x.size), _GC_BLOCK, stream](
            _gc_ravel(out), _gc_ravel(x), x.shape[ax], math.prod(x.shape[ax + 1:]),
            shape[ax], bool(descending))
    return out


def _gd_argsort(t, x, axis, descending, k=None):
    """:func:`_g_argsort` of a Dask array: the sorted axis made whole (one chunk)."""
    import dask.array as da
    ax = _g_scan_axis(x.ndim, axis)
    shape = _g_argsort_shape(x.shape, axis, descending, k)
    x = x.rechunk({ax: -1})
    return da.map_blocks(_g_argsort, x, (ax,), descending, k, dtype=np.int64,
                         chunks=x.chunks[:ax] + ((shape[ax],),) + x.chunks[ax + 1:])


def _fw_argsort(x, axis, descending, k=None):
    """:func:`_g_argsort` of jax.numpy arrays or torch tensors."""
    ax = _g_scan_axis(x.ndim, axis)
    n = _g_argsort_shape(tuple(x.shape), axis, descending, k)[ax]
    if hasattr(x, "index_select"):              # torch
        import torch
        flip, order = (lambda a: torch.flip(a, (ax,))), (lambda a: torch.argsort(
            a, dim=ax, stable=True))
    else:
        import jax.numpy as jnp
        flip, order = (lambda a: jnp.flip(a, ax)), (lambda a: jnp.argsort(a, axis=ax,
                                                                          stable=True))
    idx = x.shape[ax] - 1 - flip(order(flip(x))) if descending else order(x)
    return idx[(slice(None),) * ax + (slice(0, n),)]


def _argsort_signatures(types, t):
    return [(types.Array(types.int64, 1, "C"), types.Array(t, 1, "C"), types.int64,
             types.int64, types.int64, types.boolean)]


def _argsort_static(shapes, attrs):
    (s,), axis, k = shapes, attrs["axis"], attrs["k"]
    if axis is None:
        raise BroadcastError(f"sort, argsort and topk take one axis, got {axis}")
    _one_axis("sort, argsort and topk", s, axis)
    if k is not None and not hasattr(k, "name") and (
            isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise BroadcastError(f"topk: k must be a non-negative integer, got {k!r}")
    if k is None:
        return s
    if s.dyn:
        return None
    return Shape(_statically(_g_argsort_shape, s.static, axis, attrs["descending"],
                             getattr(k, "name", k)))


ARGSORT = Primitive(
    "argsort", ("x",), LIBRARY, _g_argsort, vjp=(None,), jvp=(None,),
    lib="_g_argsort({x}, {axis!r}, {descending!r}, {k!r})",
    helpers=(_g_scan_axis, _g_argsort_shape, _g_argsort),
    cuda="_gc_argsort({x}, {axis!r}, {descending!r}, {k!r}, stream)",
    cuda_helpers=(_gc_argsort,), cuda_kernels=((_gck_argsort, _argsort_signatures),),
    dask=_gd_argsort, jax=_fw_argsort, torch=_fw_argsort,
    float_only=False, dtype="i64", differentiable=False,
    static_shape=_argsort_static, np_shape=_g_argsort_shape,
    keywords=(("axis", "axis", (-1,)), ("descending", "bool", False), ("k", "internal", None)),
    public=True)


def _np_sort(x, axis=(-1,), descending=False):
    return np.take_along_axis(x, _g_argsort(x, axis, descending), axis[0])


def _np_topk(x, k, axis=(-1,)):
    return np.take_along_axis(x, _g_argsort(x, axis, True, k), axis[0])


SORTS = (
    _composite("sort", _np_sort, """
    out = take_along_axis(x, argsort(x, axis=axis, descending=descending), axis=axis)""",
               keywords=(("axis", "axis", (-1,)), ("descending", "bool", False))),
    _composite("topk", _np_topk, """
    out = take_along_axis(x, argsort(x, axis=axis, descending=true, k=k), axis=axis)""",
               keywords=(("k", "int", None), ("axis", "axis", (-1,))), attr_params=("k",)),
)


# --- cumprod: the inclusive product scan, by a linear recurrence ---------------------
# cumprod(x, axis=, reverse=) is a decomposition (every backend gets it, and its
# derivative) over two internal primitives whose derivatives divide by nothing, so a
# zero in x is no special case:
#   shift(x, axis, reverse, fill): x moved one place along the axis (s_i = x_{i-1}, or
#     x_{i+1} when reverse), ``fill`` where nothing moves in; its VJP shifts back.
#   linear_scan(a, b, axis, reverse): s_0 = b_0, s_i = a_i s_{i-1} + b_i (from the last
#     element when reverse: s_i = a_i s_{i+1} + b_i); a_0 (a_{n-1}) is not read.  Its
#     transpose in b is the scan the other way over a shifted one place; in a, the
#     transpose times the shifted result.
# cumprod(x) = linear_scan(x, where(first, x, 0)) (first: the first element of each
# line), the products np.cumprod forms in its order; its VJP is then
# E * linear_scan(shift(x, back), g, back), E the exclusive products (PyTorch's
# zero-safe cumprod backward, in O(n)).


def _g_shift(x, axis, reverse, fill):
    """``x`` moved one place along ``axis`` (backwards when ``reverse``), ``fill`` in the
    place left empty."""
    x = np.asarray(x)
    ax = _g_scan_axis(x.ndim, axis)
    out = np.full(x.shape, fill, x.dtype)
    lead, rest = slice(0, -1), slice(1, None)
    pre = (slice(None),) * ax
    out[pre + (lead if reverse else rest,)] = x[pre + (rest if reverse else lead,)]
    return out


def _g_linear_scan(a, b, axis, reverse):
    """``s_0 = b_0, s_i = a_i s_{i-1} + b_i`` along ``axis`` (from the last element when
    ``reverse``), in the dtype of ``a`` and ``b``."""
    b = np.asarray(b)
    ax = _g_scan_axis(b.ndim, axis)
    a = np.moveaxis(np.broadcast_to(a, b.shape), ax, 0)
    s = np.moveaxis(np.array(b, dtype=np.result_type(a, b)), ax, 0)
    n = s.shape[0]
    for i in (range(n - 2, -1, -1) if reverse else range(1, n)):
        s[i] = a[i] * s[i + 1 if reverse else i - 1] + s[i]
    return np.ascontiguousarray(np.moveaxis(s, 0, ax))


def _gck_shift(out, x, n, inner, reverse, fill):
    """``out[j] = x[j - 1]`` (``x[j + 1]`` when ``reverse``) along lines of ``n`` (stride
    ``inner``), ``fill`` where that is outside the line: one thread per element."""
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        j = (t // inner) % n
        src = j + 1 if reverse else j - 1
        out[t] = x[t + (src - j) * inner] if 0 <= src < n else fill


def _gc_line_geometry(shape, axis):
    """(axis, n, inner, lines) of the lines a scan runs along in an array of ``shape``."""
    ax = _g_scan_axis(len(shape), axis)
    n = shape[ax]
    return ax, n, math.prod(shape[ax + 1:]), math.prod(shape) // n if n else 0


def _gc_shift(x, axis, reverse, fill, stream):
    """:func:`_g_shift` on the device (``_gck_shift``)."""
    x = _gc_dev(x, stream)
    ax, n, inner, lines = _gc_line_geometry(tuple(x.shape), axis)
    out = _gc_empty(x.shape, x.dtype, stream)
    if x.size:
        _gck_shift[_gc_blocks(x.size), _GC_BLOCK, stream](
            _gc_ravel(out), _gc_ravel(x), n, inner, bool(reverse), fill)
    return out


def _gc_linear_scan(a, b, axis, reverse, stream):
    """:func:`_g_linear_scan` on the device (``_gck_scan``, scaled)."""
    b = _gc_dev(b, stream)
    a = _gc_dev(a, stream)
    if tuple(a.shape) != tuple(b.shape):
        a = _gc_broadcast(a, tuple(b.shape), stream)
    ax, n, inner, lines = _gc_line_geometry(tuple(b.shape), axis)
    out = _gc_empty(b.shape, b.dtype, stream)
    if lines:
        _gck_scan[_gc_blocks(lines), _GC_BLOCK, stream](
            _gc_ravel(out), _gc_ravel(a), _gc_ravel(b), lines, n, inner, bool(reverse), True)
    return out


def _gd_shift(t, x, axis, reverse, fill):
    """:func:`_g_shift` of a Dask array (a slice and a filled edge: no rechunking)."""
    import dask.array as da
    ax = _g_scan_axis(x.ndim, axis)
    if x.shape[ax] == 0:
        return x
    pre = (slice(None),) * ax
    edge = da.full(x.shape[:ax] + (1,) + x.shape[ax + 1:], fill, dtype=x.dtype)
    if reverse:
        return da.concatenate([x[pre + (slice(1, None),)], edge], axis=ax)
    return da.concatenate([edge, x[pre + (slice(0, -1),)]], axis=ax)


def _gd_linear_scan(t, a, b, axis, reverse):
    """:func:`_g_linear_scan` of Dask arrays: the scanned axis made whole (one chunk)."""
    import dask.array as da
    ax = _g_scan_axis(b.ndim, axis)
    b = da.asarray(b).rechunk({ax: -1})
    a = da.broadcast_to(da.asarray(a), b.shape).rechunk(b.chunks)
    return da.map_blocks(_g_linear_scan, a, b, (ax,), reverse, dtype=b.dtype)


def _fw_shift(x, axis, reverse, fill):
    """:func:`_g_shift` of jax.numpy arrays or torch tensors."""
    ax = _g_scan_axis(x.ndim, axis)
    if x.shape[ax] == 0:
        return x
    pre, shape = (slice(None),) * ax, tuple(x.shape[:ax]) + (1,) + tuple(x.shape[ax + 1:])
    if hasattr(x, "index_select"):              # torch
        import torch
        cat, edge = torch.cat, torch.full(shape, fill, dtype=x.dtype, device=x.device)
    else:
        import jax.numpy as jnp
        cat, edge = jnp.concatenate, jnp.full(shape, fill, x.dtype)
    if reverse:
        return cat([x[pre + (slice(1, None),)], edge], ax)
    return cat([edge, x[pre + (slice(0, -1),)]], ax)


def _fw_linear_scan(a, b, axis, reverse):
    """:func:`_g_linear_scan` of jax.numpy arrays or torch tensors, one step per element
    of the axis."""
    ax = _g_scan_axis(b.ndim, axis)
    if hasattr(b, "index_select"):              # torch
        import torch
        a, stack = a.expand(b.shape), torch.stack
    else:
        import jax.numpy as jnp
        a, stack = jnp.broadcast_to(a, b.shape), jnp.stack
    n = b.shape[ax]
    if n == 0:
        return b
    pre = (slice(None),) * ax
    s, acc = [None] * n, None
    for i in (range(n - 1, -1, -1) if reverse else range(n)):
        acc = b[pre + (i,)] if acc is None else a[pre + (i,)] * acc + b[pre + (i,)]
        s[i] = acc
    return stack(s, ax)


def _shift_signatures(types, t):
    flat = types.Array(t, 1, "C")
    return [(flat, flat, types.int64, types.int64, types.boolean, t)]


_SCAN_KW = (("axis", "axis", None), ("reverse", "bool", False))
# The transpose of a scan in b: the other way, over a moved one place the other way.
_BACK = ("linear_scan(shift(a, axis=axis, reverse=1 - reverse), g, axis=axis, "
         "reverse=1 - reverse)")
SCANS = (
    Primitive(
        "shift", ("x",), LIBRARY, _g_shift,
        vjp=("shift(g, axis=axis, reverse=1 - reverse)",),
        jvp=("shift(x_t, axis=axis, reverse=reverse)",),
        lib="_g_shift({x}, {axis!r}, {reverse!r}, {fill!r})", helpers=(_g_scan_axis, _g_shift),
        cuda="_gc_shift({x}, {axis!r}, {reverse!r}, {fill!r}, stream)",
        cuda_helpers=(_gc_line_geometry, _gc_shift),
        cuda_kernels=((_gck_shift, _shift_signatures),),
        dask=_gd_shift, jax=_fw_shift, torch=_fw_shift,
        float_only=False, dtype="same", shape_like=0, static_shape=_scan_static,
        keywords=_SCAN_KW + (("fill", "internal", 0.0),)),
    Primitive(
        "linear_scan", ("a", "b"), LIBRARY, _g_linear_scan,
        vjp=(f"shift(out, axis=axis, reverse=reverse) * {_BACK}", _BACK),
        jvp=("linear_scan(a, a_t * shift(out, axis=axis, reverse=reverse), axis=axis, "
             "reverse=reverse)", "linear_scan(a, b_t, axis=axis, reverse=reverse)"),
        lib="_g_linear_scan({a}, {b}, {axis!r}, {reverse!r})",
        helpers=(_g_scan_axis, _g_linear_scan),
        cuda="_gc_linear_scan({a}, {b}, {axis!r}, {reverse!r}, stream)",
        cuda_helpers=(_gc_line_geometry, _gc_linear_scan),
        cuda_kernels=((_gck_scan, _scan_signatures),),
        dask=_gd_linear_scan, jax=_fw_linear_scan, torch=_fw_linear_scan,
        dtype="same", shape_like=1, static_shape=_scan_static, linear=(1,),
        keywords=_SCAN_KW),
    _composite("cumprod", lambda x, axis=None, reverse=False: _g_flip_scan(
        np.cumprod, x, axis, reverse), """
    first = shift(zeros_like(x), axis=axis, reverse=reverse, fill=1) > 0
    out = linear_scan(x, where(first, x, 0), axis=axis, reverse=reverse)""",
               keywords=_SCAN_KW, aliases=("cumulative_prod",)),
)


# --- random numbers: random_uniform_like, random_normal_like ------------------------
# A counter-based generator (Philox4x32-10: Salmon, Moraes, Dror and Shaw, "Parallel
# random numbers: as easy as 1, 2, 3", SC'11; Random123's reference): element i of a
# draw is a pure function of the key (the call's 64-bit seed), the counter (i's two
# words, the draw's stream, 0) and nothing else, so a CPU loop, a CUDA thread and a
# Dask chunk compute their elements independently and bit for bit alike, fused into
# the loop that reads them.  ``seed`` and ``draw_offset`` are source nodes: the call's
# seed (``seed=`` of every method of an op that draws; a fresh one when omitted) and
# the flat position of the loop's first element (0 but in a Dask chunk).  Each call of
# a drawing builtin in an op gets its own ``stream`` (ir.expr numbers them), so two
# draws differ.  random_uniform(x, seed, offset) is uniform in [0, 1) with x's shape,
# from the top 24 bits of one word (float32) or 53 bits of two (float64); ``part`` 1
# takes the other words of the same block (Box-Muller's second uniform).  Its value is a
# constant for differentiation.  The kernels' text is the body of _g_philox_uniform
# (printer.inline_body), which is also the NumPy reference: one formula everywhere.


def _g_philox(_xc0, _xc1, _xc2, _xc3, _xk0, _xk1):
    """Philox4x32-10: the four words of counter ``_xc*`` under key ``_xk*`` (uint64 values
    or arrays holding 32-bit words; every constant a uint64 too, as Numba makes a float
    of a uint64 and an int), so NumPy, Numba and CUDA compute alike."""
    for _xr in range(10):
        _xp0 = np.uint64(0xD2511F53) * _xc0
        _xp1 = np.uint64(0xCD9E8D57) * _xc2
        _xc0, _xc1, _xc2, _xc3 = (
            (_xp1 >> np.uint64(32)) ^ _xc1 ^ _xk0, _xp1 & np.uint64(0xFFFFFFFF),
            (_xp0 >> np.uint64(32)) ^ _xc3 ^ _xk1, _xp0 & np.uint64(0xFFFFFFFF))
        _xk0 = (_xk0 + np.uint64(0x9E3779B9)) & np.uint64(0xFFFFFFFF)
        _xk1 = (_xk1 + np.uint64(0xBB67AE85)) & np.uint64(0xFFFFFFFF)
    return _xc0, _xc1, _xc2, _xc3


def _g_philox_uniform(_xs, _xn, _xt, _xq, _T, _w):
    """Uniform numbers in [0, 1) of dtype ``_T`` (``_w`` an array of it) at flat indices
    ``_xn`` (int64) of stream ``_xt`` for the int64 seed ``_xs``: Philox4x32-10 of key
    (the seed's low and high words) and counter (the index's low and high words, the
    stream, 0); words 0 and 1 (``_xq`` 0) or 2 and 3 (``_xq`` 1) made a float from
    their top 24 (float32) or 53 (float64) bits."""
    _xw0, _xw1, _xw2, _xw3 = _g_philox(np.uint64(_xn & 0xFFFFFFFF), np.uint64(_xn >> 32), np.uint64(_xt), np.uint64(0), np.uint64(_xs & 0xFFFFFFFF), np.uint64((_xs >> 32) & 0xFFFFFFFF))
    _xa = _xw0 if _xq == 0 else _xw2
    _xb = _xw1 if _xq == 0 else _xw3
    return (_T(_xa >> np.uint64(8)) * _T(5.9604644775390625e-08) if _w.itemsize == 4 else
            _T((_xa << np.uint64(21)) | (_xb >> np.uint64(11))) * _T(1.1102230246251565e-16))


def _random_uniform(x, seed, offset, stream=0, part=0):
    """The reference: _g_philox_uniform over x's flat indices (``offset`` on)."""
    x = np.asarray(x)
    t = x.dtype.type if x.dtype.kind == "f" else np.float64
    index = np.arange(x.size, dtype=np.int64) + np.int64(offset)
    u = _g_philox_uniform(np.int64(seed), index, stream, part, t, np.empty(0, t))
    return np.asarray(u, dtype=t).reshape(x.shape)


def _fw_mulhilo(a, b):
    """The high and low words of the product of 32-bit words, from 16-bit halves (every
    intermediate below 2**32: uint32 arrays in JAX, int64 tensors in PyTorch)."""
    al, ah, bl, bh = a & 0xFFFF, a >> 16, b & 0xFFFF, b >> 16
    ll, lh, hl = al * bl, al * bh, ah * bl
    mid = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
    return ah * bh + (lh >> 16) + (hl >> 16) + (mid >> 16), ((mid & 0xFFFF) << 16) | (ll & 0xFFFF)


def _fw_random_uniform(x, seed, offset, stream=0, part=0):
    """random_uniform of a jax.numpy array or torch tensor: the kernels' Philox4x32-10
    with 32-bit words (no uint64 in JAX without x64, no uint32 arithmetic in PyTorch),
    so the same bits and the same numbers.  ``seed``: the int64 seed, or in JAX
    without x64 its two words as a uint32 pair (the adapter's)."""
    if hasattr(x, "index_select"):              # torch: words in int64 tensors
        import torch
        word = int
        n = torch.arange(x.numel(), dtype=torch.int64, device=x.device) + offset
        seed = torch.as_tensor(seed, dtype=torch.int64, device=x.device)
        k = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF]
        c = [n & 0xFFFFFFFF, n >> 32]
        zero, f32, f64 = n * 0, torch.float32, torch.float64
        cast = lambda v, dt: v.to(dt)
    else:                                       # JAX: uint32 words
        import jax.numpy as jnp
        word = jnp.uint32
        n = jnp.arange(x.size, dtype=jnp.uint32) + word(offset)
        k = ([word(seed & 0xFFFFFFFF), word((seed >> 32) & 0xFFFFFFFF)]
             if isinstance(seed, int) else [seed[0], seed[1]])
        zero, f32, f64 = n * 0, jnp.float32, jnp.float64
        c = [n, zero]
        cast = lambda v, dt: v.astype(dt)
    c += [zero + stream, zero]
    k0, k1 = k
    m = word(0xFFFFFFFF)
    for _ in range(10):
        h0, l0 = _fw_mulhilo(zero + word(0xD2511F53), c[0])
        h1, l1 = _fw_mulhilo(zero + word(0xCD9E8D57), c[2])
        c = [h1 ^ c[1] ^ k0, l1, h0 ^ c[3] ^ k1, l0]
        k0, k1 = (k0 + word(0x9E3779B9)) & m, (k1 + word(0xBB67AE85)) & m
    a, b = (c[0], c[1]) if part == 0 else (c[2], c[3])
    if x.dtype == f32:
        u = cast(a >> 8, f32) * 5.9604644775390625e-08
    else:
        u = (cast(a, f64) * 2097152.0 + cast(b >> 11, f64)) * 1.1102230246251565e-16
    return u.reshape(tuple(x.shape))


def _np_random_uniform_like(x, lo=0.0, hi=1.0, seed=0):
    v = lo + (hi - lo) * _random_uniform(x, seed, 0, 0, 0)
    return np.where(v < hi, v, lo)


def _np_random_normal_like(x, seed=0):
    u, v = (_random_uniform(x, seed, 0, 0, part) for part in (0, 1))
    return np.sqrt(-2 * np.log1p(-u)) * np.cos(2 * np.pi * v)


_DRAW = "u = random_uniform(x, seed, offset, stream=stream, part=0)"
RANDOM = (
    Primitive("seed", (), SOURCE, None, float_only=False, dtype="i64"),
    Primitive("draw_offset", (), SOURCE, None, float_only=False, dtype="i64"),
    Primitive("random_uniform", ("x", "seed", "offset"), ELEMENTWISE, _random_uniform,
              vjp=(None, None, None), jvp=(None, None, None), differentiable=False,
              cpu=_g_philox_uniform, float_only=True, shape_only=(0,), value_operands=(),
              value_bound=1.0, keywords=(("stream", "internal", 0), ("part", "internal", 0)),
              jax=_fw_random_uniform, torch=_fw_random_uniform),
    # lo + (hi - lo) u, kept below hi where it rounds up to it (hi - lo > 1, say)
    Primitive("random_uniform_like", ("x", "lo", "hi"), DECOMPOSED, _np_random_uniform_like,
              decomposition=f"""
    {_DRAW}
    v = lo + (hi - lo) * u
    out = where(v < hi, v, lo)""", float_only=False, public=True, draws=True,
              optional=(("lo", 0.0), ("hi", 1.0))),
    # Box-Muller: sqrt(-2 log(1 - u)) cos(2 pi v), 1 - u in (0, 1]: finite everywhere
    Primitive("random_normal_like", ("x",), DECOMPOSED, _np_random_normal_like,
              decomposition=f"""
    {_DRAW}
    v = random_uniform(x, seed, offset, stream=stream, part=1)
    out = sqrt(-2 * log1p(-u)) * cos(6.283185307179586 * v)""", float_only=False,
              public=True, draws=True),
)


# --- indexing: slices, integer-array indices, concat, arange -----------------------
# NumPy's indexing (docs/language.md, *Indexing*), lowered by gradc.ir.indexing:
#   slice(x, key): basic indexing, x[key] for a key of integers (an axis dropped), slices
#     (start, stop, step) and Ellipsis, whose bounds are ints or dims known at call time
#     (DimRef, DimExpr).  A view on the CPU; its VJP is its transpose, slice_transpose
#     (the cotangent written into zeros of x's shape: no two elements of a basic slice
#     share a place, so no accumulation), whose VJP is the slice again.  Out-of-range
#     integers, too many indices and a step of 0 are NumPy's IndexError and ValueError,
#     raised from the shapes before any read.
#   wrap_index(idx, like, axis=, shown=): an integer-array index of like's axis as non-negative
#     int64 (negative ones count from the end), IndexError for one out of range (NumPy's
#     message): the advanced indices, checked before the gather (take) reads them.
#   merge_axes(x, axis=, count=): count adjacent axes from axis merged into one (a
#     reshape): several advanced indices become one flat index into the merged axis.
#   concat(x, y, axis=): np.concatenate of two arrays (concat(a, b, c) is a chain, stack
#     a concat of expand_dims); its VJP takes each operand's part of the cotangent,
#     concat_part(g, like, axis=, part=) (the first like.shape[axis] elements along the
#     axis, part 0, or the last, part 1), whose VJP is concat_part_transpose (the part
#     written into zeros), the same slices with a key computed from the shapes.
#   arange(start, stop, step): np.arange of ints (or dims), int64; no operands, no gradient.
# On CUDA a slice is a strided gather from an offset (_gck_strided), its transpose and
# concat the same kernel's scatter.


def _g_index_key(key):
    """A slice's key attribute as NumPy's: its (start, stop, step) triples as slices."""
    return tuple(slice(*k) if isinstance(k, tuple) else k for k in key)


def _g_full_key(nd, key):
    """``key`` with its Ellipsis (or the axes it leaves out) as full slices: one item per
    axis of a rank-``nd`` array; IndexError as NumPy's for too many indices."""
    used = sum(1 for k in key if k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > nd:
        raise IndexError(f"too many indices for array: array is {nd}-dimensional, but "
                         f"{used} were indexed")
    full = []
    for k in key:
        full.extend([(None, None, None)] * (nd - used) if k is Ellipsis else [k])
    return full + [(None, None, None)] * (nd - len(full))


def _g_slice_geometry(shape, key):
    """(offset, shape, strides), in elements, of ``x[key]`` for a C-ordered ``x`` of
    ``shape``; IndexError and ValueError as NumPy's (out-of-range integers, too many
    indices, a step of 0)."""
    shape = tuple(int(n) for n in shape)
    stride, strides = 1, []
    for n in reversed(shape):
        strides.insert(0, stride)
        stride *= n
    off, out, out_strides = 0, [], []
    for ax, (k, n, st) in enumerate(zip(_g_full_key(len(shape), key), shape, strides)):
        if isinstance(k, tuple):
            if k[2] == 0:
                raise ValueError("slice step cannot be zero")
            start, stop, step = slice(*k).indices(n)
            m = len(range(start, stop, step))
            out.append(m)
            out_strides.append(st * step)
            off += start * st if m else 0
        else:
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {ax} with size {n}")
            off += (k % n) * st
    if 0 in out:
        off = 0
    return off, tuple(out), tuple(out_strides)


def _g_slice_shape(x, key):
    """The shape of ``x[key]`` for an array of shape ``x``."""
    return _g_slice_geometry(x, key)[1]


def _g_slice(x, key):
    """``x[key]`` (basic indexing): a view, its errors raised first (NumPy's)."""
    x = np.asarray(x)
    _g_slice_geometry(x.shape, key)
    return np.asarray(x[_g_index_key(key)])


def _g_slice_transpose(g, like, key):
    """The adjoint of :func:`_g_slice`: ``g`` written into zeros of ``like``'s shape."""
    g, shape = np.asarray(g), tuple(np.shape(like))
    _g_slice_geometry(shape, key)
    out = np.zeros(shape, g.dtype)
    out[_g_index_key(key)] = g
    return out


def _g_concat_axis(nd, axis):
    """The axis ``concat`` joins along, non-negative; ValueError as NumPy's."""
    if nd == 0:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    return _g_axes(nd, axis, "concat")[0]


def _g_concat_shape(x, y, axis):
    """The shape of ``concat`` of arrays of shapes ``x`` and ``y``; ValueError as NumPy's
    for ranks or sizes (but along the axis) that differ."""
    if len(x) != len(y):
        raise ValueError(f"concat: all the input arrays must have same number of dimensions, "
                         f"but the array at index 0 has {len(x)} dimension(s) and the array "
                         f"at index 1 has {len(y)} dimension(s)")
    ax = _g_concat_axis(len(x), axis)
    for i, (m, n) in enumerate(zip(x, y)):
        if i != ax and m != n:
            raise ValueError(f"concat: all the input array dimensions except for the "
                             f"concatenation axis must match exactly, but along dimension "
                             f"{i}, the array at index 0 has size {m} and the array at index "
                             f"1 has size {n}")
    return tuple(x[:ax]) + (x[ax] + y[ax],) + tuple(x[ax + 1:])


def _g_concat(x, y, axis):
    """``np.concatenate((x, y), axis)``, its errors raised first."""
    x, y = np.asarray(x), np.asarray(y)
    _g_concat_shape(x.shape, y.shape, axis)
    return np.concatenate((x, y), axis=_g_concat_axis(x.ndim, axis))


def _g_part_key(shape, n, axis, part):
    """The key of the first (``part`` 0) or last ``n`` elements along ``axis`` of an
    array of ``shape``: an operand's part of a concat."""
    ax = _g_concat_axis(len(shape), axis)
    lo = 0 if part == 0 else shape[ax] - n
    return ((None, None, None),) * ax + ((lo, lo + n, None),)


def _g_concat_part(x, like, axis, part):
    """``like``'s part of ``x``, a concat of it and another array (its VJP)."""
    x, shape = np.asarray(x), tuple(np.shape(like))
    return _g_slice(x, _g_part_key(x.shape, shape[_g_concat_axis(len(shape), axis)], axis,
                                   part))


def _g_concat_part_transpose(g, like, axis, part):
    """The adjoint of :func:`_g_concat_part`: ``g`` written into zeros of ``like``'s shape."""
    g, shape = np.asarray(g), tuple(np.shape(like))
    key = _g_part_key(shape, g.shape[_g_concat_axis(g.ndim, axis)], axis, part)
    return _g_slice_transpose(g, like, key)


def _g_wrap_index(idx, like, axis, shown=None):
    """Integer-array indices of ``like``'s axis ``axis`` (a 1-tuple; ``like`` an array or
    its shape) as non-negative int64; IndexError for one outside [-n, n), NumPy's, which
    names the axis ``shown`` where ``like`` is the indexed array's permutation."""
    shape = tuple(getattr(like, "shape", like))
    _g_indexed(len(shape), axis[0] + 1)
    ax = _g_axes(len(shape), axis, "index")[0]
    return _g_take_index(idx, shape[ax], False, ax if shown is None else shown)


def _g_indexed(ndim, k):
    """NumPy's IndexError for an array of rank ``ndim`` indexed by ``k`` indices or more
    (an array whose rank the compiler did not know: ``x[arange(n), labels]`` of a 1-d
    ``x``)."""
    if k > ndim:
        raise IndexError(f"too many indices for array: array is {ndim}-dimensional, but "
                         f"at least {k} were indexed")


def _g_merge_axes_shape(x, axis, count=2):
    """The shape of an array of shape ``x`` with ``count`` axes from ``axis`` merged."""
    if axis[0] >= 0:                    # (an index's axes count from the first)
        _g_indexed(len(x), axis[0] + count)
    (ax,) = _g_axes(len(x), axis, "merge_axes")
    return tuple(x[:ax]) + (math.prod(x[ax:ax + count]),) + tuple(x[ax + count:])


def _g_merge_axes(x, axis, count=2):
    x = np.asarray(x)
    return np.reshape(x, _g_merge_axes_shape(x.shape, axis, count))


def _g_arange_shape(start=0, stop=None, step=1):
    """The shape of ``np.arange(start, stop, step)`` of ints; ValueError for a step of 0."""
    if step == 0:
        raise ValueError("arange: the step must not be zero")
    return (max(0, -((start - stop) // step)),)


def _g_arange(start=0, stop=None, step=1):
    """``np.arange(start, stop, step)``, int64."""
    return np.arange(start, start + step * _g_arange_shape(start, stop, step)[0], step,
                     dtype=np.int64)


def _gck_strided(dst, src, off, shape, strides, scatter):
    """A strided copy over ``shape`` (C order): element ``i``'s place is ``off`` plus its
    index dotted with ``strides`` (negative for a negative step); ``dst[i] =
    src[place]`` (a slice), or ``dst[place] = src[i]`` when ``scatter`` (its transpose:
    the places of a basic slice are distinct, so no atomics)."""
    nd = len(shape)
    for i in range(cuda.grid(1), src.size if scatter else dst.size, cuda.gridsize(1)):
        rest = i
        place = off
        for d in range(nd - 1, -1, -1):
            n = shape[d]
            place += (rest % n) * strides[d]
            rest //= n
        if scatter:
            dst[place] = src[i]
        else:
            dst[i] = src[place]


def _gc_strided(dst, src, key, scatter, stream):
    """``dst = src[key]`` (a new array), or ``dst[key] = src`` when ``scatter``, on the
    device (``_gck_strided``); ``dst`` returned."""
    src = _gc_dev(src, stream)
    off, shape, strides = _g_slice_geometry(tuple((dst if scatter else src).shape), key)
    if dst is None:
        dst = _gc_empty(shape, src.dtype, stream)
    if math.prod(shape):
        if scatter and tuple(src.shape) != shape:
            src = _gc_broadcast(src, shape, stream)
        if not shape:
            shape, strides = (1,), (0,)
        _gck_strided[_gc_blocks(math.prod(shape)), _GC_BLOCK, stream](
            _gc_ravel(dst), _gc_ravel(src), off, shape, tuple(strides), bool(scatter))
    return dst


def _gc_slice(x, key, stream):
    """:func:`_g_slice` on the device: a strided gather (``_gck_strided``)."""
    return _gc_strided(None, x, key, False, stream)


def _gc_scatter(dst, src, key, stream):
    """``dst[key] = src`` on the device (``_gck_strided``); ``dst`` returned."""
    return _gc_strided(dst, src, key, True, stream)


def _gc_slice_transpose(g, like, key, stream):
    """:func:`_g_slice_transpose` on the device."""
    g = _gc_dev(g, stream)
    return _gc_scatter(_gc_zeros(tuple(like.shape), g.dtype, stream), g, key, stream)


def _gc_concat(x, y, axis, stream):
    """:func:`_g_concat` on the device: both operands scattered into one new array."""
    x, y = _gc_dev(x, stream), _gc_dev(y, stream)
    shape = _g_concat_shape(tuple(x.shape), tuple(y.shape), axis)
    ax = _g_concat_axis(len(shape), axis)
    out = _gc_empty(shape, x.dtype, stream)
    _gc_scatter(out, x, _g_part_key(shape, x.shape[ax], axis, 0), stream)
    return _gc_scatter(out, y, _g_part_key(shape, y.shape[ax], axis, 1), stream)


def _gc_concat_part(x, like, axis, part, stream):
    """:func:`_g_concat_part` on the device."""
    x, shape = _gc_dev(x, stream), tuple(like.shape)
    n = shape[_g_concat_axis(len(shape), axis)]
    return _gc_slice(x, _g_part_key(tuple(x.shape), n, axis, part), stream)


def _gc_concat_part_transpose(g, like, axis, part, stream):
    """:func:`_g_concat_part_transpose` on the device."""
    g, shape = _gc_dev(g, stream), tuple(like.shape)
    key = _g_part_key(shape, g.shape[_g_concat_axis(len(g.shape), axis)], axis, part)
    return _gc_slice_transpose(g, like, key, stream)


def _gc_wrap_index(idx, like, axis, shown, stream):
    """:func:`_g_wrap_index` on the device: checked and wrapped on the host (indices are
    small beside the data they select)."""
    idx = _gc_dev(idx, stream)
    return _gc_upload(_g_wrap_index(idx.copy_to_host(stream=stream), tuple(like.shape), axis,
                                    shown), stream)


def _gc_arange(start, stop, step, stream):
    """:func:`_g_arange` on the device (uploaded: its values are its shape's)."""
    return cuda.to_device(_g_arange(start, stop, step), stream=stream)


def _gd_slice(t, x, key):
    """:func:`_g_slice` of a Dask array (Dask's slicing)."""
    x = _gd_array(x)
    _g_slice_geometry(x.shape, key)
    return x[_g_index_key(key)]


def _gd_slice_transpose(t, g, like, key):
    """:func:`_g_slice_transpose` of a Dask array: zeros chunked as ``like``, assigned."""
    import dask.array as da
    like, g = _gd_array(like), _gd_array(g)
    _g_slice_geometry(like.shape, key)
    out = da.zeros(like.shape, dtype=g.dtype, chunks=like.chunks)
    out[_g_index_key(key)] = g
    return out


def _gd_concat(t, x, y, axis):
    import dask.array as da
    x, y = _gd_array(x), _gd_array(y)
    _g_concat_shape(x.shape, y.shape, axis)
    return da.concatenate([x, y], axis=_g_concat_axis(x.ndim, axis))


def _gd_concat_part(t, x, like, axis, part):
    x, shape = _gd_array(x), tuple(like.shape)
    n = shape[_g_concat_axis(len(shape), axis)]
    return _gd_slice(t, x, _g_part_key(x.shape, n, axis, part))


def _gd_concat_part_transpose(t, g, like, axis, part):
    g = _gd_array(g)
    key = _g_part_key(tuple(like.shape), g.shape[_g_concat_axis(g.ndim, axis)], axis, part)
    return _gd_slice_transpose(t, g, like, key)


def _gd_wrap_index(t, idx, like, axis, shown=None, *, op=None):
    import dask.array as da
    return da.map_blocks(_gd_named, _gd_array(idx), tuple(like.shape), axis, shown,
                         fn=_g_wrap_index, op=op, dtype=np.int64)


def _gd_merge_axes(t, x, axis, count=2):
    return _gd_reshape_to(_gd_array(x), _g_merge_axes_shape(x.shape, axis, count))


def _gd_arange(t, start=0, stop=None, step=1):
    import dask.array as da
    return da.from_array(_g_arange(start, stop, step))


def _fw_positive_key(shape, key):
    """(axes to flip, a key without negative steps) for frameworks whose slices take
    no negative step (PyTorch): x[key] is flip(x, axes)[positive key]."""
    flips, out = [], []
    axis = 0
    for k in _g_full_key(len(shape), key):
        if not isinstance(k, tuple):
            out.append(k)
        elif k[2] is not None and k[2] < 0:
            n = shape[axis]
            start, stop, step = slice(*k).indices(n)
            m = len(range(start, stop, step))
            lo = n - 1 - start if m else 0
            out.append(slice(lo, lo - step * (m - 1) + 1 if m else 0, -step))
            flips.append(axis)
        else:
            out.append(slice(*k))
        axis += 1
    return tuple(flips), tuple(out)


def _fw_flip(x, axes):
    if not axes:
        return x
    if hasattr(x, "index_select"):              # torch
        import torch
        return torch.flip(x, axes)
    import jax.numpy as jnp
    return jnp.flip(x, axes)


def _fw_slice(x, key):
    """:func:`_g_slice` of jax.numpy arrays or torch tensors."""
    _g_slice_geometry(tuple(x.shape), key)
    flips, pos = _fw_positive_key(tuple(x.shape), key)
    return _fw_flip(x, flips)[pos]


def _fw_slice_transpose(g, like, key):
    """:func:`_g_slice_transpose` in JAX or PyTorch."""
    shape = tuple(like.shape)
    _g_slice_geometry(shape, key)
    flips, pos = _fw_positive_key(shape, key)
    if hasattr(g, "index_select"):              # torch
        import torch
        out = torch.zeros(shape, dtype=g.dtype, device=g.device)
        out[pos] = g
    else:
        import jax.numpy as jnp
        out = jnp.zeros(shape, g.dtype).at[pos].set(g)
    return _fw_flip(out, flips)


def _fw_concat(x, y, axis):
    _g_concat_shape(tuple(x.shape), tuple(y.shape), axis)
    ax = _g_concat_axis(len(x.shape), axis)
    if hasattr(x, "index_select"):              # torch
        import torch
        return torch.cat([x, y.to(x.dtype)], ax)
    import jax.numpy as jnp
    return jnp.concatenate([x, y], ax)


def _fw_concat_part(x, like, axis, part):
    shape = tuple(like.shape)
    n = shape[_g_concat_axis(len(shape), axis)]
    return _fw_slice(x, _g_part_key(tuple(x.shape), n, axis, part))


def _fw_concat_part_transpose(g, like, axis, part):
    shape = tuple(like.shape)
    key = _g_part_key(shape, g.shape[_g_concat_axis(len(g.shape), axis)], axis, part)
    return _fw_slice_transpose(g, like, key)


def _fw_wrap_index(idx, like, axis, shown=None):
    """:func:`_g_wrap_index` in JAX or PyTorch.  JAX checks nothing (a jitted function
    cannot raise): an index outside [-n, n) is clamped into its own axis, as JAX's
    ``x[idx]`` reads it, so that the flat index of several axes (``merge_axes``) never
    reaches another row; the VJP's scatter-add goes to the element read."""
    shape = tuple(like.shape)
    ax = _g_axes(len(shape), axis, "index")[0]
    n = shape[ax]
    if hasattr(idx, "index_select"):            # torch
        if idx.numel():
            _g_wrap_index(idx.detach().cpu().numpy(), shape, axis, shown)   # its IndexError
        return (idx + n * (idx < 0)).long()
    import jax
    import jax.numpy as jnp
    return jnp.clip(jnp.where(idx < 0, idx + n, idx), 0, max(n - 1, 0)).astype(
        jax.dtypes.canonicalize_dtype(jnp.int64))       # int32 where x64 is off: no warning


def _fw_arange(start=0, stop=None, step=1):
    import jax.numpy as jnp
    return jnp.asarray(_g_arange(start, stop, step))


def _torch_arange(start=0, stop=None, step=1):
    import torch
    return torch.arange(start, start + step * _g_arange_shape(start, stop, step)[0], step,
                        dtype=torch.int64)


def _strided_signatures(types, t):
    flat, i64 = types.Array(t, 1, "C"), types.int64
    return [(flat, flat, i64, types.UniTuple(i64, nd), types.UniTuple(i64, nd), types.boolean)
            for nd in (1, 2, 3)]


def _slice_static(shapes, attrs):
    """x[key]'s shape where x's dims and the key's integers say it, else None (at run
    time: a slice by a dim clips to the axis, which a shape class cannot say)."""
    s, key = shapes[0], attrs["key"]
    if s.dyn:
        return None
    full = _statically(_g_full_key, len(s.static), key)
    out = []
    for k, d in zip(full, s.static):
        if k == (None, None, None):
            out.append(d)
        elif not isinstance(d, int) or not all(isinstance(v, (int, type(None)))
                                               for v in (k if isinstance(k, tuple) else (k,))):
            return None
        elif isinstance(k, tuple):
            out.append(_statically(_g_slice_shape, (d,), (k,))[0])
        else:
            _statically(_g_slice_shape, (d,), (k,))
    return Shape(tuple(out))


def _concat_static(shapes, attrs):
    x, y = shapes
    if x.dyn or y.dyn:
        return None
    if len(x.static) != len(y.static) or all(isinstance(d, int) for d in x.static + y.static):
        return Shape(_statically(_g_concat_shape, x.static, y.static, attrs["axis"]))
    ax = _statically(_g_concat_axis, len(x.static), attrs["axis"])
    for i, (m, n) in enumerate(zip(x.static, y.static)):
        if i != ax and m != n and isinstance(m, int) and isinstance(n, int):
            _statically(_g_concat_shape, x.static, y.static, attrs["axis"])
    return None


def _merge_axes_static(shapes, attrs):
    (s,), count = shapes, attrs["count"]
    if s.dyn:
        return None
    _statically(_g_merge_axes_shape, (1,) * len(s.static), attrs["axis"], count)
    ax = _g_axes(len(s.static), attrs["axis"], "merge_axes")[0]
    merged = s.static[ax:ax + count]
    if not all(isinstance(d, int) for d in merged):
        return None
    return Shape(s.static[:ax] + (math.prod(merged),) + s.static[ax + count:])


def _arange_static(shapes, attrs):
    """arange's shape where it is known before the call: of ints; or of a step of 1 or
    -1 and bounds whose difference is one dim (``arange(n)``, ``arange(1, n + 1)``,
    ``arange(n, 0, -1)``: ``(n,)``) or a number (``arange(n, n + 3)``: ``(3,)``)."""
    start, stop, step = attrs["start"], attrs["stop"], attrs["step"]
    if all(isinstance(v, int) for v in (start, stop, step)):
        return Shape(_statically(_g_arange_shape, start, stop, step))
    if step not in (1, -1):
        return None
    length = affine(dim_op("-", stop, start) if step == 1 else dim_op("-", start, stop))
    if length is None:
        return None
    terms, c = length
    if not terms:
        return Shape((max(c, 0),))
    if c == 0 and list(terms.values()) == [1]:       # n: a size, never negative
        return Shape(tuple(terms))
    return None


def _concat_part(name, transpose, ref, gc, gd, fw) -> Primitive:
    """concat_part or its transpose: linear in ``x``, each the other's VJP."""
    return Primitive(
        name, ("x", "like"), LIBRARY, ref,
        vjp=(f"{transpose}(g, x, axis=axis, part=part)", None),
        jvp=(f"{name}(x_t, like, axis=axis, part=part)", None),
        lib=f"{ref.__name__}({{x}}, {{like}}, {{axis!r}}, {{part!r}})",
        helpers=_SLICE_HELPERS + (ref,),
        cuda=f"{gc.__name__}({{x}}, {{like}}, {{axis!r}}, {{part!r}}, stream)",
        cuda_helpers=_SLICE_CUDA + (gc,), cuda_kernels=_STRIDED, dask=gd, jax=fw, torch=fw,
        float_only=False, dtype="same", linear=(0,), shape_like=1, shape_only=(1,),
        value_operands=(0,), keywords=(("axis", "axis", (0,)), ("part", "internal", 0)))


_SLICE_HELPERS = (_g_axes, _g_index_key, _g_full_key, _g_slice_geometry, _g_slice_shape,
                  _g_slice, _g_slice_transpose, _g_concat_axis, _g_concat_shape, _g_part_key,
                  _gd_slice, _gd_slice_transpose)
_SLICE_CUDA = (_gc_zeros, _gc_strided, _gc_slice, _gc_scatter, _gc_slice_transpose)
_STRIDED = ((_gck_strided, _strided_signatures),)
INDEXING = (
    Primitive(
        "slice", ("x",), LIBRARY, _g_slice,
        vjp=("slice_transpose(g, x, key=key)",), jvp=("slice(x_t, key=key)",),
        lib="_g_slice({x}, {key!r})", helpers=_SLICE_HELPERS,
        cuda="_gc_slice({x}, {key!r}, stream)", cuda_helpers=_SLICE_CUDA,
        cuda_kernels=_STRIDED,
        dask=_gd_slice, jax=_fw_slice, torch=_fw_slice,
        float_only=False, dtype="same", linear=(0,), static_shape=_slice_static,
        np_shape=_g_slice_shape, keywords=(("key", "internal", ()),)),
    Primitive(
        "slice_transpose", ("x", "like"), LIBRARY, _g_slice_transpose,
        vjp=("slice(g, key=key)", None), jvp=("slice_transpose(x_t, like, key=key)", None),
        lib="_g_slice_transpose({x}, {like}, {key!r})", helpers=_SLICE_HELPERS,
        cuda="_gc_slice_transpose({x}, {like}, {key!r}, stream)",
        cuda_helpers=_SLICE_CUDA, cuda_kernels=_STRIDED,
        dask=_gd_slice_transpose, jax=_fw_slice_transpose, torch=_fw_slice_transpose,
        float_only=False, dtype="same", linear=(0,), shape_like=1, shape_only=(1,),
        value_operands=(0,), keywords=(("key", "internal", ()),)),
    Primitive(
        "concat", ("x", "y"), LIBRARY, _g_concat,
        vjp=("concat_part(g, x, axis=axis, part=0)", "concat_part(g, y, axis=axis, part=1)"),
        jvp=("concat_part_transpose(x_t, out, axis=axis, part=0)",
             "concat_part_transpose(y_t, out, axis=axis, part=1)"),
        lib="_g_concat({x}, {y}, {axis!r})", helpers=_SLICE_HELPERS + (_g_concat, _gd_array),
        cuda="_gc_concat({x}, {y}, {axis!r}, stream)", cuda_helpers=_SLICE_CUDA + (_gc_concat,),
        cuda_kernels=_STRIDED,
        dask=_gd_concat, jax=_fw_concat, torch=_fw_concat,
        float_only=False, dtype="same", linear=(0, 1), static_shape=_concat_static,
        np_shape=_g_concat_shape, keywords=(("axis", "axis", (0,)),)),
    *(_concat_part(*names, ref, gc, gd, fw) for names, ref, gc, gd, fw in (
        (("concat_part", "concat_part_transpose"), _g_concat_part, _gc_concat_part,
         _gd_concat_part, _fw_concat_part),
        (("concat_part_transpose", "concat_part"), _g_concat_part_transpose,
         _gc_concat_part_transpose, _gd_concat_part_transpose, _fw_concat_part_transpose))),
    Primitive(
        "wrap_index", ("idx", "like"), LIBRARY, _g_wrap_index, vjp=(None, None),
        jvp=(None, None), lib="_g_wrap_index({idx}, {like}.shape, {axis!r}, {shown!r})",
        helpers=(_g_axes, _g_indexed, _g_take_index, _g_wrap_index, _gd_array, _gd_named),
        cuda="_gc_wrap_index({idx}, {like}, {axis!r}, {shown!r}, stream)",
        cuda_helpers=(_gc_wrap_index,),
        dask=_gd_wrap_index, jax=_fw_wrap_index, torch=_fw_wrap_index,
        float_only=False, dtype="i64", differentiable=False, shape_like=0, shape_only=(1,),
        index_operands=(0,), value_operands=(), keywords=(("axis", "axis", (0,)), ("shown", "internal", None))),
    _layout("merge_axes", ("x",), _g_merge_axes, ("reshape_like(g, x)",),
            ("merge_axes(x_t, axis=axis, count=count)",),
            "_g_merge_axes({x}, {axis!r}, {count!r})",
            "_gc_layout({x}, _g_merge_axes_shape, stream, axis={axis!r}, count={count!r})",
            _gd_merge_axes, _fw_reshaped(_g_merge_axes_shape),
            (("axis", "axis", (0,)), ("count", "internal", 2)),
            static_shape=_merge_axes_static, np_shape=_g_merge_axes_shape,
            helpers=_LAYOUT_HELPERS + (_gd_reshape_to, _g_indexed, _g_merge_axes)),
    Primitive(
        "arange", (), LIBRARY, _g_arange, lib="_g_arange({start!r}, {stop!r}, {step!r})",
        helpers=(_g_arange,), cuda="_gc_arange({start!r}, {stop!r}, {step!r}, stream)",
        cuda_helpers=(_gc_arange,), dask=_gd_arange, jax=_fw_arange, torch=_torch_arange,
        float_only=False, dtype="i64", differentiable=False, static_shape=_arange_static,
        np_shape=_g_arange_shape,
        keywords=(("start", "internal", 0), ("stop", "internal", 0), ("step", "internal", 1))),
)


# --- dim_size: a dim of the signature as a value ----------------------------------
# ``k`` in an expression, for ``x: [n, k]``: the size of ``x``'s axis ``index``
# (counted from the end), an int64 known at call time (ir.expr.dim_scope makes it);
# ``x`` is read only for its shape.


def _dim_size(x, index):
    return np.asarray(np.shape(x)[index], dtype=np.int64)


def _gd_dim_size(t, x, index):
    return np.int64(x.shape[index])


def _torch_dim_size(x, index):
    import torch
    return torch.tensor(x.shape[index])


DIM_SIZE = Primitive(
    "dim_size", ("x",), LIBRARY, _dim_size, vjp=(None,), jvp=(None,),
    lib="np.int64({x}.shape[{index!r}])", cuda="np.int64(tuple({x}.shape)[{index!r}])",
    dask=_gd_dim_size, jax=_dim_size, torch=_torch_dim_size,
    float_only=False, dtype="i64", differentiable=False, shape_only=(0,),
    static_shape=lambda shapes, attrs: SCALAR, keywords=(("index", "internal", -1),))


PRIMITIVES = MappingProxyType({p.name: p for p in [
    # --- sources -----------------------------------------------------------
    Primitive("param", (), SOURCE, None, float_only=False, dtype="same"),
    Primitive("const", (), SOURCE, None, float_only=False, dtype="same"),
    # --- arithmetic --------------------------------------------------------
    _ew("add", "x y", np.add, ("g", "g"), "({x} + {y})", float_only=False, dtype="same",
        jvp=("x_t", "y_t"), linear=(0, 1),
        jax="jnp.add", torch="torch.add"),
    _ew("sub", "x y", np.subtract, ("g", "-g"), "({x} - {y})", float_only=False, dtype="same",
        jvp=("x_t", "-y_t"), linear=(0, 1),
        jax="jnp.subtract", torch="torch.subtract"),
    _ew("mul", "x y", np.multiply, ("g * y", "g * x"), "({x} * {y})", float_only=False,
        dtype="same", jvp=("x_t * y", "x * y_t"), linear=(0, 1), multilinear=True,
        jax="jnp.multiply", torch="torch.multiply"),
    _ew("div", "x y", np.divide, ("g / y", "-g * out / y"), "({x} / {y})", domain=NONZERO,
        jvp=("x_t / y", "-y_t * out / y"), linear=(0,),
        jax="jnp.divide", torch="torch.divide"),
    _unary("neg", np.negative, "-g", "(-{x})", float_only=False, dtype="same", linear=(0,),
           public=False,
           jax="jnp.negative", torch="torch.neg"),
    # x^y: d/dy uses log(x) only where x > 0, so (0, 1) gives (1, 0), not NaN.
    _ew("pow", "x y", np.power,
        ("g * where(y == 0, 0, y * pow(x, y - 1))",
         "g * where(x <= 0, 0, out * log(where(x <= 0, 1, x)))"),
        "_g_pow({x}, {y})", domain=POSITIVE, public=True,
        jax="jnp.power", torch="torch.pow"),
    _ew("maximum", "x y", _maximum,
        ("where(x > y, g, where(x == y, 0.5 * g, 0))",
         "where(y > x, g, where(x == y, 0.5 * g, 0))"),
        "({x} if ({x} > {y} or {x} != {x}) else {y})", float_only=False, dtype="same",
        jax="jnp.maximum", torch="torch.maximum"),
    _ew("minimum", "x y", np.minimum,
        ("where(x < y, g, where(x == y, 0.5 * g, 0))",
         "where(y < x, g, where(x == y, 0.5 * g, 0))"),
        "({x} if ({x} < {y} or {x} != {x}) else {y})", float_only=False, dtype="same",
        jax="jnp.minimum", torch="torch.minimum"),
    _ew("atan2", "y x", np.arctan2, ("g * x / (x * x + y * y)", "-g * y / (x * x + y * y)"),
        "_g_atan2({y}, {x})", domain=NONZERO, public=True,
        jax="jnp.arctan2", torch="torch.arctan2"),
    _cmp("lt", np.less, "<"), _cmp("le", np.less_equal, "<="),
    _cmp("gt", np.greater, ">"), _cmp("ge", np.greater_equal, ">="),
    _cmp("eq", np.equal, "=="), _cmp("ne", np.not_equal, "!="),
    _ew("where", "c x y", _where, (None, "where(c, g, 0)", "where(c, 0, g)"),
        "({x} if {c} else {y})", float_only=False, dtype="same", linear=(1, 2), public=True,
        value_operands=(1, 2),
        jax="jnp.where", torch="torch.where"),
    # clip = min(max(x, lo), hi), as np.clip (so hi wins when lo > hi, and a NaN x, lo
    # or hi gives NaN, as np.clip and torch.clamp do).
    _ew("clip", "x lo hi", lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
        ("where((x >= lo) * (x <= hi), g, 0)", "where((x < lo) * (lo <= hi), g, 0)",
         "where(max(x, lo) > hi, g, 0)"),
        "({hi} if (" + _CLIP_LO + " > {hi} or {hi} != {hi}) else " + _CLIP_LO + ")",
        float_only=False, dtype="same", public=True,
        jax=_jax_clip, torch=_torch_clip),
    _ew("full_like", "x v", lambda x, v: np.full_like(x, v, dtype=np.result_type(v)),
        (None, "g"), "{dt}({v})", float_only=False, dtype="same", shape_only=(0,), linear=(1,),
        public=True, value_operands=(1,),
        jax=_jax_full_like, torch=_torch_full_like),
    _unary("cast", lambda x: x, "g", "{dt}({x})", float_only=False, linear=(0,), public=False,
           may_refuse=False, jax=_same, torch=_same),
    # identity: marks a custom-gradient call's result; removed by simplification.
    _unary("identity", lambda x: x, "g", "{x}", float_only=False, dtype="same", linear=(0,),
           public=False,
           jax=_same, torch=_same),
    _unary("stop_gradient", lambda x: x, None, "{x}", float_only=False, dtype="same",
           differentiable=False, linear=(0,),
           jax="jax.lax.stop_gradient", torch=_torch_stop_gradient),
    # zero_masked(x, u): x, but 0 where u == 0 and x is NaN. The NaN-safe product of
    # autodiff (core.nan_safe): x is a rule's result, linear in the cotangent or tangent u,
    # and 0 * inf must stay 0. Where x is a number it is x, so a derivative of a gradient
    # sees x's dependence on u; its own derivative passes g where it does not mask.
    # Internal. Linear in x: u is read only by the test u == 0, which scaling the
    # cotangent does not change (x != x is NaN, kept NaN by any scale but 0).
    # Two selects, not one of (u == 0) & (x != x) (nor |, nor or): where u is a row's
    # value (a row kernel's cotangent), LLVM vectorised the & of that scalar test and
    # the vector one in 16-bit lanes, packed and unpacked: 8 more instructions per
    # vector (cross-entropy's fwd_bwd at rows of 64: 1.04-1.14x faster with two).
    _ew("zero_masked", "x u", lambda x, u: np.where((u == 0) & (x != x), 0.0, x),
        ("where((u == 0) * (x != x), 0, g)", None),
        "({x} if {x} == {x} else ({dt}(0) if {u} == {dt}(0) else {x}))",
        linear=(0,), scale_tested=(1,), jax=_jax_zero_masked, torch=_torch_zero_masked),
    # --- elementwise math ----------------------------------------------------
    _unary("abs", np.abs, "g * sign(x)", "abs({x})", float_only=False, dtype="same",
           jax="jnp.abs", torch="torch.abs"),
    # Selects, not np.sign: Numba's np.sign gives -0.0 for -0.0 (NumPy: 0.0) and its
    # loop vectorises worse (sign_ste's fwd_bwd: 13.2 ms vs 11.3 at 10^7 float32)
    _unary("sign", np.sign, None,
           "({dt}(1) if {x} > {dt}(0) else ({dt}(-1) if {x} < {dt}(0) else "
           "({x} if {x} != {x} else {dt}(0))))", float_only=False, dtype="same",
           differentiable=False, value_bound=1.0,
           jax="jnp.sign", torch="torch.sign"),
    _unary("floor", np.floor, None, "np.floor({x})", differentiable=False,
           jax="jnp.floor", torch="torch.floor"),
    _unary("ceil", np.ceil, None, "np.ceil({x})", differentiable=False,
           jax="jnp.ceil", torch="torch.ceil"),
    _unary("round", np.rint, None, "np.rint({x})", differentiable=False,
           jax="jnp.rint", torch="torch.round"),
    _unary("exp", np.exp, "g * out", "_g_exp({x})",
           jax="jnp.exp", torch="torch.exp"),
    _unary("exp2", np.exp2, "g * out * 0.6931471805599453", "_g_exp2({x})",
           jax="jnp.exp2", torch="torch.exp2"),
    _unary("expm1", np.expm1, "g * (out + 1)", "_g_expm1({x})",
           jax="jnp.expm1", torch="torch.expm1"),
    _unary("log", np.log, "g / x", "_g_log({x})", domain=POSITIVE,
           jax="jnp.log", torch="torch.log"),
    _unary("log2", np.log2, "g / (x * 0.6931471805599453)", "_g_log2({x})", domain=POSITIVE,
           jax="jnp.log2", torch="torch.log2"),
    _unary("log10", np.log10, "g / (x * 2.302585092994046)", "_g_log10({x})",
           domain=POSITIVE,
           jax="jnp.log10", torch="torch.log10"),
    _unary("log1p", np.log1p, "g / (1 + x)", "_g_log1p({x})", domain=POSITIVE,
           jax="jnp.log1p", torch="torch.log1p"),
    _unary("sqrt", np.sqrt, "g * 0.5 / out", "np.sqrt({x})", domain=POSITIVE,
           jax="jnp.sqrt", torch="torch.sqrt"),
    _unary("rsqrt", lambda x: 1 / np.sqrt(x), "g * -0.5 * out / x", "({dt}(1) / np.sqrt({x}))",
           domain=POSITIVE,
           jax="jax.lax.rsqrt", torch="torch.rsqrt"),
    _unary("square", np.square, "g * 2 * x", "({x} * {x})",
           jax="jnp.square", torch="torch.square"),
    _unary("reciprocal", np.reciprocal, "-g * out * out", "({dt}(1) / {x})", domain=NONZERO,
           jax="jnp.reciprocal", torch="torch.reciprocal"),
    _unary("sin", np.sin, "g * cos(x)", "_g_sin({x})",
           jax="jnp.sin", torch="torch.sin"),
    _unary("cos", np.cos, "-g * sin(x)", "_g_cos({x})",
           jax="jnp.cos", torch="torch.cos"),
    _unary("tan", np.tan, "g * (1 + out * out)", "_g_tan({x})", domain=UNIT,
           jax="jnp.tan", torch="torch.tan"),
    _unary("asin", np.arcsin, "g * rsqrt(1 - x * x)", "_g_asin({x})", domain=UNIT,
           jax="jnp.arcsin", torch="torch.arcsin"),
    _unary("acos", np.arccos, "-g * rsqrt(1 - x * x)", "_g_acos({x})", domain=UNIT,
           jax="jnp.arccos", torch="torch.arccos"),
    _unary("atan", np.arctan, "g / (1 + x * x)", "_g_atan({x})", value_bound=np.pi / 2,
           jax="jnp.arctan", torch="torch.arctan"),
    _unary("sinh", np.sinh, "g * cosh(x)", "_g_sinh({x})",
           jax="jnp.sinh", torch="torch.sinh"),
    _unary("cosh", np.cosh, "g * sinh(x)", "_g_cosh({x})",
           jax="jnp.cosh", torch="torch.cosh"),
    _unary("tanh", np.tanh, "g * (1 - out * out)", "_g_tanh({x})", value_bound=1.0,
           jax="jnp.tanh", torch="torch.tanh"),
    _unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)), "g * out * sigmoid(-x)",
           "_g_sigmoid({x})", value_bound=1.0,
           jax="jax.nn.sigmoid", torch="torch.sigmoid"),
    # softplus(x) = max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|.
    _unary("softplus", lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
           "g * sigmoid(x)",
           "_g_softplus({x})",
           jax="jax.nn.softplus", torch="torch.nn.functional.softplus"),
    # d/dx erf(x) = 2/sqrt(pi) exp(-x^2)  (Abramowitz & Stegun 7.1.19).
    _unary("erf", _erf, "g * 1.1283791670955126 * exp(-x * x)", "_g_erf({x})", value_bound=1.0,
           jax="jax.scipy.special.erf", torch="torch.erf"),
    _unary("erfc", _erfc, "g * -1.1283791670955126 * exp(-x * x)", "_g_erfc({x})",
           value_bound=2.0,
           jax="jax.scipy.special.erfc", torch="torch.erfc"),
    # --- reductions (attrs: axis, keepdims) ------------------------------------
    _red("sum", np.sum, "1", "np.sum({x}, axis={axis}, keepdims={keepdims})", dask=_gd_sum,
         vjp=(_bc("bc(g)"),), jvp=(f"sum(x_t, {_ALONG})",),
         float_only=False, dtype="same", linear=(0,),
         jax="jnp.sum", torch=_torch_sum),
    _red("mean", P.mean, "1", "_g_mean({x}, {axis}, {keepdims})", helpers=(P.mean,),
         dask=_gd_mean,
         vjp=(_bc("bc(g) * size_ratio(out, x)"),), jvp=(f"mean(x_t, {_ALONG})",),
         linear=(0,),
         jax="jnp.mean", torch=_torch_mean),
    # d prod / d x_i = product of the others: out / x_i where x_i != 0; at the one
    # zero of a slice, the product of the rest; 0 where a slice has two zeros.
    _red("prod", np.prod,
         f"where(x == 0, where(bc(sum(x == 0, {_ALONG})) == 1, "
         f"bc(prod(where(x == 0, 1, x), {_ALONG})), 0), bc(out) / where(x == 0, 1, x))",
         "np.prod({x}, axis={axis}, keepdims={keepdims})", domain=NONZERO, dask=_gd_prod,
         jax="jnp.prod", torch=_torch_prod),
    # max and min: their builtins take one argument (these) or two (maximum, minimum),
    # so frontend.builtins spells them out.
    _red("max", np.max, None, "np.max({x}, axis={axis}, keepdims={keepdims})",
         dask=_gd_max, float_only=False, dtype="same", public=False, **_TIE_RULES,
         jax="jnp.max", torch=_torch_max),
    _red("min", np.min, None, "np.min({x}, axis={axis}, keepdims={keepdims})",
         dask=_gd_min, float_only=False, dtype="same", public=False, **_TIE_RULES,
         jax="jnp.min", torch=_torch_min),
    # d lse / dx = softmax(x) = p / sum(p), p = exp(x - lse). Dividing by sum(p)
    # (1 up to rounding) removes the rounding of ``out`` itself: in float32,
    # exp(1000 - fl(1000 + ln 2)) is 0.499985, p / sum(p) is 0.5. All -inf
    # slices have p = 0 and get gradient 0 (sum(p) is replaced by 1 there).
    # Differentiated as jax.nn.logsumexp's max-shifted form (its decomposition): the
    # gradient bc(g / s) * e is softmax from the forward's exponentials e, so a fused
    # fwd_bwd takes 2 exp per element, not 3 (the rule above sums a second row of
    # them), as accurately (dividing by s cancels the rounding of the shift). An empty
    # or all -inf slice is -inf (max's initial), gradient 0; a +inf element gives inf,
    # gradient NaN there and 0 at the finite ones, as jax.vjp: no zero mask on e (g / s
    # is 0 there, and 0 * inf must stay NaN; e <= 1 elsewhere).
    _red("logsumexp", P.logsumexp,
         "exp(x - bc(where(out == -inf, 0, out))) / bc(where(out == -inf, 1, "
         f"sum(exp(x - bc(where(out == -inf, 0, out))), {_ALONG})))",
         "_g_logsumexp({x}, {axis}, {keepdims})", helpers=(P.logsumexp,), dask=_gd_logsumexp,
         decomposition=f"""
             m = max(x, {_ALONG}, initial=-inf)
             h = stop_gradient(where(m - m == 0, m, 0))
             e = exp(x - broadcast_in(h, x, {_ALONG}), zero_mask=false)
             s = sum(e, {_ALONG})
             empty = s == 0
             out = where(empty, -inf, h + log(where(empty, 1, s)))""",
         jax="jax.nn.logsumexp", torch=_torch_logsumexp),
    # d|x|/dx = x/|x|; dividing by inf where the norm is 0 gives gradient 0 there.
    # Sampled away from 0: the norm's curvature grows like 1/|x| there, which
    # defeats finite differences (its kink at 0 is tested as an edge case).
    _red("norm", P.norm, "x / bc(where(out == 0, inf, out))",
         "_g_norm({x}, {axis}, {keepdims})", helpers=(P.norm,), domain=NONZERO,
         dask=_gd_norm,
         jax=_jax_norm, torch=_torch_norm),
    # --- linear algebra and layout (kernel boundaries) ---------------------------
    Primitive("matmul", ("x", "y"), LIBRARY, np.matmul, (COMPOSITE, COMPOSITE),
              lib="np.matmul({x}, {y})", jvp=("matmul(x_t, y)", "matmul(x, y_t)"), linear=(0, 1),
              multilinear=True, static_shape=_matmul_static, np_shape=_g_matmul_shape,
              cuda="_gc_matmul({x}, {y}, stream)", dask=_gd_matmul, helpers=(_gd_array,),
              jax="jnp.matmul", torch="torch.matmul"),
    # A view of large arrays, not a copy (see prelude._g_transpose): np.matmul
    # hands a transposed C array to BLAS as a transposed operand; copying a
    # 4096 x 1024 float32 array took 30 ms here (a power-of-two stride thrashes
    # the cache). Elementwise kernels copy it to C order (_g_flat), and results
    # that are views are copied by _g_finish.
    Primitive("transpose", ("x",), LIBRARY, np.transpose, ("transpose(g)",),
              jvp=("transpose(x_t)",), lib="_g_transpose({x})", float_only=False, dtype="same", linear=(0,),
              np_shape=_g_transpose_shape, helpers=(P.transpose, _gd_array), may_refuse=False,
              cuda="_gc_transpose({x}, stream)", dask=_gd_transpose,
              jax="jnp.transpose", torch=_torch_transpose),
    # sum_to(g, like): g summed (or broadcast) to like's shape; its own adjoint.
    Primitive("sum_to", ("x", "like"), LIBRARY, lambda x, like: P.sum_to(x, np.shape(like)),
              ("sum_to(g, x)", None), jvp=("sum_to(x_t, like)", None),
              lib="_g_sum_to({x}, {like}.shape)",
              float_only=False, dtype="same", shape_only=(1,), linear=(0,), shape_like=1,
              value_operands=(0,), helpers=(P.sum_to, _gd_array), may_refuse=False,
              passes_operand=0, cuda="_gc_sum_to({x}, {like}.shape, stream)", dask=_gd_sum_to,
              jax=_jax_sum_to, torch=_torch_sum_to),
    # shape_check(g, like): g, once like's shape is known to broadcast to g's (a
    # custom gradient against its parameter, where shapes are known at run time only;
    # see prelude._g_shape_check); attribute ``message``, with {got} and {want} fields.
    Primitive("shape_check", ("x", "like"), LIBRARY,
              lambda x, like, message: P.shape_check(x, np.shape(like), message),
              ("shape_check(g, like, message=message)", None),
              jvp=("shape_check(x_t, like, message=message)", None),
              lib=_SHAPE_CHECK, cuda=_SHAPE_CHECK, helpers=(P.shape_check,), dask=_gd_shape_check,
              float_only=False, dtype="same", shape_only=(1,), linear=(0,), value_operands=(0,),
              keywords=(("message", "internal", None),), shape_like=0,
              jax=_jax_shape_check, torch=_torch_shape_check),
    # shape_check_of(t, got, like): t, once like's shape is known to broadcast to got's
    # (shape_check's test, reading shapes only). Forward mode applies it to the tangent
    # that transposing a grad block seeds with, before the transpose of ``sum_to``
    # broadcasts that tangent to the gradient's shape ``got`` (which would fail first,
    # with NumPy's message): autodiff.forward.transpose_grad_block.
    Primitive("shape_check_of", ("x", "got", "like"), LIBRARY,
              lambda x, got, like, message:
              P.shape_check(x, np.shape(like), message, np.shape(got)),
              ("shape_check_of(g, got, like, message=message)", None, None),
              jvp=("shape_check_of(x_t, got, like, message=message)", None, None),
              lib=_SHAPE_CHECK_OF, cuda=_SHAPE_CHECK_OF, helpers=(P.shape_check,),
              dask=_gd_shape_check_of, float_only=False, dtype="same", shape_only=(1, 2),
              linear=(0,), value_operands=(0,), keywords=(("message", "internal", None),),
              shape_like=0, jax=_jax_shape_check_of, torch=_torch_shape_check_of),
    # broadcast_in(v, like): a reduction's result broadcast back (see prelude).
    Primitive("broadcast_in", ("x", "like"), LIBRARY,
              lambda x, like, axis=None, keepdims=False:
              P.broadcast_in(x, np.shape(like), axis, keepdims),
              (COMPOSITE, None), jvp=(f"broadcast_in(x_t, like, {_ALONG})", None),
              lib="_g_broadcast_in({x}, {like}.shape, {axis}, {keepdims})",
              float_only=False, dtype="same", shape_only=(1,), linear=(0,), shape_like=1,
              axis_keepdims=True, value_operands=(0,), helpers=(P.broadcast_in, _gd_array),
              may_refuse=False,
              cuda="_gc_broadcast_in({x}, {like}.shape, {axis!r}, {keepdims!r}, stream)",
              dask=_gd_broadcast_in,
              jax=_jax_broadcast_in, torch=_torch_broadcast_in),
    # size_ratio(a, b) = a.size / b.size, a 0-d float: the 1/n of mean's rule.
    Primitive("size_ratio", ("x", "y"), LIBRARY,
              lambda x, y: np.asarray(np.size(x) / max(np.size(y), 1)),
              (None, None), jvp=(None, None), lib=_SIZE_RATIO, cuda=_SIZE_RATIO, float_only=False,
              differentiable=False, shape_only=(0, 1), static_shape=_scalar_static,
              np_shape=_g_scalar_shape, dask=_gd_size_ratio, may_refuse=False,
              jax=_jax_size_ratio, torch=_torch_size_ratio),
    CUMSUM, *ONE_HOT, DIM_SIZE, ARGMAX, ARGMIN, *LAYOUT, TAKE, TAKE_TRANSPOSE, TAKE_ALONG,
    TAKE_ALONG_TRANSPOSE, *COMPOSITES, ARGSORT, *SORTS, *SCANS, *RANDOM, *INDEXING,
]})

# Other .grad names of primitives (NumPy's and the Array API's): alias -> primitive.
ALIASES = MappingProxyType({a: p.name for p in PRIMITIVES.values() for a in p.aliases})

# DSL spelling -> primitive, where they differ.
BINARY_OPS = MappingProxyType({"+": "add", "-": "sub", "*": "mul", "/": "div",
                               "^": "pow", "@": "matmul"})
COMPARE_OPS = MappingProxyType({"<": "lt", "<=": "le", ">": "gt", ">=": "ge",
                                "==": "eq", "!=": "ne"})

# The .grad spelling of each operator primitive ("add" -> "+").
INFIX = MappingProxyType({v: k for k, v in {**BINARY_OPS, **COMPARE_OPS}.items()})
