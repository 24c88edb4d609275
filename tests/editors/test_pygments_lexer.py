"""The Pygments lexer of .grad files: no Error token on valid input, the right token
types, its words equal to the grammar's and the builtin table, the plugin entry point."""
from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from lark import Lark
from lark.lexer import PatternStr
from pygments.token import Comment, Error, Keyword, Name, Number, Operator, Punctuation, String

from gradc.frontend.builtins import BUILTINS, CONSTANTS, DTYPES
from gradc.frontend.parser import grammar_path
from gradc.editors.pygments_lexer import GradLexer
from gradc.editors.syntax import grammar_keywords

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.grad"))


def tokens(text: str) -> list[tuple]:
    return [(t, v) for t, v in GradLexer().get_tokens(text) if v.strip()]


def lark_keywords(grammar: str) -> set[str]:
    """Lark's own reading of the grammar: terminals that are one literal word."""
    terms = Lark(grammar, parser="lalr").terminals
    return {t.pattern.value for t in terms
            if isinstance(t.pattern, PatternStr) and t.pattern.value.isidentifier()}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_lex_without_error_tokens(path):
    text = path.read_text()
    toks = list(GradLexer().get_tokens(text))
    assert [v for t, v in toks if t in Error] == []
    assert "".join(v for _, v in toks) == text if text.endswith("\n") else text + "\n"


def test_an_unknown_character_is_an_error_token():
    assert (Error, "$") in tokens("y = x $ 2")


def test_token_types_of_the_seed_file():
    toks = tokens((ROOT / "examples" / "seed.grad").read_text())
    assert toks[0] == (Comment.Single, "# The ops of the custom-gradient guide in "
                                       "seeds/custom-gradients-guide.txt.")
    k = toks.index((Name.Function, "custom_linear"))
    assert toks[k - 1] == (Keyword, "op")
    kinds = {}
    for t, v in toks:
        kinds.setdefault(v, set()).add(t)
    assert kinds["grad"] == {Keyword, Name.Builtin} and kinds["surrogate"] == {Keyword}
    block = toks.index((Keyword, "grad"), toks.index((Name.Function, "sign_ste")))
    assert toks[block + 1:block + 5] == [(Punctuation, "("), (Name, "dy"), (Punctuation, ")"),
                                         (Operator, "->")]
    assert toks[toks.index((Name, "g")) + 2] == (Name.Builtin, "grad")     # grad(EXPR, NAME)
    assert kinds["nograd"] == {Keyword} and kinds["f32"] == {Keyword.Type}
    for b in ("tanh", "ones_like", "clip", "logsumexp", "mean", "norm", "sign"):
        assert kinds[b] == {Name.Builtin}, b
    assert kinds["axis"] == {Name.Attribute}
    assert kinds["0.5"] == {Number.Float} and kinds["2"] == {Number.Integer}
    assert kinds["->"] == {Operator} and kinds["@"] == {Operator}
    assert kinds["w1"] == {Name} and kinds["dy"] == {Name}


def test_every_construct_of_the_language():
    text = ('import "lib.grad"\nconst scale = 2.5e-1\n'
            "op f(x: f32[b, n], a: nograd = 1e3) -> (y, z) {\n"
            "    y = sum(x.T ** 2, axis=0, keepdims=true) ^ .5; z = pi * e - inf\n"
            "    w = max(x, 0) >= min(x); v = grad(sum(y), x)  # note\n}\n")
    toks = tokens(text)
    assert toks[:5] == [(Keyword, "import"), (String.Double, '"lib.grad"'),
                        (Keyword.Declaration, "const"), (Name.Constant, "scale"),
                        (Operator, "=")]
    assert (Number.Float, "2.5e-1") in toks and (Number.Float, "1e3") in toks
    assert (Number.Float, ".5") in toks and (Operator, ".T") in toks
    assert (Operator, "**") in toks and (Operator, ">=") in toks
    assert (Name.Attribute, "keepdims") in toks and (Keyword.Constant, "true") in toks
    for c in ("pi", "e", "inf"):
        assert (Keyword.Constant, c) in toks
    assert (Name.Builtin, "max") in toks and (Name.Builtin, "min") in toks
    assert (Name.Builtin, "grad") in toks and toks[-2] == (Comment.Single, "# note")


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_called_is_a_builtin_token(name):
    assert tokens(f"y = {name}(x)")[2] == (Name.Builtin, name)
    assert tokens(f"{name}_x = 1")[0] == (Name, f"{name}_x")     # only the whole word


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_of_an_annotation(dtype):
    assert (Keyword.Type, dtype) in tokens(f"op f(x: {dtype}[b]) -> y {{ y = x }}")


def test_keywords_are_the_grammars():
    """Fails when the grammar gains a keyword the lexer lacks (Lark's own reading of
    the grammar against the words the lexer highlights)."""
    grammar = grammar_path().read_text(encoding="utf-8")
    assert set(GradLexer.keywords) == lark_keywords(grammar) == set(grammar_keywords(grammar))
    for word in GradLexer.keywords:
        assert tokens(f"{word} x")[0][0] in Keyword, word
    more = grammar.replace("\n_item: ", "\n_item: while_loop | ", 1) + \
        '\nwhile_loop: WHILE STRING\nWHILE.2: "while"\n'      # a new keyword, with a priority
    assert "while" in grammar_keywords(more)
    assert lark_keywords(more) - set(GradLexer.keywords) == {"while"}     # what would fail
    assert set(GradLexer.builtins) == set(BUILTINS) and set(CONSTANTS) <= {
        v for t, v in tokens(" ".join(CONSTANTS)) if t is Keyword.Constant}


def test_the_entry_point_registers_the_lexer():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    value = project["entry-points"]["pygments.lexers"]["gradc"]
    assert metadata.EntryPoint("gradc", value, "pygments.lexers").load() is GradLexer
    assert any("pygments" in dep for dep in project["optional-dependencies"]["docs"])
    installed = [e for e in metadata.entry_points(group="pygments.lexers") if e.name == "gradc"]
    if installed and installed[0].value != value:     # installed from an older pyproject.toml
        pytest.skip(f"the installed gradc registers {installed[0].value}, this tree {value}: "
                    "reinstall (pip install -e .) to check that Pygments finds the lexer")
    if installed:                 # an installed gradc (CI's pip install -e): Pygments finds it
        from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
        assert type(get_lexer_by_name("gradc")) is GradLexer
        assert type(get_lexer_for_filename("ops.grad")).__name__ == "GradLexer"


def test_pygmentize_highlights_a_file():
    r = subprocess.run([sys.executable, "-m", "pygments", "-x", "-l",
                        f"{ROOT / 'gradc' / 'editors' / 'pygments_lexer.py'}:GradLexer", "-f", "html",
                        str(ROOT / "examples" / "seed.grad")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert '<span class="k">op</span>' in r.stdout and '<span class="nb">tanh</span>' in r.stdout
