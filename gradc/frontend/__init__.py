"""Front end: grammar, parser, AST and semantic checks of .grad files."""
