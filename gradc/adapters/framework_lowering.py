"""Evaluate a graph with JAX or PyTorch operations: the interpreter of
:mod:`gradc.ir.interpret` with another framework's array functions.

Each framework is a table from primitive names to its functions, mirroring the
NumPy references of :mod:`gradc.ir.primitives` (``np.tanh`` -> ``jnp.tanh`` /
``torch.tanh``), so the graph becomes a function the framework can trace,
differentiate and compile (``jax.jit``, ``torch.compile``).  Used by
:func:`gradc.adapters.jax.as_jax` (``lowering="xla"``), by ``gradc bench`` to compare
gradc with what users would otherwise write, and by the tests as a second oracle.
Both frameworks are optional imports.

:func:`lower_graph` turns the part of a graph between some nodes and some
targets into a function of the framework; custom-gradient regions can be
handed to a callback, which is how :mod:`gradc.tools.bench_frameworks` wraps them in
``jax.custom_vjp`` or ``torch.autograd.Function``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Callable, Mapping, Sequence

import networkx as nx
import numpy as np

from gradc.codegen import prelude
from gradc.ir.graph import FLOAT, CustomRegion, Graph, outermost_regions, unit_order
from gradc.ir.primitives import PRIMITIVES, REDUCTION
from gradc.ir.shapes import bound_dims, resolve_dims

_NP_DTYPES = {"i32": np.dtype(np.int32), "i64": np.dtype(np.int64), "bool": np.dtype(np.bool_)}
_UNARY = ("abs sign floor ceil exp exp2 expm1 log log2 log10 log1p sqrt square reciprocal "
          "sin cos tan sinh cosh tanh").split()
_ARC = {"asin": "arcsin", "acos": "arccos", "atan": "arctan"}
_BINARY = {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide",
           "pow": "power", "maximum": "maximum", "minimum": "minimum", "atan2": "arctan2",
           "lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal",
           "eq": "equal", "ne": "not_equal"}


@dataclass(frozen=True)
class Framework:
    """A framework's functions: ``ops`` per primitive (reductions take ``axis`` and
    ``keepdims``), and how to make and cast its arrays.  ``dtype`` maps a NumPy
    dtype to the framework's own; ``cast`` takes the framework's dtype."""

    name: str
    ops: Mapping[str, Callable]
    dtype: Callable[[np.dtype], Any]
    asarray: Callable[[Any, np.dtype], Any]    # a value (NumPy, scalar) as an array
    cast: Callable[[Any, Any], Any]            # an array in another dtype (no-op if equal)
    is_bool: Callable[[Any], bool]
    sum_to: Callable[[Any, tuple], Any]        # NumPy's un-broadcast (or broadcast up)


def want_dtype(node_dtype: str, dtype) -> np.dtype:
    return np.dtype(dtype) if node_dtype == FLOAT else _NP_DTYPES[node_dtype]


def lower_graph(graph: Graph, inputs: Sequence[int], targets: Sequence[int], fw: Framework,
                dtype, make_region: Callable[[CustomRegion], Callable] | None = None
                ) -> Callable[..., list]:
    """A function of the values of ``inputs`` (node ids: params, or any nodes to
    start from) returning the values of ``targets``, computed with ``fw``'s
    functions, floats in ``dtype``.  With ``make_region``, each outermost custom
    region between them is one call of ``make_region(region)`` (made here, once),
    which takes the region's inputs and returns its outputs.

    The order of evaluation is fixed here, so the function is a straight run of
    framework calls that ``jax.jit`` and ``torch.compile`` can trace."""
    seeds = set(inputs)
    needed = _needed(graph, seeds, targets)
    regions = outermost_regions(graph) if make_region else []
    spec = lambda nid: (nid, fw.dtype(want_dtype(graph.node(nid).dtype, dtype)))
    steps: list[tuple] = []
    for unit in unit_order(graph, needed - seeds, regions):
        if isinstance(unit, CustomRegion):
            steps.append(("region", tuple(unit.outputs), make_region(unit),
                          tuple(spec(i) for i in unit.inputs), {}))
            continue
        node = graph.node(unit)
        if node.op == "const":
            steps.append(("const", unit, fw.asarray(node.value, want_dtype(node.dtype, dtype)),
                          (), {}))
        elif node.op == "param":
            raise KeyError(f"parameter '{node.attr('name')}' has no value")
        else:
            args = tuple((a, None) if node.op == "where" and i == 0 else spec(a)
                         for i, a in enumerate(node.args))
            attrs = dict(node.attrs)
            kw = {"axis": attrs.get("axis"), "keepdims": bool(attrs.get("keepdims"))} \
                if PRIMITIVES[node.op].kind == REDUCTION or node.op == "broadcast_in" else \
                {k: attrs.get(k, d) for k, d in PRIMITIVES[node.op].defaults.items()}
            fn = fw.ops.get(node.op) or getattr(PRIMITIVES[node.op], fw.name)
            if fn is None:
                raise NotImplementedError(f"{fw.name} has no lowering of '{node.op}'")
            steps.append(("op", unit, fn, args, kw))
    outs = tuple(spec(t) for t in targets)
    shapes = tuple(graph.node(i).shape for i in inputs)
    return partial(_run, tuple(inputs), tuple(steps), outs, fw, shapes)


def _run(inputs: tuple, steps: tuple, outs: tuple, fw: Framework, shapes: tuple,
         *values) -> list:
    raw = dict(zip(inputs, values))
    cast: dict = {}
    dims = bound_dims((s, tuple(np.shape(v))) for s, v in zip(shapes, values))

    def get(nid: int, dt) -> Any:
        if dt is None:              # a where's condition, as a bool array
            v = raw[nid]
            return v if fw.is_bool(v) else fw.ops["ne"](v, 0)
        if (nid, dt) not in cast:
            cast[nid, dt] = fw.cast(raw[nid], dt)
        return cast[nid, dt]

    for kind, out, fn, args, kw in steps:
        if kind == "const":
            raw[out] = fn
        elif kind == "op":
            raw[out] = fn(*[get(a, dt) for a, dt in args], **resolve_dims(kw, dims))
        else:
            raw.update(zip(out, fn(*[get(a, dt) for a, dt in args])))
    return [get(t, dt) for t, dt in outs]


def _needed(graph: Graph, seeds: Mapping[int, Any], targets: Sequence[int]) -> set[int]:
    """Nodes on a path into ``targets`` that does not pass through a seed."""
    out, stack = set(), list(targets)
    while stack:
        n = stack.pop()
        if n in out:
            continue
        out.add(n)
        if n not in seeds:
            stack.extend(graph.node(n).args)
    return out


# -- JAX ------------------------------------------------------------------------


@lru_cache(maxsize=None)
def jax_framework() -> Framework:
    import jax
    import jax.numpy as jnp
    from jax.scipy import special

    ops: dict[str, Callable] = {k: getattr(jnp, v) for k, v in _BINARY.items()}
    ops.update({k: getattr(jnp, k) for k in _UNARY})
    ops.update({k: getattr(jnp, v) for k, v in _ARC.items()})
    ops.update(
        neg=jnp.negative, round=jnp.rint, rsqrt=jax.lax.rsqrt, sigmoid=jax.nn.sigmoid,
        softplus=jax.nn.softplus, erf=special.erf, erfc=special.erfc,
        where=jnp.where, clip=lambda x, lo, hi: jnp.minimum(jnp.maximum(x, lo), hi),
        full_like=lambda x, v: jnp.broadcast_to(v, jnp.shape(x)),
        cast=_same, identity=_same, stop_gradient=jax.lax.stop_gradient,
        sum=jnp.sum, mean=jnp.mean, prod=jnp.prod, max=jnp.max, min=jnp.min,
        logsumexp=jax.nn.logsumexp, norm=_jax_norm, matmul=jnp.matmul,
        transpose=jnp.transpose, sum_to=lambda x, like: _jax_sum_to(x, jnp.shape(like)),
        broadcast_in=lambda x, like, axis, keepdims: jnp.broadcast_to(
            _expand(x, jnp.ndim(like), axis, keepdims, jnp.expand_dims), jnp.shape(like)),
        size_ratio=lambda x, y: np.float32(np.size(x) / max(np.size(y), 1)),
        shape_check=lambda x, like, message: prelude.shape_check(x, jnp.shape(like), message),
        zero_masked=lambda x, u: jnp.where((u == 0) & jnp.isnan(x), jnp.zeros_like(x), x),
    )
    return Framework("jax", ops, dtype=np.dtype,
                     asarray=lambda v, dt: np.asarray(v, dtype=dt),
                     cast=lambda v, dt: v if jnp.result_type(v) == dt else jnp.asarray(v, dt),
                     is_bool=lambda v: jnp.result_type(v) == np.bool_,
                     sum_to=_jax_sum_to)


def _same(x):
    return x


def _expand(x, ndim: int, axis, keepdims: bool, expand_dims):
    if keepdims:
        return x
    for ax in range(ndim) if axis is None else sorted(a % ndim for a in axis):
        x = expand_dims(x, ax)
    return x


def _jax_norm(x, axis=None, keepdims=False):
    import jax.numpy as jnp
    return jnp.linalg.vector_norm(x, axis=axis, keepdims=keepdims)


def _jax_sum_to(g, shape: tuple):
    import jax.numpy as jnp
    return _sum_to(g, tuple(shape), lambda a, axes, kd: jnp.sum(a, axis=axes, keepdims=kd),
                   jnp.broadcast_to)


def _sum_to(g, shape: tuple, total, broadcast_to):
    """Sum ``g`` down to ``shape`` (leading dims, and dims of size 1), or broadcast up."""
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


# -- PyTorch ----------------------------------------------------------------------


@lru_cache(maxsize=None)
def torch_framework() -> Framework:
    import torch

    # torch.equal compares whole tensors; eq/ne are the elementwise ones.
    names = {**_BINARY, "pow": "pow", "eq": "eq", "ne": "ne"}
    ops: dict[str, Callable] = {k: getattr(torch, v) for k, v in names.items()}
    ops.update({k: getattr(torch, k) for k in _UNARY})
    ops.update({k: getattr(torch, v) for k, v in _ARC.items()})
    ops.update(
        neg=torch.neg, round=torch.round, rsqrt=torch.rsqrt, sigmoid=torch.sigmoid,
        softplus=torch.nn.functional.softplus, erf=torch.erf, erfc=torch.erfc,
        where=torch.where, clip=lambda x, lo, hi: torch.minimum(torch.maximum(x, lo), hi),
        full_like=lambda x, v: v.expand(x.shape).contiguous(),
        cast=_same, identity=_same, stop_gradient=lambda x: x.detach(),
        sum=_dims(torch.sum), mean=_dims(torch.mean), max=_dims(torch.amax),
        min=_dims(torch.amin), logsumexp=_dims(torch.logsumexp), prod=_torch_prod,
        norm=lambda x, axis, keepdims: torch.linalg.vector_norm(x, dim=axis, keepdim=keepdims),
        matmul=torch.matmul, transpose=lambda x: x.permute(*reversed(range(x.ndim))),
        sum_to=lambda x, like: _torch_sum_to(x, tuple(like.shape)),
        broadcast_in=lambda x, like, axis, keepdims: _expand(
            x, like.ndim, axis, keepdims, torch.unsqueeze).expand(like.shape),
        size_ratio=lambda x, y: torch.tensor(x.numel() / max(y.numel(), 1)),
        shape_check=lambda x, like, message: prelude.shape_check(x, tuple(like.shape), message),
        zero_masked=lambda x, u: torch.where((u == 0) & torch.isnan(x), torch.zeros_like(x), x),
    )
    return Framework("torch", ops, dtype=_torch_dtype, asarray=_torch_asarray,
                     cast=lambda v, dt: v if v.dtype == dt else v.to(dt),
                     is_bool=lambda v: v.dtype == torch.bool, sum_to=_torch_sum_to)


def _torch_dtype(dt):
    import torch
    return {np.float16: torch.float16, np.float32: torch.float32, np.float64: torch.float64,
            np.int32: torch.int32, np.int64: torch.int64, np.bool_: torch.bool}[np.dtype(dt).type]


_TORCH_CONSTS: dict[tuple, Any] = {}


def _torch_asarray(v, dt):
    import torch
    if isinstance(v, torch.Tensor):
        return v
    if np.ndim(v) == 0:     # constants: one 0-d tensor per value and dtype, made once
        key = (float(v), np.dtype(dt).str)
        if key not in _TORCH_CONSTS:
            _TORCH_CONSTS[key] = torch.tensor(float(v), dtype=_torch_dtype(dt))
        return _TORCH_CONSTS[key]
    return torch.from_numpy(np.asarray(v, dtype=dt))


def _dims(fn):
    def reduce(x, axis=None, keepdims=False):
        dim = tuple(range(x.ndim)) if axis is None else tuple(axis)
        return fn(x, dim=dim, keepdim=keepdims) if dim else x
    return reduce


def _torch_prod(x, axis=None, keepdims=False):
    if axis is None:
        out = x.prod()
        return out.reshape((1,) * x.ndim) if keepdims else out
    for ax in sorted((a % x.ndim for a in axis), reverse=True):
        x = x.prod(dim=ax, keepdim=keepdims)
    return x


def _torch_sum_to(g, shape: tuple):
    return _sum_to(g, tuple(shape), lambda a, axes, kd: a.sum(dim=axes, keepdim=kd),
                   lambda a, s: a.expand(s).contiguous())
