"""Forward mode, ``NAME.jvp`` (SPEC §2; issue 6, parts 1, 2 and 5).

* every op of both spec-example files: ``jvp`` fused and unfused against the IR
  interpreter, and against ``vjp`` by the adjoint identity ``<J t, u> = <t, J^T u>``;
* custom ops: a linear grad block is transposed into the op's JVP (a table with
  one transposition rule per linear primitive), a nonlinear one is a clear error
  naming the op and the grad block's line (the module still compiles);
* the tangent conventions: one tangent per differentiable parameter, broadcast
  to its shape, ``out=``, dtypes;
* ``gradc check``'s forward-mode and second-order checks notice a wrong rule.
"""
from __future__ import annotations

import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import gradc
from gradc.audit.gradcheck import check_jvp, check_second_order, sample_inputs
from gradc.frontend.check import check_source, load_program
from gradc.ir.interpret import interpret
from gradc.pipeline import build_op
from gradc.tools.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NO_JVP = {"custom_linear": 9, "clipped_relu": 28}     # op -> line of the E405 error


def _compile(text: str, file: str, **options) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradc.GradcWarning)
        return gradc.compile_source(text, file=file, **options)


@pytest.fixture(scope="module")
def spec_modules():
    """The examples as gradc.load gives them: one module each per process (and Numba's
    kernels beside it in the run's cache), which the other files that load them
    share, instead of a copy of this file's whose kernels were compiled again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gradc.GradcWarning)
        return {stem: gradc.load(EXAMPLES / f"{stem}.grad") for stem in ("seed", "activations")}


@lru_cache(maxsize=None)
def _compiled(stem: str, name: str, custom: bool = True):
    program = load_program(str(EXAMPLES / f"{stem}.grad"))
    return build_op(program.ops[name], program.ops, program.consts, custom=custom)


def _inputs(cop, seed: int, dtype=np.float64):
    """Random inputs (defaults for keyword parameters) and one tangent per
    differentiable parameter; positional and keyword arguments for the module."""
    rng = np.random.default_rng(seed)
    xs = sample_inputs(cop, rng)
    ints = {"i32": np.int32, "i64": np.int64}
    xs = [x.astype(dtype) if np.asarray(x).dtype.kind == "f" else
          x.astype(ints.get(p.dtype, x.dtype)) for x, p in zip(xs, cop.params)]
    ts = [rng.standard_normal(np.shape(x)).astype(dtype)
          for x, p in zip(xs, cop.params) if p.differentiable]
    pos = [x for x, p in zip(xs, cop.params) if not p.has_default]
    kw = {p.name: x for x, p in zip(xs, cop.params) if p.has_default}
    return xs, ts, pos, kw


SPEC_OPS = [(stem, name) for stem in ("seed", "activations")
            for name in load_program(str(EXAMPLES / f"{stem}.grad")).main_ops]


@pytest.mark.parametrize("stem, name", SPEC_OPS, ids=[n for _, n in SPEC_OPS])
def test_spec_example_jvp_matches_the_interpreter_and_the_vjp(spec_modules, stem, name):
    cop = _compiled(stem, name)
    op = getattr(spec_modules[stem], name)
    if name in NO_JVP:       # the error itself: test_nonlinear_grad_block_makes_jvp_...
        assert "jvp" not in cop.methods and f"seed.grad:{NO_JVP[name]}:" in cop.missing["jvp"]
        with pytest.raises(NotImplementedError, match=f"{name}.jvp: .*error\\[E405\\]"):
            op.jvp(np.ones(3), np.ones(3))
        return
    dtype = np.float32 if any(p.dtype == "f32" for p in cop.params) else np.float64
    xs, ts, pos, kw = _inputs(cop, seed=3, dtype=dtype)
    want = interpret(cop.methods["jvp"].graph, xs + ts, dtype)
    n_out = len(cop.op.outputs)
    assert len(want) == 2 * n_out
    rng = np.random.default_rng(4)
    us = [rng.standard_normal(np.shape(y)).astype(dtype) for y in want[:n_out]]
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    for impl in (op, op.unfused):
        got = impl.jvp(*pos, *ts, **kw)
        assert isinstance(got, tuple) and len(got) == 2 * n_out
        for g, w in zip(got, want):
            assert g.shape == np.shape(w) and g.dtype == dtype, (name, g.shape, g.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=name)
        # the adjoint identity between the module's own jvp and vjp
        cts = impl.vjp(*pos, *us, **kw)
        lhs = sum(np.vdot(jt.astype(np.float64), u) for jt, u in zip(got[n_out:], us))
        rhs = sum(np.vdot(ct.astype(np.float64), t) for ct, t in zip(cts, ts))
        assert abs(lhs - rhs) <= 100 * rtol * max(abs(lhs), abs(rhs), 1.0), (name, lhs, rhs)


@pytest.mark.parametrize("stem, name", [s for s in SPEC_OPS if s[1] not in NO_JVP],
                         ids=[n for _, n in SPEC_OPS if n not in NO_JVP])
def test_spec_example_jvp_passes_the_float64_checks(stem, name):
    cop, true = _compiled(stem, name), _compiled(stem, name, custom=False)
    rng = np.random.default_rng(5)
    xs = sample_inputs(cop, rng)
    assert check_jvp(cop, xs, rng) < 1e-12
    assert check_second_order(true, xs, rng) < 1e-6


def test_scaled_tanh_jvp_is_its_grad_block_transposed(spec_modules):
    """The guide's scaled_tanh: the custom VJP is dy * (1 - y^2) * 0.5, so the JVP is
    0.5 * (1 - tanh(x)^2) * t, not tanh's derivative."""
    op = spec_modules["seed"].scaled_tanh
    for dtype in (np.float64, np.float32):
        x = np.linspace(-3, 3, 13).astype(dtype)
        t = np.cos(np.arange(13)).astype(dtype)
        want = 0.5 * (1 - np.tanh(x.astype(np.float64)) ** 2) * t
        for impl in (op, op.unfused):
            y, yt = impl.jvp(x, t)
            assert y.dtype == yt.dtype == dtype
            np.testing.assert_allclose(y, np.tanh(x), rtol=1e-6)
            np.testing.assert_allclose(yt, want, rtol=1e-12 if dtype == np.float64 else 1e-6,
                                       atol=1e-7)
    (y, yt) = _interp(_compiled("seed", "scaled_tanh"), [np.array([0.0, 1.0])],
                      [np.array([1.0, 1.0])])
    np.testing.assert_allclose(yt, [0.5, 0.2099871], rtol=1e-6)


def _interp(cop, xs, ts):
    return interpret(cop.methods["jvp"].graph, list(xs) + list(ts))


def test_surrogate_sign_ste_transposes_to_the_identity(spec_modules):
    op = spec_modules["seed"].sign_ste
    x, t = np.array([-2.0, -1, 0, 1, 2]), np.array([1.0, -2, 3, -4, 5])
    for impl in (op, op.unfused):
        y, yt = impl.jvp(x, t)
        np.testing.assert_array_equal(y, [-1, -1, 0, 1, 1])
        np.testing.assert_array_equal(yt, t)


CLIPPED_RELU_ERROR = """\
seed.grad:28:10: error[E405]: op 'clipped_relu' has no forward mode: gradient 'dx' of its \
grad block is not linear in the upstream 'dy': 'clip' is applied to it nonlinearly here
    28 |     dx = clip(dy * (x > 0), -1, 1)
       |          ^^^^
    = note: forward mode transposes the grad block of 'clipped_relu' (line 27) into its \
JVP; only a map linear in the upstreams has a transpose (JAX's custom_vjp has no forward \
mode at all)
    = note: make the block linear in the upstreams (scale or mask them by values of the \
forward pass), or use .vjp/.fwd_bwd, which use the block as written"""


def test_nonlinear_grad_block_makes_jvp_a_clear_error(import_module_text):
    """clipped_relu's clip(dy * (x > 0), -1, 1) is not linear in dy: the module
    compiles (with a W405 warning), every other method works, jvp raises the
    compiler's error with the grad block's line."""
    text = (EXAMPLES / "seed.grad").read_text(encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module_text = gradc.compile_source(text, file="seed.grad")
    w405 = {w.message.message.split(":")[0]: w.message for w in caught
            if issubclass(w.category, gradc.GradcWarning) and w.message.code == "W405"}
    assert sorted(w405) == ["op 'clipped_relu' has no forward mode",
                            "op 'custom_linear' has no forward mode"]
    assert w405["op 'clipped_relu' has no forward mode"].span.line == 28
    m = import_module_text(module_text, "gradc_test_forward_errors")
    x = np.array([-1.0, 2.0])
    for impl in (m.clipped_relu, m.clipped_relu.unfused):
        with pytest.raises(NotImplementedError) as exc:
            impl.jvp(x, np.ones(2))
        assert str(exc.value) == "clipped_relu.jvp: " + CLIPPED_RELU_ERROR
        np.testing.assert_array_equal(impl.vjp(x, np.array([5.0, 5.0]))[0], [0, 1])
    with pytest.raises(NotImplementedError, match=r"custom_linear.jvp: seed.grad:9:5: "
                       r"error\[E405\]: .*gradient 'dx' of its grad block does not depend "
                       r"on the upstream 'dy' and is not 0"):
        m.custom_linear.jvp(x, x)


def test_gradc_compile_warns_and_check_reports_forward_mode(tmp_path, capsys):
    assert main(["compile", str(EXAMPLES / "seed.grad"), "-o", str(tmp_path / "s.py")]) == 0
    err = capsys.readouterr().err
    assert "seed.grad:28:10: warning[W405]: op 'clipped_relu' has no forward mode" in err
    assert "its jvp method raises this error" in err
    assert main(["check", str(EXAMPLES / "seed.grad")]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = {l.split(":")[0].split()[-1]: (l, nxt) for l, nxt in zip(out, out[1:])
             if l.startswith(("ok", "FAIL"))}
    assert "jvp vs vjp (adjoint identity) rel. error" in lines["scaled_tanh"][1]
    assert "second order (jvp of vjp vs finite differences of vjp)" in lines["mlp"][1]
    assert "no jvp: " in lines["clipped_relu"][1] and "seed.grad:28:10: op 'clipped_relu'" \
        in lines["clipped_relu"][1]


# ---- transposition: one linear grad block per transposition rule --------------------

TRANSPOSED = """
op mulc(x) -> y {
    y = 3 * x
} grad(dy) -> dx {
    dx = dy * 3
}
op fan(x, w) -> (y, z) {
    y = x + w
    z = x - 2 * w
} grad(dy, dz) -> (dx, dw) {
    dx = dy + dz
    dw = dy - dz * 2
}
op negated(x) -> y {
    y = -sin(x)
} grad(dy) -> dx {
    dx = -dy * cos(x)
}
op halve(x) -> y {
    y = x / 2
} grad(dy) -> dx {
    dx = dy / 2
}
op relu(x) -> y {
    y = max(x, 0)
} grad(dy) -> dx {
    dx = where(x > 0, dy, 0)
}
op rowsum(x: f64[n, k]) -> s {
    s = sum(x, axis=1, keepdims=true)
} grad(ds) -> dx {
    dx = ds * ones_like(x)
}
op total(x) -> s {
    s = sum(x)
} grad(ds) -> dx {
    dx = ds + zeros_like(x)
}
op centered(x: f64[n]) -> y {
    y = x - mean(x)
} grad(dy) -> dx {
    dx = dy - mean(dy)
}
op scale_sum(x: f64[n], w: f64[n]) -> y {
    y = x * sum(w)
} grad(dy) -> (dx, dw) {
    dx = dy * sum(w)
    dw = zeros_like(w) + sum(dy * x)
}
op lin(x: f64[n, k], w: f64[k, m]) -> y {
    y = x @ w
} grad(dy) -> (dx, dw) {
    dx = dy @ w.T
    dw = x.T @ dy
}
op frozen(x) -> y {
    y = 3 * x
} grad(dy) -> dx {
    dx = 3 * stop_gradient(dy)
}
op scaled_n(x, n: i32) -> y {
    y = x * n
} grad(dy) -> dx {
    dx = dy * n
}
op dbl(a) -> b {
    b = 2 * a
} grad(db) -> da {
    da = 2 * db
}
op nested(x) -> y {
    y = 4 * x
} grad(dy) -> dx {
    dx = dbl(dbl(dy))
}
op bias(x: f64[b, o], c: f64[o]) -> h {
    h = tanh(x + c)
} grad(dh) -> (dx, dc) {
    dx = dh * (1 - h^2)
    dc = dh * (1 - h^2)
}
op caller(x, w) -> y {
    y = relu(x * w) + mulc(w)
}
"""
# Each grad block above is the true derivative written with the primitives whose
# transposes forward mode needs: mul by a factor that does not read the upstream,
# add and sub (fan-out), neg, div, where, sum <-> broadcast, sum_to <-> broadcast
# (rowsum, total, bias), mean, matmul and transpose, stop_gradient, a cast integer
# factor, a nested custom op (its own rule transposed); caller uses two of them.
TRANSPOSED_OPS = ["mulc", "fan", "negated", "halve", "relu", "rowsum", "total", "centered",
                  "scale_sum", "lin", "frozen", "scaled_n", "nested", "bias", "caller"]


@lru_cache(maxsize=None)
def _transposed(name: str, custom: bool = True):
    program = check_source(TRANSPOSED, "transposed.grad")
    return build_op(program.ops[name], program.ops, program.consts, custom=custom)


@pytest.mark.parametrize("name", TRANSPOSED_OPS)
def test_linear_grad_block_transposes_to_the_derived_jvp(name):
    """Each block is the true VJP, so its transpose must equal the JVP that forward
    mode derives from the forward body with the grad blocks ignored."""
    cop, true = _transposed(name), _transposed(name, custom=False)
    assert "jvp" in cop.methods, cop.missing
    assert cop.primal.regions, name        # the custom rule is what is transposed
    for seed in range(3):
        xs, ts, _, _ = _inputs(cop, seed)
        got, want = _interp(cop, xs, ts), _interp(true, xs, ts)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=name)
        assert check_jvp(cop, xs, np.random.default_rng(seed)) < 1e-12


def test_transposed_jvps_compile_and_run(import_module_text):
    m = import_module_text(_compile(TRANSPOSED, "transposed.grad"), "gradc_test_transposed")
    for name in TRANSPOSED_OPS:
        cop = _transposed(name)
        xs, ts, pos, kw = _inputs(cop, seed=7)
        want = _interp(cop, xs, ts)
        op = getattr(m, name)
        for impl in (op, op.unfused):
            got = impl.jvp(*pos, *ts, **kw)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("block, where", [
    ("dx = dy * dy", "'*' is applied"),
    ("dx = dy + 1", "'+' is applied"),
    ("dx = where(dy > 0, dy, 0)", "'>' is applied"),
    ("dx = abs(dy)", "'abs' is applied"),
    ("dx = x", "does not depend on the upstream 'dy' and is not 0"),
])
def test_nonlinear_blocks_have_no_jvp(block, where):
    program = check_source(f"op f(x) -> y {{\n    y = x\n}} grad(dy) -> dx {{\n    {block}\n}}\n",
                           "n.grad")
    cop = build_op(program.ops["f"], program.ops, program.consts)
    assert "jvp" not in cop.methods
    msg = cop.missing["jvp"]
    assert msg.startswith("n.grad:4:") and "error[E405]: op 'f' has no forward mode" in msg
    assert where in msg
    assert [w.code for w in cop.diagnostics if w.code == "W405"] == ["W405"]


def test_zero_gradient_block_transposes_to_a_zero_tangent():
    program = check_source("op f(x, w) -> y {\n    y = x * w\n} grad(dy) -> (dx, dw) {\n"
                           "    dx = dy * w\n    dw = 0\n}\n", "z.grad")
    cop = build_op(program.ops["f"], program.ops, program.consts)
    x, w = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    y, yt = _interp(cop, [x, w], [np.array([1.0, 1.0]), np.array([5.0, 7.0])])
    np.testing.assert_array_equal(yt, w)       # w's tangent goes nowhere


# ---- tangent conventions ---------------------------------------------------------------

CONVENTIONS = """
op affine(x: f32[n, k], b: f32[k], alpha: nograd = 2.0) -> y {
    y = alpha * x + b
}
op mixed(x, n: i32, mask: nograd) -> (y, z) {
    y = x * n * mask
    z = sum(x)
}
op addrows(x, b) -> y {
    y = x + b
} grad(dy) -> (dx, db) {
    dx = dy
    db = sum(dy, axis=0)
}
"""


@pytest.fixture(scope="module")
def conv(import_module_text):
    return import_module_text(_compile(CONVENTIONS, "conv.grad"), "gradc_test_forward_conv")


def test_one_tangent_per_differentiable_parameter(conv):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(3, np.float32)
    y, yt = conv.affine.jvp(x, b, np.ones((2, 3), np.float32), np.full(3, 10, np.float32),
                            alpha=3.0)
    np.testing.assert_array_equal(y, 3 * x + 1)
    np.testing.assert_array_equal(yt, np.full((2, 3), 13, np.float32))
    assert yt.dtype == np.float32
    x64 = np.array([1.0, 2.0])
    n, mask = np.array([2, 3], np.int32), np.array([1.0, 0.0])
    y, z, yt, zt = conv.mixed.jvp(x64, n, mask, np.array([1.0, 1.0]))   # x's only
    np.testing.assert_array_equal(yt, [2, 0])
    assert zt.shape == () and float(zt) == 2.0
    with pytest.raises(TypeError):
        conv.mixed.jvp(x64, n, mask, np.ones(2), np.ones(2))


def test_tangents_broadcast_to_their_parameter(conv):
    x = np.zeros((2, 3), np.float32)
    b = np.zeros(3, np.float32)
    for xt, bt in [(1.0, 0.5), (np.ones(3, np.float32), np.float32(0.5)),
                   (np.ones((1, 3)), np.full((3,), 0.5))]:
        for impl in (conv.affine, conv.affine.unfused):
            _, yt = impl.jvp(x, b, xt, bt)
            np.testing.assert_array_equal(yt, np.full((2, 3), 2.5, np.float32))
    with pytest.raises(ValueError, match=r"affine.jvp: tangent 'x_t' must have its "
                       r"parameter's shape \(2, 3\) \(or one that broadcasts to it\), "
                       r"got \(4,\)"):
        conv.affine.jvp(x, b, np.ones(4), 0.0)
    with pytest.raises(TypeError, match="tangent 'b_t' must be a floating-point array"):
        conv.affine.jvp(x, b, 0.0, np.ones(3, np.int64))


def test_tangents_of_parameters_broadcast_over_dims_of_one(conv):
    """A custom rule's sum over rows, transposed, broadcasts a (5,) tangent up to (1, 5)
    as NumPy aligns the dims, from the right (it was summed over its 5: layer norm's
    jvp with x of shape (3, 1, 5) gave sum(b_t) everywhere; found by helper 40)."""
    bt = np.arange(1.0, 6.0)
    for shape in [(3, 5), (3, 1, 5), (2, 1, 1, 5), (1, 5)]:
        x = np.zeros(shape)
        for impl in (conv.addrows, conv.addrows.unfused):
            _, yt = impl.jvp(x, np.zeros(5), np.zeros(shape), bt)
            np.testing.assert_array_equal(yt, np.broadcast_to(bt, shape))
    sum_to = conv._g_sum_to
    g = np.arange(6.0).reshape(2, 1, 3)
    for got, want in [(sum_to(bt, (1, 5)), bt[None]),
                      (sum_to(bt, (2, 1, 5)), np.broadcast_to(bt, (2, 1, 5))),
                      (sum_to(g, (3,)), g.sum(axis=(0, 1))), (sum_to(g, (1, 3)), g.sum(axis=0)),
                      (sum_to(g, (2, 1, 1)), g.sum(axis=2, keepdims=True)),
                      (sum_to(np.ones((4, 1)), (2, 4, 3)), np.ones((2, 4, 3)))]:
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_jvp_writes_into_out(conv):
    x, b = np.ones((2, 3), np.float32), np.ones(3, np.float32)
    outs = (np.empty((2, 3), np.float32), np.empty((2, 3), np.float32))
    for impl in (conv.affine, conv.affine.unfused):
        r = impl.jvp(x, b, x, b, out=outs)
        assert r[0] is outs[0] and r[1] is outs[1]
        np.testing.assert_array_equal(outs[0], 3.0)
        np.testing.assert_array_equal(outs[1], 3.0)
    with pytest.raises(ValueError, match=r"out\[1\] must have shape \(2, 3\)"):
        conv.affine.jvp(x, b, x, b, out=(outs[0], np.empty(3, np.float32)))


# ---- the checks notice wrong rules ----------------------------------------------------

def _with_rule(monkeypatch, name: str, **fields) -> None:
    import gradc.ir.primitives as P
    from dataclasses import replace
    table = dict(P.PRIMITIVES)
    table[name] = replace(table[name], **fields)
    monkeypatch.setattr("gradc.autodiff.forward.PRIMITIVES", table)


def test_adjoint_check_catches_a_wrong_jvp_rule(monkeypatch, tmp_path, capsys):
    _with_rule(monkeypatch, "sin", jvp=("x_t * sin(x)",))
    program = check_source("op f(x) -> y {\n    y = sin(x)\n}\n", "f.grad")
    cop = build_op(program.ops["f"], program.ops, program.consts)
    rng = np.random.default_rng(0)
    assert check_jvp(cop, sample_inputs(cop, rng), rng) > 1e-3
    src = tmp_path / "f.grad"
    src.write_text("op f(x) -> y {\n    y = sin(x)\n}\n")
    assert main(["check", str(src)]) == 1
    assert "FAIL f:" in capsys.readouterr().out


def test_second_order_check_catches_a_rule_only_the_vjp_uses(monkeypatch):
    # sin's VJP is g * cos(x): a wrong JVP of cos leaves first order right
    _with_rule(monkeypatch, "cos", jvp=("x_t * sin(x)",))
    program = check_source("op f(x) -> y {\n    y = sin(x)\n}\n", "f.grad")
    cop = build_op(program.ops["f"], program.ops, program.consts)
    rng = np.random.default_rng(0)
    xs = sample_inputs(cop, rng)
    assert check_jvp(cop, xs, rng) < 1e-12
    assert check_second_order(cop, xs, rng) > 1e-3
