"""The custom-gradient audit (gradc/audit/custom_rules.py): each grad block against the derivative."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradc.audit.custom_rules import audit_program
from gradc.frontend.check import check_source, load_program
from gradc.tools.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def seed():
    return {a.op: a for a in audit_program(load_program(str(EXAMPLES / "seed.grad")))}


def audit(text: str, file: str = "audit_case.grad"):
    results = audit_program(check_source(text, file))
    assert len(results) == 1
    return results[0]


def test_seed_audits_exactly_the_ops_with_a_grad_block(seed):
    assert list(seed) == ["custom_linear", "sign_ste", "clipped_relu", "scaled_tanh"]


def test_custom_linear_differs_by_a_constant_factor_at_the_unit_cotangent(seed):
    a = seed["custom_linear"]
    g, = a.gradients
    assert (a.kind, g.factor, g.ignores_cotangent, g.symbolic) == ("scaled", 0.5, True, True)
    assert a.summary == ("scaled: differs from d/dx by a constant factor 0.5 at the unit "
                         "cotangent dy = 1, and only there: the rule ignores dy (d/dx scales "
                         "with dy)")


def test_sign_ste_is_a_straight_through_surrogate(seed):
    a = seed["sign_ste"]
    assert a.kind == "surrogate" and a.gradients[0].symbolic
    assert a.summary == ("surrogate: straight-through (dx = dy); the derivative is 0 almost "
                         "everywhere (identically 0 after simplification)")
    assert a.gradients[0].differs_fraction > 0.9      # every element with dy != 0


def test_clipped_relu_equals_the_derivative_where_dy_is_at_most_1(seed):
    a = seed["clipped_relu"]
    g, = a.gradients
    assert (a.kind, g.bounds, g.clips) == ("clipped", (-1.0, 1.0), "gradient")
    assert a.summary == ("clipped: equals the derivative where |dy| <= 1, the derivative "
                         "clipped to [-1, 1] elsewhere")
    assert a.marked_surrogate and a.warning is None        # grad(dy) -> dx surrogate


def test_scaled_tanh_is_scaled_by_one_half_everywhere(seed):
    a = seed["scaled_tanh"]
    assert (a.kind, a.gradients[0].factor, a.gradients[0].symbolic) == ("scaled", 0.5, True)
    assert a.summary == "scaled: differs from d/dx by a factor 0.5 everywhere"
    assert a.how().startswith("symbolically after simplification; confirmed numerically at "
                              "22 points (6 of them edge points; shapes (5,) and (7,)) x 2 cotangents")


def test_unmarked_inexact_rules_get_w410_at_the_gradient_that_differs(tmp_path):
    """examples/seed.grad marks its rules 'surrogate'; without the marks (as in the
    spec's copy of the file) each one gets W410 at the assignment of its gradient."""
    text = (EXAMPLES / "seed.grad").read_text().replace("-> dx surrogate {", "-> dx {")
    f = tmp_path / "seed.grad"
    f.write_text(text)
    unmarked = {a.op: a for a in audit_program(load_program(str(f)))}
    w = unmarked["scaled_tanh"].warning
    assert w.code == "W410" and str(w.span) == f"{f}:36:5"
    assert w.render().splitlines()[:4] == [
        f"{f}:36:5: warning[W410]: the custom gradient of 'scaled_tanh' "
        "is scaled, not exact: differs from d/dx by a factor 0.5 everywhere",
        "    36 |     dx = dy * (1 - y^2) * 0.5",
        "       |     ^^",
        "    = note: the grad block begins at line 35"]
    assert "write 'grad(dy) -> dx surrogate {' to say so" in w.render()
    assert {op: a.warning.code for op, a in unmarked.items() if a.warning} == {
        "custom_linear": "W410", "sign_ste": "W410", "clipped_relu": "W410",
        "scaled_tanh": "W410"}
    assert all(a.marked_surrogate and a.warning is None for a in
               audit_program(load_program(str(EXAMPLES / "seed.grad"))))
    assert main(["check", str(f)]) == 1            # and gradc check fails for them


@pytest.mark.parametrize("name", ["activations.grad", "wgan_gp.grad"])
def test_ops_without_grad_blocks_are_not_audited(name):
    assert audit_program(load_program(str(EXAMPLES / name))) == []


def test_an_imported_rule_that_the_files_gradients_use_is_audited_and_fails_check(
        tmp_path, capsys):
    """The wrong rule of an op of another file fails ``gradc check`` of the file whose
    ops' gradients use it (as the tests ``gradc testgen`` writes for it fail)."""
    (tmp_path / "lib.grad").write_text(
        "op my_tanh(x) -> y {\n    y = tanh(x)\n} grad(dy) -> dx {\n    dx = dy * (1 - y)\n}\n"
        "op unused(x) -> y {\n    y = x\n} grad(dy) -> dx {\n    dx = 2 * dy\n}\n")
    user = tmp_path / "user.grad"
    user.write_text('import "lib.grad"\nop outer(x) -> z {\n    z = my_tanh(x)^2\n}\n'
                    "op plain(x) -> z {\n    z = 2 * x\n}\n")
    assert [a.op for a in audit_program(load_program(str(user)))] == ["my_tanh"]
    report = tmp_path / "report.json"
    assert main(["check", str(user), "--json", str(report)]) == 1
    out, err = capsys.readouterr()
    assert "FAIL my_tanh (imported from " in out and "the gradients of outer use its rule" in out
    assert "lib.grad:4:5: warning[W410]: the custom gradient of 'my_tanh'" in err
    assert "gradient check failed for: my_tanh" in err
    data = json.loads(report.read_text())
    assert not data["passed"] and [a["op"] for a in data["imported_rules"]] == ["my_tanh"]
    (tmp_path / "lib.grad").write_text(
        (tmp_path / "lib.grad").read_text().replace("grad(dy) -> dx {\n    dx = dy * (1 - y)",
                                                    "grad(dy) -> dx surrogate {\n    dx = dy * (1 - y)"))
    assert main(["check", str(user)]) == 0           # marked: meant to differ


TANH_NO_SQUARE = """op my_tanh(x) -> y {
    y = tanh(x)
} grad(dy) -> dx {
    dx = dy * (1 - y)
}
"""


def test_a_tanh_rule_missing_the_square_is_a_surrogate_with_a_warning():
    a = audit(TANH_NO_SQUARE)
    assert a.kind == "surrogate"
    g = a.gradients[0]
    assert g.differs_fraction > 0.5 and g.max_rel_diff > 1 and g.sample.startswith("x = ")
    assert a.summary.startswith("surrogate: differs from the derivative at ")
    assert "relative in norm" in a.summary and ": rule " in a.summary
    w = a.warning
    assert (w.code, w.span.line, w.span.column) == ("W410", 4, 5)     # dx = ...
    assert w.message.startswith("the custom gradient of 'my_tanh' is a surrogate, not exact")


@pytest.mark.parametrize("dx, at, note", [
    ("dy * w", (5, 5), "the grad block begins at line 3; the other gradients are exact"),
    ("dy", (3, 3), None)])
def test_w410_points_at_the_one_gradient_that_differs(dx, at, note):
    """Of several gradients, the one that differs is where W410 points (its
    assignment), the block named in a note; where several differ, the block."""
    a = audit("op two(x, w) -> y {\n    y = x * w\n} grad(dy) -> (dx, dw) {\n"
              f"    dx = {dx}\n    dw = dy * w\n}}\n")
    w = a.warning
    assert (w.code, w.span.line, w.span.column) == ("W410", *at)
    assert (note in w.notes) if note else not any("begins at" in n for n in w.notes)


def test_a_sigmoid_rule_with_a_sign_error_is_scaled_by_minus_one_with_a_warning():
    a = audit("op sig(x) -> y {\n    y = sigmoid(x)\n} grad(dy) -> dx {\n"
              "    dx = dy * y * (y - 1)\n}\n")
    assert (a.kind, a.gradients[0].factor) == ("scaled", -1.0)
    assert a.warning is not None and a.warning.code == "W410"


@pytest.mark.parametrize("body, symbolic", [
    ("y = sigmoid(x)\n} grad(dy) -> dx {\n    dx = dy * y * (1 - y)", True),
    ("y = tanh(x)\n} grad(dy) -> dx {\n    dx = dy / cosh(x)^2", False),     # numerically
    ("y = max(x, 0)\n} grad(dy) -> dx {\n    dx = dy * (x > 0)", False),     # kink at 0
    ("y = max(x, 0)\n} grad(dy) -> dx {\n    dx = dy * (x >= 0)", False),
    ("y = sqrt(x)\n} grad(dy) -> dx {\n    dx = dy * 0.5 / y", True),        # NaN mask dropped
    ("y = x * x\n} grad(dy) -> dx {\n    dx = (dy + dy) * x", True),
], ids=["sigmoid", "tanh-cosh", "relu-gt", "relu-ge", "sqrt", "square"])
def test_a_correct_custom_rule_is_exact_and_gets_no_warning(body, symbolic):
    a = audit(f"op f(x) -> y {{\n    {body}\n}}\n")
    assert a.kind == "exact" and a.summary == "exact: the rule equals the derivative"
    assert a.gradients[0].symbolic == symbolic
    assert a.warning is None


def test_several_outputs_and_gradients_are_audited_each():
    a = audit("op f(x, w) -> (a, b) {\n    a = sin(x) * w\n    b = 3 * x\n} "
              "grad(da, db) -> (dx, dw) {\n    dx = da * cos(x) * w + db * 3\n"
              "    dw = da * sin(x) * 0.25\n}\n")
    assert [(g.name, g.param, g.kind, g.factor) for g in a.gradients] == [
        ("dx", "x", "exact", None), ("dw", "w", "scaled", 0.25)]
    assert a.summary == "scaled: dx exact; dw scaled (differs from d/dw by a factor 0.25 " \
                        "everywhere)"
    assert a.warning.message.startswith("the custom gradient of 'f' is scaled, not exact: dx exact;")


def test_a_broadcast_parameter_gradient_is_compared_after_summing():
    a = audit("op f(x: f32[n, k], b: f32[k]) -> y {\n    y = tanh(x + b)\n} "
              "grad(dy) -> (dx, db) {\n    dx = dy * (1 - y^2)\n"
              "    db = sum(dy, axis=0)\n}\n")
    assert [g.kind for g in a.gradients] == ["exact", "surrogate"]


def test_clipping_the_cotangent_is_clipped():
    a = audit("op f(x) -> y {\n    y = x * x\n} grad(dy) -> dx {\n"
              "    dx = clip(dy, -1, 1) * 2 * x\n}\n")
    g = a.gradients[0]
    assert (a.kind, g.clips) == ("clipped", "cotangent")
    assert a.summary == ("clipped: equals the derivative where |dy| <= 1, the derivative at "
                         "dy clipped to [-1, 1] elsewhere")
    assert a.warning is not None


def test_a_clip_written_with_min_and_max_is_clipped_too():
    a = audit("op f(x) -> y {\n    y = max(x, 0)\n} grad(dy) -> dx {\n"
              "    dx = min(max(dy * (x > 0), -1), 1)\n}\n")
    assert (a.kind, a.gradients[0].bounds) == ("clipped", (-1.0, 1.0))


def test_a_clip_that_is_not_the_derivative_clipped_is_a_surrogate():
    a = audit("op f(x) -> y {\n    y = x * x\n} grad(dy) -> dx {\n"
              "    dx = clip(dy * x, -1, 1)\n}\n")
    assert a.kind == "surrogate"



def test_a_rule_that_differs_only_where_the_derivative_is_0_says_so():
    """sqrt(max(x, 0)) is flat (derivative 0) for x < 0, where this rule is huge: the
    audit finds it a surrogate (the derivative there was NaN, inf * 0, and the audit
    called the rule exact) and gives the elementwise difference in absolute value,
    not "at most 0 relative"."""
    a = audit("op safe_sqrt(x) -> y {\n    y = sqrt(max(x, 0))\n} grad(dy) -> dx {\n"
              "    dx = dy * 0.5 / max(y, 1e-6)\n}\n")
    assert a.kind == "surrogate"
    assert "elementwise where the derivative is 0 (at x = " in a.summary
    assert "at most 0 relative" not in a.summary and ", derivative 0)" in a.summary

def test_a_marked_surrogate_gets_no_warning():
    a = audit("op ste(x) -> y {\n    y = round(x)\n} grad(dy) -> dx surrogate {\n"
              "    dx = dy\n}\n")
    assert a.kind == "surrogate" and a.marked_surrogate and a.warning is None
    assert a.lines()[0].endswith("(marked surrogate: intended)")
    b = audit("op f(x) -> y {\n    y = x * 3\n} grad(dy) -> dx surrogate {\n    dx = 3 * dy\n}\n")
    assert b.kind == "exact" and b.warning is None
    assert b.lines()[0].endswith("(marked surrogate, though it equals the derivative)")


def test_a_rule_of_zero_is_a_surrogate():
    a = audit("op f(x) -> y {\n    y = exp(x)\n} grad(dy) -> dx {\n    dx = 0 * dy\n}\n")
    assert a.summary == "surrogate: the rule is 0 (no gradient flows), the derivative is not"


def test_to_dict_is_json():
    a = audit(TANH_NO_SQUARE)
    d = json.loads(json.dumps(a.to_dict()))
    assert d["op"] == "my_tanh" and d["kind"] == "surrogate" and d["span"].endswith(":3:3")
    assert d["gradients"][0]["name"] == "dx" and d["points"] == 22


def test_gradc_check_prints_the_audit_of_seed_grad(capsys):
    assert main(["check", str(EXAMPLES / "seed.grad")]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    for op, text in [
            ("custom_linear", "scaled: differs from d/dx by a constant factor 0.5 at the unit "
                              "cotangent dy = 1, and only there"),
            ("sign_ste", "surrogate: straight-through (dx = dy); the derivative is 0 almost "
                         "everywhere"),
            ("clipped_relu", "clipped: equals the derivative where |dy| <= 1, the derivative "
                             "clipped to [-1, 1] elsewhere (marked surrogate: intended)"),
            ("scaled_tanh", "scaled: differs from d/dx by a factor 0.5 everywhere")]:
        k = next(i for i, line in enumerate(out) if line.startswith(f"ok   {op}:"))
        # after the finite-difference line and the forward-mode line
        assert out[k + 1].startswith(("       jvp vs vjp", "       no jvp: "))
        assert out[k + 2].startswith(f"       audit of the custom rule: {text}")
        assert out[k + 3].startswith("         decided ")
        assert out[k + 2].endswith("(marked surrogate: intended)")
    assert not any("audit" in line for line in out if "mlp" in line or "softmax" in line)
    # every rule of examples/seed.grad is marked surrogate: no W410, the check passes
    assert "W410" not in captured.err


def test_a_rule_equal_to_the_derivative_only_at_the_unit_cotangent_is_a_surrogate():
    a = audit("op f(x: f32[b, n]) -> y {\n    y = sum(exp(x), axis=1)\n} grad(dy) -> dx {\n"
              "    dx = exp(x)\n}\n")
    assert a.kind == "surrogate" and a.gradients[0].ignores_cotangent
    assert a.summary == ("surrogate: equals the derivative at the unit cotangent dy = 1, and "
                         "only there: the rule ignores dy (d/dx scales with dy)")


MEAN_LOSS = """op bce_logits(z, t: nograd) -> loss {
    loss = mean(softplus(z) - t * z)
} grad(dl) -> dz {
    dz = dl * (sigmoid(z) - t)
}
"""


def test_a_mean_rule_missing_its_1_over_n_has_a_factor_that_depends_on_the_size(tmp_path):
    """Sampled at two shapes, the factor is 5 at (5,) and 7 at (7,): not a constant."""
    a = audit(MEAN_LOSS)
    g, = a.gradients
    assert (a.kind, g.factor, g.symbolic) == ("scaled", None, False)
    assert g.factors == [["shape (5,)", 5.0], ["shape (7,)", 7.0]]
    assert a.summary == ("scaled: differs from d/dz by a factor that depends on the input size "
                         "(5 at shape (5,), 7 at shape (7,)): n times the derivative, n a "
                         "number of elements reduced (the product of some of the input's dims,"
                         " as a mean divides by): a missing 1/n (mean)?")
    assert "everywhere" not in a.summary and a.shapes == ("(5,)", "(7,)")
    assert a.how() == ("numerically at 22 points (6 of them edge points; shapes (5,) and "
                       "(7,)) x 2 cotangents, 236 elements")
    assert a.warning.code == "W410" and "depends on the input size" in a.warning.message
    f = tmp_path / "mean_loss.grad"
    f.write_text(MEAN_LOSS)
    assert main(["check", str(f)]) == 1


def test_named_dims_are_sampled_at_two_sizes_too():
    a = audit("op m(x: f32[b, n]) -> y {\n    y = mean(x, axis=1, keepdims=true)\n} "
              "grad(dy) -> dx {\n    dx = dy * ones_like(x)\n}\n")
    assert a.gradients[0].factors == [["shape (2, 3)", 3.0], ["shape (4, 5)", 5.0]]
    assert a.summary.endswith("(3 at shape (2, 3), 5 at shape (4, 5)): n times the "
                              "derivative, n a number of elements reduced (the product of "
                              "some of the input's dims, as a mean divides by): a missing "
                              "1/n (mean)?")


def test_a_size_hard_coded_in_the_rule_is_exact_at_one_shape_only():
    a = audit("op m(z) -> l {\n    l = mean(z * z)\n} grad(dl) -> dz {\n"
              "    dz = dl * 2 * z / 5\n}\n")
    assert a.summary == ("scaled: differs from d/dz by a factor that depends on the input size "
                         "(1 at shape (5,), 1.4 at shape (7,))")
    assert a.warning is not None


def test_an_op_of_fixed_shape_is_sampled_at_that_shape_only():
    """z: f32[5] has 5 elements at every call: the factor 5 is the op's constant."""
    a = audit("op m(z: f32[5]) -> l {\n    l = mean(z * z)\n} grad(dl) -> dz {\n"
              "    dz = dl * 2 * z\n}\n")
    assert a.shapes == ("(5,)",) and a.points == 18
    assert a.summary == "scaled: differs from d/dz by a factor 5 everywhere"


HUBER = """op huber_c(x, d: nograd = 1.0) -> y {
    a = abs(x)
    y = where(a <= d, 0.5 * x^2, d * (a - 0.5 * d))
} grad(dy) -> dx {
    dx = dy * clip(x, -1, 1)
}
"""


def test_a_rule_right_only_at_the_default_of_a_nograd_parameter_is_not_exact(tmp_path):
    a = audit(HUBER)
    assert a.kind == "surrogate"
    assert re.fullmatch(r"surrogate: exact at d = 1 \(the default\), not at d = 2 or "
                        r"d = (\d\.\d+): differs from the derivative at .*, d = \1, dy = .*",
                        a.summary), a.summary
    assert list(a.values) == ["d"] and a.values["d"][:2] == [1.0, 2.0] and \
        len(a.values["d"]) == 3 and a.values["d"][2] > 0
    assert re.search(r"at 30 points \(8 of them edge points; shapes \(5,\) and \(7,\); "
                     r"d = 1 \(the default\), 2, \d\.\d+\) x 2 cotangents", a.how())
    assert a.warning.code == "W410"
    f = tmp_path / "huber.grad"
    f.write_text(HUBER)
    assert main(["check", str(f)]) == 1
    right = audit(HUBER.replace("clip(x, -1, 1)", "clip(x, -d, d)"))
    assert right.kind == "exact" and right.warning is None


def test_a_factor_that_depends_on_a_nograd_parameter_is_located_by_its_values():
    a = audit("op f(x, d: nograd = 1.0) -> y {\n    y = d * sin(x)\n} grad(dy) -> dx {\n"
              "    dx = dy * cos(x)\n}\n")
    g, = a.gradients
    assert a.kind == "scaled" and g.factor is None
    assert [w for w, _ in g.factors] == ["d = 1 (the default)", "d = 2", g.factors[2][0]]
    assert [r for _, r in g.factors][:2] == [1.0, 0.5]
    assert a.summary.startswith("scaled: differs from d/dx by a factor that depends on d "
                                "(1 at d = 1 (the default), 0.5 at d = 2, ")


def test_integer_parameters_with_a_default_stay_at_it():
    a = audit("op f(x, k: i32 = 2) -> y {\n    y = x * k\n} grad(dy) -> dx {\n"
              "    dx = dy * k\n}\n")
    assert a.kind == "exact" and a.values == {} and a.points == 22


# Row-wise rules written for parameters without declared shapes: at a vector, axis 0 is
# axis -1 and a row's cotangent is a scalar, so these two classic mistakes pass there.
ROW_MISTAKES = """op wrong_axis(x) -> y {
    y = softmax(x, axis=-1)
} grad(dy) -> dx {
    dx = y * (dy - sum(y * dy, axis=0, keepdims=true))
}
op dropped_dim(x) -> y {
    y = logsumexp(x, axis=-1)
} grad(dy) -> dx {
    dx = dy * softmax(x, axis=-1)
}
op right(x) -> y {
    y = softmax(x, axis=-1)
} grad(dy) -> dx {
    dx = y * (dy - sum(y * dy, axis=-1, keepdims=true))
}
"""


def test_row_rules_are_checked_at_a_matrix_of_unequal_dims(tmp_path, capsys):
    audits = {a.op: a for a in audit_program(check_source(ROW_MISTAKES, "rows.grad"))}
    assert audits["wrong_axis"].kind != "exact" and audits["wrong_axis"].warning is not None
    assert audits["right"].kind == "exact" and audits["right"].shapes[0] == "(4, 5)"
    f = tmp_path / "rows.grad"
    f.write_text(ROW_MISTAKES)
    assert main(["check", str(f)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^FAIL wrong_axis: its custom gradient is not the derivative", out, re.M)
    assert re.search(r"^FAIL dropped_dim: not checked: the custom rule fails at x \(4, 5\), "
                     r"where the forward pass runs: operands could not be broadcast", out,
                     re.M), out
    assert re.search(r"^ok   right:", out, re.M)


def test_elementwise_ops_are_still_sampled_at_a_vector():
    from gradc.audit.gradcheck import AXIS_SHAPES, GENERIC_SHAPES, shapes_to_try
    from gradc.pipeline import build_op
    program = check_source("op t(x) -> y { y = tanh(x) * 2 }\n"
                           "op s(x) -> y { y = x - mean(x, axis=-1, keepdims=true) }", "t.grad")
    t, s = (build_op(program.ops[n], program.ops, program.consts) for n in "ts")
    assert shapes_to_try(t) == GENERIC_SHAPES and shapes_to_try(s) == AXIS_SHAPES


@pytest.mark.parametrize("labels", ["where(mask, labels, 0)", "labels * mask"])
def test_labels_a_mask_lets_through_are_drawn_in_range(labels):
    """An ignore_index-style rule (the labels a bool mask lets through reach a one_hot)
    is audited at labels in range: the labels' range is fitted with the mask all true
    and all false, not at a mask that happened to hide every label (gradc check crashed
    on a one_hot of label -2: helper 63)."""
    a = audit("op f(logits: [n, v], labels: i64[n], mask: bool[n]) -> loss {\n"
              f"    loss = sum(one_hot({labels}, v) * logits)\n"
              "} grad(dloss) -> dlogits {\n"
              f"    dlogits = dloss * one_hot({labels}, v)\n}}\n")
    assert a.kind == "exact"


def test_a_drawn_mask_holds_both_values():
    """A bool parameter of two elements or more is drawn with both values, so a check of
    where(mask, f(x), 0) never compares only zeros (gradc check of such an op at seed 0
    compared a mask of all false: helper 63)."""
    import numpy as np

    from gradc.audit.gradcheck import sample_inputs
    from gradc.pipeline import build_op

    program = check_source("op f(x: [n], mask: bool[n]) -> y {\n"
                           "    y = sum(where(mask, x, 0))\n}\n", "mask.grad")
    cop = build_op(program.ops["f"], program.ops, program.consts)
    for seed in range(200):
        for n in (2, 3):
            _, mask = sample_inputs(cop, np.random.default_rng(seed), dims={"n": n})
            assert mask.any() and not mask.all(), (seed, n, mask)
