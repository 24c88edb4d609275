"""Tests of the semantic checks (SPEC §1): names, calls, outputs, grad blocks, imports."""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest

from gradc.errors import GradcError, GradcErrors
from gradc.frontend import ast
from gradc.frontend.check import Program, check, check_source, load_program
from gradc.frontend.parser import parse
from gradc.frontend.consts import FUNCTIONS, did_you_mean

EXAMPLES = Path(__file__).parent / "spec_examples"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def errors_of(text: str, file: str = "bad.grad") -> list[GradcError]:
    with pytest.raises(GradcError) as info:
        check_source(src(text), file)
    err = info.value
    return list(err.errors) if isinstance(err, GradcErrors) else [err]


def messages(text: str) -> list[str]:
    return [e.message for e in errors_of(text)]


def rendered(text: str) -> str:
    with pytest.raises(GradcError) as info:
        check_source(src(text), "bad.grad")
    return str(info.value)


def memory_loader(files: dict[str, str]):
    """A loader that reads .grad files from a dict instead of the disk."""
    def load(path: str) -> ast.Module:
        if path not in files:
            raise FileNotFoundError(path)
        return parse(src(files[path]), path)
    return load


# ---- clean programs --------------------------------------------------------------

@pytest.mark.parametrize("name", ["activations.grad", "seed.grad"])
def test_spec_examples_check_cleanly(name: str) -> None:
    program = load_program(EXAMPLES / name)
    assert isinstance(program, Program)
    assert program.main_ops == tuple(program.ops)
    assert program.files == (str(EXAMPLES / name),)


def test_program_fields_and_const_values() -> None:
    program = check_source(src('''
        const A = 2
        const B = -A ^ 2 + sqrt(4) * pi / e - 1e-3
        const C = max(A, 3) + log(1) + inf
        op f(x, alpha: nograd = B) -> y {
            y = g(x) * alpha + A
        }
        op g(x) -> y {
            y = x
        }
    '''), "p.grad")
    assert list(program.ops) == ["f", "g"] and program.main_ops == ("f", "g")
    assert program.consts["A"] == 2.0
    assert program.consts["B"] == pytest.approx(-4 + 2 * math.pi / math.e - 1e-3)
    assert program.consts["C"] == math.inf
    assert program.files == ("p.grad",)


def test_grad_block_sees_params_residuals_and_upstreams() -> None:
    check_source(src('''
        op f(x, w, k: i32, m: nograd) -> (y, z) {
            h = x * w
            y = tanh(h) + k + m
            z = h
        } grad(dy, dz) -> (dx, dw) {
            t = dy * (1 - y^2) + dz
            dx = t * w
            dw = 0
        }
    '''))


def test_keepdims_true_false_and_axis_forms() -> None:
    check_source(src('''
        op f(x) -> y {
            a = sum(x, axis=1, keepdims=true) + mean(x, axis=(0, -1), keepdims=false)
            b = max(x, axis=-1, keepdims=1) + min(x, keepdims=0) + max(x, 0) + norm(x)
            y = a + b + logsumexp(x, axis=()) + prod(x).T
        }
    '''))
    check_source("op f(x) -> y {\n    y = where(true, x, 0) * false + true\n}\n")   # values
    assert messages("op f(x) -> y {\n    y = x + ture\n}\n") == ["undefined name 'ture'"]


def test_axis_may_be_a_const_of_integer_value() -> None:
    """``axis=AX`` with ``const AX = -1`` is ``axis=-1`` (in a tuple and negated too),
    forward and gradient; a const of another value is refused where it is used."""
    import numpy as np

    from gradc.ir.interpret import interpret
    from gradc.pipeline import build_program

    text = src('''
        const AX = -1
        const HALF = 0.5
        op f(x) -> y {
            y = softmax(x, axis=AX) * sum(x, axis=(0, -AX), keepdims=true)
        }
        op g(x) -> y {
            y = softmax(x, axis=-1) * sum(x, axis=(0, 1), keepdims=true)
        }
    ''')
    ops = build_program(check_source(text))
    x, dy = np.random.default_rng(0).standard_normal((2, 3, 2, 3))
    for method, args in (("forward", [x]), ("vjp", [x, dy])):
        got, want = (interpret(ops[n].methods[method].graph, args) for n in "fg")
        np.testing.assert_array_equal(got, want)
    bad = text.replace("axis=(0, -AX)", "axis=HALF")
    with pytest.raises(GradcError, match="axis= must be an integer, got 0.5") as info:
        build_program(check_source(bad))
    assert (info.value.span.line, info.value.span.column) == (4, 43)   # at HALF


def test_integer_arguments_and_shapes_may_be_consts_of_integer_value() -> None:
    """``one_hot(t, D)``, ``topk(x, D)``, ``swapaxes(x, 0, AX)``, ``reshape(x, (D, -1))``
    with ``const D = 3``, ``const AX = 1`` are the same ops as with the numbers written
    out, forward and gradient; a const of another value is refused where it is used."""
    import numpy as np

    from gradc.ir.interpret import interpret
    from gradc.pipeline import build_program

    body = ("op f(x: [n, k], t: i64[n]) -> y {\n    y = sum(one_hot(t, D) * topk(x, D), "
            "axis=1, keepdims=true) + reshape(swapaxes(x, 0, AX), (D, NEG))\n}\n")
    consts = "const D = 3\nconst AX = 1\nconst NEG = -1\n"
    literal = body.replace("D", "3").replace("AX", "1").replace("NEG", "-1")
    ops = [build_program(check_source(consts + text))["f"] for text in (body, literal)]
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((3, 4)), np.array([0, 2, 1])
    dy = rng.standard_normal((3, 4))
    for method, args in (("forward", [x, t]), ("vjp", [x, t, dy])):
        got, want = (interpret(op.methods[method].graph, args) for op in ops)
        for g, w in zip(got if method == "vjp" else [got], want if method == "vjp" else [want]):
            np.testing.assert_array_equal(g, w)
    for call, message in [("one_hot(t, H)", "depth must be an integer, got 2.5"),
                          ("topk(x, k=H)", "k must be an integer, got 2.5"),
                          ("swapaxes(x, 0, axis2=H)", "axis2 must be an integer, got 2.5"),
                          ("reshape(x, (H, -1))", "a shape's size must be an integer, got 2.5")]:
        text = f"const H = 2.5\nop f(x: [n, k], t: i64[n]) -> y {{\n    y = {call}\n}}\n"
        with pytest.raises(GradcError, match=re.escape(message)) as info:
            build_program(check_source(text))
        assert (info.value.span.line, info.value.span.column) == (3, 9 + call.index("H")), call


def test_dims_of_the_signature_are_values() -> None:
    check_source(src('''
        op f(x: [n, k], t: i64[n], eps: nograd = 0.1) -> y {
            y = x * ((1 - eps) * one_hot(t, k) + eps / k) / sqrt(n)
        }
        op g(x: nograd [n, k]) -> y {
            k2 = k * 2
            y = x * k2
        }
    '''))
    # a local of the same name wins; a dim is not a parameter of grad()
    check_source("op f(x: [n], n: i32) -> y {\n    y = x * n\n}\n")
    assert messages("op f(x: [n]) -> y {\n    y = grad(sum(x), n)\n}\n") == [
        "the second argument of grad() must be a parameter or an assigned name"]
    assert messages("op f(x: [n]) -> y {\n    y = x * m\n}\n") == ["undefined name 'm'"]


def test_ops_may_call_ops_defined_later_and_pass_defaults_either_way() -> None:
    check_source(src('''
        op f(x) -> y {
            y = g(x, 0.2) + g(x) + g(x, alpha=0.3) + g(alpha=1, x=x)
        }
        op g(x, alpha: nograd = 0.1) -> y {
            y = x * alpha
        }
    '''))


def test_grad_builtin_takes_a_local_name() -> None:
    check_source(src('''
        op f(x, w) -> p {
            s = x * w
            g = grad(sum(s), x) + grad(sum(s), s)
            p = mean(g^2)
        }
    '''))


# ---- errors: the whole rendered message -----------------------------------------

def test_unknown_function_suggests_a_builtin() -> None:
    assert rendered('''
        op f(x) -> y {
            y = 2 * tanhh(x)
        }
    ''') == (
        "bad.grad:2:13: error[E201]: unknown function 'tanhh'\n"
        "    2 |     y = 2 * tanhh(x)\n"
        "      |             ^^^^^\n"
        "    = note: did you mean 'tanh'?")


def test_a_function_that_is_not_a_builtin_says_how_to_write_it() -> None:
    """'silu' is a typo of nothing: no 'did you mean sin' (softmax, which was the
    example here, is a builtin now)."""
    assert rendered('''
        op f(x) -> y {
            y = silu(x)
        }
    ''').endswith("    = note: 'silu' is not a builtin function: write x * sigmoid(x)")


@pytest.mark.parametrize("name, near", [("sigmod", "sigmoid"), ("exo", "exp"),
                                        ("sotfplus", "softplus"), ("sofplus", "softplus")])
def test_suggestions_are_a_typo_away(name, near) -> None:
    assert did_you_mean(name, FUNCTIONS) == [f"did you mean '{near}'?"]


@pytest.mark.parametrize("name", ["mxx_pool", "hardmax", "tangent"])
def test_no_suggestion_far_from_every_builtin(name) -> None:
    assert did_you_mean(name, FUNCTIONS) == []


def test_the_caret_line_keeps_the_tabs_of_the_source_line() -> None:
    """A tab before the span is repeated under it, so a terminal (tab stops of any
    width) puts the caret under the name."""
    with pytest.raises(GradcError) as info:
        check_source("op f(x) -> y {\n\ty = tanhh(x)\n}\n", "tab.grad")
    assert str(info.value).splitlines()[1:3] == ["    2 | \ty = tanhh(x)",
                                                 "      | \t    ^^^^^"]


def test_the_caret_counts_wide_characters_as_two_columns() -> None:
    """A span after or over CJK characters (two columns each in a terminal): the caret
    lines up under it and is as wide as it shows (it was two columns short)."""
    with pytest.raises(GradcError) as info:
        check_source('op f(x) -> y {\n    y = "中文" + tanhh(x)\n}\n', "wide.grad")
    assert str(info.value).splitlines()[1:3] == ['    2 |     y = "中文" + tanhh(x)',
                                                 "      |         ^^^^^^"]
    with pytest.raises(GradcError) as info:
        check_source("op f(中文) -> y {\n    y = 2\n}\n", "w.grad")
    assert str(info.value).splitlines()[1:3] == ["    1 | op f(中文) -> y {",
                                                 "      |      ^^"]


def test_undefined_name() -> None:
    assert rendered('''
        op f(x, weight) -> y {
            y = x * weigth
        }
    ''') == (
        "bad.grad:2:13: error[E201]: undefined name 'weigth'\n"
        "    2 |     y = x * weigth\n"
        "      |             ^^^^^^\n"
        "    = note: did you mean 'weight'?")


def test_python_names_say_how_gradc_spells_them() -> None:
    """x[:, None], keepdims=True, and an undefined name as a constant argument (found
    by helper 50: E201 with a note, not E304 'takes an integer here')."""
    assert rendered('''
        op f(x) -> y {
            y = x[:, None]
        }
    ''') == (
        "bad.grad:2:14: error[E201]: undefined name 'None'\n"
        "    2 |     y = x[:, None]\n"
        "      |              ^^^^\n"
        "    = note: gradc has no None: add an axis with expand_dims (x[:, None] is "
        "expand_dims(x, axis=1)); leave out an argument for its default")
    assert rendered('''
        op f(x) -> y {
            y = sum(x, axis=-1, keepdims=True)
        }
    ''').endswith("error[E304]: keepdims= must be 0, 1, true or false\n"
                   "    2 |     y = sum(x, axis=-1, keepdims=True)\n"
                   "      |                                  ^^^^\n"
                   "    = note: write true (lowercase)")
    assert rendered('''
        op f(t: i64[n]) -> y {
            y = one_hot(t, depth)
        }
    ''').startswith("bad.grad:2:20: error[E201]: undefined name 'depth'\n")


def test_matmul_with_a_reversed_batch_says_what_t_does() -> None:
    """x @ x.T of a rank-3 x: .T reverses every axis (NumPy's), so the note says how
    to swap the last two (helper 50); other misfits of '@' have no such note."""
    import gradc

    def error(body: str, sig: str) -> str:
        with pytest.raises(GradcError) as info:
            gradc.compile_source(f"op f({sig}) -> y {{\n    y = {body}\n}}\n", file="t.grad")
        return str(info.value)
    assert error("x @ x.T", "x: f32[b, n, d]").endswith(
        "contracted dims 'd' and 'n' differ\n"
        "    2 |     y = x @ x.T\n"
        "      |           ^\n"
        "    = note: '.T' reverses every axis, as NumPy's does: to swap the last two, "
        "write swapaxes(x, -1, -2)")
    assert error("x @ w", "x: f32[n, 3], w: f32[4, m]").endswith(
        "contracted dims 3 and 4 differ\n    2 |     y = x @ w\n      |           ^")


def test_name_used_before_it_is_assigned() -> None:
    assert rendered('''
        op f(x) -> y {
            y = x + z
            z = x
        }
    ''') == (
        "bad.grad:2:13: error[E202]: name 'z' is used before it is assigned\n"
        "    2 |     y = x + z\n"
        "      |             ^\n"
        "    = note: 'z' is assigned at bad.grad:3:5")


def test_reassignment() -> None:
    assert rendered('''
        op f(x) -> y {
            y = x
            y = 2 * y
        }
    ''') == (
        "bad.grad:3:5: error[E203]: 'y' is assigned twice\n"
        "    3 |     y = 2 * y\n"
        "      |     ^\n"
        "    = note: first assigned at bad.grad:2:5")


def test_output_not_assigned() -> None:
    assert rendered('''
        op split(x) -> (lo, hi) {
            lo = min(x, 0)
        }
    ''') == (
        "bad.grad:1:4: error[E204]: output 'hi' of op 'split' is never assigned\n"
        "    1 | op split(x) -> (lo, hi) {\n"
        "      |    ^^^^^")


def test_gradient_output_count_mismatch() -> None:
    assert rendered('''
        op f(x, w, alpha: nograd) -> y {
            y = x * w * alpha
        } grad(dy) -> dx {
            dx = dy * w * alpha
        }
    ''') == (
        "bad.grad:3:3: error[E402]: op 'f' has 2 differentiable parameters (x, w), "
        "so its grad block returns 2 gradients, got 1\n"
        "    3 | } grad(dy) -> dx {\n"
        "      |   ^^^^\n"
        "    = note: parameter 'alpha' is marked nograd, so it gets no gradient")


def test_upstream_count_mismatch() -> None:
    assert rendered('''
        op f(x) -> (y, z) {
            y = x
            z = 2 * x
        } grad(dy) -> dx {
            dx = dy
        }
    ''') == (
        "bad.grad:4:3: error[E401]: op 'f' has 2 outputs, so its grad block takes "
        "2 upstream names, got 1\n"
        "    4 | } grad(dy) -> dx {\n"
        "      |   ^^^^")


def test_gradient_output_not_assigned() -> None:
    assert rendered('''
        op f(x) -> y {
            y = x
        } grad(dy) -> dx {
            t = dy
        }
    ''') == (
        "bad.grad:3:3: error[E204]: gradient output 'dx' is never assigned\n"
        "    3 | } grad(dy) -> dx {\n"
        "      |   ^^^^")


def test_mutual_recursion() -> None:
    assert rendered('''
        op f(x) -> y {
            y = g(x)
        }
        op g(x) -> y {
            y = 2 * f(x)
        }
    ''') == (
        "bad.grad:2:9: error[E206]: recursion is not allowed: f -> g -> f\n"
        "    2 |     y = g(x)\n"
        "      |         ^")


def test_direct_recursion() -> None:
    assert rendered('''
        op f(x) -> y {
            y = f(x - 1)
        }
    ''') == (
        "bad.grad:2:9: error[E206]: recursion is not allowed: op 'f' calls itself\n"
        "    2 |     y = f(x - 1)\n"
        "      |         ^")


def test_missing_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "main.grad").write_text('import "nope.grad"\nop f(x) -> y {\n    y = x\n}\n')
    with pytest.raises(GradcError) as info:
        load_program("main.grad")
    assert str(info.value) == (
        "main.grad:1:8: error[E205]: cannot find the imported file 'nope.grad'\n"
        '    1 | import "nope.grad"\n'
        "      |        ^^^^^^^^^^^\n"
        "    = note: looked for nope.grad")


def test_several_errors_are_reported_together() -> None:
    assert rendered('''
        op f(x) -> y {
            y = expp(x)
        }
        op g(x) -> y {
            a = x
            a = undefined_thing
        }
    ''') == (
        "bad.grad:2:9: error[E201]: unknown function 'expp'\n"
        "    2 |     y = expp(x)\n"
        "      |         ^^^^\n"
        "    = note: did you mean 'exp'?\n"
        "\n"
        "bad.grad:4:4: error[E204]: output 'y' of op 'g' is never assigned\n"
        "    4 | op g(x) -> y {\n"
        "      |    ^\n"
        "\n"
        "bad.grad:6:5: error[E203]: 'a' is assigned twice\n"
        "    6 |     a = undefined_thing\n"
        "      |     ^\n"
        "    = note: first assigned at bad.grad:5:5\n"
        "\n"
        "bad.grad:6:9: error[E201]: undefined name 'undefined_thing'\n"
        "    6 |     a = undefined_thing\n"
        "      |         ^^^^^^^^^^^^^^^\n"
        "\n"
        "4 errors")


# ---- errors: messages -------------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    ("y = sum(x, 1)", "'sum' takes 1 argument, got 2"),
    ("y = where(x, 1)", "'where' takes 3 arguments, got 2"),
    ("y = max(x, 1, 2)", "'max' takes 1 or 2 arguments, got 3"),
    ("y = tanh(x, axis=1)", "'tanh' has no keyword argument 'axis'"),
    ("y = sum(x, axes=1)", "'sum' has no keyword argument 'axes'"),
    ("y = sum(x, axis=1, axis=0)", "keyword argument 'axis' is given twice"),
    ("y = max(x, 0, axis=1)",
     "'max' of two arguments is elementwise and takes no axis= or keepdims="),
    ("y = sum(x, axis=x)", "axis= must be an integer, a const or a tuple of them"),
    ("y = sum(x, axis=1.0)", "axis= must be an integer, a const or a tuple of them"),
    ("y = sum(x, axis=(0, x))", "axis= must be an integer, a const or a tuple of them"),
    ("y = sum(x, keepdims=2)", "keepdims= must be 0, 1, true or false"),
    ("y = swapaxes(x, 0.5, 1)", "'swapaxes' takes an integer here (an integer, a dim or a const)"),
    ("y = one_hot(x, 2.5)", "'one_hot' takes an integer here (an integer, a dim or a const)"),
    ("y = topk(x, x)", "'topk' takes an integer here (an integer, a dim or a const)"),
    ("y = swapaxes(x, 0, axis2=0.5)",
     "'swapaxes' takes an integer here (an integer, a dim or a const)"),
    ("y = expand_dims(x, axis=x)", "axis= must be an integer, a const or a tuple of them"),
    ("y = expand_dims(x, -1, axis=0)", "keyword argument 'axis' is given twice"),
    ("y = swapaxes(x, 1, axis1=0)", "keyword argument 'axis1' is given twice"),
    ("y = expand_dims(x, axes=0)", "'expand_dims' has no keyword argument 'axes'"),
    ("y = reshape(x, shape=x)",
     "a shape must be an integer, a dim of the signature, a const or a tuple of them"),
    ("y = x + (1, 2)", "a tuple can only be an axis= value"),
    ("y = concat((x, x), axis=-1)", "'concat' takes its arrays as separate arguments, not a "
                                    "tuple"),
    ("y = stack((x, x))", "'stack' takes its arrays as separate arguments, not a tuple"),
    ("y = grad(x, 2 * x)", "the second argument of grad() must be a parameter or an assigned name"),
    ("y = grad(x, pi)", "the second argument of grad() must be a parameter or an assigned name"),
    ("y = grad(x)", "'grad' takes 2 arguments: grad(EXPR, NAME), got 1"),
    ("y = x * tanh", "'tanh' is a function: call it as tanh(...)"),
    ("y = x\n    x = 1", "parameter 'x' cannot be assigned"),
    ("y = two(x)", "op 'two' returns 2 outputs; only an op with one output can be called "
                   "in an expression"),
    ("y = lin(x, 1, 2, 3)", "op 'lin' takes at most 3 arguments, got 4"),
    ("y = lin(x)", "call of op 'lin' is missing the argument 'w'"),
    ("y = lin()", "call of op 'lin' is missing the arguments 'x', 'w'"),
    ("y = lin(x, w=x, x=x)", "argument 'x' of op 'lin' is given twice"),
    ("y = lin(x, x, sclae=2)", "op 'lin' has no parameter 'sclae'"),
])
def test_call_and_name_errors(body: str, message: str) -> None:
    text = ("op two(x) -> (a, b) {\n    a = x; b = x\n}\n"
            "op lin(x, w, scale: nograd = 1) -> y {\n    y = x * w * scale\n}\n"
            f"op f(x) -> y {{\n    {body}\n}}\n")
    assert message in messages(text)


def test_constant_arguments_by_keyword_as_numpy_takes_them() -> None:
    """expand_dims(x, axis=-1), swapaxes(x, 0, axis2=1), reshape(x, shape=...): a
    constant argument may be given by its name; a missing one is only an arity error."""
    text = ("op f(x: f32[a, b]) -> y {\n    y = reshape(swapaxes(expand_dims(x, axis=0), 0,"
            " axis2=2), shape=(-1,)) + sum(one_hot(argmax(x, axis=1), depth=b))\n}\n")
    check_source(text, "ok.grad")
    assert messages("op f(x) -> y {\n    y = expand_dims(x)\n}\n") == [
        "'expand_dims' takes 2 arguments, got 1"]


@pytest.mark.parametrize("body, name", [
    ("y = sum(x, axes=1)", "axes"),
    ("y = sum(x, axis=1, axis=-1)", "axis"),            # the second one
    ("y = max(x, 0, keepdims=true)", "keepdims"),
    ("y = lin(x, x, sclae=2 * x)", "sclae"),
    ("y = lin(x, w=x, x=x)", "x"),
])
def test_a_keyword_error_points_at_the_keyword(body: str, name: str) -> None:
    """The caret is under the keyword's name, its whole width (not its value)."""
    text = ("op lin(x, w, scale: nograd = 1) -> y {\n    y = x * w * scale\n}\n"
            f"op f(x) -> y {{\n    {body}\n}}\n")
    (err,) = errors_of(text)
    at = body.rindex(f"{name}=") + 5                    # 1-based, after 4 spaces
    assert (err.span.line, err.span.column, err.span.end_column) == (5, at, at + len(name))


@pytest.mark.parametrize("text, message", [
    ("op f(x, x) -> y {\n    y = x\n}\n", "parameter 'x' is declared twice"),
    ("op f(x) -> (y, y) {\n    y = x\n}\n", "output 'y' of op 'f' is declared twice"),
    ("op f(x) -> x {\n    z = x\n}\n", "output 'x' of op 'f' is never assigned"),
    ("op f(x: float32) -> y {\n    y = x\n}\n", "unknown dtype 'float32'"),
    ("op f(x) -> y {\n    y = x\n}\nop f(x) -> y {\n    y = x\n}\n", "'f' is defined twice"),
    ("const f = 1\nop f(x) -> y {\n    y = x\n}\n", "'f' is defined twice"),
    ("op grad(x) -> y {\n    y = x\n}\n",
     "an op cannot be named 'grad' (grad(EXPR, NAME) and grad blocks)"),
    ("const pi = 3\n", "const 'pi' redefines a builtin constant"),
    ("const A = B\nconst B = 1\n", "const 'B' is used before it is defined"),
    ("const A = 1 / 0\n", "'/' has no value here (division by zero)"),
    ("const A = log(-1)\n", "'log' has no value here (outside the function's domain)"),
    ("const A = exp(1000)\n", "'exp' has no value here (overflow: beyond float64's range)"),
    ("const A = 1e308 * 10\n", "'*' has no value here (overflow: beyond float64's range)"),
    ("const A = sum(2)\n", "'sum' cannot be used in a constant expression"),
    ("op f(x, n: i32 = 2.5) -> y {\n    y = x * n\n}\n",
     "parameter 'n' is i32, so its default must be an integer in [-2147483648, 2147483647], "
     "got 2.5"),
    ("op f(x, n: i64 = 1e19) -> y {\n    y = x * n\n}\n",
     "parameter 'n' is i64, so its default must be an integer in [-9223372036854775808, "
     "9223372036854775807], got 1e+19"),
    ("op f(x, b: bool = 2) -> y {\n    y = where(b, x, 0)\n}\n",
     "parameter 'b' is bool, so its default must be 0 (false) or 1 (true), got 2"),
    ("const A = 1 < 2\n", "'<' cannot be used in a constant expression"),
    ("const A = sqrtt(2)\n", "unknown function 'sqrtt'"),
    ("const A = ZZ\n", "undefined name 'ZZ'"),
    ("op f(x, a = x) -> y {\n    y = x\n}\n", "undefined name 'x'"),
    ("op f(x) -> y {\n    y = x\n} grad(x) -> dx {\n    dx = x\n}\n",
     "upstream 'x' of the grad block shadows the parameter 'x'"),
    ("op f(x) -> y {\n    y = x\n} grad(dy) -> y {\n    y = dy\n}\n",
     "gradient output 'y' of the grad block shadows 'y' of the forward body"),
    ("op f(x, w) -> y {\n    y = x\n} grad(dy) -> (dx, dx) {\n    dx = dy\n}\n",
     "gradient output 'dx' of the grad block shadows the gradient output 'dx'"),
    ("op f(x) -> y {\n    h = x; y = h\n} grad(dy) -> dx {\n    h = dy; dx = h\n}\n",
     "'h' is assigned twice"),
    ("op f(x) -> y {\n    y = x\n} grad(dy) -> dx {\n    dy = 1; dx = dy\n}\n",
     "upstream 'dy' cannot be assigned"),
    ("op f(x: nograd) -> y {\n    y = x\n} grad(dy) -> dx {\n    dx = dy\n}\n",
     "op 'f' has 0 differentiable parameters, so its grad block returns 0 gradients, got 1"),
])
def test_definition_errors(text: str, message: str) -> None:
    assert message in messages(text)


@pytest.mark.parametrize("expr, message", [
    ("x * exp(1000)", "'exp' has no value here (overflow: beyond float64's range)"),
    ("x + 1e308 * 10", "'*' has no value here (overflow: beyond float64's range)"),
    ("x * log(-1)", "'log' has no value here (outside the function's domain)"),
    ("x * (1 / (C - C))", "'/' has no value here (division by zero)"),
    ("max(x, sqrt(2 - 3 * C))", "'sqrt' has no value here (outside the function's domain)"),
])
def test_constant_subexpressions_of_a_body_are_evaluated_as_consts_are(expr, message):
    text = f"const C = 1\nop f(x) -> y {{\n    y = {expr}\n}}\n"
    assert messages(text) == [message]
    grad = f"op g(x) -> y {{\n    y = x\n}} grad(dy) -> dx {{\n    dx = dy * ({expr})\n}}\n"
    assert messages("const C = 1\n" + grad) == [message]


@pytest.mark.parametrize("expr", [
    "x * (inf - inf)",          # from an infinity: as written, NaN
    "x * exp(-1000)",           # underflow to 0 is a value
    "x * log(C)",               # C is the parameter here, not the const
    "where(x > 0, x, -inf) + sum(x, axis=0) * 2^1023",
])
def test_constant_subexpressions_with_values_compile(expr):
    text = f"const C = 0\nop f(x, C) -> y {{\n    y = {expr}\n}}\n"
    check_source(text)


def test_grad_block_body_cannot_use_names_before_assignment() -> None:
    text = "op f(x) -> y {\n    y = x\n} grad(dy) -> dx {\n    dx = t\n    t = dy\n}\n"
    assert messages(text) == ["name 't' is used before it is assigned"]


# ---- imports ------------------------------------------------------------------------

def test_imports_with_a_cycle_and_transitive_visibility() -> None:
    files = {
        "lib/a.grad": 'import "b.grad"\nconst SCALE = 2\nop act(x) -> y {\n    y = deep(x) * SCALE\n}\n',
        "lib/b.grad": 'import "a.grad"\nimport "c.grad"\nop mid(x) -> y {\n    y = x\n}\n',
        "lib/c.grad": 'op deep(x) -> y {\n    y = tanh(x)\n}\n',
    }
    main = parse('import "lib/a.grad"\nop f(x) -> y {\n    y = act(x) + deep(x) + mid(x)\n}\n',
                 "main.grad")
    program = check(main, loader=memory_loader(files))
    assert list(program.ops) == ["deep", "mid", "act", "f"]
    assert program.main_ops == ("f",)
    assert program.files == ("main.grad", "lib/c.grad", "lib/b.grad", "lib/a.grad")
    assert program.consts == {"SCALE": 2.0}


def test_ops_of_files_not_imported_are_not_visible() -> None:
    files = {
        "a.grad": 'op a(x) -> y {\n    y = b(x)\n}\n',
        "b.grad": 'op b(x) -> y {\n    y = x\n}\n',
    }
    main = parse('import "a.grad"\nimport "b.grad"\n', "main.grad")
    with pytest.raises(GradcError) as info:
        check(main, loader=memory_loader(files))
    assert info.value.message == "unknown function 'b'"
    assert info.value.span.file == "a.grad"


def test_an_op_shadows_a_builtin_in_its_file_and_the_files_importing_it() -> None:
    files = {"a.grad": "op tanh(x) -> y {\n    y = x * 2\n}\nop u(x) -> y {\n    y = tanh(x)\n}\n"}
    main = parse('import "a.grad"\nop f(x) -> y {\n    y = tanh(x)\n}\n', "main.grad")
    program = check(main, loader=memory_loader(files))
    (note,) = program.diagnostics
    assert str(note) == (
        "a.grad:1:4: note[N203]: op 'tanh' shadows the builtin function 'tanh' in this file "
        "and the files that import it\n"
        "    1 | op tanh(x) -> y {\n"
        "      |    ^^^^")
    # a file the op's file imports does not see it: calling the builtin there is E203
    files = {"a.grad": "op u(x) -> y {\n    y = tanh(x)\n}\n"}
    main = parse('import "a.grad"\nop tanh(x) -> y {\n    y = x\n}\n', "main.grad")
    with pytest.raises(GradcError) as info:
        check(main, loader=memory_loader(files))
    assert str(info.value).startswith(
        "a.grad:2:9: error[E203]: this file calls the builtin 'tanh', which op 'tanh' of a "
        "file importing it shadows")


def test_duplicate_names_across_imports() -> None:
    files = {"a.grad": 'op relu(x) -> y {\n    y = max(x, 0)\n}\n'}
    main = parse('import "a.grad"\nop relu(x) -> y {\n    y = x\n}\n', "main.grad")
    with pytest.raises(GradcError) as info:
        check(main, loader=memory_loader(files))
    assert str(info.value) == (
        "main.grad:2:4: error[E203]: 'relu' is defined twice\n"
        "    2 | op relu(x) -> y {\n"
        "      |    ^^^^\n"
        "    = note: first defined at a.grad:1:4")


def test_errors_in_imported_files_are_reported_alone(tmp_path: Path) -> None:
    """A syntax error in an imported file is reported alone, as in the main file: the
    names that file defines are unknown, so each use of them (g here) would be an
    error too, with a misleading "did you mean 'f'?"."""
    (tmp_path / "lib.grad").write_text("op g(x) -> y {\n    y = x +\n}\n")
    (tmp_path / "main.grad").write_text('import "lib.grad"\nop f(x) -> y {\n    y = g(zz)\n}\n')
    with pytest.raises(GradcError) as info:
        load_program(tmp_path / "main.grad")
    errs = getattr(info.value, "errors", [info.value])
    assert [(Path(e.span.file).name, e.message) for e in errs] == [
        ("lib.grad", "expected an expression, found a newline")]


@pytest.mark.parametrize("path", ["\0", "a\0b.grad", "\ud800.grad"])
def test_an_import_path_no_file_can_have(path: str) -> None:
    """A NUL or a lone surrogate: ValueError and UnicodeEncodeError from the OS layer."""
    [err] = errors_of(f'import "{path}"\nop f(x) -> y {{ y = x }}\n')
    assert (err.code, err.span.line, err.span.column) == ("E205", 1, 8)
    assert "no file can have this name" in err.message


SECRET = "hunter2-the-secret"


def _importing(folder: Path, target: str) -> str:
    (folder / "main.grad").write_text(f'import "{target}"\nop f(x) -> y {{ y = x }}\n')
    with pytest.raises(GradcError) as info:
        load_program(folder / "main.grad")
    return str(info.value)


def test_errors_in_an_imported_file_that_is_not_grad_quote_no_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text(f"x = 1 {SECRET}\n{SECRET}: more\n")
    text = _importing(tmp_path, "notes.txt")
    assert "notes.txt:1:1: error[E101]: expected an item ('op', 'const' or 'import'), " \
           "found 'x'" in text and SECRET not in text


@pytest.mark.parametrize("content", [f"{SECRET}: 1\n", b"\xff" + SECRET.encode(),
                                     f"op {SECRET}(x) -> y {{ y = \n"])
def test_nothing_of_a_file_outside_the_importing_files_folder(tmp_path: Path, content) -> None:
    """import "/etc/shadow" quoted its first line; a link out of the folder counts."""
    outside, project = tmp_path / "outside", tmp_path / "project"
    outside.mkdir(), project.mkdir()
    secret = outside / "secret.grad"
    secret.write_bytes(content.encode() if isinstance(content, str) else content)
    (project / "link.grad").symlink_to(secret)
    for target in (str(secret), "../outside/secret.grad", "link.grad"):
        text = _importing(project, target)
        assert SECRET not in text and "hunter" not in text, text
        assert text.startswith(f"{project / 'main.grad'}:1:8: error[E205]: cannot import "
                               f"'{target}': it is not a .grad file gradc can read, and it "
                               "lies outside the folder of the importing file")
    # given itself, it is shown
    with pytest.raises(GradcError, match=SECRET if isinstance(content, str) else "UTF-8"):
        load_program(secret)


def test_missing_main_file(tmp_path: Path) -> None:
    with pytest.raises(GradcError) as info:
        load_program(tmp_path / "none.grad")
    assert info.value.message.startswith("cannot read ")
    assert info.value.span is None


@pytest.mark.parametrize("call, warned", [
    ("max(x, -1)", True), ("min(x, 1)", True), ("max(x - 1, -2)", True), ("max(x, 0)", False),
    ("max(x, -1.0)", False), ("max(x, axis=-1, keepdims=true)", False),
    ("clip(x, -1, 1)", False), ("max(sum(x), 1)", False)])
def test_max_of_an_integer_warns_that_it_is_elementwise(call, warned):
    """``max(x, -1)`` is the largest along axis -1 in NumPy, JAX and PyTorch, the
    elementwise maximum with -1 here: W301 at the call, in a grad block too, saying how
    to write either; not for relu's ``max(x, 0)``, a float, an axis= or clip's bounds,
    nor where the first argument is 0-d (``max(sum(valid), 1)``, a count kept from 0,
    has no axis to mean: helper 73)."""
    import warnings

    import gradc
    text = (f"op f(x: f32[n, k]) -> y {{\n    y = x + {call}\n}} grad(dy) -> dx {{\n"
            f"    dx = dy * {call}\n}}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gradc.compile_source(text, file="w.grad")
    found = sorted({(w.message.span.line, w.message.span.column) for w in caught
                    if issubclass(w.category, gradc.GradcWarning) and w.message.code == "W301"})
    assert found == ([(2, 13), (4, 15)] if warned else []), [str(w.message) for w in caught]
    if warned:
        message = next(str(w.message) for w in caught if w.message.code == "W301")
        assert "of two arguments is elementwise" in message and ".0) to say so" in message
