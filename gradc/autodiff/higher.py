"""Higher order: ``grad(EXPR, NAME)`` as a value that can be differentiated again.

:func:`gradient` builds the gradient of a scalar node with respect to another
node into the graph (reverse mode, :func:`~gradc.autodiff.reverse.vjp`), then
*detaches* it: the forward values that the new backward nodes read, where they
depend on NAME, are recomputed by a copy of the forward nodes in which the
custom regions whose rules this gradient used are plain nodes.

Why the copy.  A custom rule replaces the derivative of its op *for the
gradient that uses it*.  The gradient it yields is an ordinary function of the
inputs, computed from forward values (the residuals a grad block reads, the
operands the derived rules read); differentiating that function again must
differentiate how those values are computed: the forward body of the custom op,
by its derived rules, as JAX does (its ``custom_vjp`` runs ``fwd`` as an
ordinary function under the outer transformation).  The same nodes may also be
used directly by the op, where an outer derivative must still use the custom
rule: the copy keeps the two apart, and CSE merges it with the original after
differentiation, so the generated code computes each value once.

What stays custom for an outer derivative: custom ops called inside a grad
block or inside a ``grad()`` expression where the inner gradient did not
differentiate them (their regions are copied as regions), and every call of
the op's forward body that the gradient does not read.
"""
from __future__ import annotations

from dataclasses import replace

from gradc.autodiff.core import zeros_like
from gradc.autodiff.regions import copy_nodes
from gradc.autodiff.reverse import live_nodes, vjp
from gradc.ir.builder import Builder
from gradc.errors import Span
from gradc.ir.graph import FLOAT, CustomRegion, Graph, outermost_regions, remap_region
from gradc.ir.primitives import PRIMITIVES


GRAD = "grad"      # the op of a grad() node, until expand_gradients replaces it


def grad_node(graph: Graph, f: int, wrt: int, seed: int, span: Span | None) -> int:
    """A node standing for ``grad(f, wrt)`` (``seed * d f / d wrt``, of ``wrt``'s shape
    class), as the lowering writes it; :func:`expand_gradients` replaces it."""
    return graph.add(GRAD, (f, wrt, seed), None, graph.node(wrt).shape, FLOAT, span)


def expand_gradients(graph: Graph, needed: set[int] | None = None,
                     size=None) -> dict[int, int]:
    """Replace each ``grad()`` node of ``graph`` (those in ``needed`` where given) by
    its gradient (:func:`gradient`), innermost first; return the map from each
    node to its replacement.  ``size`` (a :class:`~gradc.frontend.limits.GraphSize`)
    is checked after each.

    A grad() written inside the body of a custom op's call is differentiated with
    that call's rule out of the way (its region contains the node): the
    derivative of the body is the body's, as the op's rule is what its caller
    sees; the nodes added join the region, as part of its forward body.  Calls
    inside the differentiated expression keep their rules."""
    replaced: dict[int, int] = {}
    for n in graph.topo_order():
        node = graph.node(n)
        if node.op != GRAD or (needed is not None and n not in needed):
            continue
        enclosing = [r for r in graph.regions if n in r.nodes]
        graph.regions = [r for r in graph.regions if n not in r.nodes]
        since = graph.next_id
        g = gradient(graph, *node.args)
        added = frozenset(range(since, graph.next_id))
        graph.regions = graph.regions + [replace(r, nodes=r.nodes | added) for r in enclosing]
        graph.replace_uses(n, g)
        graph.regions = [remap_region(r, {n: g}) for r in graph.regions]
        graph.remove([n])
        replaced[n] = g
        if size is not None:
            size.check(graph, node.span)
    return replaced


def gradient(graph: Graph, f: int, wrt: int, seed: int) -> int:
    """``seed * d f / d wrt`` as a node of ``graph`` (a zero array of ``wrt``'s shape
    where it is a symbolic zero).

    ``f`` is a 0-d float node, ``wrt`` a float node, ``seed`` a 0-d cotangent.
    The result has ``wrt``'s shape class and is differentiable again (see the
    module docstring).  Raises what :func:`~gradc.autodiff.reverse.vjp` raises
    (:class:`~gradc.errors.GradientError`, :class:`~gradc.errors.ShapeError`).
    """
    live = live_nodes(graph, [f], [wrt])
    applied = [r for r in outermost_regions(graph) if any(i in live for i in r.inputs)]
    since = graph.next_id
    (g,) = vjp(graph, [f], [seed], [wrt])
    if g is None:
        return zeros_like(Builder(graph, graph.node(seed).span), wrt)
    mapping = _detach(graph, wrt, since, applied)
    return mapping.get(g, g)


def _detach(graph: Graph, wrt: int, since: int, applied: list[CustomRegion]) -> dict[int, int]:
    """Make the backward nodes (id >= ``since``) read a copy of the forward values
    that depend on ``wrt``, with the ``applied`` regions dissolved in the copy."""
    backward = [n for n in graph.dg.nodes if n >= since]
    reads = {a for n in backward for a in graph.node(n).args if a < since}
    dissolved = frozenset().union(*(r.nodes for r in applied))
    depends = _value_descendants(graph, wrt) | dissolved
    copied = {n for n in graph.ancestors(reads) if n in depends and n < since}
    mapping = copy_nodes(graph, copied, dissolved, applied)
    for n in backward:
        node = graph.node(n)
        graph.update(n, args=tuple(mapping.get(a, a) for a in node.args),
                     shape=node.shape.substitute(mapping))
    graph.regions = [remap_region(r, mapping) if min(r.nodes, default=-1) >= since else r
                     for r in graph.regions]    # custom calls in grad blocks read the copy
    return mapping


def _value_descendants(graph: Graph, wrt: int) -> set[int]:
    """The nodes whose values depend on ``wrt``'s value: descendants along operands
    whose values are read, not along those read only for their shape (a
    ``zeros_like(y)`` does not depend on ``y``, so ``grad(..., dy)`` with
    ``dy = zeros_like(y)`` differentiates the expression's own ``dy``)."""
    out, stack = set(), [wrt]
    while stack:
        n = stack.pop()
        for s in graph.dg.successors(n):
            node = graph.node(s)
            if node.op == GRAD:       # not expanded yet: no gradient being detached reads it
                continue
            shape_only = PRIMITIVES[node.op].shape_only
            if s not in out and any(a == n for i, a in enumerate(node.args)
                                    if i not in shape_only):
                out.add(s)
                stack.append(s)
    return out
