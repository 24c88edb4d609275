"""The guide's classifier on scikit-learn's digits, end to end (examples/train_digits.py).

(a) gradc's gradients of ``softmax_xent(mlp(x))`` for ``w1, b1, w2, b2`` —
    through ``mlp.vjp``, the fused ``mlp.fwd_bwd``, and the unfused variants —
    match an independent hand-written NumPy backprop (computed in float64 from
    the same float32 inputs) on a real batch of digits, at initialisation and
    after a few Adam steps.
(b) A short training run reaches >= 95 % held-out accuracy.

No timing is asserted anywhere.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

import gradc  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
NAMES = ("w1", "b1", "w2", "b2")
BATCH = 64
RTOL = 1e-5


@pytest.fixture(scope="module")
def td() -> ModuleType:
    """examples/train_digits.py imported as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gm(td: ModuleType) -> ModuleType:
    """The module gradc compiles from examples/seed.grad (loaded once)."""
    return gradc.load(td.SEED_GRAD)


@pytest.fixture(scope="module")
def data(td: ModuleType) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return td.load_data()


@pytest.fixture(scope="module")
def batch(data) -> tuple[np.ndarray, np.ndarray]:
    """A real batch: the first 64 training images (f32[64, 64]) and labels (f32[64, 10])."""
    x_tr, y_tr, _, _ = data
    return x_tr[:BATCH], y_tr[:BATCH]


@pytest.fixture(scope="module", params=["init", "trained"])
def params(request, td: ModuleType, gm: ModuleType, data) -> dict[str, np.ndarray]:
    """Parameters at initialisation, or after 10 Adam steps on other batches."""
    p = td.init_params(64, 128, 10, seed=0)
    if request.param == "trained":
        x_tr, y_tr, _, _ = data
        opt = td.Adam(p, lr=1e-2)
        for k in range(1, 11):
            sl = slice(k * BATCH, (k + 1) * BATCH)
            _, grads = td.loss_and_grads(gm, x_tr[sl], y_tr[sl], p)
            opt.step(grads)
    return p


def assert_grad_close(actual: np.ndarray, ref: np.ndarray, name: str) -> None:
    """float32 result vs float64 reference: rtol 1e-5, atol 1e-6 of the reference's scale."""
    actual = np.asarray(actual)
    assert actual.dtype == np.float32, f"{name}: dtype {actual.dtype}, expected float32"
    assert actual.shape == ref.shape, f"{name}: shape {actual.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values"
    scale = float(np.max(np.abs(ref)))
    assert scale > 0, f"{name}: reference gradient is identically zero"
    np.testing.assert_allclose(actual, ref, rtol=RTOL, atol=1e-6 * scale, err_msg=name)


GRAD_NAMES = ("x", *NAMES)          # mlp's five differentiable parameters


def reference(td: ModuleType, x, y, p) -> tuple[float, dict[str, np.ndarray]]:
    loss, *grads = td.numpy_reference_grads(x, y, *(p[k] for k in NAMES))
    return loss, dict(zip(GRAD_NAMES, grads))


# ---------------------------------------------------------------------------
# (a) gradients


def test_reference_backprop_matches_finite_differences(td: ModuleType, batch) -> None:
    """Guard the reference: central differences of the float64 loss.

    scaled_tanh's custom rule halves the gradient flowing into the hidden
    pre-activation, so the reference's dw1/db1 are exactly half the true
    derivative of the loss while dw2/db2 are the true derivative.
    """
    x, y = batch
    p = {k: v.astype(np.float64) for k, v in td.init_params(64, 128, 10, seed=1).items()}
    _, ref = reference(td, x, y, p)
    rng = np.random.default_rng(0)
    h = 1e-6
    for name, factor in (("w1", 0.5), ("b1", 0.5), ("w2", 1.0), ("b2", 1.0)):
        for _ in range(5):
            idx = tuple(int(rng.integers(n)) for n in p[name].shape)
            plus = {k: v.copy() for k, v in p.items()}
            minus = {k: v.copy() for k, v in p.items()}
            plus[name][idx] += h
            minus[name][idx] -= h
            fd = (reference(td, x, y, plus)[0] - reference(td, x, y, minus)[0]) / (2 * h)
            assert ref[name][idx] == pytest.approx(factor * fd, rel=1e-5, abs=1e-9), (name, idx)


def test_loss_matches_reference(td, gm, batch, params) -> None:
    x, y = batch
    ref_loss, _ = reference(td, x, y, params)
    logits = gm.mlp(x, *(params[k] for k in NAMES))
    loss = gm.softmax_xent(logits, y)
    assert np.asarray(loss).shape == ()
    assert float(loss) == pytest.approx(ref_loss, rel=RTOL)
    fused_loss, _ = gm.softmax_xent.fwd_bwd(logits, y, 1.0)
    unfused_loss = gm.softmax_xent.unfused(logits, y)
    assert float(fused_loss) == pytest.approx(ref_loss, rel=RTOL)
    assert float(unfused_loss) == pytest.approx(ref_loss, rel=RTOL)


@pytest.mark.parametrize("variant", ["fused", "unfused"])
def test_vjp_matches_reference(td, gm, batch, params, variant: str) -> None:
    """softmax_xent.vjp then mlp.vjp give the reference's weight gradients."""
    x, y = batch
    w = [params[k] for k in NAMES]
    mlp = gm.mlp if variant == "fused" else gm.mlp.unfused
    xent = gm.softmax_xent if variant == "fused" else gm.softmax_xent.unfused
    logits = mlp(x, *w)
    (dlogits,) = xent.vjp(logits, y, 1.0)
    grads = mlp.vjp(x, *w, dlogits)
    assert len(grads) == 5  # x, w1, b1, w2, b2 are all differentiable f32 parameters
    assert grads[0].shape == x.shape
    _, ref = reference(td, x, y, params)
    for name, g in zip(GRAD_NAMES, grads):
        assert_grad_close(g, ref[name], f"{variant} mlp.vjp d{name}")


@pytest.mark.parametrize("variant", ["fused", "unfused"])
def test_fwd_bwd_matches_reference(td, gm, batch, params, variant: str) -> None:
    """softmax_xent.fwd_bwd then mlp.fwd_bwd: outputs then gradients, all matching."""
    x, y = batch
    w = [params[k] for k in NAMES]
    mlp = gm.mlp if variant == "fused" else gm.mlp.unfused
    xent = gm.softmax_xent if variant == "fused" else gm.softmax_xent.unfused
    logits = mlp(x, *w)
    ref_loss, ref = reference(td, x, y, params)
    loss, dlogits = xent.fwd_bwd(logits, y, 1.0)
    assert float(loss) == pytest.approx(ref_loss, rel=RTOL)
    out = mlp.fwd_bwd(x, *w, dlogits)
    assert len(out) == 6  # logits, then dx, dw1, db1, dw2, db2
    np.testing.assert_allclose(out[0], logits, rtol=1e-6, atol=1e-6)
    for name, g in zip(GRAD_NAMES, out[1:]):
        assert_grad_close(g, ref[name], f"{variant} mlp.fwd_bwd d{name}")


def test_fused_and_unfused_agree_on_dx(gm, batch, params) -> None:
    """The input gradient agrees across all four paths."""
    x, y = batch
    w = [params[k] for k in NAMES]
    (dlogits,) = gm.softmax_xent.vjp(gm.mlp(x, *w), y, 1.0)
    dxs = [
        gm.mlp.vjp(x, *w, dlogits)[0],
        gm.mlp.fwd_bwd(x, *w, dlogits)[1],
        gm.mlp.unfused.vjp(x, *w, dlogits)[0],
        gm.mlp.unfused.fwd_bwd(x, *w, dlogits)[1],
    ]
    scale = float(np.max(np.abs(dxs[0])))
    for d in dxs[1:]:
        np.testing.assert_allclose(d, dxs[0], rtol=RTOL, atol=1e-6 * scale)


def test_loss_and_grads_helper_matches_reference(td, gm, batch, params) -> None:
    """The training loop's own helper, both ways it can run the backward pass."""
    x, y = batch
    ref_loss, ref = reference(td, x, y, params)
    for fused in (False, True):
        loss, grads = td.loss_and_grads(gm, x, y, params, fused=fused)
        assert loss == pytest.approx(ref_loss, rel=RTOL)
        for name in NAMES:
            assert_grad_close(grads[name], ref[name], f"loss_and_grads(fused={fused}) d{name}")


# ---------------------------------------------------------------------------
# (b) training


def test_short_training_run_generalises(td, gm) -> None:
    res = td.run(module=gm, epochs=10, quiet=True, seed=0)
    assert len(res["losses"]) == 10
    assert all(np.isfinite(res["losses"]))
    assert res["losses"][-1] < 0.5 * res["losses"][0]
    assert res["test_accuracy"] >= 0.95, res["test_accuracy"]
    for name in NAMES:
        assert res["params"][name].dtype == np.float32


def test_main_cli(td, capsys, monkeypatch) -> None:
    """main() parses its flags and prints the held-out accuracy."""
    calls: list[dict] = []

    def fake_run(**kw):
        calls.append(kw)
        return {"test_accuracy": 0.5, "train_accuracy": 0.5, "losses": [1.0],
                "seconds": 0.0, "warmup_seconds": 0.0, "load_seconds": 0.0, "params": {}}

    monkeypatch.setattr(td, "run", fake_run)
    assert td.main(["--epochs", "1", "--hidden", "16", "--lr", "0.1", "--batch", "8",
                    "--seed", "3", "--quiet"]) == 0
    assert calls == [dict(epochs=1, quiet=True, seed=3, hidden=16, lr=0.1, batch=8, cosine=True)]
    assert "held-out accuracy: 50.00%" in capsys.readouterr().out
