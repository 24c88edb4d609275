"""Evaluate a graph with the registry's NumPy references: the oracle.

Used by constant folding's tests, ``gradc check`` (finite differences in
float64) and every test that compares generated kernels with a reference.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from gradc.ir.graph import FLOAT, Graph
from gradc.ir.primitives import PRIMITIVES, REDUCTION
from gradc.ir.shapes import bound_dims, resolve_dims

_NP_DTYPES = {"i32": np.int32, "i64": np.int64, "bool": np.bool_}


def interpret(graph: Graph, args: Sequence, dtype=np.float64, seed: int = 0
              ) -> list[np.ndarray]:
    """The graph's outputs for ``args`` (one per ``graph.params``, in order),
    computing floats in ``dtype``; its random numbers drawn with ``seed``."""
    env: dict[int, np.ndarray] = {}
    params = dict(zip(graph.params, args))
    dims = bound_dims((graph.node(p).shape, np.shape(v)) for p, v in params.items())
    with np.errstate(all="ignore"):
        for node in graph:
            want = dtype if node.dtype == FLOAT else _NP_DTYPES[node.dtype]
            if node.op == "param":
                value = params[node.id]
            elif node.op == "const":
                value = node.value
            elif node.op in ("seed", "draw_offset"):      # a whole array's draws
                value = seed if node.op == "seed" else 0
            else:
                value = _apply(node, [env[a] for a in node.args], dtype, dims)
            env[node.id] = np.asarray(value, dtype=want)
    return [env[o] for o in graph.outputs]


def _apply(node, args: list[np.ndarray], dtype, dims) -> np.ndarray:
    prim = PRIMITIVES[node.op]
    attrs: Mapping = resolve_dims(dict(node.attrs), dims)
    if prim.kind == REDUCTION:
        extra = {"initial": attrs["initial"]} if "initial" in attrs else {}
        return prim.ref(args[0], axis=attrs.get("axis"), keepdims=bool(attrs.get("keepdims")),
                        **extra)
    if prim.axis_keepdims:                  # broadcast_in
        return prim.ref(*args, axis=attrs.get("axis"), keepdims=attrs.get("keepdims"))
    return prim.ref(*args, **{k: attrs.get(k, d) for k, d in prim.defaults.items()})
