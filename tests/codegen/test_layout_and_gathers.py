"""Layout (reshape, expand_dims, squeeze, broadcast_to, permute_dims/transpose, swapaxes)
and gathers (take, take_along_axis): NumPy's values, negative indices, the IndexError
for an index out of range (before any read), duplicate indices accumulating in the
VJP, the errors at compile time and at call time, Dask, JAX and PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.errors import GradcError

SRC = """
op gather(x, t: i64) -> (a, b) {
    a = take(x, t, axis=-1)
    b = take_along_axis(x, t, axis=0)
}
op flat(x, t: i32) -> y {
    y = take(x, t) * 2
}
op layout(x: [n, k]) -> (r, e, s, p, w, q) {
    r = reshape(x, (k, -1))
    e = expand_dims(x, (0, 2))
    s = squeeze(expand_dims(x, 1), 1)
    p = permute_dims(expand_dims(x, 0), (2, 0, 1))
    w = swapaxes(x, 0, -1)
    q = broadcast_to(x, (2, n, k)) + transpose(x, (1, 0)).T
}
op layout_kw(x: [n, k]) -> (r, e, s, p, w, q) {     # the constants by keyword, as NumPy's
    r = reshape(x, shape=(k, -1))
    e = expand_dims(x, axis=(0, 2))
    s = squeeze(expand_dims(x, axis=1), axis=1)
    p = permute_dims(expand_dims(x, 0), axes=(2, 0, 1))
    w = swapaxes(x, 0, axis2=-1)
    q = broadcast_to(x, shape=(2, n, k)) + transpose(transpose(x, axes=(1, 0)))  # x.T
}
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    path = tmp_path_factory.mktemp("layout") / "layout.grad"
    path.write_text(SRC, encoding="utf-8")
    return gradc.load(path)


def test_gathers_follow_numpy_with_negative_indices(ops) -> None:
    x = np.arange(12.0).reshape(3, 4)
    t = np.array([[-1, 0, 2, -3], [1, 1, 1, 1], [0, -4 + 4, 2, 2]], np.int64)
    for op in (ops.gather, ops.gather.unfused):
        a, b = op(x, t)
        np.testing.assert_array_equal(a, np.take(x, t, axis=-1))
        np.testing.assert_array_equal(b, np.take_along_axis(x, t, axis=0))
    np.testing.assert_array_equal(ops.flat(x, np.array([-1, 0], np.int32)), [22.0, 0.0])


def test_duplicate_indices_accumulate_in_the_vjp(ops) -> None:
    x = np.arange(12.0).reshape(3, 4)
    t = np.array([[2, 2, 2, 0], [1, 1, 1, 1], [0, 0, 2, 2]], np.int64)
    ga, gb = np.ones((3, 3, 4)), np.full((3, 4), 2.0)
    want = np.zeros_like(x)
    np.add.at(want, (slice(None), t), ga)
    rows = np.zeros_like(x)
    np.add.at(rows, (t, np.arange(4)), gb)
    for op in (ops.gather, ops.gather.unfused):
        (dx,) = op.vjp(x, t, ga, gb)
        np.testing.assert_array_equal(dx, want + rows)
        assert dx[0, 2] == 5                      # five hits by take, none by the other


@pytest.mark.parametrize("bad", [4, -5])
def test_an_index_out_of_range_is_an_index_error(ops, bad) -> None:
    x = np.arange(12.0).reshape(3, 4)
    t = np.array([[0, bad, 0, 0]] * 3, np.int64)
    for op, name in ((ops.gather, "gather"), (ops.gather.unfused, "gather.unfused")):
        with pytest.raises(IndexError, match=rf"^{name}\.forward: take(_along_axis)?: index "
                                             rf"{bad} is out of bounds for an axis of size [34]"):
            op(x, t)
        with pytest.raises(IndexError, match=rf"^{name}\.vjp: .*out of bounds"):
            op.vjp(x, t, np.ones((3, 3, 4)), np.ones((3, 4)))
    with pytest.raises(IndexError, match=r"^flat\.forward: take: index 12 is out of bounds"):
        ops.flat(x, np.array([12], np.int32))


def test_empty_axes(ops) -> None:
    x = np.zeros((3, 0))
    a, b = ops.gather(x, np.zeros((3, 0), np.int64))
    assert a.shape == (3, 3, 0) and b.shape == (3, 0)
    with pytest.raises(IndexError, match="axis of size 0"):
        ops.gather(x, np.zeros((3, 1), np.int64))


def test_layout_values_and_gradients(ops) -> None:
    x = np.arange(6.0).reshape(2, 3)
    want = (x.reshape(3, -1), x[None, :, None], x, np.transpose(x[None], (2, 0, 1)),
            x.T, np.broadcast_to(x, (2, 2, 3)) + x)
    ups = [np.arange(1.0, 1 + w.size).reshape(w.shape) for w in want]
    grad = (ups[0].reshape(2, 3) + ups[1].reshape(2, 3) + ups[2]
            + np.transpose(ups[3], (1, 2, 0)).reshape(2, 3) + ups[4].T
            + ups[5].sum(axis=0) * 2)
    for op in (ops.layout, ops.layout.unfused, ops.layout_kw):
        for got, w in zip(op(x), want):
            np.testing.assert_array_equal(got, w)
        np.testing.assert_array_equal(op.vjp(x, *ups)[0], grad)


@pytest.mark.parametrize("body, message", [
    ("y = reshape(x, (4, -1))", "cannot reshape an array of shape (2, 3) (size 6) into shape (4, -1)"),
    ("y = reshape(x, (-1, -1))", "one -1 at most"),
    ("y = squeeze(x, 0)", "cannot squeeze axis 0"),
    ("y = expand_dims(x, 3)", "axis 3 is out of bounds for array of dimension 3"),
    ("y = broadcast_to(x, (3, 3))", "dims 2 and 3 do not broadcast"),
    ("y = permute_dims(x, (0, 0))", "repeated axis"),
    ("y = swapaxes(x, 0, 2)", "axis 2 is out of bounds"),
])
def test_sizes_that_do_not_fit_are_e301(body, message) -> None:
    with pytest.raises(GradcError) as err:
        gradc.compile_source(f"op f(x: f64[2, 3]) -> y {{\n    {body}\n}}\n", file="f.grad")
    assert err.value.code == "E301" and message in str(err.value)
    assert "f.grad:2:" in str(err.value)


def test_run_time_sizes_are_value_errors(tmp_path) -> None:
    path = tmp_path / "gen.grad"
    path.write_text("op f(x) -> y {\n    y = reshape(x, (4, -1))\n}\n"
                    "op g(x) -> y {\n    y = squeeze(x, 0)\n}\n"
                    "op h(x) -> y {\n    y = broadcast_to(x, (2, 3))\n}\n", encoding="utf-8")
    m = gradc.load(path)
    with pytest.raises(ValueError, match="cannot reshape"):
        m.f(np.zeros(6))
    with pytest.raises(ValueError, match="cannot squeeze"):
        m.g(np.zeros((2, 1)))
    with pytest.raises(ValueError, match="cannot broadcast"):
        m.h(np.zeros(2))
    np.testing.assert_array_equal(m.f(np.arange(8.0)), np.arange(8.0).reshape(4, 2))


def test_a_float_index_and_a_bad_shape_argument_are_errors() -> None:
    with pytest.raises(GradcError, match="E308"):
        gradc.compile_source("op f(x, t) -> y {\n    y = take(x, t, axis=0)\n}\n")
    with pytest.raises(GradcError, match="E304"):
        gradc.compile_source("op f(x) -> y {\n    y = reshape(x, (1.5, 2))\n}\n")


def test_jax_and_torch_lowerings_agree(ops) -> None:
    from gradc.adapters.framework_lowering import jax_framework, lower_graph, torch_framework
    pytest.importorskip("jax")
    x = np.arange(12.0).reshape(3, 4)
    t = np.array([[-1, 0, 2, 2], [1, 1, 1, 1], [0, 0, 2, -3]], np.int64)
    ups = [np.ones((3, 3, 4)), np.full((3, 4), 2.0)]
    from gradc.frontend.check import check_source
    from gradc.pipeline import build_op
    program = check_source(SRC, "layout.grad")
    g = build_op(program.ops["gather"], program.ops, program.consts).methods["vjp"].graph
    frameworks = [jax_framework()]
    try:
        import torch
        frameworks.append(torch_framework())
    except ImportError:
        pass
    want = ops.gather.vjp(x, t, *ups)[0]
    for fw in frameworks:
        run = lower_graph(g, g.params, g.outputs, fw, np.float64)
        args = [x, t, *ups]
        if fw.name == "torch":
            args = [torch.as_tensor(a) for a in args]
        else:
            import jax.numpy as jnp
            args = [jnp.asarray(a) for a in args]
        np.testing.assert_allclose(np.asarray(run(*args)[0]), want)


def test_dask_agrees(ops) -> None:
    pytest.importorskip("dask")
    x = np.arange(12.0).reshape(3, 4)
    t = np.array([[-1, 0, 2, 2], [1, 1, 1, 1], [0, 0, 2, -3]], np.int64)
    ups = (np.ones((3, 3, 4)), np.full((3, 4), 2.0))
    want = ops.gather.vjp(x, t, *ups)
    import dask.array as da
    import dask
    with dask.config.set(scheduler="threads"):
        got = ops.gather.vjp(da.from_array(x, chunks=2), da.from_array(t, chunks=2),
                             *(da.from_array(u, chunks=2) for u in ups))
        np.testing.assert_allclose(got[0].compute(), want[0])
        for a, b in zip(ops.gather(da.from_array(x, chunks=2), da.from_array(t, chunks=2)),
                        ops.gather(x, t)):
            np.testing.assert_array_equal(a.compute(), b)
        xl = np.arange(6.0).reshape(2, 3)
        for a, b in zip(ops.layout(da.from_array(xl, chunks=1)), ops.layout(xl)):
            np.testing.assert_array_equal(a.compute(), b)
