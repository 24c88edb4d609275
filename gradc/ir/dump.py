"""Readable text of a graph: one line per node, in topological order.

Each line gives the node's id, its op and arguments (``param x``, ``const 0.5``,
``mul(%3, %0)``, attributes after the arguments), its dtype and shape class in
the user's terms (``T shape(x)``, ``T (b, h)``) and the source line it came
from (``# seed.grad:34``); the last line names the outputs.  ``T`` is the op's
floating-point compute dtype (float32 or float64, fixed by the call).
"""
from __future__ import annotations

import os

from gradc.ir.graph import Graph
from gradc.ir.shapes import Shape


def shape_text(graph: Graph, shape: Shape) -> str:
    """A shape class in user terms: ``(b, h)``, ``shape(x)``, ``broadcast((3,), shape(x))``."""
    parts = [f"({', '.join(map(str, shape.static))}{',' if len(shape.static) == 1 else ''})"
             ] if shape.static or not shape.dyn else []
    for d in sorted(shape.dyn):
        node = graph.node(d)
        parts.append(f"shape({node.attr('name') if node.op == 'param' else f'%{d}'})")
    return parts[0] if len(parts) == 1 else f"broadcast({', '.join(parts)})"


def _head(node) -> str:
    if node.op == "param":
        return f"param {node.attr('name')}"
    if node.op == "const":
        return f"const {node.value!r}"
    args = ", ".join(f"%{a}" for a in node.args)
    attrs = ", ".join(f"{k}={v!r}" for k, v in node.attrs if k != "name")
    return f"{node.op}({args}{', ' if args and attrs else ''}{attrs})"


def node_fields(graph: Graph, node) -> tuple[str, str, str, str]:
    """A node's ``%id``, ``op(args)``, ``dtype shape`` and ``file:line`` ('' without a
    span), as :func:`dump` prints them."""
    where = f"{os.path.basename(node.span.file)}:{node.span.line}" if node.span else ""
    return f"%{node.id}", _head(node), f"{node.dtype} {shape_text(graph, node.shape)}", where


def dump(graph: Graph, indent: str = "") -> str:
    """The graph as aligned lines ``%id = op(args)  dtype shape  # file:line``."""
    rows = []
    for node in graph:
        nid, head, type_, where = node_fields(graph, node)
        rows.append((nid, head, type_, f"# {where}" if where else ""))
    w_id = max((len(r[0]) for r in rows), default=0)
    w_head = max((len(r[1]) for r in rows), default=0)
    w_type = max((len(r[2]) for r in rows), default=0)
    lines = [f"{indent}{i:>{w_id}} = {h:<{w_head}}  {t:<{w_type}}  {s}".rstrip()
             for i, h, t, s in rows]
    names = list(graph.output_names) + [""] * (len(graph.outputs) - len(graph.output_names))
    outs = ", ".join(f"{n} = %{o}" if n else f"%{o}" for n, o in zip(names, graph.outputs))
    lines.append(f"{indent}return {outs}")
    return "\n".join(lines) + "\n"
