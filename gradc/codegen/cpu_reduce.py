"""CPU reduce kernels: one Numba loop over the rows of a :class:`ReduceKernel`.

The kernel ``name(*outputs, *partials, *inputs, _R, _N, _C, _w)`` runs
``numba.prange`` over ``_C`` chunks of the ``_R`` rows of ``_N`` elements
(:func:`gradc.passes.fuse_reduce.fuse_reductions` explains the levels).  Per
row it runs the passes of :func:`schedule`; each pass loops over the row's
elements, computes the element values it needs, accumulates the row
reductions and stores the element outputs of that pass; between passes it
finishes reductions and computes row values.  Chunk reductions accumulate
per chunk into ``partials`` (float64), combined by the wrapper.

Accumulators are float64 whatever the compute dtype (sums of float32 values
keep float32 accuracy over long rows, as the CUDA run time does); ``max`` and
``min`` propagate NaN as NumPy does; ``logsumexp`` and ``norm`` take two
passes (the max, then the shifted or scaled sum: ``prelude._g_logsumexp``,
``prelude._g_norm``), so they agree with the NumPy steps at ±inf, NaN and on
empty rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gradc.codegen.cpu import FAST_MATH, CpuPrinter
from gradc.codegen.printer import IndentedBuffer
from gradc.codegen.quote import comment
from gradc.ir.graph import Graph
from gradc.ir.shapes import normalize_axis
from gradc.passes.fuse import CHEAP
from gradc.passes.fuse_reduce import (ELEMENT, ROW, ROW_PASSES, ReduceKernel, col_forms,
                                      is_reduction, row_forms, value_args)

SCALAR, PER_ROW, PER_COL, PER_ELEMENT = "scalar", "row", "col", "element"
_INIT = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "max": "-np.inf", "min": "np.inf",
         "logsumexp": "-np.inf", "norm": "-np.inf", "sum_to": "0.0"}


def access(graph: Graph, kernel: ReduceKernel, reader: int, x: int) -> str:
    """How node ``reader`` of ``kernel`` reads the outside value ``x``: once per
    kernel (``scalar``), once per row, at the element's column (``col``: a bias
    over the row's dims), or per element (``element``: broadcast to the loop by
    the wrapper first)."""
    xs = graph.node(x).shape
    if xs.is_scalar:
        return SCALAR
    node = graph.node(reader)
    if is_reduction(graph, reader):
        return PER_ELEMENT if xs == kernel.shape else PER_ROW
    if kernel.level(reader) == ROW:
        return PER_ROW
    n, k = len(kernel.shape.static), kernel.split
    if node.op == "broadcast_in":
        axes = normalize_axis(node.attr("axis"), n)
        return PER_ROW if axes[-1] == n - 1 else PER_COL
    if not kernel.flat and not xs.dyn:
        if xs.static in col_forms(kernel.shape, k):      # NumPy aligns on the right
            return PER_COL
        if xs.static == row_forms(kernel.shape, k)[1]:
            return PER_ROW
    return PER_ELEMENT


def input_slots(graph: Graph, kernel: ReduceKernel) -> list[tuple[int, str]]:
    """The kernel's array arguments after its outputs and partials: one per
    outside value and way of reading it, in order of first use."""
    slots: list[tuple[int, str]] = []
    for n in kernel.nodes:
        for x in value_args(graph, n):
            if x not in kernel.nodes:
                s = (x, access(graph, kernel, n, x))
                if s not in slots:
                    slots.append(s)
    return slots


@dataclass
class Schedule:
    """When each value of a reduce kernel is computed (see :func:`schedule`)."""

    passes: int
    phase: dict[int, int] = field(default_factory=dict)     # element node -> pass
    avail: dict[int, int] = field(default_factory=dict)     # row node -> before pass
    work: list[list[int]] = field(default_factory=list)     # element nodes per pass
    live: set[int] = field(default_factory=set)
    loads: list[list[int]] = field(default_factory=list)    # element nodes read back per pass
    scratch: list[int] = field(default_factory=list)        # element nodes kept in scratch


def _kind(graph: Graph, nid: int) -> str:
    op = graph.node(nid).op
    return "sum" if op == "sum_to" else op


def schedule(graph: Graph, kernel: ReduceKernel) -> Schedule:
    """Passes over a row: an element node runs in the pass after every row
    reduction it depends on has finished; a row reduction of an element value
    of pass ``p`` accumulates in passes ``p .. p + ROW_PASSES - 1`` and its value
    is available from the next; a row node is computed before the first pass
    in which all its operands are.  Only values that reach an output or a used
    partial are computed (``live``); element values a pass needs from earlier
    passes are recomputed (the row is in cache), not stored."""
    lv = dict(kernel.levels)
    inside = set(kernel.nodes)
    live = set(kernel.outputs) | set(kernel.partials)
    for n in reversed(kernel.nodes):
        if n in live:
            live.update(a for a in value_args(graph, n) if a in inside)
    sch = Schedule(passes=0, live=live)
    for n in kernel.nodes:
        ins = [a for a in value_args(graph, n) if a in inside]
        if lv[n] == ELEMENT:
            sch.phase[n] = max([sch.phase[a] if lv[a] == ELEMENT else sch.avail[a]
                                for a in ins], default=0)
        elif lv[n] == ROW:
            if is_reduction(graph, n):
                x = ins[0] if ins else None
                start = sch.phase.get(x, 0) if x is not None and lv[x] == ELEMENT else 0
                sch.avail[n] = start + ROW_PASSES[_kind(graph, n)]
            else:
                sch.avail[n] = max([sch.avail[a] for a in ins], default=0)
    need_e = [sch.phase[n] + 1 for n in live if lv[n] == ELEMENT]
    need_r = [sch.avail[n] for n in live if lv[n] == ROW]
    sch.passes = max(need_e + need_r + [1])
    outputs = {n for n in kernel.outputs if lv[n] == ELEMENT}
    _fill_work(graph, kernel, sch, outputs)
    # A costly element value a later pass needs again is kept in a row of scratch
    # memory (in cache) rather than computed again: softmax's exp once per element.
    again = {n for p, work in enumerate(sch.work) for n in work
             if sch.phase[n] < p and graph.node(n).op not in _RECOMPUTE}
    if again:
        sch.scratch = [n for n in kernel.nodes if n in again]
        _fill_work(graph, kernel, sch, outputs | again)
    return sch


# Element values a later pass of a row computes again rather than reading them from
# scratch memory: the arithmetic of gradc.passes.fuse's cheap set, division, and a row
# value broadcast (a name for the row value, nothing computed).
_RECOMPUTE = CHEAP | {"div", "broadcast_in"}


def _fill_work(graph: Graph, kernel: ReduceKernel, sch: Schedule, stored: set[int]) -> None:
    """``sch.work`` and ``sch.loads``: per pass the element nodes it computes and those
    it reads back from memory, an element value of an earlier pass that is ``stored``
    (a kernel output, or in scratch)."""
    lv = dict(kernel.levels)
    inside = set(kernel.nodes)
    sch.work, sch.loads = [], []
    for p in range(sch.passes):
        seeds = {n for n in sch.live if lv[n] == ELEMENT and sch.phase[n] == p
                 and (n in kernel.outputs or n in sch.scratch)}
        for n in sch.live:
            if not is_reduction(graph, n):
                continue
            xs = [a for a in value_args(graph, n) if a in inside and lv[a] == ELEMENT]
            if not xs:
                continue
            first = sch.phase[xs[0]]
            last = first + (ROW_PASSES[_kind(graph, n)] if lv[n] == ROW else 1)
            if first <= p < last:
                seeds.add(xs[0])
        loads = {n for n in seeds if sch.phase[n] < p and n in stored}
        seeds -= loads
        todo = list(seeds)
        while todo:
            n = todo.pop()
            for a in value_args(graph, n):
                if a in inside and lv[a] == ELEMENT and a not in seeds and a not in loads:
                    if sch.phase[a] < p and a in stored:
                        loads.add(a)
                    else:
                        seeds.add(a)
                        todo.append(a)
        sch.work.append([n for n in kernel.nodes if n in seeds])
        sch.loads.append([n for n in kernel.nodes if n in loads])


def render_reduce_kernel(graph: Graph, kernel: ReduceKernel, name: str, *,
                         fast_math: bool = False, comments: tuple[str, ...] = ()) -> str:
    """Source of the Numba kernels ``name`` (parallel over chunks of rows) and
    ``name_serial`` computing ``kernel``; arguments: the stored values (flat
    arrays of their own sizes), the partials (float64 arrays ``(_C,)`` or
    ``(_C, _N)``), the :func:`input_slots` (flat), then ``_R``, ``_N``, ``_C``
    and the dtype witness ``_w`` (as :func:`gradc.codegen.cpu.render_kernel`)."""
    lv = dict(kernel.levels)
    kinds = dict(kernel.chunk_kind)
    sch = schedule(graph, kernel)
    slots = input_slots(graph, kernel)
    slot_of = {s: j for j, s in enumerate(slots)}
    outs = {n: f"_o{j}" for j, n in enumerate(kernel.outputs)}
    parts = {n: f"_p{j}" for j, n in enumerate(kernel.partials)}
    pos = {n: k for k, n in enumerate(kernel.nodes)}
    params = ", ".join([*outs.values(), *parts.values(), *(f"_i{j}" for j in range(len(slots))),
                        "_R", "_N", "_C", "_w"])
    names: dict[int, str] = {}
    printer = CpuPrinter(graph, names)
    flat = kernel.flat
    col = ["_c"]          # the element's index in its row (_row_body's blocks change it)
    hoisted = [f"s{j} = _i{j}[0]" for j, (x, a) in enumerate(slots) if a == SCALAR]
    if any(graph.node(n).op == "norm" for n in kernel.nodes):     # the smallest normal number
        hoisted.append("_tn = 1.1754943508222875e-38 if _w.itemsize == 4 "
                       "else 2.2250738585072014e-308")

    def local(x: int, a: str) -> str:
        j = slot_of[(x, a)]
        return {SCALAR: f"s{j}", PER_ROW: f"b{j}", PER_COL: f"c{j}", PER_ELEMENT: f"a{j}"}[a]

    def bind(n: int) -> None:
        """Name node n's outside operands as n reads them."""
        for x in value_args(graph, n):
            if x not in lv:
                names[x] = local(x, access(graph, kernel, n, x))

    def value(n: int) -> list[str]:
        """Lines computing the element or row node n (aliases print nothing)."""
        node = graph.node(n)
        bind(n)
        prefix = "v" if lv[n] == ELEMENT else "u"
        if node.op == "broadcast_in":
            names[n] = printer.name(node.args[0])
            return []
        # the flat index of the element (or row) computed, for a draw's counter
        printer.index = "_r" if lv[n] == ROW else "_j" if flat else f"(_lo + {col[0]})"
        lines = printer.lines(n, f"{prefix}{pos[n]}")
        names[n] = f"{prefix}{pos[n]}"
        return lines

    def accumulate(n: int, acc: str, v: str, kind: str) -> str:
        if kind in ("sum", "mean"):
            return f"{acc} += {v}"
        if kind == "prod":
            return f"{acc} *= {v}"
        cmp = ">" if kind == "max" else "<"       # branch-free; a NaN stays
        return f"{acc} = {v} if (({v} {cmp} {acc}) | ({v} != {v})) else {acc}"

    def reduced_input(n: int) -> str:
        x = value_args(graph, n)[0]
        if x not in lv:
            names[x] = local(x, access(graph, kernel, n, x))
        return names[x]

    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    # reassoc lets LLVM vectorise the accumulations (lanes of partial sums); it
    # does not reach the math library's functions, whose instructions keep their
    # own flags when inlined (their range reductions must not be reassociated).
    fm = ", fastmath=" + ("{" + FAST_MATH[1:-1] + ', "reassoc"}' if fast_math else '{"reassoc"}')
    row_reds = [n for n in kernel.nodes if lv[n] == ROW and is_reduction(graph, n) and n in sch.live]
    chunk_reds = [n for n in kernel.partials]
    for suffix, par in (("", "parallel=True, "), ("_serial", "")):
        buf.line(f'@numba.njit({par}cache=True, error_model="numpy"{fm})')
        buf.line(f"def {name}{suffix}({params}):")
        buf.indent()
        buf.line("_T = _w.dtype.type")
        for h in hoisted:
            buf.line(h)
        buf.line("for _ch in numba.prange(_C):")
        buf.indent()
        buf.line("_r0 = _ch * _R // _C")
        buf.line("_r1 = (_ch + 1) * _R // _C")
        for n in chunk_reds:
            init = _INIT[_kind(graph, n)]
            if kinds[n] == "cols":
                buf.line(f"_q{pos[n]} = {parts[n]}[_ch]")
                buf.line("for _c in range(_N):")
                buf.line(f"    _q{pos[n]}[_c] = {init}")
                if _kind(graph, n) in ("sum", "mean") and not flat:
                    buf.line(f"_g{pos[n]} = np.zeros(_N, _w.dtype)")
            else:
                buf.line(f"_q{pos[n]} = {init}")
        if flat:
            _flat_body(buf, graph, kernel, sch, slots, outs, value, accumulate, reduced_input,
                       names, pos, kinds)
        else:
            _row_body(buf, graph, kernel, sch, slots, outs, value, accumulate, reduced_input,
                      names, pos, kinds, row_reds, col)
        for n in chunk_reds:
            if kinds[n] != "cols":
                buf.line(f"{parts[n]}[_ch] = _q{pos[n]}")
        buf.dedent()
        buf.dedent()
        buf.line()
    return buf.getvalue().rstrip("\n") + "\n"


def _flat_body(buf, graph, kernel, sch, slots, outs, value, accumulate, reduced_input,
               names, pos, kinds) -> None:
    """Rows of one element: one loop over the chunk's flat range."""
    buf.line("for _j in range(_r0, _r1):")
    buf.indent()
    for j, (x, a) in enumerate(slots):
        if a == PER_ELEMENT:
            buf.line(f"a{j} = _i{j}[_j]")
    for n in sch.work[0]:
        for line in value(n):
            buf.line(line)
    for n in kernel.partials:
        buf.line(accumulate(n, f"_q{pos[n]}", reduced_input(n), _kind(graph, n)))
    for n, o in outs.items():
        buf.line(f"{o}[_j] = {names[n]}")
    buf.dedent()


def _row_body(buf, graph, kernel, sch, slots, outs, value, accumulate, reduced_input,
              names, pos, kinds, row_reds, col) -> None:
    lv = dict(kernel.levels)
    for n in sch.scratch:           # one row of scratch per chunk of rows
        buf.line(f"_k{pos[n]} = np.empty(_N, _w.dtype)")
    buf.line("for _r in range(_r0, _r1):")
    buf.indent()
    buf.line("_lo = _r * _N")
    for j, (x, a) in enumerate(slots):
        if a == PER_ELEMENT:
            buf.line(f"_i{j}r = _i{j}[_lo:_lo + _N]")
        elif a == PER_ROW:
            buf.line(f"b{j} = _i{j}[_r]")
    for n, o in outs.items():
        if lv[n] == ELEMENT:
            buf.line(f"{o}r = {o}[_lo:_lo + _N]")
    done: set[int] = set()
    # where an element value stored in an earlier pass is read back: its output's row
    # (in cache: a reduce kernel never writes an input's memory), or scratch
    kept = {n: f"{o}r" for n, o in outs.items() if lv[n] == ELEMENT}
    kept.update((n, f"_k{pos[n]}") for n in sch.scratch)

    def row_values(before: int) -> None:
        """Row nodes available before pass ``before`` (reductions finished)."""
        for n in kernel.nodes:
            if lv[n] != ROW or n in done or n not in sch.live or sch.avail[n] > before:
                continue
            done.add(n)
            if is_reduction(graph, n):
                _finish_row(buf, graph, n, pos, names)
            else:
                for line in value(n):
                    buf.line(line)

    def first_pass(n: int) -> int:
        return sch.avail[n] - ROW_PASSES[_kind(graph, n)]

    for p in range(sch.passes):
        row_values(p)
        for n in row_reds:
            k = p - first_pass(n)
            kind = _kind(graph, n)
            if k == 0 and kind in ("logsumexp", "norm", "max", "min"):
                acc = "_m" if kind in ("logsumexp", "norm") else "_s"
                buf.line(f"{acc}{pos[n]} = _T({_INIT[kind]}); _n{pos[n]} = False")
            elif k == 0:
                buf.line(f"_s{pos[n]} = {_INIT[kind]}")
            elif k == 1 and ROW_PASSES[kind] == 2:
                _between(buf, kind, pos[n])
        # Sums run in blocks of _BLOCK elements in the compute dtype, each block's sum
        # added to the row's float64 sum: LLVM vectorises the block in as many lanes
        # as float32 fills (float64 accumulators would halve them, and every
        # function of the math library with them).
        blocked = [(f"_s{pos[n]}", f"_f{pos[n]}") for n in row_reds
                   if _blocked(graph, n, p - first_pass(n)) and _reads_element(graph, kernel, n)]
        blocked += [(f"_q{pos[n]}", f"_f{pos[n]}") for n in kernel.partials
                    if kinds[n] == "all" and _kind(graph, n) in ("sum", "mean")
                    and _reads_element(graph, kernel, n)
                    and sch.phase.get(value_args(graph, n)[0], 0) == p]
        # a pass in blocks reads and writes its arrays through slices of the block (an
        # index _b + _c kept LLVM from vectorising: gathers and scatters)
        sliced: list[str] = []

        def at(arr: str) -> str:
            if not blocked:
                return f"{arr}[_c]"
            if arr not in sliced:
                sliced.append(arr)
            return f"{arr}b[_c]"

        col[0] = "_b + _c" if blocked else "_c"
        body = IndentedBuffer()
        work = sch.work[p]
        used = {(x, access(graph, kernel, n, x)) for n in work for x in value_args(graph, n)
                if x not in lv}
        used |= {(x, access(graph, kernel, n, x)) for n in row_reds + list(kernel.partials)
                 for x in value_args(graph, n)[:1] if x not in lv}
        for j, (x, a) in enumerate(slots):
            if (x, a) in used and a == PER_ELEMENT:
                body.line(f"a{j} = {at(f'_i{j}r')}")
            elif (x, a) in used and a == PER_COL:
                body.line(f"c{j} = {at(f'_i{j}')}")
        for n in sch.loads[p]:
            names[n] = f"v{pos[n]}"
            body.line(f"v{pos[n]} = {at(kept[n])}")
        for n in work:
            for line in value(n):
                body.line(line)
        for n in sch.scratch:
            if sch.phase[n] == p:
                body.line(f"{at(f'_k{pos[n]}')} = {names[n]}")
        block = dict(blocked)
        for n in row_reds:
            k = p - first_pass(n)
            if 0 <= k < ROW_PASSES[_kind(graph, n)] and _reads_element(graph, kernel, n):
                body.line(_row_update(graph, n, k, pos[n], reduced_input(n), accumulate,
                                      block.get(f"_s{pos[n]}", f"_s{pos[n]}")))
        for n in kernel.partials:
            x = value_args(graph, n)[0]
            if _reads_element(graph, kernel, n) and sch.phase.get(x, 0) == p:
                acc = (at(f"_g{pos[n]}") if kinds[n] == "cols" and _kind(graph, n) in (
                    "sum", "mean") else at(f"_q{pos[n]}") if kinds[n] == "cols" else f"_q{pos[n]}")
                body.line(accumulate(n, block.get(acc, acc), reduced_input(n), _kind(graph, n)))
        for n, o in outs.items():
            if lv[n] == ELEMENT and sch.phase[n] == p:
                body.line(f"{at(f'{o}r')} = {names[n]}")
        if blocked:
            buf.line(f"for _b in range(0, _N, {_BLOCK}):")
            buf.indent()
            buf.line(f"_e = min(_b + {_BLOCK}, _N)")
            for arr in sliced:
                buf.line(f"{arr}b = {arr}[_b:_e]")
            for _, blk in blocked:
                buf.line(f"{blk} = _T(0.0)")
            buf.line("for _c in range(_e - _b):")
        else:
            buf.line("for _c in range(_N):")
        buf.indent()
        for line in body.getvalue().splitlines():
            buf.line(line)
        buf.dedent()
        if blocked:
            for acc, blk in blocked:
                buf.line(f"{acc} += {blk}")
            buf.dedent()
    row_values(sch.passes)
    for n, o in outs.items():
        if lv[n] == ROW:
            buf.line(f"{o}[_r] = {names[n]}")
    for n in kernel.partials:
        if not _reads_element(graph, kernel, n):
            buf.line(accumulate(n, f"_q{pos[n]}", reduced_input(n), _kind(graph, n)))
    # sums across rows (dw, db) gather _ROWS_F rows in the compute dtype, then are
    # added to the chunk's float64 partial: the passes keep float32's vector lanes
    cols = [n for n in kernel.partials if kinds[n] == "cols" and _kind(graph, n) in ("sum", "mean")]
    if cols:
        buf.line(f"if (_r - _r0) % {_ROWS_F} == {_ROWS_F - 1} or _r == _r1 - 1:")
        buf.line("    for _c in range(_N):")
        for n in cols:
            buf.line(f"        _q{pos[n]}[_c] += _g{pos[n]}[_c]")
            buf.line(f"        _g{pos[n]}[_c] = 0.0")
    buf.dedent()


# Rows a sum across rows gathers in the compute dtype before its float64 partial.
_ROWS_F = 16


def _reads_element(graph: Graph, kernel: ReduceKernel, n: int) -> bool:
    """Whether reduction ``n`` reduces an element value (else a row value)."""
    x = value_args(graph, n)[0]
    lv = dict(kernel.levels)
    return lv.get(x) == ELEMENT if x in lv else graph.node(x).shape == kernel.shape


def _row_update(graph: Graph, n: int, k: int, i: int, v: str, accumulate, acc: str) -> str:
    """Pass ``k`` of row reduction ``n`` (position ``i``) of the element value ``v``;
    sums go to ``acc`` (``_s{i}``, or its block's ``_f{i}``)."""
    kind = _kind(graph, n)
    if kind == "logsumexp":
        return (_max_update(f"_m{i}", f"_n{i}", v, "max") if k == 0
                else f"{acc} += _g_exp({v} - _h{i})")
    if kind == "norm":
        if k == 0:
            return f"_a{i} = abs({v}); " + _max_update(f"_m{i}", f"_n{i}", f"_a{i}", "max")
        return f"_t{i} = {v} / _h{i}; {acc} += _t{i} * _t{i}"
    if kind in ("max", "min"):
        return _max_update(f"_s{i}", f"_n{i}", v, kind)
    return accumulate(n, acc, v, kind)


# Elements per block of a row's sum in the compute dtype (_row_body): 16 float32 lanes
# of 16 serial additions each, so a block's rounding error stays within about 16 ulp
# of its sum, and the blocks are added in float64.
_BLOCK = 256


def _blocked(graph: Graph, n: int, k: int) -> bool:
    """Whether pass ``k`` of row reduction ``n`` is a sum run in blocks."""
    kind = _kind(graph, n)
    return (kind in ("sum", "mean") and k == 0) or (kind in ("logsumexp", "norm") and k == 1)


def _max_update(acc: str, nan: str, v: str, kind: str) -> str:
    """A row's max or min in the compute dtype, NaN kept apart (an or-reduction): LLVM
    vectorises both, not a select that propagates a NaN."""
    return f"{acc} = _g_r{kind}({acc}, _T({v})); {nan} |= {v} != {v}"


def _between(buf: IndentedBuffer, kind: str, i: int) -> None:
    """After the first pass of a two-pass reduction: the shift or scale."""
    buf.line(f"_m{i} = _T(np.nan) if _n{i} else _m{i}")
    if kind == "logsumexp":       # the max where finite, else 0 (as prelude._g_logsumexp)
        buf.line(f"_h{i} = _T(_m{i}) if (_m{i} - _m{i}) == 0.0 else _T(0.0)")
    else:   # the max |x| where finite, raised to the smallest normal number (1/_h stays
            # finite, as --fast-math's x * (1/_h) needs), 1 where it is 0, inf or NaN
        buf.line(f"_h{i} = (_T(max(_m{i}, _tn)) if (_m{i} > 0.0 and _m{i} < np.inf) "
                 f"else _T(1.0))")
    buf.line(f"_s{i} = 0.0")


def _finish_row(buf: IndentedBuffer, graph: Graph, n: int, pos, names) -> None:
    i, kind = pos[n], _kind(graph, n)
    names[n] = f"u{i}"
    if kind == "mean":
        buf.line(f"u{i} = _T(_s{i} / _N)")
    elif kind == "logsumexp":
        buf.line(f"u{i} = _T(np.log(_s{i})) + _h{i}")
    elif kind == "norm":
        buf.line(f"u{i} = _T(_m{i}) if _m{i} == np.inf else _T(np.sqrt(_s{i})) * _h{i}")
    elif kind in ("max", "min"):
        buf.line(f"u{i} = _T(np.nan) if _n{i} else _s{i}")
    else:
        buf.line(f"u{i} = _T(_s{i})")
