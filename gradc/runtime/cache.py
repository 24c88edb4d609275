"""The on-disk cache of compiled modules.

Location: ``$GRADC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gradc``, else
``~/.cache/gradc``.  A module is keyed by the SHA-256 of its sources (the
file and everything it imports), the gradc version and a fingerprint of its
sources, the Numba and NumPy versions and the compile options, so a changed input recompiles and an unchanged one is
imported as is (and Numba's own cache beside it skips JIT compilation too).
Writes are atomic (a temporary file, then ``os.replace``), so two processes
compiling the same file at once both get a complete module.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("GRADC_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gradc"


@lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """SHA-256 of gradc's own sources and grammar, so a changed compiler recompiles
    even where its version number did not change (development installs)."""
    from gradc.frontend.parser import grammar_path
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")) + [grammar_path()]:
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(sources: list[str], options: dict) -> str:
    import numba
    import numpy

    import gradc
    h = hashlib.sha256()
    meta = {"gradc": gradc.__version__, "compiler": compiler_fingerprint(), "numba": numba.__version__, "numpy": numpy.__version__,
            "options": options}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for text in sources:
        h.update(b"\0")
        h.update(text.encode())
    return h.hexdigest()


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
