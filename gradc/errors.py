"""Source spans and the error classes of every compiler phase.

Every user-facing error carries a :class:`Span` and renders like a compiler
diagnostic::

    model.grad:3:11: error[E301]: shapes (3,) and (4,) do not broadcast in 'mul'
        3 | y = x * w
          |       ^

Several errors of one file are reported together as a :class:`GradcErrors`.
Internal errors (bugs in gradc) are :class:`InternalError` and are never
rendered as user errors.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Span:
    """A region of a source file; lines and columns are 1-based, end exclusive."""

    file: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


# Source text of files seen by the compiler, so errors can show the line, and
# where its lines start (computed when an error first needs it).
_SOURCES: dict[str, str] = {}
_LINE_STARTS: dict[str, list[int]] = {}


def remember_source(file: str, text: str) -> None:
    """Record the text of ``file`` so that errors in it can quote their line."""
    _SOURCES[file] = text
    _LINE_STARTS.pop(file, None)


def source_line(file: str, line: int) -> str | None:
    """Line ``line`` of ``file`` as the lexer counts lines (ended by ``\n`` only, not
    by ``\r`` or U+2028)."""
    text = _SOURCES.get(file)
    if text is None:
        return None
    starts = _LINE_STARTS.get(file)
    if starts is None:
        starts = _LINE_STARTS[file] = [0, *(m.end() for m in re.finditer("\n", text))]
    if not 0 < line <= len(starts):
        return None
    end = starts[line] - 1 if line < len(starts) else len(text)
    return text[starts[line - 1]:end].removesuffix("\r")


_SHOWN = 120     # characters of a long source line shown around the caret


def _shown(line: str) -> str:
    """A source line for a terminal: characters that are not printable as U+FFFD
    (one column each, so the caret stays aligned)."""
    return "".join(c if c.isprintable() or c == "\t" else "\ufffd" for c in line)


def _columns(c: str) -> int:
    """The terminal columns of a character: 2 for a wide one (East Asian wide or full
    width), 0 for a combining one, else 1."""
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def _printable(text: str) -> str:
    """User text in a message (a file name, an import path) with characters that are
    not printable escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def render_diagnostic(severity: str, code: str, message: str, span: Span | None,
                      notes: Sequence[str] = ()) -> str:
    """``file:line:col: severity[CODE]: message``, the source line with a caret
    under the span, then the notes (rustc's layout)."""
    head = _printable(f"{severity}[{code}]: {message}")
    notes = [_printable(n) for n in notes]
    if span is None:
        return "\n".join([head, *(f"  = note: {n}" for n in notes)])
    out = [f"{_printable(str(span))}: {head}"]
    text = source_line(span.file, span.line)
    if text is not None:
        num = str(span.line)
        pad = " " * len(num)
        width = 1
        if span.end_line == span.line and span.end_column:
            width = max(1, span.end_column - span.column)
        col = span.column
        if len(text) > _SHOWN:           # a window around the caret
            start = max(0, min(col - 1 - _SHOWN // 2, len(text) - _SHOWN))
            text = ("..." if start else "") + text[start:start + _SHOWN] + (
                "..." if start + _SHOWN < len(text) else "")
            col -= start - (3 if start else 0)
            width = min(width, _SHOWN)
        shown = _shown(text)
        out.append(f"    {num} | {shown}")
        # the caret line repeats the source line's tabs, so a terminal aligns both alike;
        # a wide character (CJK) takes two columns, a combining one none
        lead = "".join("\t" if c == "\t" else " " * _columns(c) for c in shown[:col - 1])
        spanned = shown[col - 1:col - 1 + width]        # (past the line's end: 1 a column)
        carets = max(1, sum(map(_columns, spanned)) + width - len(spanned))
        past = " " * max(0, col - 1 - len(shown))
        out.append(f"    {pad} | {lead}{past}{'^' * carets}")
    out.extend(f"    = note: {n}" for n in notes)
    return "\n".join(out)


class GradcWarning(UserWarning):
    """A suspicious but compilable construct (``W301``: an elementwise max or min of an
    integer, read as an axis elsewhere; ``W4xx``: custom gradients).

    Raised through :func:`warnings.warn` by the Python API; ``gradc compile``
    and ``gradc check`` print it to stderr in the layout of errors and exit 0.
    Attributes as :class:`GradcError`.
    """

    def __init__(self, message: str, span: Span | None = None, code: str = "W400",
                 notes: Sequence[str] = (), severity: str = "warning",
                 intended: bool = False) -> None:
        self.message, self.span, self.code, self.notes = message, span, code, tuple(notes)
        self.severity = severity      # "warning", or "note": shown by explain only
        # about a rule the user marked 'surrogate': shown when compiled, not again each
        # time the module is loaded from gradc's cache
        self.intended = intended
        super().__init__(self.render())

    def render(self) -> str:
        return render_diagnostic(self.severity, self.code, self.message, self.span, self.notes)

    def __str__(self) -> str:
        return self.render()

    def key(self) -> tuple:
        return (self.code, self.message, self.span)


class GradcError(Exception):
    """A user error: bad input to the compiler, reported with its source position.

    Attributes: ``message`` (one sentence, no trailing period), ``span`` (or
    None when no position applies), ``code`` (``E1xx`` parse, ``E2xx`` names,
    ``E3xx`` shapes and types, ``E4xx`` gradients, ``E5xx`` code generation),
    ``notes`` (extra lines shown after the caret).
    """

    default_code = "E000"

    def __init__(self, message: str, span: Span | None = None, code: str | None = None,
                 notes: Sequence[str] = ()) -> None:
        self.message = message
        self.span = span
        self.code = code or self.default_code
        self.notes = tuple(notes)
        super().__init__(self.render())

    def render(self) -> str:
        return render_diagnostic("error", self.code, self.message, self.span, self.notes)

    def __str__(self) -> str:
        return self.render()


class ParseError(GradcError):
    default_code = "E101"


class LimitError(GradcError):
    """Input beyond one of the limits of :mod:`gradc.frontend.limits` (E12x)."""

    default_code = "E120"


class NameResolutionError(GradcError):
    default_code = "E201"


class ShapeError(GradcError):
    default_code = "E301"


class TypeError_(GradcError):
    """A dtype error in a .grad file (named with a trailing underscore so it
    does not shadow the builtin :class:`TypeError`)."""

    default_code = "E302"


class GradientError(GradcError):
    default_code = "E401"


class CodegenError(GradcError):
    default_code = "E501"


class NotSupportedError(GradcError):
    """A construct the language has but this version of gradc cannot compile yet."""

    default_code = "E901"


class GradcErrors(GradcError):
    """Several user errors of one compilation, reported together in source order."""

    def __init__(self, errors: Iterable[GradcError]) -> None:
        self.errors = sorted(errors, key=lambda e: (
            (e.span.file, e.span.line, e.span.column) if e.span else ("", 0, 0)))
        first = self.errors[0]
        super().__init__(first.message, first.span, first.code, first.notes)

    def render(self) -> str:
        body = "\n\n".join(e.render() for e in self.errors)
        n = len(self.errors)
        return body if n == 1 else f"{body}\n\n{n} errors"


def raise_all(errors: Sequence[GradcError]) -> None:
    """Raise nothing, the single error, or a :class:`GradcErrors` of all of them."""
    flat: list[GradcError] = []
    for e in errors:
        flat.extend(e.errors if isinstance(e, GradcErrors) else [e])
    if len(flat) == 1:
        raise flat[0]
    if flat:
        raise GradcErrors(flat)


class InternalError(Exception):
    """A bug in gradc: reported with a traceback and exit status 2."""
