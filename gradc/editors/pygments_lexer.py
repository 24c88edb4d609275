"""A Pygments lexer for .grad files: ``pygmentize -l gradc examples/seed.grad``.

Registered as a Pygments plugin by gradc's entry point (``pygments.lexers``),
so installing gradc (with Pygments, e.g. ``pip install 'gradc[docs]'``) makes
``gradc``/``grad`` and ``*.grad`` known to Pygments, Sphinx and MkDocs.  The
words come from gradc's own tables (:mod:`gradc.editors.syntax`): the grammar's
keywords (``grad`` where a grad block starts, ``grad(dy) -> dx``; the builtin
``grad(EXPR, NAME)`` elsewhere), the builtin functions (a name followed by
``(``), constants, the
dtypes of annotations and the keyword arguments of builtins.
"""
from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, words
from pygments.token import (Comment, Keyword, Name, Number, Operator, Punctuation, String,
                            Whitespace)

from gradc.editors import syntax


class GradLexer(RegexLexer):
    """Tokens of a .grad file (docs/language.md); nothing the grammar accepts is an Error token."""

    name = "gradc"
    aliases = ["grad", "gradc"]
    filenames = ["*.grad"]

    keywords = syntax.KEYWORDS
    builtins = syntax.BUILTINS

    tokens = {
        "root": [
            (r"[ \t\f\r\n]+", Whitespace),
            (r"#[^\n]*", Comment.Single),
            (r'"[^"\n]*"', String.Double),
            (rf"\b(op)(\s+)({syntax.NAME})", bygroups(Keyword, Whitespace, Name.Function)),
            (rf"\b(const)(\s+)({syntax.NAME})",
             bygroups(Keyword.Declaration, Whitespace, Name.Constant)),
            (syntax.GRAD_BLOCK, Keyword),
            (words(syntax.BUILTINS, prefix=r"\b", suffix=r"(?=\s*\()"), Name.Builtin),
            (syntax.alternation(syntax.KEYWORDS), Keyword),
            (syntax.alternation(syntax.DTYPES), Keyword.Type),
            (syntax.alternation(syntax.CONSTANTS), Keyword.Constant),
            (rf"({syntax.alternation(syntax.KWARGS)})(\s*)(=)(?!=)",
             bygroups(Name.Attribute, Whitespace, Operator)),
            (r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+", Number.Float),
            (r"\d+", Number.Integer),
            (syntax.OPERATORS, Operator),
            (r"[()\[\]{},;:]", Punctuation),
            (syntax.NAME, Name),
        ],
    }
