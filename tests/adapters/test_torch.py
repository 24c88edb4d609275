"""The PyTorch adapter (gradc.adapters.torch) against PyTorch's own checks.

Every op of examples/seed.grad and examples/activations.grad goes through
``torch.autograd.gradcheck`` (reverse and, where the op has a JVP, forward mode) and
``gradgradcheck`` in float64, in the float64 twins of the two files that
tests/adapters/conftest.py shares with the JAX adapter's tests (``f32`` written
``f64``: the ops annotated ``f32[...]`` demand float32; the others are the same
ops, and their derived ops are the JAX tests' too).  gradcheck
compares against finite differences of the forward, so an op whose gradient is a
custom rule that is not the derivative (custom_linear, sign_ste, clipped_relu,
scaled_tanh, and mlp, which calls scaled_tanh) fails it by design: for those the
adapter's gradient and JVP are compared with the op's own ``.vjp`` and ``.jvp``
instead.  gradgradcheck differentiates the backward pass, whatever rule it is,
against finite differences of that backward pass, and holds for every op but mlp:
its VJP reads scaled_tanh's forward value (``d_w2 = h1^T dlogits``), and gradc
differentiates that value by scaled_tanh's rule (docs/second_order.md, rule 3, as
JAX does), half the derivative; mlp's double backward is compared with gradc's own
second order (the VJP of the derived op ``mlp__vjp``) instead.

torch is an optional extra: without it these tests skip, unless GRADC_REQUIRE_TORCH=1
(set by .ci/run), which makes a missing torch a failure.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import pytest

from optional import import_optional  # noqa: E402

torch = import_optional("torch")

import gradc  # noqa: E402
from gradc.adapters import derived  # noqa: E402
from gradc.adapters.torch import as_torch  # noqa: E402
from gradc.loader.disk_cache import cache_dir, write_atomic  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
F64 = torch.float64

# op: (module, shapes of the positional arguments, keywords, nograd positions, kind)
# kind "exact": the gradient is the derivative; "custom": a rule that is not.
CASES = {
    "softplus_stable": ("act64", [(7,)], {}, (), "exact"),
    "gelu_tanh": ("act64", [(7,)], {}, (), "exact"),
    "swish": ("act64", [(7,)], {}, (), "exact"),
    "huber": ("act64", [(7,)], {"delta": 0.8}, (), "exact"),
    "log_sigmoid": ("act64", [(7,)], {}, (), "exact"),
    "leaky_relu": ("act64", [(7,)], {"alpha": 0.2}, (), "exact"),
    "add_bias": ("act64", [(3, 4), (4,)], {}, (), "exact"),
    "critic": ("seed64", [(3, 2), (2,)], {}, (), "exact"),
    "softmax_xent": ("seed64", [(3, 4), (3, 4)], {}, (1,), "exact"),
    "gradient_penalty": ("seed64", [(3, 2), (3, 2), (3, 1), (2,)], {}, (2,), "exact"),
    "custom_linear": ("seed64", [(7,)], {}, (), "custom"),
    "sign_ste": ("seed64", [(7,)], {}, (), "custom"),
    "clipped_relu": ("seed64", [(7,)], {}, (), "custom"),
    "scaled_tanh": ("seed64", [(7,)], {}, (), "custom"),
    "mlp": ("seed64", [(3, 4), (4, 5), (5,), (5, 2), (2,)], {}, (), "custom"),
}
NO_JVP = {"custom_linear", "clipped_relu"}     # grad blocks not linear in dy: E405


def _load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradc.GradcWarning)
        return gradc.load(path)


@pytest.fixture(scope="module")
def modules(seed64, act64):
    """The example modules, and their float64 twins (the ops' annotated shapes
    demand float32; tests/adapters/conftest.py)."""
    return {"seed": _load(EXAMPLES / "seed.grad"), "act": _load(EXAMPLES / "activations.grad"),
            "seed64": seed64, "act64": act64}


def _case(modules, name, seed=0, dtype=F64):
    """The gradc op, its torch function (keywords bound) and random inputs (the
    differentiable ones requiring grad; softmax_xent's onehot one-hot)."""
    mod, shapes, kw, nograd, _ = CASES[name]
    op = modules[mod].OPS[name]
    gen = torch.Generator().manual_seed(seed)
    args = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    if name == "softmax_xent":
        args[1] = torch.nn.functional.one_hot(torch.arange(3) % 4, 4).to(dtype)
    if name == "gradient_penalty":
        args[2] = torch.rand(shapes[2], generator=gen, dtype=dtype)
    for i, a in enumerate(args):
        a.requires_grad_(i not in nograd)
    return op, functools.partial(as_torch(op), **kw), args


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[4] == "exact"])
def test_gradcheck_derived_ops(modules, name):
    _, f, args = _case(modules, name)
    assert torch.autograd.gradcheck(f, args, check_forward_ad=True, check_batched_grad=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n != "mlp"])
def test_gradgradcheck(modules, name):
    _, f, args = _case(modules, name, seed=1)
    assert torch.autograd.gradgradcheck(f, args, check_batched_grad=False)


def test_mlp_double_backward_is_gradcs_second_order(modules):
    op, f, args = _case(modules, "mlp", seed=1)
    y = f(*args)
    ct = torch.randn_like(y, requires_grad=True)
    grads = torch.autograd.grad(y, args, ct, create_graph=True)
    us = [torch.randn_like(g) for g in grads]
    second = torch.autograd.grad(grads, [*args, ct], us)
    mlp_vjp = derived.compile_op(derived.derive(derived.source_of(op), "vjp"))
    expected = mlp_vjp.vjp(*(a.detach().numpy() for a in [*args, ct]),
                           *(u.numpy() for u in us))
    for got, want in zip(second, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[4] == "custom"])
def test_custom_rules_equal_the_ops_own_vjp_and_jvp(modules, name):
    op, f, args = _case(modules, name, seed=2)
    y = f(*args)
    ct = torch.randn_like(y)
    grads = torch.autograd.grad(y, args, ct)
    expected = op.vjp(*(a.detach().numpy() for a in args), ct.numpy())
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-12, atol=1e-14)
    tangents = [torch.randn_like(a) for a in args]
    if name in NO_JVP:
        return
    _, y_t = torch.func.jvp(f, tuple(a.detach() for a in args), tuple(tangents))
    expected = op.jvp(*(a.detach().numpy() for a in args), *(t.numpy() for t in tangents))
    np.testing.assert_allclose(y_t.numpy(), expected[-1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", sorted(NO_JVP))
def test_forward_mode_without_jvp_names_the_op_and_E405(modules, name):
    _, f, args = _case(modules, name)
    x = args[0].detach()
    with pytest.raises(NotImplementedError, match=rf"gradc op '{name}' has no forward mode"
                       r"(.|\n)*E405"):
        torch.func.jvp(f, (x,), (torch.ones_like(x),))
    with torch.autograd.forward_ad.dual_level(), pytest.raises(NotImplementedError, match="E405"):
        f(torch.autograd.forward_ad.make_dual(x, torch.ones_like(x)))
    f(args[0]).sum().backward()          # reverse mode still works
    assert args[0].grad is not None


def test_second_derivative_differentiates_the_rule_as_written(modules):
    """d^2/dx^2 of sum(scaled_tanh(x)) is -y (1 - y^2) (docs/second_order.md), by
    torch.func.grad twice, backward with create_graph, and forward over reverse."""
    st = as_torch(modules["seed"].scaled_tanh)
    x = torch.tensor([0.7], dtype=F64)
    y = np.tanh(0.7)
    want = -y * (1 - y * y)
    assert torch.func.grad(torch.func.grad(lambda x: st(x).sum()))(x[0]).item() == \
        pytest.approx(want, rel=1e-12)
    xr = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(st(xr).sum(), xr, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), xr)
    assert h.item() == pytest.approx(want, rel=1e-12)
    fwd_over_rev = torch.func.jacfwd(torch.func.grad(lambda x: st(x).sum()))(x[0])
    assert fwd_over_rev.item() == pytest.approx(want, rel=1e-12)


def test_second_order_of_a_loss_nonlinear_in_the_output_is_pytorchs(tmp_path):
    """d/dx rule(x, dy = 2 st(x)): PyTorch differentiates a Function's output by
    the Function's backward, so the rule is used again for dy's dependence on x
    (unlike JAX's custom_vjp, tests/adapters/test_jax.py); as_torch equals a
    native autograd.Function with the same rule (recomputing from the saved input,
    whose derivative gradc's derived op takes through the forward body)."""
    (tmp_path / "st.grad").write_text(
        "op st(x) -> y {\n    y = tanh(x)\n}\ngrad(dy) -> dx {\n"
        "    dx = dy * (1 - y^2) * 0.5\n}\n")
    f = as_torch(_load(tmp_path / "st.grad").st)

    class St(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.tanh(x)

        @staticmethod
        def backward(ctx, dy):
            (x,) = ctx.saved_tensors
            return dy * (1 - torch.tanh(x) ** 2) * 0.5

    def second(g):
        x = torch.tensor([0.3, 0.7, -1.2], dtype=F64, requires_grad=True)
        (gx,) = torch.autograd.grad((g(x) ** 2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.sum(), x)[0]

    got = second(f)
    torch.testing.assert_close(got, second(St.apply), rtol=1e-12, atol=0)
    y = torch.tanh(torch.tensor([0.3, 0.7, -1.2], dtype=F64))
    s = 1 - y ** 2              # d/dx [y s]: y' by the rule (s / 2), s' = -2 y s
    torch.testing.assert_close(got, 0.5 * s * (s - 4 * y ** 2), rtol=1e-12, atol=0)


TYPED = "op typed(x: f32[n], k: i32, m: bool[n]) -> y {\n    y = where(m, x * k, 0)\n}\n"


def test_python_numbers_for_integer_parameters_are_never_truncated(tmp_path):
    (tmp_path / "typed.grad").write_text(TYPED)
    f = as_torch(_load(tmp_path / "typed.grad").typed)
    x, m = torch.ones(3), torch.tensor([True, False, True])
    torch.testing.assert_close(f(x, 2, m), torch.tensor([2.0, 0.0, 2.0]))
    with pytest.raises(TypeError, match="typed: argument 'k' must be int32, got float"):
        f(x, 2.5, m)
    with pytest.raises(OverflowError, match="'k' = 1099511627776 does not fit int32"):
        f(x, 2 ** 40, m)


def test_torch_func_transforms(modules):
    act = modules["act"]
    sp, ab = as_torch(act.softplus_stable), as_torch(modules["act64"].add_bias)
    x = torch.randn(5, 4, dtype=F64)
    b = torch.randn(4, dtype=F64)
    g = torch.func.grad(lambda x: sp(x).sum())(x)
    np.testing.assert_allclose(g.numpy(), act.softplus_stable.vjp(x.numpy(), np.ones((5, 4)))[0])
    y, vjp_fn = torch.func.vjp(ab, x, b)
    dx, db = vjp_fn(torch.ones_like(y))
    assert torch.equal(db, torch.full((4,), 5.0, dtype=F64)) and torch.equal(dx, torch.ones_like(x))
    _, y_t = torch.func.jvp(sp, (x,), (torch.ones_like(x),))
    np.testing.assert_allclose(y_t.numpy(), act.softplus_stable.jvp(x.numpy(), 1.0)[1])
    batched = torch.func.vmap(ab, in_dims=(0, None))(torch.randn(3, 5, 4, dtype=F64), b)
    assert batched.shape == (3, 5, 4)
    per_row = torch.func.vmap(torch.func.grad(lambda r: sp(r).sum()))(x)
    np.testing.assert_allclose(per_row.numpy(), g.numpy())


def test_layouts_dtypes_and_partial_requires_grad(modules):
    act = modules["act"]
    sw = as_torch(act.swish)
    base = torch.randn(6, 8)
    x = base[:, ::2].t()                        # non-contiguous float32
    assert not x.is_contiguous()
    xr = x.clone().requires_grad_()             # clone keeps the strides
    y = sw(xr)
    assert y.dtype == torch.float32 and y.shape == x.shape
    np.testing.assert_allclose(y.detach().numpy(), act.swish(np.ascontiguousarray(x.numpy())))
    y.sum().backward()
    assert xr.grad.dtype == torch.float32
    (expected,) = act.swish.vjp(x.numpy(), np.ones((4, 6), np.float32))
    np.testing.assert_allclose(xr.grad.numpy(), expected)
    ab = as_torch(act.add_bias)                 # f32[n, k] + f32[k]: the bias broadcast
    xa = torch.randn(3, 4, requires_grad=True)
    bias = torch.randn(4)                       # no gradient wanted for it
    out = ab(xa, bias)
    assert torch.equal(out, xa.detach() + bias)
    out.backward(torch.ones(3, 4))
    assert torch.equal(xa.grad, torch.ones(3, 4)) and bias.grad is None
    with pytest.raises(TypeError, match=r"add_bias.forward: argument 'x' must be float32, got "
                                        r"float64 \(convert with .to\(torch.float32\)\)"):
        ab(xa.detach().double(), bias.double())
    with pytest.raises(TypeError, match=r"takes 2 positional argument\(s\) \(x, b\), got 1"):
        ab(xa)
    leaky = as_torch(modules["act"].leaky_relu)
    with pytest.raises(TypeError, match=r"takes 1 positional argument\(s\) \(x\), got 2: alpha "
                                        r"is keyword-only.*leaky_relu\(\.\.\., alpha=\.\.\.\)"):
        leaky(torch.ones(3), 0.3)
    with pytest.raises(ValueError, match=r"leaky_relu: argument 'alpha' must be a scalar \(a "
                                         r"number or a 0-d tensor.*got shape \(3,\)"):
        leaky(torch.ones(3), alpha=torch.tensor([0.1, 0.2, 0.3]))
    assert torch.equal(leaky(-torch.ones(3), alpha=torch.tensor(0.25)), torch.full((3,), -0.25))
    with pytest.warns(UserWarning, match=r"leaky_relu: keyword argument 'alpha' requires grad, "
                                         r"but a parameter with a default is a constant"):
        leaky(-torch.ones(3), alpha=torch.tensor(0.25, requires_grad=True))


def test_sparse_tensors_are_type_errors_that_say_so(modules):
    """Was "a float32 tensor has no NumPy dtype"."""
    sw = as_torch(modules["act"].swish)
    dense = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    for sparse in (dense.to_sparse(), dense.to_sparse_csr()):
        with pytest.raises(TypeError, match=r"swish: a tensor of layout torch\.sparse_\w+ is not "
                                            r"supported; pass a dense \(strided\) tensor"):
            sw(sparse)
    assert torch.equal(sw(dense.to_sparse().to_dense()), sw(dense))


def test_results_never_alias_inputs(modules):
    """sign_ste's rule is dx = dy: the gradient must be new memory (PyTorch)."""
    ste = as_torch(modules["seed"].sign_ste)
    x = torch.randn(5, requires_grad=True)
    dy = torch.randn(5)
    (dx,) = torch.autograd.grad(ste(x), x, dy)
    assert torch.equal(dx, dy) and dx.data_ptr() != dy.data_ptr()


def test_torch_compile_fullgraph(modules):
    """A model with a gradc op compiles without a graph break (fullgraph=True), and
    its forward and gradients equal eager mode's."""
    st = as_torch(modules["seed"].scaled_tanh)
    lin = torch.nn.Linear(8, 4)

    def model(x):
        return st(lin(x)).square().mean()

    x = torch.randn(16, 8)
    # aot_eager: Dynamo and AOTAutograd (where graph breaks and the custom ops'
    # fake and autograd registrations matter) without Inductor's C++ build.
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="aot_eager")
    loss = compiled(x)
    grads = torch.autograd.grad(loss, list(lin.parameters()))
    eager = model(x)
    expected = torch.autograd.grad(eager, list(lin.parameters()))
    torch.testing.assert_close(loss, eager)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


@pytest.fixture(scope="module")
def arrays():
    return _load(EXAMPLES / "arrays.grad")


def test_seed_gives_one_mask_to_the_forward_and_its_backward(arrays):
    """arrays.grad's dropout: with seed= the forward is the module's at that seed and
    its backward (the seed saved on ctx, not the mask) the module's vjp, bit for bit,
    dx = where(y != 0, dy / (1 - p), 0); so is the JVP; another seed draws another
    mask; with no seed each call draws a fresh one that its own backward shares."""
    drop = as_torch(arrays.dropout)
    x = torch.linspace(0.1, 2.0, 64).requires_grad_()       # float32, as the JAX tests:
    dy = torch.linspace(-1.0, 1.0, 64)                       # the same kernels
    xn, dyn = x.detach().numpy(), dy.numpy()
    xn.flags.writeable = dyn.flags.writeable = False         # as the adapter passes them
    y = drop(x, p=0.3, seed=5)
    (dx,) = torch.autograd.grad(y, x, dy)
    np.testing.assert_array_equal(y.detach().numpy(), arrays.dropout(xn, p=0.3, seed=5))
    np.testing.assert_array_equal(dx.numpy(), arrays.dropout.vjp(xn, dyn, p=0.3, seed=5)[0])
    _, t = torch.func.jvp(lambda x: drop(x, p=0.3, seed=5), (x.detach(),), (dy,))
    np.testing.assert_array_equal(t.numpy(), arrays.dropout.jvp(xn, dyn, p=0.3, seed=5)[1])
    assert torch.equal(drop(x, p=0.3, seed=torch.tensor(5)), y)     # a 0-d int tensor
    assert not torch.equal(drop(x, p=0.3, seed=6) != 0, y != 0)
    a, b = drop(x, p=0.3), drop(x, p=0.3)
    assert not torch.equal(a != 0, b != 0)
    for y in (a, b):
        (dx,) = torch.autograd.grad(y, x, dy)
        torch.testing.assert_close(dx, torch.where(y != 0, dy / (1 - 0.3), 0),
                                   rtol=1e-6, atol=0)
    x64 = torch.linspace(0.1, 2.0, 16, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: drop(x, p=0.3, seed=5), (x64,))


def test_seed_errors(arrays):
    x = torch.ones(4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):
        as_torch(arrays.softplus)(x, seed=1)            # an op that does not draw
    for bad in (1.5, True, "1", torch.tensor([1, 2]), torch.tensor(1.0)):
        with pytest.raises(TypeError, match="seed= must be an int"):
            as_torch(arrays.dropout)(x, seed=bad)


def test_seed_under_torch_compile(arrays):
    """A seed tensor is traced (no graph break, one mask per seed, the backward's the
    forward's); without a seed each call of the compiled function draws a fresh one."""
    drop = as_torch(arrays.dropout)
    x = torch.linspace(0.1, 2.0, 32).requires_grad_()
    f = torch.compile(lambda x, s: drop(x, seed=s), fullgraph=True, backend="aot_eager")
    y5, y6 = f(x, torch.tensor(5)), f(x, torch.tensor(6))
    assert torch.equal(y5, drop(x, seed=5)) and not torch.equal(y5 != 0, y6 != 0)
    (dx,) = torch.autograd.grad(y5, x, torch.ones_like(x))
    assert torch.equal(dx, torch.where(y5 != 0, 2.0, 0.0))
    g = torch.compile(lambda x: drop(x), fullgraph=True, backend="aot_eager")
    a, b = g(x), g(x)
    assert not torch.equal(a != 0, b != 0)
    (da,) = torch.autograd.grad(a, x, torch.ones_like(x))
    assert torch.equal(da, torch.where(a != 0, 2.0, 0.0))


def test_cuda_tensors_need_a_cuda_module(modules):
    """No GPU here: the CUDA path's refusal of a CPU-only module is what can run."""
    from gradc.adapters.torch import _invoke_cuda
    with pytest.raises(TypeError, match="CUDA tensors need a module compiled with "
                                        "target='cuda' or 'all'"):
        _invoke_cuda(modules["seed"].scaled_tanh, "forward", [], {}, "scaled_tanh",
                     torch.device("cuda"))


def test_several_outputs_and_their_double_backward_error():
    path = cache_dir() / "tests" / "split.grad"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "op split(x) -> (pos, neg) {\n    pos = max(x, 0)\n"
                       "    neg = min(x, 0) * x\n}\n")
    split = as_torch(_load(path).split)
    x = torch.randn(6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(split, (x,), check_forward_ad=True)
    pos, neg = split(x)
    (g,) = torch.autograd.grad(pos.sum() + neg.sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="ops with several outputs cannot be called "
                                                  "inside another op .E306., so gradc cannot "
                                                  "differentiate the VJP of 'split'"):
        g.sum().backward()


def test_torch_digits_example_trains_the_same_model_three_ways(capsys):
    """examples/torch_digits.py for a few steps: the gradc variants and plain PyTorch
    start from the same weights, see the same batches and compute the same
    gradients, so they end with the same weights (to float32 rounding)."""
    pytest.importorskip("sklearn")
    import importlib.util
    spec = importlib.util.spec_from_file_location("torch_digits", EXAMPLES / "torch_digits.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    results, models = example.main(["--steps", "8", "--hidden", "16", "--quiet"])
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("model") and "PyTorch" in table
    reference = dict(models["PyTorch"].named_parameters())
    for name in ("gradc scaled_tanh", "gradc mlp"):
        assert results[name][0] > 0
        for key, p in models[name].named_parameters():
            torch.testing.assert_close(p, reference[key], rtol=1e-4, atol=1e-5)
    # Adam does not see a constant factor in a gradient: compare the gradients too
    x, y = torch.rand(32, 64), torch.arange(32) % 10
    grads = {}
    for name, model in models.items():
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads[name] = [p.grad for p in model.parameters()]
    for name in ("gradc scaled_tanh", "gradc mlp"):
        for g, e in zip(grads[name], grads["PyTorch"]):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_a_module_gradc_did_not_load(import_module_text):
    """A module written by gradc compile and imported by hand: first order works,
    double backward says what it needs (the recorded source of gradc.load)."""
    text = gradc.compile_source("op cube(x) -> y {\n    y = x^3\n}\n", file="cube.grad")
    cube = as_torch(import_module_text(text, "gradc_test_torch_cube").cube)
    x = torch.tensor([2.0], dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(cube(x).sum(), x, create_graph=True)
    assert g.item() == 12.0
    with pytest.raises(NotImplementedError, match=r"'cube' as a differentiable op \(double "
                                                  r"backward\) needs the op's .grad source: "
                                                  r"load the module with gradc.load\(path\)"):
        g.backward()


def test_source_gives_a_module_gradc_did_not_load_its_double_backward(tmp_path,
                                                                      import_module_text):
    """as_torch(op, source=FILE), as as_jax's: the .grad file of a module from gradc
    compile, checked against the module's SOURCE_SHA256, for the double backward."""
    src = tmp_path / "cube.grad"
    src.write_text("op cube(x) -> y {\n    y = x^3\n}\n")
    text = gradc.compile_source(src.read_text(), file=str(src))
    cube = as_torch(import_module_text(text, "gradc_test_torch_cube_source").cube, source=src)
    x = torch.tensor([2.0], dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(cube(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    assert (g.item(), h.item()) == (12.0, 12.0)


@pytest.mark.parametrize("thing", ["np.sin", "op.vjp", "lambda"])
def test_adapters_of_what_is_not_an_op_are_type_errors(modules, thing):
    from gradc.adapters.jax import as_jax
    op = modules["act"].swish
    value = {"np.sin": np.sin, "op.vjp": op.vjp, "lambda": lambda x: x}[thing]
    for adapter in (as_torch, as_jax):
        with pytest.raises(TypeError, match=rf"{adapter.__name__}\(\) expects an op of a "
                                            r"gradc module \(gradc.load\(path\).NAME"):
            adapter(value)


def test_emit_torch_writes_a_module_of_torch_functions(tmp_path, capsys):
    """gradc compile --emit torch -o OUT.py: OUT.py loads the .grad file by its path
    relative to OUT.py and exposes as_torch of every op."""
    import importlib.util
    from gradc.tools.cli import main
    out = tmp_path / "pkg" / "act_torch.py"
    out.parent.mkdir()
    assert main(["compile", str(EXAMPLES / "activations.grad"), "--emit", "torch",
                 "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    text = out.read_text()
    assert "SOURCE = Path(__file__).resolve().parent / '../../" in text
    spec = importlib.util.spec_from_file_location("act_torch", out)
    act_torch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(act_torch)
    assert sorted(act_torch.OPS) == sorted(act_torch.__all__[1:]) == [
        "add_bias", "gelu_tanh", "huber", "leaky_relu", "log_sigmoid", "softplus_stable", "swish"]
    x = torch.tensor([-2.0, 3.0], dtype=F64, requires_grad=True)
    act_torch.leaky_relu(x, alpha=0.1).sum().backward()
    assert x.grad.tolist() == [0.1, 1.0]


@pytest.mark.slow
def test_gradgradcheck_of_a_row_softmax_is_reentrant(tmp_path):
    """gradgradcheck runs each backward twice and demands the same bits: a row's sum
    in the derived op's kernels once changed in its last bit with where its small
    temporaries lay (1-4 seeds of 20 failed "Backward is not reentrant"; see
    test_reduce_kernels.test_results_do_not_depend_on_where_the_arrays_lie)."""
    (tmp_path / "row_softmax.grad").write_text("""
op my_softmax(x: [n, k]) -> y {
  m = stop_gradient(max(x, axis=-1, keepdims=true))
  e = exp(x - m)
  y = e / sum(e, axis=-1, keepdims=true)
}""")
    f = as_torch(_load(tmp_path / "row_softmax.grad").my_softmax)
    for seed in range(20):
        torch.manual_seed(seed)
        x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradgradcheck(f, (x,), check_batched_grad=False)


def test_an_op_with_an_argmax_output_is_differentiated(tmp_path):
    """The argmax output takes no gradient: backward through the float output works
    (PyTorch hands the op an int64 zero cotangent for it)."""
    (tmp_path / "am.grad").write_text(ARGMAX)
    f = as_torch(_load(tmp_path / "am.grad").max_and_index)
    x = torch.tensor([[1.0, 3.0, 2.0], [5.0, 4.0, 6.0]], dtype=torch.float64, requires_grad=True)
    m, i = f(x)
    torch.testing.assert_close(i, torch.tensor([1, 2]))
    (g,) = torch.autograd.grad(m.sum(), x)
    torch.testing.assert_close(g, torch.tensor([[0.0, 1, 0], [0, 0, 1]], dtype=torch.float64))
    # forward mode: no tangent for the argmax (PyTorch demands None there)
    t = torch.tensor([[1.0, 2, 3], [4, 5, 6]], dtype=torch.float64)
    with torch.autograd.forward_ad.dual_level():
        dm, di = f(torch.autograd.forward_ad.make_dual(x.detach(), t))
        torch.testing.assert_close(torch.autograd.forward_ad.unpack_dual(dm).tangent,
                                   torch.tensor([2.0, 6.0], dtype=torch.float64))
        assert torch.autograd.forward_ad.unpack_dual(di).tangent is None
    torch.testing.assert_close(torch.func.jacfwd(lambda a: f(a)[0])(x.detach()),
                               torch.func.jacrev(lambda a: f(a)[0])(x.detach()))



def test_no_grad_runs_the_kernels_and_keeps_forward_mode(modules):
    """Where no graph is recorded (no_grad, a plain backward) the adapter calls the
    kernels without a Function; a dual tensor's tangent still reaches the op's JVP
    there (forward mode records under no_grad too), and inference mode gives values."""
    op, f, (x,) = _case(modules, "softplus_stable")
    t = torch.linspace(-1, 1, x.numel(), dtype=F64).reshape(x.shape)
    want = torch.from_numpy(np.asarray(op(x.detach().numpy())))
    with torch.no_grad():
        y = f(x)
        assert not y.requires_grad and y.grad_fn is None
        torch.testing.assert_close(y, want)
        with torch.autograd.forward_ad.dual_level():
            y = f(torch.autograd.forward_ad.make_dual(x.detach(), t))
            tangent = torch.autograd.forward_ad.unpack_dual(y).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, torch.sigmoid(x.detach()) * t)
    with torch.inference_mode():
        torch.testing.assert_close(f(x), want)

ARGMAX = ("op max_and_index(x: [n, k]) -> (m, i) {\n    m = max(x, axis=-1)\n"
          "    i = argmax(x, axis=-1)\n}\n")


def test_int32_labels_for_an_i64_parameter(tmp_path):
    """Labels of any integer dtype that int64 holds (int32, uint8) are taken for an
    ``i64`` parameter, widened; the loss and gradient are PyTorch's cross_entropy's."""
    f = as_torch(_load(EXAMPLES / "kernels" / "cross_entropy.grad").cross_entropy)
    x = torch.randn(5, 7, dtype=F64, generator=torch.Generator().manual_seed(0),
                    requires_grad=True)
    for dtype in (torch.int32, torch.uint8, torch.int64):
        t = torch.tensor([1, 6, 0, 3, 2], dtype=dtype)
        (g,) = torch.autograd.grad(f(x, t), x)
        want = torch.nn.functional.cross_entropy(x, t.long())
        torch.testing.assert_close(f(x, t), want)
        torch.testing.assert_close(g, torch.autograd.grad(want, x)[0])
