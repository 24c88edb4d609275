"""examples/kernels/: Liger-Kernel's catalogue and a FlashAttention-style backward as
.grad files (docs/kernels.md).  Each file passes ``gradc check`` (its custom gradient
is the derivative, audited), gives the values written in its comments, and agrees with
a NumPy reference: the forward pass, and every gradient against float64 central
differences of that reference, through ``vjp`` and ``fwd_bwd``, fused and unfused in
float64, fused in float32."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gradc
from gradc.tools.cli import main

KERNELS = Path(__file__).resolve().parents[1] / "examples" / "kernels"
FILES = sorted(KERNELS.glob("*.grad"))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _lse(x):
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


def _sparsemax(z):
    zs = -np.sort(-z, axis=-1)
    r = np.arange(1, z.shape[-1] + 1)
    cs = np.cumsum(zs, axis=-1)
    k = np.sum(1 + r * zs > cs, axis=-1, keepdims=True)
    tau = (np.take_along_axis(cs, k - 1, axis=-1) - 1) / k
    return np.maximum(z - tau, 0)


def _layer_norm(x, w, b, eps=1e-5):
    xc = x - x.mean(axis=-1, keepdims=True)
    return xc / np.sqrt((xc ** 2).mean(axis=-1, keepdims=True) + eps) * w + b


def _gelu_tanh(a):
    return 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))


def _xent(logits, labels, label_smoothing=0.0):
    lse = _lse(logits)
    nll = lse - np.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return np.mean((1 - label_smoothing) * nll + label_smoothing * (lse - logits.mean(axis=-1)))


def _attention(q, k, v):
    return _softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])) @ v


RNG = np.random.default_rng(0)
LABELS = RNG.integers(0, 7, 5)
# op -> (NumPy reference, random inputs (the differentiable ones first), the values of
# the file's comments: (inputs, keywords, forward value))
CASES = {
    "rms_norm": (lambda x, w: x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + 1e-6) * w,
                 [RNG.standard_normal((5, 7)), RNG.standard_normal(7)],
                 ([np.array([[1.0, 2, 2]]), np.array([1, 0.5, 2])], {},
                  [[0.5773501729646049, 0.5773501729646049, 2.3094006918584196]])),
    "layer_norm": (_layer_norm, [RNG.standard_normal((5, 7)), RNG.standard_normal(7),
                                 RNG.standard_normal(7)],
                   ([np.array([[1.0, 2, 4], [-1, 0, 3]]), np.array([0.5, 1, 2]),
                     np.array([0, 0.1, -0.1])], {},
                    [[-0.5345207657251488, -0.16726038286257452, 2.5726038286257435],
                     [-0.4902894892682321, -0.29223159141458577, 2.6456211399021003]])),
    "swiglu": (lambda a, b: a / (1 + np.exp(-a)) * b,
               [RNG.standard_normal((5, 7)), RNG.standard_normal((5, 7))],
               ([np.array([-1.0, 0, 2]), np.array([1.0, 2, 3])], {},
                [-0.2689414213699951, 0, 5.284782467867294])),
    "geglu": (lambda a, b: _gelu_tanh(a) * b,
              [RNG.standard_normal((5, 7)), RNG.standard_normal((5, 7))],
              ([np.array([-1.0, 0, 2]), np.array([1.0, 2, 3])], {},
               [-0.1588080093917233, 0, 5.863793082263324])),
    "softmax": (_softmax, [RNG.standard_normal((5, 7))],
                ([np.array([[1.0, 2, 3], [0, 0, 0]])], {},
                 [[0.09003057317038046, 0.24472847105479764, 0.6652409557748218],
                  [1 / 3, 1 / 3, 1 / 3]])),
    "sparsemax": (_sparsemax, [RNG.standard_normal((5, 7))],
                  ([np.array([[1.0, 0.5, -1], [0.1, 0.2, 0.3]])], {},
                   [[0.75, 0.25, 0], [0.7 / 3, 1 / 3, 1.3 / 3]])),
    "cross_entropy": (lambda x, labels: _xent(x, labels, 0.1),
                      [RNG.standard_normal((5, 7)), LABELS],
                      ([np.array([[1.0, 2, 3], [1, 0, 0]]), np.array([2, 0])], {},
                       0.4795253391882155)),
}
CASES["rope"] = (
    lambda x, cos, sin: np.concatenate([x[..., :3] * cos - x[..., 3:] * sin,
                                        x[..., 3:] * cos + x[..., :3] * sin], axis=-1),
    [RNG.standard_normal((2, 2, 5, 6)), RNG.standard_normal((5, 3)), RNG.standard_normal((5, 3))],
    ([np.array([[[[1.0, 2, 3, 4]]]]), np.array([[0.5, 1]]), np.array([[0.25, 0]])], {},
     [[[[-0.25, 2, 1.75, 4]]]]))
CASES["flash_attention"] = (
    _attention, [RNG.standard_normal((2, 2, 3, 4)), RNG.standard_normal((2, 2, 5, 4)),
                 RNG.standard_normal((2, 2, 5, 3))],
    ([np.array([[[[0, 0.3], [-0.3, -0.9]]]]), np.array([[[[-0.5, -0.6], [0.5, 0.4], [0.1, -0.9]]]]),
      np.array([[[[-1.8, -0.2], [-1.3, 0.3], [0.2, -0.2]]]])], {},
     [[[[-1.0141374778267676, -0.005284130949125895],
        [-0.8594742146327321, -0.11417663777800231]]]]))
KWARGS = {"cross_entropy": {"label_smoothing": 0.1}}


@pytest.fixture(scope="module")
def kernels():
    return {f.stem: gradc.load(f) for f in FILES}


def test_every_kernel_file_has_a_case() -> None:
    assert {f.stem for f in FILES} == set(CASES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_gradc_check_passes(path, capsys) -> None:
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "exact" in out or "custom" not in out, out     # the custom rule is audited exact


def _fd(f, xs, i, v, h=1e-6):
    """<v, df/dx_i> by float64 central differences, per element of x_i."""
    g = np.zeros_like(xs[i])
    for j in np.ndindex(xs[i].shape):
        e = np.zeros_like(xs[i])
        e[j] = h
        lo, hi = list(xs), list(xs)
        hi[i], lo[i] = xs[i] + e, xs[i] - e
        g[j] = np.vdot(v, (np.asarray(f(*hi)) - np.asarray(f(*lo))) / (2 * h))
    return g


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients(kernels, name) -> None:
    ref, xs, (given, kw, want) = CASES[name]
    op = getattr(kernels[name], name)
    kw = KWARGS.get(name, {})
    ints = [x for x in xs if x.dtype.kind == "i"]
    floats = [x for x in xs if x.dtype.kind == "f"]
    for o in (op, op.unfused):
        np.testing.assert_allclose(o(*given), want, rtol=1e-12, atol=1e-15, err_msg=name)
    y = np.asarray(ref(*xs))
    v = RNG.standard_normal(y.shape)
    grads = [_fd(ref, xs, i, v) for i in range(len(floats))]
    # float32 through the fused kernels only: each dtype and variant is a compilation
    for dt, rtol, variants in ((np.float64, 1e-6, (op, op.unfused)), (np.float32, 2e-3, (op,))):
        args = [x.astype(dt) for x in floats] + ints
        for o in variants:
            what = f"{name} {dt.__name__} {'fused' if o is op else 'unfused'}"
            np.testing.assert_allclose(o(*args, **kw), y, rtol=rtol, atol=rtol, err_msg=what)
            vjp = o.vjp(*args, np.asarray(v, dt), **kw)
            fb = o.fwd_bwd(*args, np.asarray(v, dt), **kw)
            np.testing.assert_allclose(fb[0], y, rtol=rtol, atol=rtol, err_msg=what)
            for g, g2, want_g in zip(vjp, fb[1:], grads):
                assert g.dtype == dt, what
                np.testing.assert_allclose(g, want_g, rtol=rtol, atol=rtol, err_msg=what)
                np.testing.assert_allclose(g2, g, rtol=rtol, atol=rtol, err_msg=what)


def test_cross_entropy_at_masked_logits_and_labels_out_of_range(kernels) -> None:
    """A masked (-inf) logit, or a row whose mean overflows, keeps PyTorch's finite loss
    without smoothing (the smoothing term, ``0 * inf`` there, is not taken); a label
    outside [0, v), negative ones included (PyTorch's), is an IndexError naming it in
    the forward and the gradient alike (the gradient named the label plus v)."""
    op = kernels["cross_entropy"].cross_entropy
    masked = np.array([[-np.inf, 0.0, 1.0], [1.0, 2.0, 3.0]])
    huge = np.array([[1e308, 1e308, 0.0]])
    for o in (op, op.unfused):
        np.testing.assert_allclose(o(masked, np.array([1, 2])),
                                   (1.3132616875182228 + 0.40760596444438) / 2, rtol=1e-12)
        assert o(huge, np.array([2])) == 1e308
        (g,) = o.vjp(masked, np.array([1, 2]), 1.0)
        want = (_softmax(masked) - np.eye(3)[[1, 2]]) / 2
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-15)
        x = RNG.standard_normal((4, 5))
        for bad, said in (([1, 5, 0, 0], "index 5"), ([1, -1, 0, 0], "index -1"),
                          ([1, -100, 0, 0], "index -100")):
            for call in (lambda: o(x, np.array(bad)), lambda: o.vjp(x, np.array(bad), 1.0),
                         lambda: o.fwd_bwd(x, np.array(bad), 1.0)):
                with pytest.raises(IndexError, match=f"one_hot: {said} is out of range for "
                                                     "depth 5"):
                    call()


def test_sparsemax_of_rows_with_masked_entries(kernels) -> None:
    """-inf entries are outside the support: 0 there, the rest the sparsemax of the
    finite entries (the row was NaN: 0 * -inf in the support's sum)."""
    op = kernels["sparsemax"].sparsemax
    z = np.array([[-np.inf, 0.5, 1.0], [-np.inf, -np.inf, 2.0]])
    dp = np.array([[1.0, 2.0, 4.0], [1.0, 2.0, 3.0]])
    for o in (op, op.unfused):
        np.testing.assert_allclose(o(z), [[0, 0.25, 0.75], [0, 0, 1]], rtol=1e-15)
        np.testing.assert_allclose(o.vjp(z, dp)[0], [[0, -1, 1], [0, 0, 0]], atol=1e-15)
        np.testing.assert_allclose(o(z[:, 1:]), _sparsemax(z[:, 1:]), rtol=1e-15)


@pytest.mark.parametrize("dtype, offset", [(np.float32, 1e8), (np.float32, 3e38),
                                           (np.float64, 1e17), (np.float64, 3e38)])
def test_large_logits_keep_the_loss_and_sparsemax(kernels, dtype, offset) -> None:
    """Both files work on the row less its max, as PyTorch's log_softmax does: equal
    logits of any size have the loss log(3) with and without smoothing (it was 0, and
    -inf or -3.8e21 with smoothing, as lse - logit[label] cancels), and sparsemax of a
    row around a large value is the sparsemax of its differences (it was inf: its
    support test rounded to false everywhere; found by helper 65)."""
    ce = kernels["cross_entropy"].cross_entropy
    x = np.full((2, 3), offset, dtype)
    for o in (ce, ce.unfused):
        for ls in (0.0, 0.1):
            loss = o(x, np.array([0, 2]), label_smoothing=ls)
            assert loss.dtype == dtype
            np.testing.assert_allclose(loss, np.log(3), rtol=1e-6)
    sp = kernels["sparsemax"].sparsemax
    z = np.array([[offset, offset, 0]], dtype)
    for o in (sp, sp.unfused):
        np.testing.assert_allclose(o(z), [[0.5, 0.5, 0]], rtol=1e-6)
