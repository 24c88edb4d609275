"""Terminal output: colour on a terminal only (NO_COLOR, --color), and --json."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from gradc.tools.cli import main
from gradc.tools.term import status, strip, style, use_color

ROOT = Path(__file__).resolve().parents[2]
ACTIVATIONS = ROOT / "examples" / "activations.grad"
ESC = "\x1b["

TINY = """
op halved_tanh(x) -> y {
    y = tanh(x)
} grad(dy) -> dx {
    dx = dy * (1 - y^2) * 0.5
}
"""
QUICK_BENCH = ["--sizes", "1e3", "--repeat", "2", "--warmup", "0", "--settle", "0",
               "--variants", "fused+out", "fused", "unfused", "numpy"]


def run_in_pty(args: list[str], **env: str) -> str:
    """Run ``python -m gradc ARGS`` with stdout and stderr on a pseudo-terminal;
    everything it wrote, decoded."""
    leader, follower = pty.openpty()
    # A new pseudo-terminal is 0 columns wide, and tqdm draws nothing in 0 columns.
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    environ.update(PYTHONPATH=str(ROOT), TERM="xterm", **env)
    proc = subprocess.Popen([sys.executable, "-m", "gradc", *args], stdin=follower,
                            stdout=follower, stderr=follower, env=environ, cwd=ROOT)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            raise TimeoutError(f"gradc {' '.join(args)} wrote nothing for 120 s")
        try:
            data = os.read(leader, 65536)
        except OSError:            # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("output") / "tiny.grad"
    path.write_text(TINY, encoding="utf-8")
    return path


# -- when to colour ---------------------------------------------------------------------


class _Tty:
    def isatty(self) -> bool:
        return True


def test_use_color_follows_the_conventions(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert use_color(_Tty()) and not use_color(object())      # no isatty: not a terminal
    assert use_color(object(), "always") and not use_color(_Tty(), "never")
    monkeypatch.setenv("NO_COLOR", "")            # empty: as if unset (no-color.org)
    assert use_color(_Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(_Tty()) and use_color(_Tty(), "always")
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not use_color(_Tty())
    with pytest.raises(ValueError, match="auto, always, never"):
        use_color(_Tty(), "sometimes")


def test_styles_are_sgr_sequences_that_strip_back_to_the_text():
    assert style("x", "bold", "green") == "\x1b[1;32mx\x1b[0m"
    assert style("x", "bold", on=False) == "x"
    line = "ok   swish: derivative vs finite differences"
    assert status(line).startswith("\x1b[1;32mok\x1b[0m") and strip(status(line)) == line
    assert strip(status("FAIL f: x")) == "FAIL f: x" and "31m" in status("FAIL f: x")
    assert "31mMISMATCH" in status("sign_ste(x=[1.])  MISMATCH")
    assert status("no status here") == "no status here"


# -- gradc check ------------------------------------------------------------------------


def test_check_piped_has_no_escapes_unless_forced(capsys, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["check", str(ACTIVATIONS)]) == 0
    plain = capsys.readouterr().out
    assert ESC not in plain and "ok   swish:" in plain
    assert main(["check", str(ACTIVATIONS), "--color", "always"]) == 0
    forced = capsys.readouterr().out
    assert "\x1b[1;32mok\x1b[0m   swish:" in forced and strip(forced) == plain


def test_check_on_a_terminal_is_coloured_and_no_color_turns_it_off():
    coloured = run_in_pty(["check", str(ACTIVATIONS)])
    assert "\x1b[1;32mok\x1b[0m   swish:" in coloured
    plain = run_in_pty(["check", str(ACTIVATIONS)], NO_COLOR="1")
    assert ESC not in plain and "ok   swish:" in plain
    assert ESC not in run_in_pty(["check", str(ACTIVATIONS), "--color", "never"])


def test_check_json_to_stdout_has_the_documented_fields(capsys):
    assert main(["check", str(ACTIVATIONS), "--json", "-"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)                  # stdout is JSON only
    assert "ok   swish:" in captured.err                # the text went to stderr
    assert {"spec", "seed", "gradc", "passed", "ops"} <= set(report)
    assert report["passed"] is True and report["spec"] == str(ACTIVATIONS)
    names = [o["op"] for o in report["ops"]]
    assert names == ["softplus_stable", "gelu_tanh", "swish", "huber", "log_sigmoid",
                     "leaky_relu", "add_bias"]
    for op in report["ops"]:
        assert {"op", "passed", "custom", "note", "checks"} <= set(op)
        assert [c["name"] for c in op["checks"]] == [
            "vjp_vs_finite_differences", "jvp_vs_vjp", "second_order"]
        for c in op["checks"]:
            assert {"name", "error", "tolerance", "passed"} <= set(c)
            assert c["passed"] is True and 0 <= c["error"] < c["tolerance"]


def test_check_json_file_reports_custom_rules_and_missing_forward_mode(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main(["check", str(ROOT / "examples" / "seed.grad"), "--json", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    ops = {o["op"]: o for o in json.loads(out.read_text())["ops"]}
    assert ops["scaled_tanh"]["custom"] and ops["scaled_tanh"]["custom_rel_diff"] == \
        pytest.approx(0.5)
    assert not ops["softmax_xent"]["custom"] and "custom_rel_diff" not in ops["softmax_xent"]
    jvp = ops["clipped_relu"]["checks"][1]
    assert jvp["name"] == "jvp_vs_vjp" and jvp["passed"] is None and jvp["error"] is None
    assert "no forward mode" in jvp["skipped"]


# -- gradc bench ------------------------------------------------------------------------


def test_bench_json_to_stdout_and_tables_to_stderr(tiny, capsys):
    assert main(["bench", str(tiny), *QUICK_BENCH, "--json", "-"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [r["op"] for r in report["results"]] == ["halved_tanh"]
    assert "median ms" in captured.err and ESC not in captured.err


def test_bench_on_a_terminal_has_a_progress_bar_and_coloured_tables(tiny):
    pytest.importorskip("tqdm")
    text = run_in_pty(["bench", str(tiny), *QUICK_BENCH])
    assert "gradc bench:" in text and "case" in text           # tqdm's bar on stderr
    assert "  \x1b[1mmedian ms" in text                        # a bold heading
    assert "\x1b[1;32m" in text                                # the fastest variant
    plain = run_in_pty(["bench", str(tiny), *QUICK_BENCH], NO_COLOR="1")
    # No styles; Numba's colorama may still write a bare reset (ESC[0m) at exit.
    assert "\x1b[1" not in plain and "median ms" in plain
