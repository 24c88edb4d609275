"""Evaluate a graph with JAX or PyTorch operations: the interpreter of
:mod:`gradc.ir.interpret` with another framework's array functions.

Each framework's functions are the registry's (:mod:`gradc.ir.primitives`: each
primitive's ``jax`` and ``torch``, mirroring its NumPy reference: ``np.tanh`` ->
``jnp.tanh`` / ``torch.tanh``), so the graph becomes a function the framework can trace,
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

import numpy as np

from gradc.ir.graph import FLOAT, CustomRegion, Graph, outermost_regions, unit_order
from gradc.ir.primitives import PRIMITIVES, jax_sum_to, torch_sum_to
from gradc.ir.shapes import bound_dims, resolve_dims

_NP_DTYPES = {"i32": np.dtype(np.int32), "i64": np.dtype(np.int64), "bool": np.dtype(np.bool_)}


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
                dtype, make_region: Callable[[CustomRegion], Callable] | None = None,
                seed: int = 0) -> Callable[..., list]:
    """A function of the values of ``inputs`` (node ids: params, or any nodes to
    start from) returning the values of ``targets``, computed with ``fw``'s
    functions, floats in ``dtype``.  With ``make_region``, each outermost custom
    region between them is one call of ``make_region(region)`` (made here, once),
    which takes the region's inputs and returns its outputs.  Random numbers are
    drawn with ``seed`` unless the graph's ``seed`` node is among ``inputs`` (a value
    of the framework: an int64, or in JAX a uint32 pair of its low and high words).

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
        elif node.op in ("seed", "draw_offset"):      # a draw's key and (whole) offset
            steps.append(("const", unit, seed if node.op == "seed" else 0, (), {}))
        else:
            args = tuple((a, None) if node.op == "where" and i == 0 else
                         (a, "raw") if graph.node(a).op in ("seed", "draw_offset") else spec(a)
                         for i, a in enumerate(node.args))
            attrs = dict(node.attrs)
            kw = {"axis": attrs.get("axis"), "keepdims": bool(attrs.get("keepdims")),
                  **{k: attrs[k] for k in ("initial",) if k in attrs}} \
                if PRIMITIVES[node.op].axis_keepdims else \
                {k: attrs.get(k, d) for k, d in PRIMITIVES[node.op].defaults.items()}
            fn = fw.ops.get(node.op)
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
        if dt == "raw":             # a draw's seed and offset, as given
            return raw[nid]
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
    import jax.scipy.special  # noqa: F401  (jax.scipy.special.erf)

    return Framework("jax", _registry_ops("jax", {"jnp": jnp, "jax": jax}), dtype=np.dtype,
                     asarray=lambda v, dt: np.asarray(v, dtype=dt),
                     cast=partial(_jax_cast, jax, jnp),
                     is_bool=lambda v: jnp.result_type(v) == np.bool_,
                     sum_to=jax_sum_to)


def _jax_cast(jax, jnp, v, dt):
    """``v`` in dtype ``dt``; an integer value stays as it is where ``dt`` is 64-bit and
    JAX's x64 is off (an index, a count: JAX would make it 32-bit again, and warn)."""
    if jnp.result_type(v) == dt:
        return v
    if np.dtype(dt).kind in "iu" and np.dtype(dt).itemsize == 8 and \
            not jax.config.jax_enable_x64:
        return v
    return jnp.asarray(v, dt)


def _registry_ops(name: str, modules: Mapping[str, Any]) -> dict[str, Callable]:
    """Each primitive's function of framework ``name`` (its ``jax`` or ``torch``
    field): a function, or a dotted name in ``modules`` ("jnp.tanh")."""
    ops = {}
    for p in PRIMITIVES.values():
        fn = getattr(p, name)
        if isinstance(fn, str):
            head, *rest = fn.split(".")
            fn = modules[head]
            for attr in rest:
                fn = getattr(fn, attr)
        if fn is not None:
            ops[p.name] = fn
    return ops


# -- PyTorch ----------------------------------------------------------------------


@lru_cache(maxsize=None)
def torch_framework() -> Framework:
    import torch

    return Framework("torch", _registry_ops("torch", {"torch": torch}), dtype=_torch_dtype,
                     asarray=_torch_asarray, cast=lambda v, dt: v if v.dtype == dt else v.to(dt),
                     is_bool=lambda v: v.dtype == torch.bool, sum_to=torch_sum_to)


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
