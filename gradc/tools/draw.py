"""``gradc graph``: an op's optimised IR drawn as a Graphviz graph, kernels as clusters.

:func:`graph_dot` gives the DOT text of one or more methods of an op (the
graphs ``gradc compile --emit ir`` prints, after simplification, CSE and DCE):
one node per IR node, labelled as :func:`gradc.ir.dump.dump` prints it (id,
op and arguments, dtype and shape class, source line), one edge per operand
(dashed where only the operand's shape is read), and one cluster per kernel of
the fused CPU plan (:func:`gradc.passes.fuse_reduce.cpu_plan`), labelled as
``gradc explain`` describes it (:func:`gradc.tools.explain.step_texts`): what it
fuses, what it reads and stores and the bytes it moves per element.  A node
that a later kernel recomputes is drawn once, in the first kernel; the later
kernel's label says ``recomputes``.  Library calls (matmul, reductions NumPy
runs) are the grey 3-D boxes between kernels.

Parameters are blue (primal inputs), green (cotangents ``d<out>`` of ``vjp``
and ``fwd_bwd``, tangents ``<param>_t`` of ``jvp``); outputs have a double
border and their name; nodes of a custom op's forward body are yellow and
nodes of a grad block (the custom rule) orange.

:func:`write_graph` writes ``.dot``/``.gv`` itself (no dependency) and renders
``.svg``/``.png``/``.pdf`` with Graphviz's ``dot`` program, which must be on
``PATH`` (:class:`GraphvizMissing` otherwise).
"""
from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shutil
import subprocess
import textwrap
from pathlib import Path

from gradc.codegen.module import signature_text
from gradc.errors import NameResolutionError, Span
from gradc.frontend.check import load_program
from gradc.ir.dump import node_fields
from gradc.ir.graph import Graph, outermost
from gradc.ir.primitives import PRIMITIVES
from gradc.passes.fuse import Kernel
from gradc.passes.fuse_reduce import cpu_plan
from gradc.pipeline import build_op
from gradc.tools.explain import MathPrinter, compute_dtypes, step_texts

METHODS = ("forward", "vjp", "fwd_bwd", "jvp")
# ``both``: the forward and the gradient (vjp) as two graphs side by side.
METHOD_CHOICES = METHODS + ("both",)
DEFAULT_METHOD = "fwd_bwd"          # forward and backward in one graph, as they are fused
# Output suffix -> Graphviz output format (None: the DOT text itself).
FORMATS = {".dot": None, ".gv": None, ".svg": "svg", ".png": "png", ".pdf": "pdf"}
INSTALL_HINT = ("install Graphviz (apt-get install graphviz, brew install graphviz or "
                "conda install graphviz), or write DOT, which needs nothing: -o FILE.dot")

_PARAM, _SEED, _REGION, _RULE, _LIBRARY = "#cfe2ff", "#d3f9d8", "#fff3bf", "#ffd8a8", "#e9ecef"
_KERNEL = "#f1f3f5"
_WRAP = 76                          # characters per line of a kernel's label


class GraphError(Exception):
    """``gradc graph`` cannot write what was asked (exit status 1)."""


class GraphvizMissing(GraphError):
    """Rendering needs Graphviz's ``dot`` program and it is not on ``PATH``."""


# ---- DOT text ------------------------------------------------------------------------

def quote(text: str) -> str:
    """``text`` as a DOT double-quoted ID (a node, cluster or graph name, a plain
    attribute value), which Graphviz reads back exactly: ``"`` is escaped and every
    other character, line breaks included, kept.  DOT has no escape for a backslash
    in an ID, so one before a quote, a line break or the end is a ValueError (labels
    have one: :func:`label`)."""
    if re.search(r'\\(?=["\r\n]|$)', text):
        raise ValueError(f"a DOT ID cannot have a backslash before a quote, a line break "
                         f"or its end: {text!r}")
    return '"' + text.replace('"', '\\"') + '"'


def label(lines: list[str], just: str = "l") -> str:
    """A quoted label showing each of ``lines`` literally (backslashes, quotes,
    Graphviz's escapes such as ``\\N`` and HTML entities such as ``&amp;``
    included), justified ``l``eft, ``r``ight or centred (``n``).  Control
    characters are shown escaped, as in error messages."""
    out = []
    for line in lines:
        line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
        line = line.replace("&", "&amp;").replace("\\", "\\\\").replace('"', '\\"')
        out.append(line + "\\" + just)
    return '"' + "".join(out) + '"'


def attrs(**values: str) -> str:
    """``[k="v", ...]``; a value that is already a quoted label is kept as it is."""
    items = [f"{k}={v if v.startswith(chr(34)) else quote(v)}" for k, v in values.items()]
    return "[" + ", ".join(items) + "]"


# ---- what to draw --------------------------------------------------------------------

def _rule_lines(ops) -> dict[str, list[tuple[int, int, str]]]:
    """Per source file, the line ranges ``(first, last, op)`` of every grad block."""
    out: dict[str, list[tuple[int, int, str]]] = {}
    for op in ops.values():
        if op.grad is not None:
            last = max((s.end_line or s.line for s in _spans(op.grad.body)),
                       default=op.grad.span.line)
            out.setdefault(op.grad.span.file, []).append((op.grad.span.line, last, op.name))
    return out


def _spans(value):
    """Every Span in an AST value (dataclasses, tuples), depth first."""
    if isinstance(value, Span):
        yield value
    elif isinstance(value, tuple):
        for v in value:
            yield from _spans(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _spans(getattr(value, f.name))


def _rule_of(node, rules) -> str | None:
    """The op whose grad block ``node`` comes from, if any."""
    if node.span is None:
        return None
    for first, last, name in rules.get(node.span.file, ()):
        if first <= node.span.line <= last:
            return name
    return None


def _node_stmt(g: Graph, node, nid: str, ctx) -> str:
    """The DOT statement of one IR node."""
    ident, head, type_, where = node_fields(g, node)
    t = ctx.names.get(node.id)
    first = f"{ident} ({t}) = {head}" if t and node.op not in ("param", "const") else \
        f"{ident} = {head}"
    lines = [first, type_] + ([where] if where else [])
    style = {"shape": "box", "style": "rounded,filled", "fillcolor": "white"}
    if node.op == "param":
        seed = ctx.seeds.get(node.id)
        style.update(shape="ellipse", style="filled", fillcolor=_SEED if seed else _PARAM)
        if seed:
            lines.append(seed)
    elif node.op == "const":
        style.update(shape="plaintext", style="solid")
    elif node.id in ctx.library:
        style.update(shape="box3d", style="filled", fillcolor=_LIBRARY)
        lines.append(f"[{ctx.library[node.id]}] kernel boundary, run by NumPy")
    rule = _rule_of(node, ctx.rules) if node.op not in ("param", "const") else None
    if rule is not None:
        style["fillcolor"] = _RULE
        lines.append(f"custom rule: grad block of {rule}")
    elif node.id in ctx.region and node.op not in ("param", "const"):
        style["fillcolor"] = _REGION
        lines.append(f"custom op {ctx.region[node.id]} (forward)")
    outs = [n or f"result {k}" for k, (o, n) in enumerate(zip(g.outputs, ctx.out_names))
            if o == node.id]
    if outs:
        style.update(peripheries="2", penwidth="1.5")
        lines.append("output " + ", ".join(outs))
    return f"{nid} {attrs(label=label(lines), **style)};"


@dataclasses.dataclass
class _Context:
    names: dict[int, str]           # MathPrinter's names of shared values (t1, ...)
    seeds: dict[int, str]           # cotangent or tangent param -> "cotangent of y"
    region: dict[int, str]          # node -> custom op whose forward body it is in
    rules: dict
    library: dict[int, int]         # library-call node -> its step
    out_names: list[str]


def method_dot(cop, method: str, prefix: str, rules) -> tuple[list[str], list[str]]:
    """The heading lines and the DOT statements of one method of a compiled op:
    its nodes (ids ``<prefix>n<id>``), edges and kernel clusters
    (``cluster_<prefix>k<step>``); ``rules`` as :func:`_rule_lines` gives them."""
    plan = cpu_plan(cop.methods[method].fused)
    g = plan.graph          # the method's graph, with the nodes the CPU lowering adds
    texts, totals = step_texts(plan, compute_dtypes(cop.params))
    if method == "jvp":
        of = [f"tangent of {p.name}" for p in cop.params if p.differentiable]
    else:
        of = [f"cotangent of {o}" for o in cop.op.outputs]
    seeds = dict(zip(g.params[len(cop.params):], of))
    library = {s.node: k for k, s in enumerate(plan.steps) if not isinstance(s, Kernel)}
    region = {n: r.rule.op for r in outermost(cop.methods[method].regions)
              for n in r.nodes if n in g}
    ctx = _Context(MathPrinter(g).names, seeds, region, rules, library,
                   list(g.output_names))
    nid = lambda n: quote(f"{prefix}n{n}")
    placed: set[int] = set()
    out, clusters = [], 0
    for k, step in enumerate(plan.steps):
        if not isinstance(step, Kernel):
            continue
        text = [w for line in texts[k] for w in textwrap.wrap(
            line.strip(), _WRAP, subsequent_indent="    ", break_long_words=False,
            break_on_hyphens=False)]
        mine = [n for n in step.nodes if n not in placed]
        out.append(f"subgraph {quote(f'cluster_{prefix}k{k}')} {{")
        style = attrs(label=label(text), style="filled,rounded", fillcolor=_KERNEL,
                      color="#868e96")
        out.append(f"  graph {style};")
        out += [f"  {_node_stmt(g, g.node(n), nid(n), ctx)}" for n in mine]
        if not mine:                 # a kernel of recomputed nodes only: keep it visible
            out.append(f"  {quote(f'{prefix}k{k}')} {attrs(shape='point')};")
        out.append("}")
        placed.update(mine)
        clusters += 1
    out += [_node_stmt(g, node, nid(node.id), ctx) for node in g if node.id not in placed]
    for node in g:
        shape_only = PRIMITIVES[node.op].shape_only
        for i, a in enumerate(node.args):
            dashed = f" {attrs(style='dashed')}" if i in shape_only else ""
            out.append(f"{nid(a)} -> {nid(node.id)}{dashed};")
    head = [f"{method}: {len(g)} nodes; fused CPU plan: {len(plan.steps)} step(s), "
            f"{clusters} kernel(s), {len(library)} library call(s)"] + [t.strip() for t in totals]
    return head, out


_LEGEND = ["blue: parameter; green: cotangent or tangent; double border: output; "
           "dashed edge: only the shape is read",
           "yellow: a custom op's forward; orange: its grad block (the custom rule); "
           "grey 3-D box: a NumPy call; shaded clusters: the fused kernels [k] of the plan"]


def graph_dot(path: str | os.PathLike, op_name: str, methods=(DEFAULT_METHOD,), *,
              check: bool = False) -> str:
    """The DOT text of op ``op_name`` of the .grad file ``path``: each of ``methods``
    (:data:`METHOD_CHOICES`; ``both`` is forward and vjp) as its optimised graph with
    its fused CPU kernel plan, as described in the module docstring; several
    methods are drawn side by side, each in a cluster of its own.

    Raises the file's GradcErrors, NameResolutionError (E200) for an unknown op,
    and GraphError for a method the op does not have (a ``jvp`` of a grad block
    that cannot be transposed, E405).
    """
    program = load_program(path)
    if op_name not in program.ops:
        raise NameResolutionError(f"no op '{op_name}' in {path} (ops: "
                                  f"{', '.join(program.main_ops)})")
    cop = build_op(program.ops[op_name], program.ops, program.consts, check=check)
    chosen = list(dict.fromkeys(m for x in methods
                                for m in (("forward", "vjp") if x == "both" else (x,))))
    for m in chosen:
        if m not in METHODS:
            raise GraphError(f"unknown method {m!r} (choose from {', '.join(METHOD_CHOICES)})")
        if m not in cop.methods:
            why = cop.missing[m].splitlines()[0].replace("error[E405]: ", "")
            raise GraphError(f"op {op_name} has no {m} method: {why}")
    rules = _rule_lines(program.ops)
    title = f"{Path(path).name}: op {op_name}{signature_text(cop)}"
    out = ["digraph " + quote(op_name) + " {",
           f"  graph {attrs(labelloc='t', labeljust='l', fontname='Helvetica', fontsize='11')};",
           f"  node {attrs(fontname='Courier', fontsize='10')};",
           f"  edge {attrs(color='#495057', arrowsize='0.6')};"]
    if len(chosen) == 1:
        head, stmts = method_dot(cop, chosen[0], "", rules)
        out.append(f"  graph {attrs(label=label([title, *head, *_LEGEND]))};")
        out += [f"  {s}" for s in stmts]
    else:
        out.append(f"  graph {attrs(label=label([title, *_LEGEND]))};")
        for m in chosen:
            head, stmts = method_dot(cop, m, f"{m}_", rules)
            out.append(f"  subgraph {quote(f'cluster_{m}')} {{")
            out.append(f"    graph {attrs(label=label(head), style='dashed', color='#adb5bd')};")
            out += [f"    {s}" for s in stmts]
            out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def output_format(path: str | os.PathLike) -> str | None:
    """The Graphviz format for an output file's suffix (None: DOT text); GraphError
    for a suffix that is not one of :data:`FORMATS`."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise GraphError(f"cannot write {os.fspath(path)!r}: the suffix must be one of "
                         f"{', '.join(FORMATS)} (DOT text: .dot or .gv)")
    return FORMATS[suffix]


def write_graph(dot: str, path: str | os.PathLike) -> Path:
    """Write DOT text ``dot`` to ``path``: as it is for ``.dot``/``.gv``, rendered by
    Graphviz's ``dot`` for ``.svg``/``.png``/``.pdf``.  The file is replaced whole
    (through a temporary file beside it) or left as it was.  Raises GraphError for
    an unknown suffix or when ``dot`` fails, GraphvizMissing when it is not on
    ``PATH``, OSError when the file cannot be written."""
    from gradc.loader.disk_cache import check_output, write_atomic
    path = Path(path)
    fmt = output_format(path)
    if fmt is None:
        write_atomic(path, dot)
        return path
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing(f"writing {path.name} needs Graphviz's 'dot' program, which "
                              f"is not on PATH: {INSTALL_HINT}")
    check_output(path)                  # before dot, which would name its temporary file
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        r = subprocess.run([exe, f"-T{fmt}", "-o", str(tmp)], input=dot.encode(),
                           capture_output=True, timeout=300)
        if r.returncode != 0:
            raise GraphError(f"Graphviz's dot failed on {path.name} (exit status "
                             f"{r.returncode}): {r.stderr.decode(errors='replace').strip()}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
