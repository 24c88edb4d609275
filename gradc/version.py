"""gradc's version: in each generated module's header, the cache's keys and the reports.
A module of its own, so that the loader and the code generator read it without
importing the public API (:mod:`gradc`, which imports them) or the pipeline."""
__version__ = "0.1.0"
