"""``gradc.load(path)``: compile a .grad file through the cache and import it."""
from __future__ import annotations

import ast
import importlib.util
import linecache
import os
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from gradc.loader.disk_cache import (cache_dir, cache_key, discard_entry, entry_is_valid,
                                     guard_numba_caches, read_warnings, write_entry,
                                     write_metadata)


def load(path: str | os.PathLike, **options) -> ModuleType:
    """Import the module compiled from the .grad file ``path``.

    Compiles only when the cache has no module for these sources, versions and
    options, or a damaged one (see :mod:`gradc.loader.disk_cache`).  The module is
    registered in ``sys.modules`` as ``gradc_<stem>_<key>``, so loading the same
    sources again returns the same module.  Each file is read once: the key and the
    compiled module come from the same text, even when a file changes meanwhile.
    When the cache directory cannot be written (a file, a dangling link, read-only),
    the module is compiled in memory, with a RuntimeWarning.  Raises
    :class:`gradc.GradcError` for errors in the file and FileNotFoundError when it
    does not exist.
    """
    from gradc.frontend.check import load_program
    path = _grad_file(path)
    program = load_program(path)          # the file and its imports, each read once
    name = _module_name(path, program.sources, options)
    if name in sys.modules:
        return sys.modules[name]
    return _through_cache(path, name, program, options)


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
    file = Path(file).resolve()
    program = check_source(text, str(file))
    name = _module_name(file, program.sources, options)
    if name in sys.modules:
        return sys.modules[name]
    return _through_cache(file, name, program, options)


def entry_name(path: Path, options: dict) -> tuple[str, list[str]]:
    """The module name of the cache entry of the .grad file ``path`` (absolute),
    ``gradc_<stem>_<key>``, and the sources read for the key (the file's first)."""
    from gradc.frontend.check import load_program
    sources = list(load_program(path).sources)
    return _module_name(path, sources, options), sources


def _grad_file(path: str | os.PathLike) -> Path:
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no .grad file at '{path}'")
    return path


def _module_name(path: Path, sources, options: dict) -> str:
    """``gradc_<stem>_<key>``: the key of the file's path, its sources and ``options``."""
    key = cache_key([str(path), *sources], dict(sorted(options.items())))
    stem = re.sub(r"\W", "_", path.stem)
    return f"gradc_{stem}_{key[:16]}"


def _through_cache(path: Path, name: str, program, options: dict) -> ModuleType:
    """Import the valid cache entry of ``name``, compiled from ``program`` first if
    it is missing or damaged, and compiled again if importing it fails (damaged
    bytecode); compiled in memory where the cache directory cannot be written."""
    target = cache_dir() / f"{name}.py"
    origin = Origin(str(path), program.sources[0], dict(options))
    module = None
    if not entry_is_valid(target):           # missing, or damaged: (re)compile
        module = _compile_into(target, name, path, program, options)
    if module is None:
        # The compiler's warnings, whether compiled now or long ago (recorded beside
        # the entry), attributed to the first caller outside gradc.
        for w in read_warnings(target):
            warnings.warn(w, stacklevel=_caller_level())
        try:
            module = _import(name, target)
        except Exception:                    # damaged after all (its bytecode, say)
            discard_entry(target)
            module = _compile_into(target, name, path, program, options) or \
                _import(name, target)
    # what gradc.adapters.derived reads to compile an op's derived ops
    module.__gradc_origin__ = origin
    return module


def _compile_into(target: Path, name: str, path: Path, program,
                  options: dict) -> ModuleType | None:
    """Compile ``program`` into the cache entry ``target`` (None: import it), or, if
    that cannot be written, into a module in memory, returned, with a warning."""
    from gradc.codegen.module import compile_program
    from gradc.errors import GradcWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GradcWarning)
        text = compile_program(program, str(path), **options)
    for w in caught:                     # others as they came; the compiler's below
        if not isinstance(w.message, GradcWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    ours = [w.message for w in caught if isinstance(w.message, GradcWarning)]
    try:
        discard_entry(target)
        write_entry(target, text)
        # warnings about rules marked 'surrogate' were shown now; not again on each load
        write_metadata(target, path, list(program.files), dict(sorted(options.items())),
                       [w for w in ours if not w.intended])
        for w in ours:                   # the others: from the metadata, as on every load
            if w.intended:
                warnings.warn(w, stacklevel=_caller_level())
        return None
    except OSError as exc:
        why = exc.strerror or str(exc)
    level = _caller_level()
    warnings.warn(f"gradc: cannot write the cache directory {str(target.parent)!r} ({why}): "
                  f"{path.name} was compiled in memory, and is compiled again in every "
                  "process (set GRADC_CACHE_DIR to a folder that can be written)",
                  RuntimeWarning, stacklevel=level)
    for w in ours:
        warnings.warn(w, stacklevel=level)
    return _import_text(name, text)


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel, called from the caller of this function, that
    names the first frame outside the gradc package (the user's ``gradc.load``)."""
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame, level = frame.f_back, level + 1
    return level


def _import_text(name: str, text: str) -> ModuleType:
    """The module of generated ``text``, with no file: its kernels' ``cache=True``
    (Numba's on-disk cache, which needs the module's file) made ``cache=False``."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "cache":
            node.value = ast.copy_location(ast.Constant(False), node.value)
    file = f"<gradc {name}>"
    linecache.cache[file] = (len(text), None, text.splitlines(True), file)   # tracebacks
    module = ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(tree, file, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import(name: str, target: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    guard_numba_caches(module)
    return module
