"""CPU reduce kernels: one Numba loop over the rows of a :class:`ReduceKernel`.

The kernel ``name(*outputs, *partials, *inputs, _R, _N, _C, _w)`` runs
``numba.prange`` over ``_C`` chunks of the ``_R`` rows of ``_N`` elements, each a
call of the body ``name_chunks``
(:func:`gradc.passes.fuse_reduce.fuse_reductions` explains the levels).  Its
loops are :func:`gradc.passes.loop_ir.lower`'s (target ``CPU``): per row the
passes of the schedule, each a loop over the row's elements (some in blocks,
one with the next row's prefetch hints), row values between them; chunk
reductions accumulate per chunk into ``partials`` (float64), combined by the
wrapper.  This module prints that IR as Numba source and decides nothing:
the passes, blocks, hints, buffers and the slots each pass reads are the
IR's.  A kernel with passes over rows also has a split form for calls of few long
rows (:meth:`_CpuLoops.split`: each pass over segments of a row in parallel, the
segments' accumulators combined between passes; :data:`~gradc.passes.loop_ir.SPLIT`),
and where :func:`~gradc.passes.loop_ir.online` says so an online form for long rows
(``name_online``, its sums of ``exp(x - max(x))`` in the pass of the max).

Accumulators are float64 whatever the compute dtype (sums of float32 values
keep float32 accuracy over long rows, as the CUDA run time does); ``max`` and
``min`` propagate NaN as NumPy does; ``logsumexp`` and ``norm`` take two
passes (the max, then the shifted or scaled sum: ``prelude._g_logsumexp``,
``prelude._g_norm``), so they agree with the NumPy steps at ±inf, NaN and on
empty rows.
"""
from __future__ import annotations

from gradc.codegen.cpu import FAST_MATH_FLAGS, CpuPrinter
from gradc.codegen.printer import DTYPE_CTOR, IndentedBuffer, LoopPrinter
from gradc.codegen.quote import comment
from gradc.ir.graph import FLOAT, Graph
from gradc.passes.fuse_reduce import ELEMENT, ROW, ReduceKernel, value_args
from gradc.passes.loop_ir import (APART, BLOCK, CPU, PIVOT, ROW_GROUP, Acc, Buffer, Compute,
                                  Finish, Load, LoadBack, Online, Pass, PartialWrite, ReduceLoops,
                                  Shift, Stage, Start, Store, Update, lower, online)
from gradc.passes.row_schedule import (PER_COL, PER_ELEMENT, PER_ROW, SCALAR, access,
                                       accumulate_line, shift_line)

# The smallest normal number of the compute dtype (a norm's scale is at least that).
_TINY_NORMAL = "_tn = 1.1754943508222875e-38 if _w.itemsize == 4 else 2.2250738585072014e-308"

_INIT = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "max": "-np.inf", "min": "np.inf",
         "logsumexp": "-np.inf", "norm": "-np.inf", "sum_to": "0.0"}


def render_reduce_kernel(graph: Graph, kernel: ReduceKernel, name: str, *,
                         fast_math: bool = False, comments: tuple[str, ...] = (),
                         segments: dict[str, str] | None = None) -> str:
    """Source of the Numba kernels ``name`` (parallel over chunks of rows) and
    ``name_chunks`` (its body: the chunks ``_c0`` to ``_c1``) computing ``kernel``;
    arguments: the stored values (flat
    arrays of their own sizes), the partials (float64 arrays ``(_C,)`` or
    ``(_C, _N)``), the :func:`~gradc.passes.row_schedule.input_slots` (flat), then ``_R``, ``_N``, ``_C``
    and the dtype witness ``_w`` (as :func:`gradc.codegen.cpu.render_kernel`).
    ``segments``: the module's segment functions of split rows so far, by their text
    (:meth:`_CpuLoops.split`), which this kernel's identical ones name instead of
    printing them again."""
    loops = lower(graph, kernel, CPU)
    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    # No reassoc on the kernel: only the accumulations carry it (_update,
    # _g_radd), which lets LLVM vectorise them in lanes of partial sums; on the whole
    # kernel it also regrouped the element arithmetic (x / s * w as x * w / s, which
    # overflows first). With --fast-math, nsz is left out: with reassoc on the whole
    # kernel it let LLVM regroup subtractions, (x - m) - lse as x - (m + lse), which
    # rounded log_softmax of float32 logits near 1e4 to 5e-4 (1e-6 without).
    flags = [f for f in FAST_MATH_FLAGS if f != "nsz"] if fast_math else []
    fm = ", fastmath={" + ", ".join(f'"{f}"' for f in flags) + "}" if flags else ""
    printer = _CpuLoops(graph, kernel, loops, segments)
    printer.kernel(buf, f"{name}_chunks", fm)
    buf.line()
    printer.entries(buf, name)
    if loops.split:
        buf.line()
        printer.split(buf, name, fm)
    if online(graph, kernel):               # long rows: name_online, a pass fewer
        loops = lower(graph, kernel, CPU, online=True)
        printer = _CpuLoops(graph, kernel, loops, segments)
        buf.line()
        printer.kernel(buf, f"{name}_online_chunks", fm)
        buf.line()
        printer.entries(buf, f"{name}_online")
        if loops.split:
            buf.line()
            printer.split(buf, f"{name}_online", fm)
    return buf.getvalue().rstrip("\n") + "\n"


class _CpuLoops(LoopPrinter):
    """Prints a :class:`~gradc.passes.loop_ir.ReduceLoops` as one Numba kernel."""

    def __init__(self, graph: Graph, kernel: ReduceKernel, loops: ReduceLoops,
                 segments: dict[str, str] | None = None) -> None:
        super().__init__(graph, kernel, loops, CpuPrinter)
        self.segments = segments                # render_reduce_kernel's
        self.sliced: list[str] | None = None    # a pass in blocks: the arrays it slices
        self.centres = {c.node: c for ps in loops.passes for c in ps.centred}
        self.shifted: list[str] = []            # the centred sums' values started
        self.stage_at = "_c"                    # the element's index in a stage row
        self.segment = False                    # printing a pass over a segment of a row
        self.skip_hosted = False                # printing the loop of calls whose outputs host
        self.unstaged: set[int] = set()         # centred sums a pivoted loop does not stage
        self.flag = "_n"                        # a NaN flag's prefix: "_nb" in a block's loop

    def params(self, *chunks: str, n: str = "_N") -> str:
        """The kernel's parameters (``chunks``: the first and the last chunk, the body's;
        ``n``: the row length's, as a call passes it)."""
        return ", ".join([*self.outs.values(), *self.parts.values(),
                          *(f"_i{j}" for j in range(len(self.loops.slots))), "_R", n, "_C",
                          *chunks, "_w"])

    def entries(self, buf: IndentedBuffer, name: str) -> None:
        """``name``, one ``numba.prange`` iteration per chunk, each a call of the body
        ``name_chunks``, a plain function (which serial calls run on every chunk
        directly): compiled inside the parallel loop (Numba outlines a ``prange`` body
        into a function of its own, after its parfor passes), the same loops were
        1.2-1.6x slower on one thread for log-softmax and cross-entropy (a row's max
        left scalar). A serial twin calling the body would be compiled as much again
        (LLVM optimises the callee once more inside each caller). The chunk index is
        passed signed, as serial calls pass theirs: prange's unsigned one compiled the
        body a second time (1-3 s)."""
        self.parallel(buf, name, name, "_N")
        for k in self.loops.static:     # rows of k: the body compiled for that length
            buf.line()
            self.parallel(buf, f"{name}_n{k}", name, str(k))
            buf.line()
            buf.line("@numba.njit(cache=True)")
            buf.line(f"def {name}_n{k}_chunks({self.params('_c0', '_c1')}):")
            buf.line(f"    {name}_chunks({self.params('_c0', '_c1', n=str(k))})")

    def parallel(self, buf: IndentedBuffer, entry: str, name: str, n: str) -> None:
        """``entry``, the parallel loop over chunks calling ``name_chunks`` with row
        length ``n``: ``_N``, or a literal of :data:`~gradc.passes.loop_ir.STATIC_ROWS`
        (``name_n<k>``, and its serial twin ``name_n<k>_chunks``), which Numba
        compiles as a body of its own with that trip count."""
        buf.line("@numba.njit(parallel=True, cache=True)")
        buf.line(f"def {entry}({self.params()}):")
        buf.line("    for _ch in numba.prange(_C):")
        chunks = ("np.int64(_ch)", "np.int64(_ch) + 1")
        buf.line(f"        {name}_chunks({self.params(*chunks, n=n)})")

    def function(self, buf: IndentedBuffer, name: str, params: str, fm: str,
                 scalars: bool = True) -> None:
        """The head of function ``name`` of the kernel, its body indented: the compute
        dtype ``_T`` and (``scalars``) the scalar inputs."""
        buf.line(f'@numba.njit(cache=True, error_model="numpy"{fm})')
        buf.line(f"def {name}({params}):")
        buf.indent()
        buf.line("_T = _w.dtype.type")
        for j, (x, a) in enumerate(self.loops.slots):
            if a == SCALAR and scalars:
                buf.line(f"s{j} = _i{j}[0]")

    @staticmethod
    def ahead(buf: IndentedBuffer, passes: list[Pass]) -> None:
        """``_pa``: how many elements ahead of its block a pass streaming its row
        prefetches its inputs (``Prefetch.ahead``, bytes), where one of ``passes`` does."""
        ahead = {ps.prefetch.ahead for ps in passes if ps.prefetch and ps.prefetch.ahead}
        for a in ahead:
            buf.line(f"_pa = {a} // _w.itemsize")

    def kernel(self, buf: IndentedBuffer, name: str, fm: str) -> None:
        """The body: the rows of chunks ``_c0`` to ``_c1`` (exclusive)."""
        loops, pos, parts = self.loops, self.pos, self.parts
        self.index = "_j"
        self.function(buf, name, self.params("_c0", "_c1"), fm)
        if self.loops.static:           # a constant where an entry of static_entries calls
            buf.line("_N = _g_row_len(_N)")
        if loops.stages or loops.scratch or loops.gather:
            buf.line(f"_ap = {APART} // _w.itemsize")
        if loops.gather:
            buf.line(f"_gs = _g_gathers_straight(_R, _C, {loops.gather_rows})")
        self.ahead(buf, loops.passes)
        for b in loops.stages:
            buf.line(f"{self.stage_row(b)} = {_own('empty', str(BLOCK))}")
        if loops.tiny_normal:                   # the smallest normal number
            buf.line(_TINY_NORMAL)
        buf.line("for _ch in range(_c0, _c1):")
        buf.indent()
        buf.line("_r0 = _ch * _R // _C")
        buf.line("_r1 = (_ch + 1) * _R // _C")
        for init in loops.partial_inits:
            i = pos[init.node]
            if init.chunk == "cols":
                buf.line(f"_q{i} = {parts[init.node]}[_ch]")
                buf.line("for _c in range(_N):")
                buf.line(f"    _q{i}[_c] = {_INIT[init.kind]}")
                if init.gathered:       # the partial's row itself, or a row of its own
                    buf.line(f"_g{i} = _g_gather_row(_q{i}, _gs, _N, _ap, _w)")
            else:
                buf.line(f"_q{i} = {_INIT[init.kind]}")
        if loops.flat and loops.flat_staged:
            buf.line(f"for _b in range(_r0, _r1, {BLOCK}):")
            buf.indent()
            buf.line(f"_e = min(_b + {BLOCK}, _r1)")
            buf.line("for _j in range(_b, _e):")
            self.stage_at = "_j - _b"
            self.statements(buf.indent(), loops.flat_body)
            buf.dedent()
            self.stage_at = "_c"
            self.sums(buf, loops.flat_staged, "_e - _b")
            buf.dedent()
        elif loops.flat:
            buf.line("for _j in range(_r0, _r1):")
            buf.indent()
            self.statements(buf, loops.flat_body)
            buf.dedent()
        else:
            self.rows(buf)
        self.statements(buf, loops.chunk_end)
        buf.dedent()
        buf.dedent()

    def rows(self, buf: IndentedBuffer) -> None:
        """The loop over the chunk's rows: the passes, the row steps between them (in
        groups of rows where the IR says so: :meth:`grouped`)."""
        loops, pos = self.loops, self.pos
        group = loops.row_group > 1
        if group:                         # loop_ir.ROW_GROUP: short rows in groups
            buf.line(f"_Q = {loops.row_group} if _N * _w.itemsize <= {ROW_GROUP[1]} else 1")
        for n in loops.scratch:           # one row of scratch per row of a chunk's group
            own = "s" if n in loops.hosts or group else ""
            buf.line(f"_k{pos[n]}{own} = {_own('empty', '_Q * _N' if group else '_N')}")
        if loops.hosts:                   # or an output's row where the call allows it
            buf.line(f"_ho = {self.hosts_apart()}")
        if loops.prefetch_rows:             # the module's pair, loop_ir.PREFETCH_ROWS
            buf.line("_pf = _G_PREFETCH[0] < _N * _w.itemsize <= _G_PREFETCH[1]")
        if group:
            self.grouped(buf)
            return
        buf.line("for _r in range(_r0, _r1):")
        buf.indent()
        self.row_start(buf, False)
        for ps in loops.passes:
            self.shifted = []
            self.statements(buf, ps.before)
            self.one_pass(buf, ps)
        self.statements(buf, loops.after)
        self.index = "_r"
        self.statements(buf, loops.row_end)
        # sums across rows (dw, db) gather rows in the compute dtype, then are added to
        # the chunk's float64 partial: the passes keep float32's vector lanes (where the
        # partial is of the compute dtype they gather in it, and there is nothing to add)
        if loops.gather:
            k = loops.gather_rows
            buf.line(f"if (_r - _r0) % {k} == {k - 1} or _r == _r1 - 1:")
            for n in loops.gather:
                buf.line(f"    _g_gather_flush(_q{pos[n]}, _g{pos[n]}, _gs)")
        buf.dedent()

    def row_start(self, buf: IndentedBuffer, group: bool) -> None:
        """Row ``_r``'s views of its arrays, its values of inputs per row, and its
        scratch rows (in a group, row ``_q`` of the chunk's)."""
        loops, pos = self.loops, self.pos
        buf.line("_lo = _r * _N")
        for j, (x, a) in enumerate(loops.slots):
            if a == PER_ELEMENT:
                buf.line(f"_i{j}r = _g_view(_i{j}, _lo, _lo + _N)")
            elif a == PER_ROW:
                buf.line(f"b{j} = _i{j}[_r]")
        for n in loops.outputs:
            if self.kn.level[n] == ELEMENT:
                buf.line(f"{self.outs[n]}r = _g_view({self.outs[n]}, _lo, _lo + _N)")
        span = "_q * _N, _q * _N + _N" if group else "0, _N"
        for n in loops.scratch:                 # (views: no reference counts)
            if n in loops.hosts:
                buf.line(f"_k{pos[n]} = {self.outs[loops.hosts[n]]}r if _ho "
                         f"else _g_view(_k{pos[n]}s, {span})")
            elif group:
                buf.line(f"_k{pos[n]} = _g_view(_k{pos[n]}s, {span})")

    def grouped(self, buf: IndentedBuffer) -> None:
        """The chunk's rows in groups of ``_Q`` (:data:`~gradc.passes.loop_ir.ROW_GROUP`):
        each pass a loop over the group's rows, the row steps before a pass in its loop,
        before the pass (where the values of the reductions of the pass before it are
        taken, right after that pass).  A row value that a later pass's loop reads is
        kept in ``_rv_<name>[_q]``, one element per row of the group, of the value's
        dtype.  The same statements per row as one row at a time, the sums across rows
        in the same order of rows: the same bits.  (The row steps taken right after the
        pass that ends their sums, in its loop, left cross-entropy's rows of 64 as slow
        as one row at a time; before the pass that needs them, 1.25x on one thread.)"""
        loops = self.loops
        last = len(loops.passes) - 1
        bodies, reads, defined, kinds = [], [], {}, {}
        shifts: set[str] = set()
        taken = (Finish, Shift)
        for p, ps in enumerate(loops.passes):
            body = IndentedBuffer()
            self.names.reads = read = set(shifts)   # a shift's names: its next pass's
            head = [s for s in ps.before if p == 0 or not isinstance(s, taken)]
            tail = loops.after if p == last else \
                [s for s in loops.passes[p + 1].before if isinstance(s, taken)]
            self.shifted = []
            self.statements(body, head)
            self.one_pass(body, ps)
            self.statements(body, tail)
            if p == last:
                self.index = "_r"
                self.statements(body, loops.row_end)
            shifts = set()
            for s in [*head, *tail]:
                if isinstance(s, (Compute, Finish)):
                    name = dict.get(self.names, s.node)
                    defined.setdefault(name, p)
                    kinds[name] = self.graph.node(s.node).dtype
                elif isinstance(s, Shift):
                    i = self.pos[s.node]
                    for name, dt in ((f"_m{i}", FLOAT), (f"_h{i}", FLOAT), (f"_s{i}", "f64")):
                        shifts.add(name)
                        defined[name], kinds[name] = p, dt
            bodies.append(body)
            reads.append(read)
        self.names.reads = None
        back = [sorted(n for n in read if defined.get(n, p) < p) for p, read in enumerate(reads)]
        kept = sorted({n for b in back for n in b})
        buf.line("# rows in groups of _Q: each pass over the group's rows in turn, the row")
        buf.line("# values that a later pass reads kept per row of the group (_rv_<name>)")
        for n in kept:                  # the row values a later pass reads, per row
            dt = {FLOAT: "_w.dtype", "f64": "np.float64"}.get(kinds[n]) or DTYPE_CTOR[kinds[n]]
            buf.line(f"_rv_{n} = np.empty(_Q, {dt})")
        buf.line("for _rb in range(_r0, _r1, _Q):")
        buf.indent()
        buf.line("_nq = min(_Q, _r1 - _rb)")
        for p, body in enumerate(bodies):
            buf.line("for _q in range(_nq):")
            buf.indent()
            buf.line("_r = _rb + _q")
            self.row_start(buf, True)
            for n in back[p]:
                buf.line(f"{n} = _rv_{n}[_q]")
            for line in body.lines:
                buf.line(line)
            for n in kept:
                if defined[n] == p:
                    buf.line(f"_rv_{n}[_q] = {n}")
            buf.dedent()
        buf.dedent()

    def hosts_apart(self) -> str:
        """Whether the outputs that host scratch rows (:attr:`ReduceLoops.hosts`) lie
        :data:`~gradc.passes.loop_ir.APART` from every other array of the call, so that
        no vector loop's run-time alias check of them fails: a row array (an element
        input or output) by its rows, any other by its memory."""
        loops = self.loops
        rows = [self.outs[n] for n in loops.outputs if self.kn.level[n] == ELEMENT]
        rows += [f"_i{j}" for j, (x, a) in enumerate(loops.slots) if a == PER_ELEMENT]
        others = [self.outs[n] for n in loops.outputs if self.kn.level[n] != ELEMENT]
        others += [f"_i{j}" for j, (x, a) in enumerate(loops.slots) if a != PER_ELEMENT]
        others += list(self.parts.values())
        tests = []
        for h in loops.hosts.values():
            o = self.outs[h]
            tests += [f"_g_rows_far({o}, {a}, {APART})" for a in rows if a != o]
            tests += [f"_g_apart({o}, {a}, {APART})" for a in others]
        return " and ".join(tests) or "True"

    def one_pass(self, buf: IndentedBuffer, ps, hosting: bool = True) -> None:
        """A loop over the row's elements (in blocks: two, where a short row's runs as
        one plain loop; a segment's always in blocks, which leave its centred sums'
        means to combine).  A pass with hosted stores (a pass without sums:
        :func:`~gradc.passes.loop_ir.hosted`) is two loops, one without them for the
        calls whose outputs host scratch rows: a store under a branch in the loop
        kept LLVM from vectorising it (cross-entropy's fwd_bwd ran 0.54x)."""
        if hosting and any(isinstance(s, Store) and s.hosted for s in ps.body) \
                and not self.segment:
            for test, skip in (("if _ho:", True), ("else:", False)):
                buf.line(test)
                self.skip_hosted = skip
                self.one_pass(buf.indent(), ps, False)
                buf.dedent()
            self.skip_hosted = False
            return
        if ps.block and ps.whole and not self.segment:
            buf.line(f"if _N <= {ps.block}:")
            buf.indent()
            self.loop(buf, ps, False)
            buf.dedent()
            buf.line("else:")
            buf.indent()
            self.loop(buf, ps, True)
            buf.dedent()
        else:
            self.loop(buf, ps, bool(ps.block))

    def loop(self, buf: IndentedBuffer, ps, blocks: bool) -> None:
        """The pass's loop, in blocks or not; in blocks, it reads and writes its arrays
        through views of the block (an index _b + _c kept LLVM from vectorising:
        gathers and scatters)."""
        self.sliced = [] if blocks else None
        self.index = "(_lo + _b + _c)" if blocks else "(_lo + _c)"
        body = IndentedBuffer()
        self.unstaged = {c.node for c in ps.centred} if self.pivoting(ps, blocks) else set()
        # In blocks, a max's NaN flag is the block's, or-ed into the row's after the
        # block's loop, as its sums are: a flag carried from block to block through the
        # loop kept LLVM from vectorising it (scalar, 2x slower: cross-entropy's forward)
        flags = [self.pos[s.node] for s in ps.body
                 if blocks and isinstance(s, Update) and _nan_flagged(s)]
        self.flag = "_nb" if blocks else "_n"
        self.statements(body, ps.body)
        self.flag = "_n"
        self.unstaged = set()
        pivoted = self.pivoted_values(ps, blocks)
        if pivoted:
            self.pivots(buf, ps, pivoted)
            self.deviations(body, ps.centred, pivoted)
        after = IndentedBuffer()
        groups: dict[tuple, list[Online]] = {}      # one loop, one exp per x and max
        for o in ps.online:
            groups.setdefault((o.acc, o.buffer, o.slot), []).append(o)
        for group in groups.values():
            self.online(after, group, blocks)
        if blocks:
            buf.line(f"for _b in range(0, _N, {ps.block}):")
            buf.indent()
            buf.line(f"_e = min(_b + {ps.block}, _N)")
            if ps.prefetch is not None and ps.prefetch.ahead:
                for j in ps.prefetch.reads:
                    buf.line(f"_g_prefetch(_i{j}, _lo + _b + _pa, _lo + _e + _pa)")
            elif ps.prefetch is not None and not self.segment:
                buf.line("if _pf:")
                for j in ps.prefetch.reads:
                    buf.line(f"    _g_prefetch(_i{j}, _lo + _N + _b, _lo + _N + _e)")
                for n in ps.prefetch.writes:
                    buf.line(f"    _g_prefetch_w({self.outs[n]}, _lo + _N + _b, _lo + _N + _e)")
            for arr in self.sliced:
                buf.line(f"{arr}b = _g_view({arr}, _b, _e)")
        for _, blk in ps.block_sums:
            buf.line(f"{self.acc(blk)} = _T(0.0)")
        for a, _ in self.pivot_sums(ps.centred, pivoted):
            buf.line(f"_{a} = _T(0.0)")
        for i in flags:
            buf.line(f"_nb{i} = False")
        buf.line("for _c in range(_e - _b):" if blocks else "for _c in range(_N):")
        buf.indent()
        for line in body.getvalue().splitlines():
            buf.line(line)
        buf.dedent()
        self.sums(buf, ps.staged, "_e - _b" if blocks else "_N")
        if pivoted:
            for a, row in self.pivot_sums(ps.centred, pivoted):
                buf.line(f"{row} += _{a}")
        else:
            self.centre(buf, ps.centred, blocks)
        for acc, blk in ps.block_sums:
            if acc is not None:
                buf.line(f"{self.acc(acc)} += {self.acc(blk)}")
        for i in flags:
            buf.line(f"_n{i} |= _nb{i}")
        for line in after.lines:
            buf.line(line)
        if blocks:
            buf.dedent()
        self.sliced = None
        if pivoted:
            self.pivot_finish(buf, ps, pivoted)

    def pivoting(self, ps: Pass, blocks: bool) -> bool:
        """Whether the pass's loop takes its centred sums about pivots: in blocks (a row
        longer than one, or a segment of a split row: its co-moments and means leave it
        as Chan's blocks leave them, combined across segments as theirs)."""
        return blocks and ps.pivoted

    def pivoted_values(self, ps: Pass, blocks: bool) -> dict[str, str]:
        """Where the pass takes its centred sums about pivots (:data:`~gradc.passes.
        loop_ir.PIVOT`; its loop in blocks over a whole row), each value's block sum
        (``_f..``, the key of its pivot's names) and its name in the loop; else
        nothing."""
        if not self.pivoting(ps, blocks):
            return {}
        values: dict[str, str] = {}
        for c in ps.centred:
            for z, (_, f) in zip(c.buffers * 2, c.sums * 2):
                values.setdefault(self.acc(f), self.kn.reduced(z.node, z.arg))
        return values

    def squares(self, centred: list, values: dict[str, str]) -> dict[str, str]:
        """Per pivoted value, the row's sum of its squared deviations: a variance's own
        co-moment where the pass takes one (``_s``), else a sum of its own (``_Q``)."""
        own = {}
        for c in centred:
            fa, fb = [self.acc(f) for _, f in c.sums * 2][:2]
            if fa == fb:
                own.setdefault(fa, f"_s{self.pos[c.node]}")
        return {f: own.get(f, f"_Q{f}") for f in values}

    def pivot_sums(self, centred: list, values: dict[str, str]) -> list[tuple[str, str]]:
        """The block sums of a pivoted pass (their names less the leading ``_``) and the
        row sums (float64) each is added to: per value its deviations' (``d``) and
        squares' (``q``, where no variance has them), per centred sum its products'."""
        if not values:
            return []
        squares = self.squares(centred, values)
        sums = [(f"d{f}", f"_D{f}") for f in values]
        sums += [(f"q{f}", q) for f, q in squares.items() if q.startswith("_Q")]
        return sums + [(f"f{self.pos[c.node]}", f"_s{self.pos[c.node]}") for c in centred]

    def pivots(self, buf: IndentedBuffer, ps: Pass, values: dict[str, str]) -> None:
        """Before the pass's blocks: each value's pivot ``_k`` (the mean of its first
        :data:`~gradc.passes.loop_ir.PIVOT` elements, summed in float64 so that huge
        values do not overflow, rounded to the dtype) and its row sums started."""
        buf.line(f"_np = min(_N, {PIVOT})")
        for f in values:
            buf.line(f"_p{f} = 0.0")
        buf.line("for _c in range(_np):")
        for line in self.value_lines(ps):
            buf.line(f"    {line}")
        for f, v in values.items():
            buf.line(f"    _p{f} = _g_radd(_p{f}, np.float64({v}))")
        for f in values:
            buf.line(f"_k{f} = _T(_p{f} / _np); _D{f} = 0.0")
        for f, q in self.squares(ps.centred, values).items():
            if q.startswith("_Q"):
                buf.line(f"{q} = 0.0")

    def value_lines(self, ps: Pass) -> list[str]:
        """The loads and element values of pass ``ps`` at the row's element ``_c`` (a
        pivoted pass's values outside its loop in blocks)."""
        sliced, index = self.sliced, self.index
        self.sliced, self.index = None, "(_lo + _c)"
        lines = IndentedBuffer()
        self.statements(lines, [s for s in ps.body if isinstance(s, (Load, LoadBack, Compute))])
        self.sliced, self.index = sliced, index
        return lines.getvalue().splitlines()

    def deviations(self, body: IndentedBuffer, centred: list,
                   values: dict[str, str]) -> None:
        """The element's part of a pivoted pass's sums: each value's deviation from its
        pivot (``_c``), summed, squared and multiplied into each co-moment."""
        for f, v in values.items():
            body.line(f"_c{f} = {v} - _k{f}")
            body.line(f"_d{f} = _g_radd(_d{f}, _c{f})")
        for f, q in self.squares(centred, values).items():
            if q.startswith("_Q"):
                body.line(f"_q{f} = _g_radd(_q{f}, _c{f} * _c{f})")
        for c in centred:
            i = self.pos[c.node]
            fa, fb = [self.acc(f) for _, f in c.sums * 2][:2]
            body.line(f"_f{i} = _g_radd(_f{i}, _c{fa} * _c{fb})")

    def pivot_finish(self, buf: IndentedBuffer, ps: Pass, values: dict[str, str]) -> None:
        """After a pivoted pass: each value's row mean relative to its pivot (``_K``,
        ``_R``, as Chan's blocks leave them) and each co-moment about the exact means
        (``P - D_a D_b / n``) where every value's mean lies within its spread of its
        pivot; else both again, in float64 over the row, in blocks: the deviations
        from those means (``_M``), their sum ``_E`` correcting the mean and the
        co-moment about it, the blocks' co-moments added with their rounding errors
        kept (the deviations about a far pivot lose the mean's digits too; a float64
        sum one element at a time lost 1e-12 over rows of 1e5, and blocks added plainly
        1e-14 where one element dwarfs the rest: found by helper 55)."""
        squares = self.squares(ps.centred, values)
        for f in values:
            buf.line(f"_K{f} = np.float64(_k{f}); _R{f} = _D{f} / _N")
        pairs = [(self.pos[c.node], *[self.acc(f) for _, f in c.sums * 2][:2])
                 for c in ps.centred]
        ok = " and ".join(f"2.0 * _D{f} * _R{f} <= {squares[f]}" for f in values)
        buf.line(f"if {ok}:")
        for i, fa, fb in pairs:
            buf.line(f"    _s{i} -= _D{fa} * _R{fb}")
        buf.line("else:")
        buf.indent()
        for f in values:
            buf.line(f"_M{f} = _K{f} + _R{f}; _E{f} = 0.0")
        for i, _, _ in pairs:
            buf.line(f"_s{i} = 0.0; _u{i} = 0.0")
        buf.line(f"for _b in range(0, _N, {BLOCK}):")
        for f in values:
            buf.line(f"    _h{f} = 0.0")
        for i, _, _ in pairs:
            buf.line(f"    _t{i} = 0.0")
        buf.line(f"    for _c in range(_b, min(_b + {BLOCK}, _N)):")
        for line in self.value_lines(ps):
            buf.line(f"        {line}")
        for f, v in values.items():
            buf.line(f"        _x{f} = np.float64({v}) - _M{f}")
            buf.line(f"        _h{f} = _g_radd(_h{f}, _x{f})")
        for i, fa, fb in pairs:
            buf.line(f"        _t{i} = _g_radd(_t{i}, _x{fa} * _x{fb})")
        for f in values:
            buf.line(f"    _E{f} += _h{f}")
        for i, _, _ in pairs:               # added with its rounding kept (TwoSum)
            buf.line(f"    _ty{i} = _s{i} + _t{i}; _tz{i} = _ty{i} - _s{i}")
            buf.line(f"    _u{i} += (_s{i} - (_ty{i} - _tz{i})) + (_t{i} - _tz{i}); _s{i} = _ty{i}")
        for f in values:
            buf.line(f"_E{f} /= _N; _R{f} += _E{f}")
        for i, fa, fb in pairs:
            buf.line(f"_s{i} += _u{i} - _N * _E{fa} * _E{fb}")
        buf.dedent()

    def sums(self, buf: IndentedBuffer, staged: list, extent: str) -> None:
        """The second loop of a pass: its ``staged`` sums (update, buffer) over the
        ``extent`` values the first loop left in their buffers (loads and sums only:
        LLVM vectorises it without a run-time alias check, in one order)."""
        if not staged:
            return
        buf.line(f"for _c in range({extent}):")
        for s, b in staged:
            if b.kind == "stage":
                v = f"{self.stage_row(b)}[_c]"
            elif self.loops.flat:
                v = f"{self.outs[b.node]}[_b + _c]"
            else:
                v = self.at(self.row_of(b))
            buf.line(f"    {_update(s, self.acc(s.acc), self.pos[s.node], v)}")

    def centre(self, buf: IndentedBuffer, centred: list, blocks: bool) -> None:
        """The co-moments of a pass's ``centred`` sums over the block (the row where
        not in ``blocks``), combined into the row's with Chan's formula.  Each value is
        centred on its block's rounded mean ``_m`` (from its sum in the first loop),
        and the loop also sums the centred values (``_d``): the block's co-moment less
        ``_d * _d / n`` is the one about its exact mean, which is ``_m + _d / n``.  (A
        row of one block is centred on its mean rounded to the dtype, as the two
        passes of the unfused plan centre it, and that is all.)  The
        row's means are kept relative to the first block's ``_m`` (``_K``; ``_R``,
        float64), so the difference of a block's mean and the row's so far is one of
        small numbers: nothing of a row's offset from 0 enters the sum (a row of float32
        around 1e4 keeps the variance to 1e-6, as two passes do)."""
        if not centred:
            return
        n = "(_e - _b)" if blocks else "_N"
        values: dict[str, str] = {}         # a block sum -> its value at the element
        for c in centred:
            for z, j, (_, f) in zip(c.buffers * 2, c.slots * 2, c.sums * 2):
                values.setdefault(self.acc(f), f"{self.stage_row(z)}[_c]" if j is None
                                  or not blocks else self.slot_at(j))
        for f in values:
            buf.line(f"_m{f} = _T({f} / {n})" + (f"; _d{f} = _T(0.0)" if blocks else ""))
        for c in centred:
            buf.line(f"_f{self.pos[c.node]} = _T(0.0)")
        buf.line(f"for _c in range({n}):")
        for f, z in values.items():
            buf.line(f"    _c{f} = {z} - _m{f}")
        for c in centred:
            i = self.pos[c.node]
            fa, fb = [self.acc(f) for _, f in c.sums * 2][:2]
            buf.line(f"    _f{i} = _g_radd(_f{i}, _c{fa} * _c{fb})")
        if not blocks:          # one block: centred on the row's mean, as two passes are
            for c in centred:
                buf.line(f"_s{self.pos[c.node]} += _f{self.pos[c.node]}")
            for f in values:    # the row's mean (print_finish)
                buf.line(f"_K{f} = np.float64(_m{f}); _R{f} = 0.0")
            return
        for f in values:
            buf.line(f"    _d{f} = _g_radd(_d{f}, _c{f})")
        buf.line("if _b == 0:")
        for f in values:
            buf.line(f"    _K{f} = np.float64(_m{f}); _R{f} = 0.0")
        for f in values:            # the block's exact mean, relative to the first's
            buf.line(f"_r{f} = (_m{f} - _K{f}) + _d{f} / {n}")
        for c in centred:
            i = self.pos[c.node]
            fa, fb = [self.acc(f) for _, f in c.sums * 2][:2]
            buf.line(f"_s{i} += _f{i} - _d{fa} * np.float64(_d{fb}) / {n} + (_r{fa} - _R{fa})"
                     f" * (_r{fb} - _R{fb}) * (_b * {n} / _e)")
        for f in values:            # the mean of the row's elements so far
            buf.line(f"_R{f} += (_r{f} - _R{f}) * {n} / _e")

    def online(self, buf: IndentedBuffer, group: list[Online], blocks: bool) -> None:
        """The online sums of ``group`` (of one ``x`` and max) take the block (the row
        where not in ``blocks``): each one's shift ``_h`` becomes the row's max so far
        where finite (else 0; the max's NaN flag is not needed: a NaN makes the sum
        NaN), its sum so far rescaled where it changed (not a sum of 0: an exp(inf)
        times 0), then one loop over the block takes ``exp(x - _h)`` and adds it (a
        weighted sum: times its weight's element), summed in the compute dtype, to each
        row's float64 sum."""
        m = self.acc(group[0].acc)
        x = (f"{self.stage_row(group[0].buffer)}[_c]" if group[0].buffer is not None
             else self.at(f"_i{group[0].slot}r"))
        first = self.pos[group[0].node]
        for o in group:
            i = self.pos[o.node]
            buf.line(f"_hn{i} = {m} if ({m} - {m}) == 0.0 else _T(0.0)")
            buf.line(f"if _hn{i} != _h{i}:")
            buf.line(f"    if _s{i} != 0.0:")
            buf.line(f"        _s{i} *= np.exp(np.float64(_h{i}) - np.float64(_hn{i}))")
            buf.line(f"    _h{i} = _hn{i}")
        for o in group:
            buf.line(f"_f{self.pos[o.node]} = _T(0.0)")
        buf.line(f"for _c in range({'_e - _b' if blocks else '_N'}):")
        if len(group) == 1 and group[0].weight < 0:
            buf.line(f"    _f{first} = _g_radd(_f{first}, _g_exp({x} - _h{first}))")
        else:
            buf.line(f"    _ex{first} = _g_exp({x} - _h{first})")
            for o in group:
                i = self.pos[o.node]
                term = f"_ex{first}" if o.weight < 0 else \
                    f"_ex{first} * {self.at(f'_i{o.weight}r')}"
                buf.line(f"    _f{i} = _g_radd(_f{i}, {term})")
        for o in group:
            buf.line(f"_s{self.pos[o.node]} += _f{self.pos[o.node]}")

    def split(self, buf: IndentedBuffer, name: str, fm: str) -> None:
        """Split rows (:data:`~gradc.passes.loop_ir.SPLIT`): ``name_split``, the rows one
        after another, each pass of a row a call of ``name_seg{p}`` per segment of the
        row (in parallel, ``name_seg{p}_par``, where ``_par``), the segments'
        accumulators left in a float64 row of ``_x{p}`` each and combined in segment
        order before the next pass's row steps.  The segments of a pass are what its
        loop over a whole row is (blocks, block sums, staged sums, centred co-moments),
        over a part of the row.  A segment function the module has already (another
        method's pass over the same loop: softmax's max in each of its methods) is
        named, not printed and compiled again: ``name_seg{p} = <the first>``."""
        driver = IndentedBuffer()
        calls = self.driver(driver, name, fm)
        for p, (ps, arrays, values) in enumerate(calls):
            fn = f"{name}_seg{p}"
            if self.segments is not None:
                key = IndentedBuffer()
                self.segment_functions(key, "_S", p, ps, arrays, values, fm)
                first = self.segments.setdefault(key.getvalue(), fn)
                if first != fn:
                    buf.line(f"{fn} = {first}")
                    buf.line(f"{fn}_par = {first}_par")
                    buf.line()
                    continue
            self.segment_functions(buf, fn, p, ps, arrays, values, fm)
        buf.lines += driver.lines

    def segment_functions(self, buf: IndentedBuffer, fn: str, p: int, ps: Pass,
                          arrays: list[str], values: list[str], fm: str) -> None:
        """Function ``fn``, pass ``p`` over a segment (:meth:`segment_kernel`), and
        ``fn_par``, over every segment in parallel."""
        self.segment_kernel(buf, fn, p, ps, arrays, values, fm)
        buf.line()
        buf.line("@numba.njit(parallel=True, cache=True)")
        buf.line(f"def {fn}_par({self.segment_call(p, ps, arrays, values)}):")
        buf.line("    for _sg in numba.prange(_S):")   # its index unsigned: the segment's
        buf.line(f"        {fn}({self.segment_call(p, ps, arrays, values, 'np.int64(_sg)')})")
        buf.line()

    def segment_call(self, p: int, ps: Pass, arrays: list[str], values: list[str],
                     segment: str | None = None) -> str:
        """The arguments of pass ``p``'s segment function (``segment``: the segment's
        index), or of its launcher over every segment (None)."""
        return ", ".join([*arrays, "_lo", "_N", "_r", *([segment] if segment else []), "_S",
                          *values, *self.exported(p, ps), "_w"])

    def exported(self, p: int, ps: Pass) -> list[str]:
        """The segments' accumulators of pass ``p``: ``_x{p}``, or none to export."""
        return [f"_x{p}"] if ps.segment_starts else []

    def export_slots(self, s: Start) -> list[str]:
        """The locals a segment leaves of its start ``s``, in their order in ``_x``: the
        accumulator (a max or min's NaN flag next); a centred sum's co-moment, then per
        value the first block's mean ``_K`` and the mean relative to it ``_R``."""
        acc, i = self.acc(s.acc), self.pos[s.node]
        if s.kind == "centred":
            values = list(dict.fromkeys(self.acc(f) for _, f in self.centres[s.node].sums))
            return [acc] + [v for f in values for v in (f"_K{f}", f"_R{f}")]
        if s.kind == "online":
            return [acc, f"_h{i}"]
        if s.nan_flag:
            return [acc, f"_n{i}"]
        return [acc]

    def driver(self, buf: IndentedBuffer, name: str, fm: str) -> list:
        """``name_split``; per pass, the pass, the arrays and the row values its segments
        take."""
        loops, pos, parts = self.loops, self.pos, self.parts
        self.function(buf, f"{name}_split", self.params("_S", "_par"), fm)
        if loops.scratch:
            buf.line(f"_ap = {APART} // _w.itemsize")
        if loops.tiny_normal:
            buf.line(_TINY_NORMAL)
        for n in loops.scratch:                 # one row of scratch, segments of it
            buf.line(f"_k{pos[n]} = {_own('empty', '_N')}")
        for p, ps in enumerate(loops.passes):
            if ps.segment_starts:
                k = sum(len(self.export_slots(s)) for s in ps.segment_starts)
                buf.line(f"_x{p} = np.empty((_S, {k}))")
        buf.line("_ch = 0")
        for init in loops.partial_inits:        # one chunk: gathered straight (R <= 16)
            i = pos[init.node]
            if init.chunk == "cols":
                buf.line(f"_q{i} = {parts[init.node]}[_ch]")
                if init.gathered:
                    buf.line(f"_g{i} = _q{i}")
            else:
                buf.line(f"_q{i} = {_INIT[init.kind]}")
        buf.line("for _r in range(_R):")
        buf.indent()
        buf.line("_lo = _r * _N")
        fallback = loops.centred or any(o.weight >= 0 for ps in loops.passes for o in ps.online)
        for j, (x, a) in enumerate(loops.slots):
            if a == PER_ELEMENT and fallback:   # a centred or weighted sum's fallback's
                buf.line(f"_i{j}r = _g_view(_i{j}, _lo, _lo + _N)")
            elif a == PER_ROW:
                buf.line(f"b{j} = _i{j}[_r]")
        calls = []
        self.index = "(_lo + _c)"
        for p, ps in enumerate(loops.passes):
            self.shifted = []
            self.statements(buf, ps.before)
            arrays, values = self.segment_args(ps)
            buf.line("if _par:")
            buf.line(f"    {name}_seg{p}_par({self.segment_call(p, ps, arrays, values)})")
            buf.line("else:")
            buf.line("    for _sg in range(_S):")
            buf.line(f"        {name}_seg{p}({self.segment_call(p, ps, arrays, values, '_sg')})")
            self.combine(buf, p, ps)
            calls.append((ps, arrays, values))
        self.statements(buf, loops.after)
        self.index = "_r"
        self.statements(buf, loops.row_end)
        buf.dedent()
        self.statements(buf, loops.chunk_end)
        buf.dedent()
        return calls

    def segment_args(self, ps: Pass) -> tuple[list[str], list[str]]:
        """The arrays a segment of ``ps`` reads or writes (whole: the kernel's, its
        scratch rows, its partials' rows), and the row values and outside values it
        reads (as the driver names them)."""
        graph, kernel, kn = self.graph, self.kn.kernel, self.kn
        arrays: list[str] = []
        values: list[str] = []
        stmts = ps.body + [u for u, _ in ps.staged]
        buffers = [b for _, b in ps.staged]
        arrays += [f"_i{o.weight}" for o in ps.online if o.weight >= 0]
        for s in stmts:
            if isinstance(s, Load):
                arrays.append(f"_i{s.slot}")
            elif isinstance(s, (LoadBack, Store)):
                buffers.append(s.buffer)
            elif isinstance(s, Update):
                if s.acc.column:
                    arrays.append(f"_{s.acc.role}{self.pos[s.node]}")
                if s.stage == 1 and s.kind in ("logsumexp", "norm"):
                    values.append(f"_h{self.pos[s.node]}")
            elif isinstance(s, Compute):
                for x in value_args(graph, s.node):
                    if kn.level.get(x) == ROW:
                        values.append(self.names.get(x, ""))
                    elif x not in kn.level and \
                            access(graph, kernel, s.node, x) in (PER_ROW, SCALAR):
                        values.append(kn.local(x, access(graph, kernel, s.node, x)))
        for b in buffers:
            if b.kind == "output":
                arrays.append(self.outs[b.node])
            elif b.kind == "scratch":
                arrays.append(f"_k{self.pos[b.node]}")
        return (list(dict.fromkeys(arrays)),
                [v for v in dict.fromkeys(values) if v.isidentifier()])

    def segment_kernel(self, buf: IndentedBuffer, fn: str, p: int, ps: Pass,
                       arrays: list[str], values: list[str], fm: str) -> None:
        """``fn`` (``name_seg{p}``): pass ``p`` over segment ``_sg`` of ``_S`` of row ``_r``
        (from ``_lo``: its views of the arrays, then ``_lo`` and ``_N`` the segment's),
        leaving its accumulators in row ``_sg`` of ``_x{p}``."""
        loops = self.loops
        self.function(buf, fn, self.segment_call(p, ps, arrays, values, "_sg"), fm,
                      scalars=False)
        stages = [b for b in loops.stages if b in self.pass_stages(ps)]
        if stages:
            buf.line(f"_ap = {APART} // _w.itemsize")
        if loops.tiny_normal:
            buf.line(_TINY_NORMAL)
        for b in stages:
            buf.line(f"{self.stage_row(b)} = {_own('empty', str(BLOCK))}")
        self.ahead(buf, [ps])
        buf.line("_b0 = _sg * _N // _S")
        buf.line("_b1 = (_sg + 1) * _N // _S")
        slots = {f"_i{j}": a for j, (x, a) in enumerate(loops.slots)}
        for arr in arrays:
            if slots.get(arr) == PER_ELEMENT:
                buf.line(f"{arr}r = _g_view({arr}, _lo + _b0, _lo + _b1)")
            elif arr in self.outs.values():
                buf.line(f"{arr}r = _g_view({arr}, _lo + _b0, _lo + _b1)")
            else:                               # a column's: input, scratch, partial
                assert slots.get(arr, PER_COL) == PER_COL
                buf.line(f"{arr} = _g_view({arr}, _b0, _b1)")
        buf.line("_lo += _b0")
        buf.line("_N = _b1 - _b0")
        inits = {i.node: i for i in loops.partial_inits}
        for n in ps.first_cols:                 # the partials across rows: started
            acc = next(s.acc for s in ps.body if isinstance(s, Update) and s.node == n)
            buf.line("if _r == 0:")
            buf.line("    for _c in range(_N):")
            buf.line(f"        _{acc.role}{self.pos[n]}[_c] = {_INIT[inits[n].kind]}")
        self.shifted = []
        self.statements(buf, ps.segment_starts)
        self.segment = True
        self.one_pass(buf, ps)
        self.segment = False
        k = 0
        for s in ps.segment_starts:
            for j, v in enumerate(self.export_slots(s)):
                flag = s.nan_flag and j == 1
                buf.line(f"_x{p}[_sg, {k}] = " + (f"1.0 if {v} else 0.0" if flag else v))
                k += 1
        buf.dedent()

    def pass_stages(self, ps: Pass) -> set:
        """The stage rows pass ``ps`` uses."""
        used = {Buffer("stage", s.node, s.arg) for s in ps.body
                if isinstance(s, Stage) and s.blocks}       # a segment's loop: in blocks
        used |= {b for _, b in ps.staged}
        return used | {b for c in ps.centred for b, j in zip(c.buffers, c.slots) if j is None}

    def combine(self, buf: IndentedBuffer, p: int, ps: Pass) -> None:
        """The row's accumulators of pass ``p`` from its segments', in segment order (the
        row steps before the pass started them): sums added, products multiplied, a max
        or min compared (its NaN flags or-ed), a centred sum's co-moments combined with
        Chan's formula, each segment's mean relative to the first segment's ``_K``; an
        online sum's rescaled from each segment's shift to the row's (its max, combined
        before it, where finite, else 0), a sum of 0 left out."""
        k = 0
        for s in ps.segment_starts:
            slots = self.export_slots(s)
            acc, i = slots[0], self.pos[s.node]
            x = f"_x{p}[_sg, {k}]"
            if s.kind == "centred":
                values = [v[2:] for v in slots[1::2]]
                buf.line("_na = 0.0")
                buf.line("; ".join(f"_M{f} = 0.0" for f in values))
                buf.line("for _sg in range(_S):")
                buf.line("    _nb = np.float64((_sg + 1) * _N // _S - _sg * _N // _S)")
                for j, f in enumerate(values):
                    kk, kr = k + 1 + 2 * j, k + 2 + 2 * j
                    buf.line(f"    _e{f} = (_x{p}[_sg, {kk}] - _x{p}[0, {kk}]) "
                             f"+ _x{p}[_sg, {kr}] - _M{f}")
                fa, fb = [self.acc(f) for _, f in self.centres[s.node].sums * 2][:2]
                buf.line(f"    {acc} += {x} + _e{fa} * _e{fb} * (_na * _nb / (_na + _nb))")
                for f in values:
                    buf.line(f"    _M{f} += _e{f} * _nb / (_na + _nb)")
                buf.line("    _na += _nb")
                for j, f in enumerate(values):      # the row's means (print_finish)
                    buf.line(f"_K{f} = _x{p}[0, {k + 1 + 2 * j}]; _R{f} = _M{f}")
            elif s.kind == "online":
                m = self.acc(next(o.acc for o in ps.online if o.node == s.node))
                buf.line(f"_h{i} = {m} if ({m} - {m}) == 0.0 else _T(0.0)")
                buf.line("for _sg in range(_S):")
                buf.line(f"    if {x} != 0.0:")
                buf.line(f"        {acc} += {x} if _x{p}[_sg, {k + 1}] == _h{i} else "
                         f"{x} * np.exp(_x{p}[_sg, {k + 1}] - np.float64(_h{i}))")
            elif s.nan_flag:
                buf.line("for _sg in range(_S):")
                buf.line(f"    {acc} = _g_r{s.kind}({acc}, _T({x})); "
                         f"_n{i} |= _x{p}[_sg, {k + 1}] != 0.0")
            else:
                kind = "sum" if s.kind in ("sum_to", "mean") else s.kind
                buf.line("for _sg in range(_S):")
                buf.line(f"    {accumulate_line(acc, x, kind, _SELECT)}")
            k += len(slots)

    def stage_row(self, b) -> str:
        """The stage row of buffer ``b``: ``_z`` and the reduction's position (and the
        value's, the second of a centred sum's)."""
        return f"_z{self.pos[b.node]}" + (f"_{b.arg}" if b.arg else "")

    def print_stage(self, s: Stage) -> list[str]:
        if (not s.blocks and self.sliced is not None) or s.node in self.unstaged:
            return []
        row = self.stage_row(Buffer("stage", s.node, s.arg))
        return [f"{row}[{self.stage_at}] = {self.kn.reduced(s.node, s.arg)}"]

    def at(self, arr: str) -> str:
        """Row array ``arr`` at the element's column (its block's slice in blocks)."""
        if self.sliced is None:
            return f"{arr}[_c]"
        if arr not in self.sliced:
            self.sliced.append(arr)
        return f"{arr}b[_c]"

    def acc(self, a: Acc) -> str:
        name = f"_{a.role}{self.pos[a.node]}"
        return self.at(name) if a.column else name

    def print_load(self, s: Load) -> list[str]:
        if self.loops.flat:
            return [f"a{s.slot} = _i{s.slot}[_j]"]
        return [f"{'a' if s.access == PER_ELEMENT else 'c'}{s.slot} = {self.slot_at(s.slot)}"]

    def slot_at(self, j: int) -> str:
        """Input slot ``j`` at the element: its row's, or its column's (a row of weights)."""
        return self.at(f"_i{j}r" if self.loops.slots[j][1] == PER_ELEMENT else f"_i{j}")

    def print_loadback(self, s: LoadBack) -> list[str]:
        self.names[s.node] = f"v{self.pos[s.node]}"
        return [f"v{self.pos[s.node]} = {self.at(self.row_of(s.buffer))}"]

    def print_store(self, s: Store) -> list[str]:
        v = self.names[s.node]
        if self.loops.flat:
            return [f"{self.outs[s.node]}[_j] = {v}"]
        if self.kn.level[s.node] == ROW:
            return [f"{self.outs[s.node]}[_r] = {v}"]
        # a hosted store: the output's row holds the value already where the call lets
        # it host the scratch row (one_pass; a split row's segments keep theirs: stored)
        if s.hosted and self.skip_hosted and not self.segment:
            return []
        return [f"{self.at(self.row_of(s.buffer))} = {v}"]

    def print_update(self, s: Update) -> list[str]:
        i = self.pos[s.node]
        return [_update(s, self.acc(s.acc), i, self.kn.reduced(s.node, s.arg), f"{self.flag}{i}")]

    def print_start(self, s: Start) -> list[str]:
        i, acc = self.pos[s.node], self.acc(s.acc)
        if s.kind == "centred":             # its values' shift and mean (Chan's, centre)
            fresh = [self.acc(f) for _, f in self.centres[s.node].sums]
            fresh = [f for k, f in enumerate(fresh) if f not in fresh[:k] + self.shifted]
            self.shifted += fresh
            return [f"{acc} = 0.0"] + [f"_K{f} = 0.0; _R{f} = 0.0" for f in fresh]
        if s.kind == "online":              # the sum, and its shift so far (Online)
            return [f"{acc} = 0.0; _h{i} = _T(0.0)"]
        if s.nan_flag:
            return [f"{acc} = _T({_INIT[s.kind]}); _n{i} = False"]
        return [f"{acc} = {_INIT[s.kind]}"]

    def print_shift(self, s: Shift) -> list[str]:
        i = self.pos[s.node]
        if s.known:                         # the max of x - h: max(x) - h
            m, h = (self.names[v] for v in s.known)
            first = f"_m{i} = _T({m} - {h})"
        else:
            first = f"_m{i} = _T(np.nan) if _n{i} else _m{i}"
        return [first, shift_line(s.kind, i, "np.inf"), f"_s{i} = 0.0"]

    def print_finish(self, s: Finish) -> list[str]:
        self.names[s.node] = f"u{self.pos[s.node]}"
        if s.centred:
            return self.centred_finish(s)
        if s.shift is not None:             # an online sum, scaled from _h to the shift
            return self.online_finish(s)
        i = self.pos[s.node]
        if s.kind == "mean" and any(f.node == s.node for c in self.centres.values()
                                    for _, f in c.sums):
            # the mean of a centred sum's value: Chan's, the row's exact mean rounded
            # once (_K + _R; a constant row's own value), where its sum rounds on the way
            # (a row of 4096 times -1e30: the mean off by an ulp, 1.4e14, which x -
            # mean(x) keeps where the centred sum's variance is 0; found by helper 53);
            # the sum's where that is not finite (an inf in the row)
            f = self.acc(Acc("f", s.node))
            return [f"u{i} = _T(_K{f} + _R{f})",
                    f"if not (u{i} - u{i} == 0.0):", f"    u{i} = _T(_s{i} / _N)"]
        return [_finish(s, i)]

    def online_finish(self, s: Finish) -> list[str]:
        """An online sum's value: scaled by ``exp(_hd)`` from its shift ``_h`` to the
        shifts as written, ``_hd = (_h - h1) - h2`` in their order, in float64 (their sum
        rounds away a small ``h2`` and can overflow); but a sum of 0 (a row of -inf) or
        inf (a +inf in it) stays where the shifts are finite, as every term as written
        does (``0 * exp(1000)`` and ``inf * exp(-1000)`` are NaN; found by helper 42;
        -inf too: a weighted sum's), then negated, times and over the row values a
        weighted one has (:class:`~gradc.passes.row_schedule.OnlineSum`).  A logsumexp's is
        ``log(sum) + _hd`` (-inf and inf stay so where it is finite)."""
        i = self.pos[s.node]
        shifts = [self.names[v] for v in s.shift]
        hd = "".join([f"np.float64(_h{i})"] + [f" - np.float64({h})" for h in shifts])
        if s.kind == "logsumexp":
            return [f"u{i} = _T(np.log(_s{i}) + ({hd}))"]
        v = f"_s{i} / _N" if s.kind == "mean" else f"_s{i}"
        finite = " and ".join(f"({h} - {h}) == 0.0" for h in shifts)
        by = "".join([f" * np.float64({self.names[r]})" for r in s.factors]
                     + [f" / np.float64({self.names[r]})" for r in s.divisors])
        sign = "-" if s.negated else ""
        return [f"_hd{i} = {hd}",
                f"if _hd{i} == 0.0 or ((_s{i} == 0.0 or abs(_s{i}) == np.inf) and {finite}):",
                f"    u{i} = _T({sign}{v}{by})",
                "else:",
                f"    u{i} = _T({sign}{v} * np.exp(_hd{i}){by})"] + self.written_again(s, v)

    def centred_finish(self, s: Finish) -> list[str]:
        """A centred sum's value; where it is not finite, the sum of its operand as
        written, over the row (NumPy's inf or NaN where the centred values lose them)."""
        i = self.pos[s.node]
        value = f"_s{i} / _N" if s.kind == "mean" else f"_s{i}"
        return [f"u{i} = _T({' * '.join([value] + [self.names[f] for f in s.factors])})"] + \
            self.written_again(s, value)

    def written_again(self, s: Finish, value: str) -> list[str]:
        """Where row value ``u{i}`` of Finish ``s`` is not finite, its sum taken again
        over the row as written (``s.fallback``; none: nothing), ``value`` of that sum
        ``_s{i}``: a centred sum's, or a weighted online sum's (``exp(x - k) * g`` can
        overflow where ``exp(x - k) / r * g`` does not; an inf or NaN in ``g`` gives
        what the sum as written gives)."""
        if not s.fallback:
            return []
        i = self.pos[s.node]
        lines = [f"if not (u{i} - u{i} == 0.0):", f"    _s{i} = 0.0",
                 "    for _c in range(_N):"]
        index, self.index, self.sliced = self.index, "(_lo + _c)", None
        body = IndentedBuffer()
        self.statements(body, list(s.fallback))
        self.index = index
        lines += [f"        {line}" for line in body.getvalue().splitlines()]
        lines += [f"        _s{i} += {self.names[value_args(self.graph, s.node)[0]]}",
                  f"    u{i} = _T({value})"]
        return lines

    def print_partialwrite(self, s: PartialWrite) -> list[str]:
        return [f"{self.parts[s.node]}[_ch] = _q{self.pos[s.node]}"]

    def row_of(self, b) -> str:
        """The row of buffer ``b`` (a view of the output's row, or the scratch row)."""
        return f"{self.outs[b.node]}r" if b.kind == "output" else f"_k{self.pos[b.node]}"


def _own(fill: str, n: str) -> str:
    """A row of ``n`` elements the kernel allocates for itself (NumPy's ``fill``,
    ``empty`` or ``zeros``), :data:`~gradc.passes.loop_ir.APART` bytes (``_ap``
    elements) from any other array."""
    return f"np.{fill}({n} + 2 * _ap, _w.dtype)[_ap:_ap + {n}]"


# A partial's max or min: branch-free, a NaN stays.
_SELECT = "{acc} = {v} if (({v} {cmp} {acc}) | ({v} != {v})) else {acc}"


def _update(s: Update, acc: str, i: int, v: str, nan: str = "") -> str:
    """Update ``s`` of reduction at position ``i`` with the element value ``v`` into
    ``acc``: one flagged ``reassoc`` where the IR says so (``Update.reassoc``), else a
    max or min (a two-pass reduction's first stage, with a NaN flag, ``nan`` or
    ``_n{i}``; a partial's, a select that keeps a NaN)."""
    nan = nan or f"_n{i}"
    if s.reassoc:
        if s.kind == "logsumexp":
            v = f"_g_exp({v} - _h{i})"
        elif s.kind == "norm":
            return f"_t{i} = {v} / _h{i}; {acc} = _g_radd({acc}, _t{i} * _t{i})"
        return f"{acc} = _g_r{'mul' if s.kind == 'prod' else 'add'}({acc}, {v})"
    if s.kind == "norm":
        return f"_a{i} = abs({v}); " + _max_update(acc, nan, f"_a{i}", "max")
    if s.kind == "logsumexp" or s.nan_flag:
        return _max_update(acc, nan, v, "max" if s.kind == "logsumexp" else s.kind)
    return accumulate_line(acc, v, s.kind, _SELECT)


def _nan_flagged(s: Update) -> bool:
    """Whether :func:`_update` prints ``s`` with a NaN flag (a max or min)."""
    return not s.reassoc and (s.kind in ("logsumexp", "norm") or s.nan_flag)


def _max_update(acc: str, nan: str, v: str, kind: str) -> str:
    """A row's max or min in the compute dtype, NaN kept apart (an or-reduction): LLVM
    vectorises both, not a select that propagates a NaN."""
    return f"{acc} = _g_r{kind}({acc}, _T({v})); {nan} |= {v} != {v}"


def _finish(s: Finish, i: int) -> str:
    if s.kind == "mean":
        return f"u{i} = _T(_s{i} / _N)"
    if s.kind == "logsumexp":
        return f"u{i} = _T(np.log(_s{i})) + _h{i}"
    if s.kind == "norm":
        return f"u{i} = _T(_m{i}) if _m{i} == np.inf else _T(np.sqrt(_s{i})) * _h{i}"
    if s.nan_flag:
        return f"u{i} = _T(np.nan) if _n{i} else _s{i}"
    return f"u{i} = _T(_s{i})"
