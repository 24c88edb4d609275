"""cumsum and one_hot (the registry's first library primitives with every lowering in
their own block): the values of arrays.grad, errors at call time and compile time,
and every backend beside the CPU module (the IR interpreter, Dask, JAX's XLA lowering
and callbacks, PyTorch) against it.  Finite differences at float64 and edges are in
tests/ir/test_primitives.py (cases p_cumsum*, p_one_hot), the CUDA simulator in
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
op cumsum_rows(x) -> y {
    y = cumsum(x, axis=-1)
}
op rev_scan(x) -> y {
    y = cumulative_sum(x * x, axis=0, reverse=true) * 2
}
op smooth(logits, labels: i32, eps: nograd = 0.1) -> loss {
    t = (1 - eps) * one_hot(labels, 3) + eps / 3
    loss = mean(-sum(t * (logits - logsumexp(logits, axis=-1, keepdims=true)), axis=-1))
}
op labels(n: i32) -> y {
    y = one_hot(n, 4)
}
"""
X = np.arange(6.0).reshape(3, 2)
LOGITS, LABELS = np.array([[0.5, 2, -1], [3, 1, 1]]), np.array([1, 0], np.int32)


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    path = tmp_path_factory.mktemp("scans") / "scans.grad"
    path.write_text(SOURCE, encoding="utf-8")
    return gradc.load(path)


def _smooth_reference(logits, labels, eps=0.1):
    t = (1 - eps) * np.eye(3)[labels] + eps / 3
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return (-(t * logp).sum(-1)).mean(), (np.exp(logp) - t) / len(labels)


def test_values_of_arrays_grad_and_a_numpy_reference(m) -> None:
    for impl in (m.cumsum_rows, m.cumsum_rows.unfused):
        np.testing.assert_array_equal(impl(np.array([[3.0, 1, 2]])), [[3, 4, 6]])
        (dx,) = impl.vjp(np.array([[3.0, 1, 2]]), np.array([[1.0, 2, 3]]))
        np.testing.assert_array_equal(dx, [[6, 5, 3]])
    want = 2 * np.flip(np.cumsum(np.flip(X * X, 0), 0), 0)
    for impl in (m.rev_scan, m.rev_scan.unfused):
        np.testing.assert_array_equal(impl(X), want)
        y, dx = impl.fwd_bwd(X, np.ones_like(X))
        np.testing.assert_array_equal(dx, 4 * X * np.arange(1, 4)[:, None])
        _, t = impl.jvp(X, np.ones_like(X))
        np.testing.assert_array_equal(t, 2 * np.flip(np.cumsum(np.flip(2 * X, 0), 0), 0))
    loss, grad = _smooth_reference(LOGITS, LABELS)
    for impl in (m.smooth, m.smooth.unfused):
        np.testing.assert_allclose(impl(LOGITS, LABELS), loss, rtol=1e-14)
        np.testing.assert_allclose(impl.vjp(LOGITS, LABELS, 1.0)[0], grad, rtol=1e-13)
    y = m.labels(np.array([[0, 3], [1, 2]], np.int32))
    assert y.shape == (2, 2, 4) and y.dtype == np.float64
    np.testing.assert_array_equal(y, np.eye(4)[[[0, 3], [1, 2]]])
    assert m.labels(np.zeros((0,), np.int32)).shape == (0, 4)
    np.testing.assert_array_equal(m.cumsum_rows(np.zeros((2, 0))), np.zeros((2, 0)))


def test_float32_in_float32_out(m) -> None:
    x = X.astype(np.float32)
    assert m.rev_scan(x).dtype == np.float32
    assert m.smooth.vjp(LOGITS.astype(np.float32), LABELS, np.float32(1))[0].dtype == np.float32


@pytest.mark.parametrize("bad", [[0, 4], [-1, 0]])
def test_an_index_out_of_range_is_an_index_error(m, bad) -> None:
    with pytest.raises(IndexError, match=rf"one_hot: index {bad[1] if bad[1] else bad[0]} "
                                         r"is out of range for depth 4 \(indices must be in "
                                         r"\[0, 4\)\)"):
        m.labels(np.array(bad, np.int32))


def test_cumsum_without_axis_needs_a_1d_array(tmp_path) -> None:
    path = tmp_path / "flat.grad"
    path.write_text("op flat(x) -> y {\n    y = cumsum(x)\n}\n", encoding="utf-8")
    flat = gradc.load(path)
    np.testing.assert_array_equal(flat.flat(np.array([1.0, 2, 3])), [1, 3, 6])
    with pytest.raises(ValueError, match="cumsum of an array of rank 2 needs axis="):
        flat.flat(np.ones((2, 2)))
    path = tmp_path / "ax.grad"
    path.write_text("op ax(x) -> y {\n    y = cumsum(x, axis=2)\n}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="axis 2 is out of bounds for array of dimension 2"):
        gradc.load(path).ax(np.ones((2, 2)))


def test_compile_errors_name_the_position() -> None:
    with pytest.raises(gradc.GradcError) as exc:
        gradc.compile_source("op f(x, n) -> y {\n    y = one_hot(n, 3) * x\n}\n", file="f.grad")
    assert str(exc.value).startswith("f.grad:2:9: error[E308]: 'one_hot' takes integer "
                                     "indices as its first argument")
    with pytest.raises(gradc.GradcError, match=r"error\[E308\]: 'one_hot' takes integer "
                                               r"indices .* got a bool value"):   # PyTorch's
        gradc.compile_source("op f(x, n: bool) -> y {\n    y = one_hot(n, 3) * x\n}\n")
    with pytest.raises(gradc.GradcError, match=r"error\[E201\]: 'cumsum' has no keyword "
                                               r"argument 'keepdims'"):
        gradc.compile_source("op f(x) -> y {\n    y = cumsum(x, axis=0, keepdims=true)\n}\n")
    with pytest.raises(gradc.GradcError, match=r"error\[E304\]: reverse= must be 0, 1, true "
                                               r"or false"):
        gradc.compile_source("op f(x) -> y {\n    y = cumsum(x, axis=0, reverse=2)\n}\n")
    # a depth that is no count: a compile error (it was a KeyError or an IndexError
    # naming depth -3 at call time), at the const where a const is no integer
    for depth, where, shown in (("-3", "3:9", "one_hot: depth must be a non-negative integer"),
                                ("K", "3:22", "depth must be an integer")):
        with pytest.raises(gradc.GradcError, match=rf"f.grad:{where}: error\[E301\].*{shown}, "
                                                   rf"got {-3 if depth == '-3' else 2.5}"):
            gradc.compile_source("const K = 2.5\nop f(lab: i32[n]) -> y {\n"
                                 f"    y = one_hot(lab, {depth})\n}}\n", file="f.grad")


def test_the_interpreter_and_the_frameworks_agree_with_the_module(m) -> None:
    compiled = build_program(check_source(SOURCE, "scans.grad"))
    assert np.array_equal(interpret(compiled["rev_scan"].methods["vjp"].graph,
                                    [X, np.ones_like(X)])[0], m.rev_scan.vjp(X, np.ones_like(X))[0])
    with pytest.raises(IndexError, match="out of range"):
        interpret(compiled["labels"].methods["forward"].graph, [np.array([5])])
    jax = import_optional("jax")
    from gradc.adapters.jax import as_jax
    x32 = X.astype(np.float32)
    for lowering in ("xla", "kernels"):
        f = as_jax(m.rev_scan, lowering=lowering)
        np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x32),
                                   m.rev_scan.vjp(x32, np.ones_like(x32))[0], rtol=1e-6)
        s = as_jax(m.smooth, lowering=lowering)
        np.testing.assert_allclose(jax.grad(s)(LOGITS.astype(np.float32), LABELS),
                                   _smooth_reference(LOGITS, LABELS)[1], rtol=1e-5)


def test_pytorch_adapter(m) -> None:
    torch = import_optional("torch")
    from gradc.adapters.torch import as_torch
    x = torch.tensor(X, requires_grad=True)
    as_torch(m.rev_scan)(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), m.rev_scan.vjp(X, np.ones_like(X))[0])


def test_dask_arrays_rechunked_or_not(m) -> None:
    import dask
    import dask.array as da
    x = da.from_array(X, chunks=(1, 2))
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(m.rev_scan(x).compute(), m.rev_scan(X))
        (dx,) = m.rev_scan.vjp(x, da.ones((3, 2), chunks=(1, 2)))
        np.testing.assert_array_equal(dx.compute(), m.rev_scan.vjp(X, np.ones_like(X))[0])
        n = da.from_array(np.array([[0, 3], [1, 2]], np.int32), chunks=(1, 2))
        np.testing.assert_array_equal(m.labels(n).compute(),
                                      m.labels(np.array([[0, 3], [1, 2]], np.int32)))
        # a label out of range raises when its block is computed, named as in memory
        bad = da.from_array(np.array([[0, 3], [1, 4]], np.int32), chunks=(1, 2))
        with pytest.raises(IndexError, match=r"^labels\.forward: one_hot: index 4 is out of "):
            m.labels(bad).compute()
        logits = da.from_array(LOGITS, chunks=(1, 3))
        with pytest.raises(IndexError, match=r"^smooth\.vjp: one_hot: index 3 "):
            m.smooth.vjp(logits, np.array([1, 3], np.int32), 1.0)[0].compute()
