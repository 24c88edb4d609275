"""Limits on the size of .grad input, so that any file, however hostile, ends
quickly in a module or in an error: never a hang, a crash or unbounded memory.

Each limit is a named constant.  Crossing one is a :class:`LimitError` at the
place where it was crossed, whose message names the limit:

=====  ===================  ========================================================
E120   MAX_FILE_CHARS       characters in one file (checked before lexing)
E121   MAX_TOKENS           tokens in one file (bounds the time Lark's parser takes)
E122   MAX_DEPTH            brackets open at once, and operators and calls nested in
                            one expression (the compiler's passes recurse over it)
E123   MAX_STATEMENTS       statements in one body (forward or grad block)
E124   MAX_INLINED_DEPTH    nesting of an op's expressions once the ops it calls are
                            inlined (each call adds the callee's nesting)
E125   MAX_INLINED_SIZE     operations of an op once the ops it calls are inlined (a
                            chain of ops that each call the previous one twice
                            doubles it at every step) and grad() expanded
E126   (Python's limit)     the compiler hit Python's recursion limit anyway
E127   MAX_GRAPH_SIZE       operations of an op's graph as the compiler builds it:
                            the ops it calls inlined and every grad() expanded,
                            common subexpressions counted once (checked after each
                            grad(), at the one that crosses it, and for the whole
                            op); the methods' graphs are a few times this, and
                            compile time grows with it
=====  ===================  ========================================================

The real files of ``examples/`` use a few hundred tokens, nest less than ten
deep and build graphs of at most 41 operations.  The parse-time limits are
enforced in :mod:`gradc.frontend.parser`; the program-wide ones by
:func:`check_inlined` after name resolution; MAX_GRAPH_SIZE by :class:`GraphSize`
while an op is lowered (what ``grad()`` builds is known only then: its size
depends on the graph it differentiates, names bound by earlier statements
included, not on the text).
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Iterable, Mapping

import networkx as nx
from lark import Tree

from gradc.errors import LimitError, Span
from gradc.frontend import ast

MAX_FILE_CHARS = 1_000_000
MAX_TOKENS = 50_000
MAX_DEPTH = 100
MAX_STATEMENTS = 1_000
MAX_INLINED_DEPTH = 200
MAX_INLINED_SIZE = 5_000
MAX_GRAPH_SIZE = 2_000

# A grad(EXPR, NAME) call builds EXPR's gradient graph: counted as this many copies.
_GRAD_COST = 3


def read_capped(path: str | os.PathLike[str]) -> bytes:
    """The bytes of ``path``, but no more than enough to exceed MAX_FILE_CHARS
    (a 10 GB file is not read whole only to be rejected).  Only a regular file is
    read: a FIFO, a terminal or ``/dev/stdin`` could block forever and ``/dev/zero``
    never ends, so anything else is an OSError (opened without blocking, then
    checked, so that a file swapped in between cannot slip through)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"it is {what}", os.fspath(path))
        with open(fd, "rb", closefd=False) as f:
            return f.read(4 * MAX_FILE_CHARS + 4)
    finally:
        os.close(fd)


def check_file_size(text: str, file: str) -> None:
    if len(text) > MAX_FILE_CHARS:
        line = text.count("\n", 0, MAX_FILE_CHARS) + 1
        col = MAX_FILE_CHARS - (text.rfind("\n", 0, MAX_FILE_CHARS) + 1) + 1
        raise LimitError(f"the file is longer than {MAX_FILE_CHARS:,} characters "
                         "(limit MAX_FILE_CHARS): split it into files that import each other",
                         Span(file, line, col), "E120")


def too_many_tokens(file: str, line: int, column: int) -> LimitError:
    return LimitError(f"the file has more than {MAX_TOKENS:,} tokens (limit MAX_TOKENS): "
                      "split it into files that import each other",
                      Span(file, line, column), "E121")


def too_deep(file: str, line: int, column: int, what: str) -> LimitError:
    """``what``: "brackets" (open at once) or "operators" (and calls, inside one another)."""
    detail = ("more than {} brackets open at once" if what == "brackets" else
              "more than {} operators and calls inside one another; a flat chain such "
              "as a + b + c + ... nests one level per operator").format(MAX_DEPTH)
    return LimitError(f"an expression is nested too deeply: {detail} (limit MAX_DEPTH); "
                      "split it into several statements", Span(file, line, column), "E122")


def out_of_stack(file: str) -> LimitError:
    """Python's recursion limit hit below the limits above (a caller already deep in
    its own stack): a clear error rather than a RecursionError."""
    return LimitError("the compiler ran out of Python stack on this file (its nesting is "
                      "within MAX_DEPTH, but the calling program's stack is already deep): "
                      "nest expressions less deeply", Span(file, 1, 1), "E126")


# ---- the parse tree ---------------------------------------------------------------

_EXPRESSIONS = frozenset({"compare", "binop", "neg", "pos", "transpose", "call",
                          "tuple_expr", "kwarg", "number", "name"})


def check_tree(tree: Tree, file: str) -> None:
    """Expression nesting (MAX_DEPTH) and statements per body (MAX_STATEMENTS) of a
    parse tree, walked without recursion: the tree may be far too deep to recurse."""
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if node.data in _EXPRESSIONS:
            depth += 1
            if depth > MAX_DEPTH:
                raise too_deep(file, node.meta.line, node.meta.column, "operators")
        elif node.data == "body" and len(node.children) > MAX_STATEMENTS:
            stmt = node.children[MAX_STATEMENTS]
            raise LimitError(f"a body has more than {MAX_STATEMENTS:,} statements (limit "
                             "MAX_STATEMENTS): split the op into several ops",
                             Span(file, stmt.meta.line, stmt.meta.column), "E123")
        stack.extend((c, depth) for c in reversed(node.children) if isinstance(c, Tree))


# ---- ops with the ops they call inlined ------------------------------------------

def check_inlined(ops: Mapping[str, ast.OpDef], order: Iterable[str]) -> list[LimitError]:
    """MAX_INLINED_DEPTH and MAX_INLINED_SIZE for each op of ``order`` (callees before
    callers: recursion is already rejected), at the call that crosses the limit."""
    depth: dict[str, int] = {}
    size: dict[str, int] = {}
    errors: list[LimitError] = []
    for name in order:
        op = ops[name]
        measure = _Measure(ops, depth, size)
        bodies = [op.body] + ([op.grad.body] if op.grad is not None else [])
        for stmt in (s for body in bodies for s in body):
            measure.expr(stmt.value, 0)
        depth[name], size[name] = measure.depth, measure.size
        where = measure.deepest or op.span
        if measure.depth > MAX_INLINED_DEPTH:
            errors.append(LimitError(
                f"op '{name}' nests {measure.depth} operations deep once the ops it calls "
                f"are inlined (limit MAX_INLINED_DEPTH = {MAX_INLINED_DEPTH}): split "
                "long expressions into several statements", where, "E124"))
        elif measure.size > MAX_INLINED_SIZE:
            errors.append(LimitError(
                f"op '{name}' has more than {MAX_INLINED_SIZE:,} operations once the ops it "
                f"calls are inlined (limit MAX_INLINED_SIZE): each call copies the "
                "callee's body", measure.biggest or op.span, "E125"))
        if errors:          # callers of a too-big op would repeat the error
            break
    return errors


class _Measure:
    """The inlined nesting depth and size of one op's expressions."""

    def __init__(self, ops: Mapping[str, ast.OpDef], depth: Mapping[str, int],
                 size: Mapping[str, int]) -> None:
        self.ops, self.op_depth, self.op_size = ops, depth, size
        self.depth = self.size = 0
        self.deepest: Span | None = None      # the call where the depth is reached
        self.biggest: Span | None = None      # the call that makes the op too big

    def expr(self, e: ast.Expr, level: int, scale: int = 1) -> None:
        """Iteratively: ``e`` sits ``level`` deep, inside ``scale`` copies."""
        todo = [(e, level, scale)]
        while todo:
            e, level, scale = todo.pop()
            level += 1
            self.size += scale
            if isinstance(e, ast.Call) and e.func in self.op_depth:
                total = level + self.op_depth[e.func]
                if total > self.depth:
                    self.depth, self.deepest = total, e.span
                self.size += scale * self.op_size[e.func]
            elif level > self.depth:
                self.depth = level
            if self.size > MAX_INLINED_SIZE and self.biggest is None:
                self.biggest = e.span
            if isinstance(e, ast.Call) and e.func == "grad":
                scale *= _GRAD_COST
            todo.extend((c, level, scale) for c in ast.children(e))


# ---- the graph an op lowers to ----------------------------------------------------

# Nodes as built, before common subexpressions are merged, per MAX_GRAPH_SIZE: a bound
# on the memory of a graph whose copies CSE would merge.
_RAW_FACTOR = 8


def distinct_nodes(graph) -> int:
    """The nodes of ``graph`` (a :class:`gradc.ir.graph.Graph`) that remain once
    common subexpressions are merged (CSE's structural key, params distinct)."""
    canon: dict[int, int] = {}
    seen: dict[tuple, int] = {}
    for nid in nx.topological_sort(graph.dg):
        node = graph.node(nid)
        if node.op == "param":
            canon[nid] = nid
            continue
        key = (node.op, tuple(canon[a] for a in node.args), node.attrs, node.dtype,
               None if node.args else node.shape)
        canon[nid] = seen.setdefault(key, nid)
    return len(set(canon.values()))


class GraphSize:
    """MAX_GRAPH_SIZE for the graph of one op while it is lowered.

    :meth:`check` after each ``grad()``: the graph only grows while lowering, by
    at most one distinct operation per node added, so the distinct nodes are
    counted again (linear time) only once the nodes added since the last count
    could have crossed the limit."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.counted_at = 0          # nodes in the graph at the last count
        self.distinct = 0            # distinct nodes then

    def check(self, graph, span: Span | None, at_grad: bool = True) -> None:
        """``span``: the grad() just expanded, or (``at_grad=False``) the op."""
        raw = len(graph)
        if raw - self.counted_at + self.distinct <= MAX_GRAPH_SIZE:
            return
        self.counted_at, self.distinct = raw, distinct_nodes(graph)
        if self.distinct <= MAX_GRAPH_SIZE and raw <= _RAW_FACTOR * MAX_GRAPH_SIZE:
            return
        size = (f"{self.distinct:,} operations (common subexpressions counted once)"
                if self.distinct > MAX_GRAPH_SIZE else f"{raw:,} operations as built")
        how = ("once the ops it calls are inlined and grad() is expanded here" if at_grad
               else "once the ops it calls are inlined")
        advice = ("each grad() differentiates the whole expression it is given, names "
                  "bound by earlier statements included, so nesting or chaining grad() "
                  "multiplies the size: take fewer derivatives of derivatives" if at_grad
                  else "each call copies the callee's body: split the op into ops called "
                  "one after the other")
        raise LimitError(f"op '{self.op}' builds {size} {how} (limit MAX_GRAPH_SIZE = "
                         f"{MAX_GRAPH_SIZE:,}); {advice}", span, "E127")
