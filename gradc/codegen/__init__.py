"""gradc.codegen."""
