"""``gradc.load(path)``: compile a .grad file through the cache and import it."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

from gradc.runtime.cache import (cache_dir, cache_key, discard_entry, entry_is_valid,
                                 write_entry)


def load(path: str | os.PathLike, **options) -> ModuleType:
    """Import the module compiled from the .grad file ``path``.

    Compiles only when the cache has no module for these sources, versions and
    options, or a damaged one (see :mod:`gradc.runtime.cache`).  The module gets
    ``__gradc_source__`` (``path``, absolute) and ``__gradc_options__`` (the
    options), which the framework adapters read to compile derived ops from
    the same source (:mod:`gradc.adapters.higher_order`).  Raises
    :class:`gradc.GradcError` for errors in the file and FileNotFoundError when
    it does not exist.
    """
    from gradc import compile_source
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no .grad file at '{path}'")
    name, sources = entry_name(path, options)
    if name in sys.modules:
        return sys.modules[name]
    target = cache_dir() / f"{name}.py"
    if not entry_is_valid(target):           # missing, or damaged: (re)compile
        text = compile_source(sources[0], file=str(path), **options)
        discard_entry(target)
        write_entry(target, text)
    try:
        module = _import(name, target)
    except Exception:                        # damaged after all (its bytecode, say)
        discard_entry(target)
        write_entry(target, compile_source(sources[0], file=str(path), **options))
        module = _import(name, target)
    module.__gradc_source__, module.__gradc_options__ = str(path), dict(options)
    return module


def entry_name(path: Path, options: dict) -> tuple[str, list[str]]:
    """The module name of the cache entry of the .grad file ``path`` (absolute),
    ``gradc_<stem>_<key>``, and the sources read for the key (the file's first)."""
    from gradc.frontend.check import load_program
    from gradc.frontend.parser import read_source
    program = load_program(path)          # parses imports too, for the key
    sources = [read_source(f) for f in program.files]
    key = cache_key([str(path), *sources], dict(sorted(options.items())))
    stem = re.sub(r"\W", "_", path.stem)
    return f"gradc_{stem}_{key[:16]}", sources


def _import(name: str, target: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
