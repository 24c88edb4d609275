"""Lowering: the AST of an op to the graph IR.

Calls of other ops are inlined; a call of an op with a ``grad`` block is
recorded as a :class:`~gradc.ir.graph.CustomRegion`, so autodiff uses the
custom rule there: the block is lowered once, at the call, into a
:class:`~gradc.ir.graph.Template` over the call's residuals
(:func:`lower_rule`), which autodiff copies in where it differentiates the
call, as JAX's ``custom_vjp_call`` holds its ``bwd`` jaxpr.  Expressions of
primitives are lowered by :class:`~gradc.ir.expr.ExprLowerer`, which also
instantiates the derivative rules of the primitive table, so built-in rules
and user overrides share one parser and one instantiation routine.  ``grad()``
is lowered to a ``grad`` node, which :func:`~gradc.autodiff.higher.expand_gradients`
replaces by its gradient once the op is lowered (and, in a grad block, once the
block is): this module imports autodiff, and autodiff never imports it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from gradc.autodiff.higher import GRAD, expand_gradients, grad_node
from gradc.errors import GradcError, GradientError, NameResolutionError, ShapeError
from gradc.frontend import ast
from gradc.frontend.limits import GraphSize
from gradc.ir.builder import Builder
from gradc.ir.expr import ExprLowerer, Scope, dim_scope, eval_const
from gradc.ir.graph import FLOAT, CustomRegion, CustomRule, Graph, Template
from gradc.ir.shapes import Shape

_DTYPE_OF = {"f16": FLOAT, "f32": FLOAT, "f64": FLOAT, "i32": "i32", "i64": "i64",
             "bool": "bool", None: FLOAT}


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a compiled op, as the generated wrappers see it."""

    name: str
    dtype: str | None            # annotation: f16 f32 f64 i32 i64 bool, or None
    shape: tuple | None          # annotated dims, or None for any shape
    default: float | int | bool | None
    has_default: bool
    differentiable: bool


def declared_shape(p: ast.Param) -> tuple | None:
    """The dims a parameter must have: its annotation's, ``()`` for a parameter with
    a default and no shape (a scalar, like ``alpha = 0.01``), else None (any)."""
    if p.type is not None and p.type.shape is not None:
        return tuple(p.type.shape)
    return () if p.default is not None else None


def param_infos(op: ast.OpDef, consts: Mapping[str, float]) -> tuple[ParamInfo, ...]:
    out = []
    for p in op.params:
        t = p.type
        default = None if p.default is None else eval_const(p.default, consts)
        if default is not None and t is not None and t.dtype in ("i32", "i64", "bool"):
            default = bool(default) if t.dtype == "bool" else int(default)   # E307: exact
        out.append(ParamInfo(p.name, t.dtype if t else None, declared_shape(p),
                             default, p.default is not None, p.differentiable))
    return tuple(out)


class Lowerer(ExprLowerer):
    """Lowers the bodies of a program's ops into one graph: expressions of primitives
    (:class:`~gradc.ir.expr.ExprLowerer`), calls of ops (inlined) and ``grad()``."""

    def __init__(self, graph: Graph, ops: Mapping[str, ast.OpDef], consts: Mapping[str, float],
                 *, custom: bool = True, size: GraphSize | None = None) -> None:
        super().__init__(graph, consts)
        self.size = size                 # MAX_GRAPH_SIZE, checked after each grad()
        self.custom = custom             # False: ignore grad blocks (the true derivative)
        self.ops = ops

    def _call(self, e: ast.Call, scope: Scope) -> int:
        if e.func in self.ops:
            return self.call_op(self.ops[e.func], e, scope)
        if e.func == "grad":
            return self._grad(e, scope)
        return super()._call(e, scope)

    # -- calls of ops -------------------------------------------------------
    def call_op(self, op: ast.OpDef, call: ast.Call, scope: Scope) -> int:
        """Inline ``op`` at ``call``; record a CustomRegion if it has a grad block."""
        bound = self._bind(op, call, scope)
        start = self.graph.next_id
        inner: Scope = dict(bound)
        inner.update(dim_scope(self.b, op, inner))
        inner = Lowerer(self.graph, self.ops, self.consts, custom=self.custom,
                        size=self.size).body(op.body, inner)
        outs = [inner[o] for o in op.outputs]
        if len(outs) != 1:
            raise ShapeError(f"op '{op.name}' returns {len(outs)} outputs and cannot be "
                             "used inside an expression", call.span)
        if op.grad is None or not self.custom:
            return outs[0]
        outs = [o if o >= start else self.b.apply("identity", (o,), span=call.span) for o in outs]
        self.graph.regions.append(custom_region(
            self.graph, op, tuple(bound[p.name] for p in op.params), outs, inner, start,
            self.ops, self.consts, call.span, called=True))
        return outs[0]

    def _bind(self, op: ast.OpDef, call: ast.Call, scope: Scope) -> Scope:
        bound: Scope = {}
        for p, a in zip(op.params, call.args):
            bound[p.name] = self.expr(a, scope)
        for k, v in call.kwargs:
            bound[k] = self.expr(v, scope)
        for p in op.params:
            if p.name not in bound:
                if p.default is None:
                    raise NameResolutionError(
                        f"call of '{op.name}' is missing the argument '{p.name}'", call.span)
                bound[p.name] = self.b.const(eval_const(p.default, self.consts), FLOAT, p.span)
        return bound

    def _grad(self, e: ast.Call, scope: Scope) -> int:
        target = e.args[1]
        if not isinstance(target, ast.Name) or target.id not in scope:
            raise NameResolutionError("the second argument of grad() must be a parameter or "
                                      "a name assigned earlier", getattr(target, "span", e.span))
        f = self.expr(e.args[0], scope)
        shape = self.graph.node(f).shape
        if shape.rank != 0:
            what = "a shape known only at run time" if shape.dyn else f"shape {shape}"
            raise ShapeError(f"grad() needs a scalar expression (reduce it, e.g. with sum()); "
                             f"this one has {what}", e.span)
        wrt = scope[target.id]
        if self.graph.node(wrt).dtype != FLOAT:
            raise GradientError(f"grad() with respect to '{target.id}', which is not a float "
                                "value (integer and bool values have no gradient)", target.span)
        return grad_node(self.graph, f, wrt, self.b.const(1.0, FLOAT, e.span), e.span)


def custom_region(graph: Graph, op: ast.OpDef, inputs: tuple[int, ...], outputs: Sequence[int],
                  scope: Scope, start: int, ops: Mapping[str, ast.OpDef],
                  consts: Mapping[str, float], span, called: bool = False) -> CustomRegion:
    """The region of the call of ``op`` whose nodes are those from id ``start`` on
    (its names in ``scope``), with its rule (:func:`lower_rule`); ``called``: by
    another op, at ``span``."""
    rule = lower_rule(graph, op, scope, outputs, ops, consts)
    return CustomRegion(rule, inputs, tuple(outputs),
                        frozenset(range(start, graph.next_id)), span, called)


def lower_rule(graph: Graph, op: ast.OpDef, scope: Scope, outputs: Sequence[int],
               ops: Mapping[str, ast.OpDef], consts: Mapping[str, float]) -> CustomRule:
    """``op``'s grad block as a :class:`CustomRule`, lowered once over the call's
    names ``scope`` (parameters and forward-body names, its residuals) and one
    placeholder per output for its upstream cotangents.

    It is lowered in a scratch copy of ``graph`` where this call is not yet a
    custom region, so a ``grad()`` in the block differentiates the forward body by
    its derived rules (a residual's gradient is its forward body's; the op's own
    rule would recurse), while custom calls inside the body stay custom.  An
    error is kept in the rule and raised where the rule is used, as if the block
    were lowered there."""
    block = op.grad
    rule = CustomRule(op.name, tuple(p.name for p in op.params),
                      tuple(p.differentiable for p in op.params), block.upstreams,
                      block.outputs, block.span, {s.target: s.span for s in block.body},
                      block.surrogate)
    scratch = graph.copy()
    since, known = scratch.next_id, len(scratch.regions)
    b = Builder(scratch)
    ups = [b.param(n, scratch.node(o).shape, FLOAT, block.span)
           for n, o in zip(block.upstreams, outputs)]
    try:
        inner = Lowerer(scratch, ops, consts).body(block.body,
                                                   {**scope, **dict(zip(block.upstreams, ups))})
        _check_gradient_count(op)
        grads = [inner[g] for g in block.outputs]
        if any(scratch.node(n).op == GRAD for n in scratch.ancestors(grads)):
            moved = _stabilize(scratch)             # as lower_op's grad(): see there
        else:
            moved = _kept_dims(scratch, since)
        grads = [moved.get(g, g) for g in grads]
        replaced = expand_gradients(scratch, scratch.ancestors(grads))
    except GradcError as exc:
        return replace(rule, error=exc)
    grads = [replaced.get(g, g) for g in grads]
    return replace(rule, backward=Template.extract(scratch, since, ups, grads,
                                                    scratch.regions[known:]))


def _stabilize(graph: Graph) -> dict[int, int]:
    """Before grad() is expanded: the naive spellings rewritten to stable primitives
    (:func:`gradc.passes.simplify.stabilize_in_place`), so that grad() differentiates
    the forms the op's methods differentiate: the gradient of ``log(1 + exp(x))`` is
    ``sigmoid(x)``, not ``exp(x) / (1 + exp(x))``, inf / inf for large ``x``.  Returns
    each rewritten node's replacement."""
    from gradc.passes.simplify import stabilize_in_place
    return stabilize_in_place(graph)


def _kept_dims(graph: Graph, since: int) -> dict[int, int]:
    """A grad block's ``expand_dims`` of its reductions as keepdims reductions
    (:func:`gradc.passes.simplify.kept_dims_in_place`, on the nodes from ``since`` on);
    each rewritten node's replacement."""
    from gradc.passes.simplify import kept_dims_in_place
    return kept_dims_in_place(graph, since)


def _check_gradient_count(op: ast.OpDef) -> None:
    """The grad block of ``op`` must give one gradient per differentiable parameter."""
    block = op.grad
    n_diff = sum(p.differentiable for p in op.params)
    if n_diff != len(block.outputs):
        raise GradientError(f"the grad block of '{op.name}' gives {len(block.outputs)} "
                            f"gradients, but '{op.name}' has {n_diff} differentiable "
                            "parameters", block.span)


def lower_op(op: ast.OpDef, ops: Mapping[str, ast.OpDef], consts: Mapping[str, float],
             *, custom: bool = True) -> Graph:
    """The primal graph of ``op``: its params, body and outputs.

    ``custom=False`` ignores every ``grad`` block, so that differentiating the
    graph gives the true derivative (for the custom-gradient report of
    ``gradc check``).
    """
    graph = Graph()
    b = Builder(graph)
    scope: Scope = {}
    for p in op.params:
        t = p.type
        dims = declared_shape(p)
        shape = None if dims is None else Shape(dims)
        scope[p.name] = b.param(p.name, shape, _DTYPE_OF[t.dtype if t else None], p.span)
        graph.params.append(scope[p.name])
    scope.update(dim_scope(b, op, scope))
    size = GraphSize(op.name)
    lowerer = Lowerer(graph, ops, consts, custom=custom, size=size)
    start = graph.next_id
    scope = lowerer.body(op.body, scope)
    size.check(graph, op.span, at_grad=False)     # inlined calls without grad() too
    outs = [scope[o] for o in op.outputs]
    if op.grad is not None and custom:    # the op's own grad block replaces its derivative
        outs = [o if o >= start else lowerer.b.apply("identity", (o,), span=op.span)
                for o in outs]
        graph.regions.append(custom_region(graph, op, tuple(graph.params), outs, scope,
                                           start, ops, consts, op.span))
    if any(n.op == GRAD for n in graph):
        moved = _stabilize(graph)
        outs = [moved.get(o, o) for o in outs]
    replaced = expand_gradients(graph, size=size)
    outs = [replaced.get(o, o) for o in outs]
    for name, o in zip(op.outputs, outs):
        graph.set_output(o, name=name)
    return graph
