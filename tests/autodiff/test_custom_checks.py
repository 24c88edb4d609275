"""Issue 3 §2: compile-time checks of custom gradients, with file:line:col."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import gradc
from gradc.tools.cli import main


def compile_error(src: str) -> str:
    with pytest.raises(gradc.GradcError) as exc:
        gradc.compile_source(src, file="c.grad")
    return str(exc.value)


def compile_warnings(src: str, code: str = "W401") -> list[gradc.GradcWarning]:
    """The warnings of compiling ``src`` with ``code`` (W405, no forward mode, is
    tested in tests/autodiff/test_forward.py)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gradc.compile_source(src, file="w.grad")
    return [w.message for w in caught if issubclass(w.category, gradc.GradcWarning)
            and w.message.code == code]


@pytest.mark.parametrize("outputs, n", [("dx", 1), ("(dx, dw, dz)", 3)])
def test_wrong_count_of_gradient_outputs_names_both_counts(outputs, n):
    body = "\n".join(f"    {g} = dy" for g in outputs.strip("()").split(", "))
    msg = compile_error(f"op f(x, w) -> y {{\n    y = x * w\n}} grad(dy) -> {outputs} {{\n"
                        f"{body}\n}}\n")
    assert msg.startswith("c.grad:3:3: error[E402]: op 'f' has 2 differentiable parameters "
                          f"(x, w), so its grad block returns 2 gradients, got {n}")


def test_gradient_for_integer_or_bool_parameter_names_it_and_its_dtype():
    msg = compile_error("op f(x, n: i32, flag: bool, s: nograd) -> y {\n    y = x * n * s\n"
                        "} grad(dy) -> (dx, dn, dflag) {\n    dx = dy\n    dn = 0\n"
                        "    dflag = 0\n}\n")
    assert "error[E402]" in msg and "got 3" in msg
    assert "parameter 'n' is i32, so it gets no gradient" in msg
    assert "parameter 'flag' is bool, so it gets no gradient" in msg
    assert "parameter 's' is marked nograd, so it gets no gradient" in msg
    assert "^^^^" in msg          # the caret under 'grad'


def test_grad_of_an_integer_parameter_names_its_dtype():
    msg = compile_error("op f(x, n: i32) -> y { y = grad(sum(x * n), n) }")
    assert "c.grad:1:" in msg and "'n'" in msg and "i32" in msg


def test_gradient_of_an_impossible_shape_names_parameter_and_both_shapes():
    msg = compile_error("op f(x: f32[3], y: f32[4, 3]) -> z {\n    z = sum(x) + sum(y)\n"
                        "} grad(dz) -> (dx, dy) {\n    dx = dz * y\n    dy = dz * y\n}\n")
    assert msg.startswith("c.grad:4:5: error[E401]: gradient 'dx' has shape (4, 3), "
                          "but parameter 'x' has shape (3,)")


def test_a_shape_error_of_a_called_rule_names_the_call():
    """An op without declared shapes compiles alone; called with a matrix, its rule's
    gradient of the wrong shape is E401 at the rule, with a note naming the call whose
    shapes it has (helper 67); the op's own rule has no such note."""
    called = compile_error("op sm(x) -> y {\n    y = softmax(x, axis=-1)\n} grad(dy) -> dx {\n"
                           "    dx = sum(dy * y, axis=-1)\n}\n"
                           "op use(x: [n, d]) -> y {\n    y = sm(x) * 2\n}\n")
    assert called.startswith("c.grad:4:5: error[E401]: gradient 'dx' has shape (n,), but "
                             "parameter 'x' has shape (n, d)")
    assert "note: with the shapes of the call of 'sm' at c.grad:7:9" in called
    own = compile_error("op sm(x: [n, d]) -> y {\n    y = softmax(x, axis=-1)\n} grad(dy) -> "
                        "dx {\n    dx = sum(dy * y, axis=-1)\n}\n")
    assert own.startswith("c.grad:4:5: error[E401]") and "call of" not in own


def test_the_note_of_a_shape_error_names_only_shapes_the_parameter_broadcast_to():
    """A reduction's result (sum(x): ()) is not a shape x was broadcast to: no note;
    x * y with y: f32[4, 3] broadcasts x: f32[3] to (4, 3): the note says so."""
    reduced = compile_error("op f(x: f32[n]) -> y {\n    y = sum(x)\n"
                            "} grad(dy) -> dx {\n    dx = dy\n}\n")
    assert "gradient 'dx' has shape (), but parameter 'x' has shape (n,)" in reduced
    assert "broadcasts" not in reduced
    wide = compile_error("op f(x: f32[3], y: f32[4, 3]) -> z {\n    z = sum(x * y)\n"
                         "} grad(dz) -> (dx, dy) {\n    dx = dz * ones_like(sum(y, axis=1))\n"
                         "    dy = dz * y\n}\n")             # dx: (4,)
    assert "parameter 'x' has shape (3,)" in wide
    assert "note: the forward broadcasts 'x' to (4, 3) only" in wide


DENSE = """
op dense(x: f32[b, i], w: f32[i, o], bias: f32[o]) -> h {
    h = x @ w + bias
} grad(dh) -> (dx, dw, dbias) {
    dx = dh @ w.T
    dw = x.T @ dh
    dbias = dh
}
"""


def test_gradient_of_a_broadcast_parameter_is_summed_and_explained(tmp_path, capsys,
                                                                   import_module_text):
    m = import_module_text(gradc.compile_source(DENSE, file="dense.grad"), "gradc_test_dense")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 3), np.float32), rng.standard_normal((3, 2), np.float32)
    bias, dh = rng.standard_normal(2, np.float32), rng.standard_normal((5, 2), np.float32)
    for impl in (m.dense, m.dense.unfused):
        dx, dw, db = impl.vjp(x, w, bias, dh)
        assert db.shape == (2,) and db.dtype == np.float32
        np.testing.assert_allclose(db, dh.sum(0), rtol=1e-6)
        np.testing.assert_allclose(dw, x.T @ dh, rtol=1e-5)
    spec = tmp_path / "dense.grad"
    spec.write_text(DENSE)
    assert main(["explain", str(spec), "dense"]) == 0
    out = capsys.readouterr().out
    assert "note[N401]: gradient 'dbias' has shape (b, o), which the forward broadcast " \
           "parameter 'bias' (o,) to: it is summed back to (o,)" in out


SMALL_GRADIENT = """
op f(x, w) -> y {
    y = x * w
} grad(dy) -> (dx, dw) {
    dx = dy * w
    dw = sum(dy * x)
}
"""


def test_a_custom_gradient_smaller_than_its_parameter_is_an_error_at_run_time(
        import_module_text, tmp_path):
    """With shapes known only at run time, ``dw = sum(dy * x)`` is right for a scalar
    ``w`` and wrong for ``w`` of shape (3,): it must not be broadcast up to [6, 6, 6]
    (as the static check rejects it, E401). Every method and both walkers check it:
    vjp and fwd_bwd by reverse mode, jvp through the transposed grad block."""
    from gradc.frontend.check import check_source
    from gradc.ir.interpret import interpret
    from gradc.pipeline import build_program
    m = import_module_text(gradc.compile_source(SMALL_GRADIENT, file="small.grad"),
                           "gradc_test_small_gradient")
    x, ones = np.array([1.0, 2.0, 3.0]), np.ones(3)
    calls = {"vjp": (x, ones, ones), "fwd_bwd": (x, ones, ones), "jvp": (x, ones, ones, ones)}
    for impl in (m.f, m.f.unfused):
        for method, args in calls.items():
            with pytest.raises(ValueError, match=r"gradient 'dw' of op 'f' \(small.grad:6:5\) "
                               r"has shape \(\), but parameter 'w' has shape \(3,\): a "
                               r"custom gradient must have"):
                getattr(impl, method)(*args)
        # A scalar w: dw = sum(dy * x) is its gradient; the tangent sums x * w_t.
        dx, dw = impl.vjp(x, np.float64(2.0), ones)
        np.testing.assert_array_equal(dx, [2.0, 2.0, 2.0])
        assert dw.shape == () and dw == 6.0
        y, dy = impl.jvp(x, np.float64(2.0), ones, np.float64(1.0))
        np.testing.assert_array_equal(dy, [3.0, 4.0, 5.0])
    # gradc check's oracle (the IR interpreter) and as_jax's XLA lowering check it too.
    cop = build_program(check_source(SMALL_GRADIENT, "small.grad"))["f"]
    with pytest.raises(ValueError, match=r"gradient 'dw' of op 'f' \(small.grad:6:5\) has shape"):
        interpret(cop.methods["vjp"].graph, [x, ones, ones])
    pytest.importorskip("jax")
    from gradc.adapters.jax import as_jax
    import jax
    (tmp_path / "small.grad").write_text(SMALL_GRADIENT)
    f = as_jax(gradc.load(tmp_path / "small.grad").f)
    with pytest.raises(ValueError, match="gradient 'dw' of op 'f' .* has shape"):
        jax.grad(lambda x, w: f(x, w).sum(), argnums=1)(x.astype(np.float32),
                                                         ones.astype(np.float32))
    assert jax.grad(lambda x, w: f(x, w).sum(), argnums=1)(
        x.astype(np.float32), np.float32(2.0)) == 6.0


# x: (4,), w: (5, 4) at run time. bad's dx sums along the wrong axis: (5,), which x's (4,)
# does not broadcast to; good's is x's shape; wide's is y's, which x was broadcast to.
WRONG_AXIS = """
op bad(x, w) -> y {
    y = x * w
} grad(dy) -> (dx, dw) {
    dx = sum(dy * w, axis=1)
    dw = dy * x
}
op good(x, w) -> y {
    y = x * w
} grad(dy) -> (dx, dw) {
    dx = sum(dy * w, axis=0)
    dw = dy * x
}
op wide(x, w) -> y {
    y = x * w
} grad(dy) -> (dx, dw) {
    dx = dy * w
    dw = dy * x
}
"""
WRONG_AXIS_MESSAGE = (r"gradient 'dx' of op 'bad' \(axis.grad:5:5\) has shape \(5,\), but "
                      r"parameter 'x' has shape \(4,\): a custom gradient must have")


def test_jvp_checks_a_custom_gradients_shape_before_broadcasting_the_tangent(
        import_module_text, tmp_path):
    """The transposed grad block broadcasts x's tangent to the gradient's shape (the
    transpose of the sum back to x's shape) before the transposed check: jvp checks the
    gradient's shape first, with vjp's message, not NumPy's broadcast error."""
    m = import_module_text(gradc.compile_source(WRONG_AXIS, file="axis.grad"),
                           "gradc_test_wrong_axis")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(4), rng.standard_normal((5, 4))
    xt, wt, dy = rng.standard_normal(4), rng.standard_normal((5, 4)), np.ones((5, 4))
    for impl in (m.bad, m.bad.unfused):
        for method, args in {"vjp": (x, w, dy), "jvp": (x, w, xt, wt)}.items():
            with pytest.raises(ValueError, match=WRONG_AXIS_MESSAGE):
                getattr(impl, method)(*args)
        with pytest.raises(ValueError, match=WRONG_AXIS_MESSAGE):
            impl.jvp(x, w, xt, np.zeros((5, 4)))        # x's tangent is checked, not w's
    # the right gradient, and one of the shape x was broadcast to (summed back)
    for impl in (m.good, m.good.unfused, m.wide, m.wide.unfused):
        y, yt = impl.jvp(x, w, xt, wt)
        np.testing.assert_allclose(yt, xt * w + x * wt, rtol=1e-14)
        dx, dw = impl.vjp(x, w, dy)                   # the adjoint identity
        assert np.vdot(dy, yt) == pytest.approx(np.vdot(dx, xt) + np.vdot(dw, wt), rel=1e-12)
    # good's rule is right for a row x, not for a column: refused as by vjp
    with pytest.raises(ValueError, match=r"gradient 'dx' of op 'good' \(axis.grad:11:5\) has "
                       r"shape \(4,\), but parameter 'x' has shape \(5, 1\)"):
        m.good.jvp(np.ones((5, 1)), w, np.ones((5, 1)), wt)
    # the same check in the interpreter, in Dask graphs and in the JAX and PyTorch lowerings
    from gradc.adapters.framework_lowering import jax_framework, lower_graph, torch_framework
    from gradc.frontend.check import check_source
    from gradc.ir.interpret import interpret
    from gradc.pipeline import build_program
    g = build_program(check_source(WRONG_AXIS, "axis.grad"))["bad"].methods["jvp"].graph
    assert "shape_check_of" in {node.op for node in g}
    with pytest.raises(ValueError, match=WRONG_AXIS_MESSAGE):
        interpret(g, [x, w, xt, wt])
    da = pytest.importorskip("dask.array")
    with pytest.raises(ValueError, match=WRONG_AXIS_MESSAGE):
        m.bad.jvp(*(da.from_array(a, chunks=2) for a in (x, w, xt, wt)))
    frameworks = []
    for name, fw, array in (("jax", jax_framework, np.asarray),
                            ("torch", torch_framework, lambda a: __import__("torch").tensor(a))):
        try:
            __import__(name)
        except ImportError:
            continue
        frameworks.append((fw(), array))
    for fw, array in frameworks:
        run = lower_graph(g, g.params, g.outputs, fw, np.float32)
        with pytest.raises(ValueError, match=WRONG_AXIS_MESSAGE):
            run(*(array(a.astype(np.float32)) for a in (x, w, xt, wt)))


def test_check_reports_a_custom_gradients_shape_error(tmp_path, capsys):
    """A rule that fails wherever the forward runs: gradc check names its error (was:
    "no input shapes tried fit the op ... declare their shapes")."""
    spec = tmp_path / "axis.grad"
    spec.write_text(WRONG_AXIS.split("op good")[0])
    assert main(["check", str(spec)]) == 1
    out = capsys.readouterr().out
    assert "FAIL bad: " in out and "no input shapes tried" not in out
    assert re.search(r"FAIL bad: not checked: the custom rule fails at x \(4, 5\), "
                     r"w \(4, 5\), where the forward pass runs: gradient 'dx' of op 'bad' "
                     r"\(\S*axis.grad:5:5\) has shape \(4,\), but parameter 'x' has shape "
                     r"\(4, 5\)", out), out


NONLINEAR = """
op sq(x) -> y {
    y = x * 2
} grad(dy) -> dx {
    dx = dy * dy
}
op affine(x) -> y {
    y = x
} grad(dy) -> dx {
    dx = dy + 1
}
op cross(x) -> (y, z) {
    y = x
    z = 2 * x
} grad(dy, dz) -> dx {
    dx = exp(x) * dy * dz
}
op gate(x) -> y {
    y = x
} grad(dy) -> dx {
    dx = where(dy > 0, dy, 0)
}
op clipped(x) -> y {
    y = x
} grad(dy) -> dx surrogate {
    dx = clip(dy, -1, 1)
}
"""

LINEAR = """
op scaled(x, w) -> (y, z) {
    y = tanh(x) * w
    z = x + w
} grad(dy, dz) -> (dx, dw) {
    dx = where(x > 0, dy * w * (1 - tanh(x)^2), 0) - dz / (1 + x^2) + 0
    dw = double(dy) * tanh(x) + (-dz) + zeros_like(x)
}
op double(a) -> b { b = a + a }
"""


def test_nonlinear_use_of_an_upstream_is_a_warning_at_its_position():
    found = {(w.span.line, w.span.column): w for w in compile_warnings(NONLINEAR)}
    assert sorted(found) == [(5, 13), (10, 13), (16, 22), (21, 19)]
    assert found[5, 13].code == "W401"
    assert "gradient 'dx' of op 'sq' is not linear in the upstream 'dy': '*'" in \
        found[5, 13].message
    assert "'+' is applied" in found[10, 13].message
    assert "the upstreams 'dy' and 'dz'" in found[16, 22].message
    assert "'>' is applied" in found[21, 19].message
    assert "w.grad:5:13: warning[W401]" in found[5, 13].render()


def test_linear_rules_and_declared_surrogates_do_not_warn():
    assert compile_warnings(LINEAR) == []
    assert compile_warnings("op clipped" + NONLINEAR.split("op clipped")[1]) == []


def test_cli_prints_warnings_and_succeeds(tmp_path, capsys):
    spec = tmp_path / "n.grad"
    spec.write_text(NONLINEAR)
    assert main(["compile", str(spec), "-o", str(tmp_path / "n.py")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning[W401]") == 4
    assert "n.grad:5:13: warning[W401]" in err and "    5 |     dx = dy * dy" in err


INTEGER_GRADIENTS = """op argsort_grad(x: [n, k]) -> y {
    y = softmax(x, axis=-1)
} grad(dy) -> dx surrogate {
    dx = argsort(dy, axis=-1)
}
op argmax_scaled(x) -> y {
    y = x * 2
} grad(dy) -> dx surrogate {
    dx = argmax(dy, axis=-1, keepdims=true) * dy
}
"""


def test_an_integer_custom_gradient_is_of_the_compute_dtype(import_module_text):
    """A gradient of integers (argsort, argmax) is cast to the compute dtype, as PyTorch
    casts a gradient to its input's dtype (it was int64, and out= of the parameter's
    dtype refused it; helper 67): vjp and fwd_bwd, fused and unfused, into out= too."""
    m = import_module_text(gradc.compile_source(INTEGER_GRADIENTS, file="int.grad"),
                           "gradc_test_integer_gradients")
    x = np.array([[1, 2, 3], [0, 1, -1]])
    dy = np.array([[1, -1, 2], [0, 1, -1]])
    want = {"argsort_grad": np.argsort(dy, axis=-1),
            "argmax_scaled": np.argmax(dy, axis=-1)[:, None] * dy}
    for dtype in (np.float32, np.float64):
        a, d = x.astype(dtype), dy.astype(dtype)
        for name, w in want.items():
            op = getattr(m, name)
            for impl in (op, op.unfused):
                got = [impl.vjp(a, d), impl.fwd_bwd(a, d)[1],
                       impl.vjp(a, d, out=(np.empty_like(a),))]
                for g in got:
                    g = g[0] if isinstance(g, tuple) else g
                    assert g.dtype == dtype, (name, dtype)
                    np.testing.assert_array_equal(g, w.astype(dtype))
