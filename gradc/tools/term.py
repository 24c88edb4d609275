"""Terminal output: whether to colour, the few styles the reports use, aligned tables.

Colour follows the common conventions: ``--color always`` and ``never`` decide;
``auto`` (the default) colours a stream that is a terminal, unless the
``NO_COLOR`` environment variable is set to anything but the empty string
(https://no-color.org) or ``TERM`` is ``dumb``.  Piped or redirected output
therefore carries no escape codes, and the text is the same either way apart
from them (tables are aligned on the plain text).

The styles are ANSI SGR sequences (bold and the basic colours), which
terminal emulators understand; one code path, no dependency.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Sequence, TextIO

MODES = ("auto", "always", "never")

_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STATUS = re.compile(r"^(\s*)(ok|FAIL|MISMATCH|warning)\b|(\s)(ok|MISMATCH)$")


def use_color(stream: TextIO, mode: str = "auto") -> bool:
    """Whether to write escape codes to ``stream`` under ``mode`` (one of
    :data:`MODES`; ``ValueError`` otherwise)."""
    if mode not in MODES:
        raise ValueError(f"color mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "auto":
        return mode == "always"
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def style(text: str, *names: str, on: bool = True) -> str:
    """``text`` in the styles ``names`` (keys of ``_SGR``: bold, dim, red, green,
    yellow, cyan), or unchanged when ``on`` is false."""
    if not on or not names:
        return text
    return f"\x1b[{';'.join(_SGR[n] for n in names)}m{text}\x1b[0m"


def table(head: Sequence[str], rows: list[list[str]], bold: list[int | None],
          color: bool) -> list[str]:
    """Columns right-aligned (the first left-aligned); ``bold[r]`` a column to stress.
    With ``color`` the heading is bold and the stressed cell bold green, styled
    after padding so that the columns stay aligned."""
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
    fmt = lambda r, c: r[c].ljust(widths[c]) if c == 0 else r[c].rjust(widths[c])
    lines = ["  " + style("  ".join(fmt(head, c) for c in range(len(head))).rstrip(), "bold",
                          on=color)]
    for r, b in zip(rows, bold):
        cells = [fmt(r, c) for c in range(len(head))]
        if b is not None:
            cells[b] = style(cells[b], "bold", "green", on=color)
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def status(line: str, on: bool = True) -> str:
    """``line`` with its status word (the first word, or ``ok``/``MISMATCH`` as
    the last) coloured: ``ok`` green, ``FAIL`` and ``MISMATCH`` red, ``warning``
    yellow; other lines unchanged."""
    m = _STATUS.search(line)
    if not on or m is None:
        return line
    word = m.group(2) or m.group(4)
    colour = {"ok": "green", "warning": "yellow"}.get(word, "red")
    start, end = m.span(2) if m.group(2) else m.span(4)
    return line[:start] + style(word, "bold", colour) + line[end:]


def strip(text: str) -> str:
    """``text`` without ANSI SGR sequences (their display width is zero)."""
    return _ANSI.sub("", text)


def write_output(path: str, text: str) -> None:
    """``text`` to the file ``path`` (replaced atomically: see
    :func:`gradc.loader.disk_cache.write_atomic`), or to stdout when ``path`` is ``-``."""
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from gradc.loader.disk_cache import write_atomic
    write_atomic(path, text)


def close_broken_pipe() -> int:
    """After a ``BrokenPipeError`` (output piped into ``head``, which exited): point
    stdout at the null device, so that Python's flush at exit does not raise again,
    and return the exit status 0.  The recipe of Python's documentation ("Note on
    SIGPIPE", the ``signal`` module)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):   # stdout without a file descriptor (captured)
        pass
    finally:
        os.close(devnull)
    return 0
