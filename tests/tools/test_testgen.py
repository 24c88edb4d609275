"""``gradc testgen``: the generated pytest file passes on the example files, fails on
broken gradients, and is deterministic."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradc
from gradc.tools.cli import main
from gradc.tools.testgen import write_tests

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROOT = EXAMPLES.parent


def run_pytest(test_file: Path, *options: str) -> tuple[int, str]:
    """pytest on one file in a subprocess (gradc from this checkout, the session's cache),
    with pytest's ``options`` (``-k`` ...)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-p", "no:randomly", *options, str(test_file)],
                          cwd=test_file.parent, env=env, capture_output=True, text=True,
                          timeout=1200)
    return proc.returncode, proc.stdout + proc.stderr


def tables(text: str) -> dict:
    """The generated file's module-level tables (literals), by name."""
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and node.targets[0].id.isupper():
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:            # FLOAT, INT: NumPy dtypes
                pass
    return out


# Tests per op: vjp against fwd_bwd 1, finite differences 1 (derived gradients) or
# linearity 1 (custom rules with a jvp), fused against unfused 3 or 4 (with a jvp),
# adjoint identity 1 (with a jvp), Python float 1 (generic elementwise ops of one
# parameter), dtypes 2 (generic) or 1 (declared), wrong dtype 1.
# activations: 6 generic elementwise ops x 11 + add_bias 9 = 75; seed: custom_linear and
# clipped_relu 8 (no jvp), sign_ste and scaled_tanh 11, mlp, softmax_xent, critic and
# gradient_penalty 9 = 74; wgan_gp: 4 ops with declared shapes x 9 = 36.
EXPECTED = {"activations.grad": 75, "seed.grad": 74, "wgan_gp.grad": 36}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED))
def test_generated_tests_pass_on_the_examples(tmp_path, name) -> None:
    out = tmp_path / "ci" / f"test_{Path(name).stem}.py"
    out.parent.mkdir()
    assert main(["testgen", str(EXAMPLES / name), "-o", str(out)]) == 0
    rc, log = run_pytest(out)
    assert rc == 0, log
    assert re.search(rf"^{EXPECTED[name]} passed", log, re.M) and "skipped" not in log, log


DROPOUT = """op dropout(x, p: nograd = 0.5) -> y {
    keep = random_uniform_like(x) >= p
    y = where(keep, x / (1 - p), 0)
}
"""


def test_an_op_that_draws_is_called_with_one_seed(tmp_path) -> None:
    """An op that draws random numbers is called with a seed of its own in every test
    (without one, each call drew another mask: finite differences, fused against
    unfused and vjp against fwd_bwd compared different masks and failed, 8 of 10)."""
    src = tmp_path / "drop.grad"
    src.write_text(DROPOUT, encoding="utf-8")
    out = tmp_path / "test_drop.py"
    assert main(["testgen", str(src), "-o", str(out)]) == 0
    assert tables(out.read_text(encoding="utf-8"))["CASES"]["dropout"]["draws"] is True
    rc, log = run_pytest(out)
    assert rc == 0 and re.search(r"^10 passed", log, re.M), log


def test_what_the_seed_file_tests(tmp_path, capsys) -> None:
    out = tmp_path / "test_seed.py"
    assert main(["testgen", str(EXAMPLES / "seed.grad"), "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: 74 tests (run: python -m pytest {out})\n"
    text = out.read_text()
    t = tables(text)
    rel = Path(os.path.relpath(EXAMPLES / "seed.grad", tmp_path)).as_posix()
    assert f"GRAD_FILE = Path(__file__).resolve().parent / {rel!r}\n" in text
    assert t["FINITE_DIFFERENCES"] == ["softmax_xent", "critic", "gradient_penalty"]
    assert list(t["CUSTOM"]) == ["custom_linear", "sign_ste", "clipped_relu", "scaled_tanh",
                                 "mlp"]
    assert t["CUSTOM"]["sign_ste"] == "the derivative is 0, the rule is not"
    assert t["CUSTOM"]["scaled_tanh"] == "relative difference to the derivative up to 0.5"
    assert t["LINEAR_CUSTOM"] == ["sign_ste", "scaled_tanh", "mlp"]     # those with a jvp
    assert ("custom_linear", "jvp") not in t["METHODS"] and ("mlp", "jvp") in t["METHODS"]
    assert t["CASES"]["mlp"]["params"][:2] == [("x", (2, 3), "f32", True),
                                               ("w1", (3, 4), "f32", True)]
    assert t["CASES"]["softmax_xent"]["params"][1] == ("onehot", (2, 3), "f32", False)
    assert ("mlp", "declared") in t["DTYPES"] and ("scaled_tanh", "float32") in t["DTYPES"]
    assert t["SCALAR"] == ["custom_linear", "sign_ste", "clipped_relu", "scaled_tanh"]
    assert "def test_broadcast_argument" not in text     # no op of seed.grad allows one
    compile(text, str(out), "exec")


def test_the_file_is_deterministic(tmp_path) -> None:
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a, _ = write_tests(EXAMPLES / "activations.grad", tmp_path / "a" / "test_a.py")
    b, _ = write_tests(EXAMPLES / "activations.grad", tmp_path / "b" / "test_a.py")
    assert a.read_bytes() == b.read_bytes().replace(b"/b/test_a.py", b"/a/test_a.py")
    c, _ = write_tests(EXAMPLES / "activations.grad", tmp_path / "test_a.py")
    diff = [(x, y) for x, y in zip(a.read_text().splitlines(), c.read_text().splitlines())
            if x != y]
    assert [x.split(" / ")[0] for x, _ in diff] == [   # the command to regenerate it as given
        f"    gradc testgen {(EXAMPLES / 'activations.grad').as_posix()} -o {a.as_posix()}",
        "GRAD_FILE = Path(__file__).resolve().parent"]


MUTANT = """
op wave(x, s) -> y {
    y = sin(x) * s
}
op soft(x) -> y {
    y = tanh(x)
} grad(dy) -> dx {
    dx = dy * (1 - y^2)
}
"""


@pytest.fixture(scope="module")
def mutant(tmp_path_factory) -> Path:
    """MUTANT at one path for the tests that run its generated tests: gradc's cache
    key holds the file's path, so its module (and Numba's kernels beside it, in the
    run's cache) is compiled once for them, not once per test's folder."""
    spec = tmp_path_factory.mktemp("mutant") / "ops.grad"
    spec.write_text(MUTANT)
    return spec


@pytest.mark.slow
def test_generated_tests_fail_on_a_broken_gradient(mutant, tmp_path) -> None:
    """Tests generated for correct ops (a derived gradient; a custom rule that is the
    derivative, so finite differences apply) fail once the gradients are wrong (the
    same file, its GRAD_FILE pointed at the broken ops; its finite-difference tests,
    the ones that must fail: the others compare the broken ops' methods with each
    other, which agree, and only compiled every kernel of the broken ops, ~9 s)."""
    out, n = write_tests(mutant, tmp_path / "test_ops.py")
    t = tables(out.read_text())
    assert t["FINITE_DIFFERENCES"] == ["wave", "soft"] and not t["CUSTOM"]
    assert t["BROADCAST"] == [("wave", "x", ()), ("wave", "s", ())]
    rc, log = run_pytest(out)
    assert rc == 0 and re.search(rf"^{n} passed", log, re.M), log
    # The same ops with wrong gradients: wave's rule misses a factor, soft's is halved.
    text, pointer = out.read_text(), re.compile(r"^GRAD_FILE = .*$", re.M)
    assert len(pointer.findall(text)) == 1
    out.write_text(pointer.sub("GRAD_FILE = Path(__file__).resolve().parent / 'ops.grad'",
                               text))
    spec = tmp_path / "ops.grad"
    spec.write_text(MUTANT.replace("y = sin(x) * s\n}", "y = sin(x) * s\n} grad(dy) -> "
                                   "(dx, ds) {\n    dx = dy * cos(x)\n    ds = dy * sin(x)\n}")
                    .replace("dx = dy * (1 - y^2)", "dx = 0.5 * dy * (1 - y^2)"))
    rc, log = run_pytest(out, "-k", "test_vjp_matches_finite_differences")
    failed = sorted(re.findall(r"^FAILED test_ops.py::(\S+)", log, re.M))
    assert rc == 1 and failed == ["test_vjp_matches_finite_differences[soft]",
                                  "test_vjp_matches_finite_differences[wave]"], log



def test_an_unmarked_wrong_rule_gets_the_finite_difference_test(tmp_path) -> None:
    """A custom rule that differs from the derivative is exempt from finite
    differences only when its block is marked 'surrogate'; an unmarked one gets the
    test (which then fails, as gradc check does) and a W410 warning when generated."""
    from gradc.errors import GradcWarning
    spec = tmp_path / "ops.grad"
    wrong = MUTANT.replace("dx = dy * (1 - y^2)", "dx = 0.5 * dy * (1 - y^2)")
    spec.write_text(wrong)
    with pytest.warns(GradcWarning, match=r"op 'soft': its custom gradient differs .* "
                                          r"not marked 'surrogate'"):
        out, _ = write_tests(spec, tmp_path / "test_ops.py")
    t = tables(out.read_text())
    assert t["FINITE_DIFFERENCES"] == ["wave", "soft"] and not t["CUSTOM"]
    spec.write_text(wrong.replace("grad(dy) -> dx {", "grad(dy) -> dx surrogate {"))
    out, _ = write_tests(spec, tmp_path / "test_ops.py")
    t = tables(out.read_text())
    assert t["FINITE_DIFFERENCES"] == ["wave"] and list(t["CUSTOM"]) == ["soft"]


def test_w410_of_an_op_without_a_rule_names_the_op_whose_rule_it_is(tmp_path) -> None:
    """An op with no grad block of its own, whose gradient goes through another op's
    unmarked wrong rule: its W410 says whose block to mark."""
    import warnings

    from gradc.errors import GradcWarning
    spec = tmp_path / "ops.grad"
    spec.write_text(MUTANT.replace("dx = dy * (1 - y^2)", "dx = 0.5 * dy * (1 - y^2)")
                    + "op twice(x) -> z {\n    z = soft(x) * 2\n}\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", GradcWarning)
        write_tests(spec, tmp_path / "test_ops.py")
    twice, = [w.message for w in seen if "op 'twice'" in w.message.message]
    assert "goes through the custom gradient of 'soft', which differs" in twice.message
    assert "mark the grad block of 'soft'" in " ".join(twice.notes)

@pytest.mark.slow
def test_generated_tests_fail_on_a_broken_method(mutant, tmp_path) -> None:
    """A module whose jvp is off by 0.1 % and whose unfused forward is too (gradc.load
    patched by a conftest.py beside the tests) fails the adjoint and fused-vs-unfused
    tests, and only those."""
    out, _ = write_tests(mutant, tmp_path / "test_ops.py")
    (tmp_path / "conftest.py").write_text('''
import gradc


class Delegate:
    def __init__(self, op):
        self.op = op

    def __getattr__(self, name):
        return getattr(self.op, name)

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)


class WrongJvp(Delegate):
    def jvp(self, *args):
        y, t = self.op.jvp(*args)
        return y, t * 1.001


class WrongForward(Delegate):
    def __call__(self, *args):
        return self.op(*args) * 1.001


real_load = gradc.load


def load(path):
    module = real_load(path)
    soft = WrongJvp(module.OPS["soft"])
    soft.unfused = WrongForward(module.OPS["soft"].unfused)
    return type("Module", (), {"OPS": dict(module.OPS, soft=soft)})


gradc.load = load
''')
    rc, log = run_pytest(out)
    failed = sorted(re.findall(r"^FAILED test_ops.py::(\S+)", log, re.M))
    assert rc == 1 and failed == ["test_adjoint_identity[soft]",
                                  "test_fused_matches_unfused[soft-forward]",
                                  "test_fused_matches_unfused[soft-jvp]"], log


def test_errors(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.grad"
    bad.write_text("op f(x) -> y { y = q }\n")
    assert main(["testgen", str(EXAMPLES / "activations.grad"), "-o", str(tmp_path / "ci.py")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "note: pytest collects test_*.py and *_test.py files by default; name it so to have it "
        "run with the rest of your tests")
    assert main(["testgen", str(bad), "-o", str(tmp_path / "t.py")]) == 1
    assert "bad.grad:1:20: error[E201]: undefined name 'q'" in capsys.readouterr().err
    assert not (tmp_path / "t.py").exists()
    assert main(["testgen", str(tmp_path / "none.grad"), "-o", str(tmp_path / "t.py")]) == 1
    with pytest.raises(SystemExit):
        main(["testgen", str(bad)])                       # -o is required
    assert gradc.__version__ in write_tests(EXAMPLES / "activations.grad",
                                            tmp_path / "t.py")[0].read_text().splitlines()[0]


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_seed_avoids_kinks(tmp_path) -> None:
    """A ReLU of 300 float32 elements: at the finite-difference step of float32, the
    points of seeds 0 and 1 have an element within a step of the kink; the file uses
    seed 2, at which the test passes, and would fail at seed 0."""
    spec = tmp_path / "ramp.grad"
    spec.write_text("op ramp(x: f32[300]) -> y { y = 3 * max(x, 0) }\n")
    out, _ = write_tests(spec, tmp_path / "test_ramp.py")
    generated = _import(out)
    assert generated.CASES["ramp"]["seed"] == 2
    ops = gradc.load(spec)
    generated.test_vjp_matches_finite_differences(ops, "ramp")
    generated.CASES["ramp"]["seed"] = 0
    with pytest.raises(AssertionError):
        generated.test_vjp_matches_finite_differences(ops, "ramp")


def test_an_op_without_a_finite_difference_test_is_warned_of_with_why(tmp_path) -> None:
    """An op whose values are NaN at every point drawn (outside its domain) or whose
    finite differences cross a kink at every seed loses its finite-difference test:
    a warning says so, and why (not "a kink" for a NaN); the file's regenerate
    command names the output as given."""
    spec = tmp_path / "nan.grad"
    spec.write_text("op lg(x) -> y { y = log(x - 3) }\n"
                    "op kink(x) -> y { y = x * floor(1000000 * x) }\n")
    (tmp_path / "tests").mkdir()
    with pytest.warns(gradc.GradcWarning) as got:
        out, _ = write_tests(spec, tmp_path / "tests" / "test_nan.py")
    said = sorted(str(w.message) for w in got)
    assert re.search(r"op 'kink' gets no finite-difference test: finite differences "
                     r"crossed a kink at all 10 points", said[0]), said
    assert re.search(r"op 'lg' gets no finite-difference test: its values or gradients "
                     r"are NaN or inf at all 10 points tried \(floats drawn from \[0.5, 2\]",
                     said[1]), said
    text = out.read_text()
    assert tables(text)["FINITE_DIFFERENCES"] == []
    assert f"-o {(tmp_path / 'tests' / 'test_nan.py').as_posix()}" in text


@pytest.mark.parametrize("name, op", [("seed.grad", "gradient_penalty"),
                                      ("activations.grad", "huber"),
                                      ("wgan_gp.grad", "critic_loss"),
                                      ("kernels/cross_entropy.grad", "cross_entropy")])
def test_the_generator_draws_what_the_file_draws(tmp_path, name, op) -> None:
    """The generator chooses seeds on the inputs the file's make_inputs draws."""
    from gradc.frontend.check import load_program
    from gradc.pipeline import build_op
    from gradc.tools.testgen import drawn_inputs, plan_program
    out, _ = write_tests(EXAMPLES / name, tmp_path / "test_x.py")
    generated = _import(out)
    program = load_program(EXAMPLES / name)
    cop = build_op(program.ops[op], program.ops, program.consts)
    plan = next(p for p in plan_program(EXAMPLES / name)[0] if p.name == op)
    ours = [x for x, p in zip(drawn_inputs(cop, plan, plan.seed), cop.params)
            if not p.has_default]
    theirs = generated.make_inputs(op)
    assert [x.shape for x in ours] == [x.shape for x in theirs]
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, np.asarray(b, np.float64))


def test_masks_are_drawn_with_both_values_by_the_generator_and_the_file(tmp_path) -> None:
    """A bool input of two elements or more holds both values (gradcheck.draw_mask), in
    the generator's draw and the file's alike, so a where(mask, ...) is never tested at
    one branch alone."""
    from gradc.frontend.check import load_program
    from gradc.pipeline import build_op
    from gradc.tools.testgen import drawn_inputs, plan_program
    spec = tmp_path / "masked.grad"
    spec.write_text("op masked(x: [n], mask: bool[n]) -> y {\n"
                    "    y = sum(where(mask, x * x, 0))\n}\n")
    out, _ = write_tests(spec, tmp_path / "test_masked.py")
    generated = _import(out)
    program = load_program(spec)
    cop = build_op(program.ops["masked"], program.ops, program.consts)
    plan = plan_program(spec)[0][0]
    ours = drawn_inputs(cop, plan, plan.seed)
    theirs = generated.make_inputs("masked")
    np.testing.assert_array_equal(ours[1], theirs[1])
    assert theirs[1].any() and not theirs[1].all()


def test_an_op_without_tests_is_named_in_a_warning(tmp_path) -> None:
    """A custom rule that fails at a matrix where its forward pass runs gets no tests
    (a vector would hide its dropped dim): gradc testgen says so, not only a comment."""
    spec = tmp_path / "rows.grad"
    spec.write_text("op lse(x) -> y {\n    y = logsumexp(x, axis=-1)\n} grad(dy) -> dx {\n"
                    "    dx = dy * softmax(x, axis=-1)\n}\n"
                    "op ok(x) -> y { y = tanh(x) }\n")
    with pytest.warns(gradc.GradcWarning, match=r"op 'lse' gets no tests: the custom rule "
                      r"fails at x \(4, 5\), where the forward pass runs"):
        out, n = write_tests(spec, tmp_path / "test_rows.py")
    assert "#   lse: the custom rule fails at x (4, 5)" in out.read_text() and n > 0


GATHER_ONE_HOT = """op cg(x: [n, k], l: i64[n]) -> y {
    y = x[arange(n), l]
} grad(dy) -> dx {
    dx = one_hot(l, k) * expand_dims(dy, -1)
}
"""


def test_labels_are_drawn_where_every_use_takes_them(tmp_path) -> None:
    """The gather takes a label from the end (-1), the rule's one_hot refuses it: the
    file draws labels in [0, k) = [0, 2] for the k = 3 columns, where gradc check
    draws them (from [0, 1], widened while the op takes them), and its tests pass
    (testgen drew [-3, 3] and stopped with an internal error)."""
    spec = tmp_path / "cg.grad"
    spec.write_text(GATHER_ONE_HOT)
    out = tmp_path / "test_cg.py"
    assert main(["testgen", str(spec), "-o", str(out)]) == 0
    case = tables(out.read_text())["CASES"]["cg"]
    assert case["ints"] == (0, 3) and case["params"][1] == ("l", (2,), "i64", False)
    assert case["params"][0][1] == (2, 3)                 # x: k = 3
    rc, log = run_pytest(out)
    assert rc == 0 and re.search(r"^10 passed", log, re.M) and "skipped" not in log, log


def test_an_op_that_raises_while_probed_is_left_out_with_why(tmp_path, monkeypatch) -> None:
    """An error of the op while testgen runs it (in the interpreter) is a warning that
    names the op and the error, and the op gets no tests; not an internal error."""
    import gradc.tools.testgen as testgen

    holds = testgen._differences_miss

    def refuses(cop, plan, seed):
        if plan.name == "cg":
            raise IndexError("one_hot: index -1 is out of range for depth 3")
        return holds(cop, plan, seed)

    monkeypatch.setattr(testgen, "_differences_miss", refuses)
    spec = tmp_path / "cg.grad"
    spec.write_text(GATHER_ONE_HOT + "op ok(x) -> y { y = tanh(x) }\n")
    with pytest.warns(gradc.GradcWarning, match=r"op 'cg' gets no tests: the op raised "
                      r"IndexError at the inputs the tests would draw: one_hot: index -1"):
        out, n = write_tests(spec, tmp_path / "test_cg.py")
    assert "#   cg: the op raised IndexError" in out.read_text() and n > 0
