"""The user-facing tools: the ``gradc`` command (:mod:`gradc.tools.cli`) and what its
subcommands run (demo, explain, draw, testgen, bench), the terminal output they share
(:mod:`gradc.tools.term`) and ``python -m gradc.tools.cache_cmd``."""
