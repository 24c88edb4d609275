"""argmax and argmin (one registry block, every lowering) and the composite builtins
relu, softmax, log_softmax, log_sigmoid (registry decompositions): their conventions
at ties, NaN, ±inf and empty axes in the CPU module, the IR interpreter, Dask, JAX's
XLA lowering and PyTorch, and the compile-time errors.  Finite differences at float64
and edges are in tests/ir/test_primitives.py (cases p_argmax*, p_argmin, p_relu,
p_softmax*, p_log_softmax, p_log_sigmoid), the CUDA simulator in
tests/cuda/sim/test_sim_ops.py, PTX in tests/cuda/test_ptx.py (the run time's kernels).
"""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.frontend.check import check_source
from gradc.ir.interpret import interpret
from gradc.pipeline import build_program
from optional import import_optional

SOURCE = """
op amax(x) -> (i, j, k) {
    i = argmax(x, axis=-1)
    j = argmin(x, axis=0, keepdims=true)
    k = argmax(x)
}
op probs(x) -> (p, lp) {
    p = softmax(x, axis=-1)
    lp = log_softmax(x, axis=-1)
}
op acts(x) -> (r, ls) {
    r = relu(x)
    ls = log_sigmoid(x)
}
op xent(x, n: i32) -> loss {
    loss = mean(-sum(one_hot(n, 3) * log_softmax(x, axis=-1), axis=-1))
}
"""
INF, NAN = np.inf, np.nan
TIES = np.array([[1.0, 3, 3, 0], [2, 2, 2, 2], [5, NAN, 7, NAN]])


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    path = tmp_path_factory.mktemp("index") / "index.grad"
    path.write_text(SOURCE, encoding="utf-8")
    return gradc.load(path)


@pytest.fixture(scope="module")
def compiled():
    return build_program(check_source(SOURCE, "index.grad"))


def test_ties_give_the_first_index_and_nan_wins(m) -> None:
    for impl in (m.amax, m.amax.unfused):
        i, j, k = impl(TIES)
        assert i.dtype == j.dtype == k.dtype == np.int64
        np.testing.assert_array_equal(i, [1, 0, 1])               # first tie; first NaN
        np.testing.assert_array_equal(j, [[0, 2, 1, 2]])
        assert k.shape == () and k == 9
        np.testing.assert_array_equal(i, np.argmax(TIES, axis=-1))
        np.testing.assert_array_equal(j, np.argmin(TIES, axis=0, keepdims=True))
        i32 = impl(TIES.astype(np.float32))[0]
        np.testing.assert_array_equal(i32, [1, 0, 1])
        np.testing.assert_array_equal(impl(np.array([[-INF, INF, INF]]))[0], [1])


def test_an_empty_axis_is_numpys_value_error(m) -> None:
    with pytest.raises(ValueError, match="attempt to get argmax or argmin of an empty"):
        m.amax(np.zeros((2, 0)))
    with pytest.raises(ValueError, match="attempt to get argmax or argmin of an empty"):
        m.amax.unfused(np.zeros((0, 2)))


def test_softmax_at_infinities_and_empty_axes(m) -> None:
    x = np.array([[-INF, 0, 0], [1e4, -1e4, 1e4], [-INF, -INF, -INF]])
    for impl in (m.probs, m.probs.unfused):
        p, lp = impl(x)
        np.testing.assert_array_equal(p[:2], [[0, 0.5, 0.5], [0.5, 0, 0.5]])
        np.testing.assert_allclose(lp[:2], [[-INF, -np.log(2), -np.log(2)],
                                            [-np.log(2), -2e4 - np.log(2), -np.log(2)]])
        assert np.isnan(p[2]).all() and np.isnan(lp[2]).all()      # as jax.nn.softmax
        p, lp = impl(np.array([[INF, 0, 1], [NAN, 0, 1]]))  # NaN throughout, as JAX's
        assert np.isnan(p).all() and np.isnan(lp).all(), (p, lp)
        dp, = impl.vjp(x[:2], np.ones((2, 3)), np.array([[1.0, 2, 3], [0, 1, 0]]))
        assert np.isfinite(dp).all()
        np.testing.assert_allclose(dp, [[1, -1, 0], [-0.5, 1, -0.5]], atol=1e-15)
        p, lp = impl(np.zeros((2, 0)))
        assert p.shape == lp.shape == (2, 0)


def test_relu_and_log_sigmoid_conventions(m) -> None:
    x = np.array([-2.0, 0, 3, NAN, -1e3, 1e3])
    for impl in (m.acts, m.acts.unfused):
        r, ls = impl(x)
        np.testing.assert_array_equal(r, [0, 0, 3, NAN, 0, 1e3])
        np.testing.assert_allclose(ls[[0, 1, 2, 4, 5]],
                                   [-2.1269280110429727, -np.log(2), -0.04858735157374206,
                                    -1e3, 0], rtol=1e-15)
        dr, = impl.vjp(x, np.ones(6), np.zeros(6))
        np.testing.assert_array_equal(dr[[0, 1, 2, 4, 5]], [0, 0, 1, 0, 1])   # relu'(0) = 0
        dls, = impl.vjp(x[[0, 1, 4, 5]], np.zeros(4), np.ones(4))
        np.testing.assert_allclose(dls, [0.8807970779778823, 0.5, 1, 0], rtol=1e-15)


def test_the_interpreter_and_the_frameworks_agree_with_the_module(m, compiled) -> None:
    x = np.array([[0.5, 2, -1], [3, 1, 1]])
    n = np.array([1, 0], np.int32)
    forward = compiled["amax"].methods["forward"].graph
    for got, want in zip(interpret(forward, [TIES]), m.amax(TIES)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="empty sequence"):
        interpret(forward, [np.zeros((2, 0))])
    vjp = compiled["xent"].methods["vjp"].graph
    np.testing.assert_allclose(interpret(vjp, [x, n, np.ones(())])[0],
                               m.xent.vjp(x, n, 1.0)[0], rtol=1e-14)
    jax = import_optional("jax")
    from gradc.adapters.jax import as_jax
    x32 = x.astype(np.float32)
    for lowering in ("xla", "kernels"):
        f = as_jax(m.xent, lowering=lowering)
        np.testing.assert_allclose(jax.grad(f)(x32, n), m.xent.vjp(x32, n, np.float32(1))[0],
                                   rtol=1e-6)
    # int64 results: XLA's lowering only (the kernels' callbacks cannot return int64
    # unless jax_enable_x64 is set)
    i, j, k = as_jax(m.amax, lowering="xla")(TIES[:2].astype(np.float32))
    np.testing.assert_array_equal(i, [1, 0])
    np.testing.assert_array_equal(j, [[0, 1, 1, 0]])
    assert int(k) == 1


def test_pytorch_adapter(m) -> None:
    torch = import_optional("torch")
    from gradc.adapters.torch import as_torch
    x = torch.tensor([[0.5, 2, -1], [3, 1, 1]], dtype=torch.float64, requires_grad=True)
    n = torch.tensor([1, 0], dtype=torch.int32)
    as_torch(m.xent)(x, n).backward()
    want = m.xent.vjp(x.detach().numpy(), n.numpy(), 1.0)[0]
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-14)
    from gradc.adapters.framework_lowering import lower_graph, torch_framework
    g = build_program(check_source(SOURCE, "index.grad"))["amax"].methods["forward"].graph
    i, j, k = lower_graph(g, g.params, g.outputs, torch_framework(), np.float64)(
        torch.tensor(TIES[:2]))
    np.testing.assert_array_equal(i.numpy(), [1, 0])
    np.testing.assert_array_equal(j.numpy(), [[0, 1, 1, 0]])
    assert int(k) == 1


def test_dask_arrays(m) -> None:
    import dask
    import dask.array as da
    x = da.from_array(TIES, chunks=(2, 2))
    with dask.config.set(scheduler="threads"):
        for got, want in zip(m.amax(x), m.amax(TIES)):
            np.testing.assert_array_equal(got.compute(), want)
        y = np.array([[0.5, 2, -1], [3, 1, 1]])
        for got, want in zip(m.probs(da.from_array(y, chunks=(1, 3))), m.probs(y)):
            np.testing.assert_allclose(got.compute(), want, rtol=1e-15)


def test_compile_errors() -> None:
    with pytest.raises(gradc.GradcError, match=r"error\[E201\]: 'relu' has no keyword "
                                               r"argument 'axis'"):
        gradc.compile_source("op f(x) -> y {\n    y = relu(x, axis=0)\n}\n")
    with pytest.raises(gradc.GradcError, match=r"argmax and argmin take one axis \(NumPy's\), got \(0, 1\)"):
        gradc.compile_source("op f(x: [a, b]) -> y {\n    y = argmax(x, axis=(0, 1)) * x\n}\n")
    with pytest.raises(gradc.GradcError, match=r"error\[E201\]: 'softmax' has no keyword "
                                               r"argument 'keepdims'"):
        gradc.compile_source("op f(x) -> y {\n    y = softmax(x, keepdims=true)\n}\n")
