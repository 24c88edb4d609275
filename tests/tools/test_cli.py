"""The command line: exit statuses, messages and files written."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gradc
from gradc.tools.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_compile_writes_a_standalone_module(tmp_path, capsys):
    out = tmp_path / "seed_gen.py"
    assert main(["compile", str(EXAMPLES / "seed.grad"), "-o", str(out)]) == 0
    text = out.read_text()
    imports = [l for l in text.splitlines() if l.startswith(("import ", "from "))]
    assert imports and not any("gradc" in l for l in imports)
    assert "__gradc_version__" in text and "SOURCE_SHA256" in text
    assert f"wrote {out}" in capsys.readouterr().out


def test_compile_default_output_name(tmp_path):
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * 2 }\n")
    assert main(["compile", str(src)]) == 0
    assert (tmp_path / "ops_gen.py").is_file()


def test_compile_dash_o_dash_prints_the_module_and_writes_no_file(tmp_path, monkeypatch,
                                                                  capsys):
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * 2 }\n")
    monkeypatch.chdir(tmp_path)
    assert main(["compile", str(src), "-o", "-"]) == 0
    out = capsys.readouterr().out
    assert "OPS = {'f': f}" in out and "SOURCE_SHA256" in out and "wrote" not in out
    compile(out, "ops_gen.py", "exec")                   # the whole module, valid Python
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.grad"]


def test_an_output_in_a_missing_folder_is_an_error_not_a_new_folder(tmp_path):
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * 2 }\n")
    out = tmp_path / "typo" / "ops_gen.py"
    with pytest.raises(FileNotFoundError, match=f"no folder '{out.parent}' to write it in"):
        gradc.compile_file(src, out)
    with pytest.raises(IsADirectoryError, match="a folder, not a file to write"):
        gradc.compile_file(src, tmp_path)
    assert not out.parent.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ops.grad"]


OUTPUTS = [["check", "{src}", "--json", "{out}"], ["bench", "{src}", "--json", "{out}"],
           ["bench", "{src}", "--plot", "{out}"], ["compile", "{src}", "-o", "{out}"],
           ["compile", "{src}", "--emit", "torch", "-o", "{out}"],
           ["testgen", "{src}", "-o", "{out}"], ["graph", "{src}", "f", "-o", "{out}"]]


@pytest.mark.parametrize("argv", OUTPUTS)
def test_outputs_to_a_missing_folder_or_a_folder_are_refused_before_any_work(tmp_path, capsys,
                                                                              argv):
    """-o/--json/--plot in a folder that does not exist, or naming a folder: a usage
    error at once (it was an OSError after every check or measurement had run, or one
    naming the temporary file), nothing written."""
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * 2 }\n")
    out = tmp_path / "typo" / "report.json"
    for path, said in ((out, f"no folder '{out.parent}' to write '{out}' in"),
                       (tmp_path, f"'{tmp_path}' is a folder: give a file name")):
        with pytest.raises(SystemExit) as exc:
            main([a.format(src=src, out=path) for a in argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert said in err and "parsed" not in err and ".tmp" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.grad"]


@pytest.mark.parametrize("argv", [a for a in OUTPUTS if a[0] in ("compile", "testgen")])
def test_the_input_file_is_never_the_output(tmp_path, capsys, argv):
    """``gradc compile ops.grad -o ops.grad`` replaced the source with the module."""
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * 2 }\n")
    assert main([a.format(src=src, out=src) for a in argv]) == 1
    assert "the input file itself: give the output another name" in capsys.readouterr().err
    assert src.read_text() == "op f(x) -> y { y = x * 2 }\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.grad"]


def test_an_output_that_cannot_be_created_is_named_not_its_temporary_file(tmp_path, capsys,
                                                                         monkeypatch):
    """A folder where no file can be created (read-only, /proc): the error names the
    output and its folder, not the temporary file the write goes through, and leaves
    nothing behind (it was '[Errno 13] ...: /out/.ops_gen.py.d8316ea29911.tmp')."""
    from gradc.loader import disk_cache
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * 2 }\n")
    out = tmp_path / "ops_gen.py"
    real = os.open

    def refused(path, *args, **kw):
        if str(path).endswith(".tmp"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kw)
    monkeypatch.setattr(disk_cache.os, "open", refused)
    assert main(["compile", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {out}: cannot create a file in '{tmp_path}' "
                   f"(Permission denied)\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.grad"]


@pytest.mark.parametrize("argv", [["testgen", "{src}", "-o", "-"],
                                  ["compile", "{src}", "--emit", "torch", "-o", "-"]])
def test_outputs_that_must_be_files_refuse_dash(tmp_path, monkeypatch, capsys, argv):
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * 2 }\n")
    monkeypatch.chdir(tmp_path)
    assert main([a.format(src=src) for a in argv]) == 2
    assert "cannot go to stdout: give -o a file path" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.grad"]


def test_user_error_exits_1_with_a_rendered_message(tmp_path, capsys):
    bad = tmp_path / "bad.grad"
    bad.write_text("op f(x) -> y {\n    y = tanhh(x)\n}\n")
    assert main(["compile", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:2:9: error[E201]: unknown function 'tanhh'")
    assert "    2 |     y = tanhh(x)\n      |         ^^^^^" in err
    assert "did you mean 'tanh'?" in err


def test_missing_file_exits_1(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.grad")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_bad_usage_exits_2():
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2


def test_check_reports_every_op_and_custom_rules(capsys):
    assert main(["check", str(EXAMPLES / "seed.grad")]) == 0
    out = capsys.readouterr().out
    for op in ("custom_linear", "sign_ste", "clipped_relu", "scaled_tanh", "mlp",
               "softmax_xent", "gradient_penalty"):
        assert f"ok   {op}:" in out
    assert "scaled_tanh: true derivative (grad blocks ignored) vs finite differences" in out
    # Ops with a grad block of their own get the audit (tests/audit/test_custom_rules.py); an op that
    # only calls one (mlp) is compared with its true derivative as a whole.
    assert "audit of the custom rule: scaled: differs from d/dx by a factor 0.5 everywhere" in out
    assert "mlp: true derivative (grad blocks ignored) vs finite differences, rel. error" in out
    assert "custom gradient differs from the true derivative (relative difference 0.432)" in out


def test_check_fails_on_a_wrong_derivative(tmp_path, monkeypatch, capsys):
    # Break one rule of the table for this test only: the check must notice.
    import gradc.ir.primitives as P
    from dataclasses import replace
    table = dict(P.PRIMITIVES)
    table["sin"] = replace(table["sin"], vjp=("g * sin(x)",))
    monkeypatch.setattr("gradc.autodiff.reverse.PRIMITIVES", table)
    src = tmp_path / "s.grad"
    src.write_text("op f(x) -> y { y = sin(x) }\n")
    assert main(["check", str(src)]) == 1
    assert "FAIL f:" in capsys.readouterr().out


def test_explain_shows_gradient_and_plan(capsys):
    assert main(["explain", str(EXAMPLES / "seed.grad"), "scaled_tanh"]) == 0
    out = capsys.readouterr().out
    assert "grad_x = dy * (1 - tanh(x) ^ 2) * 0.5" in out
    assert "the true derivative" in out
    assert "kernel plan of fwd_bwd (fused, CPU): 1 step(s)" in out
    assert "kernel plan of jvp (fused, CPU): 1 step(s)" in out   # outputs and tangents: one loop
    assert main(["explain", str(EXAMPLES / "seed.grad"), "clipped_relu"]) == 0
    out = capsys.readouterr().out
    assert "warning[W405]: op 'clipped_relu' has no forward mode" in out
    assert "jvp: not available" in out


def test_explain_shows_the_audit_under_the_two_gradients(capsys, tmp_path):
    unmarked = tmp_path / "seed.grad"     # the spec's copy: no 'surrogate' marks
    unmarked.write_text((EXAMPLES / "seed.grad").read_text().replace("dx surrogate {", "dx {"))
    assert main(["explain", str(unmarked), "scaled_tanh"]) == 0
    out = capsys.readouterr().out
    true = out.index("the true derivative, for comparison")
    audit = out.index("\naudit of the custom rule against the true derivative (as gradc check):\n"
                      "  scaled: differs from d/dx by a factor 0.5 everywhere\n"
                      "    decided symbolically after simplification; confirmed numerically at 22 "
                      "points (6 of them edge points; shapes (5,) and (7,)) x 2 cotangents, "
                      "236 elements\n"
                      "  not marked surrogate: gradc check warns (W410) and fails\n")
    assert true < audit < out.index("kernel plan of forward")
    assert main(["explain", str(EXAMPLES / "seed.grad"), "clipped_relu"]) == 0
    out = capsys.readouterr().out
    assert "  clipped: equals the derivative where |dy| <= 1, the derivative clipped to " \
           "[-1, 1] elsewhere (marked surrogate: intended)\n" in out
    assert "gradc check warns" not in out
    assert main(["explain", str(EXAMPLES / "seed.grad"), "mlp"]) == 0   # no grad block
    assert "audit of the custom rule" not in capsys.readouterr().out


RESIDUALS = """op costly(x: f32[n, n], w: f32[n, n]) -> y {
    v = exp(sin(cos(x)))
    m = (v * 2) @ w
    y = m * v + x
}
op cheap(x: f32[n, n], w: f32[n, n]) -> y {
    v = exp(sin(x))
    m = (v * 2) @ w
    y = m * v + x
}
op newread(x: f32[n, n], w: f32[n, n]) -> y {
    v = exp(x)
    m = (v * 2) @ w
    y = m * v
}
"""


def _forward_plan(out: str) -> list[str]:
    return out.split("kernel plan of forward (fused, CPU)")[1].split("\n\n")[0].splitlines()


def test_explain_says_which_residuals_are_stored_and_recomputed_and_why(tmp_path, capsys):
    """v is stored by loop [0] for the matmul [1] (v * 2) and for loop [2]: loop [2]
    recomputes it when that is cheap and it reads x anyway (recompute_residuals)."""
    spec = tmp_path / "residuals.grad"
    spec.write_text(RESIDUALS)
    assert main(["explain", str(spec), "costly"]) == 0
    plan = _forward_plan(capsys.readouterr().out)
    assert "      stores t1 for [2] (too costly to recompute in [2]: 3 primitive(s), 3 of them " \
           "costly (transcendental, division...); at most 8, 2 costly)" in plan
    assert "      stores %6 for [1] ([1] is a library call (matmul), which reads it stored)" in plan
    assert main(["explain", str(spec), "cheap"]) == 0
    plan = _forward_plan(capsys.readouterr().out)
    assert "      recomputes %2, t1 from values it reads anyway (2 primitive(s): exp, sin): " \
           "cheaper than storing t1 and reading it back, per element 8 B at float32" in plan
    assert "      reads x; stores %5; 2 array(s) per element (8 B at float32)" \
        in plan                                   # loop [0] no longer stores v
    assert main(["explain", str(spec), "newread"]) == 0
    plan = _forward_plan(capsys.readouterr().out)
    assert "      stores t1 for [2] (recomputing it in [2] would read x, which [2] does not)" \
        in plan
    assert main(["explain", str(EXAMPLES / "seed.grad"), "mlp"]) == 0
    plan = _forward_plan(capsys.readouterr().out)
    assert "      stores %7 for [2] ([2] is a library call (matmul), which reads it stored)" in plan
    assert main(["explain", str(EXAMPLES / "seed.grad"), "scaled_tanh"]) == 0
    out = capsys.readouterr().out
    assert " for [" not in out.split("kernel plan of fwd_bwd (unfused)")[1]   # all stored



def test_explain_shows_reductions_fused_into_one_loop(capsys):
    assert main(["explain", str(EXAMPLES / "seed.grad"), "softmax_xent"]) == 0
    out = capsys.readouterr().out
    plan = out[out.index("kernel plan of fwd_bwd (fused, CPU)"):out.index("(unfused)")]
    assert "in rows of (o,), 3 pass(es) per row" in plan     # max, sum of exp, the gradient
    assert "reduces per row: sum, max, sum" in plan
    assert "reduces across rows: mean" in plan
    reads = next(line for line in plan.splitlines() if "reads " in line)
    assert all(name in reads for name in ("logits", "onehot", "dloss (scalar)")), reads
    assert "3 array(s) per element (12 B at float32" in plan


def test_explain_marks_centred_sums(capsys):
    """Layer norm's variance and its backward's mean(g * xhat) are centred sums: the
    fused fwd_bwd is two passes per row (docs/fusion.md)."""
    assert main(["explain", str(EXAMPLES / "rowwise.grad"), "layer_norm"]) == 0
    out = capsys.readouterr().out
    plan = out[out.index("kernel plan of fwd_bwd (fused, CPU)"):out.index("(unfused)")]
    assert "2 pass(es) per row" in plan
    assert "reduces per row: mean, mean, mean (centred), mean (centred)" in plan

def test_explain_counts_bytes_at_the_compute_dtypes_the_op_can_have(tmp_path, capsys):
    """An f64 parameter makes the op float64 only; f32 ones (no generic float) float32
    only; a generic one either (explain.compute_dtypes)."""
    spec = tmp_path / "d.grad"
    spec.write_text("op wide(x: f64) -> z {\n    z = tanh(x) * x\n}\n"
                    "op narrow(x: f32) -> z {\n    z = exp(x) * x\n}\n"
                    "op either(x) -> z {\n    z = exp(x) * x\n}\n")
    for op, want in [("wide", "(16 B at float64)"), ("narrow", "(8 B at float32)"),
                     ("either", "(8 B at float32, 16 B at float64)")]:
        assert main(["explain", str(spec), op]) == 0
        fused = capsys.readouterr().out.split("kernel plan of forward (fused, CPU)")[1]
        assert f"all kernels over shape(x): 2 array(s) per element {want}" in fused, fused
    from gradc.tools.explain import compute_dtypes
    from gradc.ir.lower import ParamInfo
    p = lambda dt, default=False: ParamInfo("p", dt, None, 0.5 if default else None,  # noqa: E731
                                            default, True)
    assert compute_dtypes([p("f32"), p("f64")]) == ("float64",)
    assert compute_dtypes([p("f16"), p("f32")]) == ("float32",)
    assert compute_dtypes([p("f32"), p(None, default=True)]) == ("float32",)  # weak scalar
    assert compute_dtypes([p("i32"), p("bool")]) == ("float64",)              # no floats


def test_explain_counts_bytes_per_element_of_each_kernel(capsys):
    """Every array input read and every output stored once per element, 4 B each at
    float32 and 8 B at float64; scalars (once per kernel) and inputs of one row's
    shape (a bias, "per column", as a row kernel says) are not counted per element;
    an input the wrapper broadcasts first is, and says so."""
    assert main(["explain", str(EXAMPLES / "seed.grad"), "scaled_tanh"]) == 0
    out = capsys.readouterr().out
    fused = out.split("kernel plan of fwd_bwd (fused, CPU)")[1].split("kernel plan")[0]
    assert "reads x, dy; stores y, grad_x; 4 array(s)" in fused   # outputs by name
    assert "; 4 array(s) per element (16 B at float32, 32 B at float64)" in fused
    assert "all kernels over shape(x): 4 array(s) per element (16 B at float32, 32 B at " \
           "float64)" in fused
    unfused = out.split("kernel plan of fwd_bwd (unfused)")[1]
    assert "all kernels over shape(x): 11 array(s) per element (44 B at float32, 88 B at " \
           "float64)" in unfused

    assert main(["explain", str(EXAMPLES / "activations.grad"), "leaky_relu"]) == 0
    out = capsys.readouterr().out
    fused = out.split("kernel plan of fwd_bwd (fused, CPU)")[1].split("kernel plan")[0]
    assert "reads x, alpha (scalar), dy; stores y, grad_x" in fused   # alpha: a 0-d parameter
    assert "; 4 array(s) per element (16 B at float32, 32 B at float64)" in fused

    assert main(["explain", str(EXAMPLES / "seed.grad"), "mlp"]) == 0
    out = capsys.readouterr().out
    fused = out.split("kernel plan of forward (fused, CPU)")[1].split("kernel plan")[0]
    # mlp's parameters are all f32[...]: it computes in float32 only
    assert "reads b1 (per column), %5; stores %7; 2 array(s) per element (8 B at float32)" \
        in fused
    assert "all kernels over (b, h): 2 array(s) per element" in fused
    assert "all kernels over (b, o): 2 array(s) per element" in fused


def test_explain_names_inputs_by_how_each_kernel_reads_them(tmp_path, capsys):
    """A bias ``b: [k]`` is "per column" in an elementwise kernel and in a row kernel
    alike (it was "per row" in the first); a per-row ``s: [n, 1]`` is "per row" (a loop
    over rows, reductions or not); ``c: [1, k]`` is "per column" as ``b`` (it was broadcast
    first, copied to the loop's size); without declared shapes an input is broadcast first
    unless at run time it holds one row (``_g_broadcast_rows``)."""
    (tmp_path / "bias.grad").write_text("op ab(x: [n, k], b: [k]) -> y { y = tanh(x) * b }\n"
                                        "op ar(x: [n, k], s: [n, 1]) -> y { y = tanh(x) * s }\n"
                                        "op ac(x: [n, k], c: [1, k]) -> y { y = tanh(x) * c }\n")
    plans = {}
    for op in ("ab", "ar", "ac"):
        assert main(["explain", str(tmp_path / "bias.grad"), op]) == 0
        out = capsys.readouterr().out
        plans[op] = {m: out.split(f"kernel plan of {m} (fused, CPU)")[1].split("kernel plan")[0]
                     for m in ("forward", "fwd_bwd")}
    assert "reads x, b (per column); stores y; 2 array(s) per element" in plans["ab"]["forward"]
    assert "reads x, b (per column), dy; stores" in plans["ab"]["fwd_bwd"]
    assert "reads x, s (per row); stores y; 2 array(s) per element" in plans["ar"]["forward"]
    assert "reads x, c (per column); stores y; 2 array(s) per element" in plans["ac"]["forward"]
    assert "reads x, s (per row), dy; stores y, grad_s (per row), grad_x; 4 array(s)" in \
        plans["ar"]["fwd_bwd"]
    (tmp_path / "dyn.grad").write_text("op ad(x, b) -> y { y = tanh(x) * b }\n")
    assert main(["explain", str(tmp_path / "dyn.grad"), "ad"]) == 0
    assert "b (broadcast to broadcast(shape(x), shape(b)) first unless it holds one row)" in \
        capsys.readouterr().out


def _ir_section(out: str, op: str, method: str) -> list[str]:
    """The node lines and return line of one method in ``--emit ir`` output."""
    block = out.split(f"\nop {op}(")[1].split("\nop ")[0]
    lines = block.split(f"\n  {method} (")[1].splitlines()[1:]
    end = next(k for k, l in enumerate(lines) if l.strip().startswith("return "))
    return lines[:end + 1]


def test_compile_emit_ir_prints_the_optimised_graphs(tmp_path, capsys):
    spec = tmp_path / "seed.grad"
    spec.write_text((EXAMPLES / "seed.grad").read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["compile", str(spec), "--emit", "ir"]) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [spec]                  # no module written
    for op in ("custom_linear", "sign_ste", "clipped_relu", "scaled_tanh", "mlp",
               "softmax_xent", "critic", "gradient_penalty"):
        assert f"\nop {op}(" in out
        for m in ("forward", "vjp", "fwd_bwd"):
            assert _ir_section(out, op, m)
    # One node per line: id, op(args), dtype and shape, source line.
    fb = _ir_section(out, "scaled_tanh", "fwd_bwd")
    tanh = [l for l in fb if "= tanh(" in l]
    assert len(tanh) == 1                    # the gradient reuses the forward's tanh
    tid = tanh[0].split("=")[0].strip()
    assert tanh[0].split() == [tid, "=", "tanh(%0)", "T", "shape(x)", "#", "seed.grad:34"]
    assert any(f"= square({tid})" in l for l in fb)
    assert fb[0].split()[:4] == ["%0", "=", "param", "x"]
    assert fb[-1].strip().startswith(f"return y = {tid}, grad_x = %")
    assert _ir_section(out, "scaled_tanh", "vjp")[-1].strip().startswith("return grad_x = %")
    mlp = _ir_section(out, "mlp", "forward")
    assert any(l.split()[2:6] == ["param", "b1", "T", "(h,)"] for l in mlp)
    assert any("matmul(%0, %1)  T (b, h)  # seed.grad:43" in l for l in mlp)


def test_compile_emit_ir_one_op(capsys):
    assert main(["compile", str(EXAMPLES / "activations.grad"), "--emit", "ir",
                 "--op", "leaky_relu"]) == 0
    out = capsys.readouterr().out
    assert "\nop leaky_relu(" in out and "\nop swish(" not in out
    assert out.count("\n  forward (") == 1
    assert any(l.split()[:6] == ["%1", "=", "param", "alpha", "T", "()"]
               for l in _ir_section(out, "leaky_relu", "forward"))


def test_compile_emit_bad_uses(tmp_path, capsys):
    seed = str(EXAMPLES / "seed.grad")
    assert main(["compile", seed, "--emit", "ir", "--op", "nope"]) == 1
    assert "no op 'nope' in" in capsys.readouterr().err
    assert main(["compile", seed, "--emit", "ir", "-o", str(tmp_path / "x.py")]) == 2
    assert "--emit ir prints the IR to stdout" in capsys.readouterr().err
    assert main(["compile", seed, "--op", "mlp", "-o", str(tmp_path / "x.py")]) == 2
    assert "--op selects ops for --emit ir only" in capsys.readouterr().err
    assert not (tmp_path / "x.py").exists()


def test_explain_unknown_op(capsys):
    assert main(["explain", str(EXAMPLES / "seed.grad"), "nope"]) == 1
    assert "no op 'nope'" in capsys.readouterr().err


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "gradc", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "compile" in r.stdout


@pytest.mark.parametrize("target", ["cuda", "all"])
def test_compile_target_cuda_writes_cuda_methods(tmp_path, target):
    """--target cuda|all: the module imports numba.cuda, lists its CUDA kernels, and
    (cuda only) leaves out the CPU kernels; writing it needs no GPU."""
    out = tmp_path / f"seed_{target}.py"
    assert main(["compile", str(EXAMPLES / "seed.grad"), "-o", str(out),
                 "--target", target]) == 0
    text = out.read_text(encoding="utf-8")
    assert "from numba import cuda\n" in text and "CUDA_KERNELS = {" in text
    assert f"TARGET = {target!r}" in text
    # CPU kernels (_gk_*, a row plan's _grk*): the run time's helpers are in both
    assert bool(re.search(r"^def _(gk|grk\d+)_", text, re.M)) == (target == "all")
    assert "@cuda.jit(cache=not _GC_SIM)\ndef _gck_scaled_tanh_fwd_bwd_0(" in text


def test_compile_target_cpu_writes_no_cuda(tmp_path):
    out = tmp_path / "seed_cpu.py"
    assert main(["compile", str(EXAMPLES / "seed.grad"), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "cuda" not in "".join(l for l in text.splitlines() if l.startswith(("import", "from")))
    assert "@cuda.jit" not in text and "TARGET = 'cpu'" in text


def test_a_bad_cuda_unroll_setting_is_a_user_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADC_CUDA_UNROLL", "abc")
    assert main(["compile", str(EXAMPLES / "seed.grad"), "-o", str(tmp_path / "x.py"),
                 "--target", "all"]) == 1
    assert "GRADC_CUDA_UNROLL must be an integer from 1 to 8, got 'abc'" in capsys.readouterr().err


def test_check_finds_shapes_for_undeclared_parameters(tmp_path, capsys):
    """Parameters without a declared shape are tried as a vector, a matrix, a scalar,
    a 3-D array: the first the op accepts (a fresh user's crash report)."""
    path = tmp_path / "shapes.grad"
    path.write_text("op t(a: f64[b, n], tau) -> y { y = sum(a / tau) }\n"
                    "op s(x) -> y { y = sum(x, axis=(0, -1)) }\n"
                    "op s2(x) -> y { y = sum(x, axis=1) }\n")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("ok   ") == 3
    path.write_text("op s3(x) -> y { y = sum(x, axis=5) }\n")
    assert main(["check", str(path)]) == 1
    assert "no input shapes tried fit the op" in capsys.readouterr().out


def test_check_fits_shapes_to_custom_rules_and_labels(tmp_path, capsys):
    """Undeclared shapes that the custom VJP accepts too (layer norm's ``db =
    sum(dy, axis=0)`` needs a matrix ``x`` and vector ``b``: it was an internal error),
    and integer labels in range at every point drawn, not only the first."""
    assert main(["check", str(EXAMPLES / "rowwise.grad")]) == 0, capsys.readouterr().out
    path = tmp_path / "labels.grad"
    path.write_text("op xent(logits, labels: i64) -> loss {\n"
                    "    picked = take_along_axis(logits, expand_dims(labels, -1), axis=-1)\n"
                    "    loss = mean(logsumexp(logits, axis=-1, keepdims=true) - picked)\n"
                    "} grad(dl) -> dx {\n"
                    "    dx = dl * (softmax(logits, axis=-1) - one_hot(labels, 5)) / 4\n}\n")
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    assert "audit of the custom rule: exact" in capsys.readouterr().out


def test_check_says_why_a_straight_through_estimator_fails(tmp_path, capsys):
    """stop_gradient in the forward (the straight-through idiom) gives a gradient that
    is not the derivative: the check fails and names the user's stop_gradient (not the
    one inside softmax) and the way to have it audited."""
    path = tmp_path / "ste.grad"
    path.write_text("op st_argmax(x: [n, k]) -> y {\n"
                    "    s = softmax(x, axis=-1)\n"
                    "    y = one_hot(argmax(x, axis=-1), k) - stop_gradient(s) + s\n}\n")
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "the forward uses stop_gradient (line 3, column 42)" in out
    assert "grad block marked surrogate" in out


def test_check_leaves_out_an_output_written_as_stop_gradient(tmp_path, capsys):
    """A batch norm's running mean, ``stop_gradient(...)`` as a whole, is not
    differentiable by declaration (PyTorch's ``mark_non_differentiable``): the check
    gives it a zero cotangent and says so (it failed on the value's finite differences);
    the same output without stop_gradient is checked and passes."""
    body = ("op bn(x, w, rm: nograd, momentum: nograd = 0.1) -> (y, rm_new) {{\n"
            "    mu = mean(x, axis=0, keepdims=true)\n"
            "    y = (x - mu) * rsqrt(mean((x - mu)^2, axis=0, keepdims=true) + 1e-5) * w\n"
            "    rm_new = {}((1 - momentum) * rm + momentum * mean(x, axis=0))\n}}\n")
    path = tmp_path / "bn.grad"
    path.write_text(body.format("stop_gradient"))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    assert "left out: rm_new, written as stop_gradient" in capsys.readouterr().out
    assert main(["check", str(path), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["ops"][0]["not_differentiated"] == ["rm_new"]
    path.write_text(body.format(""))
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    assert "left out" not in capsys.readouterr().out
    # stop_gradient inside an output is still a surrogate that the check fails
    path.write_text(body.format("").replace("* rm +", "* stop_gradient(rm * x[0]) +"))
    assert main(["check", str(path)]) == 1
    assert "the forward uses stop_gradient" in capsys.readouterr().out


def test_unknown_op_names_are_errors_with_a_near_miss(capsys) -> None:
    """explain, bench and --emit ir refuse an op the file does not define (bench used
    to print an empty report and exit 0), naming the likely one."""
    seed = str(EXAMPLES / "seed.grad")
    for argv in (["explain", seed, "Scaled_Tanh"], ["bench", seed, "--ops", "scaled_tanhh",
                                                     "--n", "100"],
                 ["compile", seed, "--emit", "ir", "--op", "scaled_tanhh"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "error[E201]: no op" in err and "did you mean 'scaled_tanh'?" in err, err


def test_explain_prints_a_passed_through_parameter_by_name(tmp_path, capsys) -> None:
    f = tmp_path / "rev.grad"
    f.write_text("op reverse(x) -> y {\n    y = x\n} grad(dy) -> dx surrogate {\n"
                 "    dx = -dy\n}\n")
    assert main(["explain", str(f), "reverse"]) == 0
    out = capsys.readouterr().out
    true = out.split("the true derivative, for comparison (grad block ignored):\n")[1]
    assert true.splitlines()[0] == "  grad_x = dy"


def test_check_says_checked_only_after_compiling(tmp_path, capsys) -> None:
    """A shape error is reported without a 'checked' line before it (it printed
    'parsed and checked, 1 ops', then E301)."""
    f = tmp_path / "shapes.grad"
    f.write_text("op f(x: f64[3], w: f64[4]) -> y {\n    y = x * w\n}\n")
    assert main(["check", str(f)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "error[E301]" in err


def test_explain_prints_the_gradient_without_its_nan_guards(tmp_path, capsys) -> None:
    """Reverse mode's zero-cotangent masks print apart, not as
    ``where((dy == 0) * (t2 != t2), 0, t2)`` inside the math; the unfused plan is a
    summary after the fused plans."""
    f = tmp_path / "softsign.grad"
    f.write_text("op softsign(x) -> y {\n    y = x / (1 + abs(x))\n}\n")
    assert main(["explain", str(f), "softsign"]) == 0
    out = capsys.readouterr().out
    gradient = out.split("\n\n")[1]
    assert gradient.splitlines()[1:] == ["  t1 = 1 + abs(x)",
                                         "  grad_x = dy / t1 + -dy * x / t1 / t1 * sign(x)"]
    assert "  dy / t1 is 0 where dy is 0\n  -dy * x / t1 / t1 is 0 where dy is 0" in out
    assert out.index("(fused, CPU)") < out.index("(unfused)")
    unfused = out.split("kernel plan of fwd_bwd (unfused)")[1]
    assert "[0]" not in unfused and "all kernels over shape(x)" in unfused


def test_check_json_of_a_file_that_does_not_compile_has_its_errors(tmp_path, capsys):
    """A CI that reads --json gets a report when the file does not compile too (it got
    nothing): passed false, no ops, each error with its position; the text on stderr."""
    path = tmp_path / "bad.grad"
    path.write_text("op f(x) -> y {\n    y = tanhh(x) + zz\n}\n")
    assert main(["check", str(path), "--json", "-"]) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["passed"] is False and report["ops"] == []
    assert [(e["code"], e["line"], e["column"]) for e in report["errors"]] == [
        ("E201", 2, 9), ("E201", 2, 20)]
    assert report["errors"][0]["message"] == "unknown function 'tanhh'"
    assert "bad.grad:2:9: error[E201]: unknown function 'tanhh'" in err


def test_check_shows_the_compilers_warnings(tmp_path, capsys):
    """check shows what compile warns of (W301's max(x, -1) passed as 'ok' without a
    word: found by helper 73), on stderr, and in the JSON; a warning fails nothing."""
    path = tmp_path / "w.grad"
    path.write_text("op w301(x) -> y {\n    y = max(x, -1)\n}\n")
    assert main(["check", str(path), "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert "w.grad:2:9: warning[W301]: 'max' of two arguments is elementwise" in err
    (op,) = json.loads(out)["ops"]
    assert op["passed"] and [(w["code"], w["line"], w["column"]) for w in op["warnings"]] \
        == [("W301", 2, 9)]


def test_explain_prints_one_hot_as_written(tmp_path, capsys):
    """one_hot is compared in the loop (its decomposition), but explain's math prints
    it as written; an arange compared by hand stays as it is."""
    (tmp_path / "oh.grad").write_text(
        "op a(x: [n, k], t: i64[n]) -> y { y = sum(one_hot(t, k) * x) }\n"
        "op b(x: [n, k], t: i64[n]) -> y { y = sum((expand_dims(t, axis=-1) == arange(1, k))"
        " * x) }\n")
    assert main(["explain", str(tmp_path / "oh.grad"), "a"]) == 0
    assert "  t1 = one_hot(t, k)\n" in capsys.readouterr().out
    assert main(["explain", str(tmp_path / "oh.grad"), "b"]) == 0
    out = capsys.readouterr().out
    assert "one_hot" not in out and "arange(start=1, step=1, stop=k)" in out


def test_a_file_without_an_op_compiles_with_a_warning(tmp_path, capsys):
    """An empty file, or one of imports only, compiles to a module without ops and says
    so (W101; the imported file's ops are not the module's); a file with an op does not."""
    (tmp_path / "lib.grad").write_text("op f(x) -> y { y = x * 2 }\n")
    for name, text in [("empty.grad", ""), ("comments.grad", "# nothing yet\n"),
                       ("imports.grad", 'import "lib.grad"\n')]:
        (tmp_path / name).write_text(text)
        assert main(["compile", str(tmp_path / name), "-o", str(tmp_path / "m.py")]) == 0
        err = capsys.readouterr().err
        assert f"{name}:1:1: warning[W101]: {name} defines no op: the module has none" in err
    with pytest.warns(gradc.GradcWarning, match="W101"):
        gradc.compile_source("", file="e.grad")
    assert main(["compile", str(tmp_path / "lib.grad"), "-o", str(tmp_path / "m.py")]) == 0
    assert "W101" not in capsys.readouterr().err
