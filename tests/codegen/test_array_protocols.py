"""NumPy's array protocols at the generated ops' boundary (docs/generated-module.md,
*NumPy protocols*): what ``np.asarray`` reads (``__array__`` with NumPy 2's ``copy=``
and without, ``__array_interface__``, the buffer protocol, sequences, subclasses) works
for every argument kind (inputs, upstreams, tangents) of every method, fused and
unfused, with NumPy's broadcasting; results are base-class ndarrays; a masked array is
refused (its mask would be ignored); an argument's ``__array_ufunc__`` and
``__array_function__`` are not consulted.
"""
from __future__ import annotations

import array

import numpy as np
import pytest

import gradc

pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")

SOURCE = """
op ew(x, y) -> r {
    r = x * y + sin(x)
}
op rows(x: f64[n, k], b: f64[k]) -> y {
    y = tanh(x + b)
}
op pick(x: f64[n, k], labels: i64[n], keep: bool[n]) -> y {
    y = where(keep, x[arange(n), labels], 0)
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="protocols.grad"),
                              "gradc_test_protocols_gen")


class Numpy2Like:
    """``__array__`` with NumPy 2's signature."""
    def __init__(self, a):
        self.a = np.asarray(a)

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)


class LegacyLike:
    """``__array__(dtype=None)`` only, as before NumPy 2."""
    def __init__(self, a):
        self.a = np.asarray(a)

    def __array__(self, dtype=None):
        return self.a


class InterfaceLike:
    """Only ``__array_interface__`` (the data stays owned by ``self.a``)."""
    def __init__(self, a):
        self.a = np.ascontiguousarray(a)
        self.__array_interface__ = self.a.__array_interface__


class UfuncOverride(Numpy2Like):
    """Defines ``__array_ufunc__`` and ``__array_function__``: the ops are not ufuncs
    and do not call them; the argument is read through ``__array__``."""
    calls = []

    def __array_ufunc__(self, *args, **kwargs):
        UfuncOverride.calls.append("ufunc")
        return NotImplemented

    def __array_function__(self, *args, **kwargs):
        UfuncOverride.calls.append("function")
        return NotImplemented


WRAPPERS = {
    "ndarray": lambda a: a,
    "__array__ (NumPy 2)": Numpy2Like,
    "__array__ (legacy)": LegacyLike,
    "__array_interface__": InterfaceLike,
    "buffer (memoryview)": lambda a: memoryview(np.ascontiguousarray(a)),
    "nested lists": lambda a: a.tolist(),
    "ndarray subclass (np.matrix)": lambda a: np.asmatrix(a),
    "__array_ufunc__ defined": UfuncOverride,
}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("kind", list(WRAPPERS))
def test_array_likes_for_every_argument_kind(m, kind, fused):
    wrap = WRAPPERS[kind]
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    dr, xt, yt = (rng.standard_normal((3, 4)) for _ in range(3))
    op = m.ew if fused else m.ew.unfused
    r = op(wrap(x), wrap(y))
    assert type(r) is np.ndarray and r.dtype == np.float64
    np.testing.assert_array_equal(r, op(x, y))
    for got, want in zip(op.vjp(wrap(x), wrap(y), wrap(dr)), op.vjp(x, y, dr)):
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, want)
    for got, want in zip(op.fwd_bwd(wrap(x), wrap(y), wrap(dr)), op.fwd_bwd(x, y, dr)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(op.jvp(wrap(x), wrap(y), wrap(xt), wrap(yt)), op.jvp(x, y, xt, yt)):
        np.testing.assert_array_equal(got, want)
    out = np.empty((3, 4))
    assert op(wrap(x), wrap(y), out=out) is out
    np.testing.assert_array_equal(out, r)
    assert UfuncOverride.calls == []


def test_buffers_and_broadcasting(m):
    """array.array buffers (float32 'f' and float64 'd') and NumPy broadcasting: the
    gradients are summed back to each argument's shape."""
    x = array.array("f", [0.5, -1.0, 2.0])              # shape (3,), float32
    y = Numpy2Like(np.arange(2, dtype=np.float32).reshape(2, 1))   # (2, 1)
    r = m.ew(x, y)
    xa, ya = np.asarray(x), np.asarray(y)
    assert r.shape == (2, 3) and r.dtype == np.float32
    np.testing.assert_allclose(r, xa * ya + np.sin(xa), rtol=1e-6)
    dx, dy = m.ew.vjp(x, y, np.ones((2, 3), np.float32))
    assert dx.shape == (3,) and dy.shape == (2, 1)
    np.testing.assert_allclose(dx, (ya + np.cos(xa)).sum(0), rtol=1e-6)
    np.testing.assert_allclose(dy, np.broadcast_to(xa, (2, 3)).sum(1, keepdims=True), rtol=1e-6)
    h = m.rows(InterfaceLike(np.ones((2, 3))), array.array("d", [0.0, 1.0, 2.0]))
    np.testing.assert_allclose(h, np.tanh(np.ones((2, 3)) + [0.0, 1.0, 2.0]))


@pytest.mark.parametrize("where", ["argument", "upstream", "tangent"])
def test_masked_arrays_are_refused(m, where):
    x = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    plain = np.ones(3)
    call = {"argument": lambda: m.ew(x, plain),
            "upstream": lambda: m.ew.vjp(plain, plain, x),
            "tangent": lambda: m.ew.jvp(plain, plain, x, plain)}[where]
    name = {"argument": "x", "upstream": "dr", "tangent": "x_t"}[where]
    with pytest.raises(TypeError, match=rf"ew\.\w+: {where} '{name}' is a masked array; the "
                                        r"kernels would ignore its mask \(pass "
                                        r"v\.filled\(fill_value\) or v\.data\)"):
        call()


@pytest.mark.parametrize("name", ["labels", "keep"])
def test_masked_integer_and_bool_arrays_are_refused(m, name):
    """Integer and bool arguments too: the labels' or the mask's mask would be ignored."""
    args = {"x": np.ones((3, 2)), "labels": np.array([0, 1, 0]), "keep": np.ones(3, bool)}
    args[name] = np.ma.masked_array(args[name], mask=[0, 1, 0])
    for call in (lambda: m.pick(*args.values()),
                 lambda: m.pick.vjp(*args.values(), np.ones(3))):
        with pytest.raises(TypeError, match=rf"pick\.\w+: argument '{name}' is a masked "
                                            r"array; the kernels would ignore its mask"):
            call()


def test_array_protocol_errors_name_the_argument(m):
    class Raises:
        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("no data")

    class Ints(Numpy2Like):
        pass

    with pytest.raises(TypeError, match=r"ew\.forward: argument 'y' is not an array \(no data\)"):
        m.ew(np.ones(2), Raises())
    with pytest.raises(TypeError, match=r"ew\.forward: argument 'x' must be a floating-point "
                                        r"array \(float16, float32 or float64\), got int64"):
        m.ew(Ints(np.arange(3)), np.ones(3))
    with pytest.raises(TypeError, match="rows.forward: argument 'x' must be float64, got float32"):
        m.rows(Numpy2Like(np.ones((2, 3), np.float32)), np.ones(3))




@pytest.mark.parametrize("method", ["vjp", "jvp"])
def test_out_overlap_is_checked_on_the_converted_upstream(m, method):
    """An upstream (or tangent) whose ``__array__`` gives other memory at a later
    call: the overlap check read the first answers, the kernels a later one, a view
    overlapping ``out=`` (wrong values).  Now the argument is converted once, before
    the check, and the kernels read what was checked; the overlapping view given as
    a plain argument is refused, as it was."""
    x, y = np.linspace(0.5, 1.5, 5), np.linspace(-1, 2, 5)
    plain = {"vjp": (x, y, np.ones(5)), "jvp": (x, y, np.ones(5), np.ones(5))}[method]
    want = getattr(m.ew, method)(*plain)
    for k in (2, 3) if method == "jvp" else (2,):
        memory = np.empty(6)
        out = (np.empty(5), memory[:5])     # vjp: (dx, dy); jvp: (r, r_t)
        shifted = memory[1:]                # overlaps out[1], not the same array

        class Shifty:
            calls = 0

            def __array__(self, dtype=None, copy=None):
                Shifty.calls += 1
                if Shifty.calls == 1:
                    return np.ones(5)
                shifted[:] = 1.0
                return shifted

        args = list(plain)
        args[k] = Shifty()
        got = getattr(m.ew, method)(*args, out=out)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert Shifty.calls == 1
        args[k] = shifted
        with pytest.raises(ValueError, match=r"out\[\d\] overlaps input '(dr|x_t|y_t)'$"):
            getattr(m.ew, method)(*args, out=out)
