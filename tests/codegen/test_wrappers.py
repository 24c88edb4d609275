"""The host wrappers of the generated module (SPEC §2): argument validation, ``out=``
buffers, array layouts and sizes, and the methods this version does not have.

Bad arguments must raise TypeError or ValueError with a message naming what is
wrong, never crash or write out of bounds.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import gradc

SOURCE = """
op f(x, y) -> r {
    r = x * y + 1
}
op g(x: f32[n, k], b: f32[k]) -> r {
    r = tanh(x + b)
}
op h(x: f64[3, k]) -> r {
    r = x * 2
}
op two(x, y) -> (a, b) {
    a = x * y
    b = x + y
}
op red(x) -> r {
    r = sum(x * x, axis=1)
}
op mm(x: f64[m, k], w: f64[k, n]) -> r {
    r = x @ w
}
op lr(x, alpha: nograd = 0.01) -> y {
    y = where(x > 0, x, alpha * x)
}
op chain(x) -> y {
    y = sin(x) * exp(-x * x) + log1p(x * x)
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="wrappers.grad"),
                              "gradc_test_wrappers_gen")


def ones(*shape, dtype=np.float64):
    return np.ones(shape, dtype=dtype)


# ---- argument count, dtype and shape ------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda m: m.f(ones(3)),
    lambda m: m.f(ones(3), ones(3), ones(3)),
    lambda m: m.f.vjp(ones(3), ones(3)),                    # missing upstream
    lambda m: m.f.vjp(ones(3), ones(3), ones(3), ones(3)),
    lambda m: m.f.fwd_bwd(ones(3), ones(3)),
    lambda m: m.two.vjp(ones(3), ones(3), ones(3)),         # one upstream per output
    lambda m: m.f(ones(3), ones(3), beta=1.0),              # unknown keyword
    lambda m: m.lr(ones(3), 0.1),                           # defaults are keyword-only
    lambda m: m.f.unfused(ones(3)),
], ids=["forward-1", "forward-3", "vjp-2", "vjp-4", "fwd_bwd-2", "two-vjp-3", "keyword",
        "positional-default", "unfused-1"])
def test_wrong_argument_count_is_a_type_error(m, call) -> None:
    with pytest.raises(TypeError):
        call(m)


@pytest.mark.parametrize("call, text", [
    (lambda m: m.lr(ones(3), 0.1), "lr.forward() takes 1 positional argument but 2 were given: "
                                   "alpha is keyword-only, as every parameter with a default: "
                                   "lr(..., alpha=...)"),
    (lambda m: m.lr.unfused.vjp(ones(3), ones(3), 0.1), "lr.unfused.vjp(..., alpha=...)"),
])
def test_a_default_passed_by_position_names_the_keyword(m, call, text) -> None:
    with pytest.raises(TypeError) as info:
        call(m)
    assert text in str(info.value)


def test_errors_of_unfused_methods_name_them(m) -> None:
    with pytest.raises(ValueError, match=r"^f\.unfused\.forward: out\[0\] must have shape"):
        m.f.unfused(ones(3), ones(3), out=np.empty(4))
    with pytest.raises(TypeError, match=r"^f\.unfused\.vjp\(\) missing 1 required"):
        m.f.unfused.vjp(ones(3), ones(3))


def test_f32_param_rejects_float64(m) -> None:
    with pytest.raises(TypeError, match=r"'x' must be float32, got float64"):
        m.g(ones(2, 3), ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match=r"'b' must be float32"):
        m.g.vjp(ones(2, 3, dtype=np.float32), ones(3), ones(2, 3, dtype=np.float32))


_TYPED = """
op g32(x: f32) -> y { y = x * 3 }
op g64(x: f64, w) -> y { y = x * w }
op h16(x: f16) -> y { y = x * 2 }
op gen(x, w) -> y { y = x * w }
"""


def test_a_python_scalar_takes_the_dtype_of_its_annotated_parameter(import_module_text) -> None:
    """``x: f32`` given 0.1 computes in float32 as if given np.float32(0.1) (it was
    float64: the scalar was weak); for generic parameters scalars stay weak."""
    t = import_module_text(gradc.compile_source(_TYPED, file="typed.grad"), "gradc_test_typed")
    f32, f64 = np.float32, np.float64
    for call, want in [
        (lambda: t.g32(0.1), [f32(0.1) * f32(3)]),
        (lambda: t.g32(3), [f32(9)]),
        (lambda: t.g32.vjp(0.1, 1.0), [f32(3)]),
        (lambda: t.g32.fwd_bwd(0.1, 1.0), [f32(0.1) * f32(3), f32(3)]),
        (lambda: t.g32.jvp(0.1, 1.0), [f32(0.1) * f32(3), f32(3)]),
        (lambda: t.g32.unfused(0.1), [f32(0.1) * f32(3)]),
        (lambda: t.g64(0.1, ones(1, dtype=f32)), [np.array([0.1], f64)]),
        (lambda: t.h16(1.0), [np.float16(2)]),
        (lambda: t.gen(0.1, ones(1, dtype=f32)), [np.array([f32(0.1)])]),
        (lambda: t.gen(0.1, 2.0), [f64(0.2)]),
    ]:
        got = call()
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == np.asarray(w).dtype, (g.dtype, w)
            np.testing.assert_array_equal(g, w)
    with pytest.raises(TypeError, match=r"'x' must be float32, got float64"):
        t.g32(np.float64(0.1))


@pytest.mark.parametrize("bad", [np.arange(3), np.ones(3, bool), np.array(["a", "b", "c"]),
                                 np.ones(3, complex)], ids=["int", "bool", "str", "complex"])
def test_generic_param_rejects_non_float_arrays(m, bad) -> None:
    with pytest.raises(TypeError, match="'x'"):
        m.f(bad, ones(3))
    with pytest.raises(TypeError, match="'x'"):
        m.f.unfused.vjp(bad, ones(3), ones(3))


def test_named_dims_must_agree(m) -> None:
    x = ones(2, 3, dtype=np.float32)
    with pytest.raises(ValueError, match=r"dim 'k' is 3 in argument 'x' but 4 in argument 'b'"):
        m.g(x, ones(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"'x' must have 2 dims"):
        m.g(ones(3, dtype=np.float32), ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match=r"'x' must have size 3 on axis 0"):
        m.h(ones(2, 3))
    with pytest.raises(ValueError, match=r"dim 'k'"):
        m.mm(ones(2, 3), ones(4, 2))


def test_rank_errors_count_dims(m) -> None:
    with pytest.raises(ValueError, match=r"argument 'b' must have 1 dim \['k'\], got shape \(2, 3\)"):
        m.g(ones(2, 3, dtype=np.float32), ones(2, 3, dtype=np.float32))
    with pytest.raises(ValueError, match=r"argument 'x' must have 2 dims \['n', 'k'\]"):
        m.g(ones(3, dtype=np.float32), ones(3, dtype=np.float32))


def test_non_broadcastable_shapes(m) -> None:
    with pytest.raises(ValueError, match=r"do not broadcast.*\(3,\).*\(4,\)"):
        m.f(ones(3), ones(4))
    with pytest.raises(ValueError, match="do not broadcast"):
        m.two.vjp(ones(2, 3), ones(2, 1, 4), ones(2, 3), ones(2, 3))


@pytest.mark.parametrize("shapes", [
    (), ((),), ((3,), ()), ((3,), (1,)), ((2, 1), (3,)), ((0,), (1,)), ((1, 0), (4, 1)),
    ((5, 1, 3), (4, 1), (1,)), ((2, 3), (2, 3)), ((1,), (1, 1, 1)),
])
def test_run_time_broadcasting_is_numpys(m, shapes) -> None:
    assert m._g_bshape("f", tuple(map(str, shapes)), *shapes) == np.broadcast_shapes(*shapes)


@pytest.mark.parametrize("shapes", [((3,), (4,)), ((0,), (2,)), ((2, 3), (3, 2)),
                                    ((2, 1), (1, 3), (3, 1))])
def test_run_time_broadcasting_errors_name_the_shapes(m, shapes) -> None:
    with pytest.raises(ValueError):
        np.broadcast_shapes(*shapes)
    with pytest.raises(ValueError, match=r"f: shapes do not broadcast together: 'x' \("):
        m._g_bshape("f", ("'x'", "'y'", "'z'")[:len(shapes)], *shapes)


@pytest.mark.parametrize("op, args, bad", [
    ("f", (ones(3), ones(3)), ones(4)),
    ("f", (ones(3), ones(3)), ones(1)),          # broadcastable is not enough
    ("f", (ones(3), ones(3)), ones(1, 3)),
    ("f", (ones(2, 1), ones(3)), ones(3)),
    ("g", (ones(2, 3, dtype=np.float32), ones(3, dtype=np.float32)), ones(3, 2)),
    ("mm", (ones(2, 3), ones(3, 4)), ones(1, 4)),
    ("mm", (ones(2, 3), ones(3, 4)), ones(4)),
], ids=["f-4", "f-1", "f-1x3", "f-bcast", "g-T", "mm-1x4", "mm-4"])
def test_upstream_of_wrong_shape(m, op, args, bad) -> None:
    o = getattr(m, op)
    for method in (o.vjp, o.fwd_bwd, o.unfused.vjp):
        with pytest.raises(ValueError, match="upstream"):
            method(*args, bad)


@pytest.mark.parametrize("bad", [ones(1), ones(3), ones(2, 1), ones(2, 3)],
                         ids=["1", "3", "2x1", "2x3"])
def test_upstream_of_wrong_shape_after_a_reduction(m, bad) -> None:
    x = ones(2, 3)                          # red(x) has shape (2,)
    with pytest.raises(ValueError, match="upstream"):
        m.red.vjp(x, bad)


def test_upstream_of_the_right_shape_after_a_reduction(m) -> None:
    x, g = np.arange(6.0).reshape(2, 3), np.array([1.0, -2.0])
    (dx,) = m.red.vjp(x, g)
    np.testing.assert_allclose(dx, 2 * x * g[:, None])


def test_upstream_must_be_numeric(m) -> None:
    with pytest.raises(TypeError, match="upstream"):
        m.f.vjp(ones(3), ones(3), np.array(["a", "b", "c"]))


# ---- out= -------------------------------------------------------------------------------

def test_out_wrong_shape(m) -> None:
    with pytest.raises(ValueError, match=r"out\[0\] must have shape \(3,\)"):
        m.f(ones(3), ones(3), out=np.empty(4))
    with pytest.raises(ValueError, match=r"out\[1\] must have shape"):
        m.f.vjp(ones(3), ones(3), ones(3), out=(np.empty(3), np.empty((3, 1))))


def test_out_wrong_dtype(m) -> None:
    with pytest.raises(TypeError):
        m.f(ones(3), ones(3), out=np.empty(3, np.int64))
    with pytest.raises(TypeError):
        m.f(ones(3), ones(3), out=[1.0, 2.0, 3.0])            # not an array


def test_out_non_contiguous_or_read_only(m) -> None:
    with pytest.raises(ValueError, match="C-contiguous"):
        m.f(ones(3), ones(3), out=np.empty(6)[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        m.f(ones(2, 3), ones(3), out=np.empty((3, 2)).T)
    ro = np.empty(3)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        m.f(ones(3), ones(3), out=ro)


def test_out_overlapping_an_input(m) -> None:
    # out= the very array of an input is allowed where safe (tests/codegen/test_hostile_arrays.py)
    x, y = np.arange(3.0), ones(3)
    big = np.zeros(6)
    with pytest.raises(ValueError, match=r"out\[0\] overlaps input 'x'"):
        m.f(big[:3], y, out=big[1:4])                        # a partial overlap
    g = np.zeros(4)
    with pytest.raises(ValueError, match="overlaps input 'dr'"):
        m.f.vjp(x, y, g[1:], out=(np.empty(3), g[:3]))      # the upstream is an input too
    o = np.empty(3)
    with pytest.raises(ValueError, match=r"out\[1\] overlaps out\[0\]"):
        m.two(x, y, out=(o, o))
    np.testing.assert_array_equal(x, np.arange(3.0))            # nothing was written


def test_overlap_test_of_out_buffers(m) -> None:
    """Two arrays that each own their memory are apart at once; anything else is
    NumPy's may_share_memory (views, the same array, two arrays over one buffer)."""
    a, b = np.zeros(8), np.zeros(8)
    assert a.flags.owndata and not m._g_may_overlap(a, b)
    assert m._g_may_overlap(a, a) and m._g_may_overlap(a, a[2:]) and m._g_may_overlap(a[:4], a)
    assert not m._g_may_overlap(a[:4], a[4:])
    buf = bytearray(64)
    u, v = np.frombuffer(buf, dtype=np.float64), np.frombuffer(buf, dtype=np.float64)
    assert not u.flags.owndata and m._g_may_overlap(u, v)
    assert m._g_same_array(u, v) and not m._g_same_array(a, b) and not m._g_same_array(a, a[1:])


def test_out_wrong_count(m) -> None:
    with pytest.raises(TypeError, match="tuple of 2 arrays"):
        m.two(ones(3), ones(3), out=(np.empty(3),))
    with pytest.raises(TypeError, match="tuple of 2 arrays"):
        m.two(ones(3), ones(3), out=np.empty(3))
    with pytest.raises(TypeError, match="tuple of 3 arrays"):
        m.f.fwd_bwd(ones(3), ones(3), ones(3), out=(np.empty(3), np.empty(3)))
    with pytest.raises(TypeError, match=r"an array or a tuple of 1 array, got a list of 3$"):
        m.f(ones(3), ones(3), out=[1.0, 2.0, 3.0])


LATE = """
op f(x, s) -> y {
    y = x * s
} grad(dy) -> (dx, ds) {
    dx = dy * s
    ds = sum(dy * x, axis=-1, keepdims=true)
}
op two(x, z) -> (y, mz) {
    y = exp(x)
    mz = max(z, axis=-1)
}
"""


def test_a_call_refused_by_a_later_step_has_written_no_out(import_module_text) -> None:
    """Errors found only by a step after a kernel (a custom gradient of the wrong
    shape, an empty max): out[k] is written at the end, so nothing was written."""
    m = import_module_text(gradc.compile_source(LATE, file="late.grad"), "gradc_test_late_gen")
    outs = (np.full((3, 5), 7.0), np.full((3, 5), 7.0), np.full(5, 7.0))
    with pytest.raises(ValueError, match="gradient 'ds'"):
        m.f.fwd_bwd(ones(3, 5), np.full(5, 2.0), ones(3, 5), out=outs)
    for method in (m.two, m.two.unfused):
        o = (np.full(3, 7.0), np.full(2, 7.0))
        with pytest.raises(ValueError, match="zero-size"):
            method(np.zeros(3), ones(2, 0), out=o)
        assert all((a == 7).all() for a in outs + o)
        got = method(np.zeros(3), np.arange(8.0).reshape(2, 4), out=o)
        assert got[0] is o[0] and (o[0] == 1).all() and (o[1] == [3, 7]).all()


def test_out_is_written_in_place_and_returned(m) -> None:
    x, y = np.arange(3.0), np.full(3, 2.0)
    o = np.full(3, np.nan)
    r = m.f(x, y, out=o)
    assert r is o
    np.testing.assert_allclose(o, x * y + 1)
    outs = (np.empty(3), np.empty(3))
    r = m.two(x, y, out=outs)
    assert r[0] is outs[0] and r[1] is outs[1]
    np.testing.assert_allclose(outs[0], x * y)
    np.testing.assert_allclose(outs[1], x + y)
    g = np.array([1.0, -1.0, 2.0])
    for method in (m.f.vjp, m.f.unfused.vjp):
        outs = (np.empty(3), np.empty(3))
        r = method(x, y, g, out=outs)
        assert r[0] is outs[0] and r[1] is outs[1]
        np.testing.assert_allclose(outs[0], g * y)
        np.testing.assert_allclose(outs[1], g * x)
    outs = (np.empty(3), np.empty(3), np.empty(3))
    r = m.f.fwd_bwd(x, y, g, out=outs)
    assert all(a is b for a, b in zip(r, outs))
    np.testing.assert_allclose(outs[0], x * y + 1)
    # a broadcast operand's gradient goes into an out of the operand's shape
    outs = (np.empty((2, 3)), np.empty(3))
    r = m.f.vjp(ones(2, 3), y, ones(2, 3), out=outs)
    assert r[1] is outs[1]
    np.testing.assert_allclose(outs[1], [2.0, 2.0, 2.0])


def test_out_float32_buffer_for_float32_inputs(m) -> None:
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    b = np.ones(3, np.float32)
    o = np.empty((2, 3), np.float32)
    r = m.g(x, b, out=o)
    assert r is o
    np.testing.assert_allclose(o, np.tanh(x + b), rtol=1e-6)


# ---- layouts and sizes ---------------------------------------------------------------

def test_non_contiguous_inputs(m) -> None:
    base = np.arange(24.0).reshape(4, 6) / 10
    xt = base.T                                  # (6, 4), Fortran order
    ys = np.linspace(-1, 1, 8)[::2]              # strided (4,)
    assert not xt.flags.c_contiguous and not ys.flags.c_contiguous
    for op in (m.f, m.f.unfused):
        np.testing.assert_allclose(op(xt, ys), xt * ys + 1)
        dx, dy = op.vjp(xt, ys, xt)
        np.testing.assert_allclose(dx, xt * ys)
        np.testing.assert_allclose(dy, (xt * xt).sum(axis=0))
    x32 = np.asfortranarray(np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3))
    b32 = np.arange(6, dtype=np.float32)[::2]
    np.testing.assert_allclose(m.g(x32, b32), np.tanh(x32 + b32), rtol=1e-6)
    w = np.arange(12.0).reshape(4, 3).T          # (3, 4) non-contiguous
    x = np.arange(6.0).reshape(3, 2).T           # (2, 3)
    np.testing.assert_allclose(m.mm(x, w), x @ w)
    dx, dw = m.mm.vjp(x, w, ones(2, 4))
    np.testing.assert_allclose(dx, ones(2, 4) @ w.T)
    np.testing.assert_allclose(dw, x.T @ ones(2, 4))


def test_negative_strides_and_broadcast_views(m) -> None:
    x = np.arange(5.0)[::-1]
    y = np.broadcast_to(np.array(2.0), (5,))      # read-only, zero strides
    np.testing.assert_allclose(m.f(x, y), x * 2 + 1)
    dx, dy = m.f.vjp(x, y, np.ones(5))
    np.testing.assert_allclose(dx, np.full(5, 2.0))
    np.testing.assert_allclose(dy, x)
    assert dy.flags.writeable and dy.flags.c_contiguous


def test_zero_dimensional_inputs(m) -> None:
    for op in (m.f, m.f.unfused):
        r = op(np.float64(2.0), np.array(3.0))
        assert isinstance(r, np.ndarray) and r.shape == () and float(r) == 7.0
        dx, dy = op.vjp(np.array(2.0), np.array(3.0), 1.0)
        assert dx.shape == dy.shape == ()
        assert float(dx) == 3.0 and float(dy) == 2.0
    r = m.f(2.0, 3.0)                             # Python scalars: float64 result
    assert r.shape == () and r.dtype == np.float64 and float(r) == 7.0


def test_empty_arrays(m) -> None:
    for op in (m.f, m.f.unfused):
        r = op(np.ones((0, 3)), np.ones(3))
        assert r.shape == (0, 3)
        dx, dy = op.vjp(np.ones((0, 3)), np.ones(3), np.ones((0, 3)))
        assert dx.shape == (0, 3) and dy.shape == (3,)
        np.testing.assert_array_equal(dy, np.zeros(3))
    r = m.red(np.ones((0, 3)))
    assert r.shape == (0,)
    (dx,) = m.red.vjp(np.ones((0, 3)), np.ones(0))
    assert dx.shape == (0, 3)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32])
def test_large_arrays_fused_and_unfused_agree(m, dtype) -> None:
    # above the size from which kernels run threaded (their serial twins below it);
    # float32 only: a parallel kernel's text does not depend on the dtype, and the
    # math library is checked in both dtypes (tests/codegen/test_mathlib.py) -- the
    # float64 case compiled its own parallel kernels for this test alone (~15 s)
    n = max(200_003, getattr(m, "_G_PARALLEL_MIN", 0) + 3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(dtype)
    g = rng.standard_normal(n).astype(dtype)
    y = m.chain(x)
    yu = m.chain.unfused(x)
    assert y.dtype == yu.dtype == dtype and y.shape == x.shape
    xd = x.astype(np.float64)
    want = np.sin(xd) * np.exp(-xd * xd) + np.log1p(xd * xd)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(y, want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(yu, y, rtol=rtol, atol=rtol)
    (dx,) = m.chain.vjp(x, g)
    (dxu,) = m.chain.unfused.vjp(x, g)
    y2, dx2 = m.chain.fwd_bwd(x, g)
    gd = g.astype(np.float64)
    dwant = gd * ((np.cos(xd) - 2 * xd * np.sin(xd)) * np.exp(-xd * xd) + 2 * xd / (1 + xd * xd))
    np.testing.assert_allclose(dx, dwant, rtol=rtol * 10, atol=rtol * 10)
    np.testing.assert_allclose(dxu, dx, rtol=rtol * 10, atol=rtol * 10)
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(dx2, dx)
    # a small slice (one thread) gives the same values as the threaded run
    np.testing.assert_allclose(m.chain(x[:1000]), y[:1000], rtol=rtol, atol=0)
    np.testing.assert_allclose(m.chain.vjp(x[:1000], g[:1000])[0], dx[:1000], rtol=rtol, atol=0)


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_bias_is_read_per_row_not_broadcast_first(m, rows) -> None:
    """A bias ``b: f32[k]`` added in a loop over ``(n, k)`` goes to the kernel as it is
    (no (n, k) copy); the loop reads it at the column index, threaded or not, and its
    gradient is summed over the rows."""
    assert "_g_flat(b, _s[-1:])" in inspect.getsource(m)
    rng = np.random.default_rng(1)
    for k in (1, 3, 1000):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32)
        dy = rng.standard_normal((rows, k)).astype(np.float32)
        want = np.tanh(x + b)
        for variant in (m.g, m.g.unfused):
            np.testing.assert_allclose(variant(x, b), want, rtol=2e-6, atol=2e-6)
            np.testing.assert_allclose(variant(x, b[::-1].copy()[::-1]), want, rtol=2e-6, atol=2e-6)
            r, dx, db = variant.fwd_bwd(x, b, dy)
            np.testing.assert_allclose(dx, dy * (1 - want ** 2), rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(db, (dy * (1 - want ** 2)).sum(axis=0), rtol=1e-4, atol=1e-4)


def test_loops_after_a_matmul_run_on_one_thread() -> None:
    """BLAS's worker threads spin a while after a matmul; the loops printed after one
    call their serial twin directly, the loops before it may thread."""
    text = gradc.compile_source("op d(x: f32[n, k], w: f32[k, m]) -> y {\n"
                                "    y = tanh(2 * x) @ w + 1\n}\n")
    body = text[text.index("class d:"):text.index("    def vjp(", text.index("class d:"))]
    before, after = body.split("np.matmul(", 1)
    assert "(_gk_d_forward_0 if _v" in before and " else _gk_d_forward_0_serial)(" in before
    assert " >= _G_PARALLEL_MIN " not in after and "_gk_d_forward_2_serial(_v" in after


def test_float16_inputs_compute_in_float32_and_return_float16(m) -> None:
    x = np.array([0.5, -1.0], np.float16)
    r = m.f(x, x)
    assert r.dtype == np.float16
    np.testing.assert_allclose(r.astype(np.float64), [1.25, 2.0])


@pytest.mark.parametrize("out_dtype", [np.float16, np.float32, np.float64])
def test_float16_results_into_wider_out_are_rounded_first(m, out_dtype) -> None:
    """As NumPy's ``np.add(a, b, out=f64)`` for float16 a, b: the float16 result,
    then cast; not the float32 values it was computed in."""
    rng = np.random.default_rng(4)
    x, y = (rng.standard_normal(64).astype(np.float16) for _ in range(2))
    want = m.chain(x)
    out = np.zeros(64, out_dtype)
    assert m.chain(x, out=out) is out
    np.testing.assert_array_equal(out, want.astype(out_dtype))
    want = m.two(x, y)
    outs = (np.zeros(64, out_dtype), np.zeros(64, out_dtype))
    m.two(x, y, out=outs)
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o, w.astype(out_dtype))


def test_mixed_float_dtypes_promote(m) -> None:
    r = m.f(np.ones(3, np.float32), np.ones(3))
    assert r.dtype == np.float64


# ---- forward mode ------------------------------------------------------------------------

def test_jvp_takes_one_tangent_per_differentiable_parameter(m) -> None:
    """f.jvp(x, y, x_t, y_t): the output, then its tangent x_t y + x y_t; keyword
    parameters stay keywords and a nograd one takes no tangent (tests/autodiff/
    test_forward.py has the rest)."""
    x, y = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 2.0])
    xt, yt = np.array([0.5, 1.0, -1.0]), np.array([2.0, 0.0, 1.0])
    for impl in (m.f, m.f.unfused):
        r, rt = impl.jvp(x, y, xt, yt)
        np.testing.assert_array_equal(r, x * y + 1)
        np.testing.assert_array_equal(rt, xt * y + x * yt)
    with pytest.raises(TypeError, match=r"f\.jvp\(\) missing 1 required positional"):
        m.f.jvp(x, y, xt)
    r, rt = m.lr.jvp(np.array([-2.0, 3.0]), np.array([1.0, 1.0]), alpha=0.5)
    np.testing.assert_array_equal(rt, [0.5, 1.0])
    with pytest.raises(TypeError, match=r"lr\.jvp\(\) takes 2 positional"):
        m.lr.jvp(np.ones(2), np.ones(2), np.ones(2))


def test_cuda_needs_the_cuda_target(m) -> None:
    """A module compiled for the CPU (the default) has no CUDA methods and never
    imports numba.cuda; .cuda says how to get them."""
    with pytest.raises(NotImplementedError, match=r"f\.cuda: this module was compiled for "
                                                  r"the CPU only; recompile with --target cuda"):
        m.f.cuda.vjp(ones(3), ones(3), ones(3))
    with pytest.raises(NotImplementedError, match="--target cuda or all"):
        getattr(m.two, "cuda")
    assert "numba.cuda" not in "".join(
        l for l in open(m.__file__, encoding="utf-8") if l.startswith(("import", "from")))


def test_repr_spec_and_signature(m) -> None:
    assert m.lr.signature == "(x, alpha: nograd = 0.01) -> y"
    assert m.lr.spec.startswith("op lr(x, alpha: nograd = 0.01) -> y {")
    assert repr(m.g).startswith("<gradc op g(")
    assert m.OPS["lr"] is m.lr


def test_two_outputs_are_never_one_array(import_module_text) -> None:
    """``b = a``: two results, two arrays (writing one must not change the other)."""
    m = import_module_text(gradc.compile_source(
        "op twin(x) -> (a, b) {\n    a = x * 2\n    b = a\n}\n", file="twin.grad"), "gradc_twin")
    for a, b in (m.twin(ones(3)), m.twin.unfused(ones(3)), m.twin.fwd_bwd(ones(3), ones(3),
                                                                          ones(3))[:2]):
        assert not np.shares_memory(a, b)
        a[0] = 7.0
        assert b[0] == 2.0


def test_a_keyword_parameter_may_be_named_self(import_module_text) -> None:
    m = import_module_text(gradc.compile_source(
        "op g(x, self: nograd = 2.0) -> y {\n    y = x * self\n}\n", file="self.grad"),
        "gradc_self_kw")
    np.testing.assert_array_equal(m.g(ones(2), self=3.0), [3.0, 3.0])
    np.testing.assert_array_equal(m.g.vjp(ones(2), ones(2), self=3.0)[0], [3.0, 3.0])


def test_defaults_are_keyword_only_wherever_declared(import_module_text) -> None:
    """docs/language.md: parameters without a default are positional-only in declared
    order, those with one keyword-only, also when declared first."""
    import inspect
    m = import_module_text(gradc.compile_source(
        "op g(a: nograd = 0.5, x, out) -> y {\n    y = a * x + out\n}\n", file="order.grad"),
        "gradc_default_first")
    np.testing.assert_array_equal(m.g(ones(2), ones(2), a=2.0), [3.0, 3.0])
    assert str(inspect.signature(m.OPS["g"]._methods["vjp"])) == \
        "(x, out_, dy, /, *, a=0.5, out=None)"
    # the op's own methods show the same (help(), IDEs), unfused ones too
    assert str(inspect.signature(m.g.vjp)) == "(x, out_, dy, /, *, a=0.5, out=None)"
    assert str(inspect.signature(m.g.unfused.jvp)) == \
        "(x, out_, x_t, out_t, /, *, a=0.5, out=None)"
    assert str(inspect.signature(m.g)) == "(x, out_, /, *, a=0.5, out=None)"
    assert m.g.fwd_bwd.__qualname__ == "g.fwd_bwd" and "g.vjp" in repr(m.g.vjp)
    with pytest.raises(TypeError, match="positional-only"):
        m.g(x=ones(2), out=ones(2))


def test_integer_and_bool_defaults_take_their_dtype(import_module_text) -> None:
    """``n: i32 = 3.0`` and ``b: bool = 1`` are the int 3 and True in the module (a
    float or int there would fail the module's own dtype check at every call)."""
    import inspect
    m = import_module_text(gradc.compile_source(
        "op f(x, n: i32 = 3.0, b: bool = 1) -> y {\n    y = where(b, x * n, 0)\n}\n",
        file="intdefaults.grad"), "gradc_int_defaults")
    assert str(inspect.signature(m.OPS["f"]._methods["forward"])) == \
        "(x, /, *, n=3, b=True, out=None)"
    np.testing.assert_array_equal(m.f(ones(2)), [3.0, 3.0])
    np.testing.assert_array_equal(m.f(ones(2), b=False), [0.0, 0.0])


def test_a_default_named_stream_is_an_error() -> None:
    with pytest.raises(gradc.GradcError, match="cannot be named 'stream'") as info:
        gradc.compile_source("op g(x, stream: nograd = 2.0) -> y {\n    y = x * stream\n}\n",
                             file="stream.grad")
    assert info.value.code == "E207"


@pytest.mark.parametrize("text, want", [(None, 131072), ("", 131072), ("4096", 4096),
                                        ("1e5", 100000), (" 0 ", 0), ("abc", None),
                                        ("-5", None), ("1.5", None), ("inf", None),
                                        ("nan", None), ("1e400", None)])
def test_parallel_threshold_from_the_environment(text, want) -> None:
    from gradc.codegen.runtime_src import _g_env_count
    if want is not None:
        assert _g_env_count("GRADC_PARALLEL_MIN", text, 1 << 17) == want
    else:
        with pytest.raises(ValueError, match=r"GRADC_PARALLEL_MIN=.*non-negative whole number"):
            _g_env_count("GRADC_PARALLEL_MIN", text, 1 << 17)


def test_a_bad_parallel_threshold_is_a_clear_error_at_import(import_module_text,
                                                            monkeypatch) -> None:
    text = gradc.compile_source("op r(x) -> y { y = sum(x * 2) }", file="r.grad")
    monkeypatch.setenv("GRADC_PARALLEL_MIN", "abc")
    with pytest.raises(ValueError, match=r"GRADC_PARALLEL_MIN='abc'"):
        import_module_text(text, "gradc_test_bad_parallel_min")
    monkeypatch.setenv("GRADC_PARALLEL_MIN", "1e3")
    assert import_module_text(text, "gradc_test_parallel_min_1e3")._G_PARALLEL_MIN == 1000
