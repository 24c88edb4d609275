"""``gradc bench`` end to end on tiny sizes, and the framework versions of gradc's IR
(JAX, PyTorch, numexpr) against the generated kernels.

Nothing here is about time: the benchmark runs with n = 1000 and 2 repeats, and
only its output (the table, the JSON keys, the checked errors) is asserted.  The
optional frameworks are skipped where not installed; ``torch.compile`` (tens of
seconds of compiling on two cores) only with ``GRADC_TEST_TORCH_COMPILE=1``.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

import gradc
from gradc.tools.bench import Skip, make_inputs, max_rel_err, run_bench, select_op
from gradc.tools.bench_frameworks import (Unsupported, jax_functions, numexpr_function,
                                          to_torch, torch_functions)
from gradc.tools.bench_report import format_report, plot_report
from gradc.tools.cli import main
from gradc.frontend.check import load_program
from gradc.pipeline import build_op

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOL = 2e-5          # max |a - b| / max(|b|, 1), float32

TINY = """
op halved_tanh(x) -> y {
    y = tanh(x)
} grad(dy) -> dx {
    dx = dy * (1 - y^2) * 0.5
}
op leaky(x, alpha: nograd = 0.01) -> y {
    y = where(x > 0, x, alpha * x)
}
op bias(x: f32[n, k], b: f32[k]) -> y {
    y = softplus(x + b)
}
op project(x: f32[n, k], w: f32[k]) -> y {
    y = x @ w
}
"""
TINY_OPS = ("halved_tanh", "leaky", "bias")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "tiny.grad"
    path.write_text(TINY, encoding="utf-8")
    return path


def _quick(spec, variants, **kw) -> dict:
    return run_bench(spec, [1000], repeat=2, warmup=0, variants=variants, progress=False,
                     settle=0.0, **kw)


def test_cli_bench_numpy_only_writes_table_and_json(tiny, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", str(tiny), "--sizes", "1e3", "--repeat", "2", "--warmup", "0",
               "--settle", "0", "--variants", "fused+out", "fused", "unfused", "numpy",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "\033[" not in text                      # plain when not a terminal
    assert "median ms" in text and "GB/s (% copy)" in text and "max rel err" in text
    for op in TINY_OPS:
        assert op in text
    assert "skipped: project: uses @" in text
    report = json.loads(out.read_text())
    assert {"spec", "sizes", "repeat", "warmup", "variants", "machine", "results",
            "skipped"} <= set(report)
    assert {"cpu_count", "cpu_model", "versions", "threads", "loadavg_before"} \
        <= set(report["machine"])
    assert {"numpy", "numba", "gradc"} <= set(report["machine"]["versions"])
    assert sorted(r["op"] for r in report["results"]) == sorted(TINY_OPS)
    for r in report["results"]:
        assert {"op", "n", "dtype", "shapes", "bytes", "variants", "references",
                "unavailable"} <= set(r)
        assert set(r["variants"]) == {"fused+out", "fused", "unfused", "numpy"}
        assert set(r["references"]) == {"copy 2r/2w", "np.copyto"}
        for v in r["variants"].values():
            assert {"median_s", "min_s", "samples_s", "first_call_s", "gbs", "pct_copy",
                    "max_rel_err"} <= set(v)
            assert len(v["samples_s"]) == 2 and v["max_rel_err"] < TOL
    assert report["results"][-1]["shapes"] == {"x": [1, 1000], "b": [1000]}
    assert "unfused / fused+out" in text and "bytes per element" in text
    assert all(r["traffic"]["fused_B"] > 0 for r in report["results"])


# Bytes per element (float32) of fwd_bwd over the largest loop, fused CPU plan and
# unfused plan, counted by hand: custom_linear reads x and writes y and dx either way;
# sign_ste reads x, dy and writes y, dx (unfused: sign, then dx copied from dy);
# clipped_relu unfused: max (x -> y), gt (x -> m), mul (dy, m -> t), clip (t -> dx);
# add_bias unfused: add (x -> y; b per row), dx copied from dy, sum_to reads dy.
TRAFFIC = {"custom_linear": (12, 12), "sign_ste": (16, 16), "clipped_relu": (16, 36),
           "scaled_tanh": (16, 44), "add_bias": (16, 20)}


@pytest.mark.parametrize("name", sorted(TRAFFIC))
def test_plan_traffic_counts_the_bytes_each_plan_moves(name):
    from gradc.tools.bench import plan_traffic
    file = EXAMPLES / ("activations.grad" if name == "add_bias" else "seed.grad")
    program = load_program(file)
    cop = build_op(program.ops[name], program.ops, program.consts)
    t = plan_traffic(cop)
    assert (t["fused_B"], t["unfused_B"], t["dtype"]) == (*TRAFFIC[name], "float32")
    t = plan_traffic(cop, np.float64)     # every value is a float: twice the bytes
    assert (t["fused_B"], t["unfused_B"]) == tuple(2 * b for b in TRAFFIC[name])
    assert plan_traffic(cop, np.float16)["dtype"] == "float32"     # computed in float32


def test_cli_rejects_unknown_variant(tiny, capsys):
    assert main(["bench", str(tiny), "--variants", "tensorflow"]) == 2
    assert "unknown variant" in capsys.readouterr().err


@pytest.mark.parametrize("variant,module", [("numexpr", "numexpr"), ("jax.jit", "jax"),
                                            ("torch", "torch")])
def test_bench_with_framework(tiny, variant, module):
    pytest.importorskip(module)
    report = _quick(tiny, ("fused+out", variant))
    assert report["machine"]["versions"][module]
    for r in report["results"]:
        if variant == "numexpr" and r["op"] == "bias":      # its gradient sums over rows
            assert r["unavailable"] == {"numexpr": "not elementwise (sum_to)"}
            continue
        assert r["unavailable"] == {}, r["unavailable"]
        assert r["variants"][variant]["max_rel_err"] < TOL
    assert variant in format_report(report)


@pytest.mark.skipif(not os.environ.get("GRADC_TEST_TORCH_COMPILE"),
                    reason="torch.compile takes tens of seconds; GRADC_TEST_TORCH_COMPILE=1")
def test_bench_torch_compile_one_op(tiny):
    pytest.importorskip("torch")
    report = _quick(tiny, ("fused+out", "torch.compile"), ops=["halved_tanh"])
    (r,) = report["results"]
    assert r["variants"]["torch.compile"]["max_rel_err"] < TOL


def test_plot(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    report = _quick(tiny, ("fused+out", "numpy"), ops=["leaky"])
    plot_report(report, tmp_path / "one.png")
    assert (tmp_path / "one.png").read_bytes()[:4] == b"\x89PNG"


# -- variants timed one library at a time, and the interference warning -----------------


def test_interference_warning_in_the_report(tiny):
    from gradc.tools.bench_report import interference
    report = _quick(tiny, ("fused+out",), ops=["leaky"])
    cores = report["machine"]["cpus_usable"]
    m, (r,) = report["machine"], report["results"]
    m["loadavg_before"], m["loadavg_after"], r["busy"] = [0.1, 0, 0], [cores - 0.5, 0, 0], {}
    assert interference(report) == []
    assert "warning" not in format_report(report)
    for before, after in (([0.5, 0, 0], [0.6, 0, 0]), ([0.0, 0, 0], [cores + 0.1, 0, 0])):
        m["loadavg_before"], m["loadavg_after"] = before, after
        (line,) = interference(report)
        assert line.startswith(f"warning: interference: load average {before[0]} before the "
                               f"run and {after[0]} after it on {cores} usable cores")
        assert line in format_report(report).splitlines()
    m["loadavg_before"], m["loadavg_after"] = [0.0, 0, 0], [0.0, 0, 0]
    r["busy"] = {"fused+out": 2, "copy 2r/2w": 1}
    assert interference(report) == ["warning: another thread of this process still ran when "
                                     "these were timed (times per variant): fused+out 2, "
                                     "copy 2r/2w 1"]


def test_wait_quiet_waits_for_busy_threads_and_gives_up_at_the_limit():
    from gradc.tools.bench import wait_quiet
    clock, states = [0.0], iter([2, 1, 1, 0, 3])
    sleep = lambda s: clock.__setitem__(0, clock[0] + s)
    assert wait_quiet(1.0, 0.25, busy=lambda: next(states), sleep=sleep, clock=lambda: clock[0])
    assert clock[0] == 0.75 and next(states) == 3                   # stopped at the first 0
    clock[0] = 0.0
    assert not wait_quiet(1.0, 0.25, busy=lambda: 1, sleep=sleep, clock=lambda: clock[0])
    assert clock[0] == 1.0
    assert wait_quiet(1.0, 0.25, busy=lambda: None, sleep=sleep, clock=lambda: clock[0])


def _spinner():
    """A thread that runs without the GIL (as a library's workers do) until ``stop``
    is set; ``seen[1]`` is 1 once it has left its loop."""
    import threading
    import numba

    @numba.njit(nogil=True, cache=False)
    def spin(flag, seen):
        n = 0
        while flag[0] == 0:          # seen may alias flag: the load stays in the loop
            n += 1
            seen[0] = n
        seen[1] = 1

    flag, seen = np.zeros(1, np.int64), np.zeros(2, np.int64)
    spin(np.ones(1, np.int64), np.zeros(2, np.int64))               # compile here
    t = threading.Thread(target=spin, args=(flag, seen), daemon=True)
    t.start()
    while seen[0] == 0:              # running, not waiting for the GIL to start
        pass
    return t, flag, seen


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads seen through /proc")
def test_busy_threads_sees_a_spinning_thread_not_a_sleeping_one():
    import threading
    from gradc.tools.bench import busy_threads, wait_quiet
    done = threading.Event()
    sleeper = threading.Thread(target=done.wait, daemon=True)
    sleeper.start()
    t, flag, seen = _spinner()
    assert busy_threads() >= 1 and not wait_quiet(0.01)
    flag[0] = 1
    t.join()
    assert seen[1] == 1 and wait_quiet(30.0) and sleeper.is_alive()
    done.set()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads seen through /proc")
def test_no_variant_is_timed_while_another_variants_threads_spin(monkeypatch):
    """A variant that leaves a thread spinning (stopped by a timer, as OpenMP's workers
    stop after their spin count) and one that records whether any still spins: the
    second is never timed (nor woken) while the first's threads run."""
    import threading
    import gradc.tools.bench as bench
    monkeypatch.setattr(bench, "QUIET_LIMIT", 30.0)
    spinners, spinning_when_timed = [], []

    def leave_spinning():
        t, flag, seen = _spinner()
        threading.Timer(0.02, flag.__setitem__, (0, 1)).start()
        spinners.append(seen)

    def probe():
        spinning_when_timed.append(sum(s[1] == 0 for s in spinners))

    quiet: dict = {}
    bench.time_interleaved({"spin": leave_spinning, "probe": probe}, 4, quiet=quiet)
    assert len(spinners) == 8 and len(spinning_when_timed) == 8
    assert spinning_when_timed == [0] * 8 and quiet == {"busy": []}


# -- the framework versions of the IR, against the generated kernels -------------------


def _ops(file: str) -> list[tuple[str, str]]:
    program = load_program(EXAMPLES / file)
    out = []
    for name in program.main_ops:
        try:
            select_op(build_op(program.ops[name], program.ops, program.consts))
            out.append((file, name))
        except Skip:
            pass
    return out


BENCH_OPS = _ops("seed.grad") + _ops("activations.grad")


@pytest.fixture(scope="module")
def modules():
    return {f: (load_program(EXAMPLES / f), gradc.load(EXAMPLES / f))
            for f in ("seed.grad", "activations.grad")}


def _case(modules, file: str, name: str, n: int = 4000):
    program, module = modules[file]
    cop = build_op(program.ops[name], program.ops, program.consts)
    args = make_inputs(cop, n, np.random.default_rng(1))
    op = getattr(module, name)
    pos = [a for a, p in zip(args, cop.params) if not p.has_default]
    ys = op(*pos)
    ys = ys if isinstance(ys, tuple) else (ys,)
    ups = [np.random.default_rng(2).standard_normal(np.shape(y)).astype(y.dtype) for y in ys]
    both = op.fwd_bwd(*pos, *ups)
    return cop, args, ups, list(ys), list(both)


def _agree(got, want, what: str) -> None:
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.shape(g) == np.shape(w), f"{what}[{k}]: shape {np.shape(g)} != {np.shape(w)}"
        err = max_rel_err(g, w)
        assert err < TOL, f"{what}[{k}]: max rel err {err:.1e}"


def test_bench_ops_of_the_examples():
    names = {n for _, n in BENCH_OPS}
    assert {"scaled_tanh", "clipped_relu", "sign_ste", "custom_linear", "softplus_stable",
            "gelu_tanh", "swish", "huber", "log_sigmoid", "leaky_relu"} <= names
    assert "mlp" not in names


@pytest.mark.parametrize("file,name", BENCH_OPS, ids=[n for _, n in BENCH_OPS])
def test_jax_agrees_with_gradc(modules, file, name):
    pytest.importorskip("jax")
    cop, args, ups, ys, both = _case(modules, file, name)
    forward, fwd_bwd = jax_functions(cop)
    _agree([np.asarray(v) for v in forward(*args)], ys, f"jax {name} forward")
    _agree([np.asarray(v) for v in fwd_bwd(*args, *ups)], both, f"jax {name} fwd_bwd")


@pytest.mark.parametrize("file,name", BENCH_OPS, ids=[n for _, n in BENCH_OPS])
def test_torch_agrees_with_gradc(modules, file, name):
    pytest.importorskip("torch")
    cop, args, ups, ys, both = _case(modules, file, name)
    forward, fwd_bwd = torch_functions(cop)
    ta, tu = to_torch(args), to_torch(ups)
    _agree([v.detach().numpy() for v in forward(*ta)], ys, f"torch {name} forward")
    _agree([v.detach().numpy() for v in fwd_bwd(*ta, *tu)], both, f"torch {name} fwd_bwd")


@pytest.mark.parametrize("file,name", BENCH_OPS, ids=[n for _, n in BENCH_OPS])
def test_numexpr_agrees_with_gradc(modules, file, name):
    pytest.importorskip("numexpr")
    cop, args, ups, ys, both = _case(modules, file, name)
    try:
        forward = numexpr_function(cop, method="forward")
        fwd_bwd = numexpr_function(cop)
    except Unsupported as exc:
        assert name in ("softmax_xent", "add_bias"), exc      # reductions, sum_to
        return
    _agree(forward(*args, out=[np.empty_like(y) for y in ys]), ys, f"numexpr {name} forward")
    _agree(fwd_bwd(*args, *ups, out=[np.empty_like(b) for b in both]), both,
           f"numexpr {name} fwd_bwd")


@pytest.mark.parametrize("name", ["mlp", "gradient_penalty"])
def test_frameworks_beyond_elementwise(modules, name):
    """Matmul, reductions, grad() inside the body and a custom region inside a derived
    gradient (mlp calls scaled_tanh): the interpreters are not limited to the bench's ops."""
    program, module = modules["seed.grad"]
    cop = build_op(program.ops[name], program.ops, program.consts)
    rng = np.random.default_rng(3)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
    args = {"mlp": [f32(8, 5), f32(5, 7), f32(7), f32(7, 3), f32(3)],
            "gradient_penalty": [f32(8, 5), f32(8, 5), rng.random((8, 1), np.float32),
                                 f32(5)]}[name]
    op = getattr(module, name)
    y = op(*args)
    up = f32(*np.shape(y))
    both = list(op.fwd_bwd(*args, up))
    if importlib.util.find_spec("jax"):
        _agree([np.asarray(v) for v in jax_functions(cop)[1](*args, up)], both, f"jax {name}")
    if importlib.util.find_spec("torch"):
        got = torch_functions(cop)[1](*to_torch(args), *to_torch([up]))
        _agree([v.detach().numpy() for v in got], both, f"torch {name}")


def test_bench_gives_an_op_reducing_over_axis_1_rank_2_inputs(tmp_path):
    """A grad block summing over axis=(0, 1) ended in 'internal error' (1-D inputs)."""
    f = tmp_path / "ax.grad"
    f.write_text("op sq(x) -> y {\n    y = x * x\n} grad(dy) -> dx surrogate {\n"
                 "    dx = dy * sum(x, axis=(0, 1))\n}\n")
    report = run_bench(f, sizes=[2000], variants=["fused"], repeat=1, warmup=0, progress=None)
    assert report["skipped"] == [] and [r["op"] for r in report["results"]] == ["sq"]


# -- --shape: the shapes of an op's inputs given by the user ----------------------------

SHAPED = """
op rowmax(x) -> y {
    y = x - max(x, axis=-1, keepdims=true)
}
op bias(x: f32[n, k], b: f32[k]) -> y {
    y = softplus(x + b)
}
op leaky(x, alpha: nograd = 0.01) -> y {
    y = where(x > 0, x, alpha * x)
}
op project(x: f32[n, k], w: f32[k]) -> y {
    y = x @ w
}
"""


@pytest.fixture(scope="module")
def shaped(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench_shape") / "shaped.grad"
    path.write_text(SHAPED, encoding="utf-8")
    return path


def _cop(path, name):
    program = load_program(path)
    return build_op(program.ops[name], program.ops, program.consts)


@pytest.mark.parametrize("value", ["x=8,16", "x=8x16"])
def test_cli_bench_shape_sets_the_inputs_shape(shaped, tmp_path, capsys, value):
    """A row-wise op gets 8 rows of 16 (it would get n elements in one row), once
    although two sizes are asked for; the report labels the block by the shapes."""
    out = tmp_path / "bench.json"
    rc = main(["bench", str(shaped), "--shape", value, "--sizes", "1e3", "2e3",
               "--repeat", "1", "--warmup", "0", "--settle", "0", "--ops", "rowmax",
               "--variants", "fused+out", "numpy", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    report = json.loads(out.read_text())
    (r,) = report["results"]
    assert r["shapes"] == {"x": [8, 16]} and r["shapes_given"] == {"x": [8, 16]}
    assert r["n"] == 128 and r["bytes"] == 4 * 128 * 4     # x, dy, y, dx: float32
    assert r["variants"]["numpy"]["max_rel_err"] < TOL
    assert report["shapes"] == {"x": [8, 16]} and report["skipped"] == []
    assert "shapes x 8×16 (float32" in text and "n = 1,000" not in text


def test_bench_shape_rowwise_kernel_sees_rows(shaped):
    """What the op computes on the given shape: each row's max subtracted (a 1-D
    input would have one max)."""
    cop = _cop(shaped, "rowmax")
    args = make_inputs(cop, 1000, np.random.default_rng(0), {"x": (8, 16)})
    (x,) = args
    y = gradc.load(shaped).rowmax(x)
    assert x.shape == (8, 16) and np.allclose(y.max(axis=-1), 0)


def test_input_shapes_keep_named_dims_consistent(shaped):
    from gradc.tools.bench import input_shapes
    bias, rowmax, leaky = (_cop(shaped, n) for n in ("bias", "rowmax", "leaky"))
    assert input_shapes(bias, 10**6) == [(1000, 1000), (1000,)]          # as before
    assert input_shapes(bias, 10**6, {"x": (4096, 1024)}) == [(4096, 1024), (1024,)]
    assert input_shapes(bias, 10**6, {"b": (64,)}) == [(15625, 64), (64,)]  # ~n elements
    assert input_shapes(bias, 10**6, {"x": (8, 16), "b": (10,)}) == [(8, 16), (10,)]
    assert input_shapes(rowmax, 1000, {"w": (3,)}) == [(1000,)]
    assert input_shapes(leaky, 1000, {"x": (2, 3), "alpha": (5,)}) == [(2, 3), None]


def test_bench_shape_fixes_the_other_parameters(shaped):
    report = _quick(shaped, ("fused+out",), ops=["bias"], shapes={"x": (8, 16)})
    (r,) = report["results"]
    assert r["shapes"] == {"x": [8, 16], "b": [16]} and r["shapes_given"] == {"x": [8, 16]}


@pytest.mark.parametrize("shapes,why", [
    ({"x": (8, 16), "b": 10}, "dim 'k' is 16 in argument 'x' but 10 in argument 'b'"),
    ({"x": (16,)}, "argument 'x' must have 2 dims ['n', 'k'], got shape (16,)"),
])
def test_bench_shape_the_op_refuses_is_skipped_with_its_reason(shaped, shapes, why):
    report = _quick(shaped, ("fused+out",), ops=["bias"], shapes=shapes)
    assert report["results"] == []
    (s,) = report["skipped"]
    assert s["op"] == "bias" and why in s["reason"] and "shapes given" in s["reason"]
    assert f"skipped: bias at shapes x {'×'.join(map(str, shapes['x']))}" in \
        format_report(report)


@pytest.mark.parametrize("value,message", [
    ("x=", "no dimensions after '='"),
    ("x=a,b", "dimension 'a' is not a positive integer"),
    ("x=0,3", "dimensions must be positive, got 0"),
    ("=3", "no parameter name before '='"),
    ("x=3,", "an empty dimension"),
    ("x", "is not NAME=DIMS"),
])
def test_cli_bench_malformed_shape_is_a_usage_error(shaped, capsys, value, message):
    with pytest.raises(SystemExit) as exc:
        main(["bench", str(shaped), "--shape", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument --shape: {value!r}: {message}" in err or \
        f"error: argument --shape: {value!r} {message}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args,message", [
    (["--shape", "z=3"], "no benchmarked op has a parameter named z (their parameters: x, b)"),
    (["--shape", "alpha=3"], "alpha has a default in leaky"),
    (["--shape", "w=3"], "project has a parameter w but is not benchmarked: uses @"),
    (["--shape", "b=3", "--ops", "rowmax"], "named b (their parameters: x)"),
    (["--shape", "x=3", "--shape", "x=4"], "--shape x given twice (3 and 4)"),
])
def test_cli_bench_shape_of_no_parameter_is_an_error(shaped, capsys, args, message):
    assert main(["bench", str(shaped), "--sizes", "1e3", "--repeat", "1", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_run_bench_checks_shapes():
    from gradc.tools.bench import ShapeError
    for bad in ({"x": (0, 3)}, {"x": ()}, {"x": "8,16"}, {"x": (2.5,)}, {3: (2,)}):
        with pytest.raises(ShapeError):
            run_bench(EXAMPLES / "seed.grad", [1000], shapes=bad)


def test_inputs_too_large_for_memory_are_skipped_with_the_reason(shaped):
    """--shape x=4000000x4000000 (64 TB): numpy's MemoryError is a skip that says
    so, not an 'internal error'."""
    report = _quick(shaped, ("fused+out",), ops=["rowmax"], shapes={"x": (4_000_000, 4_000_000)})
    assert report["results"] == []
    (s,) = report["skipped"]
    assert "do not fit in memory" in s["reason"] and "smaller --sizes or --shape" in s["reason"]


@pytest.mark.parametrize("value", ["2.5", "1e-3", "nan", "inf"])
def test_cli_bench_size_must_be_a_whole_number(tiny, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["bench", str(tiny), "--sizes", value])
    assert exc.value.code == 2
    assert "not a size (a whole number of elements)" in capsys.readouterr().err


def test_peers_left_out_are_named_installed_or_not(tiny):
    """A peer that is installed but not among --variants is 'not selected', not 'not
    installed' (jax and numpy are in the test extra)."""
    text = format_report(_quick(tiny, ("fused+out",)))
    assert "not selected: " in text and "jax.jit" in text.split("not selected: ")[1]
    assert "not installed or not selected" not in text
    for line in text.splitlines():
        if line.lstrip().startswith("not installed:"):
            assert all(importlib.util.find_spec(v.split(".")[0]) is None
                       for v in line.split(":", 1)[1].split("(")[0].replace(",", " ").split())
