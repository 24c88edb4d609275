"""gradc.ir."""
