"""``benchmarks/bench_rowwise.py`` at a tiny shape with gradc's variants, its float64
NumPy reference against the values written in ``examples/rowwise.grad``, and its
agreement check, which must keep a variant with wrong results out of the timings.
Nothing here is about time."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
OPS = ("softmax_rows", "log_softmax_rows", "layer_norm", "rms_norm", "xent_rows")
QUICK = ["--shapes", "3x5", "--repeat", "1", "--settle", "0"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_rowwise",
                                                  ROOT / "benchmarks" / "bench_rowwise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_row_per_op_and_the_json(bench, tmp_path, monkeypatch, capsys):
    import gradc.tools.bench
    monkeypatch.setattr(gradc.tools.bench, "wait_quiet", lambda: False)   # a thread never sleeps
    out = tmp_path / "rowwise.json"
    assert bench.main([*QUICK, "--allocations", "2", "--variants", *bench.GRADC,
                       "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "disagrees" not in printed and "not timed" not in printed, printed
    assert ("warning: another thread of this process still ran when these were timed "
            "(times per variant): fused+out 10, fused 10, unfused 10, copy 10, 2-pass floor 10"
            ) in printed
    for op in OPS:
        rows = [line.split() for line in printed.splitlines() if line.startswith(op + " ")]
        assert len(rows) == 1 and rows[0][1] == "3x5", printed
        # copy, then "ms (%)" for the 2-pass floor and each variant
        assert len(rows[0]) == 5 + 2 * len(bench.GRADC), rows
    report = json.loads(out.read_text())
    loads = report["machine"]["loadavg_before"] + report["machine"]["loadavg_after"]
    assert len(loads) == 6 and all(round(x, 2) == x for x in loads), loads
    assert [r["op"] for r in report["results"]] == list(OPS)
    for r in report["results"]:
        assert set(r["variants"]) == set(bench.GRADC) and r["fastest_peer"] is None
        assert r["busy"] == {v: 2 for v in (*bench.GRADC, "copy", bench.FLOOR)}
        # two allocations of the arrays, one repeat each: both samples, and each median
        assert len(r["copy_per_allocation_s"]) == len(r["floor_per_allocation_s"]) == 2
        for v in r["variants"].values():
            assert len(v["samples_s"]) == len(v["per_allocation_s"]) == 2
            assert v["median_s"] == np.median(v["samples_s"])
        assert r["floor_s"] > 0
        assert all(v["max_rel_err"] <= bench.TOL_TIMED for v in r["variants"].values())
    assert all(set(c["max_rel_err"]) == set(bench.GRADC) for c in report["check"].values())


def test_a_variant_that_disagrees_is_not_timed(bench, monkeypatch, capsys):
    # a reference whose gradient is off by 1 % stands for a variant that is wrong
    right = bench.reference
    off = lambda op, params, ups: [a * (1.01 if k else 1) for k, a in
                                   enumerate(right(op, params, ups))]
    monkeypatch.setattr(bench, "reference", off)
    assert bench.main([*QUICK, "--ops", "softmax_rows", "--variants", "fused"]) == 0
    printed = capsys.readouterr().out
    assert "check at 6x37: fused for softmax_rows disagrees: result 1 differs" in printed
    row = next(line.split() for line in printed.splitlines() if line.startswith("softmax_rows"))
    assert row[5:] == ["-"], printed
    assert "not timed: fused for softmax_rows 3x5" in printed


def test_the_two_pass_floor_is_rms_norm_without_a_weight():
    """The floor timed beside the copy computes what it says, on rows of one block,
    several blocks and a partial last block, float32 and float64."""
    from gradc.tools.bench import two_pass_kernel
    floor = two_pass_kernel()
    rng = np.random.default_rng(3)
    for dtype, tol in ((np.float32, 2e-6), (np.float64, 1e-14)):
        for rows, n in ((3, 5), (4, 256), (2, 700), (1, 1)):
            x, dy = (rng.standard_normal(rows * n).astype(dtype) for _ in range(2))
            y, dx = np.empty_like(x), np.empty_like(x)
            floor(x, dy, y, dx, n)
            X, D = (a.reshape(rows, n).astype(np.float64) for a in (x, dy))
            r = 1 / np.sqrt((X * X).mean(-1, keepdims=True) + 1e-5)
            want_dx = r * D - X * r ** 3 * (X * D).mean(-1, keepdims=True)
            np.testing.assert_allclose(y.reshape(rows, n), X * r, rtol=tol, atol=tol)
            np.testing.assert_allclose(dx.reshape(rows, n), want_dx, rtol=tol, atol=tol)
            assert y.dtype == dx.dtype == dtype


def test_the_check_names_each_kind_of_wrong_result(bench):
    params, ups = bench.make_inputs("softmax_rows", bench.CHECK_SHAPE)
    want = bench.reference("softmax_rows", params, ups)
    y, dx = (np.float32(a) for a in want)
    runs = {"right": lambda: [y, dx],
            "no <y, dy> term": lambda: [y, y * ups[0]],
            "nan": lambda: [y, np.where(dx > 0, np.nan, dx)],
            "one result": lambda: [y],
            "transposed": lambda: [y, dx.T],
            "raises": lambda: 1 / 0}
    errs, wrong = bench.check_variants(runs, want, bench.TOL_CHECK)
    assert list(errs) == ["right"] and errs["right"] < 1e-6
    assert wrong["no <y, dy> term"].startswith("result 1 differs from float64 NumPy by")
    assert wrong["nan"].startswith("result 1 differs")
    assert wrong["transposed"] == "result 1 differs from float64 NumPy by inf (tolerance 0.0001)"
    assert wrong["one result"] == "1 results, expected 2"
    assert wrong["raises"] == "ZeroDivisionError: division by zero"


def _written():
    """The inputs, upstream and values of ``examples/rowwise.grad``'s comments."""
    x = np.array([[1, 2, 3], [0, 0, 0]])
    x2 = np.array([[1, 2, 4], [-1, 0, 3]])
    dy = np.array([[1, 0, 0], [0, 1, 0]])
    w, b, t = np.array([0.5, 1, 2]), np.array([0, 0.1, -0.1]), np.array([[0, 0, 1], [1, 0, 0]])
    third, ninth = 1 / 3, 1 / 9
    return dy, {
        "softmax_rows": ([x], [[[0.09003057317038046, 0.24472847105479764, 0.6652409557748218],
                                [third] * 3],
                               [[0.08192506906499324, -0.022033044520174298, -0.05989202454481893],
                                [-ninth, 2 * ninth, -ninth]]]),
        "log_softmax_rows": ([x], [[[-2.40760596444438, -1.40760596444438, -0.40760596444438],
                                    [-1.0986122886681098] * 3],
                                   [[0.9099694268296196, -0.24472847105479764,
                                     -0.6652409557748218], [-third, 2 * third, -third]]]),
        "layer_norm": ([x2, w, b], [
            [[-0.5345207657251488, -0.16726038286257452, 2.5726038286257435],
             [-0.4902894892682321, -0.29223159141458577, 2.6456211399021003]],
            [[0.11454114585048407, -0.1718100006843098, 0.057268854833825704],
             [-0.27154468680239785, 0.36206003497654377, -0.09051534817414587]],
            [-1.0690415314502977, -0.39223159141458575, 0], [1, 1, 0]]),
        "rms_norm": ([x2, w[:]], [
            [[0.18898222300588385, 0.7559288920235354, 3.0237155680941417],
             [-0.2738612376734005, 0, 3.286334852080806]],
            [[0.179983070815, -0.0179983043818, -0.0359966087635],
             [0, 0.547722475346801, 0]]]),
        "xent_rows": ([x2, t], [2.1178649616568572,
                                [[0.021005033067033024, 0.057097599692297246,
                                  -0.07810263275933027],
                                 [-0.4914260872272398, 0.02330631128898695,
                                  0.4681197759382529]]]),
    }


def test_the_reference_gives_the_values_written_in_the_example(bench):
    """The values of ``examples/rowwise.grad``'s comments, from the NumPy reference."""
    dy, written = _written()
    for op, (params, values) in written.items():
        got = bench.reference(op, params, [1.0 if op == "xent_rows" else dy])
        for k, value in enumerate(values):     # rms_norm's dw is not written
            np.testing.assert_allclose(got[k], value, rtol=1e-9, atol=1e-12, err_msg=f"{op}[{k}]")


def test_the_generated_module_gives_the_values_written_in_the_example():
    """The same values from gradc's module (float64), fused and unfused: forward, then
    the VJP's gradients in order."""
    import gradc
    module = gradc.load(ROOT / "examples" / "rowwise.grad")
    dy, written = _written()
    for name, (params, values) in written.items():
        args = [np.asarray(p, np.float64) for p in params]
        up = np.float64(1.0) if name == "xent_rows" else np.asarray(dy, np.float64)
        for op in (getattr(module, name), getattr(module, name).unfused):
            grads = op.vjp(*args, up)
            got = [op(*args), *(grads if isinstance(grads, tuple) else (grads,))]
            for k, value in enumerate(values):
                np.testing.assert_allclose(got[k], value, rtol=1e-9, atol=1e-12,
                                           err_msg=f"{name}[{k}]")



def test_bench_ab_runs_two_modules_side_by_side(tmp_path, capsys):
    import gradc
    spec = importlib.util.spec_from_file_location("bench_ab", ROOT / "benchmarks" / "bench_ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    text = gradc.compile_source((ROOT / "examples" / "rowwise.grad").read_text(),
                                file="rowwise.grad")
    for name in ("rowwise_before", "rowwise_after"):
        (tmp_path / f"{name}.py").write_text(text)
    # rows of 2048: the row plan, whose serial kernel prefetches the next row
    assert ab.main([str(tmp_path / "rowwise_before.py"), str(tmp_path / "rowwise_after.py"),
                    "--ops", "softmax_rows", "--shapes", "2x2048", "--repeat", "2",
                    "--serial"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "serial, thread CPU time" in lines[0]
    (row,) = [line.split() for line in lines if line.startswith("softmax_rows ")]
    assert row[1] == "2x2048" and row[-3:-1] == ["after/before", "speed"], row
    assert float(row[-1]) > 0
    # --fresh: calls without out= (a small call on the generic plan here)
    assert ab.main([str(tmp_path / "rowwise_before.py"), str(tmp_path / "rowwise_after.py"),
                    "--ops", "rms_norm", "--shapes", "8x64", "--repeat", "2", "--fresh"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "calls of fwd_bwd(), wall" in lines[0]
    assert [line.split()[1] for line in lines if line.startswith("rms_norm ")] == ["8x64"]
    with pytest.raises(SystemExit):        # one name for both: Numba's caches would clash
        ab.main([str(tmp_path / "rowwise_before.py")] * 2)


def test_the_copy_moves_through_the_ops_own_arrays(bench):
    """The copy and the floor read the op's x and dy (logits and targets) and write its
    out= buffers y and dx (cross-entropy: dlogits and an array of its own), so that
    they see the memory the op's kernels see."""
    shape = (4, 6)
    x, dy, y, dx = (np.zeros(shape, np.float32) for _ in range(4))
    w = np.ones(6, np.float32)
    arrays = bench.copy_arrays([x, w, np.float32(1e-5)], (y, dx), shape)
    assert len(arrays) == 4 and all(a.shape == (24,) for a in arrays)
    assert np.shares_memory(arrays[0], x) and np.shares_memory(arrays[2], y)
    assert np.shares_memory(arrays[3], dx) and not np.shares_memory(arrays[1], w)
    arrays = bench.copy_arrays([x, dy, w], [y, dx], shape)
    assert [np.shares_memory(a, b) for a, b in zip(arrays, [x, dy, y, dx])] == [True] * 4
    loss = np.float32(0.5)                           # cross-entropy: a scalar and dlogits
    arrays = bench.copy_arrays([x, dy], (loss, dx), shape)
    assert np.shares_memory(arrays[2], dx) and arrays[3].shape == (24,)
    assert not any(np.shares_memory(arrays[3], a) for a in (x, dy, dx))
