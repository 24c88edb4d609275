"""The printer base: deterministic names and template rendering of one node.

A printer renders an op with a ``_print_<op>`` method if it has one,
otherwise with the registry template of its backend, and otherwise raises
:class:`~gradc.errors.CodegenError` (strict, as in SymPy).  Templates are
fully parenthesised, so there is no precedence logic.  Printers never
transform graphs.
"""
from __future__ import annotations

import math

from gradc.errors import CodegenError
from gradc.ir.graph import FLOAT, Graph, Node
from gradc.ir.primitives import PRIMITIVES

DTYPE_CTOR = {FLOAT: "_T", "i32": "np.int32", "i64": "np.int64", "bool": "np.bool_"}


class IndentedBuffer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def line(self, text: str = "") -> None:
        self.lines.append(("    " * self.level + text) if text else "")

    def indent(self) -> "IndentedBuffer":
        self.level += 1
        return self

    def dedent(self) -> None:
        self.level -= 1

    def getvalue(self) -> str:
        return "\n".join(self.lines) + "\n"


class Printer:
    backend = "cpu"

    def __init__(self, graph: Graph, names: dict[int, str]) -> None:
        self.graph = graph
        self.names = names          # node id -> the local holding its value

    def name(self, nid: int) -> str:
        node = self.graph.node(nid)
        if node.op == "const":
            return self._print_const(node)
        return self.names[nid]

    def _print_broadcast_in(self, node: Node) -> str:
        """A scalar broadcast into a loop (a recomputed residual): the scalar itself."""
        if not self.graph.node(node.args[0]).shape.is_scalar:
            raise CodegenError("broadcast_in of an array inside an elementwise loop", node.span)
        return self.name(node.args[0])

    def expr(self, nid: int) -> str:
        node = self.graph.node(nid)
        special = getattr(self, f"_print_{node.op}", None)
        if special is not None:
            return special(node)
        prim = PRIMITIVES[node.op]
        template = getattr(prim, self.backend, None) or prim.cpu
        if template is None:
            raise CodegenError(f"'{node.op}' has no {self.backend} template", node.span)
        fields = {p: ("None" if i in prim.shape_only else self.name(a))
                  for i, (p, a) in enumerate(zip(prim.params, node.args))}
        return template.format(dt=DTYPE_CTOR[node.dtype], **fields)

    def _print_const(self, node: Node) -> str:
        v = node.value
        ctor = DTYPE_CTOR[node.dtype]
        if isinstance(v, float) and not math.isfinite(v):
            v = "np.nan" if math.isnan(v) else ("np.inf" if v > 0 else "-np.inf")
        return f"{ctor}({v!r})" if not isinstance(v, str) else f"{ctor}({v})"

    def _print_pow(self, node: Node) -> str:
        """Small integer exponents become multiplications (exact, vectorisable)."""
        x, y = (self.name(a) for a in node.args)
        k = self.graph.node(node.args[1])
        if k.op == "const" and float(k.value).is_integer() and 0 < abs(k.value) <= 4:
            prod = " * ".join([x] * int(abs(k.value)))
            return f"({prod})" if k.value > 0 else f"(_T(1) / ({prod}))"
        if k.op == "const" and k.value == 0.5:
            return f"np.sqrt({x})"
        prim = PRIMITIVES["pow"]
        return (getattr(prim, self.backend, None) or prim.cpu).format(x=x, y=y)
