"""``gradc.load(path)``: compile a .grad file through the cache and import it."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from gradc.runtime.cache import (cache_dir, cache_key, discard_entry, entry_is_valid,
                                 read_warnings, write_entry, write_metadata)


def load(path: str | os.PathLike, **options) -> ModuleType:
    """Import the module compiled from the .grad file ``path``.

    Compiles only when the cache has no module for these sources, versions and
    options, or a damaged one (see :mod:`gradc.runtime.cache`).  The module is
    registered in ``sys.modules`` as ``gradc_<stem>_<key>``, so loading the same
    sources again returns the same module.  Raises :class:`gradc.GradcError` for
    errors in the file and FileNotFoundError when it does not exist.
    """
    path = _grad_file(path)
    name, sources, files = _resolve(path, options)
    if name in sys.modules:
        return sys.modules[name]
    return _through_cache(path, name, sources, files, options)


class Origin(NamedTuple):
    """What a module was compiled from: the .grad file (for a text, the file it
    stands for: imports resolve beside it), the text and the options.  Loaded
    modules carry it as ``__gradc_origin__``; the framework adapters read it to
    compile derived ops (:mod:`gradc.adapters.derived`)."""

    file: str
    text: str
    options: dict


def load_text(text: str, file: str | os.PathLike, **options) -> ModuleType:
    """Import the module compiled from the .grad source ``text``, as if it were
    the file ``file`` (which need not exist: imports resolve beside it, errors
    name it), through the same cache as :func:`load`."""
    from gradc.frontend.check import check_source
    from gradc.frontend.parser import read_source
    file = Path(file).resolve()
    program = check_source(text, str(file))
    sources = [text, *(read_source(f) for f in program.files[1:])]
    key = cache_key([str(file), *sources], dict(sorted(options.items())))
    stem = re.sub(r"\W", "_", file.stem)
    name = f"gradc_{stem}_{key[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    return _through_cache(file, name, sources, [file, *program.files[1:]], options)


def entry_name(path: Path, options: dict) -> tuple[str, list[str]]:
    """The module name of the cache entry of the .grad file ``path`` (absolute),
    ``gradc_<stem>_<key>``, and the sources read for the key (the file's first)."""
    return _resolve(path, options)[:2]


def _grad_file(path: str | os.PathLike) -> Path:
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no .grad file at '{path}'")
    return path


def _resolve(path: Path, options: dict) -> tuple[str, list[str], list]:
    """The entry's module name, the sources read for its key and their files."""
    from gradc.frontend.check import load_program
    from gradc.frontend.parser import read_source
    program = load_program(path)          # parses imports too, for the key
    sources = [read_source(f) for f in program.files]
    key = cache_key([str(path), *sources], dict(sorted(options.items())))
    stem = re.sub(r"\W", "_", path.stem)
    return f"gradc_{stem}_{key[:16]}", sources, list(program.files)


def _through_cache(path: Path, name: str, sources: list[str], files: list,
                   options: dict) -> ModuleType:
    """Import the valid cache entry of ``name``, compiled first if it is missing or
    damaged, and compiled again if importing it fails (damaged bytecode)."""
    from gradc import GradcWarning, compile_source
    target = cache_dir() / f"{name}.py"

    def write() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GradcWarning)
            text = compile_source(sources[0], file=str(path), **options)
        for w in caught:                 # others as they came; the compiler's below
            if not isinstance(w.message, GradcWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        discard_entry(target)
        write_entry(target, text)
        write_metadata(target, path, files, dict(sorted(options.items())),
                       [w.message for w in caught if isinstance(w.message, GradcWarning)])

    if not entry_is_valid(target):           # missing, or damaged: (re)compile
        write()
    # The compiler's warnings, whether compiled now or long ago (recorded beside the
    # entry), attributed to the first caller outside gradc.
    for w in read_warnings(target):
        warnings.warn(w, stacklevel=_caller_level())
    try:
        module = _import(name, target)
    except Exception:                        # damaged after all (its bytecode, say)
        discard_entry(target)
        write()
        module = _import(name, target)
    # what gradc.adapters.derived reads to compile an op's derived ops
    module.__gradc_origin__ = Origin(str(path), sources[0], dict(options))
    return module


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel, called from the caller of this function, that
    names the first frame outside the gradc package (the user's ``gradc.load``)."""
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame, level = frame.f_back, level + 1
    return level


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
