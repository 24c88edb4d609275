"""The loop IR of reduce kernels: the loops, their order and memory, decided once.

:func:`gradc.passes.row_schedule.schedule` says when each value of a
:class:`~gradc.passes.fuse_reduce.ReduceKernel` is computed (passes per row,
the values each pass computes or loads back).  :func:`lower` turns that into
the kernel's loops for a target (:class:`ReduceLoops`): per chunk of rows its
setup (partials, scratch rows); per row the passes (:class:`Pass`, a loop
over the row's elements: whether it runs in blocks and with which block
sums, its prefetch hints, then its statements in order: input loads, loads
back from an output or scratch row, computes, stores, reduction updates);
between passes the row steps (start, shift, block tree, finish of a
reduction, a row value); after the row, its row stores and the partials of
row values; after the chunk, the partials' writes.  Every choice is made
here, once, for both targets: which passes run in blocks, which pass carries
the next row's prefetch hints, which input slots a pass reads, where a
stored value is read back from, which accumulator each update goes to, when
a two-pass reduction shifts and finishes.  The printers
(:mod:`gradc.codegen.cpu_reduce`, :mod:`gradc.codegen.cuda_reduce`) map the
IR's nodes to text and decide nothing; a node's value is printed by
:class:`~gradc.passes.row_schedule.KernelNames`.

The targets differ as data: the CPU (``CPU``) keeps costly element values a
later pass needs in scratch rows (an output's row where the call allows it:
:func:`hosted`), runs sums in blocks of :data:`BLOCK`
elements in the compute dtype, prefetches the next row in one pass, keeps
max/min accumulators in the compute dtype with a NaN flag apart (LLVM
vectorises both), gathers sums across rows (dw, db) over
:data:`GATHER_ROWS` rows in the compute dtype, runs the sums of a pass that stores
to an output in a second loop of their own (:func:`staged`), and takes centred sums
(:class:`~gradc.passes.row_schedule.CentredSum`: a variance, ``mean(g * xhat)``) in the
pass of their values, a co-moment per block combined across blocks (:class:`Centre`),
and in its online form (:func:`online`, long rows) takes sums of ``exp(x - max(x))`` and
logsumexps in the pass of the max (:class:`Online`);
CUDA (``CUDA``) does none of these and finishes its row reductions in block trees
(:class:`Tree`) of float64 partials in shared memory.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

from gradc.ir.graph import Graph
from gradc.passes.fuse import CHEAP
from gradc.passes.fuse_reduce import (ELEMENT, ROW, ROW_PASSES, ReduceKernel, is_reduction,
                                      value_args)
from gradc.passes.row_schedule import (PER_COL, PER_ELEMENT, PER_ROW, Schedule, access,
                                       fallback_chain, input_slots, online_sums,
                                       reads_element, reduced_values, reduction_kind,
                                       row_passes, rows_ready, schedule)

CPU, CUDA = "cpu", "cuda"

# Elements per block of a row's sum in the compute dtype: 16 float32 lanes of 16 serial
# additions each, so a block's rounding error stays within about 16 ulp of its sum, and
# the blocks are added in float64.
BLOCK = 256

# The rows whose next row a reduce kernel prefetches from a pass that reads nothing from
# memory itself: of more than [0][0] bytes where Numba compiles for 512-bit vectors,
# [0][1] where not, and at most [1] (a longer row's own passes fill the caches).  Rows
# of a page or less follow each other within a page, where the hardware's prefetchers
# work, but each pass of the kernel streams at most one array from memory, a row's worth,
# which they start cold.  On a Zen 4 (AVX-512) rows of one page ran faster without the
# hints (softmax's fwd_bwd 1.2-1.4x, log-softmax's 1.2x at rows of 1024 float32, one
# thread; session 34); on a Zen 3 (AVX2) rows of 512 to 1024 float32 ran faster with
# them (softmax 1.04-1.24x, cross-entropy 0.97-1.12x, log-softmax 0.99-1.07x, two
# threads; one thread at 1024: 1.02-1.18x; session 43).  The module's ``_G_PREFETCH``
# is the pair that holds where it runs.
PREFETCH_ROWS = ((4096, 1024), 1 << 17)

# Bytes ahead of its elements that a pass streaming its own row (layer norm's statistics
# pass) prefetches its inputs, past the row's end into the next rows', in every row in
# blocks and in a split row's segments: the hardware's prefetchers stop at page
# boundaries, and the pass's second loop over each block, in cache, leaves memory idle.
# Layer norm's fwd_bwd at rows of 512 to 4096 float32, two threads, with the next row's
# inputs prefetched so: 1.03-1.29x, their outputs for writing too 0.96-1.07x; 2048 or
# 8192 bytes ahead of the element in place of the next row 1.2x at rows of 1024, and over
# the segments of 16 rows of 262144 1.08-1.23x (session 35).
PREFETCH_AHEAD = 8192

# Rows a sum across rows gathers in the compute dtype before its float64 partial.
GATHER_ROWS = 16

# Bytes of padding on each side of the rows a CPU kernel allocates for itself (scratch,
# sums across rows, stage rows): no other array lies within a vector loop's run-time
# alias check of them (see staged), so the passes that store only to them always run
# their vector loop.
APART = 1024

# Split rows (CPU, :attr:`ReduceLoops.split`): a call of fewer than ``SPLIT[0]`` rows of
# at least ``SPLIT[1]`` elements runs each pass of a row over the row's segments in
# parallel, segments of ``SPLIT[2]`` elements or more, the segments' accumulators
# combined per row between passes (rows shared among threads would leave threads idle,
# one row of 2^22 float32 ran at 38-41 % of a two-thread copy).  The wrapper decides by
# the shape alone (``_g_rows``), so a row's bits do not depend on the thread count.
SPLIT = (8, 1 << 17, 1 << 14)

# Centred sums about pivots (CPU, a pass over a row longer than a block, or over a split
# row's segment, that stores no output): each value's pivot is the mean of its first
# PIVOT elements, rounded to the dtype; one loop sums the values' deviations from their
# pivots, their products and squares, a block at a time, and the co-moments about the
# row's exact means follow from those sums (``C = P - D_a D_b / n``), where Chan's
# blocks take a second loop over every block (layer norm's fwd_bwd at rows of
# 512-2048: 1.06-1.09x; split rows: 1.04-1.13x).  The pivot is good where a value's
# mean lies within its spread of it (``D^2 / n <= M2``, checked per row, losing at most
# a bit); else (a trend or a step along the row) the row's means and co-moments are
# taken again over the row about its exact means, in float64 (``pivot_finish``).
PIVOT = 16

# A kernel with sums across rows (``dw``: a partial row per chunk of whole rows) splits
# up to this many times ``SPLIT[0]`` rows: each segment gathers its own columns of the
# sum, where each chunk of whole rows gathered a whole row of its own (rows of 2^18 and
# more do not stay in L2 with it).  Layer and RMS norm's fwd_bwd split ran 1.0-1.25x at
# 16 rows of 262144 float32, 1.12-1.45x at 8 of 524288, 0.93-1.02x at 24 and 32 rows
# (two threads, session 31); softmax's and the others' 0.94-1.05x at 8 rows.
SPLIT_COLS = 2

# Online sums (CPU, :attr:`ReduceLoops.online`): a kernel whose schedule with its
# :class:`~gradc.passes.row_schedule.OnlineSum` s in the pass of their max has fewer
# passes (softmax's fused fwd_bwd: 3, not 4; log-softmax's and cross-entropy's: 2, not
# 3) also runs in that form, on rows of at least this many bytes (a row that no longer
# stays in the cache between its passes).  It computes the exp twice where the other
# form keeps it in scratch: written by hand, log-softmax's online fwd_bwd ran 0.65x on
# rows of 64 float32, the same on rows of 1024 to 16384, 1.2-1.35x on rows of 32768 and
# more (two threads, session 28; the generated kernels: docs/performance.md, "Online
# sums").  The wrapper decides by the shape and dtype alone.
ONLINE_ROWS = 1 << 17
# ... and where its online form computes an exp again (:func:`online_again`), from rows
# of [0] bytes where Numba compiles for 512-bit vectors (AVX-512: an exp costs half as
# much per float; measured on a Zen 4, sessions 28-37) and of [1] bytes where not: on a
# Zen 3 (AVX2) the other form's fused fwd_bwd ran 1.14-1.27x (softmax), 1.18-1.31x
# (cross-entropy), 0.99-1.10x (log-softmax) on rows of 65536 to 524288 float32, whose
# passes stay in its 32 MiB L3 cache; on rows of 1M and 4M 0.92-1.13x and 0.81-1.01x
# (two threads, session 39; docs/performance.md).  The module's ``_G_ONLINE`` is the
# pair of the two thresholds that hold where it runs.
ONLINE_AGAIN = (1 << 17, 1 << 22)

# Rows whose length a CPU reduce kernel also runs compiled in, as a constant (CPU,
# :func:`static_rows`): the kernel's body called with the length a literal, so LLVM
# knows every pass's trip count (no remainder loops or their checks, the row's views and
# offsets folded).  Fused fwd_bwd at these lengths, float32, two threads, 2^22 elements,
# the length written into the generated kernel against the kernel as generated (session
# 43): rows of 64 1.06-1.27x (softmax 1.17-1.27x, layer norm 1.19-1.25x, cross-entropy
# 1.00-1.06x), rows of 128 1.03-1.17x (cross-entropy 0.81-1.07x); rows of 48, 96 and 192
# gained as much (1.02-1.21x) but are rarer; rows of 32 lost (0.74-0.86x: LLVM unrolled
# their loops whole before it vectorised them), rows of 256 and 1024 0.86-1.09x.  Each
# length is compiled on the first call with a row of that length.
STATIC_ROWS = (64, 128)

# Rows in groups (CPU, :func:`row_group`): a kernel runs each pass over [0] rows in
# turn before the next pass, on rows of at most [1] bytes, the row values a later pass
# reads kept per row of the group (the same arithmetic per row, in the same order of
# rows: the same bits).  Where one row's passes follow each other, a row's scalar steps
# between its passes (cross-entropy's log and division, softmax's division) wait on its
# sum, which is the end of a chain through the whole pass; in groups the next rows' loops
# run while they wait.  Written by hand (session 45; Zen 3, float32, fused fwd_bwd,
# rows of 64): cross-entropy 1.27-1.32x on one thread in groups of 2, 4 or 8 rows,
# 1.17-1.29x on two; softmax 1.09-1.13x in groups of 4.  An earlier try that
# interleaved two rows in each loop lost (0.86x: performance.md).
ROW_GROUP = (4, 1024)


@dataclass(frozen=True)
class Acc:
    """An accumulator of reduction ``node``: ``role`` ``s`` (a row reduction's value,
    a two-pass one's sum, a centred sum's co-moment), ``m`` (a two-pass one's max),
    ``q`` (the chunk's partial), ``f`` (a block's sum in the compute dtype), ``g`` (a
    sum across rows gathered in the compute dtype), ``p`` (the partial's own memory),
    or a centred sum's block sums of its values, ``fa``, ``fb`` (in the compute
    dtype); ``column``: one per column of the row, the element's."""
    role: str
    node: int
    column: bool = False


@dataclass(frozen=True)
class Buffer:
    """Memory holding element value ``node`` for a row: its ``output`` row, or its
    ``scratch`` row (one per chunk of rows); or the ``stage`` row of value ``arg`` of
    reduction ``node`` (:class:`Stage`)."""
    kind: str
    node: int
    arg: int = 0


@dataclass(frozen=True)
class Load:
    """Read input slot ``slot`` (of :func:`~gradc.passes.row_schedule.input_slots`),
    read as ``access``, at the loop's element (or row)."""
    slot: int
    access: str


@dataclass(frozen=True)
class LoadBack:
    """Read element value ``node``, stored by an earlier pass, from ``buffer``."""
    node: int
    buffer: Buffer


@dataclass(frozen=True)
class Compute:
    """Compute node ``node`` (an element value in a pass, a row value between passes)."""
    node: int


@dataclass(frozen=True)
class Store:
    """Store value ``node`` into ``buffer`` at the loop's element (or row); ``hosted``: a
    store to an output that the call skips where that output's row holds the scratch row
    the value is in already (:attr:`ReduceLoops.hosts`)."""
    node: int
    buffer: Buffer
    hosted: bool = False


@dataclass(frozen=True)
class Update:
    """Update ``acc`` of reduction ``node`` (of kind ``kind``) with the value it reduces:
    ``stage`` 0 or 1 of a two-pass reduction (the max, then the shifted or scaled
    sum); ``nan_flag``: a max or min kept in the compute dtype with a NaN flag apart,
    else a select that keeps a NaN; ``arg``: which of the values the reduction
    reduces (:func:`~gradc.passes.row_schedule.reduced_values`)."""
    node: int
    kind: str
    stage: int
    acc: Acc
    nan_flag: bool = False
    arg: int = 0

    @property
    def reassoc(self) -> bool:
        """Whether it adds (or multiplies) in an order left to LLVM: the CPU prints it as
        one instruction flagged ``reassoc`` (``_g_radd``, ``_g_rmul``: vector lanes of
        partial sums), and runs it apart from stores (:func:`staged`)."""
        if self.kind in ("logsumexp", "norm"):
            return self.stage == 1
        return not self.nan_flag and self.kind in ("sum", "mean", "prod")


@dataclass(frozen=True)
class Stage:
    """Store value ``arg`` reduction ``node`` reduces into its stage row (a block of
    :data:`BLOCK` elements per chunk of rows, CPU), for the pass's later loops over
    the block (:attr:`Pass.staged`, :attr:`Pass.centred`); ``blocks``: in the loop in
    blocks too (False: a centre reads it from its input there, :attr:`Centre.slots`)."""
    node: int
    arg: int = 0
    blocks: bool = True


@dataclass(frozen=True)
class Centre:
    """CPU: a block's co-moment of centred sum ``node``
    (:class:`~gradc.passes.row_schedule.CentredSum`), over its values in
    ``buffers`` less their block's means, combined into the row's with Chan's
    formula; ``sums``: per value, the accumulators of its sum over the row (None: none
    kept) and over the block (a sum of the same value in the pass shares them);
    ``slots``: per value, the input slot the loop in blocks reads it from instead of
    its stage row (None: the stage row).

    An input's element is read again from its row, in cache, where the pass runs in
    blocks and stores no output (which, written in place, would be in that row by
    then): a store and a load an element fewer (layer norm's ``fwd_bwd``, rows of 1024,
    1.04-1.07x on one thread).  A row of one block keeps the stage row: it is aligned
    where the input's row is not (rows of 64: 0.88-0.96x from the input)."""
    node: int
    buffers: tuple[Buffer, ...]
    sums: tuple[tuple[Acc, Acc], ...]
    slots: tuple[int | None, ...]


@dataclass(frozen=True)
class Online:
    """CPU, the online form: after the loop over a block (the row where not in
    blocks), online sum ``node`` (:class:`~gradc.passes.row_schedule.OnlineSum`)
    takes the block: its shift ``k`` becomes the row's max so far (accumulator
    ``acc``: the max's, or a logsumexp's own) where that is finite (else 0), the
    row's sum so far rescaled where ``k`` changed, then a loop over the block adds
    ``exp(x - k)``, ``x`` read from ``buffer`` (the max's stage row) or, where None,
    from input slot ``slot``; a weighted one (``weight``, an input slot, else -1) adds
    ``exp(x - k)`` times the element of that slot, in the loop of the other online sums
    of the same ``x`` and max (one exp)."""
    node: int
    acc: Acc
    buffer: Buffer | None = None
    slot: int = -1
    weight: int = -1


@dataclass(frozen=True)
class Start:
    """Before a row reduction's first pass: ``acc`` set to the identity of ``kind``
    (``max`` for a two-pass one's max), with a NaN flag if ``nan_flag``."""
    node: int
    kind: str
    acc: Acc
    nan_flag: bool = False


@dataclass(frozen=True)
class Shift:
    """After the first pass of two-pass reduction ``node``: its shift or scale from the
    max (NaN from the flag if ``nan_flag``), and the sum started; ``known``: ``(m, h)``,
    a logsumexp's max is the row value ``m - h``, and no pass took it
    (:func:`~gradc.passes.row_schedule.known_maxima`)."""
    node: int
    kind: str
    nan_flag: bool = False
    known: tuple[int, int] | None = None


@dataclass(frozen=True)
class Tree:
    """A block's tree over each thread's float64 accumulators ``accs`` (``(acc,
    kind)``), leaving the block's value in every thread (CUDA)."""
    accs: tuple[tuple[Acc, str], ...]


@dataclass(frozen=True)
class Finish:
    """Row reduction ``node``'s value from its accumulators (``nan_flag``: a max or
    min's NaN from its flag; ``centred``: a centred sum's, times the row values
    ``factors``, and where that is not finite, the sum of its operand as written
    over the row, computed by ``fallback``: the statements of a loop over the row;
    ``shift``: an online sum's (:class:`Online`), scaled by ``exp(k - shift)``, the
    sum of the row values ``shift``, then negated where ``negated``, times the row
    values ``factors`` and over the row values ``divisors``; a weighted one's, where
    not finite, computed again by ``fallback`` as the centred sum's)."""
    node: int
    kind: str
    nan_flag: bool = False
    centred: bool = False
    factors: tuple[int, ...] = ()
    fallback: tuple = ()
    shift: tuple[int, ...] | None = None
    negated: bool = False
    divisors: tuple[int, ...] = ()


def gathered(graph: Graph, kernel: ReduceKernel, n: int) -> bool:
    """Whether a CPU kernel gathers partial ``n``, a sum or mean across rows (one per
    column: ``dw``, ``db``), in a row of the compute dtype, :data:`GATHER_ROWS` rows at
    a time, before adding them to the chunk's partial (its vector loops keep
    float32's lanes).  Where no chunk has more rows than that (``_R <= GATHER_ROWS *
    _C``) the wrapper makes the partial itself of the compute dtype and the kernel
    gathers straight into it: the same float32 sums, which the float64 partial held
    exactly, without its zeroing, its additions or a row of its own (16 rows of
    262144: 16 MB less memory traffic a call).  The rule is the run time's
    ``_g_gathers_straight``, which the wrapper and the kernel both call."""
    return (dict(kernel.chunk_kind)[n] == "cols" and not kernel.flat
            and reduction_kind(graph, n) in ("sum", "mean"))


@dataclass(frozen=True)
class PartialInit:
    """A chunk's partial ``node`` set to the identity of ``kind``: one value (``chunk``
    "all") or one per column ("cols"), then ``gathered``: a row of sums across rows
    in the compute dtype."""
    node: int
    kind: str
    chunk: str
    gathered: bool = False


@dataclass(frozen=True)
class PartialWrite:
    """The chunk's partial ``node`` written to its memory."""
    node: int


@dataclass(frozen=True)
class Prefetch:
    """Hints that fetch the next row's elements, a block at a time: of the input slots
    ``reads``, and of the element outputs ``writes`` (owned lines: their stores need
    no read for ownership); or, ``ahead`` > 0, the elements of the inputs ``reads``
    (those the pass reads) that many bytes ahead of the block in their flat arrays (in
    every row, and in a split row's segments)."""
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    ahead: int = 0


@dataclass
class Pass:
    """One loop over a row's elements: ``before``, the row steps before it; ``body``,
    per element; ``block`` > 0: in blocks of that many elements, each with
    ``block_sums`` (accumulator, or None for a centred sum's value summed per block
    only; block's sum in the compute dtype), added after the
    block; ``prefetch``: its hints (in blocks only); ``whole``: a row of at most
    ``block`` elements runs as one plain loop instead (the same sums: one block), the
    loop nest of blocks costing short rows more than their arithmetic; ``staged``:
    the sums run in a second loop over the block (:func:`staged`); ``centred``: the
    co-moments then run in a loop of their own over it (:class:`Centre`), but where
    ``pivoted``, in the first loop about pivots (:data:`PIVOT`).  Split rows:
    ``segment_starts``, the accumulators each segment of the pass starts, then
    leaves to be combined per row (a :class:`Start` each: a two-pass reduction's sum
    as a ``sum``, a partial of all elements as its kind); ``first_cols``: the partials
    across rows (one per column) the pass updates first, which a segment starts at the
    first row.  ``online``: the online sums the pass takes, after each block."""
    before: list = field(default_factory=list)
    body: list = field(default_factory=list)
    block: int = 0
    block_sums: list[tuple[Acc | None, Acc]] = field(default_factory=list)
    prefetch: Prefetch | None = None
    whole: bool = False
    staged: list[tuple[Update, Buffer]] = field(default_factory=list)
    centred: list[Centre] = field(default_factory=list)
    pivoted: bool = False
    segment_starts: list[Start] = field(default_factory=list)
    first_cols: list[int] = field(default_factory=list)
    online: list[Online] = field(default_factory=list)


@dataclass
class ReduceLoops:
    """The loops of a reduce kernel for ``target`` (see the module doc): its
    ``outputs``, ``partials`` and input ``slots`` (the parameters, in that order);
    per chunk, ``partial_inits``, the ``scratch`` rows, ``prefetch_rows`` (a pass
    prefetches the next row, on rows of the sizes of :data:`PREFETCH_ROWS`); per row (``flat``: rows of one
    element, ``flat_body`` per element instead), the ``passes``, the row steps
    ``after`` them and ``row_end`` (stores of row values, updates of partials of row
    values), the sums across rows gathered over ``gather_rows`` rows (``gather``);
    per chunk then ``chunk_end``.  ``tiny_normal``: a norm needs the smallest normal
    number; ``tree_rows``: accumulators a tree takes at most (CUDA's shared memory);
    ``stages``: the stage rows (:class:`Stage`), ``flat_staged`` the sums of a flat
    kernel run in a second loop per block of :data:`BLOCK` elements; ``centred``: the
    centred sums (CPU); ``split``: the kernel also runs as split rows (:func:`splits`;
    the CPU's rule is :data:`SPLIT`, CUDA's the run time's ``_GC_SPLIT``); on CUDA
    then ``kept`` and ``kept_chunk``, what a segment keeps for the next kernels, and
    ``split_end``, a last kernel after the passes (:meth:`_Lowering.segments_kept`).
    ``online``: the online form (:data:`ONLINE_ROWS`; its split rows too: segments
    leave their online sums and shifts, combined by rescaling); ``hosts``: the scratch
    rows that an output's row holds where the call's outputs lie apart from its other
    arrays (:func:`hosted`; CPU, rows not split); ``static``: the row lengths the
    kernel also runs compiled in (:func:`static_rows`; CPU, not the online form);
    ``row_group``: the rows each pass runs over in turn (:func:`row_group`)."""
    target: str
    outputs: list[int]
    partials: list[int]
    slots: list[tuple[int, str]]
    flat: bool
    tiny_normal: bool = False
    partial_inits: list[PartialInit] = field(default_factory=list)
    scratch: list[int] = field(default_factory=list)
    prefetch_rows: bool = False
    flat_body: list = field(default_factory=list)
    passes: list[Pass] = field(default_factory=list)
    after: list = field(default_factory=list)
    row_end: list = field(default_factory=list)
    gather: list[int] = field(default_factory=list)
    gather_rows: int = GATHER_ROWS
    chunk_end: list = field(default_factory=list)
    tree_rows: int = 1
    stages: list[Buffer] = field(default_factory=list)
    flat_staged: list[tuple[Update, Buffer]] = field(default_factory=list)
    centred: dict = field(default_factory=dict)
    split: bool = False
    kept: list[Acc] = field(default_factory=list)
    kept_chunk: list[Acc] = field(default_factory=list)
    split_end: bool = False
    online: bool = False
    hosts: dict[int, int] = field(default_factory=dict)
    static: tuple[int, ...] = ()
    row_group: int = 1


def stores_after_reads(loops: ReduceLoops, slots: set[int], output: int) -> bool:
    """Whether the kernel of ``loops`` may store its element output ``output`` over the
    very array its input slots ``slots`` read (called in place, ``f(x, out=x)``): every
    read of those slots is in a pass before the first that stores the output, or in that
    pass's loop over the row, where each element is read before it is stored (a
    statement list reads, then stores); none comes later (a later pass, a centred or
    online loop over a block of that pass, which runs after its stores, a fallback loop
    over the row, a row step after the passes).  A row's passes run in order on every
    target (split rows: a pass over every segment before the next), so this holds for
    each element of each row."""
    if loops.flat:
        return True
    out = Buffer("output", output)
    first = next((i for i, ps in enumerate(loops.passes)
                  if any(isinstance(st, Store) and st.buffer == out for st in ps.body)), None)
    if first is None:
        return False
    for i, ps in enumerate(loops.passes[first:], first):
        if _reads(ps.centred, slots) or _reads(ps.online, slots):
            return False
        if i > first and (_reads(ps.before, slots) or _reads(ps.body, slots)):
            return False
    body = loops.passes[first].body
    stored = next(k for k, st in enumerate(body) if isinstance(st, Store) and st.buffer == out)
    return not _reads(body[stored:], slots) and not _reads(loops.after, slots) \
        and not _reads(loops.row_end, slots)


def _reads(statements, slots: set[int]) -> bool:
    """Whether any of ``statements`` reads one of the input ``slots`` (a load, a fallback
    loop's, a centre's or an online sum's read of its input row)."""
    for st in statements:
        if isinstance(st, Load) and st.slot in slots or \
                isinstance(st, Finish) and _reads(st.fallback, slots) or \
                isinstance(st, Centre) and slots.intersection(st.slots) or \
                isinstance(st, Online) and slots.intersection((st.slot, st.weight)):
            return True
    return False


def splits(graph: Graph, kernel: ReduceKernel) -> bool:
    """Whether a reduce kernel also runs as split rows (the CPU's :data:`SPLIT`, CUDA's
    ``_GC_SPLIT``): every kernel
    with passes over rows (a flat one's rows are of one element) but a row product's
    (the segments' products of a row of 2s, then of 0.5s, are inf and 0, whose product
    is NaN where the row's, as NumPy takes it, is inf; found by helper 40)."""
    return not kernel.flat and not any(
        kernel_level == ROW and is_reduction(graph, n) and reduction_kind(graph, n) == "prod"
        for n, kernel_level in kernel.levels)


def static_rows(kernel: ReduceKernel) -> tuple[int, ...]:
    """The row lengths a CPU reduce kernel also runs compiled in (:data:`STATIC_ROWS`):
    every kernel with passes over rows (a flat one's rows are of one element), those
    of them its rows can have (a row of declared dims has one length)."""
    if kernel.flat:
        return ()
    row = kernel.shape.static[kernel.split:]
    if kernel.shape.dyn or not all(isinstance(d, int) for d in row):
        return STATIC_ROWS
    return tuple(k for k in STATIC_ROWS if k == math.prod(row))


def row_group(loops: ReduceLoops) -> int:
    """The rows each pass of a CPU reduce kernel runs over in turn (:data:`ROW_GROUP`;
    1: a row's passes follow each other): a kernel of two passes or more whose row
    values are all that a later pass reads of an earlier one's (each reduction started
    in the pass that updates it first, its shift and value taken right after the pass
    that updates it last, a shift from its own max), with no sums across rows gathered
    (their flush counts rows), no centred sums or stage rows."""
    if loops.flat or loops.online or loops.centred or loops.gather or loops.stages \
            or len(loops.passes) < 2:
        return 1
    updated: dict[int, set[int]] = {}
    for p, ps in enumerate(loops.passes):
        for s in ps.body:
            if isinstance(s, Update) and s.acc.role != "q":
                updated.setdefault(s.node, set()).add(p)
    tails = [ps.before for ps in loops.passes[1:]] + [loops.after]
    for p, ps in enumerate(loops.passes):
        for s in ps.before:
            if isinstance(s, Start) and min(updated.get(s.node, {p})) != p:
                return 1
        for s in tails[p]:
            if isinstance(s, Finish) and max(updated.get(s.node, {p})) != p:
                return 1
            if isinstance(s, Shift) and (updated.get(s.node) != {p, p + 1} or s.known):
                return 1
    return ROW_GROUP[0]


def online(graph: Graph, kernel: ReduceKernel) -> bool:
    """Whether a CPU reduce kernel also runs in the online form on long rows
    (:data:`ONLINE_ROWS`): it has passes over rows, its
    :class:`~gradc.passes.row_schedule.OnlineSum` s in the pass of their max take a
    pass fewer, and that is worth what the form costs.  An online sum of ``exp(x -
    max)`` whose exp a later pass needs computes it again there (the other form keeps
    it in scratch): on long rows that cost softmax's forward (2 arrays per element)
    0.62-0.89x and its vjp, which keeps that exp in a scratch row still, 0.66-1.04x,
    while kernels of 3 or 4 arrays that do not gained (log-softmax's vjp 0.99-1.28x,
    fwd_bwds 1.02-1.39x, cross-entropy's vjp 0.87-1.12x; rows of 32768 to 262144
    float32, two threads, session 28).  A logsumexp computes no more (its exp is
    summed once either way: log-softmax's forward 0.90-1.21x, cross-entropy's
    1.6-3x)."""
    if kernel.flat or not online_sums(graph, kernel):
        return False
    other, sch = schedule(graph, kernel), schedule(graph, kernel, online=True)
    if sch.passes >= other.passes:
        return False
    if not _computes_again(graph, sch, other):
        return True
    again = {o.exp for o in sch.online.values() if o.shift is not None}
    return _arrays(graph, kernel) >= 3 and not again & set(sch.scratch)


def _arrays(graph: Graph, kernel: ReduceKernel) -> int:
    """The arrays a reduce kernel reads or writes per element."""
    streams = [a for x, a in input_slots(graph, kernel) if a == PER_ELEMENT]
    return len(streams) + sum(dict(kernel.levels)[n] == ELEMENT for n in kernel.outputs)


def online_again(graph: Graph, kernel: ReduceKernel) -> bool:
    """Whether the online form of a kernel that has one (:func:`online`) computes
    costly primitives (an exp) again that its other form computes once: it runs from
    rows of :data:`ONLINE_AGAIN` bytes, the others' from :data:`ONLINE_ROWS`.  Not
    where it reads each row two passes fewer and the kernel moves 4 arrays or more
    per element: softmax's fused fwd_bwd (its ``sum(y * dy)`` a weighted online sum:
    two passes, not four) ran 1.10x at rows of 8192 float32, 1.21-1.28x at 16384 to
    262144 (two threads, Zen 3, session 46), where the exp taken twice cost its vjp
    (three arrays) 0.93-0.97x."""
    sch, other = schedule(graph, kernel, online=True), schedule(graph, kernel)
    if other.passes - sch.passes >= 2 and _arrays(graph, kernel) >= 4:
        return False
    return _computes_again(graph, sch, other)


def _computes_again(graph: Graph, online_form: Schedule, other: Schedule) -> bool:
    """Whether the online form's schedule computes more costly primitives than the
    other form's."""
    return _costly(graph, online_form) > _costly(graph, other)


# What a costly primitive costs per element in :func:`_costly`: one vector instruction
# (a division, a square root) 1, a function of the math library (exp, log: a
# polynomial after a range reduction, some 20 vector instructions) LIBRARY.  Counted
# alike, softmax's vjp looked as costly in its online form (two passes, the exp taken
# twice, a division once) as in its other (four passes, the exp once, kept in scratch,
# two divisions) and ran online from 128 KiB: 0.93-0.97x at rows of 16384 to 262144
# float32 (two threads, session 46).
LIBRARY = 4
_INSTRUCTIONS = frozenset({"div", "sqrt", "rsqrt"})


def _costly(graph: Graph, sch: Schedule) -> int:
    """The cost of the costly primitives (``gradc.passes.fuse``'s not cheap: exp, log,
    division; :data:`LIBRARY`) a schedule computes per element: in its passes, the exps
    of its two-pass reductions' sums and of its online sums (one per exp: a weighted
    sum shares its plain one's)."""
    twice = [n for n in sch.live if n not in sch.online
             and reduction_kind(graph, n) in ("logsumexp", "norm")]
    exps = {o.exp if o.exp >= 0 else n for n, o in sch.online.items()}
    return sum(1 if graph.node(n).op in _INSTRUCTIONS else LIBRARY
               for work in sch.work for n in work if graph.node(n).op not in CHEAP) + \
        LIBRARY * (len(twice) + len(exps))


def lower(graph: Graph, kernel: ReduceKernel, target: str,
          online: bool = False) -> ReduceLoops:
    """The loops of ``kernel`` for ``target`` (``CPU`` or ``CUDA``) from its
    :func:`~gradc.passes.row_schedule.schedule` (with scratch rows on the CPU);
    ``online``: the CPU's online form (:func:`online`)."""
    return _Lowering(graph, kernel, target, online).run()


class _Lowering:
    """The decisions of :func:`lower`, one method each."""

    def __init__(self, graph: Graph, kernel: ReduceKernel, target: str,
                 online: bool = False) -> None:
        self.graph, self.kernel, self.target = graph, kernel, target
        self.cpu, self.online = target == CPU, online
        self.sch = schedule(graph, kernel, scratch=self.cpu, centred=self.cpu,
                            online=online and self.cpu)
        self.cen = self.sch.centred
        self.onl = self.sch.online
        self.known = self.sch.known
        self._centres: dict[int, tuple] = {}
        self.lv = dict(kernel.levels)
        self.kinds = dict(kernel.chunk_kind)
        self.slots = input_slots(graph, kernel)
        self.row_reds = [n for n in kernel.nodes if self.lv[n] == ROW
                         and is_reduction(graph, n) and n in self.sch.live]
        self.done: set[int] = set()

    def kind(self, n: int) -> str:
        return reduction_kind(self.graph, n)

    def first_pass(self, n: int) -> int:
        if n in self.cen or n in self.onl:
            return self.sch.phase[n]
        return self.sch.avail[n] - self.passes_of(n)

    def passes_of(self, n: int) -> int:
        """The passes row reduction ``n`` runs in (an online logsumexp, or one whose max
        is known: one)."""
        return row_passes(self.graph, self.sch, n)

    def stage(self, n: int, p: int) -> int:
        """The stage of row reduction ``n`` in pass ``p``: its pass less its first (a
        logsumexp whose max is known, its max from the row's, starts at its sum: 1)."""
        return p - self.first_pass(n) + (1 if n in self.known else 0)

    def own_max(self, n: int) -> bool:
        """Whether online sum ``n`` is a logsumexp, which keeps its own max."""
        return n in self.onl and self.onl[n].shift is None

    def elem_outputs(self) -> list[int]:
        return [n for n in self.kernel.outputs if self.lv[n] == ELEMENT]

    def run(self) -> ReduceLoops:
        graph, kernel, sch = self.graph, self.kernel, self.sch
        loops = ReduceLoops(self.target, list(kernel.outputs), list(kernel.partials),
                            self.slots, kernel.flat, centred=dict(self.cen),
                            online=bool(self.onl))
        norms = kernel.nodes if self.cpu else self.row_reds
        loops.tiny_normal = any(graph.node(n).op == "norm" for n in norms)
        for n in kernel.partials:
            kind, chunk = self.kind(n), self.kinds[n]
            loops.partial_inits.append(PartialInit(n, kind, chunk,
                                                   self.cpu and gathered(graph, kernel, n)))
        every = [n for n in kernel.partials if self.kinds[n] == "all"]
        if self.cpu:
            loops.chunk_end = [PartialWrite(n) for n in kernel.partials if self.kinds[n] != "cols"]
        elif every:                 # one tree for the block's partials, then the writes
            loops.chunk_end = [Tree(tuple((Acc("q", n), self.kind(n)) for n in every)),
                               *(PartialWrite(n) for n in every)]
        loops.tree_rows = max([len(self.tree_group(p)) for p in range(sch.passes + 1)]
                              + [len(every), 1])
        if kernel.flat:
            loops.flat_body = self.flat_body()
            if self.cpu:
                loops.flat_body, loops.flat_staged = staged(graph, sch, loops.flat_body)
                loops.stages = [b for _, b in loops.flat_staged if b.kind == "stage"]
            return loops
        loops.scratch = list(sch.scratch)
        loops.split = splits(graph, kernel)
        loops.static = static_rows(kernel) if self.cpu and not self.online else ()
        streamed = [j for j, (x, a) in enumerate(self.slots) if a == PER_ELEMENT]
        prefetch_pass, streams = self.prefetch_pass(streamed) if self.cpu else (None, False)
        if prefetch_pass is not None and streamed:
            loops.prefetch_rows = not streams
        for p in range(sch.passes):
            ps = Pass(before=self.row_steps(p) + self.starts(p))
            if self.cpu and (self.blocked_sums(p) or self.online_in(p)):
                ps.block, ps.block_sums = BLOCK, self.blocked_sums(p)
                ps.whole = True
                if p == prefetch_pass and streamed:
                    read = tuple(j for j in streamed if self.slots[j] in self.slots_used(p))
                    ps.prefetch = Prefetch(read, (), PREFETCH_AHEAD) if streams \
                        else Prefetch(tuple(streamed), tuple(self.elem_outputs()))
            ps.body = self.body(p, dict(ps.block_sums))
            loops.passes.append(ps)
        if self.cpu:
            deferred(sch, loops.passes)
            loops.hosts = hosted(loops.scratch, self.elem_outputs(), loops.passes)
        for p, ps in enumerate(loops.passes):
            if self.cpu:
                ps.body, ps.staged = staged(graph, sch, ps.body)
                if ps.staged and not ps.block:
                    ps.block, ps.whole = BLOCK, True
                ps.centred = self.centres(p)[0]
                ps.pivoted = bool(ps.centred) and bool(ps.block) and not stores_output(ps.body)
                ps.online = self.onlines(p)
                for b in [b for _, b in ps.staged] + [b for c in ps.centred for b in c.buffers] + \
                        [o.buffer for o in ps.online if o.buffer is not None]:
                    if b.kind == "stage" and b not in loops.stages:
                        loops.stages.append(b)
            ps.segment_starts, ps.first_cols = self.segment_starts(p, ps.before)
        loops.after = self.row_steps(sch.passes)
        loops.row_end = [Store(n, Buffer("output", n)) for n in kernel.outputs
                         if self.lv[n] == ROW]
        loops.row_end += [Update(n, self.kind(n), 0, Acc("q", n)) for n in kernel.partials
                          if not reads_element(graph, kernel, n)]
        loops.gather = [i.node for i in loops.partial_inits if i.gathered]
        if self.cpu and not self.online:
            loops.row_group = row_group(loops)
        if loops.split and not self.cpu:
            self.segments_kept(loops)
        return loops

    def segments_kept(self, loops: ReduceLoops) -> None:
        """CUDA's split rows: what a segment's block keeps for the kernels after its pass
        (:attr:`ReduceLoops.kept`: the accumulators of the trees after each pass, in pass
        order; then the partials of all elements), and whether a last kernel stores the
        rows' values and writes the partials (:attr:`ReduceLoops.split_end`)."""
        after = [ps.before for ps in loops.passes[1:]] + [loops.after]
        loops.kept = [a for stmts in after for s in stmts if isinstance(s, Tree)
                      for a, _ in s.accs]
        loops.kept_chunk = [s.acc for ps in loops.passes for s in ps.segment_starts
                            if s.acc.role == "q"]
        loops.split_end = bool(loops.row_end) or any(i.chunk == "all"
                                                     for i in loops.partial_inits)

    def segment_starts(self, p: int, before: list) -> tuple[list[Start], list[int]]:
        """Split rows: the accumulators a segment of pass ``p`` starts (of the
        reductions it updates: their starts and shifts in ``before``, its partials of
        all elements) and the partials across rows it updates (:attr:`Pass.first_cols`:
        each partial is updated in one pass)."""
        rows, parts = self.updated(p)
        ours = set(rows) | set(self.centred_in(p)) | set(self.online_in(p))
        starts = [s for s in before if isinstance(s, Start) and s.node in ours]
        starts += [Start(s.node, "sum", Acc("s", s.node)) for s in before
                   if isinstance(s, Shift) and s.node in ours]
        starts += [Start(n, self.kind(n), Acc("q", n)) for n in parts if self.kinds[n] == "all"]
        return starts, [n for n in parts if self.kinds[n] == "cols"]

    def flat_body(self) -> list:
        """Rows of one element: the loop over the flat range."""
        read = (PER_ELEMENT,) if self.cpu else (PER_ELEMENT, PER_ROW)
        body: list = [Load(j, a) for j, (x, a) in enumerate(self.slots) if a in read]
        body += [Compute(n) for n in self.sch.work[0]]
        body += [Update(n, self.kind(n), 0, Acc("q", n)) for n in self.kernel.partials]
        body += [Store(n, Buffer("output", n)) for n in self.kernel.outputs]
        return body

    def tree_group(self, before: int) -> list[tuple[Acc, str]]:
        """CUDA: the accumulators whose block trees run before pass ``before``: the row
        reductions finishing there, and the maxima of the two-pass ones whose first
        pass ends there."""
        group = []
        for n in self.row_reds:
            kind = self.kind(n)
            if self.sch.avail[n] == before:
                group.append((Acc("s", n), "sum" if ROW_PASSES[kind] == 2 else kind))
            elif ROW_PASSES[kind] == 2 and n not in self.known and \
                    self.sch.avail[n] - 1 == before:
                group.append((Acc("m", n), "max"))
        return group

    def row_steps(self, before: int) -> list:
        """The row steps before pass ``before``: on CUDA the trees of the reductions that
        finish there (and the shifts of the two-pass ones whose first pass ends there:
        not a logsumexp whose max is known, which has no first pass, nor tree);
        the reductions finished there and the row values available."""
        steps: list = []
        if not self.cpu:
            group = self.tree_group(before)
            if group:
                steps.append(Tree(tuple(group)))
            steps += [Shift(acc.node, self.kind(acc.node)) for acc, kind in group
                      if kind == "max" and ROW_PASSES[self.kind(acc.node)] == 2
                      and self.first_pass(acc.node) + 1 == before]
        for n in rows_ready(self.kernel, self.sch, before, self.done):
            if n in self.cen:
                steps.append(Finish(n, self.kind(n), centred=True, factors=self.cen[n].factors,
                                    fallback=self.fallback(n)))
            elif n in self.onl:
                o = self.onl[n]
                steps.append(Finish(n, self.kind(n), shift=o.shift, negated=o.negated,
                                    factors=o.factors, divisors=o.divisors,
                                    fallback=self.fallback(n) if o.weight else ()))
            elif is_reduction(self.graph, n):
                steps.append(Finish(n, self.kind(n), self.cpu and self.kind(n) in ("max", "min")))
            else:
                steps.append(Compute(n))
        return steps

    def fallback(self, n: int) -> tuple:
        """The statements of a loop over the row computing the operand of row reduction
        ``n`` as written (:func:`~gradc.passes.row_schedule.fallback_chain`)."""
        chain = fallback_chain(self.graph, self.kernel, n)
        used = {(x, access(self.graph, self.kernel, m, x)) for m in chain
                for x in value_args(self.graph, m) if x not in self.lv}
        return tuple(self.loads(used) + [Compute(m) for m in chain])

    def starts(self, p: int) -> list:
        """The row reductions starting in pass ``p`` (on the CPU, the shifts of those in
        their second pass; on both targets, those of logsumexps whose max is known)."""
        steps: list = []
        for n in self.row_reds:
            k, kind = self.stage(n, p), self.kind(n)
            two = ROW_PASSES[kind] == 2
            if self.own_max(n) and k == 0:             # its max, then its online sum
                steps.append(Start(n, "max", Acc("m", n), self.cpu))
            if n in self.cen or n in self.onl:
                if k == 0:
                    steps.append(Start(n, "centred" if n in self.cen else "online", Acc("s", n)))
            elif k == 0 and n not in self.known:
                flag = self.cpu and (two or kind in ("max", "min"))
                steps.append(Start(n, "max" if two else kind, Acc("m" if two else "s", n), flag))
            elif k == 1 and two and (self.cpu or n in self.known):  # known: no NaN flag
                steps.append(Shift(n, kind, n not in self.known, self.known.get(n)))
        return steps

    def blocked_sums(self, p: int) -> list[tuple[Acc, Acc]]:
        """CPU: (accumulator, block's sum) of the sums pass ``p`` runs in blocks.  Sums
        run in blocks of BLOCK elements in the compute dtype, each block's sum added to
        the row's float64 sum: LLVM vectorises the block in as many lanes as float32
        fills (float64 accumulators would halve them, and every function of the math
        library with them)."""
        graph, kernel = self.graph, self.kernel
        return self.centres(p)[1] + [(Acc("s", n), Acc("f", n)) for n in self.row_reds
                          if n not in self.cen and n not in self.onl
                          and _blocked(self.kind(n), self.stage(n, p))
                          and reads_element(graph, kernel, n)] + [
            (Acc("q", n), Acc("f", n)) for n in kernel.partials
            if self.kinds[n] == "all" and self.kind(n) in ("sum", "mean")
            and reads_element(graph, kernel, n)
            and self.sch.phase.get(value_args(graph, n)[0], 0) == p]

    def loads(self, used: set[tuple[int, str]]) -> list[Load]:
        """The loads, at the loop's element, of the input slots in ``used`` read per
        element or per column."""
        return [Load(j, a) for j, (x, a) in enumerate(self.slots)
                if (x, a) in used and a in (PER_ELEMENT, PER_COL)]

    def online_in(self, p: int) -> list[int]:
        """The online sums pass ``p`` accumulates."""
        return [n for n in self.row_reds if n in self.onl and self.sch.phase[n] == p]

    def onlines(self, p: int) -> list[Online]:
        """The :class:`Online` s of pass ``p``: each reads its value from the input slot
        its max reads, or from the max's stage row (an element value)."""
        out = []
        for n in self.online_in(p):
            o = self.onl[n]
            x, m = o.value
            acc = Acc("m", n) if self.own_max(n) else Acc("s", m)
            weight = -1 if o.weight is None else \
                self.slots.index((o.weight[0], access(self.graph, self.kernel, o.weight[1],
                                                      o.weight[0])))
            if x in self.lv:
                out.append(Online(n, acc, buffer=Buffer("stage", m), weight=weight))
            else:
                out.append(Online(n, acc, slot=self.slots.index((x, access(self.graph,
                                                                           self.kernel, m, x))),
                                  weight=weight))
        return out

    def centred_in(self, p: int) -> list[int]:
        """The centred sums pass ``p`` accumulates."""
        return [n for n in self.row_reds if n in self.cen and self.sch.phase[n] == p]

    def centres(self, p: int) -> tuple[list[Centre], list[tuple[None, Acc]], list]:
        """CPU: the :class:`Centre` s of pass ``p``; the block sums of their values it
        adds (``(None, block's sum)``: no row sum), a value summed once (a row sum or
        mean of it in the pass serves); the statements staging the values, each once,
        and adding them to those sums."""
        if p in self._centres:
            return self._centres[p]
        graph, kernel = self.graph, self.kernel
        sums = {value_args(graph, n)[0]: (Acc("s", n), Acc("f", n)) for n in self.row_reds
                if n not in self.cen and self.kind(n) in ("sum", "mean")
                and self.first_pass(n) == p and reads_element(graph, kernel, n)}
        stores = any(self.lv[o] == ELEMENT and self.sch.phase[o] == p for o in kernel.outputs)
        staged_at: dict[int, tuple[Buffer, int | None]] = {}
        centres, own, body = [], [], []
        for n in self.centred_in(p):
            buffers, accs, slots = [], [], []
            for k, (v, _) in enumerate(reduced_values(graph, self.sch, n)):
                if v not in staged_at:
                    a = None if v in self.lv else access(graph, kernel, n, v)
                    slot = self.slots.index((v, a)) if not stores and a in (
                        PER_ELEMENT, PER_COL) else None
                    staged_at[v] = (Buffer("stage", n, k), slot)
                    body.append(Stage(n, k, blocks=slot is None))
                if v not in sums:
                    sums[v] = (None, Acc(("fa", "fb")[k], n))
                    own.append(sums[v])
                    body.append(Update(n, "sum", 0, sums[v][1], arg=k))
                buffers.append(staged_at[v][0])
                slots.append(staged_at[v][1])
                accs.append(sums[v])
            centres.append(Centre(n, tuple(buffers), tuple(accs), tuple(slots)))
        self._centres[p] = (centres, own, body)
        return self._centres[p]

    def updated(self, p: int) -> tuple[list[int], list[int]]:
        """The row reductions (other than centred sums) and the partials pass ``p``
        updates."""
        graph, kernel, sch = self.graph, self.kernel, self.sch
        rows = [n for n in self.row_reds if n not in self.cen
                and (n not in self.onl or self.own_max(n)) and 0 <= p - self.first_pass(n)
                < self.passes_of(n) and reads_element(graph, kernel, n)]
        parts = [n for n in kernel.partials if reads_element(graph, kernel, n)
                 and sch.phase.get(value_args(graph, n)[0], 0) == p]
        return rows, parts

    def slots_used(self, p: int) -> set[tuple[int, str]]:
        """The (value, access) of the input slots pass ``p`` reads: its element values'
        and the values its reductions reduce."""
        graph, kernel = self.graph, self.kernel
        used = {(x, access(graph, kernel, n, x)) for n in self.sch.work[p]
                for x in value_args(graph, n) if x not in self.lv}
        reds = [n for ns in self.updated(p) for n in ns] + self.centred_in(p) + \
            [n for n in self.online_in(p) if not self.own_max(n)]
        return used | {(x, access(graph, kernel, r, x)) for n in reds
                       for x, r in reduced_values(graph, self.sch, n) if x not in self.lv}

    def prefetch_pass(self, streamed: list[int]) -> tuple[int | None, bool]:
        """CPU: the pass that prefetches the next row's elements, a block at a time, so
        memory delivers them while this row computes (rows of a page or more start
        cold: the hardware's prefetchers stop at page boundaries), and whether it
        streams its own row.  Of the passes in blocks that read nothing from memory
        themselves, the one with the most arithmetic to hide the hints' loop in (layer
        norm's variance pass, a subtraction and a square per element, ran 5-10 % slower
        with it); it prefetches the next row's inputs, and its element outputs for
        writing (one thread, rows of 1024: softmax's fused fwd_bwd 1.26x, session 18;
        :data:`PREFETCH_ROWS`).  Where every pass in blocks reads the row first, one
        with centred sums, whose second loop over each block reads only the block, in
        cache: it reads its inputs ahead of the hardware's prefetchers while it streams
        them (layer norm's statistics pass; RMS norm's first pass, a sum of squares,
        ran 0.89x with the next row's hints), :data:`PREFETCH_AHEAD`.  A pass without
        sums is not run in blocks for the hints (RMS norm's last pass: 0.75-0.88x in
        blocks)."""
        sch = self.sch
        streamed_slots = [self.slots[j] for j in streamed]
        seen: set[tuple[int, str]] = set()
        fresh = []                                  # per pass: its first reads of the row
        for p in range(sch.passes):
            used = self.slots_used(p)
            fresh.append(sum(1 for s in streamed_slots if s in used and s not in seen))
            seen |= used
        blocked = [p for p in range(sch.passes) if self.blocked_sums(p)]
        quiet = [p for p in blocked if not fresh[p]]
        candidates = quiet or [p for p in blocked if self.centred_in(p)]
        best = max(candidates, key=lambda p: (_arithmetic(self.graph, sch.work[p]), -p),
                   default=None)
        return best, not quiet

    def body(self, p: int, block: dict[Acc, Acc]) -> list:
        """The statements of pass ``p`` per element, in order: input loads, loads back,
        computes, stores to scratch, reduction updates, stores to outputs."""
        kernel, sch = self.kernel, self.sch
        used = self.slots_used(p)
        body: list = self.loads(used)
        # an element value stored in an earlier pass is read back from its output's
        # row (in cache: a reduce kernel never writes an input's memory), or scratch
        body += [LoadBack(n, Buffer("scratch" if n in sch.scratch else "output", n))
                 for n in sch.loads[p]]
        body += [Compute(n) for n in sch.work[p]]
        body += [Store(n, Buffer("scratch", n)) for n in sch.scratch if sch.phase[n] == p]
        body += self.centres(p)[2] if self.cpu else []
        body += [Stage(o.buffer.node) for o in self.onlines(p) if o.buffer is not None]
        rows, parts = self.updated(p)
        for n in rows:
            k, kind = self.stage(n, p), self.kind(n)
            acc = Acc("m", n) if ROW_PASSES[kind] == 2 and k == 0 else Acc("s", n)
            body.append(Update(n, kind, k, block.get(acc, acc),
                               self.cpu and (kind in ("max", "min") or ROW_PASSES[kind] == 2)))
        for n in parts:
            kind, cols = self.kind(n), self.kinds[n] == "cols"
            if cols:
                acc = Acc("g" if self.cpu and kind in ("sum", "mean") else
                          "q" if self.cpu else "p", n, True)
            else:
                acc = Acc("q", n)
            body.append(Update(n, kind, 0, block.get(acc, acc)))
        body += [Store(n, Buffer("output", n)) for n in kernel.outputs
                 if self.lv[n] == ELEMENT and sch.phase[n] == p]
        return body


def stores_output(body: list) -> bool:
    """Whether a pass's ``body`` stores to an output, whose row may lie near another
    array's (the kernel's own rows lie :data:`APART`): then its sums run in a loop of
    their own (:func:`staged`), and its centred sums in Chan's blocks, not about pivots
    (one loop with the sums: :data:`PIVOT`)."""
    return any(isinstance(s, Store) and s.buffer.kind == "output" for s in body)


def staged(graph: Graph, sch: Schedule, body: list) -> tuple[list, list[tuple[Update, Buffer]]]:
    """CPU: ``body`` with its reassociated sums (and products) moved to a second loop
    where it stores to an output; and the sums moved, each with the buffer its second
    loop reads the value from: the output or scratch row the body stores it in, else
    its stage row (a :class:`Stage` in the body where the sum was).

    LLVM vectorises a loop that stores behind a run-time check that its stores do not
    overlap the memory it reads a few iterations ahead, and runs the scalar loop
    where they might: where two arrays lie within a vector's reach of each other
    (small temporaries next to each other on the heap, an output written in place of
    an input).  Both loops give the same elements, but a sum flagged reassoc adds in
    another order in each: a row's sum, and all that follows from it, would change in
    its last bit with the addresses of the arrays (PyTorch's ``gradgradcheck`` saw the
    second derivative of a softmax change between two identical calls).  A loop that
    only loads and sums has no such check: one order for given sizes.  A pass that
    stores only to the kernel's own rows keeps its sums: those rows lie :data:`APART`
    from every other array, so its check never fails.  (An input is staged too:
    written in place, its row holds the outputs by then.)"""
    if not stores_output(body):
        return body, []
    stored = {s.node: s.buffer for s in body if isinstance(s, Store)}
    there = {Buffer("stage", s.node, s.arg) for s in body if isinstance(s, Stage)}
    moved = [(s, stored.get(reduced_values(graph, sch, s.node)[s.arg][0],
                            Buffer("stage", s.node, s.arg)))
             for s in body if isinstance(s, Update) and not s.acc.column and s.reassoc]
    staged_at = dict(moved)
    rest = []
    for s in body:
        b = staged_at.get(s)
        if b is None:
            rest.append(s)
        elif b.kind == "stage" and b not in there:
            rest.append(Stage(s.node, s.arg))
            there.add(b)
    return rest, moved


def deferred(sch: Schedule, passes: list[Pass]) -> None:
    """CPU: move an element output's store out of a pass with sums that LLVM adds in
    its own order (which :func:`staged` would run in a second loop) into the later pass
    that reads the output back, where that pass has no such sums: the pass keeps the
    value in a scratch row instead, one whose own value it reads for the last time (at
    the same element, before the store), and the later passes read it from there.

    No row more: softmax's ``fwd_bwd`` keeps ``exp(x - max)`` in scratch for its third
    pass, which computes ``y``, sums ``y * dy`` and stored ``y`` for the fourth, which
    reads it back for ``dx``; now the third stores ``y`` over the ``exp`` and the fourth
    stores ``y`` and ``dx``. The third pass's sum runs in its loop, not in a second one
    over a stage row, and the row's working set stays five rows (four of the arrays,
    the scratch row). Rows of 1024 float32, two threads: 1.2-1.35x (a new scratch row
    for ``y`` instead: 1.0x, the sixth row crowds the L1 cache)."""
    taken: set[int] = set()
    for p, ps in enumerate(passes):
        if not _summing(ps.body):
            continue
        for k, s in enumerate(ps.body):
            if not (isinstance(s, Store) and s.buffer.kind == "output"):
                continue
            back = LoadBack(s.node, s.buffer)
            later = [q for q in range(p + 1, len(passes)) if back in passes[q].body]
            if not later or _summing(passes[later[0]].body):
                continue
            free = [m for m in sch.scratch if m not in taken
                    and LoadBack(m, Buffer("scratch", m)) in ps.body
                    and not any(_uses(passes[q].body, Buffer("scratch", m))
                                for q in range(p + 1, len(passes)))]
            if not free:
                continue
            taken.add(free[0])
            row = Buffer("scratch", free[0])
            ps.body[k] = Store(s.node, row)
            for q in later:
                passes[q].body = [LoadBack(s.node, row) if t == back else t
                                  for t in passes[q].body]
            passes[later[0]].body.append(s)


def hosted(scratch: list[int], outputs: list[int], passes: list[Pass]) -> dict[int, int]:
    """CPU: the scratch rows that a call whose outputs lie apart from every other array
    keeps in an output's row instead (scratch node -> output node), and the passes
    rewritten for it: a row the kernel allocates for itself is a row more in the cache
    per row (softmax's and log-softmax's ``exp``, cross-entropy's).

    An output ``h`` hosts scratch row ``m`` where no pass before the last that uses the
    row stores or reads ``h``'s output, and that last pass, if it stores ``h``, has no
    sums left to LLVM's order: there ``h`` is stored through the scratch row too (unless
    the row holds it already, a :func:`deferred` value), and its store to the output
    is ``hosted``, skipped where the row is the output's. The kernel decides per call
    (the wrapper's ``out=`` may be an input, or small arrays lie side by side): the
    passes read and write the scratch row through one name, either row, so that a pass
    is one loop whatever the call, and its sums' bits do not depend on it; a row that
    lay within a vector's reach of another array that a loop reads would make LLVM run
    the scalar loop (:func:`staged`)."""
    hosts: dict[int, int] = {}
    for m in scratch:
        row = Buffer("scratch", m)
        last = max((p for p, ps in enumerate(passes) if _uses(ps.body, row)), default=None)
        if last is None:
            continue
        body = passes[last].body
        # an output the row holds already (deferred there) first: no store more
        for h in sorted(outputs, key=lambda h: LoadBack(h, row) not in body):
            out = Buffer("output", h)
            if h in hosts.values() or any(_uses(ps.body, out) for ps in passes[:last]):
                continue
            stores = [s for s in body if isinstance(s, Store) and s.buffer == out]
            if stores and _summing(body) or LoadBack(h, out) in body:
                continue
            kept = LoadBack(h, row) in body
            rewritten: list = []
            for s in body:
                if s in stores:
                    rewritten += [] if kept else [Store(h, row)]
                    rewritten.append(Store(h, out, hosted=True))
                else:
                    rewritten.append(s)
            passes[last].body = rewritten
            hosts[m] = h
            break
    return hosts


def _summing(body: list) -> bool:
    """Whether a pass's statements update a sum in LLVM's order (:attr:`Update.reassoc`;
    a column's sum across rows is not one: each element its own)."""
    return any(isinstance(s, Update) and not s.acc.column and s.reassoc for s in body)


def _uses(body: list, buffer: Buffer) -> bool:
    """Whether a pass's statements read or write ``buffer``."""
    return any(isinstance(s, (LoadBack, Store)) and s.buffer == buffer for s in body)


def _blocked(kind: str, k: int) -> bool:
    """Whether pass ``k`` of a row reduction of ``kind`` is a sum run in blocks."""
    return (kind in ("sum", "mean") and k == 0) or (kind in ("logsumexp", "norm") and k == 1)


def _arithmetic(graph: Graph, nodes) -> int:
    """A rough cost of computing ``nodes`` per element: 1 per cheap primitive, 10 per
    costly one (transcendental, division: ``gradc.passes.fuse.CHEAP``)."""
    return sum(1 if graph.node(n).op in CHEAP else 10 for n in nodes)
