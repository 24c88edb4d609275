"""CUDA reduce kernels: one ``@cuda.jit`` kernel for a :class:`ReduceKernel`.

The same schedule as the CPU's (:mod:`gradc.passes.row_schedule`), printed
for a GPU: the blocks stride over the ``_R`` rows (block ``b`` takes rows
``b, b + grid, ...``) and, in each pass of the schedule, the block's
``_GC_RBLOCK`` threads stride over the row's ``_N`` elements (thread ``t``
takes ``t, t + _GC_RBLOCK, ...``, the same elements in every pass, so an
element value a thread stored in an earlier pass is read back by that
thread).  A row reduction is each thread's float64 partial, then a tree in
shared memory (the reductions that finish before the same pass share one
tree); every thread reads the row's value back, so row values are computed
by every thread and stored by thread 0.  Element values a later pass needs
again are read back from the kernel's output rows where they are outputs,
else recomputed (no scratch rows: the row stays in L1/L2 between passes).

Chunk reductions accumulate per block into ``partials`` (float64), which the
wrapper combines on the device (``_gc_combine``): the "all" kind one value
per block (each thread's own, then the block's tree), the "cols" kind one
row of ``_N`` per block (``_p[b * _N + c]``), each column of it owned by the
thread that takes that column in every row, so no two threads write one
element.  The grid is a function of the shape alone (``_gc_row_grid``), so
results do not depend on the device.  Rows of one element (``flat``) are a
grid-stride loop over the flat array instead.

As on the CPU (:mod:`gradc.codegen.cpu_reduce`), accumulators are float64
whatever the compute dtype, ``max`` and ``min`` propagate NaN, and
``logsumexp`` and ``norm`` take two passes (the max, then the shifted or
scaled sum), with the conventions of ``prelude._g_logsumexp`` and
``prelude._g_norm`` at ±inf, NaN and on empty rows.  The math is
:class:`gradc.codegen.cuda.CudaPrinter`'s (libdevice through ``math``).
"""
from __future__ import annotations

from gradc.codegen.cuda import CudaPrinter, check_device_lines
from gradc.codegen.printer import IndentedBuffer
from gradc.codegen.quote import comment
from gradc.ir.graph import Graph
from gradc.passes.fuse_reduce import (ELEMENT, ROW, ROW_PASSES, ReduceKernel, is_reduction,
                                      value_args)
from gradc.passes.row_schedule import (PER_COL, PER_ELEMENT, PER_ROW, SCALAR, KernelNames,
                                       access, reads_element, reduction_kind, rows_ready,
                                       schedule, shift_line)

# Initial values of the float64 accumulators (the simulator runs Python: numba.float64
# keeps its sums in float64, a Python float would take a float32 operand's type).
_INIT = {"sum": "numba.float64(0.0)", "mean": "numba.float64(0.0)",
         "prod": "numba.float64(1.0)", "max": "numba.float64(-math.inf)",
         "min": "numba.float64(math.inf)"}


def render_cuda_reduce_kernel(graph: Graph, kernel: ReduceKernel, name: str, *,
                              fast_math: bool = False, comments: tuple[str, ...] = ()) -> str:
    """Source of the CUDA kernel ``name`` computing ``kernel``; arguments: the stored
    values (flat arrays of their own sizes), the partials (flat float64 arrays of
    ``grid`` or ``grid * _N`` elements), the
    :func:`~gradc.passes.row_schedule.input_slots` (flat), then ``_R``, ``_N`` and
    the dtype witness ``_w``.  Launched with ``_GC_RBLOCK`` threads per block."""
    lv = dict(kernel.levels)
    kinds = dict(kernel.chunk_kind)
    sch = schedule(graph, kernel, scratch=False)
    outs = {n: f"_o{j}" for j, n in enumerate(kernel.outputs)}
    parts = {n: f"_p{j}" for j, n in enumerate(kernel.partials)}
    names: dict[int, str] = {}
    kn = KernelNames(graph, kernel, CudaPrinter(graph, names))
    slots, pos, value, reduced, local = kn.slots, kn.pos, kn.value, kn.reduced, kn.local
    params = [*outs.values(), *parts.values(), *(f"_i{j}" for j in range(len(slots))),
              "_R", "_N", "_w"]
    row_reds = [n for n in kernel.nodes if lv[n] == ROW and is_reduction(graph, n)
                and n in sch.live]
    every = [n for n in kernel.partials if kinds[n] == "all"]
    cols = [n for n in kernel.partials if kinds[n] == "cols"]

    # Reductions that finish at the same point share one tree: as many rows of shared
    # memory as the most such reductions.
    trees = [len(_tree_group(graph, sch, row_reds, p, pos)) for p in range(sch.passes + 1)]
    depth = max(trees + [len(every), 1])
    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    fm = ", fastmath=True" if fast_math else ""
    buf.line(f"@cuda.jit(cache=not _GC_SIM{fm})")
    buf.line(f"def {name}({', '.join(params)}):")
    buf.indent()
    body = IndentedBuffer()
    body.level = buf.level
    body.line("_T = _w.dtype.type")
    body.line(f"_sh = cuda.shared.array(({depth}, _GC_RBLOCK), numba.float64)")
    body.line("_tx = cuda.threadIdx.x")
    for j, (x, a) in enumerate(slots):
        if a == SCALAR:
            body.line(f"s{j} = _i{j}[0]")
    if any(graph.node(n).op == "norm" for n in row_reds):      # the smallest normal number
        body.line("_tn = 1.1754943508222875e-38 if _w.itemsize == 4 else 2.2250738585072014e-308")
    for n in every:
        body.line(f"_q{pos[n]} = {_INIT[reduction_kind(graph, n)]}")
    if cols:
        body.line("_pb = cuda.blockIdx.x * _N")
        body.line("for _c in range(_tx, _N, _GC_RBLOCK):")
        for n in cols:
            body.line(f"    {parts[n]}[_pb + _c] = {_INIT[reduction_kind(graph, n)]}")
    if kernel.flat:
        body.line("for _j in range(cuda.grid(1), _R, cuda.gridsize(1)):")
        body.indent()
        for j, (x, a) in enumerate(slots):
            if a in (PER_ELEMENT, PER_ROW):
                body.line(f"{local(x, a)} = _i{j}[_j]")
        for n in sch.work[0]:
            for line in value(n, "_j"):
                body.line(line)
        for n in kernel.partials:
            body.line(_accumulate(f"_q{pos[n]}", reduced(n), reduction_kind(graph, n)))
        for n, o in outs.items():
            body.line(f"{o}[_j] = {names[n]}")
        body.dedent()
    else:
        _rows(body, graph, kernel, sch, slots, outs, parts, pos, names, value, reduced, local,
              row_reds)
    if every:                     # the block's partials: one tree, written by thread 0
        _tree(body, [(f"_q{pos[n]}", reduction_kind(graph, n)) for n in every])
        body.line("if _tx == 0:")
        for n in every:
            body.line(f"    {parts[n]}[cuda.blockIdx.x] = _q{pos[n]}")
    check_device_lines(name, body.lines)
    buf.lines += body.lines
    return buf.getvalue()


def _rows(buf, graph, kernel, sch, slots, outs, parts, pos, names, value, reduced, local,
          row_reds) -> None:
    """The loop over the block's rows: the passes of the schedule, each a loop of the
    block's threads over the row's elements, the row reductions' trees between them."""
    lv = dict(kernel.levels)
    kinds = dict(kernel.chunk_kind)
    done: set[int] = set()

    def first_pass(n: int) -> int:
        return sch.avail[n] - ROW_PASSES[reduction_kind(graph, n)]

    def row_values(before: int) -> None:
        """The trees of the reductions that finish before pass ``before`` (or whose
        first pass ends there), then the row nodes available before it."""
        group = _tree_group(graph, sch, row_reds, before, pos)
        if group:
            _tree(buf, [(acc, kind) for acc, kind, _ in group])
        for acc, kind, n in group:
            if ROW_PASSES[reduction_kind(graph, n)] == 2 and first_pass(n) + 1 == before:
                _between(buf, reduction_kind(graph, n), pos[n])
        for n in rows_ready(kernel, sch, before, done):
            if is_reduction(graph, n):
                _finish_row(buf, graph, n, pos, names)
            else:
                for line in value(n, "_r"):
                    buf.line(line)

    buf.line("for _r in range(cuda.blockIdx.x, _R, cuda.gridDim.x):")
    buf.indent()
    buf.line("_lo = _r * _N")
    for j, (x, a) in enumerate(slots):
        if a == PER_ROW:
            buf.line(f"b{j} = _i{j}[_r]")
    for p in range(sch.passes):
        row_values(p)
        for n in row_reds:
            kind = reduction_kind(graph, n)
            if p == first_pass(n):
                acc = "_m" if kind in ("logsumexp", "norm") else "_s"
                buf.line(f"{acc}{pos[n]} = {_INIT['max' if acc == '_m' else kind]}")
        work = sch.work[p]
        red_here = [n for n in row_reds if 0 <= p - first_pass(n) < ROW_PASSES[
            reduction_kind(graph, n)] and reads_element(graph, kernel, n)]
        part_here = [n for n in kernel.partials if reads_element(graph, kernel, n)
                     and sch.phase.get(value_args(graph, n)[0], 0) == p]
        used = {(x, access(graph, kernel, n, x)) for n in work for x in value_args(graph, n)
                if x not in lv}
        used |= {(x, access(graph, kernel, n, x)) for n in red_here + part_here
                 for x in value_args(graph, n)[:1] if x not in lv}
        buf.line("for _c in range(_tx, _N, _GC_RBLOCK):")
        buf.indent()
        for j, (x, a) in enumerate(slots):
            if (x, a) in used and a == PER_ELEMENT:
                buf.line(f"a{j} = _i{j}[_lo + _c]")
            elif (x, a) in used and a == PER_COL:
                buf.line(f"c{j} = _i{j}[_c]")
        for n in sch.loads[p]:           # stored by this thread in an earlier pass
            names[n] = f"v{pos[n]}"
            buf.line(f"v{pos[n]} = {outs[n]}[_lo + _c]")
        for n in work:
            for line in value(n, "(_lo + _c)"):
                buf.line(line)
        for n in red_here:
            buf.line(_row_update(graph, n, p - first_pass(n), pos[n], reduced(n)))
        for n in part_here:
            kind = reduction_kind(graph, n)
            acc = f"{parts[n]}[_pb + _c]" if kinds[n] == "cols" else f"_q{pos[n]}"
            buf.line(_accumulate(acc, reduced(n), kind))
        for n, o in outs.items():
            if lv[n] == ELEMENT and sch.phase[n] == p:
                buf.line(f"{o}[_lo + _c] = {names[n]}")
        buf.dedent()
    row_values(sch.passes)
    row_outs = [(n, o) for n, o in outs.items() if lv[n] == ROW]
    row_parts = [n for n in kernel.partials if not reads_element(graph, kernel, n)]
    if row_outs or row_parts:
        buf.line("if _tx == 0:")
        for n, o in row_outs:
            buf.line(f"    {o}[_r] = {names[n]}")
        for n in row_parts:
            buf.line("    " + _accumulate(f"_q{pos[n]}", reduced(n), reduction_kind(graph, n)))
    buf.dedent()


def _tree_group(graph: Graph, sch, row_reds: list[int], before: int,
                pos: dict[int, int]) -> list[tuple[str, str, int]]:
    """The accumulators whose block trees run before pass ``before``: ``(name, kind,
    node)`` of the row reductions finishing there, and of the maxima of the two-pass
    ones whose first pass ends there."""
    group = []
    for n in row_reds:
        kind, i = reduction_kind(graph, n), pos[n]
        if sch.avail[n] == before:
            group.append((f"_s{i}", "sum" if ROW_PASSES[kind] == 2 else kind, n))
        elif ROW_PASSES[kind] == 2 and sch.avail[n] - 1 == before:
            group.append((f"_m{i}", "max", n))
    return group


def _accumulate(acc: str, v: str, kind: str) -> str:
    """``acc`` (float64) updated with the value ``v``; max and min keep a NaN."""
    if kind in ("sum", "mean"):
        return f"{acc} += {v}"
    if kind == "prod":
        return f"{acc} *= {v}"
    cmp = ">" if kind == "max" else "<"
    return f"{acc} = numba.float64({v}) if ({v} {cmp} {acc} or {v} != {v}) else {acc}"


def _row_update(graph: Graph, n: int, k: int, i: int, v: str) -> str:
    """Pass ``k`` of row reduction ``n`` (position ``i``) of the element value ``v``."""
    kind = reduction_kind(graph, n)
    if kind == "logsumexp":
        return _accumulate(f"_m{i}", v, "max") if k == 0 else f"_s{i} += math.exp({v} - _h{i})"
    if kind == "norm":
        if k == 0:
            return f"_a{i} = abs({v}); " + _accumulate(f"_m{i}", f"_a{i}", "max")
        return f"_t{i} = {v} / _h{i}; _s{i} += _t{i} * _t{i}"
    return _accumulate(f"_s{i}", v, kind)


def _tree(buf: IndentedBuffer, accs: list[tuple[str, str]]) -> None:
    """The block's tree over each thread's ``accs`` (float64 ``(name, kind)``, row ``j``
    of the shared array for the ``j``-th), each name then holding the block's value in
    every thread.  Every thread of the block runs it (syncthreads in uniform control
    flow), and a last syncthreads lets the next tree reuse the shared array."""
    for j, (acc, _) in enumerate(accs):
        buf.line(f"_sh[{j}, _tx] = {acc}")
    buf.line("cuda.syncthreads()")
    buf.line("_wd = _GC_RBLOCK // 2")
    buf.line("while _wd > 0:")
    buf.line("    if _tx < _wd:")
    for j, (_, kind) in enumerate(accs):
        if kind in ("sum", "mean"):
            buf.line(f"        _sh[{j}, _tx] += _sh[{j}, _tx + _wd]")
        elif kind == "prod":
            buf.line(f"        _sh[{j}, _tx] *= _sh[{j}, _tx + _wd]")
        else:
            cmp = ">" if kind == "max" else "<"
            buf.line(f"        _y = _sh[{j}, _tx + _wd]")
            buf.line(f"        if _y {cmp} _sh[{j}, _tx] or _y != _y:")
            buf.line(f"            _sh[{j}, _tx] = _y")
    buf.line("    cuda.syncthreads()")
    buf.line("    _wd //= 2")
    for j, (acc, _) in enumerate(accs):
        buf.line(f"{acc} = _sh[{j}, 0]")
    buf.line("cuda.syncthreads()")


def _between(buf: IndentedBuffer, kind: str, i: int) -> None:
    """After the first pass of a two-pass reduction (its max ``_m``, NaN kept, in every
    thread): the shift or scale (as cpu_reduce's)."""
    buf.line(shift_line(kind, i, "math.inf"))
    buf.line(f"_s{i} = numba.float64(0.0)")


def _finish_row(buf: IndentedBuffer, graph: Graph, n: int, pos, names) -> None:
    """Row reduction ``n``'s value from its block's accumulator (in every thread)."""
    i, kind = pos[n], reduction_kind(graph, n)
    names[n] = f"u{i}"
    if kind == "mean":            # NumPy's mean of nothing is NaN
        buf.line(f"u{i} = _T(_s{i} / _N) if _N > 0 else _T(math.nan)")
    elif kind == "logsumexp":     # log(0) is -inf (Python's math.log raises in the simulator)
        buf.line(f"u{i} = _T(math.log(_s{i}) if _s{i} > 0.0 else (-math.inf if _s{i} == 0.0 "
                 f"else math.nan)) + _h{i}")
    elif kind == "norm":
        buf.line(f"u{i} = _T(_m{i}) if _m{i} == math.inf else _T(math.sqrt(_s{i})) * _h{i}")
    else:
        buf.line(f"u{i} = _T(_s{i})")
