"""Syntax highlighting of .grad files: the TextMate grammar (:mod:`gradc.editors.syntax`)
and the Pygments lexer (:mod:`gradc.editors.pygments_lexer`), from gradc's own tables."""
