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


# Source text of files seen by the compiler, so errors can show the line.
_SOURCES: dict[str, str] = {}


def remember_source(file: str, text: str) -> None:
    """Record the text of ``file`` so that errors in it can quote their line."""
    _SOURCES[file] = text


def source_line(file: str, line: int) -> str | None:
    text = _SOURCES.get(file)
    if text is None:
        return None
    lines = text.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else None


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
        head = f"error[{self.code}]: {self.message}"
        if self.span is None:
            return "\n".join([head, *(f"  = note: {n}" for n in self.notes)])
        out = [f"{self.span}: {head}"]
        text = source_line(self.span.file, self.span.line)
        if text is not None:
            num = str(self.span.line)
            pad = " " * len(num)
            width = 1
            if self.span.end_line == self.span.line and self.span.end_column:
                width = max(1, self.span.end_column - self.span.column)
            out.append(f"    {num} | {text}")
            out.append(f"    {pad} | {' ' * (self.span.column - 1)}{'^' * width}")
        out.extend(f"    = note: {n}" for n in self.notes)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


class ParseError(GradcError):
    default_code = "E101"


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
