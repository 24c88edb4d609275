"""The schedule stage of reduce kernels, shared by the CPU and CUDA printers.

A :class:`~gradc.passes.fuse_reduce.ReduceKernel` runs per row a number of
passes over the row's elements (:func:`schedule`): which element values each
pass computes, which it reads back from memory (a value an earlier pass
stored), which row values are available before it; and how each node reads
the values from outside the kernel (:func:`access`, :func:`input_slots`:
once per kernel, per row, per column or per element); on the CPU, which row
sums are centred sums that need no pass for their mean first
(:func:`centred_sums`).  The loops, their blocks, prefetch hints and memory are
decided from the schedule by
:func:`gradc.passes.loop_ir.lower`, whose loop IR the backends print
(:mod:`gradc.codegen.cpu_reduce`, :mod:`gradc.codegen.cuda_reduce`), with
the names and node values of :class:`KernelNames` and the reduction lines
both share (:func:`shift_line`, :func:`accumulate_line`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gradc.ir.graph import Graph
from gradc.ir.shapes import normalize_axis
from gradc.passes.fuse import CHEAP
from gradc.passes.fuse_reduce import (ELEMENT, ROW, ROW_PASSES, ReduceKernel, col_forms,
                                      is_reduction, row_forms, value_args)
from gradc.passes.simplify import minus_inf_only_with

SCALAR, PER_ROW, PER_COL, PER_ELEMENT = "scalar", "row", "col", "element"


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


@dataclass(frozen=True)
class CentredSum:
    """Row reduction ``node`` (``kind`` "sum" or "mean") of ``h * (x - mean(x))`` or
    ``(x - mean(x)) * (z - mean(z))`` times row values ``factors``: the co-moment
    ``sum((a - mean(a)) * (b - mean(b)))`` of the element values ``values`` (``(a,
    reader), (b, reader)``: the node, and the kernel node reading it where it is an
    outside value), times the factors (divided by the row's size for a mean).  The
    two are equal (the centred values sum to zero), and the co-moment needs no mean
    first: each block of a row gives its own, combined with Chan's formula, so the
    reduction runs in the pass that sums ``x`` for ``mean(x)`` (layer norm's variance
    and its backward's ``mean(g * xhat)`` in its first pass).  Where the co-moment is
    not finite (an infinity, NaN, an overflow), the row's value is computed again as
    written (:func:`fallback_chain`), so it is NumPy's ``inf`` or ``NaN``."""
    node: int
    kind: str
    values: tuple[tuple[int, int], ...]
    factors: tuple[int, ...]


def row_sums(graph: Graph, kernel: ReduceKernel):
    """The row sums and means of ``kernel`` over element values: ``(node, kind, operand)``."""
    lv = dict(kernel.levels)
    for n in kernel.nodes:
        op = graph.node(n).op
        if lv[n] == ROW and op in ("sum", "mean") and reads_element(graph, kernel, n):
            yield n, op, value_args(graph, n)[0]


def centred_sums(graph: Graph, kernel: ReduceKernel) -> dict[int, CentredSum]:
    """The row sums and means of ``kernel`` that are :class:`CentredSum` s."""
    lv = dict(kernel.levels)
    found: dict[int, CentredSum] = {}
    for n, kind, x in row_sums(graph, kernel):
        if lv.get(x) != ELEMENT:
            continue
        parts = _product(graph, kernel, x)
        if parts is None:
            continue
        centred, elements, factors = parts
        if len(centred) == 1 and len(elements) == 1:
            values = (elements[0], centred[0])
        elif len(centred) == 2 and not elements:
            values = tuple(centred)
        else:
            continue
        found[n] = CentredSum(n, kind, values, tuple(factors))
    return found


def _product(graph: Graph, kernel: ReduceKernel, e: int, reader: int | None = None):
    """The factors of element value ``e``, a product: ``(centred, elements,
    factors)``: ``(x, reader)`` of each ``x - mean(x)``, ``(h, reader)`` of each other
    element value (a product of such values as one), the row values; None where a
    factor is neither (a constant)."""
    lv = dict(kernel.levels)
    node = graph.node(e)
    level = lv.get(e)
    if level == ROW:
        return [], [], [e]
    if level == ELEMENT and node.op == "broadcast_in" and lv.get(node.args[0]) == ROW:
        return [], [], [node.args[0]]
    if level == ELEMENT and node.op == "square" and _centre(graph, kernel, node.args[0]):
        return [_centre(graph, kernel, node.args[0])] * 2, [], []
    if level == ELEMENT and _centre(graph, kernel, e):
        return [_centre(graph, kernel, e)], [], []
    if level == ELEMENT and node.op == "mul":
        parts = [_product(graph, kernel, a, e) for a in node.args]
        if any(p is None for p in parts):
            return None
        if not any(c or f for c, _, f in parts):
            return [], [(e, reader)], []            # a product of element values: one
        return tuple(sum((list(p[k]) for p in parts), []) for k in range(3))
    if level == ELEMENT or (level is None and node.op != "const"
                            and access(graph, kernel, reader, e) in (PER_ELEMENT, PER_COL)):
        return [], [(e, reader)], []
    return None


def _centre(graph: Graph, kernel: ReduceKernel, v: int) -> tuple[int, int] | None:
    """``(x, v)`` where element node ``v`` is ``x - mean(x)`` (the row's mean)."""
    lv = dict(kernel.levels)
    node = graph.node(v)
    if lv.get(v) != ELEMENT or node.op != "sub":
        return None
    x, m = node.args
    if graph.node(m).op == "broadcast_in" and lv.get(m) == ELEMENT:
        m = graph.node(m).args[0]
    if lv.get(m) != ROW or graph.node(m).op != "mean" or value_args(graph, m)[:1] != [x] \
            or not reads_element(graph, kernel, m):
        return None
    return x, v


@dataclass(frozen=True)
class OnlineSum:
    """Row reduction ``node`` (``kind`` "sum" or "mean") of ``exp(x - h)``, or a
    ``logsumexp`` of ``x - h``, where ``h`` is the sum of the row values ``shift`` (one,
    or two subtracted in turn: ``(x - h1) - h2``), each computed from the row's max of
    the same ``x``, ``max``, and nothing else but constants (softmax's
    ``sum(exp(x - max(x)))``, a logsumexp's sum as its derivative writes it, the
    built-in ``log_softmax``'s ``logsumexp(x - max(x))`` and its derivative's sum); or a
    ``logsumexp`` of ``x`` (its own max and shift: ``max`` is the node, ``shift``
    None).  ``value`` is ``(x, reader)`` (the node, and the kernel node reading it where
    it is an outside value).  It can run in the pass of the max, online (Milakov and
    Gimelshein's online softmax): each block of a row sums ``exp(x - k)`` with ``k``
    the row's max so far where finite (else 0), the row's sum so far rescaled by
    ``exp(k_old - k)`` when ``k`` changes; after the pass the sum is scaled by ``exp(k -
    h)`` (1 where they are equal, as they are for a finite max), a logsumexp is
    ``log(sum) + k - h`` (``+ k`` with its own max).  One read of the row fewer than the
    max, then the sum; where the max or ``h`` is infinite or NaN, the product gives what
    the sum as written gives (inf, NaN, 0), but for a sum of 0 (a row of -inf) or inf (a
    +inf in it) with a finite ``h``, which is kept (``0 * exp(1000)`` would be NaN).

    A weighted one (``weight``: ``(g, reader)``, an outside value read per element by
    the node ``reader``) sums ``exp(x - h) * g`` times row values: negated where
    ``negated``, times the row values ``factors``, over the row values ``divisors``
    (softmax's ``sum(y * dy)`` with ``y = e / sum(e)``; the built-in softmax's
    derivative ``sum(-dy * e / s / s)``): the same loop adds ``exp(x - k) * g`` beside
    the plain sum's ``exp(x - k)``, the exp taken once; after the pass the sum is
    scaled as the plain one's, then by the row values (the sum in the pass of the max:
    softmax's fused ``fwd_bwd`` and ``vjp`` in two passes).  ``exp``: the exp node
    summed (-1 for a logsumexp)."""
    node: int
    kind: str
    max: int
    value: tuple[int, int]
    shift: tuple[int, ...] | None
    exp: int = -1
    weight: tuple[int, int] | None = None
    negated: bool = False
    factors: tuple[int, ...] = ()
    divisors: tuple[int, ...] = ()


def online_sums(graph: Graph, kernel: ReduceKernel) -> dict[int, OnlineSum]:
    """The row sums, means and logsumexps of ``kernel`` that are :class:`OnlineSum` s."""
    lv = dict(kernel.levels)
    maxima = {value_args(graph, n)[0]: n for n in kernel.nodes
              if lv[n] == ROW and graph.node(n).op == "max" and reads_element(graph, kernel, n)}
    found: dict[int, OnlineSum] = {}
    for n in kernel.nodes:
        if lv[n] == ROW and graph.node(n).op == "logsumexp" and reads_element(graph, kernel, n):
            x = value_args(graph, n)[0]
            shifted = _shifted(graph, kernel, x, maxima)
            found[n] = (OnlineSum(n, "logsumexp", shifted[1], (shifted[0], shifted[1]),
                                  shifted[2]) if shifted else
                        OnlineSum(n, "logsumexp", n, (x, n), None))
    sums = list(row_sums(graph, kernel))
    for n, kind, e in sums:
        if lv.get(e) != ELEMENT or graph.node(e).op != "exp":
            continue
        shifted = _shifted(graph, kernel, graph.node(e).args[0], maxima)
        if shifted:
            x, m, h = shifted
            found[n] = OnlineSum(n, kind, m, (x, m), h, exp=e)
    for n, kind, e in sums:
        weighted = None if n in found else _weighted(graph, kernel, e, maxima)
        if weighted:
            found[n] = weighted(n, kind)
    return found


def _weighted(graph: Graph, kernel: ReduceKernel, e: int, maxima: dict[int, int]):
    """Where element node ``e`` is a product of one ``exp(x - h)``, one outside value
    ``g`` read per element, and row values, with negations and divisions by row
    values (:func:`_factors`; softmax's ``exp(x - h) / r * g``, the built-in softmax's
    derivative ``zero_masked(-g * exp(x - h) / r / r, g)``), a function of the sum's
    node and kind giving its weighted :class:`OnlineSum`; else None."""
    got = _factors(graph, kernel, e)
    if got is None or got[0] is None or got[1] is None:
        return None
    p, weight, negated, factors, divisors = got
    shifted = _shifted(graph, kernel, graph.node(p).args[0], maxima)
    if not shifted:
        return None
    x, m, h = shifted
    return lambda n, kind: OnlineSum(n, kind, m, (x, m), h, exp=p, weight=weight,
                                     negated=negated, factors=factors, divisors=divisors)


def _factors(graph: Graph, kernel: ReduceKernel, e: int):
    """``(exp, (g, reader), negated, factors, divisors)`` where element node ``e`` is
    ``exp`` (an exp node) times ``g`` (an outside value, read per element by
    ``reader``; each at most once, else None), negated or not, times the row values
    ``factors`` over the row values ``divisors`` (broadcast back, as a row kernel
    reads them); a ``zero_masked`` is read as its value (it differs only where the
    value is NaN, which the weighted sum's fallback takes again as written); None
    where ``e`` is not such a product."""
    lv = dict(kernel.levels)

    def row_value(v: int) -> int | None:
        if graph.node(v).op == "broadcast_in" and lv.get(v) == ELEMENT:
            v = graph.node(v).args[0]
        return v if lv.get(v) == ROW else None

    def walk(v: int, reader: int):
        node = graph.node(v)
        if v not in lv:
            if access(graph, kernel, reader, v) != PER_ELEMENT:
                return None
            return None, (v, reader), False, (), ()
        if lv[v] != ELEMENT:
            return None
        if node.op == "exp":
            return v, None, False, (), ()
        if node.op in ("neg", "zero_masked"):
            inner = walk(node.args[0], v)
            return inner and (*inner[:2], inner[2] != (node.op == "neg"), *inner[3:])
        if node.op == "div" and row_value(node.args[1]) is not None:
            inner = walk(node.args[0], v)
            return inner and (*inner[:4], (*inner[4], row_value(node.args[1])))
        if node.op != "mul":
            return None
        a, b = node.args
        for u, r in ((a, b), (b, a)):
            if row_value(r) is not None:
                inner = walk(u, v)
                return inner and (*inner[:3], (*inner[3], row_value(r)), inner[4])
        left, right = walk(a, v), walk(b, v)
        if not left or not right or (left[0] and right[0]) or (left[1] and right[1]):
            return None
        return (left[0] or right[0], left[1] or right[1], left[2] != right[2],
                left[3] + right[3], left[4] + right[4])

    return walk(e, e) if lv.get(e) == ELEMENT else None


def _shifted(graph: Graph, kernel: ReduceKernel, d: int,
             maxima: dict[int, int]) -> tuple[int, int, tuple[int, ...]] | None:
    """``(x, m, hs)`` where element node ``d`` is ``x`` less the row values ``hs``
    (``x - h``, or ``(x - h1) - h2``: a logsumexp's derivative of the built-in
    log_softmax's ``x - max(x)``), each computed from the row's max ``m`` of ``x``
    (:func:`_shift_of`; ``maxima``: the kernel's row maxima by the value they reduce)
    and -inf only where ``m`` is (``gradc.passes.simplify.minus_inf_only_with``: the
    online form cannot tell a row holding -inf, whose ``x - h`` is NaN there where ``h``
    is -inf, from one that does not; where ``m`` is -inf, every ``x`` is)."""
    lv = dict(kernel.levels)
    if lv.get(d) != ELEMENT or graph.node(d).op != "sub":
        return None
    x, h = graph.node(d).args
    if graph.node(h).op == "broadcast_in" and lv.get(h) == ELEMENT:
        h = graph.node(h).args[0]
    if lv.get(h) != ROW:
        return None
    if x not in maxima:
        inner = _shifted(graph, kernel, x, maxima)
        if inner is None or len(inner[2]) > 1 or not _shift_of(graph, kernel, h, inner[1]) \
                or not minus_inf_only_with(graph, h, inner[1]):
            return None
        return inner[0], inner[1], (*inner[2], h)
    if not _shift_of(graph, kernel, h, maxima[x]) or not minus_inf_only_with(graph, h, maxima[x]):
        return None
    return x, maxima[x], (h,)


def known_maxima(graph: Graph, kernel: ReduceKernel) -> dict[int, tuple[int, int]]:
    """``{n: (m, h)}``: the ``logsumexp`` s of ``kernel`` of ``x - h`` (the built-in
    ``log_softmax``'s), ``h`` a row value of the row's max ``m`` of ``x`` that is -inf
    only where ``m`` is: the logsumexps of :func:`online_sums` with one shift.  Their
    max, of ``x - h``, is ``m - h``, the same bits
    (``gradc.passes.simplify._shifted_max``): taken from it, they need no pass for
    their max, only the one for their sum (CUDA, and the CPU's other form than the
    online one, which takes them in the pass of ``m``)."""
    return {n: (o.max, o.shift[0]) for n, o in online_sums(graph, kernel).items()
            if o.kind == "logsumexp" and o.shift is not None and len(o.shift) == 1}


def _shift_of(graph: Graph, kernel: ReduceKernel, h: int, m: int) -> bool:
    """Whether row value ``h`` is computed from the max ``m`` (or is it) and constants
    only, through row values of no other reduction."""
    lv = dict(kernel.levels)
    seen, todo, found = set(), [h], False
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v == m:
            found = True
        elif lv.get(v) == ROW and not is_reduction(graph, v):
            todo += value_args(graph, v)
        elif v in lv or not graph.node(v).shape.is_scalar:
            return False
    return found


@dataclass
class Schedule:
    """When each value of a reduce kernel is computed (see :func:`schedule`)."""

    passes: int
    phase: dict[int, int] = field(default_factory=dict)     # element node -> pass
    centred: dict[int, CentredSum] = field(default_factory=dict)  # and its pass in phase
    online: dict[int, OnlineSum] = field(default_factory=dict)    # and its pass in phase
    known: dict[int, tuple[int, int]] = field(default_factory=dict)  # lse -> (max, shift)
    avail: dict[int, int] = field(default_factory=dict)     # row node -> before pass
    work: list[list[int]] = field(default_factory=list)     # element nodes per pass
    live: set[int] = field(default_factory=set)
    loads: list[list[int]] = field(default_factory=list)    # element nodes read back per pass
    scratch: list[int] = field(default_factory=list)        # element nodes kept in scratch


def reduction_kind(graph: Graph, nid: int) -> str:
    """The reduction node ``nid`` computes (``sum_to`` is a sum)."""
    op = graph.node(nid).op
    return "sum" if op == "sum_to" else op


def row_passes(graph: Graph, sch: Schedule, n: int) -> int:
    """The passes row reduction ``n`` of a schedule reads its operand in: one for an
    online sum or a logsumexp whose max is known (:func:`known_maxima`), else its
    kind's (``ROW_PASSES``)."""
    if n in sch.online or n in sch.known:
        return 1
    return ROW_PASSES[reduction_kind(graph, n)]


def schedule(graph: Graph, kernel: ReduceKernel, scratch: bool = True,
             centred: bool = True, online: bool = False) -> Schedule:
    """Passes over a row: an element node runs in the pass after every row
    reduction it depends on has finished; a row reduction of an element value
    of pass ``p`` accumulates in passes ``p .. p + ROW_PASSES - 1`` and its value
    is available from the next; a row node is computed before the first pass
    in which all its operands are.  Only values that reach an output or a used
    partial are computed (``live``); element values a pass needs from earlier
    passes are recomputed (the row is in cache), not stored, or read back from
    the kernel's own output rows where they are outputs.  With ``scratch``
    (the CPU's), costly ones are kept in a row of scratch memory instead
    (``Schedule.scratch``).  With ``centred`` (the CPU's), a :class:`CentredSum`
    accumulates in the pass its element values are computed in (``phase``), not
    after the mean it is centred by, and is available after it and its factors.  With
    ``online`` (the CPU's form for long rows), an :class:`OnlineSum` accumulates in the
    pass of its max, and is available after it and its shift.  A logsumexp of
    :func:`known_maxima` (not online) takes one pass, its sum."""
    lv = dict(kernel.levels)
    inside = set(kernel.nodes)
    cen = centred_sums(graph, kernel) if centred else {}
    onl = online_sums(graph, kernel) if online else {}
    kno = {n: v for n, v in known_maxima(graph, kernel).items() if n not in onl}
    live = set(kernel.outputs) | set(kernel.partials)
    for n in reversed(kernel.nodes):
        if n in live:
            live.update(a for a in _reads(graph, kernel, cen, onl, n) + list(kno.get(n, ()))
                        if a in inside)
    sch = Schedule(passes=0, live=live)
    sch.centred = {n: c for n, c in cen.items() if n in live}
    sch.online = {n: o for n, o in onl.items() if n in live}
    sch.known = {n: v for n, v in kno.items() if n in live}
    for n in kernel.nodes:
        ins = [a for a in value_args(graph, n) if a in inside]
        if lv[n] == ELEMENT:
            sch.phase[n] = max([sch.phase[a] if lv[a] == ELEMENT else sch.avail[a]
                                for a in ins], default=0)
        elif lv[n] == ROW:
            if n in sch.online and sch.online[n].shift is None:     # a logsumexp
                x = sch.online[n].value[0]
                sch.phase[n] = sch.phase.get(x, 0) if lv.get(x) == ELEMENT else 0
                sch.avail[n] = sch.phase[n] + 1
            elif n in sch.online:
                o = sch.online[n]
                sch.phase[n] = sch.avail[o.max] - 1
                sch.avail[n] = max(sch.avail[o.max], *(sch.avail[h] for h in o.shift),
                                   *(sch.avail[r] for r in o.factors + o.divisors))
            elif n in sch.centred:
                c = sch.centred[n]
                sch.phase[n] = max(sch.phase.get(v, 0) for v, _ in c.values)
                sch.avail[n] = max([sch.phase[n] + 1] + [sch.avail[f] for f in c.factors])
            elif is_reduction(graph, n):
                x = ins[0] if ins else None
                start = sch.phase.get(x, 0) if x is not None and lv[x] == ELEMENT else 0
                sch.avail[n] = start + row_passes(graph, sch, n)
            else:
                sch.avail[n] = max([sch.avail[a] for a in ins], default=0)
    need_e = [sch.phase[n] + 1 for n in live if lv[n] == ELEMENT]
    need_r = [sch.avail[n] for n in live if lv[n] == ROW]
    sch.passes = max(need_e + need_r + [1])
    outputs = {n for n in kernel.outputs if lv[n] == ELEMENT}
    _fill_work(graph, kernel, sch, outputs)
    # A costly element value a later pass needs again is kept in a row of scratch
    # memory (in cache) rather than computed again: softmax's exp once per element.
    if not scratch:
        return sch
    again = {n for p, work in enumerate(sch.work) for n in work
             if sch.phase[n] < p and graph.node(n).op not in _RECOMPUTE}
    if again:
        sch.scratch = [n for n in kernel.nodes if n in again]
        _fill_work(graph, kernel, sch, outputs | again)
    return sch


def _reads(graph: Graph, kernel: ReduceKernel, cen: dict[int, CentredSum],
           onl: dict[int, OnlineSum], n: int) -> list[int]:
    """The values node ``n`` reads: a centred sum's values and factors, and the row
    values its operand reads (its means: for :func:`fallback_chain`); an online sum's
    value, max, shift and the row values it is scaled by."""
    if n in onl and onl[n].shift is not None:
        o = onl[n]
        return [o.value[0], o.max, *o.shift, *o.factors, *o.divisors]
    if n in cen:
        lv = dict(kernel.levels)
        return [v for v, _ in cen[n].values] + list(cen[n].factors) + [
            a for m in fallback_chain(graph, kernel, n)
            for a in value_args(graph, m) if lv.get(a) == ROW]
    return value_args(graph, n)


def fallback_chain(graph: Graph, kernel: ReduceKernel, n: int) -> list[int]:
    """The element nodes that compute the operand of reduction ``n`` from outside and
    row values (the operand included), in the kernel's (topological) order: a
    centred sum's operand as written, computed again where its co-moment is not
    finite."""
    lv = dict(kernel.levels)
    chain, todo = set(), [value_args(graph, n)[0]]
    while todo:
        v = todo.pop()
        if lv.get(v) == ELEMENT and v not in chain:
            chain.add(v)
            todo += value_args(graph, v)
    return [m for m in kernel.nodes if m in chain]


def reduced_values(graph: Graph, sch: Schedule, n: int) -> tuple[tuple[int, int], ...]:
    """``(value, reader)`` of each value reduction ``n`` reduces (a
    :class:`CentredSum`'s two, distinct ones once; an :class:`OnlineSum`'s ``x``; else
    its operand, read by ``n``)."""
    if n in sch.online:
        return (sch.online[n].value,)
    if n in sch.centred:
        a, b = sch.centred[n].values
        return (a,) if a[0] == b[0] else (a, b)
    return ((value_args(graph, n)[0], n),)


def rows_ready(kernel: ReduceKernel, sch: Schedule, before: int, done: set[int]) -> list[int]:
    """The live row nodes available before pass ``before`` (their reductions finished)
    that are not in ``done``, in order; adds them to ``done``."""
    lv = dict(kernel.levels)
    ready = [n for n in kernel.nodes if lv[n] == ROW and n not in done and n in sch.live
             and sch.avail[n] <= before]
    done.update(ready)
    return ready


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
            if n in sch.centred:
                if sch.phase[n] == p:
                    seeds.update(v for v, _ in sch.centred[n].values if lv.get(v) == ELEMENT)
                continue
            if n in sch.online:
                x = sch.online[n].value[0]
                if sch.phase[n] == p and lv.get(x) == ELEMENT:
                    seeds.add(x)
                continue
            if not is_reduction(graph, n):
                continue
            xs = [a for a in value_args(graph, n) if a in inside and lv[a] == ELEMENT]
            if not xs:
                continue
            first = sch.phase[xs[0]]
            last = first + (row_passes(graph, sch, n) if lv[n] == ROW else 1)
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


def reads_element(graph: Graph, kernel: ReduceKernel, n: int) -> bool:
    """Whether reduction ``n`` reduces an element value (else a row value)."""
    x = value_args(graph, n)[0]
    lv = dict(kernel.levels)
    return lv.get(x) == ELEMENT if x in lv else graph.node(x).shape == kernel.shape


class KernelNames:
    """The locals a reduce kernel's printer gives its values, for both backends:
    outside values by slot (``s{j}`` scalar, ``b{j}`` per row, ``c{j}`` per column,
    ``a{j}`` per element), element nodes ``v{k}`` and row nodes ``u{k}`` (``k`` the
    node's position in the kernel); ``printer`` (the backend's) prints the nodes and
    its ``names`` map is the one kept here."""

    def __init__(self, graph: Graph, kernel: ReduceKernel, printer,
                 centred: dict[int, CentredSum] | None = None) -> None:
        self.graph, self.kernel, self.printer = graph, kernel, printer
        self.centred = centred or {}
        self.names = printer.names
        self.level = dict(kernel.levels)
        self.slots = input_slots(graph, kernel)
        self.slot_of = {s: j for j, s in enumerate(self.slots)}
        self.pos = {n: k for k, n in enumerate(kernel.nodes)}

    def local(self, x: int, a: str) -> str:
        """The local holding outside value ``x`` read as ``a``."""
        j = self.slot_of[(x, a)]
        return {SCALAR: f"s{j}", PER_ROW: f"b{j}", PER_COL: f"c{j}", PER_ELEMENT: f"a{j}"}[a]

    def bind(self, n: int) -> None:
        """Name node n's outside operands as n reads them."""
        for x in value_args(self.graph, n):
            if x not in self.level:
                self.names[x] = self.local(x, access(self.graph, self.kernel, n, x))

    def value(self, n: int, index: str) -> list[str]:
        """Lines computing the element or row node n (aliases print nothing); ``index``
        is the flat index of the element (or row) computed, a draw's counter."""
        node = self.graph.node(n)
        self.bind(n)
        prefix = "v" if self.level[n] == ELEMENT else "u"
        if node.op == "broadcast_in":
            self.names[n] = self.printer.name(node.args[0])
            return []
        self.printer.index = index
        lines = self.printer.lines(n, f"{prefix}{self.pos[n]}")
        self.names[n] = f"{prefix}{self.pos[n]}"
        return lines

    def reduced(self, n: int, arg: int = 0) -> str:
        """The name of value ``arg`` reduction ``n`` reduces (its operand; a
        :class:`CentredSum`'s values, in ``centred``)."""
        x, reader = (self.centred[n].values[arg] if n in self.centred
                     else (value_args(self.graph, n)[0], n))
        if x not in self.level:
            self.names[x] = self.local(x, access(self.graph, self.kernel, reader, x))
        return self.names[x]


def shift_line(kind: str, i: int, inf: str) -> str:
    """The line printing ``_h{i}``, the shift (``logsumexp``: the row's max where finite,
    else 0, as ``prelude._g_logsumexp``) or scale (``norm``: the max |x| where finite,
    raised to the smallest normal number ``_tn`` (1/_h stays finite, as --fast-math's
    x * (1/_h) needs), 1 where it is 0, inf or NaN) of a two-pass reduction's second
    pass, from the first pass's max ``_m{i}``; ``inf`` is the backend's infinity."""
    if kind == "logsumexp":
        return f"_h{i} = _T(_m{i}) if (_m{i} - _m{i}) == 0.0 else _T(0.0)"
    return f"_h{i} = (_T(max(_m{i}, _tn)) if (_m{i} > 0.0 and _m{i} < {inf}) else _T(1.0))"


def accumulate_line(acc: str, v: str, kind: str, select: str,
                    combine: str = "{acc} {op}= {v}") -> str:
    """The line updating accumulator ``acc`` of a reduction of ``kind`` with the value
    ``v``; a max or min is the backend's ``select`` (a format of ``acc``, ``v`` and
    ``cmp``, ``>`` or ``<``), which keeps a NaN; a sum or product the backend's
    ``combine`` (a format of ``acc``, ``v`` and ``op``, ``+`` or ``*``)."""
    if kind in ("sum", "mean", "prod"):
        return combine.format(acc=acc, v=v, op="*" if kind == "prod" else "+")
    return select.format(acc=acc, v=v, cmp=">" if kind == "max" else "<")
