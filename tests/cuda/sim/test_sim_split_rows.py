"""Split rows on CUDA, in the simulator: a call of few long rows runs each pass of its
reduce kernel as a kernel of a block per segment of a row, the segments' accumulators
kept between the passes and combined by the next one (``gradc.codegen.cuda_reduce``,
the rule ``_GC_SPLIT`` of ``_gc_row_grid``; the simulator's makes rows of 16 elements
or more split, fewer than 4 of them).  Every kind of accumulator a segment leaves
(sums, two-pass maxima and shifted sums, NaN-keeping maxima and minima, norms, sums
and maxima across rows, a sum of all elements, row values' partials) against the IR
interpreter; special values in one segment against whole rows; stale ``out=``."""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from gradc.ir.interpret import interpret

from row_sources import KNOWN_MAX_OPS, SPLIT_OPS
from simulated import every_method, load

WHOLE = (0, 16, 4, 16)            # no call splits


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return load(SPLIT_OPS, tmp_path_factory.mktemp("split"), "sim_split_rows")


@pytest.fixture
def calls(ops, monkeypatch):
    """Calls of the module's split rows (the drivers the wrappers call)."""
    made = []
    for name in [n for n in dir(ops.module) if n.endswith("_split") and n.startswith("_gc")]:
        def counted(*args, _inner=getattr(ops.module, name), _name=name):
            made.append(_name)
            return _inner(*args)
        monkeypatch.setattr(ops.module, name, counted)
    return made


def _inputs(op, shape, dtype, rng):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    n = shape[-1]
    if op == "lnorm":
        return [x, rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)]
    if op == "rms":
        return [x, rng.standard_normal(n).astype(dtype)]
    if op in ("xent", "sdot"):
        t = rng.random(shape).astype(dtype)
        return [x, t / t.sum(axis=-1, keepdims=True)]
    return [x]


def _ups(ops, op, args, dtype, rng):
    """Cotangents like the op's results."""
    y = ops.OPS[op].cuda(*(cuda.to_device(a) for a in args))
    return [rng.standard_normal(v.shape).astype(dtype) for v in (y if isinstance(y, tuple) else (y,))]


# every op's fwd_bwd, and the methods whose kernels hold other accumulators
CASES = [(op, ("fwd_bwd",)) for op in ("smax", "lsmax", "lnorm", "rms", "xent", "sdot")] + [
    ("ext", ("forward",)), ("lnorm", ("forward", "jvp")), ("xent", ("vjp", "jvp")),
    ("smax", ("jvp",))]


@pytest.mark.parametrize("op, methods", CASES)
def test_split_rows_agree_with_the_interpreter(ops, calls, op, methods):
    """Float64, 3 rows of 20 (5 segments, a block a row for layer norm's dw and db too)
    and of 37 (6 segments; one block for every row where there are column partials:
    the simulator's _GC_COLS holds one row of 37); more segments than a block's 4
    threads, which stride over them to combine."""
    rng = np.random.default_rng(1)
    for shape in [(3, 20), (3, 37)]:
        args = _inputs(op, shape, np.float64, rng)
        before = len(calls)
        every_method(ops, op, args, _ups(ops, op, args, np.float64, rng), np.float64,
                     methods=methods, unfused=False)
        assert len(calls) > before, f"{op} at {shape} did not split"


def test_float32_split_rows(ops, calls):
    """Layer norm's fwd_bwd in float32 (a float64 accumulator per segment)."""
    rng = np.random.default_rng(2)
    args = _inputs("lnorm", (2, 40), np.float32, rng)
    every_method(ops, "lnorm", args, [rng.standard_normal((2, 40)).astype(np.float32)],
                 np.float32, methods=("fwd_bwd",), unfused=False)
    assert calls


# inf - inf in the simulator's threads, whose NumPy scalars warn (np.errstate is per thread)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_special_values_in_one_segment(ops, monkeypatch):
    """A NaN, an inf or a -inf in one segment of a row reaches the row's max, min, norm,
    logsumexp and softmax as with whole rows; a row of -inf and a row of zeros too."""
    x = np.random.default_rng(3).standard_normal((3, 40))
    x[0, 33] = np.nan
    x[1, 5] = np.inf
    x[2, :] = -np.inf
    y = np.zeros((3, 40))
    y[1, 3] = -np.inf
    dev = cuda.to_device(x)
    t = cuda.to_device(np.full_like(x, 1 / 40))
    results = {}
    for name, split in [("split", ops.module._GC_SPLIT), ("whole", WHOLE)]:
        monkeypatch.setattr(ops.module, "_GC_SPLIT", split)
        got = [*ops.ext.cuda(dev), ops.smax.cuda(dev), ops.lsmax.cuda(dev),
               ops.xent.cuda(dev, t), *ops.smax.cuda.fwd_bwd(dev, cuda.to_device(np.ones_like(x))),
               *ops.ext.cuda(cuda.to_device(y))]
        results[name] = [g.copy_to_host() for g in got]
    for a, b in zip(results["split"], results["whole"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15, equal_nan=True)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(results["split"][0], np.max(x, axis=-1))
        np.testing.assert_array_equal(results["split"][3], np.max(x, axis=0))


def test_column_max_into_stale_out(ops, calls):
    """The max across rows (a partial per column, each segment's block starting its
    columns) and the row values, into ``out=`` buffers holding other numbers."""
    x = np.random.default_rng(5).standard_normal((3, 37)) - 10
    outs = tuple(cuda.to_device(np.full(s, 7.0)) for s in [(3,), (3, 1), (3,), (37,)])
    got = ops.ext.cuda(cuda.to_device(x), out=outs)
    assert calls and all(g is o for g, o in zip(got, outs))
    np.testing.assert_array_equal(got[3].copy_to_host(), x.max(axis=0))
    np.testing.assert_array_equal(got[0].copy_to_host(), x.max(axis=-1))
    np.testing.assert_array_equal(got[1].copy_to_host(), x.min(axis=-1, keepdims=True))


def test_which_calls_split(ops, monkeypatch):
    """The GPU's rule (``_GC_SPLIT``): fewer than 256 rows of 16384 elements or more,
    segments of 8192 or more, about 1024 blocks a pass; a block per row, or, with
    column partials, as many rows at a time as 2^20 float64 partials hold.  More rows,
    shorter rows, no rows, rows of one element and kernels that keep whole rows do not
    split."""
    m = ops.module
    rule = (256, 1 << 14, 1 << 13, 1 << 10)
    monkeypatch.setattr(m, "_GC_COLS", 1 << 20)
    grid = lambda shape, cols=False, flat=False, split=rule: m._gc_row_grid(  # noqa: E731
        "f", shape, 1, None, cols, flat, split)
    assert grid((1, 1 << 14)) == (1, 1 << 14, 1, 1, 2)
    assert grid((1, 1 << 22)) == (1, 1 << 22, 1, 1, 512)
    assert grid((16, 262144)) == (16, 262144, 16, 1, 32)
    assert grid((16, 262144), cols=True) == (16, 262144, 4, 1, 32)
    assert grid((255, 1 << 14))[4] == 2
    for shape in [(256, 1 << 14), (1, (1 << 14) - 1), (0, 1 << 14), (3, 0)]:
        assert grid(shape)[4] == 0, shape
    assert grid((1, 1 << 14), flat=True)[4] == 0
    assert grid((1, 1 << 14), split=None)[4] == 0


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    return load(KNOWN_MAX_OPS, tmp_path_factory.mktemp("known"), "sim_known_max")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("op", ["lsmb", "jlsm", "lkd"])
def test_known_maxima_whole_and_split(known, monkeypatch, op):
    """A logsumexp of x less its max (the built-in log_softmax, JAX's form written out,
    lse(x - max(x))): its max is the row's less the shift (``loop_ir.Shift.known``), no
    pass and no tree of its own; every method against the interpreter in whole and
    split rows, and rows of -inf, +inf, NaN and around 1000 alike in both."""
    rng = np.random.default_rng(6)
    for split in (known.module._GC_SPLIT, WHOLE):
        monkeypatch.setattr(known.module, "_GC_SPLIT", split)
        for shape in [(3, 20), (2, 37)]:
            x = rng.standard_normal(shape) * 3
            y = known.OPS[op].cuda(cuda.to_device(x)).copy_to_host()
            every_method(known, op, [x], [rng.standard_normal(y.shape)], np.float64,
                         methods=("forward", "vjp", "fwd_bwd"), unfused=False)
    x = rng.standard_normal((5, 40))
    x[0] = -np.inf
    x[1, 7] = np.inf
    x[2, 30] = np.nan
    x[3, ::5] = -np.inf
    x[4] += 1000                    # exp(x - max) shifted by the max again is 0
    got = []
    for split in (known.module._GC_SPLIT, WHOLE):
        monkeypatch.setattr(known.module, "_GC_SPLIT", split)
        got.append(known.OPS[op].cuda(cuda.to_device(x)).copy_to_host())
    with np.errstate(all="ignore"):
        want = interpret(known.compiled[op].methods["forward"].graph, [x])[0]
    for g in got:
        np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-15)
