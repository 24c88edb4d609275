"""The code in README.md and docs/*.md runs, so that the documentation cannot rot.

Fenced blocks are found with markdown-it-py (CommonMark), and what is done with
each depends on its info string (the words after the opening fence):

- ``python``: run.  A page's python blocks run in order in one namespace, as a
  reader would type them into one interpreter, in a fresh working directory that
  links to the repository's top-level entries (``examples/``...), as a reader's
  checkout would hold them: the files a page writes land there, never in the
  repository, and two runs never share one.  (README.md's fragments use arrays they
  do not define: ``README_SETUP`` below defines them.)
- ``pycon``: an interactive session (``>>>`` prompts and what they print), run by
  the standard library's ``doctest`` in the same namespace, in page order with
  the python blocks; the output must be what is shown (``...`` elides, and runs
  of whitespace are equal).
- ``console``: a shell session, run in page order with the python blocks.  Each line starting ``$ `` is a command (a line
  ending in ``\\`` continues it); the lines after it, up to the next command, are
  its expected output (stdout and stderr together).  A line ``...`` stands for
  any number of lines, and ``...`` at the end of a line for the rest of it;
  trailing spaces are ignored.  ``gradc`` and ``python`` run with this
  interpreter, in the page's working directory.
- ``grad``: a whole .grad file; ``gradc check`` must pass on it (exit status 0:
  every gradient checked, every custom rule exact or marked ``surrogate``), as a
  file ``ops.grad`` beside copies of ``examples/*.grad`` (so ``import "seed.grad"``
  finds the example).  ``grad error``: it must fail with a ``GradcError``, whose
  rendered message must equal the page's next block when that block's info string
  is ``text error``.  ``grad fails``: a bad example that compiles but fails
  ``gradc check`` (exit status 1); when the next block is ``text``, it is the
  check's output (finite-difference errors not compared).  ``grad fragment``: part
  of a file (a template, an excerpt), which must not compile alone.  A block that
  is not marked ``grad`` must not hold .grad source (``test_grad_text_is_marked``).
- ``notest`` after the language (``python notest``, ``console notest``):
  illustrative only, not run; each such block says why beside it.
- Any other block (no info string, ``text``) is not code.
"""
from __future__ import annotations

import doctest
import linecache
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from markdown_it import MarkdownIt
from optional import REQUIRE, missing

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int              # 1-based line of the opening fence
    lang: str
    options: frozenset[str]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    out = []
    for tok in MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8")):
        if tok.type == "fence" and tok.map:
            words = tok.info.split()
            out.append(Block(page, tok.map[0] + 1, words[0] if words else "",
                             frozenset(words[1:]), tok.content))
    return out


ALL = [b for page in PAGES for b in blocks(page)]


def _run(kind: str) -> list[Block]:
    return [b for b in ALL if b.lang == kind and "notest" not in b.options]


def _ids(bs: list[Block]) -> list[str]:
    return [b.where for b in bs]


# -- python -----------------------------------------------------------------------------

def README_SETUP() -> dict:
    """The arrays README.md's fragments use without defining them (float32: the
    shapes of the mlp example, which also suit the elementwise ops)."""
    rng = np.random.default_rng(0)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return {"x": f(4, 3), "dy": f(4, 3), "x_t": f(4, 3), "w1": f(3, 5), "b1": f(5),
            "w2": f(5, 2), "b2": f(2), "dlogits": f(4, 2)}


PAGES_RUN = sorted({b.page for b in _run("python") + _run("pycon") + _run("console")})
DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def checkout(folder: Path) -> Path:
    """``folder`` made to look like the repository's root, where a reader runs the
    pages' commands: a link to each of its top-level entries (``examples/``...)."""
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (folder / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return folder


@pytest.mark.parametrize("page", PAGES_RUN, ids=[str(p.relative_to(ROOT)) for p in PAGES_RUN])
def test_code_blocks_run(page, monkeypatch, tmp_path):
    """The page's python, pycon and console blocks, in page order (a console block
    may use a file a python block wrote, as a reader's shell would), in a folder of
    their own: what a page writes in its working directory stays out of the
    repository."""
    cwd = checkout(tmp_path)
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(ROOT))
    temp = tmp_path / "temp"                 # what a page leaves in the temp folder
    temp.mkdir()                             # (Dask's dask-scratch-space) goes here
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    namespace = {"__name__": "__docs__"}
    if page.name == "README.md":
        namespace.update(README_SETUP())
    for b in ALL:
        if b.page != page or "notest" in b.options:
            continue
        if b.lang == "python":
            # tracebacks: page lines; the source registered with linecache under its own
            # name, so that inspect (and torch.compile's Dynamo, which reads a function's
            # source) sees Python, not the Markdown page around the block
            name = f"<{b.page.relative_to(ROOT)}:{b.line}>"
            source = "\n" * b.line + b.text
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            try:
                exec(compile(source, name, "exec"), namespace)
            except ModuleNotFoundError as exc:
                if exc.name not in REQUIRE:          # an optional part's module: skip
                    raise
                missing(exc.name, f"{b.where} imports {exc.name}, which is not installed")
        elif b.lang == "pycon":
            test = doctest.DocTestParser().get_doctest(b.text, namespace, b.where,
                                                       str(b.page), b.line)
            test.globs = namespace                   # DocTest copies; share the page's
            runner = doctest.DocTestRunner(optionflags=DOCTEST_FLAGS)
            out: list[str] = []
            runner.run(test, out=out.append, clear_globs=False)
            assert runner.failures == 0, "".join(out)
        elif b.lang == "console":
            run_session(b, cwd)


# -- console ----------------------------------------------------------------------------

def session(text: str) -> list[tuple[str, list[str]]]:
    """The (command, expected output lines) pairs of a console block."""
    pairs: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"a console block must start with a '$ ' command: {lines[i]!r}")
        command = lines[i][2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + lines[i].strip()
        i += 1
        output = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i].rstrip())
            i += 1
        pairs.append((command, output))
    return pairs


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` fits ``expected``, where the line ``...`` matches any
    lines and a line ending in ``...`` any line that starts with the rest."""
    pattern = []
    for line in expected:
        if line == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        elif line.endswith("..."):
            pattern.append(re.escape(line[:-3]) + r"[^\n]*\n")
        else:
            pattern.append(re.escape(line) + r"\n")
    return re.fullmatch("".join(pattern), "".join(l + "\n" for l in actual)) is not None


def run_command(command: str, cwd: Path = ROOT) -> list[str]:
    prelude = (f'gradc() {{ "{sys.executable}" -m gradc "$@"; }}; '
               f'python() {{ "{sys.executable}" "$@"; }}; ')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    env.pop("NO_COLOR", None)
    proc = subprocess.run(["bash", "-c", prelude + command], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    return [l.rstrip() for l in proc.stdout.rstrip("\n").splitlines()]


def run_session(block: Block, cwd: Path = ROOT) -> None:
    for command, expected in session(block.text):
        actual = run_command(command, cwd)
        assert matches(expected, actual), (
            f"{block.where}: $ {command}\n--- shown\n" + "\n".join(expected)
            + "\n--- printed\n" + "\n".join(actual))


def test_console_matching():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"]) and matches(["a", "..."], ["a"])
    assert matches(["took ... ms..."], ["took ... ms, 3 runs"])
    assert not matches(["a", "d"], ["a", "b", "d"]) and not matches(["a"], ["a", "b"])
    assert session("$ gradc a \\\n    --b\nout\n$ c\n") == [("gradc a --b", ["out"]),
                                                           ("c", [])]


# -- grad -------------------------------------------------------------------------------

GRAD = _run("grad")


def _following(block: Block) -> Block | None:
    later = [b for b in ALL if b.page == block.page and b.line > block.line]
    return later[0] if later else None


def _masked(text: str) -> list[str]:
    """Lines of a check's output; finite-difference errors depend on the platform's
    math library, so they are not compared."""
    return [re.sub(r"rel\. error \d\.\de[+-]\d\d", "rel. error ?", line.rstrip())
            for line in text.rstrip("\n").splitlines()]


def gradc_check(text: str, folder: Path, capsys) -> tuple[int, str]:
    """``gradc check ops.grad`` on ``text``, in ``folder`` beside copies of the
    example files: the exit status, and stdout then stderr."""
    from gradc.tools.cli import main
    for example in (ROOT / "examples").glob("*.grad"):
        shutil.copy(example, folder)
    (folder / "ops.grad").write_text(text, encoding="utf-8")
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        status = main(["check", "ops.grad"])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr()
    return status, out.out + out.err


@pytest.mark.parametrize("block", GRAD, ids=_ids(GRAD))
def test_grad_blocks_check(block, tmp_path, capsys):
    from gradc.errors import GradcError
    from gradc.frontend.check import check_source
    file = str(ROOT / "examples" / "ops.grad")          # imports resolve in examples/
    if "error" in block.options or "fragment" in block.options:
        with pytest.raises(GradcError) as exc:
            check_source(block.text, file)
        shown = _following(block)
        if shown is not None and shown.lang == "text" and "error" in shown.options:
            rendered = exc.value.render().replace(file, "ops.grad")
            assert rendered.rstrip() == shown.text.rstrip()
        return
    status, printed = gradc_check(block.text, tmp_path, capsys)
    if "fails" not in block.options:
        assert status == 0, f"{block.where}: gradc check failed:\n{printed}"
        return
    assert status == 1, f"{block.where}: gradc check passed on a bad example:\n{printed}"
    shown = _following(block)
    if shown is not None and shown.lang == "text" and not shown.options:
        assert _masked(printed) == _masked(shown.text), (
            f"{shown.where}: not what gradc check prints:\n{printed}")


GRAD_SOURCE = re.compile(r"^(op [A-Za-z_]\w*\(|import \"|const [A-Za-z_]\w* =)", re.M)


def test_grad_text_is_marked():
    """.grad source shown in a plain block would escape the check above: every block
    that holds some is marked ``grad`` (``grad fragment`` for a part of a file)."""
    unmarked = [b.where for b in ALL if b.lang in ("", "text") and GRAD_SOURCE.search(b.text)]
    assert unmarked == []


def test_every_page_has_tested_code():
    """Each new page carries code that runs (the older pages are prose and tables)."""
    for name in ("language", "tutorial", "generated-module", "performance"):
        page = ROOT / "docs" / f"{name}.md"
        tested = [b for b in blocks(page) if b.lang in ("python", "pycon", "console", "grad")
                  and "notest" not in b.options]
        assert tested, f"{page.name} has no tested code block"


# -- the language reference -------------------------------------------------------------

def test_language_reference_documents_every_builtin_operator_and_dtype():
    from gradc.frontend.builtins import BUILTINS, CONSTANTS, DTYPES
    from gradc.ir.expr import INTERNAL
    from gradc.ir.primitives import BINARY_OPS, COMPARE_OPS, PRIMITIVES, SOURCE
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    # A builtin is documented by a table row or heading that starts with its call.
    called = set(re.findall(r"^(?:\| |### )`([a-z_0-9]+)\(", text, re.M))
    assert set(BUILTINS) - called == set(), "builtins missing from docs/language.md"
    assert called - set(BUILTINS) == set(), "docs/language.md documents unknown builtins"
    named = set(re.findall(r"^\| `([a-z]+)` \|", text, re.M))
    assert set(CONSTANTS) <= named, "constants missing from docs/language.md"
    for symbol in [*BINARY_OPS, *COMPARE_OPS, "**", ".T"]:
        assert f"`{symbol}`" in text or f" {symbol} y`" in text, symbol
    for dtype in DTYPES:
        assert f"`{dtype}" in text or f" {dtype} " in text, dtype
    # Every primitive a program can reach is a builtin, an operator or documented here.
    reachable = {p.name for p in PRIMITIVES.values() if p.kind != SOURCE} - set(INTERNAL)
    via = set(BUILTINS) | set(BINARY_OPS.values()) | set(COMPARE_OPS.values()) | {
        "neg", "maximum", "minimum", "full_like", "stop_gradient"}
    assert reachable - via == set(), "primitives no builtin or operator reaches"
    for name in ("op", "const", "import", "grad", "nograd", "surrogate", "axis=",
                 "keepdims="):
        assert f"`{name}" in text, name


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub makes them: lower case,
    punctuation other than ``-`` and ``_`` dropped, spaces made ``-``."""
    headings = re.findall(r"^#+ (.*)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_point_at_files():
    """A link from a page to a file of the repository (``[text](path)``) finds it, and
    a link to a heading of a page (``page.md#anchor``, ``#anchor``) finds the heading."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            assert path.exists(), f"{page.relative_to(ROOT)}: broken link {target}"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{page.relative_to(ROOT)}: no heading {target}"


# docs/cli.md shows some output without its command (plain blocks): each excerpt must
# still be what the command prints, line for line.
CLI_EXCERPTS = {
    "  fwd_bwd (9 nodes):": "gradc compile examples/seed.grad --emit ir --op scaled_tanh",
    "kernel plan of fwd_bwd (fused, CPU): 1 step(s)":
        "gradc explain examples/activations.grad leaky_relu",
    "bad.grad:8:9: error[E201]: unknown function 'tanhh'":
        "cd $(mktemp -d) && printf 'op f(x, z) -> y {\\n\\n\\n\\n\\n\\n\\n    y = tanhh(x) + z\\n}\\n'"
        " > bad.grad && gradc check bad.grad; rm -r $PWD",
}


@pytest.mark.parametrize("first", CLI_EXCERPTS)
def test_cli_output_excerpts_are_what_gradc_prints(first):
    plain = [b for b in blocks(ROOT / "docs" / "cli.md") if b.lang == ""]
    (block,) = [b for b in plain if b.text.startswith(first)]
    shown = [l.rstrip() for l in block.text.rstrip("\n").splitlines()]
    printed = run_command(CLI_EXCERPTS[first])
    starts = [i for i, l in enumerate(printed) if l == shown[0]]
    assert any(printed[i:i + len(shown)] == shown for i in starts), (
        f"{block.where}: no longer what '{CLI_EXCERPTS[first]}' prints:\n"
        + "\n".join(printed))


# -- the README and the index -----------------------------------------------------------

def test_readme_fits_on_two_screens():
    """At most 150 lines, with the sections a new user looks for; the rest is in docs/."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    headings = re.findall(r"^## (.+)$", text, re.M)
    for heading in ("Quick start", "Tests", "Command line", "What the language cannot do yet"):
        assert heading in headings, heading


def test_no_page_cites_the_spec():
    """The pages are the reference: they state each rule, never cite the project's
    design contract (SPEC.md, "SPEC §1"), which is not in the repository."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\bSPEC\b", text), f"{page.relative_to(ROOT)} cites SPEC"


def test_the_package_does_not_cite_the_spec():
    """Nor does what ships with gradc: its docstrings and comments, the templates, the
    runtime copied into every generated module.  Each names the page of docs/ that
    states the rule, or says it in plain words."""
    citing = []
    for file in sorted((ROOT / "gradc").rglob("*")):
        if not file.is_file() or "__pycache__" in file.parts:
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:                   # not text
            continue
        citing += [f"{file.relative_to(ROOT)}:{i}: {line.strip()}"
                   for i, line in enumerate(text.splitlines(), 1)
                   if re.search(r"\bSPEC\b", line)]
    assert citing == [], "cites SPEC:\n" + "\n".join(citing)


def test_index_links_every_page():
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", text))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages - linked == set(), "pages docs/index.md does not list"
