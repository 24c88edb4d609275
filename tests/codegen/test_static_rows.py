"""Rows of a length the CPU reduce kernels also run compiled in
(``gradc.passes.loop_ir.STATIC_ROWS``): the wrapper calls ``<kernel>_n64`` (parallel)
or ``<kernel>_n64_chunks`` (serial) on rows of 64 elements, the kernel's body with the
literal 64 for the row length.  The tests check which calls run them and that they
compute what the kernel for any length computes (those swapped in for them), at random
and special rows."""
from __future__ import annotations

import numpy as np
import pytest

from gradc.passes.loop_ir import STATIC_ROWS
from row_sources import split_rows_module


@pytest.fixture(scope="module")
def m(import_module_text):
    return split_rows_module(import_module_text)     # test_split_rows's module


def _rows(shape, case, rng):
    x = rng.standard_normal(shape) * 3
    if case == "special":
        x[0, 5] = np.nan
        x[1, :] = -np.inf
        x[-1, 7] = np.inf
        x[-2, ::4] = 0.0
    return x


def _call(m, op, method, x, rng):
    n, t = x.shape[-1], x.dtype.type
    args = {"lnorm": [x, rng.standard_normal(n) + 1, rng.standard_normal(n)],
            "rms": [x, rng.standard_normal(n) + 1],
            "xent": [x, rng.dirichlet(np.ones(n), size=x.shape[0])]}.get(op, [x])
    args = [np.asarray(a, t) for a in args]
    f = getattr(m, op)
    if method == "forward":
        got = f(*args)
    else:
        ys = f(*args)
        dys = [rng.standard_normal(np.shape(y)).astype(t)
               for y in (ys if isinstance(ys, tuple) else (ys,))]
        got = getattr(f, method)(*args, *dys)
    return got if isinstance(got, tuple) else (got,)


def _generic(m, monkeypatch, k):
    """Every static entry for rows of ``k`` replaced by the kernel for any length (the
    same parameters)."""
    for name in [n for n in dir(m) if n.startswith("_grk") and f"_n{k}" in n]:
        monkeypatch.setattr(m, name, getattr(m, name.replace(f"_n{k}", "")))


# softmax, layer norm (sums across rows), a logsumexp, max, min, norm and a max across
# rows, a row product
CASES = [("smax", "fwd_bwd"), ("lnorm", "fwd_bwd"), ("xent", "fwd_bwd"), ("ext", "forward"),
         ("prodrow", "fwd_bwd")]


@pytest.mark.parametrize("op, method, parallel",
                         [(op, method, False) for op, method in CASES]
                         + [("smax", "fwd_bwd", True), ("lnorm", "fwd_bwd", True)])
def test_static_entries_agree_with_the_kernel_for_any_length(m, monkeypatch, kernel_calls,
                                                             op, method, parallel):
    """Float64 rows of 64: the static entries run (the parallel or the serial one) and
    give what the kernels for any length give, to the order of the sums, NaN and
    infinities in the same places; rows of 63 and 65 run no static entry."""
    monkeypatch.setattr(m, "_G_PARALLEL_MIN", 0 if parallel else 1 << 62)
    calls = kernel_calls(m, "_n64" if parallel else "_n64_chunks")
    for case in ["random", "special"]:
        x = _rows((9, 64), case, np.random.default_rng(1))
        with np.errstate(all="ignore"):
            static = _call(m, op, method, x, np.random.default_rng(2))
        assert calls, case
        with monkeypatch.context() as mp:
            _generic(m, mp, 64)
            with np.errstate(all="ignore"):
                generic = _call(m, op, method, x, np.random.default_rng(2))
        for a, b in zip(static, generic):
            a, b = np.asarray(a), np.asarray(b)
            assert a.dtype == b.dtype == np.float64
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=case)
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15, err_msg=case)
    calls.clear()
    for n in (63, 65):
        _call(m, op, method, _rows((9, n), "random", np.random.default_rng(3)),
              np.random.default_rng(4))
    assert not calls


def test_float32_rows_of_every_static_length(m, monkeypatch, kernel_calls):
    """Softmax's fwd_bwd in float32 at every static length: the static entry runs and
    agrees with the kernel for any length and with float64."""
    for k in STATIC_ROWS:
        calls = kernel_calls(m, f"_n{k}_chunks")
        x = _rows((5, k), "random", np.random.default_rng(k)).astype(np.float32)
        got = _call(m, "smax", "fwd_bwd", x, np.random.default_rng(6))
        want = _call(m, "smax", "fwd_bwd", x.astype(np.float64), np.random.default_rng(6))
        with monkeypatch.context() as mp:
            _generic(m, mp, k)
            generic = _call(m, "smax", "fwd_bwd", x, np.random.default_rng(6))
        for g, o, w in zip(got, generic, want):
            assert np.asarray(g).dtype == np.float32
            np.testing.assert_allclose(g, o, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        assert calls, k
