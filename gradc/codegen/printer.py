"""The printer base: deterministic names and template rendering of one node.

A printer renders an op with a ``_print_<op>`` method if it has one,
otherwise with the registry template of its backend, and otherwise raises
:class:`~gradc.errors.CodegenError` (strict, as in SymPy).  Templates are
fully parenthesised, so there is no precedence logic.  Printers never
transform graphs.
"""
from __future__ import annotations

import ast
import inspect
import math
import textwrap
from typing import Callable, Mapping

from gradc.codegen.runtime import source_of
from gradc.errors import CodegenError
from gradc.ir.graph import FLOAT, Graph, Node
from gradc.ir.primitives import PRIMITIVES
from gradc.passes.fuse_reduce import ROW
from gradc.passes.row_schedule import KernelNames

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

    def __init__(self, graph: Graph, names: dict[int, str], index: str = "_i") -> None:
        self.graph = graph
        self.names = names          # node id -> the local holding its value
        self.index = index          # the loop's flat index of the element computed

    def lines(self, nid: int, var: str) -> list[str]:
        """Statements assigning node ``nid``'s value to ``var``: one, of :meth:`expr`,
        or, for a primitive whose template is a function (a draw of random numbers:
        ``fn(seed, index, *attributes, _T, _w)``, operands ``(x, seed, offset)``), that
        function's body inlined, its counter the element's flat index ``self.index``
        plus the loop's offset."""
        node = self.graph.node(nid)
        prim = PRIMITIVES[node.op]
        if not callable(prim.cpu):
            return [f"{var} = {self.expr(nid)}"]
        seed, offset = (self.name(a) for a in node.args[1:])
        values = [seed, f"{offset} + np.int64({self.index})",
                  *(repr(node.attr(k)) for k in prim.attrs), "_T", "_w"]
        args = dict(zip(inspect.signature(prim.cpu).parameters, values))
        where = ", ".join(f"{k} {node.attr(k)}" for k in prim.attrs)
        return [f"# {node.op} ({where}): {prim.cpu.__name__}, inlined"] + \
            inline_body(prim.cpu, args, var)

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

    def template(self, op: str) -> str | Callable | None:
        """The template of primitive ``op`` on this printer's backend (the CPU's
        where the backend has none of its own)."""
        prim = PRIMITIVES[op]
        return getattr(prim, self.backend, None) or prim.cpu

    def expr(self, nid: int) -> str:
        node = self.graph.node(nid)
        special = getattr(self, f"_print_{node.op}", None)
        if special is not None:
            return special(node)
        prim = PRIMITIVES[node.op]
        template = self.template(node.op)
        if template is None or callable(template):
            what = "statements, not an expression" if callable(template) else \
                f"no {self.backend} template"
            raise CodegenError(f"'{node.op}' has {what}", node.span)
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
            return self.template("sqrt").format(x=x)
        return self.template("pow").format(x=x, y=y)


def inline_body(fn: Callable, args: Mapping[str, str], out: str) -> list[str]:
    """The body of function ``fn`` as statements of a kernel: its parameters bound to
    the expressions ``args`` (those bound to their own name are left as they are), each
    statement as written, a call ``a, b = _g_f(...)`` of a function of its module
    inlined in turn, and its final ``return`` assigning ``out``.  So one function is
    both the NumPy code (the reference) and the text of CPU and CUDA kernels, which
    cannot call a device function (numba-cuda needs a GPU to compile one)."""
    src = textwrap.dedent(source_of(fn))
    tree = ast.parse(src).body[0]
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    names = [a.arg for a in tree.args.args]
    lines = [f"{p} = {args[p]}" for p in names if args[p] != p]
    for stmt in body:
        text = ast.get_source_segment(src, stmt, padded=True)
        text = textwrap.dedent(text).strip("\n")
        call = stmt.value if isinstance(stmt, (ast.Assign, ast.Return)) else None
        callee = (fn.__globals__.get(call.func.id) if isinstance(call, ast.Call)
                  and isinstance(call.func, ast.Name) and call.func.id.startswith("_g_")
                  else None)
        target = (ast.get_source_segment(src, stmt.targets[0]) if isinstance(stmt, ast.Assign)
                  else out)
        if callee is not None and inspect.isfunction(callee):
            inner = [ast.get_source_segment(src, a) for a in call.args]
            lines += inline_body(callee, dict(zip(inspect.signature(callee).parameters,
                                                  inner)), target)
        elif isinstance(stmt, ast.Return):
            lines += f"{out} = {text.removeprefix('return ')}".splitlines()
        else:
            lines += text.splitlines()
    return lines


class NameReads(dict):
    """Node id to local name, recording the names read while ``reads`` is a set (a
    reduce kernel's rows in groups: which row values a pass reads of earlier ones)."""

    reads: set[str] | None = None

    def __getitem__(self, nid: int) -> str:
        name = super().__getitem__(nid)
        if self.reads is not None:
            self.reads.add(name)
        return name


class LoopPrinter:
    """The base of the printers of a reduce kernel's loop IR
    (:class:`gradc.passes.loop_ir.ReduceLoops`, one per backend): the names of the
    kernel's parameters and values (:class:`~gradc.passes.row_schedule.KernelNames`,
    node values printed by ``printer``, the backend's), and the lines of each IR
    statement, from the backend's ``print_<statement class>`` methods."""

    def __init__(self, graph: Graph, kernel, loops, printer: Callable) -> None:
        self.graph, self.loops = graph, loops
        self.names = NameReads()
        self.kn = KernelNames(graph, kernel, printer(graph, self.names), loops.centred)
        self.pos = self.kn.pos
        self.outs = {n: f"_o{j}" for j, n in enumerate(loops.outputs)}
        self.parts = {n: f"_p{j}" for j, n in enumerate(loops.partials)}
        self.index = "_j"           # the flat index of the element computed

    def statements(self, buf: IndentedBuffer, stmts: list) -> None:
        """The lines of ``stmts`` into ``buf``."""
        for s in stmts:
            for line in getattr(self, f"print_{type(s).__name__.lower()}")(s):
                buf.line(line)

    def print_compute(self, s) -> list[str]:
        """A node's value: a row value at the row ``_r``, an element value at
        ``self.index``."""
        row = self.kn.level[s.node] == ROW
        return self.kn.value(s.node, "_r" if row else self.index)
