"""Batched ``@`` (``np.matmul`` at any rank): values and gradients against NumPy with
broadcast batch dims and 1-d operands, empty batch and contracted dims, errors at
compile time and call time, and every backend beside the CPU module (Dask with the
batch and contracted axes in chunks, JAX, PyTorch) against it.  Finite differences at
float64, second order and edges are in tests/ir/test_primitives.py (cases p_matmul_b3,
p_matmul_bc, p_matmul_1b, p_matmul_b1, p_matmul_2b, i_matmul_second), the CUDA simulator
in tests/cuda/sim/test_sim_ops.py (test_batched_matmul), the spec's attention in
tests/test_spec_examples.py.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import gradc
from gradc.frontend.check import check_source
from gradc.pipeline import build_program
from optional import import_optional

SOURCE = """
op bmm(x: [1, h, i, k], y: [b, 1, k, j]) -> z {
    z = x @ y
}
op vecs(u: [k], x: [b, i, k], y: [b, k, j]) -> (p, q) {
    p = u @ y
    q = x @ u
}
op gen(x: nograd, y: nograd) -> z {
    z = x @ y
}
"""
RNG = np.random.default_rng(0)
X, Y = RNG.standard_normal((1, 2, 2, 3)), RNG.standard_normal((2, 1, 3, 2))
G = RNG.standard_normal((2, 2, 2, 2))
U, A, B = RNG.standard_normal(3), RNG.standard_normal((2, 2, 3)), RNG.standard_normal((2, 3, 2))
GP, GQ = RNG.standard_normal((2, 2)), RNG.standard_normal((2, 2))
mT = lambda a: np.swapaxes(a, -1, -2)


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    (path := tmp_path_factory.mktemp("bmm") / "bmm.grad").write_text(SOURCE)
    return gradc.load(path)


def test_values_and_gradients_summed_over_broadcast_batch_dims(m) -> None:
    dx = (G @ mT(Y)).sum(axis=0, keepdims=True)
    dy = (mT(X) @ G).sum(axis=1, keepdims=True)
    du = np.einsum("bkj,bj->k", B, GP) + np.einsum("bik,bi->k", A, GQ)
    dA, dB = GQ[..., None] * U, U[:, None] * GP[:, None, :]
    for op in (m.bmm, m.bmm.unfused):
        np.testing.assert_allclose(op(X, Y), X @ Y, rtol=1e-14)
        for got, want in zip(op.vjp(X, Y, G), (dx, dy)):
            np.testing.assert_allclose(got, want, rtol=1e-13)
        z, tz = op.jvp(X, Y, X, Y)
        np.testing.assert_allclose(tz, 2 * (X @ Y), rtol=1e-14)
    for op in (m.vecs, m.vecs.unfused):
        p, q = op(U, A, B)
        np.testing.assert_allclose(p, U @ B, rtol=1e-14)
        np.testing.assert_allclose(q, A @ U, rtol=1e-14)
        for got, want in zip(op.vjp(U, A, B, GP, GQ), (du, dA, dB)):
            np.testing.assert_allclose(got, want, rtol=1e-13)
    # float32 stays float32; strided views are accepted (copied to C order first)
    x32, y32 = X.astype(np.float32), mT(mT(Y).copy()).astype(np.float32)
    assert not y32.flags.c_contiguous
    z = m.bmm(x32, y32)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z, X @ Y, rtol=1e-5)


def test_empty_batch_and_contracted_dims(m) -> None:
    """An empty batch gives an empty product; an empty contracted dim zeros, and
    gradients of the operands' (empty) shapes."""
    x, y = np.ones((1, 0, 2, 3)), np.ones((2, 1, 3, 2))
    for op in (m.bmm, m.bmm.unfused):
        assert op(x, y).shape == (2, 0, 2, 2)
        dx, dy = op.vjp(x, y, np.ones((2, 0, 2, 2)))
        assert dx.shape == x.shape and dy.shape == y.shape
        np.testing.assert_array_equal(dy, 0)
        x0, y0 = np.ones((1, 2, 2, 0)), np.ones((2, 1, 0, 2))
        np.testing.assert_array_equal(op(x0, y0), np.zeros((2, 2, 2, 2)))
        dx, dy = op.vjp(x0, y0, np.ones((2, 2, 2, 2)))
        assert dx.shape == x0.shape and dy.shape == y0.shape


@pytest.mark.parametrize("params, message", [
    ("x: [2, 3], y: [4, 5]", "shapes (2, 3) and (4, 5) do not fit '@': contracted dims 3 and 4 "
                             "differ"),
    ("x: [n, k], y: [m, j]", "shapes (n, k) and (m, j) do not fit '@': contracted dims 'k' and "
                             "'m' differ"),
    ("x: [a, n, k], y: [c, k, m]", "shapes (a, n, k) and (c, k, m) do not fit '@': batch dims "
                                   "'a' and 'c' do not broadcast"),
    ("x: [2, 4, n, k], y: [3, k, m]", "shapes (2, 4, n, k) and (3, k, m) do not fit '@': batch "
                                      "dims 4 and 3 do not broadcast"),
    ("x: [n, k]", "shapes (n, k) and () do not fit '@': a 0-d operand has no dim to contract "
                  "(scale with '*')"),
])
def test_shapes_that_do_not_fit_are_compile_time_errors(params, message) -> None:
    y = "y" if "y:" in params else "2"
    with pytest.raises(gradc.GradcError) as exc:
        gradc.compile_source(f"op f({params}) -> z {{\n    z = x @ {y}\n}}\n", file="f.grad")
    assert str(exc.value).splitlines()[0] == f"f.grad:2:11: error[E301]: {message}"


@pytest.mark.parametrize("x, y, message", [
    ((2, 3, 4), (3, 5), r"contracted dims 4 and 3 differ"),
    ((2, 3, 4), (3, 4, 5), r"batch dims \(2,\) and \(3,\) do not broadcast"),
    ((), (3,), r"a 0-d operand has no dim to contract"),
])
def test_shapes_known_at_call_time_are_value_errors(m, x, y, message) -> None:
    shapes = re.escape(f"matmul: operands of shapes {x} and {y}: ")
    for op in (m.gen, m.gen.unfused):
        with pytest.raises(ValueError, match=r"^gen(\.unfused)?\.forward: " + shapes + message):
            op(np.ones(x), np.ones(y))
    assert m.gen(np.ones((2, 1, 3, 4)), np.ones((5, 4, 2))).shape == (2, 5, 3, 2)


def test_dask_arrays_with_batch_and_contracted_axes_in_chunks(m) -> None:
    import dask
    import dask.array as da
    ch = lambda a: da.from_array(a, chunks=tuple(max(1, n // 2) for n in a.shape))
    with dask.config.set(scheduler="threads"):
        got = dask.compute(m.bmm(ch(X), ch(Y)), *m.bmm.vjp(ch(X), ch(Y), ch(G)))
        for g, w in zip(got, (m.bmm(X, Y), *m.bmm.vjp(X, Y, G))):
            np.testing.assert_allclose(g, w, rtol=1e-13)
        got = dask.compute(*m.vecs.vjp(ch(U), ch(A), ch(B), ch(GP), ch(GQ)))
        for g, w in zip(got, m.vecs.vjp(U, A, B, GP, GQ)):
            np.testing.assert_allclose(g, w, rtol=1e-13)
        with pytest.raises(ValueError, match="contracted dims 4 and 3 differ"):
            m.gen(ch(np.ones((2, 3, 4))), ch(np.ones((3, 5))))


def test_jax_and_pytorch_lowerings(m) -> None:
    """The vjp graphs of ``bmm`` and ``vecs`` run by ``jnp.matmul`` and ``torch.matmul``
    (through ``jnp.swapaxes``, the sums over batch dims...) as by the module."""
    from gradc.adapters.framework_lowering import jax_framework, lower_graph, torch_framework
    compiled = build_program(check_source(SOURCE, "bmm.grad"))
    cases = (("bmm", (X, Y, G)), ("vecs", (U, A, B, GP, GQ)))
    import_optional("jax")
    frameworks = [(jax_framework(), np.float32, 1e-5, np.asarray)]   # JAX: float32 unless x64
    try:
        import torch
        frameworks.append((torch_framework(), np.float64, 1e-12, torch.from_numpy))
    except ImportError:
        pass
    for fw, dt, tol, array in frameworks:
        for name, args in cases:
            args = [a.astype(dt) for a in args]
            g = compiled[name].methods["vjp"].graph
            got = lower_graph(g, g.params, g.outputs, fw, dt)(*map(array, args))
            for a, w in zip(got, getattr(m, name).vjp(*args)):
                np.testing.assert_allclose(np.asarray(a), w, rtol=tol, atol=tol, err_msg=name)
