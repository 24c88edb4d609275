"""CPU reduce kernels: one Numba loop over the rows of a :class:`ReduceKernel`.

The kernel ``name(*outputs, *partials, *inputs, _R, _N, _C, _w)`` runs
``numba.prange`` over ``_C`` chunks of the ``_R`` rows of ``_N`` elements
(:func:`gradc.passes.fuse_reduce.fuse_reductions` explains the levels).  Per
row it runs the passes of the schedule
(:func:`gradc.passes.row_schedule.schedule`); each pass loops over the row's
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

from gradc.codegen.cpu import FAST_MATH_FLAGS, CpuPrinter
from gradc.codegen.printer import IndentedBuffer
from gradc.codegen.quote import comment
from gradc.ir.graph import Graph
from gradc.passes.fuse import CHEAP
from gradc.passes.fuse_reduce import (ELEMENT, ROW, ROW_PASSES, ReduceKernel, is_reduction,
                                      value_args)
from gradc.passes.row_schedule import (PER_COL, PER_ELEMENT, PER_ROW, SCALAR, KernelNames,
                                       access, reads_element, reduction_kind, rows_ready,
                                       schedule, shift_line)

_INIT = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "max": "-np.inf", "min": "np.inf",
         "logsumexp": "-np.inf", "norm": "-np.inf", "sum_to": "0.0"}


def render_reduce_kernel(graph: Graph, kernel: ReduceKernel, name: str, *,
                         fast_math: bool = False, comments: tuple[str, ...] = ()) -> str:
    """Source of the Numba kernels ``name`` (parallel over chunks of rows) and
    ``name_serial`` computing ``kernel``; arguments: the stored values (flat
    arrays of their own sizes), the partials (float64 arrays ``(_C,)`` or
    ``(_C, _N)``), the :func:`~gradc.passes.row_schedule.input_slots` (flat), then ``_R``, ``_N``, ``_C``
    and the dtype witness ``_w`` (as :func:`gradc.codegen.cpu.render_kernel`)."""
    lv = dict(kernel.levels)
    kinds = dict(kernel.chunk_kind)
    sch = schedule(graph, kernel)
    outs = {n: f"_o{j}" for j, n in enumerate(kernel.outputs)}
    parts = {n: f"_p{j}" for j, n in enumerate(kernel.partials)}
    names: dict[int, str] = {}
    kn = KernelNames(graph, kernel, CpuPrinter(graph, names))
    slots, pos, reduced_input = kn.slots, kn.pos, kn.reduced
    params = ", ".join([*outs.values(), *parts.values(), *(f"_i{j}" for j in range(len(slots))),
                        "_R", "_N", "_C", "_w"])
    flat = kernel.flat
    col = ["_c"]          # the element's index in its row (_row_body's blocks change it)
    hoisted = [f"s{j} = _i{j}[0]" for j, (x, a) in enumerate(slots) if a == SCALAR]
    if any(graph.node(n).op == "norm" for n in kernel.nodes):     # the smallest normal number
        hoisted.append("_tn = 1.1754943508222875e-38 if _w.itemsize == 4 "
                       "else 2.2250738585072014e-308")

    def value(n: int) -> list[str]:
        """Lines computing the element or row node n (aliases print nothing)."""
        return kn.value(n, "_r" if lv[n] == ROW else "_j" if flat else f"(_lo + {col[0]})")

    def accumulate(n: int, acc: str, v: str, kind: str) -> str:
        if kind in ("sum", "mean"):
            return f"{acc} += {v}"
        if kind == "prod":
            return f"{acc} *= {v}"
        cmp = ">" if kind == "max" else "<"       # branch-free; a NaN stays
        return f"{acc} = {v} if (({v} {cmp} {acc}) | ({v} != {v})) else {acc}"

    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    # reassoc lets LLVM vectorise the accumulations (lanes of partial sums); it
    # does not reach the math library's functions, whose instructions keep their
    # own flags when inlined (their range reductions must not be reassociated).
    # With --fast-math, nsz is left out: reassoc and nsz together let LLVM regroup
    # subtractions, (x - m) - lse as x - (m + lse), which rounded log_softmax of float32
    # logits near 1e4 to 5e-4 (1e-6 without).
    flags = [f for f in FAST_MATH_FLAGS if f != "nsz"] if fast_math else []
    fm = ", fastmath={" + ", ".join(f'"{f}"' for f in [*flags, "reassoc"]) + "}"
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
            init = _INIT[reduction_kind(graph, n)]
            if kinds[n] == "cols":
                buf.line(f"_q{pos[n]} = {parts[n]}[_ch]")
                buf.line("for _c in range(_N):")
                buf.line(f"    _q{pos[n]}[_c] = {init}")
                if reduction_kind(graph, n) in ("sum", "mean") and not flat:
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
        buf.line(accumulate(n, f"_q{pos[n]}", reduced_input(n), reduction_kind(graph, n)))
    for n, o in outs.items():
        buf.line(f"{o}[_j] = {names[n]}")
    buf.dedent()


def _row_body(buf, graph, kernel, sch, slots, outs, value, accumulate, reduced_input,
              names, pos, kinds, row_reds, col) -> None:
    lv = dict(kernel.levels)

    def first_pass(n: int) -> int:
        return sch.avail[n] - ROW_PASSES[reduction_kind(graph, n)]

    def blocked_sums(p: int) -> list[tuple[str, str]]:
        """(accumulator, block accumulator) of the sums pass ``p`` runs in blocks."""
        # Sums run in blocks of _BLOCK elements in the compute dtype, each block's sum
        # added to the row's float64 sum: LLVM vectorises the block in as many lanes
        # as float32 fills (float64 accumulators would halve them, and every
        # function of the math library with them).
        return [(f"_s{pos[n]}", f"_f{pos[n]}") for n in row_reds
                if _blocked(graph, n, p - first_pass(n)) and reads_element(graph, kernel, n)] + [
            (f"_q{pos[n]}", f"_f{pos[n]}") for n in kernel.partials
            if kinds[n] == "all" and reduction_kind(graph, n) in ("sum", "mean")
            and reads_element(graph, kernel, n) and sch.phase.get(value_args(graph, n)[0], 0) == p]

    def slots_used(p: int) -> set[tuple[int, str]]:
        """The (value, access) of the input slots pass ``p`` may read."""
        used = {(x, access(graph, kernel, n, x)) for n in sch.work[p]
                for x in value_args(graph, n) if x not in lv}
        return used | {(x, access(graph, kernel, n, x)) for n in row_reds + list(kernel.partials)
                       for x in value_args(graph, n)[:1] if x not in lv}

    # One pass in blocks prefetches the next row's elements, a block at a time, so memory
    # delivers them while this row computes (rows of a page or more start cold: the
    # hardware's prefetchers stop at page boundaries): of those that read nothing from
    # memory themselves (no first read of the row: a pass streaming its row gains
    # nothing from streaming the next one too), the one with the most arithmetic to
    # hide the hints' loop in (layer norm's variance pass, a subtraction and a square
    # per element, ran 5-10 % slower with it).  The next row's element outputs are
    # prefetched for writing (owned lines: their stores need no read for ownership;
    # one thread, rows of 1024: softmax's fused fwd_bwd 1.26x, layer norm's 1.20x).
    # A pass without sums is not run in blocks for the hints (RMS norm's last pass:
    # 0.75-0.88x in blocks).  _pf says whether rows are of that size.
    streamed = [(j, (x, a)) for j, (x, a) in enumerate(slots) if a == PER_ELEMENT]
    seen: set[tuple[int, str]] = set()
    fresh = []                                  # per pass: its first reads of the row
    for p in range(sch.passes):
        used = slots_used(p)
        fresh.append(sum(1 for _, s in streamed if s in used and s not in seen))
        seen |= used
    prefetch_pass = max((p for p in range(sch.passes) if blocked_sums(p) and not fresh[p]),
                        key=lambda p: (_arithmetic(graph, sch.work[p]), -p), default=None)
    for n in sch.scratch:           # one row of scratch per chunk of rows
        buf.line(f"_k{pos[n]} = np.empty(_N, _w.dtype)")
    if prefetch_pass is not None and streamed:
        buf.line(f"_pf = {_PREFETCH_ROWS[0]} <= _N and _N * _w.itemsize <= {_PREFETCH_ROWS[1]}")
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
        for n in rows_ready(kernel, sch, before, done):
            if is_reduction(graph, n):
                _finish_row(buf, graph, n, pos, names)
            else:
                for line in value(n):
                    buf.line(line)

    for p in range(sch.passes):
        row_values(p)
        for n in row_reds:
            k = p - first_pass(n)
            kind = reduction_kind(graph, n)
            if k == 0 and kind in ("logsumexp", "norm", "max", "min"):
                acc = "_m" if kind in ("logsumexp", "norm") else "_s"
                buf.line(f"{acc}{pos[n]} = _T({_INIT[kind]}); _n{pos[n]} = False")
            elif k == 0:
                buf.line(f"_s{pos[n]} = {_INIT[kind]}")
            elif k == 1 and ROW_PASSES[kind] == 2:
                _between(buf, kind, pos[n])
        blocked = blocked_sums(p)
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
        used = slots_used(p)
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
            if 0 <= k < ROW_PASSES[reduction_kind(graph, n)] and reads_element(graph, kernel, n):
                body.line(_row_update(graph, n, k, pos[n], reduced_input(n), accumulate,
                                      block.get(f"_s{pos[n]}", f"_s{pos[n]}")))
        for n in kernel.partials:
            x = value_args(graph, n)[0]
            if reads_element(graph, kernel, n) and sch.phase.get(x, 0) == p:
                acc = (at(f"_g{pos[n]}") if kinds[n] == "cols" and reduction_kind(graph, n) in (
                    "sum", "mean") else at(f"_q{pos[n]}") if kinds[n] == "cols" else f"_q{pos[n]}")
                body.line(accumulate(n, block.get(acc, acc), reduced_input(n), reduction_kind(graph, n)))
        for n, o in outs.items():
            if lv[n] == ELEMENT and sch.phase[n] == p:
                body.line(f"{at(f'{o}r')} = {names[n]}")
        if blocked:
            buf.line(f"for _b in range(0, _N, {_BLOCK}):")
            buf.indent()
            buf.line(f"_e = min(_b + {_BLOCK}, _N)")
            if p == prefetch_pass and streamed:
                buf.line("if _pf:")
                for j, _ in streamed:
                    buf.line(f"    _g_prefetch(_i{j}, _lo + _N + _b, _lo + _N + _e)")
                for n, o in outs.items():
                    if lv[n] == ELEMENT:
                        buf.line(f"    _g_prefetch_w({o}, _lo + _N + _b, _lo + _N + _e)")
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
        if not reads_element(graph, kernel, n):
            buf.line(accumulate(n, f"_q{pos[n]}", reduced_input(n), reduction_kind(graph, n)))
    # sums across rows (dw, db) gather _ROWS_F rows in the compute dtype, then are
    # added to the chunk's float64 partial: the passes keep float32's vector lanes
    cols = [n for n in kernel.partials if kinds[n] == "cols" and reduction_kind(graph, n) in ("sum", "mean")]
    if cols:
        buf.line(f"if (_r - _r0) % {_ROWS_F} == {_ROWS_F - 1} or _r == _r1 - 1:")
        buf.line("    for _c in range(_N):")
        for n in cols:
            buf.line(f"        _q{pos[n]}[_c] += _g{pos[n]}[_c]")
            buf.line(f"        _g{pos[n]}[_c] = 0.0")
    buf.dedent()


# The rows whose next row a reduce kernel prefetches: at least this many elements
# (shorter rows follow each other within a page, where the hardware's prefetchers
# work), of at most this many bytes (a longer row's own passes fill the caches).
_PREFETCH_ROWS = (512, 1 << 17)

# Rows a sum across rows gathers in the compute dtype before its float64 partial.
_ROWS_F = 16


def _row_update(graph: Graph, n: int, k: int, i: int, v: str, accumulate, acc: str) -> str:
    """Pass ``k`` of row reduction ``n`` (position ``i``) of the element value ``v``;
    sums go to ``acc`` (``_s{i}``, or its block's ``_f{i}``)."""
    kind = reduction_kind(graph, n)
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
    kind = reduction_kind(graph, n)
    return (kind in ("sum", "mean") and k == 0) or (kind in ("logsumexp", "norm") and k == 1)


def _arithmetic(graph: Graph, nodes) -> int:
    """A rough cost of computing ``nodes`` per element: 1 per cheap primitive, 10 per
    costly one (transcendental, division: ``gradc.passes.fuse.CHEAP``)."""
    return sum(1 if graph.node(n).op in CHEAP else 10 for n in nodes)


def _max_update(acc: str, nan: str, v: str, kind: str) -> str:
    """A row's max or min in the compute dtype, NaN kept apart (an or-reduction): LLVM
    vectorises both, not a select that propagates a NaN."""
    return f"{acc} = _g_r{kind}({acc}, _T({v})); {nan} |= {v} != {v}"


def _between(buf: IndentedBuffer, kind: str, i: int) -> None:
    """After the first pass of a two-pass reduction: the shift or scale."""
    buf.line(f"_m{i} = _T(np.nan) if _n{i} else _m{i}")
    buf.line(shift_line(kind, i, "np.inf"))
    buf.line(f"_s{i} = 0.0")


def _finish_row(buf: IndentedBuffer, graph: Graph, n: int, pos, names) -> None:
    i, kind = pos[n], reduction_kind(graph, n)
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
