"""The wrappers' fast paths (issue 4: a call on a 1-element array costs a few
microseconds).

A call whose arguments are exact C-contiguous ndarrays of one native float32 or
float64 dtype (Python floats for scalars) skips the full argument checks, and a
result a kernel wrote into a fresh buffer is returned without the aliasing
checks.  Such calls must behave exactly as the full checks would: every call
below is made twice, once with its arguments as they are and once with each
array an ndarray subclass view (same data, never a fast path), and both must
give the same results, dtypes and errors.  ``bench_dispatch.py`` measures the
time.
"""
from __future__ import annotations

import itertools

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
op ident(x) -> y {
    y = x
}
op scale(x, n: i64) -> y {
    y = x * n
}
op tr(x: f32[n, k]) -> y {
    y = x.T
}
op lr(x, alpha: nograd = 0.01) -> y {
    y = where(x > 0, x, alpha * x)
}
op two(x, y) -> (a, b) {
    a = x * y
    b = sum(x * y)
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="fast.grad"),
                              "gradc_test_fast_paths_gen")


class Sub(np.ndarray):
    """An ndarray subclass: never on a fast path, the same data for the checks."""


def slow(v):
    return v.view(Sub) if isinstance(v, np.ndarray) else v


RNG = np.random.default_rng(4)


def arr(shape, dtype=np.float64):
    return np.array(RNG.standard_normal(shape) + 0.5, dtype)     # 0-d: an array


# Arguments for a parameter of any shape: the fast path's cases, and its neighbours.
ANY = {
    "f32": arr(3, np.float32), "f64": arr(3), "f32-1": arr(1, np.float32),
    "f64-1": arr(1), "f32-0d": arr((), np.float32), "f64-0d": arr(()),
    "f32-2x3": arr((2, 3), np.float32), "f16": arr(3, np.float16),
    "f32-big-endian": arr(3, ">f4"), "f64-strided": arr(6)[::2],
    "f32-F": np.asfortranarray(arr((3, 2), np.float32)), "f32-empty": arr(0, np.float32),
    "i64": np.arange(3), "bool": np.array([True, False, True]),
    "float": 1.5, "int": 2, "np.float32": np.float32(0.5), "np.float64": np.float64(0.5),
    "list": [1.0, 2.0, 3.0],
    "True": True, "None": None,
}
SMALL = {k: ANY[k] for k in ("f32", "f64", "f32-1", "f64-0d", "f32-2x3", "f16",
                             "f64-strided", "float", "int", "i64")}


def outcome(fn, args, kwargs):
    """What a call did: its results (dtype, shape, bytes) or its error (type, text);
    results must be fresh C-contiguous writeable arrays, inputs left unchanged."""
    arrays = [a for a in (*args, *kwargs.values()) if isinstance(a, np.ndarray)]
    before = [a.tobytes() for a in arrays]
    try:
        r = fn(*args, **kwargs)
    except (TypeError, ValueError, OverflowError) as exc:
        return ("error", type(exc), str(exc))
    assert [a.tobytes() for a in arrays] == before
    results = r if isinstance(r, tuple) else (r,)
    for a in results:
        assert type(a) is np.ndarray and a.flags.c_contiguous and a.flags.writeable
        assert not any(np.shares_memory(a, b) for b in arrays)
    return ("ok", tuple((a.dtype, a.shape, a.tobytes()) for a in results))


def upstreams(result):
    """Cotangent candidates for the outputs of a forward call that gave ``result``."""
    outs = result if isinstance(result, tuple) else (result,)
    per = [[np.ones_like(o), o.astype(np.float64 if o.dtype == np.float32 else np.float32),
            o.astype(o.dtype.newbyteorder()), np.stack([o, o], -1)[..., 0],
            np.ones((*o.shape, 2), o.dtype), 0.5] for o in outs]
    return list(itertools.product(*per))


def check_same(op, args, kwargs=None):
    """Forward, vjp and fwd_bwd, fused and unfused, with ``args`` and with ``slow``
    views of them: the same outcome."""
    kwargs = kwargs or {}
    slow_kw = {k: slow(v) for k, v in kwargs.items()}
    calls = 0
    for o in (op, op.unfused):
        fast = outcome(o, args, kwargs)
        assert fast == outcome(o, [slow(a) for a in args], slow_kw), (args, kwargs)
        calls += 1
        if fast[0] != "ok":
            continue
        for ups in upstreams(o(*args, **kwargs)):
            for method in (o.vjp, o.fwd_bwd):
                full = [*args, *ups]
                assert outcome(method, full, kwargs) == \
                    outcome(method, [slow(a) for a in full], slow_kw), (method, full, kwargs)
                calls += 1
    return calls


@pytest.mark.parametrize("op", ["f", "two"])
def test_two_generic_parameters(m, op) -> None:
    for (_, x), (_, y) in itertools.product(SMALL.items(), repeat=2):
        check_same(getattr(m, op), [x, y])


@pytest.mark.parametrize("name", sorted(ANY))
def test_one_generic_parameter(m, name) -> None:
    for op in (m.ident, m.lr):
        check_same(op, [ANY[name]])
    check_same(m.f, [ANY[name], ANY["f32-1"]])


@pytest.mark.parametrize("alpha", [0.2, -1, np.float32(0.2), np.array(0.2),
                                   np.array(0.2, np.float32), np.ones(1), None])
def test_weak_and_strong_scalar_keywords(m, alpha) -> None:
    for x in (ANY["f32"], ANY["f64-0d"], ANY["f32-2x3"], 1.5):
        check_same(m.lr, [x], {"alpha": alpha})


def test_annotated_shapes_and_dtypes(m) -> None:
    xs = [arr((2, 3), np.float32), arr((2, 3)), arr((2, 4), np.float32), arr(3, np.float32),
          np.asfortranarray(arr((2, 3), np.float32)), arr((0, 3), np.float32), 1.5,
          arr((1, 3), np.float32)]              # its transpose is a C-contiguous view
    bs = [arr(3, np.float32), arr(4, np.float32), arr(3), arr((), np.float32), 0.5]
    for x, b in itertools.product(xs, bs):
        check_same(m.g, [x, b])
    for x in [arr((3, 2)), arr((3, 2), np.float32), arr((2, 2)), arr((3, 4))[:, ::2], arr(3)]:
        check_same(m.h, [x])
    for x in xs:
        check_same(m.tr, [x])


def test_integer_parameter(m) -> None:
    for x, n in itertools.product([arr(3, np.float32), arr((), np.float64), 1.5],
                                  [np.arange(3), np.arange(3, dtype=np.int32), 3, 2 ** 70,
                                   np.ones(3), 0.5, True]):
        check_same(m.scale, [x, n])


@pytest.mark.parametrize("name", sorted(ANY))
def test_inputs_are_c_contiguous_arrays_of_the_compute_dtype(m, name) -> None:
    """What ``_g_inputs`` promises the wrapper, fast path or not."""
    for values in ([ANY[name]], [ANY[name], ANY["f32"]], [ANY["f32-1"], ANY[name]]):
        sig = m._SIG_f if len(values) == 2 else m._SIG_ident
        try:
            arrays, t, rt, _ = m._g_inputs("f.forward", sig, tuple(values))
        except (TypeError, ValueError):
            continue
        assert t in (np.float32, np.float64) and rt.kind == "f"
        for a, v in zip(arrays, values):
            assert type(a) is np.ndarray and a.dtype == t and a.flags.c_contiguous
            np.testing.assert_array_equal(a, np.asarray(v, dtype=t))


def test_out_buffers(m) -> None:
    """``out=`` calls (never the argument fast path) give what calls without it give."""
    x, y = arr(3, np.float32), arr(3, np.float32)
    for o in (m.f, m.f.unfused):
        want = o(x, y)
        for out in (np.empty(3, np.float32), np.empty(3), (np.empty(3, np.float32),)):
            r = o(x, y, out=out)
            assert r is (out if isinstance(out, np.ndarray) else out[0])
            np.testing.assert_array_equal(r, want.astype(r.dtype))
        outs = (np.empty(3, np.float32), np.empty(3, np.float32), np.empty(3, np.float32))
        r = o.fwd_bwd(x, y, np.ones(3, np.float32), out=outs)
        assert all(a is b for a, b in zip(r, outs))
        for got, ref in zip(r, o.fwd_bwd(x, y, np.ones(3, np.float32))):
            np.testing.assert_array_equal(got, ref)
    outs = (np.empty(3, np.float32), np.empty((), np.float32))
    r = m.two(x, y, out=outs)
    assert r[0] is outs[0] and r[1] is outs[1]
    np.testing.assert_allclose(outs[1], np.sum(x * y), rtol=1e-6)


class NumPyCalls:
    """The module's ``np``, recording which of its functions a call uses."""

    def __init__(self):
        self.used = set()

    def __getattr__(self, name):
        self.used.add(name)
        return getattr(np, name)


# What the full checks call: argument conversion, promotion, broadcasting, overlap tests.
SLOW_FUNCTIONS = {"result_type", "may_share_memory", "broadcast_to", "broadcast_shapes",
                  "can_cast", "copyto", "ascontiguousarray", "array", "_g_float_input"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (), (2, 3)])
def test_plain_calls_take_the_fast_path(m, monkeypatch, dtype, shape) -> None:
    """A plain call (and only it) skips the full checks: none of the functions
    they call runs."""
    x, y, dy = arr(shape, dtype), arr(shape, dtype), arr(shape, dtype)
    calls = [lambda: m.f(x, y), lambda: m.f.vjp(x, y, dy), lambda: m.f.fwd_bwd(x, y, dy),
             lambda: m.f.unfused.fwd_bwd(x, y, dy), lambda: m.lr(x, alpha=0.5),
             lambda: m.lr.vjp(x, dy)]
    for call in calls:
        call()                                  # compiled before np is swapped

    def spy():
        used = NumPyCalls()
        full_check = m._g_float_input
        monkeypatch.setattr(m, "np", used)
        monkeypatch.setattr(m, "_g_float_input", lambda *a: used.used.add(
            "_g_float_input") or full_check(*a))
        return used.used

    used = spy()
    for call in calls:
        call()
    assert not used & SLOW_FUNCTIONS, used
    used = spy()
    m.f(slow(x), y)                             # an ndarray subclass: the full checks
    assert {"_g_float_input", "result_type"} <= used


def test_numpy_errors_name_the_op_and_method(import_module_text) -> None:
    m = import_module_text(gradc.compile_source("op f(x) -> y { y = sum(x, axis=1) }",
                                                file="axis.grad"), "gradc_test_fast_axis")
    for call, label in [(lambda: m.f(np.ones(3)), "f.forward"),
                        (lambda: m.f.vjp(np.ones(3), 1.0), "f.vjp"),
                        (lambda: m.f.unfused.fwd_bwd(np.ones(3), 1.0), "f.unfused.fwd_bwd")]:
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value).startswith(f"{label}: axis 1 is out of bounds")
        assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ValueError) as info:     # the wrappers' own: named once, as raised
        m.f(np.ones((2, 3)), out=np.ones(5))
    assert str(info.value).startswith("f.forward: out[0] must have shape")
    assert info.value.__cause__ is None
