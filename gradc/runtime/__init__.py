"""gradc.runtime."""
