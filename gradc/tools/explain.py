"""``gradc explain``: an op's derived gradient as readable math, and its kernel plan;
``gradc compile --emit ir``: every method's optimised graph (:func:`emit_ir`)."""
from __future__ import annotations

import re
from collections import Counter

from gradc.codegen.cpu import broadcast_rows, is_scalar_input, row_inputs
from gradc.codegen.module import signature_text
from gradc.frontend.check import load_program
from gradc.ir.dump import dump, shape_text
from gradc.ir.graph import FLOAT, Graph
from gradc.ir.indexing import key_text
from gradc.ir.primitives import INFIX, PRIMITIVES
from gradc.ir.shapes import Shape
from gradc.passes.fuse import (Kernel, KernelPlan, reading_steps, value_args, value_used,
                               why_stored)
from gradc.passes.fuse_reduce import ReduceKernel, cpu_plan, is_reduction
from gradc.passes.loop_ir import (CPU, ONLINE_AGAIN, ONLINE_ROWS, ROW_GROUP, SPLIT, SPLIT_COLS,
                                  lower, online, online_again, splits, static_rows)
from gradc.passes.row_schedule import input_slots, schedule
from gradc.pipeline import build_op

_PREC = {"lt": 0, "le": 0, "gt": 0, "ge": 0, "eq": 0, "ne": 0, "add": 1, "sub": 1,
         "mul": 2, "div": 2, "matmul": 2, "neg": 3, "pow": 4, "square": 4}


class MathPrinter:
    """Infix text of graph values; values used more than once get names t1, t2...

    With ``unmask``, autodiff's NaN-safe products (``zero_masked(v, g)``: 0 where the
    cotangent ``g`` is 0 even if ``v`` is inf or NaN) print as ``v``, and
    :meth:`guards` lists them apart."""

    def __init__(self, graph: Graph, unmask: bool = False) -> None:
        self.graph = graph
        self.masks = {n.id: n.args for n in graph if unmask and n.op == "zero_masked"}
        uses: Counter = Counter()
        todo, seen = list(graph.outputs), set()
        while todo:                   # uses among the values printed (masks see through)
            nid = self._through(todo.pop())
            if nid in seen:
                continue
            seen.add(nid)
            args = [self._through(a) for a in graph.node(nid).args]
            uses.update(args)
            todo += args
        self.shared = [n.id for n in graph if uses[n.id] > 1 and n.op not in ("param", "const")]
        self.names = {p: graph.node(p).attr("name") for p in graph.params}
        self.names.update({nid: f"t{k + 1}" for k, nid in enumerate(self.shared)})

    def _through(self, nid: int) -> int:
        """``nid``, or the value a mask at ``nid`` guards."""
        return self.masks[nid][0] if nid in self.masks else nid

    def definitions(self) -> list[str]:
        return [f"{self.names[n]} = {self.text(n, top=True)}" for n in self.shared]

    def guards(self) -> list[str]:
        """One line per value a NaN-safe product guards (in graph order)."""
        out = {}
        for value, g in self.masks.values():
            out.setdefault(self.text(value), []).append(self.text(g))
        return [f"{v} is 0 where {' or '.join(dict.fromkeys(gs))} is 0" for v, gs in out.items()]

    def text(self, nid: int, top: bool = False) -> str:
        nid = self._through(nid)
        node = self.graph.node(nid)
        if not top and nid in self.names:
            return self.names[nid]
        if node.op == "param":              # a result that is a parameter (dx = dy)
            return node.attr("name")
        if node.op == "const":
            v = node.value
            return repr(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(v)
        args = [self._operand(a, node.op, i) for i, a in enumerate(node.args)]
        if node.op in INFIX:
            return f"{args[0]} {INFIX[node.op]} {args[1]}"
        if node.op == "neg":
            return f"-{args[0]}"
        if node.op == "square":             # as written: x^2
            return f"{self._operand(node.args[0], 'pow', 0)} ^ 2"
        if node.op == "slice":              # as written: x[..., :h]
            return f"{self._operand(node.args[0], 'slice', 0)}[{key_text(node.attr('key'))}]"
        labels = self._one_hot_labels(node)
        if labels is not None:              # as written: one_hot(t, k), not its decomposition
            return f"one_hot({self.text(labels.args[0])}, " \
                   f"{_dims_by_name(labels.attr('depth'))})"
        attrs = [f"key=[{key_text(v)}]" if k == "key" else f"{k}={_dims_by_name(v)}"
                 for k, v in node.attrs if v is not None and v is not False]
        return f"{node.op}({', '.join([self.text(a) for a in node.args] + attrs)})"

    def _one_hot_labels(self, node):
        """The ``one_hot_labels`` node of ``cast(expand_dims(one_hot_labels(t)) ==
        arange(depth))``, one_hot's decomposition, where ``node`` is that cast."""
        g = self.graph
        if node.op != "cast" or g.node(node.args[0]).op != "eq":
            return None
        kept, cols = (g.node(a) for a in g.node(node.args[0]).args)
        if kept.op != "expand_dims" or cols.op != "arange" or kept.id in self.names:
            return None
        labels = g.node(kept.args[0])
        if labels.op != "one_hot_labels" or labels.id in self.names or \
                (cols.attr("start"), cols.attr("stop"), cols.attr("step")) != (
                    0, labels.attr("depth"), 1):
            return None
        return labels

    def _operand(self, nid: int, parent: str, i: int) -> str:
        inner = self.graph.node(nid).op
        s = self.text(nid)
        if nid in self.names or inner not in _PREC or parent not in _PREC:
            return s
        p, q = _PREC[parent], _PREC[inner]
        if q < p or (q == p and (i == 1 and parent in ("sub", "div", "pow") or parent == "pow")):
            return f"({s})"
        return s


def _dims_by_name(v) -> str:
    """An attribute as explain prints it: a dim by its name (``stop=n``, not ``_d['n']``)."""
    return re.sub(r"_d\['([^']*)'\]", r"\1", str(v))


# Bytes of one element of a value, at float32 and at float64 compute dtype.
_ITEMSIZE = {FLOAT: (4, 8), "bool": (1, 1), "i32": (4, 4), "i64": (8, 8)}
COMPUTE_DTYPES = ("float32", "float64")


def compute_dtypes(params) -> tuple[str, ...]:
    """The compute dtypes ``T`` an op with parameters ``params``
    (:class:`gradc.ir.lower.ParamInfo`) can run in: NumPy's result type of its float
    arguments, float16 computed in float32 (the generated module's rule:
    docs/generated-module.md, *Dtypes*).
    An ``f64`` parameter makes it float64 only; ``f32``/``f16`` ones with no generic
    float parameter, float32 only; an op without float arguments computes in float64."""
    floats = [p.dtype for p in params if not p.has_default and p.dtype not in ("i32", "i64", "bool")]
    if not floats:
        return ("float64",)
    if "f64" in floats:
        return ("float64",)
    if None in floats:
        return COMPUTE_DTYPES
    return ("float32",)


def _traffic(g: Graph, values) -> tuple[int, int]:
    """Bytes per element that reading or storing ``values`` once each moves (f32, f64)."""
    sizes = [_ITEMSIZE[g.node(v).dtype] for v in values]
    return sum(s[0] for s in sizes), sum(s[1] for s in sizes)


def moved_per_element(g: Graph, step: Kernel) -> list[int]:
    """The values kernel ``step`` reads or stores once per element of its loop: its array
    inputs (not those read once per row, per column or per kernel) and its element-level
    results."""
    if isinstance(step, ReduceKernel):
        lv = dict(step.levels)
        return [x for x, how in input_slots(g, step) if how == "element"] + \
            [o for o in step.outputs if lv[o] == "E"]
    rows = row_inputs(g, step)
    once = {i for i in step.inputs if is_scalar_input(g, i)}
    return [i for i in step.inputs if i not in rows and i not in once] + list(step.outputs)


def element_traffic(plan: KernelPlan, dtype: str = "float32") -> dict[Shape, int]:
    """Bytes per element, at compute dtype ``dtype`` (float32 or float64), that
    ``plan``'s steps move over each shape: each kernel's :func:`moved_per_element`
    values over its loop's shape, each NumPy call reading its array operands and
    writing its result once, and each parameter that is a result read and written
    once (the copy after the loops), each over its own shape.
    The bound on a memory-bound plan: two plans over the same arrays can differ in time
    by at most the ratio of their bytes (``gradc bench`` prints fused against unfused)."""
    g, at = plan.graph, COMPUTE_DTYPES.index(dtype)
    out: Counter = Counter()
    for step in plan.steps:
        if isinstance(step, Kernel):
            out[step.shape] += _traffic(g, moved_per_element(g, step))[at]
        elif value_used(g, step.node):
            for v in (*value_args(g, step.node), step.node):
                if not g.node(v).shape.is_scalar:
                    out[g.node(v).shape] += _traffic(g, [v])[at]
    for o in g.outputs:         # a parameter returned as a result: copied after the loops
        if g.node(o).op == "param" and not g.node(o).shape.is_scalar:
            out[g.node(o).shape] += 2 * _traffic(g, [o])[at]
    return dict(out)


def _bytes(f32: int, f64: int, dtypes: tuple[str, ...]) -> str:
    """``16 B at float32, 32 B at float64``: the bytes at each of ``dtypes``."""
    return ", ".join(f"{b} B at {d}" for b, d in zip((f32, f64), COMPUTE_DTYPES)
                     if d in dtypes)


def plan_text(plan: KernelPlan, label: str,
              dtypes: tuple[str, ...] = COMPUTE_DTYPES) -> list[str]:
    """The plan's steps; per kernel, what it reads and stores and the memory it must
    move per element of its loop (in bytes at each compute dtype of ``dtypes``,
    :func:`compute_dtypes`): every array input read once and every output
    stored once; scalar inputs (read once per kernel) and per-row inputs (a bias,
    read once per row) are not counted per element."""
    per_step, totals = step_texts(plan, dtypes)
    return [f"{label}: {len(plan.steps)} step(s)"] + [l for s in per_step for l in s] + totals


def step_texts(plan: KernelPlan, dtypes: tuple[str, ...] = COMPUTE_DTYPES
               ) -> tuple[list[list[str]], list[str]]:
    """:func:`plan_text`'s lines of each step of ``plan`` (in order), and its closing
    per-loop-shape totals; values are named as :class:`MathPrinter` names them."""
    g = plan.graph
    per_step: list[list[str]] = []
    names = MathPrinter(g).names
    outputs = {n: name for n, name in zip(g.outputs, g.output_names) if name}
    ref = lambda n: names.get(n) or outputs.get(n, f"%{n}")
    totals: dict[str, list[int]] = {}         # loop shape -> [arrays, f32 B, f64 B]
    seen: set[int] = set()                     # nodes of earlier kernels
    for k, step in enumerate(plan.steps):
        lines: list[str] = []
        per_step.append(lines)
        if isinstance(step, ReduceKernel):
            lines += _reduce_kernel_text(g, step, k, ref, totals, dtypes)
            seen.update(step.nodes)
            lines += _stored_text(plan, k, ref)
        elif isinstance(step, Kernel):
            ops = Counter(g.node(n).op for n in step.nodes)
            fused = ", ".join(f"{op}×{c}" if c > 1 else op for op, c in sorted(ops.items()))
            shape = shape_text(g, step.shape)
            lines.append(f"  [{k}] kernel over {shape}: fuses {len(step.nodes)} "
                         f"primitive(s) ({fused})")
            lines += _recompute_text(g, step, [n for n in step.nodes
                                               if n in seen and n not in step.inputs], ref,
                                     dtypes)
            cols = row_inputs(g, step)          # one row of them, read again for every row
            once = {i for i in step.inputs if is_scalar_input(g, i)}   # once per kernel
            unless = " unless it holds one row" if broadcast_rows(g, step) else ""
            reads = [ref(i) + (" (per column)" if i in cols else " (scalar)" if i in once else
                               f" (broadcast to {shape} first{unless})"
                               if g.node(i).shape != step.shape else "")
                     for i in step.inputs]
            moved = moved_per_element(g, step)
            f32, f64 = _traffic(g, moved)
            lines.append(f"      reads {', '.join(reads) or '-'}; "
                         f"stores {', '.join(ref(o) for o in step.outputs)}; "
                         f"{len(moved)} array(s) per element ({_bytes(f32, f64, dtypes)})")
            t = totals.setdefault(shape, [0, 0, 0])
            t[0] += len(moved)
            t[1] += f32
            t[2] += f64
            seen.update(step.nodes)
            lines += _stored_text(plan, k, ref)
        else:
            node = g.node(step.node)
            lines.append(f"  [{k}] {PRIMITIVES[node.op].kind} call: {node.op} "
                         f"(a kernel boundary, run by NumPy)")
    return per_step, [f"  all kernels over {shape}: {n} array(s) per element "
                      f"({_bytes(f32, f64, dtypes)})" for shape, (n, f32, f64) in totals.items()]


def _recompute_text(g: Graph, step: Kernel, again: list[int], ref,
                    dtypes: tuple[str, ...]) -> list[str]:
    """What a loop recomputes of earlier loops' values (:func:`recompute_residuals`),
    and why: its cost against the store and read back it saves."""
    if not again:
        return []
    tops = [n for n in again if any(u in step.nodes and u not in again for u in g.users(n))]
    ops = Counter(g.node(n).op for n in again)
    f32, f64 = _traffic(g, tops)
    return [f"      recomputes {', '.join(ref(n) for n in again)} from values it reads anyway "
            f"({len(again)} primitive(s): {', '.join(f'{o}×{c}' if c > 1 else o for o, c in sorted(ops.items()))}): "
            f"cheaper than storing {', '.join(ref(n) for n in tops)} and reading it back, "
            f"per element {_bytes(2 * f32, 2 * f64, dtypes)}"]


def _stored_text(plan: KernelPlan, k: int, ref) -> list[str]:
    """Per value kernel ``k`` stores only for later steps (a residual of the fused
    plan): which steps read it and why they do not recompute it."""
    if not plan.fused:
        return []
    g, steps = plan.graph, plan.steps
    out = []
    for v in steps[k].outputs:
        readers = reading_steps(g, steps, k, v)
        if v in g.outputs or not readers:
            continue
        why = why_stored(plan, k, v, ref)
        out.append(f"      stores {ref(v)} for {', '.join(f'[{q}]' for q in readers)}"
                   + (f" ({why})" if why else ""))
    return out


def _reduce_kernel_text(g: Graph, step: ReduceKernel, k: int, ref, totals,
                        dtypes: tuple[str, ...]) -> list[str]:
    """A reduce kernel: its rows, passes, reductions, and per-element traffic
    (element inputs and outputs; per-row, per-column and scalar values and the
    chunk partials are not counted per element)."""
    lv = dict(step.levels)
    ops = Counter(g.node(n).op for n in step.nodes)
    fused = ", ".join(f"{op}×{c}" if c > 1 else op for op, c in sorted(ops.items()))
    shape = shape_text(g, step.shape)
    dims = step.shape.static
    if step.flat:
        layout = "over the flat array in chunks"
    else:
        row = "(" + ", ".join(map(str, dims[step.split:])) + ("," if len(dims) - step.split == 1 else "") + ")"
        sch = schedule(g, step)
        layout = f"in rows of {row}, {sch.passes} pass(es) per row"
    lines = [f"  [{k}] kernel over {shape} {layout}: fuses {len(step.nodes)} primitive(s) ({fused})"]
    if splits(g, step):
        rows, least, segment = SPLIT
        few = f"at most {SPLIT_COLS * rows}" if step.cols else f"fewer than {rows}"
        lines.append(f"      {few} rows of {least} elements or more: each pass over "
                     f"segments of a row ({segment} or more) in parallel (split rows)")
    if online(g, step):
        sch = schedule(g, step, online=True)
        wide, narrow = ONLINE_AGAIN
        rows = (f"rows of {wide} bytes or more where the CPU has 512-bit vectors, of {narrow} "
                f"where not" if online_again(g, step) else f"rows of {ONLINE_ROWS} bytes or more")
        weighted = sum(o.weight is not None for o in sch.online.values())
        times = f" (and {weighted} of it times an input)" if weighted else ""
        lines.append(f"      {rows} (unless split): {sch.passes} pass(es) per row, each sum of "
                     f"exp(x - max(x)){times} in the pass of the max (online)")
    if static_rows(step):
        lengths = " or ".join(map(str, static_rows(step)))
        lines.append(f"      rows of {lengths} elements: compiled for that length (CPU)")
    group = 1 if step.flat else lower(g, step, CPU).row_group
    if group > 1:
        lines.append(f"      rows of {ROW_GROUP[1]} bytes or less: each pass over groups of "
                     f"{group} rows in turn (CPU)")
    centred = {} if step.flat else sch.centred
    per_row = [g.node(n).op + (" (centred)" if n in centred else "")
               for n in step.nodes if lv[n] == "R" and is_reduction(g, n)]
    across = [g.node(n).op for n in step.partials]
    if per_row:
        lines.append(f"      reduces per row: {', '.join(per_row)}")
    if across:
        lines.append(f"      reduces across rows: {', '.join(across)} (a partial per chunk of "
                     f"rows, combined after the loop)")
    slots = input_slots(g, step)
    label = {"scalar": " (scalar)", "row": " (per row)", "col": " (per column)", "element": ""}
    reads = [ref(x) + label[how] for x, how in slots]
    moved = moved_per_element(g, step)
    f32, f64 = _traffic(g, moved)
    stores = [ref(o) + ("" if lv[o] == "E" else " (per row)") for o in step.outputs]
    stores += [ref(o) + " (partials)" for o in step.partials]
    lines.append(f"      reads {', '.join(reads) or '-'}; stores {', '.join(stores) or '-'}; "
                 f"{len(moved)} array(s) per element ({_bytes(f32, f64, dtypes)})")
    t = totals.setdefault(shape, [0, 0, 0])
    t[0] += len(moved)
    t[1] += f32
    t[2] += f64
    return lines


def explain(path: str, op_name: str) -> str:
    program = load_program(path)
    if op_name not in program.ops:
        raise unknown_op_error(path, [op_name], program.main_ops)
    op = program.ops[op_name]
    cop = build_op(op, program.ops, program.consts)
    out = [f"op {op_name}{signature_text(cop)}", ""]
    g = cop.methods["vjp"].graph
    mp = MathPrinter(g, unmask=True)
    out.append("gradient (vjp), after simplification:")
    out += [f"  {d}" for d in mp.definitions()]
    for name, o in zip(g.output_names, g.outputs):
        out.append(f"  {name} = {mp.names[o] if o in mp.shared else mp.text(o, top=True)}")
    if mp.masks:
        out += ["", "zero-cotangent guards (0 times inf or NaN is 0 there, as in JAX and PyTorch):"]
        out += [f"  {line}" for line in mp.guards()]
    if op.grad is not None:
        true = build_op(op, program.ops, program.consts, custom=False).methods["vjp"].graph
        tp = MathPrinter(true)
        out += ["", "the true derivative, for comparison (grad block ignored):"]
        out += [f"  {d}" for d in tp.definitions()]
        out += [f"  {n} = {tp.text(o, top=True)}" for n, o in zip(true.output_names, true.outputs)]
        from gradc.audit.custom_rules import audit_op
        audit = audit_op(op, program.ops, program.consts)
        out += ["", "audit of the custom rule against the true derivative (as gradc check):"]
        out += [f"  {line}" for line in audit.lines(head="")]
        if audit.warning is not None:
            out.append(f"  not marked surrogate: gradc check warns ({audit.warning.code}) and fails")
    if cop.diagnostics:
        out += ["", "diagnostics of the gradient:"]
        out += [f"  {line}" for d in cop.diagnostics for line in d.render().splitlines()]
    dtypes = compute_dtypes(cop.params)
    for m in ("forward", "fwd_bwd", "jvp"):
        if m in cop.methods:
            out += [""] + plan_text(cpu_plan(cop.methods[m].fused),
                                    f"kernel plan of {m} (fused, CPU)", dtypes)
        else:
            out += ["", f"{m}: not available (see the diagnostics: E405)"]
    out += row_plans_text(cop, program, dtypes)
    unfused = cop.methods["fwd_bwd"].unfused
    _, totals = step_texts(unfused, dtypes)
    out += ["", f"kernel plan of fwd_bwd (unfused), as .unfused runs it: {len(unfused.steps)} "
                "step(s), one primitive or library call each"] + totals
    return "\n".join(out)


def row_plans_text(cop, program, dtypes) -> list[str]:
    """The row plans of an op whose arrays have no declared shapes
    (:mod:`gradc.passes.row_plan`): the forms, the ranks each method serves, and the
    fused plans of forward and fwd_bwd."""
    from gradc.passes import row_plan
    from gradc.pipeline import row_variants
    ranks = {row_plan.ANY_RANK: "rank >= 1", row_plan.RANK_2_UP: "rank >= 2",
             row_plan.RANK_2: "rank 2"}
    out = []
    for i, v in enumerate(row_variants(cop, program.ops, program.consts)):
        decl = ", ".join(f"{p.name}: [{row_plan.ROWS}, {row_plan.ROW}]" if f == row_plan.FULL
                         else f"{p.name}: [{row_plan.ROW}]"
                         for p, f in zip(cop.params, v.forms) if f != row_plan.DECLARED)
        serves = ", ".join(f"{m} {ranks[r]}" for m, r in v.ranks.items())
        out += ["", f"row plan {i}: run instead when the arguments fit {decl}, their leading "
                    f"dims collapsed into {row_plan.ROWS} ({serves})"]
        for m in ("forward", "fwd_bwd"):
            out += plan_text(cpu_plan(v.cop.methods[m].fused),
                             f"  kernel plan of {m} (row plan {i}, CPU)", dtypes)
    return out


def unknown_op_error(path, unknown, ops):
    """NameResolutionError for op names ``unknown`` that ``path`` does not define,
    listing its ops and, for a near miss, the likely one (``Mish`` -> ``mish``)."""
    from gradc.errors import NameResolutionError
    from gradc.frontend.consts import did_you_mean
    lower = {o.lower(): o for o in ops}
    notes = [note for n in unknown for note in (
        [f"did you mean '{lower[n.lower()]}'?"] if n.lower() in lower else did_you_mean(n, ops))]
    return NameResolutionError(
        f"no op{'s' if len(unknown) > 1 else ''} {', '.join(repr(n) for n in unknown)} in "
        f"{path} (ops: {', '.join(ops)})", notes=list(dict.fromkeys(notes)))


def emit_ir(path: str, op_names: list[str] | None = None, *, check: bool = False) -> str:
    """``gradc compile --emit ir``: the optimised graph of every method (forward, vjp,
    fwd_bwd, jvp) of every op of ``path`` (or of ``op_names``), as codegen receives it:
    after simplification, CSE and DCE (:func:`gradc.ir.dump.dump`)."""
    from gradc.errors import GradcError, NotSupportedError, raise_all
    from gradc.frontend.limits import out_of_stack
    from gradc.pipeline import METHODS, issue_warnings
    try:
        program = load_program(path)
        unknown = [n for n in op_names or () if n not in program.ops]
        if unknown:
            raise unknown_op_error(path, unknown, program.main_ops)
        out = [f"# gradc IR of {path}: each method's graph after simplification, CSE and DCE,",
               "# as code generation receives it; T is the op's float dtype (float32 or float64,",
               "# fixed by the call); shapes in the source's terms; # file:line of each node"]
        compiled, errors = {}, []
        for name in op_names or program.main_ops:
            try:
                compiled[name] = cop = build_op(program.ops[name], program.ops,
                                                program.consts, check=check)
            except NotSupportedError as exc:
                out += ["", f"op {name}: not compiled: {exc.render().splitlines()[0]}"]
                continue
            except GradcError as exc:
                errors.append(exc)
                continue
            out += ["", f"op {name}{signature_text(cop)}"]
            for m in METHODS:
                if m not in cop.methods:
                    why = cop.missing[m].splitlines()[0].replace("error[E405]: ", "")
                    out += ["", f"  {m}: not available: {why}"]
                    continue
                g = cop.methods[m].graph
                out += ["", f"  {m} ({len(g)} nodes):", dump(g, indent="    ").rstrip("\n")]
        raise_all(errors)
    except RecursionError:
        raise out_of_stack(str(path)) from None
    issue_warnings(compiled)
    return "\n".join(out)
