"""Short rows in groups (``gradc.passes.loop_ir.ROW_GROUP``): a CPU reduce kernel runs
each pass over the rows of a group in turn, keeping the row values a later pass reads
per row of the group (``_rv_<name>``).  Each row is computed by the same statements as
one row at a time, so a row's results do not depend on the group it falls in, and every
kept value keeps its own type (the arrays are allocated by dtype, checked here against
Numba's types of the values)."""
from __future__ import annotations

import re

import numba
import numpy as np
import pytest

import gradc
from gradc.passes.loop_ir import ROW_GROUP
from row_sources import SPLIT_OPS, split_rows_module

# ops of SPLIT_OPS whose results are row by row (a row's outputs from its own inputs)
ROW_LOCAL = ["smax", "lsmax", "rms", "prodrow", "lnorm"]


@pytest.fixture(scope="module")
def m(import_module_text):
    return split_rows_module(import_module_text)     # test_split_rows's module


def _args(op, x, rng):
    n, t = x.shape[-1], x.dtype.type
    extra = {"lnorm": [rng.standard_normal(n) + 1, rng.standard_normal(n)],
             "rms": [rng.standard_normal(n) + 1]}.get(op, [])
    return [x, *(np.asarray(a, t) for a in extra)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [64, 100])
@pytest.mark.parametrize("op", ROW_LOCAL)
def test_a_row_gets_the_same_bits_in_any_group(m, op, n, dtype) -> None:
    """Rows 1.. of 23 rows, and the same rows called alone (each in another place of its
    group, the last group shorter), give the same bits in every method; the grouped
    kernels agree with the unfused ones."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((23, n)) * 3).astype(dtype)
    x[5, 3], x[9, :] = np.nan, -np.inf
    args = _args(op, x, rng)
    f = getattr(m, op)
    dy = rng.standard_normal(x.shape).astype(dtype)
    with np.errstate(all="ignore"):
        for method, extra in (("forward", []), ("fwd_bwd", [dy])):
            call = f if method == "forward" else getattr(f, method)
            whole = call(*args, *extra)
            part = call(args[0][1:], *args[1:], *(e[1:] for e in extra))
            unfused = getattr(f.unfused, method) if method != "forward" else f.unfused
            ref = unfused(*args, *extra)
            whole, part, ref = ((r if isinstance(r, tuple) else (r,)) for r in (whole, part, ref))
            for a, b, r in zip(whole, part, ref):
                if np.ndim(a) == 2:             # the element outputs (not dw, db)
                    np.testing.assert_array_equal(a[1:], b)
                tol = 1e-3 if dtype == np.float32 else 1e-10     # a product of 100
                np.testing.assert_allclose(a, r, rtol=tol, atol=tol)


def test_kept_row_values_keep_their_types(m) -> None:
    """Every ``_rv_<name>`` of a grouped kernel holds values of ``<name>``'s own type
    (float32 and float64 row values, a shift's float64 sum): no value is rounded on its
    way to a later pass.  Each kernel called is typed again here (one loaded from Numba's
    cache keeps no types; one compiled in this process is read as it is)."""
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((16, 64)).astype(dtype)
        for op in ("smax", "rms", "xent"):
            args = [x, np.full_like(x, 1 / 64)] if op == "xent" else _args(op, x, rng)
            f = getattr(m, op)
            f(*args)
            f.fwd_bwd(*args, *([dtype(1.0)] if op == "xent" else [np.ones_like(x)]))
    checked = 0
    for name in dir(m):
        disp = getattr(m, name)
        code = getattr(getattr(disp, "py_func", None), "__code__", None)
        kept = [v.removeprefix("_rv_") for v in (code.co_varnames if code else ())
                if v.startswith("_rv_")]
        if not (name.endswith("_chunks") and kept and disp.overloads):
            continue
        again = None
        for sig in list(disp.overloads):
            annotation = disp.overloads[sig].type_annotation
            if not hasattr(annotation, "typemap"):     # None, or a str from the cache
                again = again or numba.njit(error_model="numpy")(disp.py_func)
                again.compile(sig)
                annotation = again.overloads[sig].type_annotation
            types = annotation.typemap
            for v in kept:
                held = types[f"_rv_{v}"].dtype
                own = {str(t) for k, t in types.items() if re.fullmatch(rf"{v}(\.\d+)?", k)}
                assert own == {str(held)}, (name, v, own, held)
                checked += 1
    assert checked > 0


def test_groups_are_of_the_rows_of_a_short_row() -> None:
    """Groups of ROW_GROUP[0] rows on rows of at most ROW_GROUP[1] bytes: the kernel's
    row loop says so, and a long row runs one row at a time."""
    text = gradc.compile_source(SPLIT_OPS, file="split.grad")
    k, size = ROW_GROUP
    assert f"_Q = {k} if _N * _w.itemsize <= {size} else 1" in text
    assert "for _rb in range(_r0, _r1, _Q):" in text
