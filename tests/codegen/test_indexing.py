"""NumPy's indexing in .grad (x[i], x[a:b:s], x[..., h:], x[arange(n), labels]), arange,
eye, concat and stack: NumPy's values and gradients (a scatter-add for integer-array
indices, duplicates accumulating), NumPy's placement of advanced indices, the errors at
compile time (file:line:col) and at call time (IndexError before any read), Dask, JAX
and PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.errors import GradcError

SRC = """
op basic(x: [a, b, c]) -> (r1, r2, r3, r4, r5) {
    r1 = x[1]
    r2 = x[:, ::-1, 1:]
    r3 = x[..., -1] + x[...][:, :, c - 1]
    r4 = x[-1, 1:a:2, ...]
    r5 = x[::-2, b - 1, c - 2:] * 2
}
op generic(x) -> (r1, r2) {
    r1 = x[..., 1:3]
    r2 = x[1, ...]
}
op adv(x: [a, b, c], i: i64[m], j: i64[m]) -> (r1, r2, r3, r4, r5) {
    r1 = x[:, i]
    r2 = x[i, :, j]
    r3 = x[0, i, 1:]
    r4 = x[1:, i, j]
    r5 = x[i, j]
}
op fw(x: [a, b, c], i: i64[m]) -> (r1, r2) {
    r1 = x[::-2, i, 1:]
    r2 = concat(x[0], x[1, ::-1], axis=0) * arange(c)
}
op make(x: [n, k]) -> (e, r, c, s, f) {
    e = eye(n, k, k=1) * x
    r = arange(1, 2 * n, 2) * 1.0
    c = concatenate(x, x * 2, x[:, :1], axis=1)
    s = stack(x, x + 1, axis=-1)
    f = arange(0.5, 2.5, 0.5)
}
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    path = tmp_path_factory.mktemp("indexing") / "indexing.grad"
    path.write_text(SRC, encoding="utf-8")
    return gradc.load(path)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 3, 5))
I, J = np.array([0, 2, -1, 2]), np.array([1, 0, 2, -3])


def _basic(x):
    return [x[1], x[:, ::-1, 1:], 2 * x[..., -1], x[-1, 1:4:2, ...], x[::-2, 2, 3:] * 2]


def _adv(x, i, j):
    return [x[:, i], x[i, :, j], x[0, i, 1:], x[1:, i, j], x[i, j]]


def test_basic_indexing_follows_numpy(ops) -> None:
    """Integers, slices with negative steps and omitted bounds, '...', bounds by dims; the
    VJP writes each cotangent into zeros of x's shape, the JVP slices the tangent."""
    want = _basic(X)
    gs = [RNG.standard_normal(w.shape) for w in want]
    dx = np.zeros_like(X)
    for key, g, k in zip([1, (slice(None), slice(None, None, -1), slice(1, None)),
                          (Ellipsis, -1), (-1, slice(1, 4, 2)),
                          (slice(None, None, -2), 2, slice(3, None))], gs, (1, 1, 2, 1, 2)):
        dx[key] += k * g
    for op in (ops.basic, ops.basic.unfused):
        for got, w in zip(op(X), want):
            np.testing.assert_array_equal(got, w)
        np.testing.assert_allclose(op.vjp(X, *gs)[0], dx)
        for got, w in zip(op.jvp(X, X)[5:], want):
            np.testing.assert_array_equal(got, w)
        got = op.fwd_bwd(*(a.astype(np.float32) for a in (X, *gs)))
        assert got[-1].dtype == np.float32
        np.testing.assert_allclose(got[-1], dx, rtol=1e-5, atol=1e-6)
    r1, r2 = ops.generic(X)
    np.testing.assert_array_equal(r1, X[..., 1:3])
    np.testing.assert_array_equal(r2, X[1, ...])
    np.testing.assert_array_equal(ops.generic(X[0, 0])[1], X[0, 0, 1])      # 0-d


def test_integer_array_indices_follow_numpy(ops) -> None:
    """Adjacent indices keep their dims in place, apart ones put them first; integers
    beside them are indices too; the VJP accumulates duplicate indices (np.add.at)."""
    want = _adv(X, I, J)
    gs = [RNG.standard_normal(w.shape) for w in want]
    dx = np.zeros_like(X)
    for key, g in zip([(slice(None), I), (I, slice(None), J), (0, I, slice(1, None)),
                       (slice(1, None), I, J), (I, J)], gs):
        np.add.at(dx, key, g)
    for op in (ops.adv, ops.adv.unfused):
        for got, w in zip(op(X, I, J), want):
            np.testing.assert_array_equal(got, w)
        np.testing.assert_allclose(op.vjp(X, I, J, *gs)[0], dx)


@pytest.mark.parametrize("i, j, message", [
    ([0, 3, 0, 0], J, "index 3 is out of bounds for axis 1 with size 3"),
    (I, [0, 0, 0, -4], "index -4 is out of bounds for axis 1 with size 3"),
])
def test_an_index_array_out_of_range_is_an_index_error(ops, i, j, message) -> None:
    with pytest.raises(IndexError, match=message):
        ops.adv(X, np.array(i), np.array(j))
    with pytest.raises(IndexError, match=message):
        ops.adv.vjp(X, np.array(i), np.array(j), *(np.ones(w.shape) for w in _adv(X, I, J)))


def test_creation_and_joining(ops) -> None:
    """eye, arange (ints: int64, dims as bounds; floats: np.arange's values), concat of
    three, stack; their gradients: eye and arange are constants, concat's by slices."""
    x = RNG.standard_normal((3, 4))
    want = [np.eye(3, 4, 1) * x, np.arange(1, 6, 2), np.concatenate([x, 2 * x, x[:, :1]], 1),
            np.stack([x, x + 1], -1), np.arange(0.5, 2.5, 0.5)]
    gs = [RNG.standard_normal(w.shape) for w in want]
    dx = np.eye(3, 4, 1) * gs[0] + gs[2][:, :4] + 2 * gs[2][:, 4:8] + gs[3].sum(-1)
    dx[:, :1] += gs[2][:, 8:]
    for op in (ops.make, ops.make.unfused):
        for got, w in zip(op(x), want):
            np.testing.assert_allclose(got, w, rtol=1e-15)
        np.testing.assert_allclose(op.vjp(x, *gs)[0], dx)
        np.testing.assert_allclose(op.jvp(x, x)[7], want[2])


@pytest.mark.parametrize("body, code, message, col", [
    ("y = x[0.5]", "E309", "an index must be an integer, got 0.5", 11),
    ("y = x[::0]", "E309", "slice step cannot be zero", 13),
    ("y = x[..., 1, ...]", "E309", "single ellipsis", 19),
    ("y = x[0, 1, 2]", "E309", "too many indices for array: array is 2-dimensional, but 3 "
     "were indexed", 10),
    ("y = x[x > 0]", "E309", "an index array must be an integer array (i32 or i64), got the "
     "0 and 1 of a comparison", 11),
    ("y = x[t]", "E309", "got a bool array", 11),
    ("y = x[:, 3]", "E309", "index 3 is out of bounds for axis 1 with size 3", 14),
    ("y = x[:t[0]]", "E309", "a slice bound must be an integer constant or a dim", 12),
    ("y = x[..., n / 2]", "E309", "'/' divides into a float", 18),
    ("y = x[arange(2), arange(3)]", "E309", "shape mismatch: indexing arrays could not be "
     "broadcast together with shapes (2,) (3,)", 10),
    ("y = concat(x, t, axis=0)", "E301", "same number of dimensions", 9),
    ("y = arange(x)", "E304", "'arange' takes numbers, consts and dims", 16),
    ("y = concat(axis=0)", "E303", "'concat' takes at least 1 argument", 9),
])
def test_static_errors_name_the_place(body, code, message, col) -> None:
    src = f"op f(x: f64[n, 3], t: bool[n]) -> y {{\n    {body}\n}}\n"
    with pytest.raises(GradcError) as err:
        gradc.compile_source(src, file="f.grad")
    assert err.value.code == code and message in str(err.value), str(err.value)
    assert f"f.grad:2:{col}:" in str(err.value), str(err.value)


@pytest.mark.parametrize("values", ["arange(b)", "arange(0, b)", "arange(b, 0, -1)",
                                    "arange(1, b + 1)", "arange(b - 1, -1, -1)",
                                    "arange(2 * b, b, -1)"])
def test_arange_of_a_dim_has_that_dim_before_the_call(values) -> None:
    """An arange whose length is a dim of the signature (step 1 or -1, bounds a dim apart)
    has that dim's shape at compile time: along the wrong axis it is E301, not a silent
    broadcast where the dims happen to be equal (helper 68: arange(b, 0, -1) against
    (a, b, c) compiled; along c it gave c's values)."""
    src = f"op f(x: [a, b, c]) -> y {{\n    y = x * {values}\n}}\n"
    with pytest.raises(GradcError) as err:
        gradc.compile_source(src, file="f.grad")
    assert err.value.code == "E301" and "dims 'c' and 'b' do not broadcast" in str(err.value)


def test_arange_along_a_dim_counts_as_numpy(tmp_path) -> None:
    """The aranges of a dim's length above, along the right axis, give NumPy's values,
    fused and unfused, and their gradients."""
    bodies = ["arange(c, 0, -1)", "arange(1, c + 1)", "arange(c - 1, -1, -1)",
              "arange(2 * c, c, -1)"]
    path = tmp_path / "ar.grad"
    path.write_text("".join(f"op f{k}(x: [a, b, c]) -> y {{\n    y = x * {v}\n}}\n"
                            for k, v in enumerate(bodies)))
    m = gradc.load(path)
    x = np.arange(24.0).reshape(2, 3, 4)
    wants = [np.arange(4, 0, -1), np.arange(1, 5), np.arange(3, -1, -1), np.arange(8, 4, -1)]
    for k, want in enumerate(wants):
        op = getattr(m, f"f{k}")
        for impl in (op, op.unfused):
            np.testing.assert_array_equal(impl(x), x * want)
            np.testing.assert_array_equal(impl.vjp(x, np.ones_like(x))[0],
                                          np.broadcast_to(want, x.shape))


def test_a_float_index_array_is_told_to_declare_integers() -> None:
    """A float array of labels is told to declare its parameter an integer array; a
    comparison (x[x > 0]) that a mask is not supported (it was told so both times)."""
    notes = {}
    for body in ("y = x[arange(n), labels]", "y = x[x > 0]"):
        src = f"op f(x: f64[n, 3], labels: f32[n]) -> y {{\n    {body}\n}}\n"
        with pytest.raises(GradcError) as err:
            gradc.compile_source(src, file="f.grad")
        got = "a float value" if "labels" in body else "the 0 and 1 of a comparison"
        assert err.value.code == "E309" and f"got {got}" in str(err.value)
        notes[body] = " ".join(err.value.notes)
    assert "declare the indices' parameter i32 or i64" in notes["y = x[arange(n), labels]"]
    assert "mask" not in notes["y = x[arange(n), labels]"]
    assert "a mask (x[x > 0]) is not supported" in notes["y = x[x > 0]"]


@pytest.mark.parametrize("body", ["y = x[labels != 0]", "keep = labels > -1\n    y = x[keep]"])
def test_a_comparison_of_integers_is_no_index_array(body) -> None:
    """A comparison of integer labels is 0 and 1 in their dtype: as an index it would
    take rows 0 and 1 where a NumPy reader means a mask (``x[labels != -100]``), so it
    is refused as a mask is (helper 63)."""
    src = f"op f(x: f64[n, 3], labels: i64[n]) -> y {{\n    {body}\n}}\n"
    with pytest.raises(GradcError) as err:
        gradc.compile_source(src, file="f.grad")
    assert err.value.code == "E309" and "the 0 and 1 of a comparison" in str(err.value)
    assert "a mask (x[x > 0]) is not supported" in " ".join(err.value.notes)
    # the caret under the whole index, the comparison where it is written there
    line = src.splitlines()[err.value.span.line - 1]
    marked = line[err.value.span.column - 1:err.value.span.end_column - 1]
    assert marked == ("labels != 0" if "!=" in body else "keep"), marked


def test_gathers_of_named_dims_have_static_shapes() -> None:
    """x[labels] of x: [n, k] and labels: i64[n] is (n, k) at compile time, so
    PyTorch's habit logsumexp(x, -1) - x[labels] is E301 where the dims are named (it
    ran, and at n == k gave the mean of an (n, n) array, silently: helper 50);
    take_along_axis's result is known too."""
    src = ("op f(x: f64[n, k], labels: i64[n]) -> loss {\n"
           "    loss = mean(logsumexp(x, axis=-1) - x[labels])\n}\n")
    with pytest.raises(GradcError) as err:
        gradc.compile_source(src, file="f.grad")
    assert err.value.code == "E301" and "dims 'n' and 'k' do not broadcast" in str(err.value)
    assert "f.grad:2:39:" in str(err.value), str(err.value)        # the '-'
    from gradc.frontend.check import check_source
    from gradc.pipeline import build_program
    src = ("op g(x: f64[n, k], labels: i64[n], m: i64[b, 2]) -> (a, b2, c) {\n"
           "    a = x[labels]\n    b2 = take_along_axis(x, expand_dims(labels, -1), axis=-1)\n"
           "    c = take(x, m, axis=1)\n}\n")
    graph = build_program(check_source(src, "g.grad"))["g"].methods["forward"].graph
    shapes = [graph.node(o).shape for o in graph.outputs]
    assert [s.static for s in shapes] == [("n", "k"), ("n", 1), ("n", "b", 2)]
    assert not any(s.dyn for s in shapes)


def test_run_time_errors_of_generic_arrays(tmp_path) -> None:
    """Where the rank or the sizes are known only at call time: NumPy's IndexError and
    ValueError before any read; apart index arrays need the rank (E309)."""
    path = tmp_path / "gen.grad"
    path.write_text("op f(x) -> y {\n    y = x[2, 1:]\n}\n"
                    "op g(x, y) -> z {\n    z = concat(x, y, axis=-1)\n}\n"
                    "op h(x, t: i64) -> y {\n    y = x[arange(3), t]\n}\n", encoding="utf-8")
    m = gradc.load(path)
    with pytest.raises(IndexError, match="index 2 is out of bounds for axis 0 with size 2"):
        m.f(np.zeros((2, 3)))
    with pytest.raises(IndexError, match="too many indices for array: array is 1-dimensional"):
        m.f(np.zeros(3))
    # two index arrays into a 1-d array: NumPy's IndexError (it was merge_axes's
    # ValueError, named after a primitive the user did not write: helper 73)
    t = np.array([0, 2, 1])
    for call in (lambda: m.h(np.zeros(5), t), lambda: m.h.vjp(np.zeros(5), t, np.ones(3)),
                 lambda: m.h.unfused(np.zeros(5), t)):
        with pytest.raises(IndexError, match="too many indices for array: array is "
                                             "1-dimensional, but at least 2 were indexed"):
            call()
    np.testing.assert_array_equal(m.h(np.arange(9.0).reshape(3, 3), t), [0.0, 5.0, 7.0])
    with pytest.raises(ValueError, match="along dimension 0, the array at index 0 has size 2"):
        m.g(np.zeros((2, 3)), np.zeros((3, 3)))
    np.testing.assert_array_equal(m.g.vjp(np.zeros((2, 3)), np.ones((2, 1)), np.arange(8.0)
                                          .reshape(2, 4))[1], [[3.0], [7.0]])
    with pytest.raises(GradcError, match="E309.*need.* rank"):
        gradc.compile_source("op f(x, t: i64) -> y {\n    y = x[t, :, t]\n}\n")


def test_dask_agrees(ops) -> None:
    da = pytest.importorskip("dask.array")
    import dask
    gs = [np.ones(w.shape) for w in _adv(X, I, J)]
    with dask.config.set(scheduler="synchronous"):
        dx = da.from_array(X, chunks=2)
        for got, w in zip(ops.basic(dx), _basic(X)):
            np.testing.assert_array_equal(got.compute(), w)
        np.testing.assert_allclose(ops.basic.vjp(dx, *(np.ones(w.shape) for w in _basic(X)))[0]
                                   .compute(),
                                   ops.basic.vjp(X, *(np.ones(w.shape) for w in _basic(X)))[0])
        got = ops.adv.vjp(dx, da.from_array(I, chunks=3), da.from_array(J, chunks=3), *gs)
        np.testing.assert_allclose(got[0].compute(), ops.adv.vjp(X, I, J, *gs)[0])
        # an index out of range raises when its block is computed, named as in memory
        with pytest.raises(IndexError, match=r"^adv\.vjp: index 9 is out of bounds"):
            ops.adv.vjp(dx, da.from_array(I * 0 + 9, chunks=3), J, *gs)[0].compute()
        x = RNG.standard_normal((3, 4))
        for got, w in zip(ops.make(da.from_array(x, chunks=2)), ops.make(x)):
            np.testing.assert_allclose(got.compute(), w)


def test_dask_gathers_name_the_method_of_an_index_out_of_range(import_module_text) -> None:
    """take and take_along_axis of Dask arrays raise, when the block is computed, the
    IndexError of the call in memory, the op's method named (helper 61)."""
    da = pytest.importorskip("dask.array")
    import dask
    m = import_module_text(gradc.compile_source(
        "op tk(x: [v, d], idx: i64[n]) -> y {\n    y = take(x, idx, axis=0) * 2\n}\n"
        "op tal(x: [n, k], t: i64[n]) -> y {\n"
        "    y = sum(take_along_axis(x, expand_dims(t, -1), axis=-1))\n}\n",
        file="gathers.grad"), "dask_gathers")
    x, idx = np.ones((10, 8)), np.arange(20) % 10
    with dask.config.set(scheduler="synchronous"):
        np.testing.assert_array_equal(
            m.tk(da.from_array(x, chunks=5), da.from_array(idx, chunks=5)).compute(),
            m.tk(x, idx))
        idx[7] = 10
        for method, args in (("forward", ()), ("vjp", (np.ones((20, 8)),))):
            with pytest.raises(IndexError, match=rf"^tk\.{method}: take: index 10 is out"):
                fn = m.tk if method == "forward" else m.tk.vjp
                got = fn(da.from_array(x, chunks=5), da.from_array(idx, chunks=5), *args)
                (got[0] if isinstance(got, tuple) else got).compute()
        with pytest.raises(IndexError, match=r"^tal\.vjp: take_along_axis: index 12 is out"):
            m.tal.vjp(da.from_array(np.ones((20, 12)), chunks=5),
                      da.from_array(np.full(20, 12), chunks=5), 1.0)[0].compute()


def test_jax_and_torch_lowerings_agree(ops) -> None:
    """A VJP graph of slices (negative steps: PyTorch's slices take none, so flipped
    first), integer-array indices, concat and arange, lowered to JAX and PyTorch."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from gradc.adapters.framework_lowering import jax_framework, lower_graph, torch_framework
    from gradc.frontend.check import check_source
    from gradc.pipeline import build_op
    frameworks = [(jax_framework(), jnp.asarray)]
    try:
        import torch
        frameworks.append((torch_framework(), torch.as_tensor))
    except ImportError:
        pass
    program = check_source(SRC, "indexing.grad")
    xs = [X, I]
    gs = [np.ones(np.shape(w)) for w in ops.fw(*xs)]
    want = ops.fw.vjp(*xs, *gs)
    g = build_op(program.ops["fw"], program.ops, program.consts).methods["vjp"].graph
    for fw, conv in frameworks:
        run = lower_graph(g, g.params, g.outputs, fw, np.float64)
        got = run(*(conv(a) for a in (*xs, *gs)))
        np.testing.assert_allclose(np.asarray(got[0]), want[0], err_msg=fw.name)


def test_explain_writes_indexing_as_written() -> None:
    from gradc.tools.explain import explain
    text = explain("examples/arrays.grad", "rope")
    assert "x[..., :h]" in text and "x[..., h:]" in text
    assert "take(" in explain("examples/arrays.grad", "xent_labels")
