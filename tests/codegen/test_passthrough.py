"""Results that are parameters (gradc.passes.fuse_reduce.store_passthrough_outputs).

``dx = dy`` of a straight-through estimator, or of ``x + b``, is stored by a loop
of the fused CPU plan that runs over its shape, not copied by the wrapper after
the loops.  Checked: the plans (one loop, no copy), the results fused against
unfused and NumPy in float32 and float64, on serial and parallel sizes, the
result never sharing memory with the argument it equals, and ``out=`` (fresh,
the argument's own array where that is safe, a clear error where it is not).
"""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.frontend.check import check_source
from gradc.passes.fuse import Kernel, LibraryCall
from gradc.passes.fuse_reduce import ReduceKernel, cpu_plan
from gradc.pipeline import build_op

SOURCE = """
op ste(x) -> y { y = sign(x) } grad(dy) -> dx surrogate { dx = dy }
op bias(x: f64[n, k], b: f64[k]) -> y { y = x + b }
op both(x, z) -> (y, w) { y = tanh(x); w = z }
op pass(x) -> y { y = x }
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="passthrough.grad"),
                              "gradc_test_passthrough")


def _plan(op: str, method: str = "fwd_bwd"):
    program = check_source(SOURCE, "passthrough.grad")
    cop = build_op(program.ops[op], program.ops, program.consts)
    return cpu_plan(cop.methods[method].fused), cop.methods[method].unfused


def test_a_passed_through_cotangent_is_stored_by_the_loop() -> None:
    plan, unfused = _plan("ste")
    (k,) = plan.steps
    g = plan.graph
    assert isinstance(k, Kernel) and len(k.outputs) == 2
    assert [g.node(i).attr("name") for i in k.inputs] == ["x", "dy"]
    assert g.node(g.outputs[1]).op == "identity" and g.outputs[1] in k.nodes
    # the unfused baseline keeps the wrapper's copy: dx is the parameter itself
    assert unfused.graph.node(unfused.graph.outputs[1]).op == "param"


def test_add_bias_stores_dx_in_its_reduce_kernel() -> None:
    plan, _ = _plan("bias")
    (k,) = [s for s in plan.steps if not isinstance(s, LibraryCall)]
    assert isinstance(k, ReduceKernel)
    g = plan.graph
    assert dict(k.levels)[g.outputs[1]] == "E" and g.outputs[1] in k.outputs


def test_the_forward_of_an_identity_op_stays_a_copy_free_plan() -> None:
    plan, _ = _plan("pass", "forward")
    g = plan.graph
    # no loop over x: nothing to attach the store to, the wrapper copies
    assert not [s for s in plan.steps if isinstance(s, Kernel)]
    assert g.node(g.outputs[0]).op == "param"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [7, 300_000])
def test_results_agree_and_never_alias_the_argument(m, dtype, n) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(dtype)
    x[:3] = (0.0, np.inf, np.nan)
    dy = rng.standard_normal(n).astype(dtype)
    for fn in (m.ste.fwd_bwd, m.ste.unfused.fwd_bwd):
        y, dx = fn(x, dy)
        np.testing.assert_array_equal(y, np.sign(x))
        np.testing.assert_array_equal(dx, dy)
        assert dx.dtype == dtype and not np.shares_memory(dx, dy)
    y, w = m.both(x, dy)
    np.testing.assert_allclose(y, np.tanh(x), rtol=4 * np.finfo(dtype).eps)
    np.testing.assert_array_equal(w, dy)
    assert not np.shares_memory(w, dy)
    (dx,) = m.ste.vjp(x, dy)
    np.testing.assert_array_equal(dx, dy)


@pytest.mark.parametrize("shape", [(3, 5), (700, 300)])
def test_add_bias_fwd_bwd(m, shape) -> None:
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    b = rng.standard_normal(shape[1])
    for fn in (m.bias.fwd_bwd, m.bias.unfused.fwd_bwd):
        y, dx, db = fn(x, b, dy)
        np.testing.assert_allclose(y, x + b, rtol=1e-15)
        np.testing.assert_array_equal(dx, dy)
        np.testing.assert_allclose(db, dy.sum(axis=0), rtol=1e-12)
        assert not np.shares_memory(dx, dy)


def test_out_buffers(m) -> None:
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal(1000), rng.standard_normal(1000)
    want = dy.copy()
    y, dx = np.empty(1000), np.empty(1000)
    r = m.ste.fwd_bwd(x, dy, out=(y, dx))
    assert r[0] is y and r[1] is dx
    np.testing.assert_array_equal(dx, want)
    # dx into dy's own array: each element is read before it is written
    r = m.ste.fwd_bwd(x, dy, out=(y, dy))
    assert r[1] is dy
    np.testing.assert_array_equal(dy, want)
    np.testing.assert_array_equal(y, np.sign(x))


def test_add_bias_out_aliasing(m) -> None:
    """dx = dy into dy's own array: the reduce kernel that also sums db reads each
    element before it stores it (its row loop's statements), so it is allowed; an out
    that overlaps dy without being it is refused, nothing written."""
    rng = np.random.default_rng(3)
    x, dy, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), np.zeros(3)
    y, db = np.empty((4, 3)), np.empty(3)
    want = m.bias.fwd_bwd(x, b, dy)
    got = m.bias.fwd_bwd(x, b, dy, out=(y, dy, db))
    assert got[1] is dy
    for a, w in zip(got, want):
        np.testing.assert_array_equal(a, w)
    big = rng.standard_normal((5, 3))
    kept = big.copy()
    with pytest.raises(ValueError, match="out"):
        m.bias.fwd_bwd(x, b, big[:4], out=(y, big[1:], db))
    np.testing.assert_array_equal(big, kept)


def test_explain_counts_four_arrays_for_the_straight_through_estimator(tmp_path) -> None:
    from gradc.tools.explain import explain
    f = tmp_path / "ste.grad"
    f.write_text(SOURCE)
    text = explain(str(f), "ste")
    plan = text.split("kernel plan of fwd_bwd (fused, CPU)")[1].split("kernel plan of")[0]
    assert "1 step(s)" in plan and "4 array(s) per element" in plan
