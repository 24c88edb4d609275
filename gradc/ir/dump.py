"""Readable text of a graph: one line per node, in topological order."""
from __future__ import annotations

from gradc.ir.graph import Graph


def dump(graph: Graph) -> str:
    lines = []
    names = {p: graph.node(p).attr("name") for p in graph.params}
    for node in graph:
        args = ", ".join(f"%{a}" for a in node.args)
        attrs = "".join(f", {k}={v!r}" for k, v in node.attrs if k != "name")
        if node.op == "param":
            head = f"param {names[node.id]!r}"
        elif node.op == "const":
            head = f"const {node.value!r}"
        else:
            head = f"{node.op}({args}{attrs})"
        where = f"  # {node.span.file}:{node.span.line}" if node.span else ""
        lines.append(f"%{node.id}: {node.dtype}{node.shape} = {head}{where}")
    outs = ", ".join(f"%{o}" for o in graph.outputs)
    lines.append(f"return {outs}")
    return "\n".join(lines) + "\n"
