"""Loops of run-time shapes with an input that holds one row (a bias): the wrapper runs
the kernel's ``_rows`` form, which reads that input once per row of the loop's last
dims instead of broadcast to the loop's size first (``cpu.broadcast_rows``,
``_g_broadcast_rows``).  The tests check which calls run it and that it computes what
the flat loop computes, bit for bit, in every method, in place and with draws."""
from __future__ import annotations

import numpy as np
import pytest

import gradc

SOURCE = """
op affine(x, w, b) -> y {
    y = tanh(x * w + b)
}
op scaled(x, b) -> y {
    y = tanh(x * 2 + b)
}
op noisy(x, b, p: nograd = 0.5) -> y {
    y = (x + b) * (random_uniform_like(x) >= p)
}
"""
NEVER = 1 << 62
# the kernels' rows forms (not the helpers _g_rows, _g_broadcast_rows)
ROWS = tuple(f"_{k}_rows{s}" for k in range(4) for s in ("", "_serial"))


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="bias.grad"), "broadcast_rows")


# (x's shape, w's, b's, rows form): a bias of the last dims, with leading 1s, of the
# last two dims, a column broadcast within its row, x itself a row of w's shape;
# rows too short, a bias of one value and one broadcast along a leading dim (flat)
CASES = [((300, 70), (70,), (70,), True), ((300, 70), (1, 70), (1, 1, 70), True),
         ((5, 6, 70), (6, 70), (70,), True), ((5, 6, 70), (6, 1), (1, 70), True),
         ((70,), (4, 70), (70,), True), ((300, 70), (300, 70), (1, 70), True),
         ((300, 20), (20,), (20,), False), ((300, 70), (1, 1), (), False),
         ((5, 6, 70), (5, 1, 70), (5, 1, 70), False), ((0, 70), (70,), (70,), True)]


@pytest.mark.parametrize("xs, ws, bs, rows", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_form_agrees_with_the_flat_loop(m, monkeypatch, kernel_calls, xs, ws, bs, rows,
                                             dtype):
    """forward, vjp and fwd_bwd: the rows form runs where the shapes allow it (the
    forward's loop: ``rows``) and gives the flat loop's bits (the flat loop forced with a row length out of reach)."""
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in (xs, ws, bs))
    dy = rng.standard_normal(np.broadcast_shapes(xs, ws, bs)).astype(dtype)
    calls = kernel_calls(m, *ROWS)
    got = [m.affine(x, w, b)]
    assert bool(calls) == rows              # the forward's one loop
    got += [*m.affine.vjp(x, w, b, dy), *m.affine.fwd_bwd(x, w, b, dy)]
    monkeypatch.setattr(m, "_G_BROADCAST_ROW", NEVER)
    calls.clear()
    want = [m.affine(x, w, b), *m.affine.vjp(x, w, b, dy), *m.affine.fwd_bwd(x, w, b, dy)]
    assert not calls
    for g, v in zip(got, want):
        assert g.dtype == v.dtype == dtype and g.shape == v.shape
        np.testing.assert_array_equal(g, v)
    np.testing.assert_allclose(got[0], np.tanh(x.astype(np.float64) * w + b),
                               rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


@pytest.mark.parametrize("parallel", [False, True])
def test_rows_form_in_place_with_draws_and_threads(m, monkeypatch, kernel_calls, parallel):
    """In place (``out=x``) and with a draw per element (the element's flat index, as
    the flat loop's), on one thread and threaded."""
    monkeypatch.setattr(m, "_G_PARALLEL_MIN", 0 if parallel else NEVER)
    rng = np.random.default_rng(2)
    x, b = rng.standard_normal((64, 300)), rng.standard_normal(300)
    calls = kernel_calls(m, *(r for r in ROWS if r.endswith("_serial") != parallel))
    want = np.tanh(x * 2.0 + b)
    xx = x.copy()
    assert m.affine(xx, np.full(300, 2.0), b, out=xx) is xx
    np.testing.assert_allclose(xx, want, rtol=1e-12)
    y = m.noisy(x, b, seed=7)
    assert calls
    monkeypatch.setattr(m, "_G_BROADCAST_ROW", NEVER)
    np.testing.assert_array_equal(y, m.noisy(x, b, seed=7))
    np.testing.assert_array_equal(m.noisy(x, b, seed=7), m.noisy(x, np.tile(b, (64, 1)), seed=7))


@pytest.mark.parametrize("xs, bs", [((300, 70), (70,)), ((70,), (300, 70)), ((300, 1), (1, 70)),
                                    ((5, 6, 70), (6, 70)), ((0, 70), (70,)), ((), (4, 3))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_value_moved_into_the_loop_of_its_broadcast(m, xs, bs, dtype):
    """``x * 2`` computed in the loop over the broadcast of x and b (fuse._sink),
    whichever of the two is larger: every method against NumPy and the unfused
    plan."""
    rng = np.random.default_rng(2)
    x, b = rng.standard_normal(xs).astype(dtype), rng.standard_normal(bs).astype(dtype)
    y = np.tanh(x * 2 + b)
    dy = rng.standard_normal(y.shape).astype(dtype)
    g = dy * (1 - y ** 2)
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)

    def unbroadcast(a, shape):
        a = a.sum(axis=tuple(range(a.ndim - len(shape))))
        return a.sum(axis=tuple(i for i, k in enumerate(shape) if k == 1), keepdims=True)
    for op in (m.scaled, m.scaled.unfused):
        out, dx, db = op.fwd_bwd(x, b, dy)
        np.testing.assert_allclose(op(x, b), y, **tol)
        np.testing.assert_allclose(out, y, **tol)
        np.testing.assert_allclose(dx, unbroadcast(2 * g, xs), **tol)
        np.testing.assert_allclose(db, unbroadcast(g, bs), **tol)
        assert dx.shape == xs and db.shape == bs and dx.dtype == dtype
        np.testing.assert_allclose(op.jvp(x, b, x, b)[1], (1 - y ** 2) * (2 * x + b), **tol)
