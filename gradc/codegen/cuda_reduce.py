"""CUDA reduce kernels: one ``@cuda.jit`` kernel for a :class:`ReduceKernel`.

The same schedule as the CPU's (:mod:`gradc.passes.row_schedule`), lowered
for a GPU (:func:`gradc.passes.loop_ir.lower`, target ``CUDA``: no scratch
rows, no blocks of a pass, no prefetch hints; block trees) and printed here,
which decides nothing.  A block of ``_GC_RBLOCK`` threads is ``(_W, _Y)``: ``_Y``
groups of ``_W`` threads, each group on a row at a time (the launch chooses:
``_gc_row_grid`` gives a warp per row to short rows, the whole block to long
ones).  The groups stride over the ``_R`` rows (group ``y`` of block ``b`` takes
row ``b * _Y + y``, then every ``grid * _Y``-th) and, in each pass of the
schedule, a group's threads stride over the row's ``_N`` elements (lane ``x``
takes ``x, x + _W, ...``, the same elements in every pass, so an element value
a thread stored in an earlier pass is read back by that thread).  A row
reduction is each thread's float64 partial, then the group's tree in shared
memory (the reductions that finish before the same pass share one tree;
``_gcd_sync_row``: syncthreads for a whole block, syncwarp for a warp); every
lane reads the row's value back, so row values are computed by every lane and
stored by lane 0.  Element values a later pass needs again are read back from
the kernel's output rows where they are outputs, else recomputed (no scratch
rows: the row stays in L1/L2 between passes).

Chunk reductions accumulate per block into ``partials`` (float64), which the
wrapper combines on the device (``_gc_combine``): the "all" kind one value
per block (each thread's own, then the block's tree), the "cols" kind one
row of ``_N`` per block (``_p[b * _N + c]``: such a kernel runs a whole block
per row), each column of it owned by the thread that takes that column in every
row, so no two threads write one element.  The grid is a function of the shape alone (``_gc_row_grid``), so
results do not depend on the device.  Rows of one element (``flat``) are a
grid-stride loop over the flat array instead.

Split rows (a kernel :func:`~gradc.passes.loop_ir.splits` allows, for the calls of
few long rows ``_gc_row_grid`` picks by the rule ``_GC_SPLIT``): each pass is also
a kernel of its own, ``<kernel>_seg<p>``, on a grid of ``(_NS, _G)`` blocks: block
``(g, b)`` takes segment ``g`` of the rows ``b, b + _G, ...``; per row it replays
the row steps before its pass, each tree then over the row's segments' values kept
in ``_sg`` by the earlier passes (:meth:`_CudaLoops.replay`), runs the pass over its
segment and keeps its own segment's tree in ``_sg``; ``<kernel>_end`` then stores
the rows' values and writes the partials (:func:`split_entries`), and the host
function ``<kernel>_split`` launches them in turn.

As on the CPU (:mod:`gradc.codegen.cpu_reduce`), accumulators are float64
whatever the compute dtype, ``max`` and ``min`` propagate NaN, and
``logsumexp`` and ``norm`` take two passes (the max, then the shifted or
scaled sum), with the conventions of ``prelude._g_logsumexp`` and
``prelude._g_norm`` at ±inf, NaN and on empty rows.  The math is
:class:`gradc.codegen.cuda.CudaPrinter`'s (libdevice through ``math``).
"""
from __future__ import annotations

from gradc.codegen.cuda import CudaPrinter, check_device_lines
from gradc.codegen.printer import IndentedBuffer, LoopPrinter
from gradc.codegen.quote import comment
from gradc.ir.graph import Graph
from gradc.passes.fuse_reduce import ROW, ReduceKernel
from gradc.passes.loop_ir import (CUDA, Acc, Finish, Load, LoadBack, PartialWrite,
                                  ReduceLoops, Shift, Start, Store, Tree, Update, lower)
from gradc.passes.row_schedule import (PER_COL, PER_ROW, SCALAR, accumulate_line,
                                       shift_line)

# Initial values of the float64 accumulators (the simulator runs Python: numba.float64
# keeps its sums in float64, a Python float would take a float32 operand's type).
_INIT = {"sum": "numba.float64(0.0)", "mean": "numba.float64(0.0)",
         "prod": "numba.float64(1.0)", "max": "numba.float64(-math.inf)",
         "min": "numba.float64(math.inf)"}

# A max or min in float64: a select that keeps a NaN.
_SELECT = "{acc} = numba.float64({v}) if ({v} {cmp} {acc} or {v} != {v}) else {acc}"


def render_cuda_reduce_kernel(graph: Graph, kernel: ReduceKernel, name: str, *,
                              fast_math: bool = False, comments: tuple[str, ...] = ()) -> str:
    """Source of the CUDA kernel ``name`` computing ``kernel``; arguments: the stored
    values (flat arrays of their own sizes), the partials (flat float64 arrays of
    ``grid`` or ``grid * _N`` elements), the
    :func:`~gradc.passes.row_schedule.input_slots` (flat), then ``_R``, ``_N`` and
    the dtype witness ``_w``.  Launched with blocks of ``(_W, _Y)`` threads,
    ``_W * _Y == _GC_RBLOCK`` (``_gc_launch_rows``).  Where the kernel splits rows,
    the kernels of its split form and their host function follow it."""
    loops = lower(graph, kernel, CUDA)
    p = _CudaLoops(graph, kernel, loops)
    arrays = [*p.outs.values(), *p.parts.values()]
    inputs = [f"_i{j}" for j in range(len(loops.slots))]
    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    fm = ", fastmath=True" if fast_math else ""
    _device_function(buf, name, [*arrays, *inputs, "_R", "_N", "_w"], fm, p.kernel)
    if not loops.split:
        return buf.getvalue()
    params = [*arrays, "_sg", *inputs, "_R", "_N", "_NS", "_w"]
    for k, (entry, _) in enumerate(split_entries(loops, name)):
        printer = _CudaLoops(graph, kernel, loops)     # names of its own
        buf.line("")
        buf.line("")
        _device_function(buf, entry, params, fm, (lambda b, k=k: printer.segment_pass(b, k))
                         if k < len(loops.passes) else printer.split_end)
    buf.line("")
    buf.line("")
    p.driver(buf, name, params)
    return buf.getvalue()


def split_entries(loops: ReduceLoops, name: str) -> list[tuple[str, tuple[str, ...]]]:
    """The kernels of split rows of reduce kernel ``name`` (``loops.split``), each with
    the grid it runs on (names of the driver's): a kernel per pass
    (``<name>_seg<p>``, a block per segment of each of ``_G`` rows at a time), then, where
    rows store a value or chunk reductions are combined, ``<name>_end`` (a block per
    ``_G`` rows at a time)."""
    entries = [(f"{name}_seg{p}", ("_NS", "_G")) for p in range(len(loops.passes))]
    if loops.split_end:
        entries.append((f"{name}_end", ("_G",)))
    return entries


def split_kernels(graph: Graph, kernel: ReduceKernel, name: str) -> list[str]:
    """The kernels of reduce kernel ``name``'s split rows (:func:`split_entries`; none
    where it keeps whole rows): their parameters are its own with ``_sg`` (float64)
    after the partials and ``_NS`` after ``_N``."""
    loops = lower(graph, kernel, CUDA)
    return [entry for entry, _ in split_entries(loops, name)] if loops.split else []


def _device_function(buf: IndentedBuffer, name: str, params: list[str], fm: str, body) -> None:
    """The CUDA kernel ``name`` of ``params``, its body printed by ``body`` (a function of
    a buffer) and checked for what a device function may not contain."""
    buf.line(f"@cuda.jit(cache=not _GC_SIM{fm})")
    buf.line(f"def {name}({', '.join(params)}):")
    buf.indent()
    lines = IndentedBuffer()
    lines.level = buf.level
    body(lines)
    check_device_lines(name, lines.lines)
    buf.lines += lines.lines
    buf.dedent()


class _CudaLoops(LoopPrinter):
    """Prints a :class:`~gradc.passes.loop_ir.ReduceLoops` as a CUDA kernel's body."""

    def __init__(self, graph: Graph, kernel: ReduceKernel, loops: ReduceLoops) -> None:
        super().__init__(graph, kernel, loops, CudaPrinter)
        self.combining = False      # split rows: trees over the segments' values (_sg)

    def preamble(self, buf: IndentedBuffer, rows: bool) -> None:
        """The kernel's setup: its dtype, shared array, thread and the scalars it reads;
        ``rows``: a block of ``(_W, _Y)`` threads, ``_Y`` rows at a time (else one
        row, or one segment, at a time: a whole block's trees)."""
        loops = self.loops
        buf.line("_T = _w.dtype.type")
        buf.line(f"_sh = cuda.shared.array(({loops.tree_rows}, _GC_RBLOCK), numba.float64)")
        buf.line("_tx = cuda.threadIdx.x")
        buf.line("_W = cuda.blockDim.x")              # a row's threads
        if rows:
            buf.line("_Y = cuda.blockDim.y")              # rows at a time
            buf.line("_t = cuda.threadIdx.y * _W + _tx")  # the thread in the block
            buf.line("_whole = _Y == 1")
        else:
            buf.line("_t = _tx")
        for j, (x, a) in enumerate(loops.slots):
            if a == SCALAR:
                buf.line(f"s{j} = _i{j}[0]")
        if loops.tiny_normal:      # the smallest normal number
            buf.line("_tn = 1.1754943508222875e-38 if _w.itemsize == 4 else 2.2250738585072014e-308")

    def kernel(self, buf: IndentedBuffer) -> None:
        loops, pos, parts = self.loops, self.pos, self.parts
        self.preamble(buf, True)
        cols = [i for i in loops.partial_inits if i.chunk == "cols"]
        for init in loops.partial_inits:
            if init.chunk == "all":
                buf.line(f"_q{pos[init.node]} = {_INIT[init.kind]}")
        if cols:
            buf.line("_pb = cuda.blockIdx.x * _N")        # launched as whole blocks
            buf.line("for _c in range(_tx, _N, _W):")
            for init in cols:
                buf.line(f"    {parts[init.node]}[_pb + _c] = {_INIT[init.kind]}")
        if loops.flat:            # launched as whole blocks (_gc_row_grid)
            buf.line("for _j in range(cuda.grid(1), _R, cuda.gridsize(1)):")
            buf.indent()
            self.statements(buf, loops.flat_body)
            buf.dedent()
        else:
            self.rows(buf)
        self.whole = True               # after the rows: the block's tree
        self.guarded(buf, loops.chunk_end)

    def rows(self, buf: IndentedBuffer) -> None:
        """The loop over a group's rows: the passes, each a loop of the group's threads
        over the row's elements, the row steps (trees, row values) between them."""
        loops = self.loops
        self.whole = False              # trees of the row's group
        buf.line("for _r in range(cuda.blockIdx.x * _Y + cuda.threadIdx.y, _R, "
                 "cuda.gridDim.x * _Y):")
        buf.indent()
        self.row_start(buf)
        self.index = "(_lo + _c)"
        for ps in loops.passes:
            self.statements(buf, ps.before)
            buf.line("for _c in range(_tx, _N, _W):")
            buf.indent()
            self.statements(buf, ps.body)
            buf.dedent()
        self.statements(buf, loops.after)
        self.index = "_r"
        self.guarded(buf, loops.row_end)
        buf.dedent()

    def row_start(self, buf: IndentedBuffer) -> None:
        """Row ``_r``'s offset and the values its row reads per row."""
        buf.line("_lo = _r * _N")
        for j, (x, a) in enumerate(self.loops.slots):
            if a == PER_ROW:
                buf.line(f"b{j} = _i{j}[_r]")

    # Split rows (:func:`split_entries`): each pass of a row is a kernel of a block per
    # segment of the row; a segment's accumulators (its block's tree) are kept in
    # ``_sg``, which the next kernels combine: a block replays the row steps of the
    # passes before its own, each tree then over the segments' values (``combining``).
    # ``_sg`` holds the trees' accumulators of row ``r``, segment ``g`` at ``(r * _NS +
    # g) * K``, then the partials of all elements of block ``b`` (of ``_G``), segment
    # ``g`` at ``_R * _NS * K + (b * _NS + g) * Q``.

    def segment_slots(self) -> tuple[dict[Acc, int], dict[Acc, int]]:
        """Split rows: the offsets in ``_sg`` of the row reductions' accumulators
        (``K`` of them) and of the partials of all elements (``Q``), as the loops keep
        them (:attr:`~gradc.passes.loop_ir.ReduceLoops.kept`)."""
        loops = self.loops
        return ({a: k for k, a in enumerate(loops.kept)},
                {a: k for k, a in enumerate(loops.kept_chunk)})

    def tree_after(self, p: int) -> Tree | None:
        """The tree over the accumulators pass ``p`` updates (the first row step after
        it), if any."""
        loops = self.loops
        after = loops.passes[p + 1].before if p + 1 < len(loops.passes) else loops.after
        return next((s for s in after if isinstance(s, Tree)), None)

    def segment_pass(self, buf: IndentedBuffer, p: int) -> None:
        """Split rows: pass ``p`` over segment ``cuda.blockIdx.x`` of the rows ``cuda.blockIdx.y
        + k * cuda.gridDim.y``: per row, the row steps before the pass (their trees over
        the segments of earlier passes), the pass over the segment's elements, the
        segment's tree of the accumulators it updated kept in ``_sg``; after the rows,
        the segment's partials of all elements."""
        loops, ps = self.loops, self.loops.passes[p]
        slots, chunk = self.segment_slots()
        inits = {i.node: i for i in loops.partial_inits}
        self.preamble(buf, False)
        self.whole = True               # a block per segment: its trees
        buf.line("_sl = (_N + _NS - 1) // _NS")         # a segment's elements
        buf.line("_c0 = cuda.blockIdx.x * _sl")
        buf.line("_c1 = min(_c0 + _sl, _N)")
        mine = [s for s in ps.segment_starts if s.acc.role == "q"]
        self.statements(buf, mine)
        if ps.first_cols:       # the block's row of partials: its segment's columns
            buf.line("_pb = cuda.blockIdx.y * _N")
            buf.line("for _c in range(_c0 + _tx, _c1, _W):")
            for n in ps.first_cols:
                buf.line(f"    {self.parts[n]}[_pb + _c] = {_INIT[inits[n].kind]}")
        buf.line("for _r in range(cuda.blockIdx.y, _R, cuda.gridDim.y):")
        buf.indent()
        self.row_start(buf)
        self.replay(buf, [*(ps.before for ps in loops.passes[:p])], ps.before)
        self.index = "(_lo + _c)"
        buf.line("for _c in range(_c0 + _tx, _c1, _W):")
        buf.indent()
        self.statements(buf, ps.body)
        buf.dedent()
        if tree := self.tree_after(p):
            self.statements(buf, [tree])
            self.kept(buf, f"(_r * _NS + cuda.blockIdx.x) * {len(slots)}",
                      [(a, slots[a]) for a, _ in tree.accs])
        buf.dedent()
        if mine:
            self.statements(buf, [Tree(tuple((s.acc, s.kind) for s in mine))])
            self.kept(buf, f"_R * _NS * {len(slots)} + (cuda.blockIdx.y * _NS + "
                      f"cuda.blockIdx.x) * {len(chunk)}", [(s.acc, chunk[s.acc]) for s in mine])

    def replay(self, buf: IndentedBuffer, earlier: list[list], last: list) -> None:
        """The row steps ``earlier`` (before the passes before a kernel's own, less
        their starts: the trees overwrite them), then ``last``, each tree over the
        segments' values."""
        self.combining = True
        for stmts in earlier:
            self.statements(buf, [s for s in stmts if not isinstance(s, Start)])
        self.statements(buf, last)
        self.combining = False

    def kept(self, buf: IndentedBuffer, at: str, accs: list) -> None:
        """A segment's accumulators ``accs`` (with their offsets) kept in ``_sg`` from
        ``at`` on by the block's thread 0."""
        buf.line("if _t == 0:")
        buf.line(f"    _e = {at}")
        for a, k in accs:
            buf.line(f"    _sg[_e + {k}] = {self.acc(a)}")

    def split_end(self, buf: IndentedBuffer) -> None:
        """Split rows: after the passes, a block per ``_G`` rows at a time: the chunk
        partials of all elements combined over the block's segments, then per row the
        row steps (trees over the segments) and the row's stores and updates of
        partials, then the block's partials."""
        loops = self.loops
        slots, chunk = self.segment_slots()
        self.preamble(buf, False)
        self.whole = True
        for init in loops.partial_inits:
            if init.chunk == "all":
                buf.line(f"_q{self.pos[init.node]} = {_INIT[init.kind]}")
        kinds = {i.node: i.kind for i in loops.partial_inits}
        if chunk:
            buf.line("for _g in range(_t, _NS, _GC_RBLOCK):")
            buf.line(f"    _e = _R * _NS * {len(slots)} + (cuda.blockIdx.x * _NS + _g) * {len(chunk)}")
            for a, k in chunk.items():
                buf.line("    " + accumulate_line(self.acc(a), f"_sg[_e + {k}]",
                                                  kinds[a.node], _SELECT))
            self.statements(buf, [Tree(tuple((a, kinds[a.node]) for a in chunk))])
        buf.line("for _r in range(cuda.blockIdx.x, _R, cuda.gridDim.x):")
        buf.indent()
        self.row_start(buf)
        self.replay(buf, [ps.before for ps in loops.passes], loops.after)
        self.index = "_r"
        self.guarded(buf, loops.row_end)
        buf.dedent()
        writes = [s for s in loops.chunk_end if isinstance(s, PartialWrite)]
        if writes:              # every thread holds the combined ones; row values' in 0
            buf.line("if _t == 0:")
            buf.indent()
            self.statements(buf, writes)
            buf.dedent()

    def driver(self, buf: IndentedBuffer, name: str, params: list[str]) -> None:
        """The host function running split rows of kernel ``name``: ``_NS`` segments a
        row, ``_G`` rows at a time (``_gc_row_grid``), each kernel of
        :func:`split_entries` in turn on ``stream``, their segments' accumulators in a
        scratch buffer kept between calls."""
        slots, chunk = self.segment_slots()
        own = [p for p in params if p not in ("_sg", "_NS")]
        buf.line(f"def {name}_split(stream, _NS, _G, {', '.join(own)}):")
        buf.indent()
        buf.line(f'"""Split rows: {name} a pass at a time over ``_NS`` segments of a row."""')
        size = f"_R * _NS * {len(slots)}" + (f" + _G * _NS * {len(chunk)}" if chunk else "")
        buf.line(f"_sg = _gc_scratch(({size},), stream, {name + '_split'!r})")
        for entry, grid in split_entries(self.loops, name):
            dims = f"({', '.join(grid)})" if len(grid) > 1 else grid[0]
            buf.line(f"{entry}[{dims}, _GC_RBLOCK, stream]({', '.join(params)})")
        buf.dedent()

    def guarded(self, buf: IndentedBuffer, stmts: list) -> None:
        """Trees (every thread), then the other statements by one thread alone: the
        group's lane 0 (a row's), or the block's thread 0 (after the rows)."""
        self.statements(buf, [s for s in stmts if isinstance(s, Tree)])
        rest = [s for s in stmts if not isinstance(s, Tree)]
        if rest:
            buf.line("if _t == 0:" if self.whole else "if _tx == 0:")
            buf.indent()
            self.statements(buf, rest)
            buf.dedent()

    def acc(self, a: Acc) -> str:
        if a.role == "p":
            return f"{self.parts[a.node]}[_pb + _c]"
        return f"_{a.role}{self.pos[a.node]}"

    def print_tree(self, s: Tree) -> list[str]:
        buf = IndentedBuffer()
        accs = [(self.acc(a), kind) for a, kind in s.accs]
        if self.combining:      # split rows: the tree's accumulators over the segments
            slots = self.segment_slots()[0]
            for acc, kind in accs:
                buf.line(f"{acc} = {_INIT[kind]}")
            buf.line("for _g in range(_t, _NS, _GC_RBLOCK):")
            buf.line(f"    _e = (_r * _NS + _g) * {len(slots)}")
            for (a, kind), (acc, _) in zip(s.accs, accs):
                buf.line("    " + accumulate_line(acc, f"_sg[_e + {slots[a]}]", kind, _SELECT))
        _tree(buf, accs, self.whole)
        return buf.lines

    def print_load(self, s: Load) -> list[str]:
        local = self.kn.local(*self.loops.slots[s.slot])
        at = "_j" if self.loops.flat else "_c" if s.access == PER_COL else "_lo + _c"
        return [f"{local} = _i{s.slot}[{at}]"]

    def print_loadback(self, s: LoadBack) -> list[str]:     # stored by this thread before
        self.names[s.node] = f"v{self.pos[s.node]}"
        return [f"v{self.pos[s.node]} = {self.outs[s.buffer.node]}[_lo + _c]"]

    def print_store(self, s: Store) -> list[str]:
        at = "_j" if self.loops.flat else "_r" if self.kn.level[s.node] == ROW else "_lo + _c"
        return [f"{self.outs[s.node]}[{at}] = {self.names[s.node]}"]

    def print_update(self, s: Update) -> list[str]:
        return [_update(s, self.acc(s.acc), self.pos[s.node], self.kn.reduced(s.node))]

    def print_start(self, s: Start) -> list[str]:
        return [f"{self.acc(s.acc)} = {_INIT[s.kind]}"]

    def print_shift(self, s: Shift) -> list[str]:
        i = self.pos[s.node]
        known = []
        if s.known:                         # the max of x - h: max(x) - h
            m, h = (self.names[v] for v in s.known)
            known = [f"_m{i} = numba.float64(_T({m} - {h}))"]
        return known + [shift_line(s.kind, i, "math.inf"), f"_s{i} = numba.float64(0.0)"]

    def print_finish(self, s: Finish) -> list[str]:
        self.names[s.node] = f"u{self.pos[s.node]}"
        return [_finish(s, self.pos[s.node])]

    def print_partialwrite(self, s: PartialWrite) -> list[str]:
        return [f"{self.parts[s.node]}[cuda.blockIdx.x] = _q{self.pos[s.node]}"]


def _update(s: Update, acc: str, i: int, v: str) -> str:
    """Update ``s`` of the reduction at position ``i`` with the value ``v`` into ``acc``
    (float64)."""
    if s.kind == "logsumexp":
        if s.stage == 0:
            return accumulate_line(acc, v, "max", _SELECT)
        return f"{acc} += _gcm.exp({v} - _h{i})"
    if s.kind == "norm":
        if s.stage == 0:
            return f"_a{i} = abs({v}); " + accumulate_line(acc, f"_a{i}", "max", _SELECT)
        return f"_t{i} = {v} / _h{i}; {acc} += _t{i} * _t{i}"
    return accumulate_line(acc, v, s.kind, _SELECT)


def _tree(buf: IndentedBuffer, accs: list[tuple[str, str]], whole: bool) -> None:
    """A tree over each thread's ``accs`` (float64 ``(name, kind)``, row ``j`` of the
    shared array for the ``j``-th), each name then holding the tree's value in every
    thread it spans: the block's (``whole``: every thread of the block runs it,
    syncthreads in uniform control flow) or a row's group's (the ``_W`` lanes of one
    row, which run it together, synchronised by ``_gcd_sync_row``).  A last
    synchronisation lets the next tree reuse the shared array."""
    lane, width, base, sync = (("_t", "_GC_RBLOCK", "0", "cuda.syncthreads()") if whole else
                               ("_tx", "_W", "_t - _tx", "_gcd_sync_row(_whole)"))
    for j, (acc, _) in enumerate(accs):
        buf.line(f"_sh[{j}, _t] = {acc}")
    buf.line(sync)
    buf.line(f"_wd = {width} // 2")
    buf.line("while _wd > 0:")
    buf.line(f"    if {lane} < _wd:")
    for j, (_, kind) in enumerate(accs):
        if kind in ("sum", "mean"):
            buf.line(f"        _sh[{j}, _t] += _sh[{j}, _t + _wd]")
        elif kind == "prod":
            buf.line(f"        _sh[{j}, _t] *= _sh[{j}, _t + _wd]")
        else:
            cmp = ">" if kind == "max" else "<"
            buf.line(f"        _y = _sh[{j}, _t + _wd]")
            buf.line(f"        if _y {cmp} _sh[{j}, _t] or _y != _y:")
            buf.line(f"            _sh[{j}, _t] = _y")
    buf.line(f"    {sync}")
    buf.line("    _wd //= 2")
    for j, (acc, _) in enumerate(accs):
        buf.line(f"{acc} = _sh[{j}, {base}]")
    buf.line(sync)


def _finish(s: Finish, i: int) -> str:
    """Row reduction ``s.node``'s value from its block's accumulator (in every thread)."""
    if s.kind == "mean":            # NumPy's mean of nothing is NaN
        return f"u{i} = _T(_s{i} / _N) if _N > 0 else _T(math.nan)"
    if s.kind == "logsumexp":     # log(0) is -inf: a row of -inf, or of nothing
        return f"u{i} = _T(_gcm.log(_s{i})) + _h{i}"
    if s.kind == "norm":
        return f"u{i} = _T(_m{i}) if _m{i} == math.inf else _T(_gcm.sqrt(_s{i})) * _h{i}"
    return f"u{i} = _T(_s{i})"
