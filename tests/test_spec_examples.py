"""The values written in the comments of the spec examples (SPEC §1: "each states in
comments the values it must produce"), reproduced by the generated modules.

``examples/seed.grad`` and ``examples/activations.grad`` are the project's copies
of ``spec-examples/``; ``examples/arrays.grad`` holds the ops of its ``arrays.grad``
that gradc compiles so far (``ARRAYS_OPS``).  Values are float32 (inputs and results); every op is
checked through every method: the forward call, ``vjp``, ``fwd_bwd`` and the
same three on ``.unfused``.  Tolerances as the files say: relative 1e-6, or
absolute 1e-7 near 0; a value written rounded to 7 significant digits is
compared with relative 2e-6 (rounding plus float32 arithmetic).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gradc

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
F32 = np.float32


@pytest.fixture(scope="module")
def seed():
    return gradc.load(EXAMPLES / "seed.grad")


@pytest.fixture(scope="module")
def act():
    return gradc.load(EXAMPLES / "activations.grad")


def _sig_digits(text: str) -> int:
    mantissa = text.lower().split("e")[0].lstrip("+-").replace(".", "").lstrip("0")
    return len(mantissa)


def expect(got, written, what: str = "") -> None:
    """``got`` (float32) equals the values ``written`` as in the file (strings or numbers).

    "~0" and 0 are checked with absolute 1e-7; a value with 7 or more significant
    digits (rounded) with relative 2e-6; other values (exact: 0.5, 30.0, -0.2)
    with relative 1e-6.
    """
    got = np.asarray(got)
    assert got.dtype == F32, f"{what}: dtype {got.dtype}, expected float32"
    items = np.asarray(written, dtype=object)
    assert got.shape == items.shape, f"{what}: shape {got.shape}, expected {items.shape}"
    for idx in np.ndindex(items.shape):
        w = items[idx]
        text = w if isinstance(w, str) else repr(float(w))
        value = 0.0 if text.strip() == "~0" else float(text)
        if value == 0.0:
            tol = 1e-7
        elif _sig_digits(text) >= 7:
            tol = 2e-6 * abs(value)
        else:
            tol = 1e-6 * abs(value)
        g = float(got[idx])
        assert abs(g - value) <= tol, f"{what}[{idx}]: got {g!r}, expected {text} (±{tol:.2g})"


def f32(*values):
    return np.array(values, dtype=F32)


def check_op(op, inputs, upstreams, y, grads, kwargs=None) -> None:
    """Every method of ``op`` (fused and unfused) gives ``y`` and ``grads``."""
    kwargs = kwargs or {}
    ys = y if isinstance(y, tuple) else (y,)
    for variant, o in (("fused", op), ("unfused", op.unfused)):
        name = f"{op.__name__} {variant}"
        fwd = o(*inputs, **kwargs)
        fwd = fwd if isinstance(fwd, tuple) else (fwd,)
        assert len(fwd) == len(ys), name
        for k, (got, want) in enumerate(zip(fwd, ys)):
            expect(got, want, f"{name} forward[{k}]")
        g = o.vjp(*inputs, *upstreams, **kwargs)
        assert isinstance(g, tuple) and len(g) == len(grads), f"{name} vjp: {g!r}"
        for k, (got, want) in enumerate(zip(g, grads)):
            expect(got, want, f"{name} vjp[{k}]")
        fb = o.fwd_bwd(*inputs, *upstreams, **kwargs)
        assert isinstance(fb, tuple) and len(fb) == len(ys) + len(grads), f"{name} fwd_bwd"
        for k, (got, want) in enumerate(zip(fb, ys + tuple(grads))):
            expect(got, want, f"{name} fwd_bwd[{k}]")


# ---- seed.grad -------------------------------------------------------------------

def test_custom_linear(seed) -> None:
    # x = 3.0 -> y = 6.0, dx = 1.0 (dy = 1)
    x = np.asarray(3.0, dtype=F32)
    check_op(seed.custom_linear, [x], [np.asarray(1.0, dtype=F32)], "6.0", ["1.0"])
    # an upstream may be a Python scalar when the output is 0-d
    (dx,) = seed.custom_linear.vjp(x, 1.0)
    expect(dx, "1.0", "custom_linear.vjp with a scalar upstream")


def test_sign_ste(seed) -> None:
    # x = [-2, -1, 0, 1, 2] -> y = [-1, -1, 0, 1, 1], dx = [1, 1, 1, 1, 1] (dy = 1)
    x = f32(-2, -1, 0, 1, 2)
    check_op(seed.sign_ste, [x], [np.ones(5, F32)], [-1, -1, 0, 1, 1], [[1, 1, 1, 1, 1]])


def test_clipped_relu(seed) -> None:
    # x = [-2, -1, 0, 1, 2] -> y = [0, 0, 0, 1, 2], dx = [0, 0, 0, 1, 1] (dy = 1)
    x = f32(-2, -1, 0, 1, 2)
    check_op(seed.clipped_relu, [x], [np.ones(5, F32)], [0, 0, 0, 1, 2], [[0, 0, 0, 1, 1]])


def test_clipped_relu_clips_the_upstream(seed) -> None:
    # x = [1, 2], dy = [5, -3] -> dx = [1, -1]
    check_op(seed.clipped_relu, [f32(1, 2)], [f32(5, -3)], [1, 2], [[1, -1]])


def test_scaled_tanh(seed) -> None:
    # x = [0, 1] -> y = [0, 0.7615942], dx = [0.5, 0.2099871] (dy = 1)
    check_op(seed.scaled_tanh, [f32(0, 1)], [np.ones(2, F32)],
             [0, "0.7615942"], [["0.5", "0.2099871"]])


def test_softmax_xent(seed) -> None:
    # logits = [[0, 0]], onehot = [[1, 0]] -> loss = 0.6931472 (ln 2), dlogits = [[-0.5, 0.5]]
    logits, onehot = np.zeros((1, 2), F32), np.array([[1, 0]], F32)
    # onehot is nograd: one gradient; the 0-d loss takes a 0-d (or scalar) upstream
    check_op(seed.softmax_xent, [logits, onehot], [np.asarray(1.0, F32)],
             "0.6931472", [[["-0.5", "0.5"]]])
    (d,) = seed.softmax_xent.vjp(logits, onehot, 1.0)
    expect(d, [["-0.5", "0.5"]], "softmax_xent.vjp with a Python scalar upstream")
    expect(seed.softmax_xent(logits, onehot), repr(float(np.log(F32(2)))), "ln 2")


def test_mlp_uses_the_custom_gradient_of_scaled_tanh(seed) -> None:
    """mlp has no written values; its comment says scaled_tanh's custom (halved)
    gradient applies inside.  Checked against the NumPy closed form in float64."""
    rng = np.random.default_rng(0)
    x, w1, b1, w2, b2 = (rng.standard_normal(s).astype(F32)
                         for s in [(3, 5), (5, 4), (4,), (4, 2), (2,)])
    dy = rng.standard_normal((3, 2)).astype(F32)
    X, W1, B1, W2, B2, DY = (a.astype(np.float64) for a in (x, w1, b1, w2, b2, dy))
    h = np.tanh(X @ W1 + B1)
    logits = h @ W2 + B2
    dh = DY @ W2.T
    dz = dh * (1 - h ** 2) * 0.5                # the custom rule: half the tanh derivative
    want = [X.T @ dz, dz.sum(0), h.T @ DY, DY.sum(0)]
    want = [dz @ W1.T] + want
    for o in (seed.mlp, seed.mlp.unfused):
        np.testing.assert_allclose(o(x, w1, b1, w2, b2), logits, rtol=1e-5, atol=1e-5)
        grads = o.vjp(x, w1, b1, w2, b2, dy)
        assert [g.shape for g in grads] == [a.shape for a in (x, w1, b1, w2, b2)]
        for g, w in zip(grads, want):
            assert g.dtype == F32
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# ---- gradient_penalty: against float64 finite differences of a NumPy reference ----

def penalty_ref(real, fake, alpha, w):
    """The penalty in float64: critic s = tanh(xi @ w), d sum(s) / d xi = (1 - s^2) w."""
    xi = alpha * real + (1 - alpha) * fake
    s = np.tanh(xi @ w)
    g = (1 - s ** 2)[:, None] * w
    return np.mean((np.linalg.norm(g, axis=1) - 1) ** 2)


def _fd_grad(f, args, i, h=1e-6):
    args = [np.array(a, dtype=np.float64) for a in args]
    out = np.zeros_like(args[i])
    for idx in np.ndindex(out.shape):
        up = [a.copy() for a in args]
        dn = [a.copy() for a in args]
        up[i][idx] += h
        dn[i][idx] -= h
        out[idx] = (f(*up) - f(*dn)) / (2 * h)
    return out


def test_gradient_penalty_matches_finite_differences(seed) -> None:
    rng = np.random.default_rng(3)
    b, d = 3, 4
    real = rng.standard_normal((b, d)).astype(F32)
    fake = rng.standard_normal((b, d)).astype(F32)
    alpha = rng.uniform(0, 1, (b, 1)).astype(F32)
    w = (0.7 * rng.standard_normal(d)).astype(F32)
    args = (real, fake, alpha, w)
    p_ref = penalty_ref(*(a.astype(np.float64) for a in args))
    fd = [_fd_grad(penalty_ref, args, i) for i in (0, 1, 3)]   # alpha is nograd
    dp = np.asarray(1.0, F32)
    gp = seed.gradient_penalty
    for variant, op in (("fused", gp), ("unfused", gp.unfused)):
        p = op(*args)
        assert p.dtype == F32 and p.shape == ()
        np.testing.assert_allclose(p, p_ref, rtol=1e-5, err_msg=variant)
        grads = op.vjp(*args, dp)
        assert len(grads) == 3, f"{variant}: one gradient per differentiable input"
        fb = op.fwd_bwd(*args, dp)
        assert len(fb) == 4
        np.testing.assert_allclose(fb[0], p_ref, rtol=1e-5, err_msg=variant)
        for name, g, g2, want in zip(("real", "fake", "w"), grads, fb[1:], fd):
            assert g.dtype == F32 and g.shape == want.shape, (variant, name)
            scale = np.max(np.abs(want))
            np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{variant} d/d{name}")
            np.testing.assert_allclose(g2, g, rtol=1e-6, atol=1e-6 * scale,
                                       err_msg=f"{variant} fwd_bwd d/d{name}")


def test_critic(seed) -> None:
    x = np.array([[1, 0], [0.5, -1]], F32)
    w = f32(0.3, -0.2)
    s = seed.critic(x, w)
    np.testing.assert_allclose(s, np.tanh(x.astype(np.float64) @ w), rtol=1e-6)
    dx, dw = seed.critic.vjp(x, w, np.ones(2, F32))
    ds = 1 - np.tanh(x.astype(np.float64) @ w) ** 2
    np.testing.assert_allclose(dx, ds[:, None] * w, rtol=1e-5)
    np.testing.assert_allclose(dw, x.T.astype(np.float64) @ ds, rtol=1e-5)


# ---- activations.grad --------------------------------------------------------------

def test_softplus_stable(act) -> None:
    # x = [-30, 0, 2, 30] -> y = [9.357623e-14, 0.6931472, 2.126928, 30.0]
    #                        dx = [9.357623e-14, 0.5, 0.8807971, 1.0]
    check_op(act.softplus_stable, [f32(-30, 0, 2, 30)], [np.ones(4, F32)],
             ["9.357623e-14", "0.6931472", "2.126928", "30.0"],
             [["9.357623e-14", "0.5", "0.8807971", "1.0"]])


def test_gelu_tanh(act) -> None:
    # x = [-1, 0, 1, 3] -> y = [-0.1588080, 0, 0.8411920, 2.9963626]
    #                     dx = [-0.0829641, 0.5, 1.0829641, 1.0115842]
    check_op(act.gelu_tanh, [f32(-1, 0, 1, 3)], [np.ones(4, F32)],
             ["-0.1588080", "0", "0.8411920", "2.9963626"],
             [["-0.0829641", "0.5", "1.0829641", "1.0115842"]])


def test_swish(act) -> None:
    # x = [-1, 0, 1] -> y = [-0.2689414, 0, 0.7310586], dx = [0.0723295, 0.5, 0.9276705]
    check_op(act.swish, [f32(-1, 0, 1)], [np.ones(3, F32)],
             ["-0.2689414", "0", "0.7310586"], [["0.0723295", "0.5", "0.9276705"]])


def test_huber(act) -> None:
    # x = [-2, 0.5, 3] -> y = [1.5, 0.125, 2.5], dx = [-1, 0.5, 1]   (delta = 1.0)
    check_op(act.huber, [f32(-2, 0.5, 3)], [np.ones(3, F32)],
             ["1.5", "0.125", "2.5"], [["-1", "0.5", "1"]])
    # delta is a keyword-only nograd parameter: passing the default changes nothing
    check_op(act.huber, [f32(-2, 0.5, 3)], [np.ones(3, F32)],
             ["1.5", "0.125", "2.5"], [["-1", "0.5", "1"]], kwargs={"delta": 1.0})


def test_log_sigmoid(act) -> None:
    # x = [-100, 0, 100] -> y = [-100, -0.6931472, ~0 (3.7e-44 or 0)], dx = [1, 0.5, ~0]
    check_op(act.log_sigmoid, [f32(-100, 0, 100)], [np.ones(3, F32)],
             ["-100", "-0.6931472", "~0"], [["1", "0.5", "~0"]])
    y = act.log_sigmoid(f32(100))
    assert 0 >= float(y[0]) > -1e-40          # 3.7e-44 (denormal) or 0, never a rounding error


def test_leaky_relu_with_alpha_keyword(act) -> None:
    # x = [-2, 3], alpha = 0.1 -> y = [-0.2, 3], dx = [0.1, 1]; alpha gets no gradient
    check_op(act.leaky_relu, [f32(-2, 3)], [np.ones(2, F32)], ["-0.2", "3"], [["0.1", "1"]],
             kwargs={"alpha": 0.1})
    # the default slope 0.01
    check_op(act.leaky_relu, [f32(-2, 3)], [np.ones(2, F32)], ["-0.02", "3"], [["0.01", "1"]])
    with pytest.raises(TypeError):
        act.leaky_relu(f32(-2, 3), 0.1)        # alpha is keyword-only


def test_add_bias_reduces_the_bias_gradient(act) -> None:
    # x = [[1, 2], [3, 4]], b = [10, 20], dy = 1 -> y = x + b,
    #   dx = [[1, 1], [1, 1]], db = [2, 2]
    x, b = np.array([[1, 2], [3, 4]], F32), f32(10, 20)
    check_op(act.add_bias, [x, b], [np.ones((2, 2), F32)], [[11, 22], [13, 24]],
             [[[1, 1], [1, 1]], [2, 2]])


# ---- arrays.grad (SPEC §1b): the ops gradc compiles so far ----------------------------
# examples/arrays.grad holds every op of the spec's arrays.grad (xent_labels, xent_gather,
# smooth_xent, st_argmax, attention, rope, bias_nchw, cumsum_rows, sorted_weighted,
# dropout, softplus), as there.  Its values are float64: compared to 1e-12 relative in
# float64, and to 2e-6 (float32's rounding) in float32, through every method, fused and
# unfused (dropout's: the properties it states).

ARRAYS_OPS = ("xent_labels", "xent_gather", "smooth_xent", "st_argmax", "attention", "rope",
              "bias_nchw", "cumsum_rows", "sorted_weighted", "dropout", "softplus")


@pytest.fixture(scope="module")
def arrays():
    return gradc.load(EXAMPLES / "arrays.grad")


def check_values(op, inputs, upstreams, y, grads) -> None:
    """Every method of ``op`` (fused and unfused), float64 and float32, gives ``y``
    and ``grads`` (float64 values)."""
    want = [np.asarray(w, np.float64) for w in (y, *grads)]
    for dt, rtol, atol in ((np.float64, 1e-12, 1e-300), (np.float32, 2e-6, 1e-7)):
        xs = [x.astype(dt) if x.dtype.kind == "f" else x for x in inputs]
        us = [np.asarray(u, dt) for u in upstreams]
        for o in (op, op.unfused):
            what = f"{op.__name__} {dt.__name__} {'fused' if o is op else 'unfused'}"
            got = [o(*xs), *o.vjp(*xs, *us)] if grads else [o(*xs)]
            if grads:
                fb = o.fwd_bwd(*xs, *us)
                assert len(fb) == 1 + len(grads), what
                got += list(fb)
            for k, (g, w) in enumerate(zip(got, want + want)):
                assert np.asarray(g).dtype == dt, (what, k, np.asarray(g).dtype)
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what} [{k}]")


def test_smooth_xent(arrays) -> None:
    logits, labels = np.array([[1.0, 2, 3], [1, 0, 0]]), np.array([2, 0], np.int64)
    check_values(arrays.smooth_xent, [logits, labels], [1.0], 0.5628586725215489,
                 [[[0.028348619918523565, 0.10569756886073216, -0.13404618877925578],
                   [-0.17860822428375212, 0.08930411214187606, 0.08930411214187606]]])


def test_xent_labels(arrays) -> None:
    """Advanced indexing logits[arange(n), labels]: a gather, its VJP a scatter-add."""
    logits, labels = np.array([[1.0, 2, 3], [1, 0, 0]]), np.array([2, 0], np.int64)
    check_values(arrays.xent_labels, [logits, labels], [1.0], 0.4795253391882155,
                 [[[0.04501528658519023, 0.12236423552739882, -0.1673795221125891],
                   [-0.21194155761708544, 0.10597077880854272, 0.10597077880854272]]])


def test_rope(arrays) -> None:
    """Slices by a dim (x[..., :h], x[..., h:]) and concat; cos and sin are nograd."""
    x, cos, sin = np.array([[1.0, 2, 3, 4]]), np.array([[0.5, 1]]), np.array([[0.25, 0]])
    check_values(arrays.rope, [x, cos, sin], [[[1.0, 0, 0, 1]]], [[-0.25, 2, 1.75, 4]],
                 [[[0.5, 0, -0.25, 1]]])


def test_xent_gather(arrays) -> None:
    """take_along_axis of expand_dims: the values of xent_labels in the spec."""
    logits, labels = np.array([[1.0, 2, 3], [1, 0, 0]]), np.array([2, 0], np.int64)
    check_values(arrays.xent_gather, [logits, labels], [1.0], 0.4795253391882155,
                 [[[0.04501528658519023, 0.12236423552739882, -0.1673795221125891],
                   [-0.21194155761708544, 0.10597077880854272, 0.10597077880854272]]])


def test_attention(arrays) -> None:
    """Batched @ over (batch, head) dims, swapaxes, a dim as a value; the vjp at ones."""
    q = np.array([[[[0, 0.3], [-0.3, -0.9]], [[-0.5, -1], [0.1, 1.3]]]])
    k = np.array([[[[-0.5, -0.6], [0.5, 0.4], [0.1, -0.9]], [[0, 0.7], [-1.3, -0.5], [-1.9, -1.3]]]])
    v = np.array([[[[-1.8, -0.2], [-1.3, 0.3], [0.2, -0.2]], [[-2.5, -0.5], [0, 0.1], [-1.5, -0.5]]]])
    out = [[[[-1.0141374778267676, -0.005284130949125895], [-0.8594742146327321, -0.11417663777800231]],
            [[-1.1432647012028643, -0.3259374471072637], [-1.8786673014427875, -0.3740289712270234]]]]
    dq = [[[[0.13318475901957275, -0.058570192058511425], [0.17333434249417465, -0.09146426660374574]],
           [[0.031855416780799034, 0.08774638224597055], [-0.48680617504049073, -0.45360191146777473]]]]
    dk = [[[[0.08730678396130843, 0.1963975973676423], [0.0009594190713316707, 0.004482694704250031],
            [-0.08826620303264013, -0.20088029207189234]],
           [[0.005791777019683647, -0.391579484919697], [-0.12602117038641253, 0.13216262835664525],
            [0.1202293933667289, 0.2594168565630517]]]]
    dv = [[[[0.715996999320442, 0.715996999320442], [0.5610784625457437, 0.5610784625457437],
            [0.7229245381338145, 0.7229245381338145]],
           [[0.772015956809934, 0.772015956809934], [0.5000559694428548, 0.5000559694428548],
            [0.7279280737472112, 0.7279280737472112]]]]
    check_values(arrays.attention, [q, k, v], [np.ones((1, 2, 2, 2))], out, [dq, dk, dv])


def test_bias_nchw(arrays) -> None:
    """reshape with -1; the bias's gradient is reshaped back from the broadcast sum."""
    x, b = np.zeros((2, 3, 2, 2)), np.array([1.0, 2, 3])
    y = np.broadcast_to(b[None, :, None, None], x.shape)
    check_values(arrays.bias_nchw, [x, b], [np.ones(x.shape)], y, [np.ones(x.shape), [8, 8, 8]])


def test_st_argmax(arrays) -> None:
    x, dy = np.array([[0.5, 2, -1], [3, 1, 1]]), np.array([[1.0, 0, 0], [0, 0, 1]])
    check_values(arrays.st_argmax, [x], [dy], [[0, 1, 0], [1, 0, 0]],
                 [[[0.14456367056342886, -0.13770761225720413, -0.006856058306224722],
                   [-0.08381950580221058, -0.01134373655849507, 0.09516324236070567]]])


def test_cumsum_rows(arrays) -> None:
    """A scan: its VJP is the reverse scan of the cotangent."""
    check_values(arrays.cumsum_rows, [np.array([[3.0, 1, 2]])], [[[1.0, 2, 3]]], [[3, 4, 6]],
                 [[[6, 5, 3]]])


def test_sorted_weighted(arrays) -> None:
    """sort, descending: the gradient flows back through the permutation."""
    x, w = np.array([[3.0, 1, 2]]), np.array([1, 0.5, 0.25])
    check_values(arrays.sorted_weighted, [x, w], [[1.0]], [4.25], [[[1, 0.25, 0.5]]])


def test_dropout(arrays) -> None:
    """The properties arrays.grad states: one seed, one mask in every method, fused and
    unfused, float64 and float32; dx = where(y != 0, dy / (1 - p), 0); another seed,
    another mask; the kept fraction 1 - p within 5 sigma (10^5 elements)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2, (100, 1000))            # no zeros: y != 0 is the mask
    dy = rng.standard_normal(x.shape)
    for dt in (np.float64, np.float32):
        xs, dys = x.astype(dt), dy.astype(dt)
        op = arrays.dropout
        for p in (0.5, 0.2):
            y = op(xs, p=p, seed=11)
            keep = y != 0
            np.testing.assert_allclose(y[keep], xs[keep] / dt(1 - p), rtol=1e-6)
            dx = np.where(keep, dys / dt(1 - p), 0)
            for o in (op, op.unfused):
                np.testing.assert_array_equal(o(xs, p=p, seed=11), y)
                np.testing.assert_array_equal(o.vjp(xs, dys, p=p, seed=11)[0], dx)
                yy, dxx = o.fwd_bwd(xs, dys, p=p, seed=11)
                np.testing.assert_array_equal(yy, y)
                np.testing.assert_array_equal(dxx, dx)
            kept, n = keep.mean(), keep.size
            assert abs(kept - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), (dt, p, kept)
            other = op(xs, p=p, seed=12) != 0
            assert 0.1 * n < np.sum(other != keep) < 0.9 * n
        assert not np.array_equal(op(xs) != 0, op(xs) != 0)    # a fresh seed per call


def test_softplus_shadows_the_builtin(arrays) -> None:
    x = np.array([-30.0, 0, 30])
    check_values(arrays.softplus, [x], [], [9.357622968839737e-14, 0.6931471805599453, 30], [])
    assert "op softplus(x)" in arrays.softplus.spec


def test_every_op_of_the_examples_is_tested(seed, act, arrays) -> None:
    tested = {"custom_linear", "sign_ste", "clipped_relu", "scaled_tanh", "mlp", "softmax_xent",
              "critic", "gradient_penalty", "softplus_stable", "gelu_tanh", "swish", "huber",
              "log_sigmoid", "leaky_relu", "add_bias"}
    assert set(seed.OPS) | set(act.OPS) == tested
    assert set(arrays.OPS) == set(ARRAYS_OPS)
