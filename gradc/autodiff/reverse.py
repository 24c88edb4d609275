"""Reverse mode: vector-Jacobian products built into the graph.

``vjp(graph, roots, cotangents, wrt)`` adds the nodes of the backward pass to
``graph`` and returns one cotangent node per ``wrt`` node (None for a
symbolic zero).  The walk is JAX's ``backward_pass`` over the graph instead of
a jaxpr: nodes are visited in reverse topological order, cotangents are
accumulated per node, symbolic zeros are dropped before a rule runs, and each
rule's result is un-broadcast (``sum_to``) to its operand's shape class.

A :class:`~gradc.ir.graph.CustomRegion` (an inlined call of an op with a
``grad`` block) is visited as one unit: its outputs' cotangents go into the
op's grad block, instantiated over the region's residual nodes, and the
derived rules of the nodes inside it are never used.
"""
from __future__ import annotations

from typing import Sequence

import networkx as nx

from gradc.autodiff.core import instantiate, is_zero, nan_safe, surface, total, unbroadcast, units
from gradc.autodiff.linearity import classify, describe_upstreams
from gradc.autodiff.regions import apply_rule
from gradc.autodiff.rules import COMPOSITES
from gradc.errors import GradcWarning, GradientError
from gradc.ir.builder import Builder
from gradc.ir.graph import FLOAT, CustomRegion, Graph, Node, outermost_regions
from gradc.ir.primitives import COMPOSITE, PRIMITIVES
from gradc.ir.shapes import BroadcastError, broadcast


def vjp(graph: Graph, roots: Sequence[int], cotangents: Sequence[int | None],
        wrt: Sequence[int]) -> list[int | None]:
    """Add ``sum_i <cotangents[i], d roots[i] / d wrt>`` to ``graph``, per ``wrt``."""
    live = live_nodes(graph, roots, wrt)
    cts: dict[int, list[int]] = {}
    for r, c in zip(roots, cotangents):
        if c is not None:
            cts.setdefault(r, []).append(c)
    wanted, results = set(wrt), {}
    for unit in reversed(units(graph, live)):
        if isinstance(unit, CustomRegion):
            if any(i in live for i in unit.inputs):
                _custom_vjp(graph, unit, cts, live)
            else:       # live only through wrt nodes inside it: the walk ends there
                for w in wanted & unit.nodes:
                    results[w] = total(graph, cts.pop(w, []))
            continue
        g = total(graph, cts.pop(unit, []))
        if unit in wanted:
            results[unit] = g
        if g is not None:
            _node_vjp(graph, graph.node(unit), g, cts, live)
    return [results.get(w) for w in wrt]


def live_nodes(graph: Graph, roots: Sequence[int], wrt: Sequence[int]) -> set[int]:
    """Nodes on a differentiable path from some ``wrt`` node to some root."""
    down: set[int] = set(wrt)
    region_of = {n: r for r in outermost_regions(graph) for n in r.nodes}
    needed = graph.ancestors(roots)
    for nid in graph.topo_order():
        node = graph.node(nid)
        if nid in down or not node.args or nid not in needed:
            continue
        region = region_of.get(nid)
        if region is not None:        # a custom rule may pass gradients anywhere
            if any(i in down for i in region.inputs):
                down.add(nid)
            continue
        prim = PRIMITIVES[node.op]
        if any(a in down and prim.vjp[i] is not None for i, a in enumerate(node.args)):
            down.add(nid)
    return down & needed


def _node_vjp(graph: Graph, node: Node, g: int, cts: dict[int, list[int]],
              live: set[int]) -> None:
    prim = PRIMITIVES[node.op]
    b = Builder(graph, span=node.span)     # autodiff nodes point at the primal's source
    for i, (a, rule) in enumerate(zip(node.args, prim.vjp)):
        if rule is None or a not in live:
            continue
        if rule == COMPOSITE:
            ct = COMPOSITES[node.op](b, node, g, i)
        else:
            ct = instantiate(graph, rule, node, {"g": g}, b)
        if not is_zero(graph, ct):
            cts.setdefault(a, []).append(unbroadcast(b, nan_safe(b, node, ct, g), a))


def _custom_vjp(graph: Graph, region: CustomRegion, cts: dict[int, list[int]],
                live: set[int]) -> None:
    ups = [total(graph, cts.pop(o, [])) for o in region.outputs]
    if all(u is None for u in ups):
        return
    rule = region.rule
    since = graph.next_id
    ups, grads = apply_rule(graph, region, ups)
    _check_linear(graph, region, ups, grads, since)
    b = Builder(graph)
    for (p, a), gname, g in zip(region.differentiable_inputs, rule.gradients, grads):
        ct = custom_cotangent(b, region, gname, g, p, a)
        if a in live and not is_zero(graph, ct):
            cts.setdefault(a, []).append(unbroadcast(b, ct, a))


def _check_linear(graph: Graph, region: CustomRegion, ups: list[int], grads: list[int],
                  since: int) -> None:
    """Warn (W401) for each gradient output of a grad block that is not linear in
    the upstream cotangents (see :mod:`gradc.autodiff.linearity`)."""
    rule = region.rule
    if rule.surrogate:         # declared: not meant to be the derivative
        return
    verdict = classify(graph, ups, since)
    name_of = dict(zip(ups, rule.upstreams))
    for gname, g in zip(rule.gradients, grads):
        bad = verdict.get(g)
        if bad is None:
            continue
        node = graph.node(bad.node)
        used = describe_upstreams([name_of[u] for u in ups if u in bad.depends])
        warning = GradcWarning(
            f"gradient '{gname}' of op '{rule.op}' is not linear in the {used}: "
            f"'{surface(node.op)}' is applied to it nonlinearly here",
            node.span or rule.span, "W401",
            ["a VJP is linear in its cotangent; gradient accumulation, loss scaling and "
             "forward mode rely on it (scale or mask the upstream by values of the forward "
             "pass instead)",
             "if this is intended (gradient clipping, a surrogate gradient), write "
             f"'grad({', '.join(rule.upstreams)}) -> ... surrogate {{' to say so"])
        if warning.key() not in {w.key() for w in graph.diagnostics}:
            graph.diagnostics.append(warning)


def _broadcasts_to(shape, other) -> bool:
    """Whether ``shape`` broadcasts to ``other`` (a reduction's smaller result does not)."""
    try:
        return broadcast([shape, other]) == other
    except BroadcastError:
        return False


def custom_cotangent(b: Builder, region: CustomRegion, gname: str, ct: int, pname: str,
                     arg: int) -> int:
    """Gradient ``gname`` (node ``ct``) of ``region``'s grad block for parameter
    ``pname`` (node ``arg``), checked against the parameter's shape: statically
    where both shapes are known (:func:`_check_custom_shape`), else at run time
    (``shape_check``: the parameter's shape must broadcast to the gradient's, or a
    smaller gradient would be broadcast up to it, silently wrong); an integer one
    (``argsort(dy)``) cast to the compute dtype first, as PyTorch casts a gradient to
    its input's dtype.  Both walkers take a grad block's gradients through here."""
    graph = b.graph
    node = graph.node(ct)
    if node.dtype != FLOAT and node.op != "const":   # an integer one (argsort): as PyTorch,
        ct = graph.add("cast", (ct,), None, node.shape, FLOAT, node.span)   # of the dtype
    _check_custom_shape(graph, region, gname, ct, pname, arg)
    got, want = graph.node(ct).shape, graph.node(arg).shape
    if graph.node(ct).op == "const" or _broadcasts_to(want, got):
        return ct           # a constant broadcasts; otherwise true for every run-time shape
    at = region.rule.gradient_spans.get(gname, region.rule.span)
    message = (f"gradient '{gname}' of op '{region.rule.op}' ({at}) has shape {{got}}, but "
               f"parameter '{pname}' has shape {{want}}: a custom gradient must have its "
               "parameter's shape, or a shape the parameter was broadcast to (it is summed "
               "back)")
    return b.apply("shape_check", (ct, arg), {"message": message},
                   span=graph.node(ct).span or region.rule.span)


def _check_custom_shape(graph: Graph, region: CustomRegion, gname: str, ct: int, pname: str,
                        arg: int) -> None:
    """A custom gradient must have its parameter's shape where both are known
    statically (as JAX's custom_vjp requires); a constant (``0``, ``1``) broadcasts.
    One more shape is accepted: a shape the forward broadcast the parameter to
    (``db = dy`` for ``y = x @ w + b``); it is summed back, with a note (N401)
    that ``gradc explain`` shows."""
    rule = region.rule
    got, want = graph.node(ct).shape, graph.node(arg).shape
    if got.dyn or want.dyn or got == want or graph.node(ct).op == "const":
        return
    span = rule.gradient_spans.get(gname, rule.span)
    reached = {graph.node(n).shape for n in nx.descendants(graph.dg, arg) & region.nodes}
    if _broadcasts_to(want, got) and got in reached:
        graph.diagnostics.append(GradcWarning(
            f"gradient '{gname}' has shape {got}, which the forward broadcast parameter "
            f"'{pname}' {want} to: it is summed back to {want}", span, "N401",
            severity="note"))
        return
    wider = sorted(str(s) for s in reached - {want} if _broadcasts_to(want, s))
    notes = [f"the forward broadcasts '{pname}' to {', '.join(wider)} only"] if wider else []
    if region.called and region.span is not None:     # the shapes are the caller's
        notes.append(f"with the shapes of the call of '{rule.op}' at {region.span}")
    raise GradientError(f"gradient '{gname}' has shape {got}, but parameter '{pname}' has "
                        f"shape {want}", span, notes=notes)