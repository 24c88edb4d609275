"""Inputs a fresh user tried that once misbehaved: each now gets a clear answer."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import gradc
from gradc.tools.cli import main

SOURCE = """
op ints(x, n: i32) -> y { y = x * n }
op nothing() -> y { y = 1 }
op top(x: [n, k]) -> (i, y) { i = argmax(x, axis=-1)
    y = x * 2 }
op rowtop(x) -> (m, i) { m = max(x, axis=-1)
    i = argmax(x, axis=-1) }
op s(x) -> y {
    y = x * 2
} grad(dy) -> dx {
    dx = dy * 2
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="edge.grad"), "gradc_test_edge")


def test_integer_arguments_never_wrap(m):
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(m.ints(x, 3), [3, 3])
    np.testing.assert_array_equal(m.ints(x, np.array([2, 3], np.int32)), [2, 3])
    with pytest.raises(OverflowError, match="does not fit int32"):
        m.ints(x, 2**40)
    for bad in (np.array([2**31]), np.int64(3), True, 3.0):
        with pytest.raises(TypeError, match="must be int32"):
            m.ints(x, bad)


def test_an_op_without_parameters(m):
    assert float(m.nothing()) == 1.0


def test_argument_count_errors_name_the_op_and_method(m):
    with pytest.raises(TypeError, match=r"^s\.vjp\(\) missing 1 required positional"):
        m.s.vjp(np.ones(3))
    with pytest.raises(TypeError, match=r"^s\.unfused\.forward\(\) takes 1 positional"):
        m.s.unfused(np.ones(3), np.ones(3))


def test_out_buffer_of_integer_dtype(m):
    with pytest.raises(TypeError, match=r"out\[0\] must be a floating-point array"):
        m.s(np.ones(3), out=np.empty(3, np.int32))


def test_out_buffer_of_an_integer_result_has_its_dtype(m):
    """argmax's out= is int64, as NumPy's np.argmax(out=) demands (an int32 or float
    buffer was written with a silent cast)."""
    x = np.array([[1.0, 3, 2], [5, 4, 6]])
    i, y = np.empty(2, np.int64), np.empty((2, 3), np.float32)
    assert m.top(x, out=(i, y))[0] is i
    np.testing.assert_array_equal(i, [1, 2])
    for bad in (np.int32, np.float64, np.uint64):
        with pytest.raises(TypeError, match=r"top\.forward: out\[0\] must be of the result's "
                                            rf"dtype, int64, got {np.dtype(bad).name}"):
            m.top(x, out=(np.empty(2, bad), y))


def test_custom_gradient_of_the_wrong_static_shape_is_a_compile_error():
    src = ("op b(x: f32[n], w: f32[m]) -> y {\n    y = sum(x) + sum(w)\n"
           "} grad(dy) -> (dx, dw) {\n    dx = dy * w\n    dw = dy * x\n}\n")
    with pytest.raises(gradc.GradcError) as exc:
        gradc.compile_source(src, file="b.grad")
    assert str(exc.value).startswith(
        "b.grad:4:5: error[E401]: gradient 'dx' has shape (m,), but parameter 'x' has shape (n,)")


def test_grad_of_a_non_scalar_and_of_an_integer(tmp_path):
    with pytest.raises(gradc.GradcError, match=r"grad\(\) needs a scalar expression"):
        gradc.compile_source("op f(x) -> y { y = grad(x * x, x) }", file="g.grad")
    with pytest.raises(gradc.GradcError, match="not a float value"):
        gradc.compile_source("op f(x, n: i32) -> y { y = grad(sum(x * n), n) }", file="g.grad")


def test_repeated_axis_is_a_compile_error():
    with pytest.raises(gradc.GradcError, match="repeats an axis"):
        gradc.compile_source("op f(x) -> y { y = sum(x, axis=(0, 0)) }", file="a.grad")


def test_files_that_are_not_utf8_or_carry_a_bom(tmp_path, capsys):
    bad = tmp_path / "u.grad"
    bad.write_bytes(b"\xff\xfeop f(x) -> y { y = x }")
    assert main(["compile", str(bad)]) == 1
    assert "is not UTF-8 text" in capsys.readouterr().err
    bom = tmp_path / "bom.grad"
    bom.write_bytes(b"\xef\xbb\xbfop f(x) -> y { y = x }\n")
    assert main(["compile", str(bom)]) == 0


def test_very_long_expressions_are_an_error_not_a_crash(tmp_path, capsys):
    src = tmp_path / "long.grad"
    src.write_text("op f(x) -> y {\n    y = x" + " + sin(x)" * 800 + "\n}\n")
    assert main(["compile", str(src)]) == 1
    assert "nested too deeply" in capsys.readouterr().err


def test_numpy_errors_name_the_op(import_module_text):
    m = import_module_text(gradc.compile_source("op f(x) -> y { y = sum(x, axis=1) }",
                                                file="ax.grad"), "gradc_test_axis")
    with pytest.raises(ValueError, match=r"^f\.forward: axis 1 is out of bounds"):
        m.f(np.ones(3))


def test_vjp_of_a_reduction_does_not_compute_it(import_module_text):
    text = gradc.compile_source("op f(x) -> r { r = sum(x, axis=1) }", file="r.grad")
    start = text.index("    def vjp(x, dr")
    vjp = text[start:text.index("    def fwd_bwd(x, dr", start)]
    assert "np.sum" not in vjp and "only its shape is used" in vjp
    m = import_module_text(text, "gradc_test_shape_only")
    np.testing.assert_array_equal(m.f.vjp(np.ones((2, 3)), np.array([1.0, 2.0]))[0],
                                  [[1, 1, 1], [2, 2, 2]])
    with pytest.raises(ValueError, match=r"upstream 'dr' must have the output's shape \(2,\)"):
        m.f.vjp(np.ones((2, 3)), np.ones(3))


def test_the_mean_of_an_empty_batch_is_nan_without_a_warning(import_module_text):
    # PyTorch's and JAX's means of an empty batch warn of nothing; NumPy's printed "Mean
    # of empty slice" (twice per call of a loss) from inside the generated module
    text = gradc.compile_source("""
op loss(logits, target: nograd) -> l {
    l = mean(logsumexp(logits, axis=-1) - sum(logits * target, axis=-1))
}
op centre(x) -> y { y = x - mean(x, axis=0, keepdims=true) }
""", file="empty_mean.grad")
    m = import_module_text(text, "gradc_test_empty_mean")
    empty = np.zeros((0, 5), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for f in (m.loss, m.loss.unfused):
            assert np.isnan(f(empty, empty)) and f(empty, empty).dtype == np.float32
            loss, dlogits = f.fwd_bwd(empty, empty, np.float32(1))
            assert np.isnan(loss) and dlogits.shape == (0, 5)
        assert m.centre(empty).shape == (0, 5)
        assert m.centre.vjp(empty, empty)[0].shape == (0, 5)
    x = np.arange(6.0).reshape(2, 3)        # and the mean of a batch is NumPy's
    np.testing.assert_array_equal(m.centre(x), x - x.mean(axis=0))



@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
def test_the_generic_plans_mean_has_numpys_bits(dtype):
    """The generic plan's mean (NumPy's steps without np.mean's dispatch, the division
    in the array's dtype) gives np.mean's bits and dtype: huge, tiny (subnormal) and
    ordinary values, every axis, 0-d results, counts up to 3 * 77777."""
    from gradc.codegen.prelude import mean
    rng = np.random.default_rng(7)
    for shape in [(8, 64), (3, 5, 7), (1000,), (5, 1), (1, 3000), (3, 77777), ()]:
        for scale in (1e3, 1e37, 1e-41):
            with np.errstate(all="ignore"):
                x = (rng.standard_normal(shape) * scale).astype(dtype)
            axes = [None] + [(a,) for a in range(-x.ndim, x.ndim)] + [(0, -1)] * (x.ndim > 1)
            for axis in axes:
                for keepdims in (False, True):
                    with np.errstate(all="ignore"):
                        want = np.mean(x, axis=axis, keepdims=keepdims)
                        got = mean(x, axis, keepdims)
                    assert type(got) is type(want)
                    got = np.asarray(got)
                    assert got.dtype == want.dtype and got.shape == want.shape
                    np.testing.assert_array_equal(got, want, strict=True,
                                                  err_msg=f"{shape} {scale} {axis}")


QUIET_SOURCE = """
op row_sum(x) -> y { y = sum(x, axis=-1) }
op row_prod(x) -> y { y = prod(x, axis=-1) + cumprod(x, axis=-1)[..., 0] }
op mm(a: [n, k], b: [k, m]) -> y { y = a @ b }
"""


@pytest.mark.parametrize("n", [4, 8192])
def test_no_numpy_warnings_at_any_size(import_module_text, n):
    """Overflow warns in neither the NumPy calls of small arrays and of the unfused
    plans nor the kernels of large ones (it warned at 4 and not at 8192)."""
    q = import_module_text(gradc.compile_source(QUIET_SOURCE, file="quiet.grad"),
                           "gradc_test_quiet")
    x = np.full((2, n), 1e308)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for op in (q.row_sum, q.row_sum.unfused):
            np.testing.assert_array_equal(op(x), [np.inf, np.inf])
            np.testing.assert_array_equal(op.vjp(x, np.ones(2))[0], np.ones_like(x))
        for op in (q.row_prod, q.row_prod.unfused):
            assert np.isinf(op(x)).all()
        a = np.full((2, 3), 1e200)
        np.testing.assert_array_equal(q.mm(a, a.T.copy()), np.full((2, 2), np.inf))


def test_the_upstream_of_an_integer_output_is_not_read(m):
    """``top(x) -> (i, y)``: ``i`` (argmax) takes no gradient, so its upstream may be
    None or anything of its shape (JAX's float0, PyTorch's int64 zeros); it was a
    TypeError unless float, and the frameworks could not differentiate the op."""
    x = np.array([[1.0, 3, 2], [5, 4, 6]])
    dy = np.arange(6.0).reshape(2, 3)
    want = 2 * dy
    for op in (m.top, m.top.unfused):
        for di in (None, np.zeros(2, np.int64), np.ones(2), np.zeros(2, [("float0", "V")])):
            np.testing.assert_array_equal(op.vjp(x, di, dy)[0], want)
            i, y, dx = op.fwd_bwd(x, di, dy)
            np.testing.assert_array_equal(i, [1, 2])
            np.testing.assert_array_equal(dx, want)
        with pytest.raises(ValueError, match=r"top\.[\w.]+: upstream 'di' must have the output's "
                                             r"shape \(2,\) \(or be None"):
            op.vjp(x, np.zeros(3), dy)
    # a row plan (no declared shapes, 8192 elements) passes it on unread too
    x = np.random.default_rng(0).standard_normal((64, 128))
    want = np.zeros_like(x)
    want[np.arange(64), x.argmax(-1)] = 1
    for op in (m.rowtop, m.rowtop.unfused):
        for di in (None, np.zeros(64, np.int64)):
            np.testing.assert_array_equal(op.vjp(x, np.ones(64), di)[0], want)
            np.testing.assert_array_equal(op.fwd_bwd(x, np.ones(64), di)[2], want)
