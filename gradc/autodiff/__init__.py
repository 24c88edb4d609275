"""gradc.autodiff."""
