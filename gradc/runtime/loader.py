"""``gradc.load(path)``: compile a .grad file through the cache and import it."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

from gradc.runtime.cache import cache_dir, cache_key, write_atomic


def load(path: str | os.PathLike, **options) -> ModuleType:
    """Import the module compiled from the .grad file ``path``.

    Compiles only when the cache has no module for these sources, versions and
    options.  Raises :class:`gradc.GradcError` for errors in the file and
    FileNotFoundError when it does not exist.
    """
    from gradc import compile_source
    from gradc.frontend.check import load_program
    from gradc.frontend.parser import read_source
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no .grad file at '{path}'")
    program = load_program(path)          # parses imports too, for the key
    sources = [read_source(f) for f in program.files]
    key = cache_key([str(path), *sources], dict(sorted(options.items())))
    stem = re.sub(r"\W", "_", path.stem)
    name = f"gradc_{stem}_{key[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    target = cache_dir() / f"{name}.py"
    if not target.exists():
        write_atomic(target, compile_source(sources[0], file=str(path), **options))
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
