"""Algebraic simplification: small rewrite rules keyed by op, run to a fixed point.

Every rewrite keeps the node's shape and dtype (a rewrite that would shrink a
broadcast result is not applied); where the new node's shape class is another
one, equal at run time (``_kept_dims``'s), the drivers make every class refer to
it (:meth:`Graph.substitute_shapes`).  None changes IEEE results for
finite inputs except ``x * 0`` is never rewritten (it is NaN for x = inf).
RULES run only after autodiff: ``stop_gradient`` and ``identity`` are no-ops
by then.  :func:`stabilize` runs two of them before it, on the primal graph
(:func:`_stable_forms`, :func:`_kept_dims`), so the derivative is the rewritten
form's.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gradc.autodiff.core import is_zero
from gradc.ir.builder import Builder
from gradc.ir.expr import lower_decomposition, operand_scope
from gradc.ir.graph import Graph, Node, remap_region
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES, REDUCTION
from gradc.passes.dce import eliminate_dead_code


def _const(graph: Graph, nid: int) -> float | None:
    node = graph.node(nid)
    return node.value if node.op == "const" else None


def _same_shape(graph: Graph, a: int, node: Node) -> bool:
    other = graph.node(a)
    return other.shape == node.shape and other.dtype == node.dtype


def _fold(graph: Graph, node: Node) -> int | None:
    """An elementwise op of constants becomes a constant (computed in float64)."""
    prim = PRIMITIVES[node.op]
    if prim.kind != ELEMENTWISE or not node.args:
        return None
    values = [_const(graph, a) for a in node.args]
    if any(v is None for v in values):
        return None
    with np.errstate(all="ignore"):
        value = prim.ref(*(np.float64(v) for v in values))
    value = float(np.asarray(value).reshape(()))
    return Builder(graph, node.span).const(value, node.dtype)


def _operand_if(graph: Graph, node: Node, i: int, cond: Callable[[int], bool]):
    """Operand ``1 - i`` when operand ``i`` satisfies ``cond``."""
    other = node.args[1 - i]
    if cond(node.args[i]) and _same_shape(graph, other, node):
        return other
    return None


def _identities(graph: Graph, node: Node) -> int | None:
    op, args = node.op, node.args
    is0 = lambda a: is_zero(graph, a)          # 0, or zeros_like(x)
    is1 = lambda a: _const(graph, a) == 1
    if op in ("identity", "stop_gradient") or (op == "cast" and
                                                graph.node(args[0]).dtype == node.dtype):
        return args[0]
    if op == "add":
        return _operand_if(graph, node, 0, is0) or _operand_if(graph, node, 1, is0)
    if op == "sub":
        return _operand_if(graph, node, 1, is0)
    if op == "mul":
        return _operand_if(graph, node, 0, is1) or _operand_if(graph, node, 1, is1)
    if op in ("div", "pow"):
        return _operand_if(graph, node, 1, is1)
    if op == "neg" and graph.node(args[0]).op == "neg":
        return graph.node(args[0]).args[0]
    if op in ("sum_to", "broadcast_in") and _same_shape(graph, args[0], node):
        return args[0]
    if op == "where" and args[1] == args[2]:
        return args[1]
    if op == "where" and _const(graph, args[0]) is not None:
        pick = args[1] if _const(graph, args[0]) != 0 else args[2]
        return pick if _same_shape(graph, pick, node) else None
    if op == "zero_masked" and _is_needless_mask(graph, node):
        return args[0]
    if op == "swapaxes" and graph.node(args[0]).op == "swapaxes":
        inner = graph.node(args[0])        # swapped back (a batched '@''s VJP of k.T)
        axes = lambda n: {n.attr("axis1"), n.attr("axis2")}
        if axes(inner) == axes(node) and _same_shape(graph, inner.args[0], node):
            return inner.args[0]
    return None


def _is_needless_mask(graph: Graph, node: Node) -> bool:
    """``zero_masked(ct, g)`` (the NaN-safe product of both walkers,
    ``autodiff.core.nan_safe``: 0 where ``g == 0`` and ``ct`` is NaN) where ``ct``
    is ``g`` times a factor that :func:`bound` proves finite: ``ct`` is ``±0``
    wherever ``g == 0``, so the mask never selects.  For a constant factor removing it keeps
    every bit; for a bounded function of the inputs (``dy * sigmoid(x)`` in swish's
    gradient, ``dy * (1 + tanh(u))`` in gelu's) it keeps every bit at every input
    that is not NaN, ±inf included.  Where such a factor's input is NaN the factor
    is NaN and the contribution is NaN, as IEEE arithmetic and ``jax.vjp`` give,
    not 0 (the bounded primitive's own rule, never masked, was NaN there already).
    The mask cost swish's fused ``fwd_bwd`` 26 % of its time."""
    ct, g = node.args
    ctn = graph.node(ct)
    if ctn.op != "mul":
        return False
    others = [a for a in ctn.args if a != g]
    if len(others) != 1 or g not in ctn.args:
        return False
    return bound(graph, others[0]) is not None and _same_shape(graph, ct, node)


_BOUND_LIMIT = 1e30           # far inside float32's range, so no value can round to inf


def bound(graph: Graph, nid: int) -> float | None:
    """A bound on ``|value|`` of node ``nid`` at every input that is not NaN, or None
    where none is proven (any parameter not under a bounded function, ``exp``, ``/``...).

    Interval arithmetic on magnitudes: constants, the primitives' ``value_bound``, and
    ``neg abs identity cast add sub mul square maximum minimum where clip
    full_like broadcast_in zero_masked`` of bounded operands (``add``: the sum of the bounds,
    ``mul``: the product...).  Bounds above 1e30 count as none, so that no rounding
    in float32 can reach inf."""
    memo: dict[int, float | None] = {}
    stack = [nid]
    while stack:
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        node = graph.node(top)
        deps = _bound_operands(node)
        todo = [a for a in deps if a not in memo]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        memo[top] = _node_bound(node, [memo[a] for a in deps])
    return memo[nid]


def _bound_operands(node: Node) -> tuple[int, ...]:
    """The operands whose bounds ``node``'s bound is computed from."""
    if node.op in ("neg", "abs", "identity", "stop_gradient", "cast", "square", "add",
                   "sub", "mul", "maximum", "minimum", "broadcast_in"):
        return node.args[:1] if node.op == "broadcast_in" else node.args
    if node.op == "where":
        return node.args[1:]
    if node.op == "zero_masked":
        return node.args[:1]            # ct, or 0
    if node.op == "clip":
        return node.args[1:]            # clip(x, lo, hi) lies between lo and hi
    if node.op == "full_like":
        return node.args[1:]
    return ()


def _node_bound(node: Node, operand_bounds: list[float | None]) -> float | None:
    if node.op == "const":
        v = node.value
        return abs(float(v)) if isinstance(v, (int, float)) and abs(float(v)) <= \
            _BOUND_LIMIT else None
    if PRIMITIVES[node.op].value_bound is not None:
        return PRIMITIVES[node.op].value_bound
    if not operand_bounds or any(b is None for b in operand_bounds):
        return None
    if node.op in ("add", "sub"):
        out = operand_bounds[0] + operand_bounds[1]
    elif node.op == "mul":
        out = operand_bounds[0] * operand_bounds[1]
    elif node.op == "square":
        out = operand_bounds[0] ** 2
    else:
        out = max(operand_bounds)
    return out if out <= _BOUND_LIMIT else None


def _negations(graph: Graph, node: Node) -> int | None:
    """``x + (-y)`` -> ``x - y``; ``x - (-y)`` -> ``x + y``; ``(-x) * y`` stays."""
    if node.op in ("add", "sub") and graph.node(node.args[1]).op == "neg":
        op = "sub" if node.op == "add" else "add"
        inner = graph.node(node.args[1]).args[0]
        return Builder(graph, node.span).apply(op, (node.args[0], inner))
    return None


def _strength(graph: Graph, node: Node) -> int | None:
    """Cheaper equivalents that LLVM can vectorise (libm ``pow`` cannot be).

    - ``x * x`` -> ``square(x)``; ``x^n`` for an integer constant ``0 < |n| <= 4`` ->
      a chain of multiplications (``x^3 = square(x) * x``, ``x^-2 = 1 / square(x)``),
      as ``lax.integer_pow`` does: within 3 ULP of the correctly rounded power
      (up to three roundings; 2.3 ULP measured for float32 ``x^-3``);
    - ``x / c`` for a constant power of two -> ``x * (1/c)`` (bit-exact);
    - ``exp(log(x))`` -> ``x`` (equal for x >= 0, inf included; NaN for x < 0 is
      outside log's domain).
    """
    op, args = node.op, node.args
    b = Builder(graph, node.span)
    if op == "mul" and args[0] == args[1]:
        return b.apply("square", (args[0],))
    if op == "pow" and _same_shape(graph, args[0], node):
        n = _const(graph, args[1])
        if n is not None and float(n).is_integer() and 0 < abs(n) <= 4:
            x = args[0]
            sq = b.apply("square", (x,)) if abs(n) >= 2 else x
            acc = {1: x, 2: sq, 3: b.apply("mul", (sq, x)) if abs(n) == 3 else sq,
                   4: b.apply("square", (sq,))}[abs(int(n))]
            return acc if n > 0 else b.apply("div", (b.const(1.0), acc))
    if op == "div" and (c := _const(graph, args[1])) not in (None, 0) and \
            _same_shape(graph, args[0], node) and abs(c) != np.inf:
        mant, _ = np.frexp(c)
        if abs(mant) == 0.5:
            return b.apply("mul", (args[0], b.const(1.0 / c)))
    if op == "exp" and graph.node(args[0]).op == "log":
        inner = graph.node(args[0]).args[0]
        return inner if _same_shape(graph, inner, node) else None
    return None


def _shifted_max(graph: Graph, node: Node) -> int | None:
    """``max(x - h, axis)`` -> ``max(x, axis) - h`` for a row value ``h`` (the max's
    shape, keepdims; broadcast or ``broadcast_in`` along the same axes) that is never
    -inf: logsumexp's decomposition of the built-in ``log_softmax``'s ``x - max(x)``
    takes the max of the shifted row, which is then the max already taken, less the
    shift, and one pass over the row fewer.  The same bits: rounding is monotone, so
    the max of ``fl(x_i - h)`` is ``fl(max(x) - h)``, NaN where an ``x_i`` or ``h`` is
    NaN, or where ``h`` is +inf and so is an ``x_i``; not where ``h`` is -inf (an
    ``x_i`` of -inf less -inf is NaN, the max is not): :func:`minus_inf_only_with`.
    Also where ``h`` is the max of the same ``x`` along the same axes without
    ``initial`` (JAX's ``x - stop_gradient(max(x))``), which is -inf only for a row of
    -inf, NaN in both forms, and raises for an empty row (where ``max(x - h,
    initial=-inf)`` would be -inf and ``h - h`` NaN): then the max is ``h`` itself."""
    if node.op != "max" or not node.attr("keepdims") or node.attr("initial") not in (None, -np.inf):
        return None
    d = graph.node(node.args[0])
    x = d.args[0] if d.op == "sub" else None
    if x is None or graph.node(x).shape != d.shape:
        return None
    h, b = d.args[1], graph.node(d.args[1])
    if b.op == "broadcast_in" and b.attr("keepdims") and b.attr("axis") == node.attr("axis"):
        h = b.args[0]
    if not _same_shape(graph, h, node):
        return None
    out = Builder(graph, node.span)
    m = _stripped(graph, h)
    if not (graph.node(m).op == "max" and graph.node(m).args[0] == x and
            graph.node(m).attr("axis") == node.attr("axis") and
            graph.node(m).attr("initial") is None and graph.node(m).shape == node.shape):
        if not minus_inf_only_with(graph, h):
            return None
        m = out.apply("max", (x,), dict(node.attrs))
    return out.apply("sub", (m, h))


def _kept_dims(graph: Graph, node: Node, *, avoid: frozenset[int] = frozenset()
               ) -> int | None:
    """``expand_dims(r, axis)`` of a reduction ``r`` without keepdims along the same axes
    -> ``r`` with keepdims (JAX's ``x - expand_dims(max(x, axis=-1), -1)``), where every use
    of ``r`` is such an ``expand_dims``, directly or through ``stop_gradient`` or
    ``identity`` (``expand_dims(stop_gradient(max(x, axis=-1)), -1)``, which keep their place:
    ``stop_gradient(max(x, -1, keepdims=true))``), and no node on the way is an output
    or in ``avoid``: the same values, and a row value a reduce kernel fuses, where
    ``expand_dims`` is a library call between kernels.  :func:`stabilize` applies it
    before differentiation, so the derivative is the keepdims reduction's."""
    if node.op != "expand_dims":
        return None
    chain = [node.args[0]]                    # r, then the wrappers up to node's operand
    while graph.node(chain[0]).op in ("stop_gradient", "identity"):
        chain.insert(0, graph.node(chain[0]).args[0])
    r = graph.node(chain[0])
    if r.op not in PRIMITIVES or PRIMITIVES[r.op].kind != REDUCTION or r.attr("keepdims") \
            or any(v in graph.outputs or v in avoid for v in chain):
        return None
    rank = graph.node(r.args[0]).shape.rank   # both axes count in it: r's operand's rank
    if rank is None and r.attr("axis") is None:
        return None

    def axes(a) -> frozenset[int] | None:
        """The axes ``a``, each in ``range(rank)``; as written where the rank is not
        known (then a different spelling of the same axes is not seen as the same);
        None where two name one axis (``expand_dims(s, (-1, 1))`` of a rank-1 ``s``
        adds two axes, not the one its reduction took)."""
        if a is None:
            return frozenset(range(rank))
        a = a if isinstance(a, tuple) else (a,)
        out = frozenset(int(i) if rank is None else int(i) % rank for i in a)
        return out if len(out) == len(a) else None

    def expanded_only(v: int, wrappers: list[int]) -> bool:
        return all(
            (u == wrappers[0] and expanded_only(u, wrappers[1:])) if wrappers and
            graph.node(u).op in ("stop_gradient", "identity") else
            graph.node(u).op == "expand_dims" and
            axes(graph.node(u).attr("axis")) == axes(r.attr("axis")) is not None
            for u in graph.users(v))

    if not expanded_only(r.id, chain[1:]):
        return None
    build = Builder(graph, node.span)
    out = build.apply(r.op, r.args, {**dict(r.attrs), "keepdims": True})
    for v in chain[1:]:
        out = build.apply(graph.node(v).op, (out,), dict(graph.node(v).attrs))
    return out


def _stripped(graph: Graph, v: int) -> int:
    """``v`` without the ``identity``, ``stop_gradient`` and ``broadcast_in`` around it
    (the same values, where a row value is concerned)."""
    while graph.node(v).op in ("identity", "stop_gradient", "broadcast_in"):
        v = graph.node(v).args[0]
    return v


# The largest constant finite in every float dtype (float16's largest): one added to a
# finite value of any dtype does not round to -inf, nor does one as a value.
_FINITE_EVERYWHERE = 65504.0


def minus_inf_only_with(graph: Graph, nid: int, m: int | None = None) -> bool:
    """Whether node ``nid`` can be -inf only where node ``m`` is (never, where ``m`` is
    None), proven from its form: ``m`` itself; a constant of at most
    :data:`_FINITE_EVERYWHERE` in magnitude; ``where(a > -inf, a, b)`` or ``where(a - a
    == 0, a, b)`` (the built-in softmaxes' and logsumexp's shifts) with ``b`` such, any
    other ``where`` with both branches such; ``a + c``, ``c + a``, ``a - c`` for such a
    constant ``c``, ``a * c`` for ``0 < c <= 1``; ``minimum`` of two, ``maximum`` with
    one, such values; through ``broadcast_in`` and ``stop_gradient``.  Used where -inf
    less -inf (NaN) would be lost: :func:`_shifted_max`, and the online sums of
    ``gradc.passes.row_schedule`` (whose shifts are -inf only for a row of -inf)."""
    def small(v: int) -> bool:
        c = _const(graph, v)
        return c is not None and abs(c) <= _FINITE_EVERYWHERE

    def ok(v: int) -> bool:
        v = _stripped(graph, v)
        node = graph.node(v)
        if v == m or small(v):
            return True
        args = node.args
        if node.op == "where":
            c, a, b = (graph.node(u) for u in args)
            guarded = (c.op == "gt" and c.args[0] == args[1] and
                       _const(graph, c.args[1]) == -np.inf) or (
                c.op == "eq" and graph.node(c.args[0]).op == "sub" and
                graph.node(c.args[0]).args == (args[1], args[1]) and _const(graph, c.args[1]) == 0)
            return ok(args[2]) and (guarded or ok(args[1]))
        if node.op in ("add", "sub"):
            return (ok(args[0]) and small(args[1])) or (
                node.op == "add" and small(args[0]) and ok(args[1]))
        if node.op == "mul":
            return any(ok(a) and 0 < (_const(graph, c) or 0) <= 1
                       for a, c in (args, args[::-1]))
        if node.op == "minimum":
            return all(ok(a) for a in args)
        if node.op == "maximum":
            return any(ok(a) for a in args)
        return False
    return ok(nid)


def _stable_forms(graph: Graph, node: Node, *, avoid: frozenset[int] = frozenset()
                  ) -> int | None:
    """Naive spellings of functions that have a stable primitive, rewritten to it.

    ============================  =====================  ===========================
    written                        becomes                 why
    ============================  =====================  ===========================
    ``log1p(exp(x))``              ``softplus(x)``         exp overflows (float32: x > 88)
    ``log(1 + exp(x))``            ``softplus(x)``         same
    ``1 / (1 + exp(-x))``          ``sigmoid(x)``          same, for x < -88
    ``log(sigmoid(x))``            ``-softplus(-x)``       log(0) for x < -104 (float32);
                                                           ``log_sigmoid(x)``'s form
    ``log(exp(x))``                ``x``                   exp overflows
    ``log(sum(exp(x), ...))``      ``logsumexp(x, ...)``   exp overflows; max-shifted
    ``sqrt(sum(x^2 | x*x, ...))``  ``norm(x, ...)``        x^2 overflows; gradient at 0
    ``log(1 + x)``                 ``log1p(x)``            cancellation for tiny x
    ``exp(x) - 1``                 ``expm1(x)``            cancellation for tiny x
    ============================  =====================  ===========================

    The rewrites run on the primal graph *before* differentiation, so the
    derivative is the stable primitive's (``softplus' = sigmoid``), and again
    after it.  ``avoid``: nodes not to look through (the inside of a custom
    gradient region, whose rule is written against the original nodes).
    Sources: the same rewrites as TensorFlow's and XLA's algebraic simplifier
    for ``log1p(exp)``/``log(sum(exp))``; Higham, *Accuracy and Stability of
    Numerical Algorithms*, §1.14 for ``log1p``/``expm1``.
    """
    op = node.op

    def inner(nid: int, *ops: str) -> Node | None:
        n = graph.node(nid)
        return n if n.op in ops and nid not in avoid and _same_shape(graph, nid, node) else None

    def inner_red(nid: int, *ops: str) -> Node | None:      # reductions change shape
        n = graph.node(nid)
        return n if n.op in ops and nid not in avoid else None

    def plus_one(nid: int) -> int | None:          # the other operand of ``1 + a``/``a + 1``
        n = inner(nid, "add")
        if n is None:
            return None
        for i in (0, 1):
            if _const(graph, n.args[i]) == 1 and _same_shape(graph, n.args[1 - i], node):
                return n.args[1 - i]
        return None

    b = Builder(graph, node.span)
    x0 = node.args[0] if node.args else None
    if op == "log1p" and (e := inner(x0, "exp")):
        return b.apply("softplus", e.args)
    if op == "log":
        if (a := plus_one(x0)) is not None:
            if e := inner(a, "exp"):
                return b.apply("softplus", e.args)
            return b.apply("log1p", (a,))
        if (e := inner(x0, "exp")) and _same_shape(graph, e.args[0], node):
            return e.args[0]
        if s := inner(x0, "sigmoid"):
            return b.apply("neg", (b.apply("softplus", (b.apply("neg", s.args),)),))
        if (r := inner_red(x0, "sum")) and (e := inner_red(r.args[0], "exp")):
            return b.apply("logsumexp", e.args, dict(r.attrs))
    if op == "div" and _const(graph, x0) == 1 and (a := plus_one(node.args[1])) is not None:
        if (e := inner(a, "exp")) and (n := inner(e.args[0], "neg")):
            return b.apply("sigmoid", n.args)
    if op == "sub" and _const(graph, node.args[1]) == 1 and (e := inner(x0, "exp")):
        return b.apply("expm1", e.args)
    if op == "sqrt" and (r := inner_red(x0, "sum")):
        sq = graph.node(r.args[0])
        if r.args[0] not in avoid and (
                sq.op == "square" or sq.op == "mul" and sq.args[0] == sq.args[1] or
                sq.op == "pow" and _const(graph, sq.args[1]) == 2):
            return b.apply("norm", sq.args[:1], dict(r.attrs))
    return None


RULES = (_fold, _identities, _negations, _stable_forms, _strength, _shifted_max, _kept_dims)


def _remap_regions(graph: Graph, moved: dict[int, int]) -> None:
    """Point custom regions at the replacements ``moved`` of their inputs and
    residuals (a rewritten node may be passed into a custom region)."""
    if moved:
        graph.regions = [remap_region(r, moved) for r in graph.regions]


def stabilize(graph: Graph) -> Graph:
    """Rewrite naive spellings to stable primitives (:func:`_stable_forms`), and
    ``expand_dims`` of reductions to keepdims reductions (:func:`_kept_dims`), before
    differentiation; nodes of custom-gradient regions are left as written (a grad
    block's own: :func:`kept_dims_in_place`)."""
    out = graph.copy()
    stabilize_in_place(out)
    return out      # no DCE: a custom region's residuals may have no user yet


def stabilize_in_place(graph: Graph) -> dict[int, int]:
    """:func:`stabilize` on ``graph`` itself; returns each rewritten node's replacement
    (the lowering's outputs not yet set: ``gradc.ir.lower.lower_op``, before it expands
    ``grad()``)."""
    avoid = frozenset().union(*(r.nodes for r in graph.regions))
    return _rewrite_in_place(graph, avoid, (_stable_forms, _kept_dims))


def kept_dims_in_place(graph: Graph, since: int) -> dict[int, int]:
    """:func:`_kept_dims` on the nodes of ``graph`` from id ``since`` on (a grad block's,
    lowered in a scratch copy of the op's graph: ``gradc.ir.lower.lower_rule``), their
    reductions among them; returns each rewritten node's replacement.  A grad block
    written with ``expand_dims`` (``y * (dy - expand_dims(sum(y * dy, axis=-1), -1))``)
    then transposes, in the op's jvp, to a row value a reduce kernel fuses, not to
    library calls between kernels."""
    avoid = frozenset(range(since)).union(*(r.nodes for r in graph.regions))
    return _rewrite_in_place(graph, avoid, (_kept_dims,))


def _rewrite_in_place(graph: Graph, avoid: frozenset[int], rules: tuple) -> dict[int, int]:
    """Each node of ``graph`` not in ``avoid``, in topological order, replaced by the
    first of ``rules`` that rewrites it; returns each rewritten node's replacement."""
    moved: dict[int, int] = {}
    for nid in graph.topo_order():
        if nid in avoid or graph.node(nid).op not in PRIMITIVES or \
                graph.node(nid).op in ("param", "const"):
            continue
        new = next((n for n in (rule(graph, graph.node(nid), avoid=avoid) for rule in rules)
                    if n is not None), None)
        if new is not None and new != nid:
            graph.replace_uses(nid, new)
            moved[nid] = new
    graph.substitute_shapes(moved)
    _remap_regions(graph, moved)
    return moved


def expand_decompositions(graph: Graph) -> Graph:
    """Each node whose primitive has a ``decomposition`` (outside custom-gradient
    regions) replaced by it: the decomposition's statements lowered over the node's
    operands and attributes, its ``out`` used in the node's place.
    :func:`gradc.pipeline.build_op` applies it to the graphs it differentiates (vjp,
    fwd_bwd, jvp), so their derivatives are the decomposition's (``logsumexp``'s: see
    its entry in :mod:`gradc.ir.primitives`); ``forward`` keeps the primitive."""
    avoid = frozenset().union(*(r.nodes for r in graph.regions))
    out = graph.copy()
    moved: dict[int, int] = {}
    for nid in out.topo_order():
        node = out.node(nid)
        if PRIMITIVES[node.op].decomposition is None or nid in avoid:
            continue
        new = lower_decomposition(out, node.op, operand_scope(node), node.span)
        out.replace_uses(nid, new)
        moved[nid] = new
    _remap_regions(out, moved)
    return out


def simplify(graph: Graph) -> Graph:
    """Rewrite to a fixed point; no rule of RULES applies to the result's live nodes."""
    out = eliminate_dead_code(graph)
    changed = True
    while changed:
        moved: dict[int, int] = {}
        for nid in out.topo_order():
            if out.node(nid).op in ("param", "const") or not (
                    out.users(nid) or nid in out.outputs):
                continue
            for rule in RULES:
                new = rule(out, out.node(nid))
                if new is not None and new != nid:
                    out.replace_uses(nid, new)
                    moved[nid] = new
                    break
        changed = bool(moved)
        out.substitute_shapes(moved)
        out = eliminate_dead_code(out)
    return out
