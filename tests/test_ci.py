"""CI runs what the README shows: ``.ci/run``'s commands are the README's CI block,
line for line, and that block is the README's test command with every optional part
required (tests/optional.py)."""
from __future__ import annotations

import re
from pathlib import Path

from markdown_it import MarkdownIt
from optional import REQUIRE

ROOT = Path(__file__).resolve().parents[1]


def commands(text: str) -> list[str]:
    """The command lines of a shell text: no comments, blank lines or shell setup."""
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]


def readme_sh_blocks() -> list[str]:
    """The ``sh`` blocks of README.md's "Tests" section, in order."""
    tokens = MarkdownIt("commonmark").parse((ROOT / "README.md").read_text(encoding="utf-8"))
    out, section = [], None
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            section = tokens[i + 1].content
        elif tok.type == "fence" and tok.info.split()[:1] == ["sh"] and section == "Tests":
            out.append(tok.content)
    return out


def test_ci_runs_the_readme_ci_block():
    blocks = readme_sh_blocks()
    assert len(blocks) == 2, "README's Tests section: the test command, then CI's"
    ci = commands((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    assert ci == commands(blocks[1]), ".ci/run and README's CI block differ"


def test_ci_block_is_the_test_command_with_every_part_required():
    newcomer, ci = (commands(b) for b in readme_sh_blocks())
    (install, pytest_cmd) = newcomer[0].split(" && ")
    assert install.startswith("pip install -e \".[test") and pytest_cmd.startswith("python -m pytest")
    required = sorted(f"{var}=1" for var in REQUIRE.values())
    assert sorted(ci[-1].split(" python -m pytest")[0].split()) == required, ci[-1]
    assert ci[-1].endswith(pytest_cmd), "CI's pytest line is not the README's"
