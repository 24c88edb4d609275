"""Passes: each establishes the invariant its docstring states."""
from __future__ import annotations

import numpy as np
import pytest

from gradc.frontend.check import check_source
from gradc.ir.interpret import interpret
from gradc.ir.verify import verify
from gradc.passes import run
from gradc.passes.cse import eliminate_common_subexpressions
from gradc.passes.dce import eliminate_dead_code
from gradc.passes.fuse import Kernel
from gradc.passes.simplify import simplify
from gradc.pipeline import build_op


def _op(src: str, name: str, **kw):
    program = check_source(src, "t.grad")
    return build_op(program.ops[name], program.ops, program.consts, check=True, **kw)


def _ops(graph) -> list[str]:
    return [n.op for n in graph if n.op not in ("param", "const")]


def test_constants_fold_and_identities_vanish():
    cop = _op("op f(x) -> y { y = (x * 1 + 0) * (2 * 3) - 0 }", "f")
    g = cop.methods["forward"].graph
    assert _ops(g) == ["mul"]
    consts = [n.value for n in g if n.op == "const"]
    assert consts == [6.0]


def test_fold_keeps_broadcast_shape():
    # x + 0 may not drop the add when 0 would change the result's shape class:
    # here the add is what broadcasts b against x.
    cop = _op("op f(x: f32[3, 4], b: f32[4]) -> y { y = x * 0 + b }", "f")
    g = cop.methods["forward"].graph
    assert g.node(g.outputs[0]).shape.static == (3, 4)
    x = np.ones((3, 4)); b = np.arange(4.0)
    np.testing.assert_array_equal(interpret(g, [x, b])[0], np.broadcast_to(b, (3, 4)))


def test_cse_merges_repeated_subexpressions():
    cop = _op("op f(x) -> y { a = sin(x) * 2\n b = sin(x) * 2\n y = a + b }", "f")
    assert _ops(cop.methods["forward"].graph).count("sin") == 1
    assert _ops(cop.methods["forward"].graph).count("mul") == 1


def test_dce_drops_unused_values_but_keeps_params():
    cop = _op("op f(x, z) -> y { unused = exp(z)\n y = sin(x) }", "f")
    g = cop.methods["forward"].graph
    assert _ops(g) == ["sin"]
    assert len(g.params) == 2 and all(p in g for p in g.params)


def test_run_verifies_after_every_pass():
    cop = _op("op f(x) -> y { y = tanh(x) * x }", "f")
    g = run(cop.methods["fwd_bwd"].graph, check=True)
    verify(g)


def test_passes_are_pure():
    cop = _op("op f(x) -> y { y = x * 1 }", "f")
    g = cop.primal
    before = [(n.id, n.op, n.args) for n in g]
    simplify(g); eliminate_common_subexpressions(g); eliminate_dead_code(g)
    assert [(n.id, n.op, n.args) for n in g] == before


def test_elementwise_fwd_bwd_is_one_kernel():
    src = "op st(x) -> y { y = tanh(x) } grad(dy) -> dx { dx = dy * (1 - y^2) * 0.5 }"
    plan = _op(src, "st").methods["fwd_bwd"].fused
    assert len(plan.steps) == 1 and isinstance(plan.steps[0], Kernel)
    k = plan.steps[0]
    assert len(k.inputs) == 2 and len(k.outputs) == 2      # x, dy in; y, dx out


def test_independent_loops_of_one_shape_fuse_horizontally():
    src = "op f(x) -> y { y = 2 * x } grad(dy) -> dx { dx = ones_like(dy) }"
    plan = _op(src, "f").methods["fwd_bwd"].fused
    assert len(plan.steps) == 1


def test_unfused_plan_has_one_kernel_per_primitive():
    src = "op f(x) -> y { y = sin(x) * cos(x) + 1 }"
    m = _op(src, "f").methods["forward"]
    assert len(m.unfused.steps) == 4
    assert all(len(s.nodes) == 1 for s in m.unfused.steps)


def test_reductions_and_matmul_are_kernel_boundaries():
    src = ("op f(x: f32[b, i], w: f32[i, o]) -> y {\n"
           "  h = tanh(x @ w)\n  y = sum(h * h, axis=1) + 1\n}")
    plan = _op(src, "f").methods["forward"].fused
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds == ["LibraryCall", "Kernel", "LibraryCall", "Kernel"]


@pytest.mark.parametrize("fuse", [True, False])
def test_plan_order_respects_dependencies(fuse):
    src = ("op f(x: f32[n, k]) -> y {\n  m = max(x, axis=1, keepdims=true)\n"
           "  e = exp(x - m)\n  y = e / sum(e, axis=1, keepdims=true)\n}")
    cop = _op(src, "f")
    for m in cop.methods.values():
        plan = m.fused if fuse else m.unfused
        ready = set(plan.graph.params) | {n.id for n in plan.graph if n.op == "const"}
        for step in plan.steps:
            nodes = step.nodes if isinstance(step, Kernel) else (step.node,)
            inside = set(nodes)
            for n in nodes:
                node = plan.graph.node(n)
                assert all(a in ready or a in inside for a in node.args)
                assert node.shape.dyn <= ready | inside
            ready |= inside


def test_shape_only_operands_are_not_kernel_inputs():
    src = "op f(x) -> y { y = 2 * x } grad(dy) -> dx { dx = ones_like(dy) }"
    plan = _op(src, "f").methods["fwd_bwd"].fused
    (kernel,) = plan.steps
    names = {plan.graph.node(i).attr("name") for i in kernel.inputs}
    assert names == {"x"}          # dy gives only its shape to ones_like


def _kernels(plan) -> list[Kernel]:
    return [s for s in plan.steps if isinstance(s, Kernel)]


def test_values_for_one_later_loop_are_computed_there():
    """tanh's derivative 1 - t^2 needs only t, which the forward loop stores anyway:
    it is computed in the backward loop (after the matmul), not stored for it."""
    src = ("op f(x: f32[b, i], w: f32[i, h], v: f32[h, o]) -> y {\n"
           "  t = tanh(x @ w)\n  y = sum((t @ v)^2)\n}")
    plan = _op(src, "f").methods["vjp"].fused
    g = plan.graph
    fwd = next(k for k in _kernels(plan) if any(g.node(n).op == "tanh" for n in k.nodes))
    bwd = next(k for k in _kernels(plan) if any(g.node(n).op == "sub" for n in k.nodes))
    assert [g.node(n).op for n in fwd.nodes] == ["tanh"] and len(fwd.outputs) == 1
    assert {g.node(n).op for n in bwd.nodes} == {"square", "sub", "mul"}
    assert fwd.outputs[0] in bwd.inputs and len(bwd.inputs) == 2 and len(bwd.outputs) == 1


def test_values_stay_where_moving_them_would_read_more_arrays():
    """a * c + t would need a, c and t in the later loop instead of one array: stored."""
    src = ("op f(x: f32[n, n], a: f32[n, n], c: f32[n, n], w: f32[n, n]) -> y {\n"
           "  t = tanh(x)\n  y = (t @ w) * (a * c + t)\n}")
    plan = _op(src, "f").methods["forward"].fused
    first, last = _kernels(plan)
    assert len(first.outputs) == 2 and len(last.nodes) == 1


def test_cheap_values_move_into_a_loop_over_their_broadcast_with_a_bias():
    """Shapes known at run time: ``x * 2`` (over shape(x)) moves into the loop over
    the broadcast of x and b that adds b, in every method: one loop, whose shape is the
    broadcast; the un-broadcast gradient reads ``x * 2`` only for its shape, so nothing
    stores it.  An exp is not moved (computed once per element of the larger loop)."""
    cop = _op("op f(x, b) -> y { y = tanh(x * 2 + b) }", "f")
    for name in ("forward", "vjp", "fwd_bwd", "jvp"):
        plan = cop.methods[name].fused
        g = plan.graph
        (kernel, *rest) = [k for k in _kernels(plan) if any(g.node(n).op == "tanh"
                                                            for n in k.nodes)]
        assert not rest and "mul" in {g.node(n).op for n in kernel.nodes}
        x, b = (p for p in g.params if g.node(p).attr("name") in ("x", "b"))
        assert kernel.shape.dyn == {x, b}
        assert not [k for k in _kernels(plan) if k.shape.dyn == {x}
                    and {g.node(n).op for n in k.nodes} == {"mul"} and x in k.inputs]
    plan = _op("op f(x, b) -> y { y = tanh(exp(x) + b) }", "f").methods["forward"].fused
    assert len(_kernels(plan)) == 2


def test_mlp_loss_computes_each_matmul_once():
    """fwd_bwd of a two-layer MLP's loss: the two forward matmuls and four backward
    ones, each once (the backward reuses the forward's hidden layer, never x @ w1
    again), and each transpose once."""
    src = ("op f(x: f32[b, i], w1: f32[i, h], b1: f32[h], w2: f32[h, o]) -> loss {\n"
           "  h1 = tanh(x @ w1 + b1)\n  loss = sum((h1 @ w2)^2)\n}")
    for method in ("vjp", "fwd_bwd"):
        g = _op(src, "f").methods[method].graph
        mms = [n for n in g if n.op == "matmul"]
        assert len(mms) == 6
        assert len({n.args for n in mms}) == 6
        ts = [n.args for n in g if n.op == "transpose"]

        assert sorted(ts) == sorted(set(ts)) and len(ts) == 4      # of x, w1, h1 and w2


def test_zero_cotangent_mask_of_a_constant_multiple_is_removed():
    """Reverse mode masks ``g * y`` where ``g == 0`` and the product is NaN (0 * inf:
    ``zero_masked(g * y, g)``);
    for ``g * 0.5`` the product is never NaN there, so the mask goes (bit-exact),
    while the mask of ``g * x`` (x may be inf) stays."""
    from gradc.frontend.check import check_source
    from gradc.pipeline import build_op
    program = check_source("op f(x) -> y { y = 0.5 * x * x }", "m.grad")
    g = build_op(program.ops["f"], program.ops, program.consts).methods["vjp"].graph
    masks = [n for n in g if n.op == "zero_masked"]
    assert len(masks) == 2                   # dy * x and dy * (0.5 * x): x may be inf
    for m in masks:
        ct = g.node(m.args[0])
        assert ct.op == "mul" and all(g.node(a).op != "const" for a in ct.args)
    assert any(n.op == "mul" and g.node(n.args[1]).op == "const" for n in g)   # (...) * 0.5



def test_zero_cotangent_mask_of_a_bounded_factor_is_removed_and_values_are_kept(monkeypatch):
    """``dy * sigmoid(x)`` (swish) and ``dy * (1 + tanh(u))`` (gelu) are ±0 wherever
    dy == 0 at every non-NaN x, ±inf included, so their masks go; the masks of
    ``dy * x`` (and gelu's ``... * 3x^2``) stay (0 * inf).  Every value is kept, at
    the edges and for a zero cotangent."""
    import importlib
    simplify_module = importlib.import_module("gradc.passes.simplify")
    src = """op swish(x) -> y { y = x * sigmoid(x) }
    op gelu(x) -> y { y = 0.5 * x * (1 + tanh(0.8 * (x + 0.044715 * x^3))) }"""
    program = check_source(src, "m.grad")
    x = np.array([-np.inf, -1e30, -3.0, -0.0, 0.0, 1e-30, 2.0, 1e30, np.inf])

    def vjp(name):
        return build_op(program.ops[name], program.ops, program.consts).methods["vjp"].graph

    for name, kept in (("swish", 1), ("gelu", 2)):
        g = vjp(name)
        masks = [n for n in g if n.op == "zero_masked"]
        assert len(masks) == kept, name
        for m in masks:
            assert not any(g.node(a).op in ("sigmoid", "add") for a in g.node(m.args[0]).args)
        with monkeypatch.context() as mp:      # every mask kept: the unoptimised values
            mp.setattr(simplify_module, "bound", lambda graph, nid: None)
            masked = vjp(name)
        assert len([n for n in masked if n.op == "zero_masked"]) > kept
        for dy in (np.zeros_like(x), np.ones_like(x)):
            got, want = interpret(g, [x, dy])[0], interpret(masked, [x, dy])[0]
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, dy = {dy[0]}")
        assert (interpret(g, [x, np.zeros_like(x)])[0] == 0).all(), name


@pytest.mark.parametrize("expr, want", [
    ("sigmoid(x)", 1.0), ("1 + tanh(x)", 2.0), ("3 * erf(x) - erfc(x)", 5.0),
    ("where(x > 0, atan(x), -2)", 2.0), ("clip(x, -4, 3)", 4.0), ("sigmoid(x)^2", 1.0),
    ("max(sigmoid(x), 0.5)", 1.0), ("x", None), ("exp(x)", None), ("1 / sigmoid(x)", None),
    ("sigmoid(x) * x", None), ("1e20 * 1e20 * tanh(x)", None)])
def test_bound_is_proven_only_for_finite_values(expr, want):
    from gradc.passes.simplify import bound
    program = check_source(f"op f(x) -> y {{ y = {expr} }}", "b.grad")
    g = build_op(program.ops["f"], program.ops, program.consts).methods["forward"].graph
    got = bound(g, g.outputs[0])
    assert got == pytest.approx(want) if want is not None else got is None, expr


def test_logsumexp_is_expanded_in_the_differentiated_graphs_only():
    """vjp, fwd_bwd and jvp use jax.nn.logsumexp's max-shifted form (softmax from the
    forward's exponentials: 2 exp per element, not 3); forward keeps the primitive."""
    program = check_source("op f(x: f32[b, n]) -> y { y = logsumexp(x, axis=1) }", "l.grad")
    built = build_op(program.ops["f"], program.ops, program.consts)
    assert "logsumexp" in _ops(built.methods["forward"].graph)
    for name in ("vjp", "fwd_bwd", "jvp"):
        g = built.methods[name].graph
        assert "logsumexp" not in _ops(g), name
        (m,) = [n for n in g if n.op == "max"]
        assert m.attr("initial") == -np.inf, name          # -inf for an empty row
        assert _ops(g).count("exp") == 1, name
    x = np.array([[1.0, 2.0, 3.0], [-1e4, -1e4 + 1, -np.inf], [1e3, 1e3, 1e3]])
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    value, grad = interpret(built.methods["fwd_bwd"].graph, [x, np.ones(3)])
    np.testing.assert_allclose(value, np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
                               + x.max(1), rtol=1e-15)
    np.testing.assert_allclose(grad, p, rtol=1e-15)


@pytest.mark.parametrize("shift, numpy, rewritten", [
    # the built-in softmaxes' shift, logsumexp's
    ("where(m > -inf, m, 0)", lambda x, m: np.where(m > -np.inf, m, 0), True),
    ("where(m - m == 0, m, 0)", lambda x, m: np.where(m - m == 0, m, 0), True),
    # -inf for a row of -inf, or in a row that is not all -inf (-inf less -inf is NaN)
    ("where(m > -inf, m, -inf)", lambda x, m: np.where(m > -np.inf, m, -np.inf), False),
    # the row's max itself (JAX's x - stop_gradient(max(x))): -inf for a row of -inf,
    # where both forms are NaN; an empty row raises in it
    ("m", lambda x, m: m, True),
    ("stop_gradient(m)", lambda x, m: m, True),
    ("max(x + 0.5, axis=1, keepdims=true)", lambda x, m: (x + 0.5).max(1, keepdims=True),
     False),
    ("max(x, axis=0, keepdims=true)", lambda x, m: x.max(0, keepdims=True), False),
    ("max(x, axis=(0, 1), keepdims=true)", lambda x, m: x.max(keepdims=True), False),
    ("where(m < 0, m, 0)", lambda x, m: np.where(m < 0, m, 0), False),
    ("min(x, axis=1, keepdims=true)", lambda x, m: x.min(1, keepdims=True), False),
    # -inf in float32 (found by helper 44), or where m is +inf
    ("where(m - m == 0, m, -1e39)", lambda x, m: np.where(m - m == 0, m, -1e39), False),
    ("m * -1", lambda x, m: m * -1, False),
    ("min(where(m > -inf, m, 0), 5) + 3",
     lambda x, m: np.minimum(np.where(m > -np.inf, m, 0), 5) + 3, True),
])
def test_max_of_x_less_a_shift_is_the_max_less_the_shift_where_it_is_never_minus_inf(
        shift, numpy, rewritten):
    """max(x - h) -> max(x) - h (one max of the row, one pass of the kernel fewer: the
    built-in log_softmax's derived gradient) where h is never -inf; the same values as
    written at every special row (rounding is monotone)."""
    src = ("op f(x: f32[b, n]) -> y {\n    m = max(x, axis=1, keepdims=true)\n"
           f"    h = {shift}\n    y = max(x - h, axis=1, keepdims=true)\n}}\n")
    g = _op(src, "f").methods["forward"].graph
    assert (g.node(g.outputs[0]).op == "sub") == rewritten, _ops(g)
    x = np.array([[1.0, -2, 3, 0], [-np.inf, -np.inf, -np.inf, -np.inf],
                  [-np.inf, 5, 1e30, -1e30], [np.inf, 0, 1, -np.inf], [np.nan, 0, 1, 2],
                  [1e300, -1e300, 1e-300, -0.0], [7, 7, 7, 7], [-np.inf, 2, -np.inf, 2]])
    with np.errstate(all="ignore"):     # float64: the interpreter's float32 is float64
        want = (x - numpy(x, x.max(1, keepdims=True))).max(1, keepdims=True)
        got = interpret(g, [x])[0]
    np.testing.assert_array_equal(got, want, err_msg=shift)


@pytest.mark.parametrize("initial", [None, -np.inf])
def test_max_of_x_less_its_max_with_an_initial_is_not_rewritten(initial):
    """max(x - max(x)) -> max(x) - max(x) only where the inner max has no initial, so
    that an empty row raises in it: with initial=-inf, max(x - h, initial=-inf) of an
    empty row is -inf and h - h NaN."""
    from gradc.ir.builder import Builder
    from gradc.ir.graph import FLOAT, Graph
    from gradc.ir.shapes import Shape
    g = Graph()
    b = Builder(g)
    x = b.param("x", Shape(("b", "n")), FLOAT, None)
    kw = {"axis": (1,), "keepdims": True}
    h = b.apply("max", (x,), {**kw, "initial": initial} if initial else kw)
    g.params.append(x)
    g.set_output(b.apply("max", (b.apply("sub", (x, h)),), {**kw, "initial": -np.inf}))
    out = simplify(g)
    assert (out.node(out.outputs[0]).op == "sub") == (initial is None), _ops(out)
    x = np.array([[1.0, -np.inf, 3], [-np.inf, -np.inf, -np.inf], [np.nan, 0, 1]])
    with np.errstate(all="ignore"):
        want = (x - x.max(1, keepdims=True)).max(1, keepdims=True)
        np.testing.assert_array_equal(interpret(out, [x])[0], want)


@pytest.mark.parametrize("axes, kept", [("-1", True), ("1", True), ("(1,)", True),
                                        ("0", False)])
def test_expand_dims_of_a_reduction_is_the_reduction_with_keepdims(axes, kept):
    """expand_dims(max(x, axis=1), 1) -> max(x, axis=1, keepdims=true) (a row value a reduce kernel
    fuses, where expand_dims is a library call), along the same axes only (axis 0: a
    new leading axis), and only where every use of the reduction is such a one."""
    src = (f"op f(x: f32[n, n]) -> y {{\n    e = exp(x - expand_dims(max(x, axis=1), {axes}))\n"
           f"    y = e / expand_dims(sum(e, axis=1), axis={axes})\n}}\n"
           "op g(x: f32[b, n]) -> (y, m) {\n    m = max(x, axis=1)\n"
           "    y = x - expand_dims(m, -1)\n}\n")
    g = _op(src, "f").methods["forward"].graph
    assert ("expand_dims" not in _ops(g)) == kept, _ops(g)
    assert all(n.attr("keepdims") == kept for n in g if n.op in ("max", "sum"))
    x = np.array([[1.0, -2, 3, 0], [5, 5, -np.inf, 1], [0, 0, 0, 0], [2, 1e300, -1e300, 3]])
    shape = (-1, 1) if kept else (1, -1)
    e = np.exp(x - x.max(1).reshape(shape))
    np.testing.assert_allclose(interpret(g, [x])[0], e / e.sum(1).reshape(shape), rtol=1e-15)
    shared = _op(src, "g").methods["forward"].graph     # m is an output too: kept as is
    assert "expand_dims" in _ops(shared)


@pytest.mark.parametrize("red, axes, kept", [("-1", "-1", True), ("(0, -1)", "(0, -1)", True),
                                             ("1", "1", True), ("1", "-1", False)])
def test_expand_dims_of_a_reduction_before_differentiation(red, axes, kept):
    """The same before differentiation, at a rank known only at run time (an axis
    spelled the same way is the same axis of x in both), and through stop_gradient
    (JAX's softmax and log-softmax with expand_dims): every method's graph has the
    keepdims reduction, so its derivative is the keepdims one's, and no expand_dims
    or shape class refers to the old nodes.  At this rank 1 and -1 are not seen to be
    the same axis: kept as written."""
    src = (f"op f(x) -> y {{\n    m = expand_dims(stop_gradient(max(x, axis={red})), "
           f"axis={axes})\n    e = exp(x - m)\n"
           f"    y = e / expand_dims(sum(e, axis={red}), axis={axes})\n}}\n")
    cop = _op(src, "f")
    x = np.random.default_rng(0).standard_normal((3, 5)) * 4
    for name, method in cop.methods.items():
        g = method.graph
        assert ("expand_dims" not in _ops(g)) == kept, (name, _ops(g))
        if kept:
            assert all(n.attr("keepdims") for n in g if n.op in ("max", "sum")), name
            assert {d for n in g for d in n.shape.dyn} <= {n.id for n in g}, name
    axis = eval(red)
    e = np.exp(x - x.max(axis, keepdims=True))
    np.testing.assert_allclose(interpret(cop.methods["forward"].graph, [x])[0],
                               e / e.sum(axis, keepdims=True), rtol=1e-15)


def test_expand_dims_naming_one_axis_twice_is_not_the_reduction_with_keepdims():
    """expand_dims(sum(x, -1), (-1, 1)) of a rank-2 x adds two axes (found by helper
    49: the two name one axis modulo the rank, which is not the one the reduction
    took): kept as written, with NumPy's shapes and values."""
    src = ("op c(x: f32[n, k]) -> y {\n    y = x * expand_dims(sum(x, axis=-1), axis=(-1, 1))\n}\n"
           "op t(x: f32[n, k]) -> y {\n    y = expand_dims(max(x, axis=0), axis=(0, -2))\n}\n")
    x = np.arange(6.0).reshape(2, 3)
    for name, want in (("c", x * np.expand_dims(x.sum(-1), (-1, 1))),
                       ("t", np.expand_dims(x.max(0), (0, -2)))):
        g = _op(src, name).methods["forward"].graph
        assert "expand_dims" in _ops(g), name
        got = interpret(g, [x])[0]
        assert got.shape == want.shape and np.array_equal(got, want), name


def test_shape_classes_follow_the_rewritten_nodes(import_module_text):
    """At a rank known only at run time the rewritten node's shape class is the one
    the classes use (helper 49): x - expand_dims(stop_gradient(max(x)), -1), whose vjp
    needs the max only for its shape, compiles (it made a kernel with no outputs), and
    so do x / sqrt(sum(x * x, -1)) with keepdims or expand_dims, whose sum became a
    norm (a class kept the sum: a cycle in the kernel plan)."""
    import gradc
    src = ("op f(x) -> y {\n    y = x - expand_dims(stop_gradient(max(x, axis=-1)), -1)\n}\n"
           "op g(x) -> y {\n    y = x / sqrt(expand_dims(sum(x * x, axis=-1), axis=-1))\n}\n"
           "op h(x) -> y {\n    y = x / sqrt(sum(x * x, axis=-1, keepdims=true))\n}\n")
    m = import_module_text(gradc.compile_source(src, file="t.grad"), "shape_classes_ops")
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    np.testing.assert_array_equal(m.f.vjp(x, dy)[0], dy)
    np.testing.assert_allclose(m.f(x), x - x.max(-1, keepdims=True), rtol=1e-15)
    n = np.sqrt((x * x).sum(-1, keepdims=True))
    want = dy / n - x * (x * dy).sum(-1, keepdims=True) / n ** 3
    for op in (m.g, m.h):
        np.testing.assert_allclose(op(x), x / n, rtol=1e-14)
        np.testing.assert_allclose(op.vjp(x, dy)[0], want, rtol=1e-12)


def _traffic(cop, method: str) -> dict:
    from gradc.passes.fuse_reduce import cpu_plan
    from gradc.tools.explain import element_traffic
    return {str(s): b for s, b in element_traffic(cpu_plan(cop.methods[method].fused)).items()}


def test_a_one_hot_is_compared_in_the_loop_that_reads_it_never_stored():
    """one_hot(t, k) is the labels compared with the column inside the loop: an
    elementwise loop reads the labels once per row (a reduce kernel without
    reductions, not the labels broadcast to (n, k) first), and a cross-entropy's
    gradient, its one-hot and label smoothing included, is one row kernel that reads
    the logits and writes the gradient (it was 7 arrays per element, the one-hot a
    dense array read by a loop of its own)."""
    from pathlib import Path

    from gradc.frontend.check import load_program
    from gradc.passes.fuse_reduce import ReduceKernel, cpu_plan
    from gradc.tools.explain import moved_per_element
    cop = _op("op oh(x: [n, k], t: i64[n]) -> y { y = one_hot(t, k) * x }", "oh")
    plan = cpu_plan(cop.methods["fwd_bwd"].fused)
    (loop,) = [s for s in plan.steps if isinstance(s, Kernel)]
    assert isinstance(loop, ReduceKernel) and not loop.partials
    assert _traffic(cop, "fwd_bwd")["(n, k)"] == 16          # x, dy in; y, dx out
    path = Path(__file__).parents[2] / "examples" / "kernels" / "cross_entropy.grad"
    program = load_program(path)
    xent = build_op(program.ops["cross_entropy"], program.ops, program.consts)
    for method in ("vjp", "fwd_bwd"):
        plan = cpu_plan(xent.methods[method].fused)
        rows = [s for s in plan.steps if isinstance(s, Kernel) and str(s.shape) == "(n, v)"]
        assert len(rows) == 1 and isinstance(rows[0], ReduceKernel)
        assert [plan.graph.node(n).op for n in moved_per_element(plan.graph, rows[0])] == [
            "param", "div"]                                     # logits in, dx out
