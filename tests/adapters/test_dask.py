"""Generated ops on Dask arrays (docs/dask.md): every op of the examples, every
method, equal to the in-memory results; lazy until computed; one task per chunk;
the threaded scheduler and a two-process ``LocalCluster``."""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest

import gradc

ROOT = Path(__file__).resolve().parents[2]
SEED, ACT = ROOT / "examples" / "seed.grad", ROOT / "examples" / "activations.grad"
# Named dims of the examples' annotated parameters; generic parameters get GENERIC.
DIMS = {"b": 37, "i": 13, "h": 11, "o": 7, "d": 9, "n": 37, "k": 23}
GENERIC = (37, 23)
METHODS = ("forward", "vjp", "fwd_bwd", "jvp")


@pytest.fixture(scope="module")
def modules():
    return {"seed": gradc.load(SEED), "activations": gradc.load(ACT)}


def _refuse(*args, **kwargs):
    raise AssertionError("a Dask graph was computed while the op was called")


def _chunks(shape: tuple, k: int) -> tuple:
    """Odd chunk sizes that do not divide the dims (k varies them per argument)."""
    return tuple(max(1, d // (2 + k) + 1) for d in shape)


def _args(module, op, method: str, dtype, rng):
    """The in-memory arguments of ``op.method`` (upstreams and tangents shaped from
    a forward call): inputs of the op's signature, then cotangents or tangents."""
    sig = getattr(module, f"_SIG_{op.__name__}")
    params = re.sub(r"\[[^]]*\]", "", op.signature).split(") ->")[0].lstrip("(").split(", ")
    xs, diff = [], []
    for (name, dt, dims), text in zip(sig, params):
        if "=" in text:                 # keyword-only, with its default
            continue
        shape = GENERIC if dims is None else tuple(d if isinstance(d, int) else DIMS[d]
                                                   for d in dims)
        x = rng.standard_normal(shape).astype(dtype if dt is None else np.float32)
        if name == "onehot":
            x = np.eye(shape[1], dtype=x.dtype)[rng.integers(0, shape[1], shape[0])]
        elif name == "alpha":
            x = rng.uniform(0, 1, shape).astype(x.dtype)
        xs.append(x)
        diff.append("nograd" not in text)
    if method == "forward":
        return xs
    if method == "jvp":
        return xs + [rng.standard_normal(x.shape).astype(x.dtype) for x, d in zip(xs, diff) if d]
    outs = op(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return xs + [np.asarray(rng.standard_normal(o.shape), o.dtype) for o in outs]


def _call(op, method, args):
    return op(*args) if method == "forward" else getattr(op, method)(*args)


def _cases():
    out = []
    for mod, path in (("seed", SEED), ("activations", ACT)):
        names = re.findall(r"^op (\w+)", path.read_text(), re.M)
        for name in names:
            for method in METHODS:
                out.append((mod, name, method))
    return out


def _unavailable(op, method) -> bool:
    return method == "jvp" and op.__name__ in ("custom_linear", "clipped_relu")   # W405


@pytest.mark.parametrize("mod, name, method", _cases(), ids=lambda v: str(v))
def test_dask_results_equal_the_in_memory_results(modules, mod, name, method):
    """Float32, the examples' declared dtype (the Dask wrappers' code does not depend
    on the dtype: they cast to the compute dtype, whichever it is; float64 on Dask
    arrays: arrays.grad's ops in test_the_ops_of_arrays_grad, swish and leaky_relu in
    the tests below; float64 here too compiled the generic ops' kernels again), chunks
    that do not divide the shapes and differ between arguments; elementwise results bit
    for bit, those through reductions and matmul to the rounding of a different
    summation order."""
    module = modules[mod]
    op = module.OPS[name]
    if _unavailable(op, method):
        with pytest.raises(NotImplementedError, match="E405"):
            _call(op, method, [da.ones(3)])
        return
    rng = np.random.default_rng(0)
    args = _args(module, op, method, np.float32, rng)
    want = _call(op, method, args)
    lazy = [da.from_array(a, chunks=_chunks(a.shape, k)) for k, a in enumerate(args)]
    with dask.config.set(scheduler=_refuse):
        got = _call(op, method, lazy)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert all(isinstance(g, da.Array) for g in got)
    got = dask.compute(*got, scheduler="threads")
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(w).max()))
    if mod == "activations" and name != "add_bias":    # elementwise: the same kernel
        np.testing.assert_array_equal(got, want)


def test_one_task_per_chunk_and_nothing_computed_before_compute(modules):
    """fwd_bwd of an elementwise op is one fused-kernel task per chunk (its two
    results read from it), run only by compute()."""
    act = modules["activations"]
    x = da.random.default_rng(1).standard_normal((1000, 30), chunks=(101, 30))
    dy = da.ones_like(x)
    calls = []

    class Count(dask.callbacks.Callback):
        def _pretask(self, key, dsk, state):
            name = key[0] if isinstance(key, tuple) else key
            calls.append(name)

    with dask.config.set(scheduler=_refuse):
        y, dx = act.swish.fwd_bwd(x, dy)
    graph = dict(y.__dask_graph__())
    kernel_tasks = [k for k in graph if isinstance(k, tuple) and k[0].startswith("gradc-")]
    assert len(kernel_tasks) == x.npartitions == 10
    with Count():
        y, dx = dask.compute(y, dx, scheduler="threads")
    assert sum(n.startswith("gradc-") for n in calls) == 10
    want_y, want_dx = act.swish.fwd_bwd(x.compute(), np.ones(x.shape))
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(dx, want_dx)
    serial = [getattr(act, n) for n in dir(act) if n.startswith("_gk_swish") and n.endswith("_serial")]
    assert serial and all(k.targetoptions.get("nogil") for k in serial)   # threads run chunks at once


def test_mixed_numpy_and_dask_arguments_and_keywords(modules):
    act = modules["activations"]
    x = np.linspace(-3, 3, 101)
    dy = da.from_array(np.cos(x), chunks=17)          # only the cotangent is lazy
    (got,) = act.leaky_relu.vjp(x, dy, alpha=0.3)
    np.testing.assert_array_equal(got.compute(), act.leaky_relu.vjp(x, np.cos(x), alpha=0.3)[0])
    b = np.arange(5.0, dtype=np.float32)
    xd = da.ones((11, 5), dtype=np.float32, chunks=(4, 2))
    np.testing.assert_array_equal(act.add_bias(xd, b).compute(), act.add_bias(np.ones((11, 5),
                                  np.float32), b))


def test_errors_are_the_in_memory_errors_raised_at_the_call(modules):
    """Arguments are checked when the op is called (shapes and dtypes are known
    without computing), with the in-memory messages; out= is refused."""
    act, seed = modules["activations"], modules["seed"]
    x = da.ones((6, 4), dtype=np.float32, chunks=3)
    with pytest.raises(ValueError, match=r"add_bias.forward: dim 'k' is 4 in argument 'x' "
                                         r"but 3 in argument 'b'"):
        act.add_bias(x, da.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="mlp.forward: argument 'x' must be float32"):
        seed.mlp(x.astype(np.float64), *(np.ones(s, np.float32) for s in
                                         ((4, 3), (3,), (3, 2), (2,))))
    with pytest.raises(ValueError, match=r"swish.vjp: upstream 'dy' must have the output's "
                                         r"shape \(6, 4\), got \(6, 3\)"):
        act.swish.vjp(x, da.ones((6, 3), chunks=2))
    with pytest.raises(TypeError, match="swish.forward: argument 'x' must be a floating-point"):
        act.swish(da.ones(3, dtype=np.int64))
    with pytest.raises(TypeError, match="swish.forward: out= is not supported with Dask"):
        act.swish(x, out=np.empty((6, 4), np.float32))
    with pytest.raises(TypeError, match="swish.forward: Dask arrays are not supported here"):
        act.swish.unfused(x)
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        act.swish(x[x > 0])


def test_an_object_with_a_dask_graph_that_is_not_a_dask_array(modules):
    """Was AttributeError ('Fake' object has no attribute 'shape')."""
    class Fake:
        __dask_graph__ = None

        def __array__(self, dtype=None, copy=None):
            return np.ones(3)

    act = modules["activations"]
    for call in (lambda: act.swish(Fake()), lambda: act.swish.vjp(np.ones(3), Fake()),
                 lambda: act.swish.jvp(np.ones(3), Fake())):
        with pytest.raises(TypeError, match=r"swish\.\w+: an argument of type Fake has "
                                            r"__dask_graph__ but is not a Dask array"):
            call()


CUBE = "op cube(x) -> y {\n    y = x^3\n}\n"


def _import_file(path: Path):
    """Import a generated module from ``path`` under its stem, as ``gradc.load`` does
    (registered in ``sys.modules``, so that tasks pickle its functions by name)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def test_two_worker_processes_of_a_local_cluster(modules, tmp_path):
    """Both ways docs/dask.md ships a module: a directory the workers share (the
    gradc cache) put on their ``sys.path``, where they also find Numba's cache of
    the kernels; and ``client.upload_file`` of a module file, for workers that share
    no file system.  The workers import the modules by name, never gradc."""
    import dask
    from dask.distributed import Client, LocalCluster

    act, seed = modules["activations"], modules["seed"]
    (tmp_path / "gradc_dask_cube.py").write_text(gradc.compile_source(CUBE), encoding="utf-8")
    cube = _import_file(tmp_path / "gradc_dask_cube.py")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4001,)).astype(np.float32)
    logits = rng.standard_normal((301, 7)).astype(np.float32)
    onehot = np.eye(7, dtype=np.float32)[rng.integers(0, 7, 301)]
    want = (*act.swish.fwd_bwd(x, np.ones_like(x)), *seed.softmax_xent.fwd_bwd(logits, onehot, 1.0),
            *cube.cube.fwd_bwd(x, x))
    with dask.config.set({"temporary-directory": str(tmp_path)}), \
            LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                         dashboard_address=None) as cluster, Client(cluster) as client:
        shared = str(Path(act.__file__).parent)            # a directory the workers share
        client.run(lambda: sys.path.insert(0, shared))     # a lambda: pickled with its code
        client.upload_file(str(tmp_path / "gradc_dask_cube.py"))             # or the file itself
        cube = sys.modules["gradc_dask_cube"]     # upload_file reloads it here too (LocalCluster)
        xd = da.from_array(x, chunks=500)
        y, dx = act.swish.fwd_bwd(xd, da.ones_like(xd))
        loss, dlogits = seed.softmax_xent.fwd_bwd(da.from_array(logits, chunks=(50, 7)),
                                                  da.from_array(onehot, chunks=(60, 7)), 1.0)
        got = client.compute([y, dx, loss, dlogits, *cube.cube.fwd_bwd(xd, xd)], sync=True)
        where = client.run(lambda: sorted(n for n in sys.modules if n.startswith("gradc")))
    assert len(where) == 2
    assert all({act.__name__, seed.__name__, "gradc_dask_cube"} <= set(names)
               and "gradc" not in names for names in where.values())
    for k in (0, 1, 4, 5):                                  # elementwise: bit for bit
        np.testing.assert_array_equal(got[k], want[k])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5)
    np.testing.assert_allclose(got[3], want[3], rtol=1e-5, atol=1e-8)


def test_the_benchmark_runs_small():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_dask.py"),
                          "--n", "1000000", "--chunk", "250000"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert re.search(r"1,000,000 float32 elements in 4 chunks", out.stdout), out.stdout
    assert re.search(r"peak RSS [\d.]+ MiB", out.stdout) \
        and "max abs difference vs the in-memory op (first and last chunks): 0" in out.stdout
    assert math.isfinite(float(re.search(r"elements/s: ([\d.e+]+)", out.stdout).group(1)))


def test_the_ops_of_arrays_grad() -> None:
    """Every op of examples/arrays.grad (the spec's arrays.grad) on Dask arrays of one
    row a chunk (the axes an op needs whole are rechunked), its fwd_bwd equal to the
    in-memory one: the forward's and the backward's primitives, each through its Dask
    function (the other methods' wrappers: test_dask_results_equal_the_in_memory_results;
    forward and vjp here too compiled their kernels again, about 5 s).  In float64 only
    (to 1e-12): the Dask wrappers do not depend on the dtype (the float32 casts of lazy
    arguments: test_dask_results_equal_the_in_memory_results), and
    tests/test_spec_examples.py runs these ops' in-memory kernels in float32 too; a
    second dtype only compiled every kernel of the file again (about 20 s)."""
    from arrays_inputs import ARRAYS_INPUTS, cast
    arrays = gradc.load(ROOT / "examples" / "arrays.grad")
    assert set(arrays.OPS) == set(ARRAYS_INPUTS) | {"dropout"}   # tests/codegen/test_random.py
    dtype, tol = np.float64, 1e-12
    for name, (xs, ups) in ARRAYS_INPUTS.items():
        op = arrays.OPS[name]
        args = cast(xs, dtype) + cast(ups, dtype)
        want = op.fwd_bwd(*args)
        lazy = [da.from_array(a, chunks=1) for a in args]
        with dask.config.set(scheduler=_refuse):
            got = op.fwd_bwd(*lazy)
        assert all(isinstance(g, da.Array) for g in got), name
        got = dask.compute(*got, scheduler="threads")
        for w, g in zip(want, got, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, name
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)


def test_row_reductions_of_no_rows(tmp_path) -> None:
    """A max (and the softmax around it) of each of 0 rows is an empty array, as in
    memory (Dask's own max refuses an empty array); a max over an empty axis is still
    NumPy's ValueError, at compute."""
    (tmp_path / "rows.grad").write_text(
        "op sm(x) -> y {\n    e = exp(x - max(x, axis=-1, keepdims=true))\n"
        "    y = e / sum(e, axis=-1, keepdims=true)\n}\n"
        "op mx(x) -> y {\n    y = max(x, axis=-1)\n}\n")
    m = gradc.load(tmp_path / "rows.grad")
    z = np.zeros((0, 9), np.float32)
    for got, want in ((m.sm(da.from_array(z)), m.sm(z)),
                      (m.sm.vjp(da.from_array(z), da.from_array(z))[0], m.sm.vjp(z, z)[0])):
        got = got.compute()
        assert got.shape == want.shape == (0, 9) and got.dtype == want.dtype == np.float32
    assert m.mx(da.from_array(z)).compute().shape == (0,)
    with pytest.raises(ValueError, match="zero-size array"):
        m.mx(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="mx.forward: zero-size array"):
        m.mx(da.from_array(np.zeros((3, 0))))    # at the call, the shapes being known


def test_empty_chunks_and_rows_with_weights(tmp_path) -> None:
    """Chunks of 0 rows or columns (a slice's, a concatenation's) and arrays of no rows
    give the in-memory results: a row of weights read per row failed on a block of no
    rows, and Dask's own max on an empty chunk (found by helper 74)."""
    (tmp_path / "w.grad").write_text(
        "op rn(x, w) -> y {\n    y = x * rsqrt(mean(x^2, axis=-1, keepdims=true) + 1e-6) * w\n}\n"
        "op sm(x) -> y {\n    e = exp(x - max(x, axis=-1, keepdims=true))\n"
        "    y = e / sum(e, axis=-1, keepdims=true)\n}\n")
    m = gradc.load(tmp_path / "w.grad")
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((2, 40, 8))
    w = rng.standard_normal(8)
    z = np.zeros((0, 8))
    assert m.rn(da.from_array(z), w).compute().shape == (0, 8)
    assert [r.compute().shape for r in m.rn.vjp(da.from_array(z), w, da.from_array(z))] \
        == [(0, 8), (8,)]
    for chunks in (((10, 0, 30), (8,)), ((40,), (3, 0, 5)), ((0, 40), (8, 0))):
        dx, dg = (da.from_array(a, chunks=chunks) for a in (x, g))
        for got, want in ((m.rn(dx, w), m.rn(x, w)), (m.sm(dx), m.sm(x)),
                          *zip(m.rn.vjp(dx, w, dg), m.rn.vjp(x, w, g)),
                          (m.sm.vjp(dx, dg)[0], m.sm.vjp(x, g)[0])):
            np.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-14)
