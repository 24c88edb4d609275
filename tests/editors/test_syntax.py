"""The TextMate grammar grammars/grad.tmLanguage.json: generated from gradc's tables,
valid JSON, every regex compiled by Oniguruma (the engine of VS Code and Sublime's
TextMate grammars) and by Python's re, and scopes right on the example files."""
from __future__ import annotations

import json
import plistlib
import re
import subprocess
import sys
from pathlib import Path

import onigurumacffi
import pytest

from gradc.editors import syntax
from gradc.frontend.builtins import BUILTINS, CONSTANTS, DTYPES
from gradc.frontend.calls import KEEPDIMS_NAMES
from gradc.frontend.parser import grammar_path

from test_pygments_lexer import lark_keywords

ROOT = Path(__file__).resolve().parents[2]
TM = ROOT / "grammars" / "grad.tmLanguage.json"


def grammar() -> dict:
    return json.loads(TM.read_text(encoding="utf-8"))


def words_of(regex: str) -> set[str]:
    """The words of an ``\\b(?:w1|w2)\\b`` alternation."""
    body = re.fullmatch(r"\\b\(\?:(.*?)\)\\b.*", regex)[1]
    return {w.replace("\\", "") for w in body.split("|")}


def test_the_file_is_the_generated_grammar():
    assert TM.read_text(encoding="utf-8") == syntax.textmate_json(), \
        "regenerate it: python -m gradc.editors.syntax > grammars/grad.tmLanguage.json"
    g = grammar()
    assert g["scopeName"] == "source.grad" and g["fileTypes"] == ["grad"]
    assert [p["include"] for p in g["patterns"]] == [f"#{k}" for k in g["repository"]]


def test_every_regex_compiles_in_oniguruma_and_python():
    regexes = [r["match"] for r in grammar()["repository"].values()]
    assert len(regexes) == len(grammar()["repository"]) >= 10
    for rx in regexes:
        onigurumacffi.compile(rx)
        re.compile(rx)
    with pytest.raises(onigurumacffi.OnigError):     # the check can fail
        onigurumacffi.compile(r"(?:unclosed")


def test_word_lists_are_gradcs_tables():
    repo = grammar()["repository"]
    assert words_of(repo["keyword"]["match"]) == lark_keywords(
        grammar_path().read_text(encoding="utf-8"))
    assert words_of(repo["builtin"]["match"]) == set(BUILTINS)
    assert words_of(repo["dtype"]["match"]) == set(DTYPES)
    assert words_of(repo["constant"]["match"]) == set(CONSTANTS) | set(KEEPDIMS_NAMES)
    assert words_of(repo["kwarg"]["match"]) == {k for b in BUILTINS.values()
                                                for k in (*b.kwargs, *b.attrs)}
    assert {"axis", "keepdims", "reverse", "shape", "axis2"} <= words_of(repo["kwarg"]["match"])


def scopes(text: str) -> list[tuple[str, str]]:
    """(matched text, scope) of each match, scanning as a TextMate engine does: at
    each position the earliest match of any pattern, ties to the first pattern."""
    repo = grammar()["repository"]
    rules = [repo[p["include"][1:]] for p in grammar()["patterns"]]
    regset = onigurumacffi.compile_regset(*(r["match"] for r in rules))
    out = []
    for line in text.splitlines():
        pos = 0
        while pos < len(line):
            k, m = regset.search(line, pos)
            if m is None:
                break
            if "captures" in rules[k]:
                out += [(m.group(int(i)), c["name"]) for i, c in rules[k]["captures"].items()]
            else:
                out.append((m.group(0), rules[k]["name"]))
            pos = max(m.end(), pos + 1)
    return out


def test_scopes_of_the_examples():
    seed = scopes((ROOT / "examples" / "seed.grad").read_text())
    kinds: dict[str, set[str]] = {}
    for text, scope in seed:
        kinds.setdefault(text, set()).add(scope)
    assert ("op", "keyword.other.grad") in seed and ("custom_linear", "entity.name.function.grad") in seed
    assert kinds["surrogate"] == {"keyword.other.grad"} and kinds["nograd"] == {"keyword.other.grad"}
    assert kinds["grad"] == {"keyword.other.grad", "support.function.builtin.grad"}
    assert kinds["tanh"] == {"support.function.builtin.grad"}
    assert kinds["f32"] == {"storage.type.grad"} and kinds["axis"] == {"variable.parameter.grad"}
    assert kinds["0.5"] == {"constant.numeric.grad"} and kinds["->"] == {"keyword.operator.grad"}
    assert seed[0] == ("# The ops of the custom-gradient guide in seeds/custom-gradients-guide.txt.",
                       "comment.line.number-sign.grad")
    act = scopes((ROOT / "examples" / "activations.grad").read_text())
    assert ("gelu_tanh", "entity.name.function.grad") in act
    assert scopes("h1 = w2 @ b1") == [("=", "keyword.operator.grad"),
                                       ("@", "keyword.operator.grad")]   # no number in a name
    other = scopes('import "lib.grad"\nconst c = 1e-3\ny = x.T ^ .5 + pi\n')
    assert other == [("import", "keyword.other.grad"), ('"lib.grad"', "string.quoted.double.grad"),
                     ("const", "storage.type.const.grad"), ("c", "variable.other.constant.grad"),
                     ("=", "keyword.operator.grad"), ("1e-3", "constant.numeric.grad"),
                     ("=", "keyword.operator.grad"), (".T", "keyword.operator.grad"),
                     ("^", "keyword.operator.grad"), (".5", "constant.numeric.grad"),
                     ("+", "keyword.operator.grad"), ("pi", "constant.language.grad")]


def test_the_property_list_form_is_the_same_grammar():
    """``python -m gradc.editors.syntax --plist`` (Sublime Text's form) holds the same grammar."""
    r = subprocess.run([sys.executable, "-m", "gradc.editors.syntax", "--plist"], capture_output=True,
                       cwd=ROOT, check=True)
    assert plistlib.loads(r.stdout) == grammar()
    assert r.stdout.startswith(b"<?xml") and b"<string>source.grad</string>" in r.stdout
