"""gradc's ops written for the frameworks users would otherwise use, from gradc's IR.

* JAX and PyTorch: the op's forward graph evaluated with ``jax.numpy`` or
  ``torch`` (:mod:`gradc.adapters.framework_lowering`) and differentiated by the
  framework's own autodiff; an op with a ``grad`` block (or a call of one) is a
  ``jax.custom_vjp`` or ``torch.autograd.Function`` whose backward is the grad
  block's graph over the forward's residuals.  ``fwd_bwd`` returns the outputs
  and one gradient per differentiable parameter, as gradc's does; JAX's is
  ``jax.jit``-compiled, PyTorch's runs eagerly or under ``torch.compile``.
* numexpr: the ``fwd_bwd`` graph printed as one numexpr expression per output
  (an elementwise graph only), constants as variables of the compute dtype so
  float32 stays float32, and a later output reading an earlier one's buffer
  (``dx`` from ``y``) as a careful numexpr user would write it.

All three are optional imports.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from gradc.ir.builder import Builder
from gradc.adapters.framework_lowering import (Framework, jax_framework, lower_graph,
                                               torch_framework)
from gradc.ir.graph import FLOAT, CustomRegion, Graph, inline
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES, SOURCE

FRAMEWORKS = ("numexpr", "jax.jit", "torch", "torch.compile")


class Unsupported(Exception):
    """This op cannot be written for that framework (the message says why)."""


def diff_positions(cop) -> list[int]:
    return [i for i, p in enumerate(cop.params) if p.differentiable]


# -- custom-gradient regions ---------------------------------------------------------


def grad_block(graph: Graph, region: CustomRegion):
    """The region's backward as nodes over its residuals: ``(graph, upstreams,
    gradients, residuals)``; gradients are one node per differentiable parameter,
    residuals the forward nodes it reads (the residuals of its rule's template)."""
    bg = graph.copy()
    b = Builder(bg)
    rule = region.rule
    ups = [b.param(n, bg.node(o).shape, FLOAT, None)
           for n, o in zip(rule.upstreams, region.outputs)]
    grads = inline(bg, rule.backward, ups)
    return bg, ups, grads, list(rule.backward.residuals)


def _region_parts(graph: Graph, region: CustomRegion, fw: Framework, dtype):
    """(forward: inputs -> (outputs, residuals), backward: (residuals, cotangents) ->
    gradients of the differentiable inputs)."""
    bg, ups, grads, residuals = grad_block(graph, region)
    n_out = len(region.outputs)
    fwd = lower_graph(graph, region.inputs, [*region.outputs, *residuals], fw, dtype)
    bwd = lower_graph(bg, [*residuals, *ups], grads, fw, dtype)

    def forward(xs):
        vals = fwd(*xs)
        return tuple(vals[:n_out]), tuple(vals[n_out:])

    return forward, lambda res, cts: bwd(*res, *cts)


def _jax_region(graph: Graph, fw: Framework, dtype) -> Callable[[CustomRegion], Callable]:
    import jax
    import jax.numpy as jnp

    def make(region: CustomRegion) -> Callable:
        forward, backward = _region_parts(graph, region, fw, dtype)
        diff = region.rule.differentiable

        @jax.custom_vjp
        def f(*xs):
            return forward(xs)[0]

        def f_fwd(*xs):
            outs, res = forward(xs)
            return outs, (res, xs)

        def f_bwd(saved, cts):
            res, xs = saved
            gs = iter(backward(res, cts))
            out = []
            for x, d in zip(xs, diff):
                x = jnp.asarray(x)
                if d:
                    out.append(fw.sum_to(next(gs), tuple(x.shape)).astype(x.dtype))
                elif jnp.issubdtype(x.dtype, jnp.floating):
                    out.append(jnp.zeros_like(x))
                else:
                    out.append(np.zeros(x.shape, jax.dtypes.float0))
            return tuple(out)

        f.defvjp(f_fwd, f_bwd)
        return f

    return make


def _torch_region(graph: Graph, fw: Framework, dtype) -> Callable[[CustomRegion], Callable]:
    import torch

    def make(region: CustomRegion) -> Callable:
        forward, backward = _region_parts(graph, region, fw, dtype)
        diff = region.rule.differentiable
        n_in, n_out = len(region.inputs), len(region.outputs)

        class Region(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *xs):
                outs, res = forward(xs)
                ctx.save_for_backward(*xs, *res)
                return outs if n_out > 1 else outs[0]

            @staticmethod
            def backward(ctx, *cts):
                saved = ctx.saved_tensors
                gs = iter(backward(saved[n_in:], cts))
                return tuple(fw.sum_to(next(gs), tuple(x.shape)).to(x.dtype) if d else None
                             for x, d in zip(saved[:n_in], diff))

        Region.__name__ = f"{region.rule.op}_Function"
        return lambda *xs: (Region.apply(*xs),) if n_out == 1 else Region.apply(*xs)

    return make


def forward_function(cop, fw: Framework, dtype) -> Callable[..., tuple]:
    """The op's forward pass in ``fw``: a function of every parameter, in order.

    The graph is gradc's simplified forward (``x^2`` as ``x * x``, constants
    folded: what a careful user would write) unless the op has custom-gradient
    regions, which only the primal graph keeps (simplification drops them)."""
    g = cop.primal if cop.primal.regions else cop.methods["forward"].graph
    maker = (_jax_region if fw.name == "jax" else _torch_region)(g, fw, dtype)
    run = lower_graph(g, g.params, g.outputs, fw, dtype, maker)
    return lambda *args: tuple(run(*args))


# -- JAX and PyTorch ---------------------------------------------------------------------


def jax_functions(cop, dtype=np.float32) -> tuple[Callable, Callable]:
    """``(forward, fwd_bwd)``, both ``jax.jit``-compiled: ``forward(*params)`` and
    ``fwd_bwd(*params, *upstreams)`` -> outputs then gradients."""
    import jax
    if np.dtype(dtype) == np.float64 and not jax.config.jax_enable_x64:
        raise Unsupported("float64 needs jax_enable_x64")
    forward = forward_function(cop, jax_framework(), dtype)
    diff, n = diff_positions(cop), len(cop.params)

    def fwd_bwd(*args):
        params, ups = list(args[:n]), tuple(args[n:])

        def f(*d):
            full = list(params)
            for i, v in zip(diff, d):
                full[i] = v
            return forward(*full)

        ys, pull = jax.vjp(f, *[params[i] for i in diff])
        return (*ys, *pull(ups))

    return jax.jit(forward), jax.jit(fwd_bwd)


def torch_functions(cop, dtype=np.float32, compile: bool = False) -> tuple[Callable, Callable]:
    """``(forward, fwd_bwd)`` for PyTorch tensors, eager or under ``torch.compile``
    (the forward is compiled; autograd compiles its backward on the first call)."""
    import torch
    forward = forward_function(cop, torch_framework(), dtype)
    if compile:
        forward = torch.compile(forward)
    diff, n = diff_positions(cop), len(cop.params)

    def fwd_bwd(*args):
        params, ups = list(args[:n]), args[n:]
        for i in diff:
            params[i] = params[i].detach().requires_grad_()
        ys = forward(*params)
        wrt = [params[i] for i in diff]
        pairs = [(y, u) for y, u in zip(ys, ups) if y.requires_grad]
        if pairs and wrt:
            gs = torch.autograd.grad([y for y, _ in pairs], wrt, [u for _, u in pairs],
                                     allow_unused=True, materialize_grads=True)
        else:
            gs = [torch.zeros_like(w) for w in wrt]
        return (*(y.detach() for y in ys), *gs)

    return forward, fwd_bwd


def to_torch(values: Sequence, dtype=np.float32) -> list:
    """NumPy arrays (shared, not copied) and scalars as tensors."""
    import torch
    return [torch.from_numpy(np.ascontiguousarray(v) if np.ndim(v) else np.asarray(v))
            for v in values]


# -- numexpr ----------------------------------------------------------------------------

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_NE = {
    "add": "({x} + {y})", "sub": "({x} - {y})", "mul": "({x} * {y})", "div": "({x} / {y})",
    "neg": "(-{x})", "pow": "({x} ** {y})", "atan2": "arctan2({y}, {x})",
    "maximum": "where(({x} > {y}) | ({x} != {x}), {x}, {y})",
    "minimum": "where(({x} < {y}) | ({x} != {x}), {x}, {y})",
    "where": "where({c}, {x}, {y})",
    "zero_masked": "where(({u} == {zero}) & ({x} != {x}), {zero}, {x})",
    "clip": "where(where({x} < {lo}, {lo}, {x}) > {hi}, {hi}, where({x} < {lo}, {lo}, {x}))",
    "full_like": "(ones_like({x}) * {v})", "cast": "{x}", "identity": "{x}",
    "stop_gradient": "{x}", "abs": "abs({x})",
    "sign": "where({x} > {zero}, {one}, where({x} < {zero}, -{one}, {x}))",
    "exp2": "exp({x} * {ln2})", "rsqrt": "({one} / sqrt({x}))", "square": "({x} * {x})",
    "reciprocal": "({one} / {x})", "asin": "arcsin({x})", "acos": "arccos({x})",
    "atan": "arctan({x})", "sigmoid": "({one} / ({one} + exp(-{x})))",
    "softplus": "(where({x} > {zero}, {x}, {zero}) + log1p(exp(-abs({x}))))",
    **{k: f"{k}({{x}})" for k in "floor ceil exp expm1 log log2 log10 log1p sqrt sin cos "
       "tan sinh cosh tanh".split()},
    **{k: f"({{x}} {s} {{y}})" for k, s in _CMP.items()},
}
_MAX_CHARS = 20_000


class NumexprPrinter:
    """numexpr text of graph values: params are ``v0, v1, ...``, constants ``c0, ...``
    (0-d arrays of the compute dtype), earlier outputs ``o0, ...``."""

    def __init__(self, graph: Graph, dtype=np.float32) -> None:
        self.graph, self.dtype = graph, np.dtype(dtype)
        self.names = {p: f"v{k}" for k, p in enumerate(graph.params)}
        self.consts: dict[str, np.ndarray] = {}
        self.memo: dict[int, str] = {}

    def const(self, value: float) -> str:
        v = self.dtype.type(value)
        for name, c in self.consts.items():
            if c.tobytes() == v.tobytes():
                return name
        name = f"c{len(self.consts)}"
        self.consts[name] = v
        return name

    def text(self, nid: int) -> str:
        if nid in self.names:
            return self.names[nid]
        if nid not in self.memo:
            node = self.graph.node(nid)
            if node.op == "const":
                s = self.const(node.value)
            elif node.op not in _NE:
                raise Unsupported(f"numexpr has no '{node.op}'")
            else:
                prim = PRIMITIVES[node.op]
                fields = {p: self._operand(a, node.op == "where" and i == 0)
                          for i, (p, a) in enumerate(zip(prim.params, node.args))}
                fields.update(zero=self.const(0), one=self.const(1), ln2=self.const(np.log(2)))
                s = _NE[node.op].format(**fields)
            if len(s) > _MAX_CHARS:
                raise Unsupported("expression too long for numexpr")
            self.memo[nid] = s
        return self.memo[nid]

    def _operand(self, nid: int, condition: bool) -> str:
        s = self.text(nid)
        is_bool = self.graph.node(nid).op in _CMP and nid not in self.names
        if condition:
            return s if is_bool else f"({s} != {self.const(0)})"
        return f"where({s}, {self.const(1)}, {self.const(0)})" if is_bool else s


def numexpr_program(graph: Graph, dtype=np.float32) -> tuple[list[str], dict[str, Any]]:
    """One numexpr expression per output of an elementwise ``graph`` and the
    constants it names; a later expression names an earlier output ``o<k>``."""
    bad = sorted({n.op for n in graph
                  if PRIMITIVES[n.op].kind not in (ELEMENTWISE, SOURCE)})
    if bad:
        raise Unsupported(f"not elementwise ({', '.join(bad)})")
    pr = NumexprPrinter(graph, dtype)
    exprs = []
    for k, o in enumerate(graph.outputs):
        exprs.append(pr.text(o))
        if o not in pr.names:       # later outputs read this one from its buffer
            pr.names[o] = f"o{k}"
    return exprs, dict(pr.consts)


def numexpr_function(cop, dtype=np.float32, method: str = "fwd_bwd") -> Callable:
    """``fwd_bwd(*params, *upstreams, out=buffers)`` (or another method's call) with
    numexpr, writing the ``out`` buffers and returning them."""
    import numexpr as ne
    graph = cop.methods[method].graph
    exprs, consts = numexpr_program(graph, dtype)
    n = len(graph.params)

    def fwd_bwd(*args, out):
        local = dict(consts)
        local.update((f"v{k}", a) for k, a in enumerate(args[:n]))
        for k, (e, o) in enumerate(zip(exprs, out)):
            ne.evaluate(e, local_dict=local, out=o, casting="same_kind")
            local[f"o{k}"] = o
        return out

    return fwd_bwd
