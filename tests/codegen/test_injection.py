"""Injection-proof code generation (issue 3, section 3.2).

No text of a .grad file reaches the generated module except as a mangled
identifier (:func:`gradc.codegen.quote.py_name`), escaped inside a comment or
docstring, or inside a ``repr`` string literal (``NAME.spec``).  Names that
collide with the module's own (``os``, ``np``, ``OPS``, ``_GradcOp``, ``_T``...),
Python keywords and soft keywords, and names differing only by underscores all
compile to modules that import and compute the right values.
"""
from __future__ import annotations

import ast
import keyword
import math
import os
import symtable
import tokenize
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import gradc
from gradc.codegen.quote import RESERVED, comment, docstring, is_plain, py_literal, py_name

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
IDENTIFIERS = st.from_regex(r"[A-Za-z_u][A-Za-z0-9_u]{0,8}", fullmatch=True)

# Every name the generated module defines or uses without a leading underscore, and
# the underscored names of its helpers, kernels and wrapper locals.
MODULE_NAMES = ["os", "np", "numba", "math", "OPS", "SOURCE_SHA256", "__gradc_version__",
                "__all__", "__name__", "__doc__", "__import__", "_GradcOp", "_g_inputs",
                "_g_finish", "_g_launch", "_G_FLOATS", "_G_PARALLEL_MIN", "_T", "_RT", "_n",
                "_d", "_s", "_r", "_out", "_S", "_v1", "_SIG_f", "_SPEC_f", "_gk_f_forward_0",
                "_gu_mul", "_K", "_i", "_o0", "_ka", "_par"]
PYTHON_NAMES = ["lambda", "None", "True", "False", "class", "def", "return", "import",
                "match", "case", "type", "_", "len", "tuple", "isinstance", "print", "range",
                "ValueError", "TypeError", "object", "super", "property"]
SUFFIXES = ["x", "x_", "x__", "u_xu", "u_xu_", "_x", "_x_", "np_", "u_npu", "out_",
            "u_Tu", "u_Tu_", "u__u"]


@given(IDENTIFIERS, IDENTIFIERS)
def test_py_name_is_injective(a: str, b: str) -> None:
    assume(a != b)
    assert py_name(a) != py_name(b)


@given(IDENTIFIERS)
def test_py_name_is_a_safe_identifier(name: str) -> None:
    p = py_name(name)
    assert p.isidentifier() and not keyword.iskeyword(p)
    assert not p.startswith("_") and p not in RESERVED
    assert (p == name) == is_plain(name)


def test_tricky_names_never_collide() -> None:
    names = MODULE_NAMES + PYTHON_NAMES + SUFFIXES + [py_name(n) for n in MODULE_NAMES]
    names = sorted(set(names))
    assert len({py_name(n) for n in names}) == len(names)


@pytest.mark.parametrize("target", ["cpu", "all"])
def test_reserved_names_cover_every_global_the_module_reads(target) -> None:
    """A user name may not rebind or shadow a global of the module: every global
    it reads without a leading underscore is reserved (so mangled), the CUDA
    target's too (``cuda``, ``stream``...; writing it needs no numba-cuda)."""
    text = gradc.compile_source((EXAMPLES / "seed.grad").read_text(encoding="utf-8"),
                                file="seed.grad", target=target)
    used: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            if table.get_type() == "module":
                if sym.is_referenced() and not sym.is_assigned() and not sym.is_imported():
                    used.add(sym.get_name())
            elif sym.is_global() and sym.is_referenced():
                used.add(sym.get_name())
        for child in table.get_children():
            walk(child)

    walk(symtable.symtable(text, "seed_gen.py", "exec"))
    ops = set(ast.literal_eval(text.rsplit("__all__ = ", 1)[1])) - {"OPS"}
    public = {n for n in used if not n.startswith("_")} - ops
    assert public <= RESERVED, sorted(public - RESERVED)


# ---- ops and parameters named after everything ---------------------------------------

OP_NAMES = [n for n in dict.fromkeys(MODULE_NAMES + PYTHON_NAMES + SUFFIXES + ["f", "f_", "u_fu"])
            if n != "import"]        # 'import' starts an import item at top level


@pytest.fixture(scope="module")
def hostile(import_module_text):
    ops = "\n".join(f"op {n}(x) -> y {{ y = x * x }}" for n in OP_NAMES)
    params = SUFFIXES + ["np", "os", "math", "numba", "out", "OPS", "lambda", "None", "match",
                         "case", "type", "_T", "_n", "_d", "_out", "_v1", "_r", "_s", "len"]
    body = " + ".join(f"{k + 1} * {p}" for k, p in enumerate(params))
    kw = ["lambda", "x_", "np", "_T", "__a", "None", "type", "u_Tu", "u_Tu_"]
    kw_params = ", ".join(f"{p}: nograd = {k + 2}" for k, p in enumerate(kw))
    kw_body = " + ".join(kw)
    source = (f"{ops}\n"
              f"op many({', '.join(p + ': f64[n]' for p in params)}) -> y {{\n"
              f"    y = {body}\n}}\n"
              f"op keywords(x, {kw_params}) -> y {{\n    y = x * ({kw_body})\n}}\n"
              "op ups(x) -> (y, z) {\n    y = 2 * x\n    z = 3 * x\n"
              "} grad(_T, lambda) -> out_ {\n    out_ = _T * 5 + lambda * 7\n}\n")
    text = gradc.compile_source(source, file="hostile.grad")
    return import_module_text(text, "gradc_test_hostile"), params, kw


def test_ops_named_after_module_globals_and_keywords(hostile) -> None:
    m, _, _ = hostile
    import numba
    assert m.os is os and m.np is np and m.math is math and m.numba is numba
    assert len(m.SOURCE_SHA256) == 64 and m.__gradc_version__ == gradc.__version__
    assert set(m.OPS) == set(OP_NAMES) | {"many", "keywords", "ups"}
    x = np.array([1.0, -2.0, 3.0])
    for name in OP_NAMES:
        op = m.OPS[name]
        assert op.__name__ == name and getattr(m, py_name(name)) is op
        np.testing.assert_array_equal(op(x), x * x)
        np.testing.assert_array_equal(op.vjp(x, np.ones(3))[0], 2 * x)
    assert set(m.__all__) == {"OPS", *map(py_name, m.OPS)}


def test_parameters_differing_only_by_underscores_keep_their_values(hostile) -> None:
    m, params, _ = hostile
    args = [np.array([float(k + 1)]) for k in range(len(params))]
    expected = sum((k + 1) * (k + 1) for k in range(len(params)))
    np.testing.assert_array_equal(m.many(*args), [expected])
    grads = m.many.vjp(*args, np.array([1.0]))
    np.testing.assert_array_equal(np.concatenate(grads), np.arange(1.0, len(params) + 1))
    np.testing.assert_array_equal(np.concatenate(m.many.fwd_bwd(*args, np.ones(1))),
                                  [expected, *range(1, len(params) + 1)])
    assert m.many.signature.startswith("(" + ", ".join(p + ": f64[n]" for p in params) + ")")


def test_keyword_parameters_keep_their_user_names(hostile) -> None:
    m, _, kw = hostile
    x = np.array([1.0, 2.0])
    defaults = sum(range(2, len(kw) + 2))
    np.testing.assert_array_equal(m.keywords(x), x * defaults)
    given_ = {name: 0.0 for name in kw} | {"lambda": 1.0, "__a": 2.0}
    np.testing.assert_array_equal(m.keywords(x, **given_), x * 3.0)
    np.testing.assert_array_equal(m.keywords.vjp(x, np.ones(2), **given_)[0], [3.0, 3.0])
    np.testing.assert_array_equal(m.keywords.unfused.fwd_bwd(x, np.ones(2), **given_)[1],
                                  [3.0, 3.0])
    with pytest.raises(TypeError, match="unexpected keyword argument 'lambda_'"):
        m.keywords(x, lambda_=1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lambd'"):
        m.keywords(x, lambd=1.0)
    assert "lambda: nograd = 2" in m.keywords.signature


def test_upstream_names_that_are_module_names(hostile) -> None:
    m, _, _ = hostile
    (dx,) = m.ups.vjp(np.ones(2), np.ones(2), np.full(2, 2.0))
    np.testing.assert_array_equal(dx, [19.0, 19.0])
    with pytest.raises(ValueError, match=r"upstream '_T' must have the output's shape"):
        m.ups.vjp(np.ones(2), np.ones(3), np.ones(2))


def test_a_default_named_out_is_an_error() -> None:
    with pytest.raises(gradc.GradcError) as exc:
        gradc.compile_source("op f(x, out: nograd = 1) -> y { y = x * out }", file="o.grad")
    assert str(exc.value).startswith("o.grad:1:9: error[E207]: a parameter with a default "
                                     "cannot be named 'out'")
    gradc.compile_source("op f(x, out) -> y { y = x * out }", file="o.grad")   # positional: fine


# ---- text of the file in comments, docstrings and NAME.spec ---------------------------

NASTY = ['"""', "'''", "\\", "\\\\", '\\"""', "\r", "\x00", "\x0b", "\x0c", "\x1b[2J",
         "\u2028", "\u2029", "\x85", "\u202e", "\ud800", "é", "'", '"']
PAYLOAD = "\rINJECTED = 1\r" + "".join(NASTY)


def test_comments_with_quotes_backslashes_and_line_breaks(import_module_text) -> None:
    source = (f"# {PAYLOAD}\n"
              f"op f(x) -> y {{  # {PAYLOAD}\n    y = x * 2  # {PAYLOAD}\n"
              f"}} grad(dy) -> dx {{  # {PAYLOAD}\n    dx = dy * 3\n}}\n")
    text = gradc.compile_source(source, file="nasty.grad")
    _assert_clean(text)
    m = import_module_text(text, "gradc_test_nasty_comments")
    assert not hasattr(m, "INJECTED")
    assert m.f.spec == source[source.index("op f"):source.rindex("}") + 1]
    np.testing.assert_array_equal(m.f(np.ones(2)), [2.0, 2.0])
    np.testing.assert_array_equal(m.f.vjp(np.ones(2), np.ones(2))[0], [3.0, 3.0])


def test_file_names_with_quotes_and_line_breaks(import_module_text) -> None:
    name = f'evil"""{PAYLOAD}\\.grad'.replace("\ud800", "")
    text = gradc.compile_source("op f(x) -> y { y = x + 1 }", file=name)
    _assert_clean(text)
    m = import_module_text(text, "gradc_test_nasty_file")
    assert not hasattr(m, "INJECTED")
    assert m.__doc__.startswith(f"Kernels compiled by gradc from {name}.")
    np.testing.assert_array_equal(m.f(np.zeros(2)), [1.0, 1.0])


def test_imported_file_names_in_kernel_comments(tmp_path, import_module_text) -> None:
    lib = "lib\rINJECTED = 1\r\u2028.grad"
    (tmp_path / lib).write_text("op twice(x) -> y {\n    y = 2 * x\n}\n", encoding="utf-8")
    main = tmp_path / "main.grad"
    main.write_text(f'import "{lib}"\nop f(x) -> y {{ y = twice(x) + 1 }}\n', encoding="utf-8")
    out = gradc.compile_file(main, tmp_path / "main_gen.py")
    text = out.read_text(encoding="utf-8")
    _assert_clean(text)
    assert "# from lib\\rINJECTED = 1\\r\\u2028.grad:2" in text
    m = import_module_text(text, "gradc_test_nasty_import")
    assert not hasattr(m, "INJECTED")
    np.testing.assert_array_equal(m.f(np.ones(2)), [3.0, 3.0])


def _assert_clean(text: str) -> None:
    """No character that any tool reads as a line break, or that a terminal obeys,
    outside ``\\n``: every user text was escaped."""
    assert not set(text) & set("\r\x00\x0b\x0c\x1b\x1c\x1d\x1e\x85\u2028\u2029\u202e\ud800")
    compile(text, "generated.py", "exec")


@pytest.mark.parametrize("source, column", [
    ("op \uff46(x) -> y { y = x }", 4),                 # fullwidth f
    ("op f(\u0445) -> y { y = \u0445 }", 6),            # Cyrillic ha
    ("op f(x) -> y { y = x\u200b + 1 }", 21),           # zero-width space
    ("op f(x) -> y { y = x \uff0b 1 }", 22),            # fullwidth plus
    ("op f(x) -> y {\n    y = e\u0301 * x\n}", 10),       # combining accent
    ("op f(x) -> y { y = x }\u2028", 23),               # line separator
])
def test_unicode_look_alikes_are_errors_with_a_position(source: str, column: int) -> None:
    with pytest.raises(gradc.GradcError) as exc:
        gradc.compile_source(source, file="u.grad")
    assert exc.value.span.column == column, str(exc.value)
    assert "unexpected character" in exc.value.message


# ---- values that repr() would write as undefined names ---------------------------------

def test_infinite_and_nan_defaults_and_constants(import_module_text) -> None:
    source = ("const N = inf - inf\n"
              "op f(x, a: nograd = inf, b: nograd = -inf, c: nograd = N,"
              " d: nograd = 100000000000000000000000000000) -> (y, z) {\n"
              "    y = x + a + b + c + d\n    z = -inf\n}\n")
    m = import_module_text(gradc.compile_source(source, file="inf.grad"), "gradc_test_inf")
    y, z = m.f(np.ones(2))
    assert np.isnan(y).all() and z == -np.inf
    y, _ = m.f(np.ones(2), b=0.0, c=0.0, d=0.0)
    assert (y == np.inf).all()


@pytest.mark.parametrize("value, text", [
    (math.inf, "math.inf"), (-math.inf, "-math.inf"), (math.nan, "math.nan"), (0.1, "0.1"),
    (10**30, repr(10**30)), (True, "True"), (np.float32(0.5), "0.5"), (np.bool_(True), "True"),
])
def test_py_literal(value, text: str) -> None:
    assert py_literal(value) == text


def test_comment_and_docstring_escape_what_would_end_them() -> None:
    assert comment("a\rb\nc\u2028") == "a\\rb\\nc\\u2028"
    assert docstring('say """\\') == 'say \\"\\"\\"\\\\'
    assert eval('"""' + docstring('x"""\\\n\r\x00\U0001f600\ud800') + '"""') == \
        'x"""\\\n\r\x00\U0001f600\ud800'


# ---- file names Python would read as an encoding, or that end a docstring -------------

# Python takes a line 1 or 2 matching 'coding[:=]' as the file's encoding (PEP 263).
CODING_NAMES = ["coding=raw_unicode_escape \\u000aprint('INJECTED')\\u000a#.grad",
                "ops coding=bogus v1.grad", "coding=utf-16 x.grad", 'q"""uote.grad']


def _decodes_as_utf8(path: Path) -> None:
    with path.open("rb") as f:
        assert tokenize.detect_encoding(f.readline)[0] == "utf-8"
    compile(path.read_bytes(), str(path), "exec")       # bytes: Python decodes them itself


@pytest.mark.parametrize("name", CODING_NAMES)
def test_a_file_name_never_decides_the_encoding(tmp_path, monkeypatch, capfd, name) -> None:
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / name
    src.write_text("op f(x) -> y { y = x * 2 }\n", encoding="utf-8")
    m = gradc.load(src)
    assert m.f.spec == "op f(x) -> y { y = x * 2 }" and m.__doc__.startswith(
        f"Kernels compiled by gradc from {name}.")
    _decodes_as_utf8(Path(m.__file__))
    _decodes_as_utf8(gradc.compile_file(src, tmp_path / "out_gen.py"))    # gradc compile
    assert "INJECTED" not in capfd.readouterr().out


def test_testgen_and_emit_escape_the_file_name(tmp_path) -> None:
    from gradc.adapters.emit import torch_module_text
    from gradc.tools.testgen import write_tests
    name = CODING_NAMES[0].replace(".grad", '"""\\.grad')
    src = tmp_path / name
    src.write_text("op f(x) -> y { y = x * 2 }\n", encoding="utf-8")
    out = write_tests(src, tmp_path / 'test_"""ops.py')[0]
    _decodes_as_utf8(out)
    doc = ast.get_docstring(ast.parse(out.read_text(encoding="utf-8")))
    assert doc.startswith(f"Tests of the ops of {name}, generated by") and \
        f'-o {out.as_posix()}' in doc
    emitted = tmp_path / "torch_ops.py"
    emitted.write_text(torch_module_text(src, emitted, ["f"], {}), encoding="utf-8")
    _decodes_as_utf8(emitted)
    assert ast.get_docstring(ast.parse(emitted.read_text(encoding="utf-8"))).startswith(
        f"PyTorch functions of the ops of {name}, written")
