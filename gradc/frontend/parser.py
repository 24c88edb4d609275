"""Parse .grad source text into an :class:`gradc.frontend.ast.Module`.

One Lark LALR parser built from ``grammars/gradc.lark``.  Syntax errors become
:class:`ParseError` with the exact position and what was expected in words.
When a file has a syntax error, each top-level item (``import``, ``const``,
``op``, ``grad`` block) is parsed on its own as well, so every bad item is
reported, together, in one :class:`GradcErrors`.
"""
from __future__ import annotations

import functools
import os
import importlib.resources
import importlib.util
import re
from pathlib import Path
from typing import Iterator

from lark import Lark, Token, UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.exceptions import VisitError

from gradc.errors import (GradcError, GradcErrors, ParseError, Span, raise_all,
                          remember_source)
from gradc.frontend import ast, limits
from gradc.frontend.to_ast import ToAst


def grammar_path() -> Path:
    """Where ``gradc.lark`` is: inside an installed wheel, else in the repository."""
    try:
        found = importlib.util.find_spec("gradc.grammars") is not None
    except ModuleNotFoundError:
        found = False
    if found:
        path = Path(str(importlib.resources.files("gradc.grammars") / "gradc.lark"))
        if path.is_file():
            return path
    return Path(__file__).resolve().parents[2] / "grammars" / "gradc.lark"


_OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}
_CLOSERS = set(_OPENERS.values())
_CLOSER = {"(": "RPAR", "[": "RSQB", "{": "RBRACE"}     # a bracket's closing terminal


class _LimitHit(Exception):
    """A parse-time limit crossed at a token; :func:`parse` adds the file name."""

    def __init__(self, make, tok: Token) -> None:
        super().__init__()
        self.make, self.line, self.column = make, tok.line, tok.column

    def error(self, file: str) -> GradcError:
        return self.make(file, self.line, self.column)


# Items' keywords: where only they are expected, the contextual lexer takes the 'op' of
# 'opp f(x)' as the keyword and 'p' as the op's name.
_ITEM_KEYWORDS = {"OP": "op", "CONST": "const", "IMPORT": "import", "GRAD": "grad"}
_WORD_TOKENS = frozenset({"NAME", "INT", "NUMBER"})


def _glued_word(text: str, tok: Token) -> tuple[str, int] | None:
    """``(word, column)`` where ``tok`` continues a word of ``text`` that begins with an
    item's keyword (the lexer split it there), else None."""
    start = tok.start_pos
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    head = text[start:tok.start_pos]
    if head not in _ITEM_KEYWORDS.values():
        return None
    return head + tok.value, tok.column - len(head)


def _glued_keyword(f: str, line: int, column: int, word: str) -> GradcError:
    return ParseError(f"expected an item ('op', 'const' or 'import'), found '{word}'",
                      Span(f, line, column, line, column + len(word)), "E101")


class _NewlinesInBrackets:
    """Post-lexer: a newline only counts at top level or directly inside braces.
    It also enforces MAX_TOKENS and, for brackets, MAX_DEPTH, and refuses an item's
    keyword glued to the word after it (``opp``)."""

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        stack: list[str] = []
        depth = 0               # ( and [ open (braces are bodies, not expressions)
        prev = None
        for n, tok in enumerate(stream):
            if n >= limits.MAX_TOKENS:
                raise _LimitHit(lambda f, l, c: limits.too_many_tokens(f, l, c), tok)
            if prev is not None and prev.type in _ITEM_KEYWORDS and \
                    tok.type in _WORD_TOKENS and tok.start_pos == prev.end_pos:
                word = prev.value + tok.value
                raise _LimitHit(lambda f, l, c: _glued_keyword(f, l, c, word), prev)
            prev = tok
            if tok.type == "_NL":
                if stack and stack[-1] != "LBRACE":
                    continue
            elif tok.type in _OPENERS:
                stack.append(tok.type)
                depth += tok.type != "LBRACE"
                if depth > limits.MAX_DEPTH:
                    raise _LimitHit(lambda f, l, c: limits.too_deep(f, l, c, "brackets"), tok)
            elif tok.type in _CLOSERS and stack:
                depth -= stack.pop() != "LBRACE"
            yield tok


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(grammar_path().read_text(encoding="utf-8"), parser="lalr",
                propagate_positions=True, postlex=_NewlinesInBrackets())


def read_source(path: str | os.PathLike[str]) -> str:
    """The text of a .grad file (UTF-8, a leading BOM dropped); GradcError E205
    when it cannot be read or is not UTF-8."""
    try:
        data = limits.read_capped(path).removeprefix(b"\xef\xbb\xbf")
    except OSError as exc:
        raise GradcError(f"cannot read '{path}': {exc.strerror or exc}", None, "E205") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(data) > 4 * limits.MAX_FILE_CHARS:      # cut short: too long anyway
            return data.decode("utf-8", "replace")
        start = exc.start
    # The position of the first bad byte, and the text with it replaced for the caret.
    line_start = data.rfind(b"\n", 0, start) + 1
    line = data.count(b"\n", 0, start) + 1
    column = len(data[line_start:start].decode("utf-8", "replace")) + 1
    remember_source(str(path), data.decode("utf-8", "replace"))
    raise GradcError(f"cannot read '{path}': it is not UTF-8 text (byte {start})",
                     Span(str(path), line, column), "E205")


def parse(text: str, file: str = "<string>", *, quote: bool = True) -> ast.Module:
    """Parse the .grad source ``text`` of ``file``; raise ParseError(s) on bad syntax.
    ``quote=False``: errors in it show no line of it (a file that is not .grad)."""
    text = text.removeprefix("\ufeff")
    if quote:
        remember_source(file, text)
    limits.check_file_size(text, file)
    try:
        tree = _lark().parse(text)
    except _LimitHit as hit:
        raise hit.error(file) from None
    except UnexpectedInput as e:
        errors = _item_errors(text, file) or [_parse_error(e, text, file, None)]
        raise (errors[0] if len(errors) == 1 else GradcErrors(errors)) from None
    limits.check_tree(tree, file)        # before the recursive transform below
    builder = ToAst(file, text)
    try:
        module = builder.transform(tree)
    except RecursionError:
        raise limits.out_of_stack(file) from None
    except VisitError as e:
        if isinstance(e.orig_exc, GradcError):
            raise e.orig_exc from None
        if isinstance(e.orig_exc, RecursionError):
            raise limits.out_of_stack(file) from None
        raise
    raise_all(builder.errors)
    return module


# ---- several errors: parse each top-level item on its own -------------------

_ITEM_START = re.compile(
    r'^[ \t]*(?:\}[ \t]*)?(?P<kw>(?:op|const)[ \t]+[A-Za-z_]|import[ \t]*"'
    r'|grad[ \t]*\([\w \t,]*\)[ \t]*->)', re.M)


_MAX_REPORTED = 50     # syntax errors reported together, at most


def _item_errors(text: str, file: str) -> list[GradcError]:
    """Parse each item of ``text`` alone, keeping positions; return their errors."""
    starts = sorted({0, *(m.start("kw") for m in _ITEM_START.finditer(text))})
    bounds = list(zip(starts, [*starts[1:], len(text)]))
    errors: list[GradcError] = []
    line0 = 0                   # newlines before the item
    for begin, end in bounds:
        # Spaces before the item keep its columns; line0 is added to its lines.
        line_start = text.rfind("\n", 0, begin) + 1
        chunk = " " * (begin - line_start) + text[begin:end]
        following = None
        if end < len(text):
            line = line0 + chunk.count("\n") + 1
            col = end - text.rfind("\n", 0, end)
            following = (line, col, re.match(r"\w*", text[end:end + 100]).group(0))
        try:
            _lark().parse(chunk)
        except _LimitHit as hit:
            hit.line += line0
            errors.append(hit.error(file))
        except UnexpectedInput as e:
            errors.append(_parse_error(e, chunk, file, following, line0))
        line0 += chunk.count("\n")
        if len(errors) >= _MAX_REPORTED:
            break
    return errors


# ---- error messages ---------------------------------------------------------

_WORDS = {      # in the order they are listed in a message
    "RPAR": "')'", "RSQB": "']'", "COMMA": "','", "EQUAL": "'='", "COLON": "':'",
    "ARROW": "'->'", "LBRACE": "'{'", "LPAR": "'('", "LSQB": "'['",
    "NAME": "a name", "INT": "an integer", "NUMBER": "a number",
    "STRING": 'a quoted file name like "other.grad"', "NOGRAD": "'nograd'",
    "SURROGATE": "'surrogate'", "OP": "'op'", "CONST": "'const'", "IMPORT": "'import'",
    "GRAD": "'grad'", "_NL": "a newline", "SEMICOLON": "';'", "RBRACE": "'}'",
    "$END": "the end of the file", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'",
    "SLASH": "'/'", "AT": "'@'", "POW": "'^'", "CMP": "a comparison", "TRANSPOSE": "'.T'",
}
_ORDER = list(_WORDS)
_EXPR_START = {"NAME", "NUMBER", "LPAR", "MINUS", "PLUS"}
_OPERATORS = {"PLUS", "MINUS", "STAR", "SLASH", "AT", "POW", "CMP", "TRANSPOSE", "LPAR",
              "LSQB"}                 # a call, a subscript x[i]
_ITEMS = {"OP", "CONST", "IMPORT", "GRAD"}
_MAX_SHOWN = 4


def describe_expected(terminals: set[str] | frozenset[str]) -> str:
    """Say in words which of Lark's terminals were expected, at most a few."""
    names = {t for t in terminals if t in _WORDS}
    words: list[tuple[int, str]] = []
    if "NUMBER" in names:
        names -= _EXPR_START
        words.append((_ORDER.index("NAME"), "an expression"))
    if names & (_OPERATORS - {"LPAR", "LSQB"}):
        names -= _OPERATORS | {"EQUAL"}     # '=' there only starts a keyword argument
        words.append((_ORDER.index("NAME"), "an operator"))
    if len(names & _ITEMS) > 1:
        names -= _ITEMS | {"_NL", "$END"}
        words.append((_ORDER.index("OP"), "an item ('op', 'const' or 'import')"))
    if names & {"ARROW", "LBRACE"}:
        names.discard("_NL")                # a newline is allowed in op headers, not needed
    words += [(_ORDER.index(n), _WORDS[n]) for n in names]
    shown = [w for _, w in sorted(words)][:_MAX_SHOWN]
    if not shown:
        return "something else"
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _found(tok: Token) -> str:
    if tok.type == "_NL":
        return "a newline"
    if tok.type == "$END":
        return "the end of the file"
    return f"'{tok.value}'"


def _acceptable(e: UnexpectedInput) -> set[str]:
    """The terminals the parser could really take where ``e`` happened."""
    parser = getattr(e, "interactive_parser", None)
    if parser is not None:
        return set(parser.accepts())
    return set(getattr(e, "expected", None) or getattr(e, "allowed", None) or ())


def _parse_error(e: UnexpectedInput, text: str, file: str,
                 following: tuple[int, int, str] | None, line0: int = 0) -> ParseError:
    """Translate Lark's error ``e`` in ``text``.

    ``following`` is the line, column and first word of the next item when ``text``
    is one item cut from a longer file, so running out of text means the
    item ran into the next one; ``line0`` is the number of lines before it.
    """
    accepts = _acceptable(e)
    if isinstance(e, UnexpectedCharacters):
        char = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        span = Span(file, e.line + line0, e.column, e.line + line0, e.column + 1)
        return ParseError(f"unexpected character {char!r}{_expecting(accepts, ', expected ')}",
                          span, "E101")
    tok = e.token if isinstance(e, UnexpectedToken) else Token("$END", "")
    glued = _glued_word(text, tok) if tok.type in _WORD_TOKENS else None
    if glued is not None:     # 'gradient(dy)': the lexer could not go on after 'grad'
        word, column = glued
        return _glued_keyword(file, tok.line + line0, column, word)
    if tok.type != "$END":
        span = Span(file, tok.line + line0, tok.column, tok.end_line + line0, tok.end_column)
        after_operand = "NUMBER" not in accepts and bool(accepts & {"PLUS", "STAR"})
        if tok.type == "CMP" and "CMP" not in accepts and after_operand:
            return ParseError("comparisons do not chain: add parentheses", span, "E101")
        return ParseError(f"expected {describe_expected(accepts)}, found {_found(tok)}",
                          span, "E101", _left_open(text, tok, accepts, file, line0))
    return _eof_error(accepts, text, file, following, line0)


def _left_open(text: str, tok: Token, accepts: set[str], file: str, line0: int) -> list[str]:
    """A note on the bracket left open before ``tok`` where its closer was expected and
    ``tok`` closes another bracket or is on a later line (``dx = dy * (1 - y`` then
    ``}``: the '(' is the mistake, not the '}')."""
    unclosed = _unclosed(text[:tok.start_pos])
    if not unclosed:
        return []
    c, line, col = unclosed[-1]
    closer = _CLOSER[c]
    if closer not in accepts or not (tok.type in ("RPAR", "RSQB", "RBRACE") or tok.line > line):
        return []
    return [f"this '{c}' at {file}:{line + line0}:{col} is not closed"]


def _expecting(accepts: set[str], prefix: str) -> str:
    words = describe_expected(accepts)
    return "" if words == "something else" else prefix + words


def _eof_error(accepts: set[str], text: str, file: str,
               following: tuple[int, int, str] | None, line0: int = 0) -> ParseError:
    """An item ended early: point at the next item, or just past the last token."""
    unclosed = _unclosed(text)
    notes = [f"this '{c}' at {file}:{line + line0}:{col} is not closed"
             for c, line, col in unclosed[-1:]]
    closer = _CLOSER[unclosed[-1][0]] if unclosed else None
    expected = describe_expected({closer} if closer in accepts else accepts)
    if following is not None:
        line, col, word = following
        return ParseError(f"expected {expected}, found '{word}'",
                          Span(file, line, col, line, col + len(word)), "E101", notes)
    line, col = _end_of_last_token(text)
    line += line0
    return ParseError(f"expected {expected}, found the end of the file",
                      Span(file, line, col, line, col + 1), "E101", notes)


_BRACKETS = re.compile(r'#[^\n]*|"[^"\n]*"|[()\[\]{}]')
_PAIRS = {")": "(", "]": "[", "}": "{"}


def _unclosed(text: str) -> list[tuple[str, int, int]]:
    """The brackets of ``text`` still open at its end, as (char, line, column)."""
    stack: list[tuple[str, int, int]] = []
    line, seen = 1, 0
    for m in _BRACKETS.finditer(text):
        c = m.group(0)
        if c in "([{":
            line += text.count("\n", seen, m.start())
            seen = m.start()
            stack.append((c, line, m.start() - text.rfind("\n", 0, m.start())))
        elif c in _PAIRS and stack and stack[-1][0] == _PAIRS[c]:
            stack.pop()
    return stack


def _end_of_last_token(text: str) -> tuple[int, int]:
    """Line and column just after the last non-blank, non-comment character."""
    lines = text.split("\n")          # lines as the lexer counts them
    for i in range(len(lines) - 1, -1, -1):
        code = re.sub(r'#[^\n]*$', "", lines[i]).rstrip()
        if code:
            return i + 1, len(code) + 1
    return 1, 1
