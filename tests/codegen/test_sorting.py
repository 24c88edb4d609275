"""argsort, sort, topk and cumprod: the tie, NaN and infinity conventions, the
gradients at ties and at zeros, errors at compile time and call time, and every
backend beside the CPU module (the IR interpreter, Dask with the sorted axis in
chunks, JAX, PyTorch) against it.  Finite differences at float64 and edges are in
tests/ir/test_primitives.py (cases p_argsort*, p_sort*, p_topk*, p_cumprod*), the CUDA
simulator in tests/cuda/sim/test_sim_ops.py, PTX in tests/cuda/test_ptx.py.
"""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.frontend.check import check_source
from gradc.ir.interpret import interpret
from gradc.ir.primitives import PRIMITIVES
from gradc.pipeline import build_program
from optional import import_optional

SOURCE = """
op asc(x) -> y {
    y = sort(x, axis=-1)
}
op desc(x) -> y {
    y = sort(x, axis=0, descending=true)
}
op order(x) -> (i, j) {
    i = argsort(x)
    j = argsort(x, axis=-1, descending=true)
}
op top2(x) -> y {
    y = topk(x, 2)
}
op top_dim(x: [n, k]) -> y {
    y = topk(x, k, axis=-1) * 1
}
op top0(x) -> y {
    y = topk(x, 0, axis=0)
}
op prods(x) -> y {
    y = cumprod(x, axis=-1)
}
op rprods(x) -> y {
    y = cumulative_prod(x, axis=0, reverse=true)
}
"""
TIES = np.array([[2.0, 1, 2, 1, 3], [0.0, -0.0, np.nan, -np.inf, np.inf]])


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    (path := tmp_path_factory.mktemp("sorting") / "sorting.grad").write_text(SOURCE)
    return gradc.load(path)


def test_argsort_is_stable_nan_last_and_descending_keeps_the_order_of_ties(m) -> None:
    for impl in (m.order, m.order.unfused):
        i, j = impl(TIES)
        assert i.dtype == j.dtype == np.int64
        np.testing.assert_array_equal(i, np.argsort(TIES, axis=-1, kind="stable"))
        np.testing.assert_array_equal(i, [[1, 3, 0, 2, 4], [3, 0, 1, 4, 2]])
        # descending: NaN first (the largest, as jnp.sort(descending=True) and torch's),
        # equal values (2, 2; 1, 1; 0.0, -0.0) still in their order
        np.testing.assert_array_equal(j, [[4, 0, 2, 1, 3], [2, 4, 0, 1, 3]])
    assert m.order(np.zeros((2, 0)))[0].shape == (2, 0)


def test_sort_values_and_gradient_through_the_permutation(m) -> None:
    g = np.arange(10.0).reshape(2, 5)
    for impl in (m.asc, m.asc.unfused):
        np.testing.assert_array_equal(impl(TIES), np.sort(TIES, axis=-1, kind="stable"))
        (dx,) = impl.vjp(TIES, g)
        # g scattered back to where each value came from (ties: in their order)
        want = np.empty_like(g)
        np.put_along_axis(want, np.argsort(TIES, axis=-1, kind="stable"), g, -1)
        np.testing.assert_array_equal(dx, want)
        _, t = impl.jvp(TIES, g)
        np.testing.assert_array_equal(t, np.take_along_axis(
            g, np.argsort(TIES, axis=-1, kind="stable"), -1))
    x = TIES.T
    for impl in (m.desc, m.desc.unfused):
        y = impl(x)
        np.testing.assert_array_equal(y[:, 0], [3, 2, 2, 1, 1])
        np.testing.assert_array_equal(y[:, 1], [np.nan, np.inf, 0, -0.0, -np.inf])
        (dx,) = impl.vjp(x, g.T)
        np.testing.assert_array_equal(dx[:, 0], [1, 3, 2, 4, 0])
        np.testing.assert_array_equal(dx[:, 1], [7, 8, 5, 9, 6])
    np.testing.assert_array_equal(m.asc(np.zeros((3, 0))), np.zeros((3, 0)))


def test_topk_is_the_descending_sort_cut_at_k(m) -> None:
    x = np.array([[1.0, 5, 3, 5], [np.nan, 2, -np.inf, 7]])
    for impl in (m.top2, m.top2.unfused):
        np.testing.assert_array_equal(impl(x), [[5, 5], [np.nan, 7]])
        (dx,) = impl.vjp(x, np.array([[1.0, 2], [3, 4]]))
        np.testing.assert_array_equal(dx, [[0, 1, 0, 2], [3, 0, 0, 4]])
    np.testing.assert_array_equal(m.top_dim(x[:1]), [[5, 5, 3, 1]])          # k = n
    (dx,) = m.top_dim.vjp(x[:1], np.array([[1.0, 2, 3, 4]]))
    np.testing.assert_array_equal(dx, [[4, 1, 3, 2]])
    assert m.top0(x).shape == (0, 4)                                          # k = 0
    np.testing.assert_array_equal(m.top0.vjp(x, np.zeros((0, 4)))[0], np.zeros((2, 4)))


def test_a_bad_k_is_a_compile_time_error_where_n_is_known_else_a_value_error(m) -> None:
    with pytest.raises(gradc.GradcError, match=r"f.grad:2:9: error\[E301\].*topk: k = 5 is "
                                               r"out of range for an axis of size 4"):
        gradc.compile_source("op f(x: [3, 4]) -> y {\n    y = topk(x, 5)\n}\n", file="f.grad")
    with pytest.raises(gradc.GradcError, match=r"error\[E301\].*topk: k must be a "
                                               r"non-negative integer, got -1"):
        gradc.compile_source("op f(x) -> y {\n    y = topk(x, -1)\n}\n", file="f.grad")
    with pytest.raises(gradc.GradcError, match=r"error\[E201\]: 'sort' has no keyword "
                                               r"argument 'keepdims'"):
        gradc.compile_source("op f(x) -> y {\n    y = sort(x, keepdims=true)\n}\n")
    with pytest.raises(ValueError, match="topk: k = 2 is out of range for an axis of size 1"):
        m.top2(np.ones((3, 1)))


def _cumprod_vjp_by_products(x, g):
    """sum_{i >= j} g_i prod_{m <= i, m != j} x_m: no division."""
    d = np.zeros_like(x)
    for r, j, i in np.ndindex(x.shape[0], x.shape[1], x.shape[1]):
        if i >= j:
            d[r, j] += g[r, i] * np.prod([x[r, k] for k in range(i + 1) if k != j])
    return d


def test_cumprod_values_and_gradient_with_zeros(m) -> None:
    x = np.array([[3.0, 0, 2, 4], [1, 2, 0, 0], [0, -1, 0.5, 3], [2, -1, 0.5, 3]])
    g = np.array([[1.0, 2, 3, 4], [-1, 0.5, 2, 1], [1, 1, 1, 1], [0.5, 2, -3, 1]])
    for impl in (m.prods, m.prods.unfused):
        np.testing.assert_array_equal(impl(x), np.cumprod(x, axis=-1))
        np.testing.assert_allclose(impl.vjp(x, g)[0], _cumprod_vjp_by_products(x, g),
                                   rtol=1e-15)
        _, t = impl.jvp(x, g)
        np.testing.assert_allclose(np.vdot(t, g), np.vdot(impl.vjp(x, g)[0], g), rtol=1e-14)
    for impl in (m.rprods, m.rprods.unfused):
        np.testing.assert_array_equal(impl(x), np.flip(np.cumprod(np.flip(x, 0), 0), 0))
        want = np.flip(_cumprod_vjp_by_products(np.flip(x, 0).T, np.flip(g, 0).T).T, 0)
        np.testing.assert_allclose(impl.vjp(x, g)[0], want, rtol=1e-15)
    assert m.prods(x.astype(np.float32)).dtype == np.float32
    assert m.prods(np.zeros((2, 0))).shape == (2, 0)
    np.testing.assert_array_equal(m.prods(np.array([[np.inf, 0, 2]])), [[np.inf, np.nan, np.nan]])


def test_decomposed_builtins_match_their_references() -> None:
    x = np.array([[0.5, -2, 3, 0.5], [1, np.nan, -np.inf, 4]])
    np.testing.assert_array_equal(PRIMITIVES["sort"].ref(x), np.sort(x, axis=-1))
    np.testing.assert_array_equal(PRIMITIVES["sort"].ref(x, axis=(0,), descending=True),
                                  np.flip(np.sort(x, axis=0), 0))
    np.testing.assert_array_equal(PRIMITIVES["topk"].ref(x[:, [0, 2, 3]], 2),
                                  [[3, 0.5], [4, 1]])
    np.testing.assert_array_equal(PRIMITIVES["cumprod"].ref(x, axis=(1,), reverse=True),
                                  np.flip(np.cumprod(np.flip(x, 1), 1), 1))


def test_the_interpreter_and_the_frameworks_agree_with_the_module(m) -> None:
    compiled = build_program(check_source(SOURCE, "sorting.grad"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))
    x[0, :2] = x[1, 1:3] = 0.25                 # ties
    g = rng.standard_normal((3, 4))
    for name, ups in (("asc", g), ("top2", g[:, :2]), ("prods", g), ("rprods", g)):
        op = getattr(m, name)
        got = interpret(compiled[name].methods["vjp"].graph, [x, ups])
        np.testing.assert_allclose(got[0], op.vjp(x, ups)[0], rtol=1e-14)
    jax = import_optional("jax")
    from gradc.adapters.jax import as_jax
    x32, g32 = x.astype(np.float32), g.astype(np.float32)
    for lowering in ("xla", "kernels"):
        for name, ups in (("asc", g32), ("top2", g32[:, :2]), ("prods", g32)):
            op = getattr(m, name)
            f = as_jax(op, lowering=lowering)
            got = jax.vjp(f, x32)[1](ups)[0]
            np.testing.assert_allclose(got, op.vjp(x32, ups)[0], rtol=1e-5, atol=1e-6)
    # XLA's lowering (the kernels' callbacks cannot return int64 without jax_enable_x64)
    for got, want in zip(as_jax(m.order, lowering="xla")(x32), m.order(x32)):
        np.testing.assert_array_equal(got, want)


def test_pytorch_adapter(m) -> None:
    torch = import_optional("torch")
    from gradc.adapters.torch import as_torch
    x = np.array([[3.0, 1, 2, 1], [0, 2, -1, 0]])
    for name in ("asc", "top2", "prods", "rprods"):
        op = getattr(m, name)
        t = torch.tensor(x, requires_grad=True)
        as_torch(op)(t).sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(),
                                      op.vjp(x, np.ones_like(op(x)))[0], err_msg=name)


def test_dask_arrays_with_the_sorted_axis_in_chunks(m) -> None:
    import dask
    import dask.array as da
    x = np.array([[3.0, 1, 2, 1], [0, 2, -1, 0], [5, np.nan, 7, 0]])
    d = da.from_array(x, chunks=(2, 2))
    g = np.arange(12.0).reshape(3, 4)
    with dask.config.set(scheduler="threads"):
        for name, ups in (("asc", g), ("desc", g), ("top2", g[:, :2]), ("prods", g),
                          ("rprods", g)):
            op = getattr(m, name)
            np.testing.assert_array_equal(op(d).compute(), op(x), err_msg=name)
            (dx,) = op.vjp(d, da.from_array(ups, chunks=(2, 1)))
            np.testing.assert_array_equal(dx.compute(), op.vjp(x, ups)[0], err_msg=name)
        for a, b in zip(m.order(d), m.order(x)):
            np.testing.assert_array_equal(a.compute(), b)
