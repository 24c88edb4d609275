"""Forward mode: Jacobian-vector products built into the graph.

``jvp(graph, tangents, roots)`` adds the nodes of the tangent computation to
``graph`` and returns one tangent node per root (None for a symbolic zero).
The walk is JAX's ``jvp`` over the graph: nodes are visited in topological
order, each primitive's ``jvp`` rules (one per operand, in
:mod:`gradc.ir.primitives`) run for the operands whose tangent is not a
symbolic zero, their sum is broadcast to the node's shape, and integer values
carry no tangent.

A :class:`~gradc.ir.graph.CustomRegion` (an inlined call of an op with a
``grad`` block) is visited as one unit.  Its grad block is a VJP, ``u ->
J^T u``; gradc *transposes* it to get the op's JVP, ``t -> J t``
(:func:`transpose_grad_block`): the block is instantiated over placeholder
upstreams, checked to be linear in them (:mod:`gradc.autodiff.linearity`),
and reverse mode over it, seeded with the input tangents, gives the output
tangents (the VJP of a linear map is its transpose).  JAX's ``custom_vjp``
has no forward mode at all; a grad block that is not linear in its upstream
names cannot be transposed and is a :class:`GradientError` (E405).  JAX goes
the other way, from a JVP to a VJP by linearizing and transposing (Radul et
al., "You Only Linearize Once", POPL 2023); transposition is the same
operation in both directions.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from gradc.autodiff.core import instantiate, is_zero, nan_safe, surface, total, unbroadcast, units
from gradc.autodiff.linearity import classify, describe_upstreams
from gradc.autodiff.regions import apply_rule
from gradc.autodiff.reverse import custom_cotangent, vjp
from gradc.errors import GradientError
from gradc.ir.builder import Builder
from gradc.ir.graph import FLOAT, CustomRegion, Graph, Node
from gradc.ir.primitives import PRIMITIVES


def jvp(graph: Graph, tangents: Mapping[int, int], roots: Sequence[int]) -> list[int | None]:
    """Add ``d roots[i] / d seeds . tangents`` to ``graph``, per root.

    ``tangents`` maps seed nodes (parameters) to their tangent nodes, which must
    have the seeds' shape class.  Returns one tangent node per root, of the
    root's shape class, or None where it is a symbolic zero.  Raises
    :class:`GradientError` (E405) when a custom region on the way has a grad
    block that cannot be transposed.
    """
    tan: dict[int, int] = dict(tangents)
    live = _live_nodes(graph, tan, roots)
    for unit in units(graph, live):
        if isinstance(unit, CustomRegion):
            _custom_jvp(graph, unit, tan)
        elif unit not in tan and graph.node(unit).args:
            t = _node_jvp(graph, graph.node(unit), tan)
            if t is not None:
                tan[unit] = t
    return [tan.get(r) for r in roots]


def _live_nodes(graph: Graph, seeds: Mapping[int, int], roots: Sequence[int]) -> set[int]:
    """Nodes that depend on a seed and that some root depends on."""
    down = set(seeds)
    for nid in graph.topo_order():
        if nid not in down and any(a in down for a in graph.node(nid).args):
            down.add(nid)
    return down & graph.ancestors(roots)


def _node_jvp(graph: Graph, node: Node, tan: dict[int, int]) -> int | None:
    """The tangent of ``node`` from its operands' tangents (None: a zero)."""
    if node.dtype != FLOAT:
        return None
    prim = PRIMITIVES[node.op]
    b = Builder(graph, span=node.span)     # tangent nodes point at the primal's source
    parts = []
    for i, (a, rule) in enumerate(zip(node.args, prim.jvp)):
        t = tan.get(a)
        if rule is None or t is None:
            continue
        part = instantiate(graph, rule, node, {f"{prim.params[i]}_t": t}, b)
        if not is_zero(graph, part):
            parts.append(nan_safe(b, node, part, t))
    t = total(graph, parts)
    if t is not None and graph.node(t).shape != node.shape:
        t = b.apply("sum_to", (t, node.id))          # broadcast up to the node's shape
    return t


def _custom_jvp(graph: Graph, region: CustomRegion, tan: dict[int, int]) -> None:
    """The output tangents of a custom region: its grad block, transposed."""
    diff = [a for _, a in region.differentiable_inputs]
    if all(tan.get(a) is None for a in diff):
        return
    outs = transpose_grad_block(graph, region, [tan.get(a) for a in diff])
    for o, t in zip(region.outputs, outs):
        if t is not None:
            tan[o] = t


def transpose_grad_block(graph: Graph, region: CustomRegion,
                         tangents: Sequence[int | None]) -> list[int | None]:
    """``J t`` from a grad block giving ``J^T u``: one tangent node per output of
    ``region`` (None: a zero), from one tangent per differentiable parameter.

    The block is applied to placeholder upstreams (NaN arrays of the outputs'
    shapes, never read by the result), each gradient output is checked to be
    linear in them, ``stop_gradient`` inside it is read as the identity (it
    only matters when the block itself is differentiated), and so is a
    ``zero_masked`` (its mask tests the upstream for 0, which maps to 0 anyway),
    and reverse mode from the gradient outputs, seeded with ``tangents``, to the
    placeholders is the transpose.  A gradient whose shape is checked at run time
    (``shape_check``) has its tangent checked against that shape first
    (``shape_check_of``), so a wrong one is refused with the rule's message.  Raises
    :class:`GradientError` (E405) naming the op and the line of the block where
    linearity is lost.
    """
    rule = region.rule
    b = Builder(graph)
    since = graph.next_id
    ups = [b.apply("full_like", (o, b.const(math.nan)), span=rule.span)
           for o in region.outputs]
    ups, grads = apply_rule(graph, region, ups)
    reads_ups = _require_linear(graph, region, ups, grads, since)
    for nid in reads_ups:     # stop_gradient(dy): the identity, as a map of dy; so is
        node = graph.node(nid)  # a NaN-safe product's mask, which tests dy == 0 only
        if node.op in ("stop_gradient", "zero_masked"):
            graph.update(nid, op="identity", args=node.args[:1])
    roots, seeds = [], []
    for (p, a), gname, g, t in zip(region.differentiable_inputs, rule.gradients, grads,
                                   tangents):
        if t is None or is_zero(graph, g):
            continue
        gb = Builder(graph, span=graph.node(g).span)
        ct = custom_cotangent(gb, region, gname, g, p, a)
        if ct != g and graph.node(ct).op == "shape_check":
            # the transpose of unbroadcast's sum_to broadcasts t to g's shape before the
            # transposed check runs: check g's shape (read only) on the seed first
            t = gb.apply("shape_check_of", (t, g, a), dict(graph.node(ct).attrs))
        roots.append(unbroadcast(gb, ct, a))
        seeds.append(t)
    out = vjp(graph, roots, seeds, ups) if roots else [None] * len(ups)
    leaked = _values_read(graph, [t for t in out if t is not None]) & set(ups)
    assert not leaked, f"the transpose of {rule.op}'s grad block reads its upstreams"
    for u, o in zip(ups, region.outputs):     # left only as shape sources (sum_to's like)
        graph.replace_uses(u, o)
    return out


def _values_read(graph: Graph, roots: Sequence[int]) -> set[int]:
    """The nodes whose values ``roots`` depend on (not those read for a shape only)."""
    seen, todo = set(), list(roots)
    while todo:
        nid = todo.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = graph.node(nid)
        skip = PRIMITIVES[node.op].shape_only
        todo.extend(a for i, a in enumerate(node.args) if i not in skip)
    return seen


def _require_linear(graph: Graph, region: CustomRegion, ups: list[int], grads: list[int],
                    since: int) -> set[int]:
    """Raise E405 unless every gradient output is linear in the upstreams (a
    symbolic zero is; a nonzero value that does not depend on them is not);
    return the nodes of the block that depend on the upstreams."""
    rule = region.rule
    verdict = classify(graph, ups, since)
    notes = [f"forward mode transposes the grad block of '{rule.op}' (line {rule.span.line}) "
             "into its JVP; only a map linear in the upstreams has a transpose (JAX's "
             "custom_vjp has no forward mode at all)",
             "make the block linear in the upstreams (scale or mask them by values of the "
             "forward pass), or use .vjp/.fwd_bwd, which use the block as written"]
    for gname, g in zip(rule.gradients, grads):
        span = rule.gradient_spans.get(gname, rule.span)
        if g not in verdict:
            if is_zero(graph, g):
                continue
            raise GradientError(
                f"op '{rule.op}' has no forward mode: gradient '{gname}' of its grad block "
                f"does not depend on the {describe_upstreams(rule.upstreams)} and is not 0, "
                "so the block is not linear in them", span,
                "E405", notes)
        bad = verdict[g]
        if bad is None:
            continue
        node = graph.node(bad.node)
        used = [n for n, u in zip(rule.upstreams, ups) if u in bad.depends]
        raise GradientError(
            f"op '{rule.op}' has no forward mode: gradient '{gname}' of its grad block is "
            f"not linear in the {describe_upstreams(used)}: '{surface(node.op)}' is "
            "applied to it nonlinearly here", node.span or rule.span, "E405", notes)
    return set(verdict)

