"""The on-disk cache of compiled modules.

Location: ``$GRADC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gradc``, else
``~/.cache/gradc``.  A module is keyed by the SHA-256 of its sources (the
file and everything it imports), the gradc version and a fingerprint of its
sources, the Numba and NumPy versions and the compile options, so a changed input recompiles and an unchanged one is
imported as is (and Numba's own cache beside it skips JIT compilation too).  The
sources are read once: the key is computed from the text that is compiled.
Writes are atomic (a temporary file, then ``os.replace``), so two processes
compiling the same file at once both get a complete module; there are no lock
files, so none can be left stale.  An entry carries its own name and the SHA-256
of its text in its last line: a truncated, empty or overwritten entry, a link to
another entry or a copy of one, a directory in its place, a ``.json`` beside it
that is not gradc's metadata, or a damaged Numba cache file beside it is discarded
and recompiled; a Numba cache file that is a whole pickle but fails to load is
replaced on the first call (:func:`guard_numba_caches`).  When the directory
cannot be written, :func:`gradc.load` compiles in memory, with a warning.

Each entry ``gradc_<stem>_<key>.py`` has beside it ``gradc_<stem>_<key>.json`` (the
source path, the files it imports, the options and versions: what ``python -m
gradc.tools.cache_cmd info`` shows) and, under ``__pycache__/``, Python's bytecode and Numba's
index and data files of its kernels.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import pickletools
import secrets
import shutil
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("GRADC_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gradc"


# The parts of gradc that decide a module's text: the front end, the IR, the
# differentiation, the passes, the code generators, and the loader that loads modules.
# The tools (gradc/tools: the CLI, bench, explain, draw, testgen), the audit (gradc/audit),
# the editors' syntax files and the adapters (their derived ops are hashed as sources) are
# left out, so editing them keeps the cache.
_COMPILER_PARTS = ("frontend", "ir", "autodiff", "passes", "codegen", "loader",
                   "__init__.py", "pipeline.py", "errors.py", "version.py")


def compiler_sources() -> list[Path]:
    """The files :func:`compiler_fingerprint` hashes: ``_COMPILER_PARTS`` and the grammar."""
    from gradc.frontend.parser import grammar_path
    root = Path(__file__).resolve().parent.parent
    files = []
    for part in _COMPILER_PARTS:
        path = root / part
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files + [grammar_path()]


@lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """SHA-256 of the compiler's own sources (:func:`compiler_sources`), so a changed
    compiler recompiles even where its version number did not change (development
    installs)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in compiler_sources():
        h.update(f.relative_to(root.parent).as_posix().encode() if f.is_relative_to(root.parent)
                 else f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(sources: list[str], options: dict) -> str:
    import numba
    import numpy

    from gradc.version import __version__
    h = hashlib.sha256()
    meta = {"gradc": __version__, "compiler": compiler_fingerprint(), "numba": numba.__version__, "numpy": numpy.__version__,
            "options": options,
            # settings read from the environment when a module is written
            "env": {k: os.environ.get(k, "") for k in ("GRADC_CUDA_UNROLL",)}}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for text in sources:
        h.update(b"\0")
        h.update(text.encode("utf-8", "surrogatepass"))    # a path's undecodable bytes
    return h.hexdigest()


def check_output(path: str | os.PathLike, keep: str | os.PathLike | None = None) -> Path:
    """``path`` as a file that can be written (replaced whole): its folder exists, it
    is not a folder, and it is not the file ``keep`` (the input it is made from, which
    ``gradc compile a.grad -o a.grad`` would replace).  Raises OSError saying which."""
    path = Path(path)
    if not path.parent.is_dir():            # say so for the path, not the temporary file
        raise FileNotFoundError(errno.ENOENT, f"no folder {str(path.parent)!r} to write it in",
                                str(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "a folder, not a file to write", str(path))
    if keep is not None and path.exists() and path.samefile(keep):
        raise FileExistsError(errno.EEXIST, "the input file itself: give the output "
                              "another name", str(path))
    return path


def write_atomic(path: str | os.PathLike, text: str, *, parents: bool = False,
                 keep: str | os.PathLike | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file beside it and
    ``os.replace``: readers see the old file or the new one, never a part, and a
    failure (an exception, a full disk, a kill) leaves the old file as it was.

    The new file gets the permissions a plain ``open(path, "w")`` would give
    (``0o666`` less the umask), not ``mkstemp``'s ``0o600``.  A missing folder is
    FileNotFoundError, as for ``open`` (a mistyped ``-o`` path is not created),
    unless ``parents`` (the cache's own folders); ``path`` must not be a folder nor
    the file ``keep`` (:func:`check_output`).
    """
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    check_output(path, keep)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as exc:              # say so for the path, not the temporary file
            raise type(exc)(exc.errno, f"cannot create a file in {str(path.parent)!r} "
                            f"({exc.strerror})", str(path)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---- cache entries: checked before they are imported --------------------------------

_TRAILER = "# gradc cache entry {}; SHA-256 of the text above: "
_STALE_TEMP_S = 3600       # a writer's temporary file older than this was left by a crash


def write_entry(path: Path, text: str) -> None:
    """Write a compiled module to the cache, with a last line holding its name and the
    SHA-256 of its text, so that a truncated or damaged entry, or another entry's text
    in its place (a link to it, a copy), is recognised (:func:`entry_is_valid`)."""
    _remove_stale_temps(path)
    write_atomic(path, f"{text}{_trailer(path)}{hashlib.sha256(text.encode()).hexdigest()}\n",
                 parents=True)


def _trailer(path: Path) -> str:
    return _TRAILER.format(path.stem)


def entry_is_valid(path: Path) -> bool:
    """Whether ``path`` is a complete module written by :func:`write_entry` (a
    regular file, not a link, whose text matches its trailer, which names this
    entry), its ``.json`` (if any) is gradc's metadata, and the Numba cache files
    beside it are well-formed pickles."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        data = path.read_bytes()
    except OSError:
        return False
    text, _, last = data[:-1].rpartition(b"\n")
    expected = (_trailer(path).encode("utf-8", "surrogatepass")
                + hashlib.sha256(text + b"\n").hexdigest().encode())
    return (data.endswith(b"\n") and last == expected and _metadata_ok(path)
            and _numba_files_ok(path))


def _metadata_ok(path: Path) -> bool:
    """The entry's ``.json`` is missing (written after the entry) or gradc's metadata
    (not ``null``, a list or damaged: those failed every load, forever)."""
    try:
        _recorded_warnings(path)
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return True


def discard_entry(path: Path) -> None:
    """Remove what was cached from a damaged entry (Python's bytecode, Numba's index
    and data files) and a directory in its place; a file there is left for
    :func:`write_entry` to replace atomically (another process may be reading it)."""
    stale = [*(path.parent / "__pycache__").glob(f"{path.stem}.*")]
    stale += [p for p in (path, path.with_suffix(".json")) if p.is_dir() and not p.is_symlink()]
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


def _numba_files_ok(path: Path) -> bool:
    """Numba's cache files of the module (``__pycache__/<module>.*.nbi`` and ``.nbc``)
    are whole pickles: Numba itself would fail on the first call otherwise.  The
    pickles are walked opcode by opcode (``pickletools``), never loaded."""
    for f in (path.parent / "__pycache__").glob(f"{path.stem}.*.nb[ic]"):
        try:
            data = f.read_bytes()
            # An index holds two pickles (a version, then the data); a data file one.
            rest = _walk_pickle(data) if f.suffix == ".nbi" else data
            if _walk_pickle(rest):
                return False
        except (OSError, ValueError, EOFError):
            return False
    return True


def guard_numba_caches(module) -> None:
    """Make the kernels of ``module`` (an imported entry) compile afresh where loading
    one from Numba's cache fails: a whole pickle of the wrong data (a TypeError) or
    damaged LLVM code would otherwise fail every call, in every process.  The index is
    emptied, so the kernel compiled now replaces the damaged file."""
    for obj in list(vars(module).values()):
        cache = getattr(obj, "_cache", None)
        if callable(getattr(cache, "load_overload", None)) and hasattr(cache, "flush"):
            cache.load_overload = _guarded(cache, cache.load_overload)


def _guarded(cache, load):
    def load_overload(sig, target_context):
        try:
            return load(sig, target_context)
        except Exception:
            with contextlib.suppress(Exception):
                cache.flush()
            return None
    return load_overload


def _walk_pickle(data: bytes) -> bytes:
    """The bytes after the one pickle at the start of ``data``; ValueError if it is
    not a whole pickle."""
    stream = io.BytesIO(data)
    for _ in pickletools.genops(stream):
        pass
    return data[stream.tell():]


def _remove_stale_temps(path: Path) -> None:
    now = time.time()
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime > _STALE_TEMP_S:
                tmp.unlink()


# ---- what is in the cache: metadata, listing, clearing ---------------------------------

def write_metadata(entry: Path, source: Path, files: list, options: dict,
                   warnings: list = ()) -> None:
    """Write ``<entry>.json`` beside the entry (atomically): the .grad file it was
    compiled from, the files that one imports, the options, the versions and the
    compiler's warnings (:class:`gradc.GradcWarning` s, shown again when the entry is
    imported from the cache: :func:`read_warnings`)."""
    import numba
    import numpy

    from gradc.version import __version__
    meta = {"source": str(source), "imports": [str(f) for f in files[1:]], "options": options,
            "gradc": __version__, "numba": numba.__version__, "numpy": numpy.__version__,
            "warnings": [{"message": w.message, "code": w.code, "notes": list(w.notes),
                          "span": None if w.span is None else
                          [w.span.file, w.span.line, w.span.column, w.span.end_line,
                           w.span.end_column]} for w in warnings]}
    write_atomic(entry.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True) + "\n",
                 parents=True)


def read_warnings(entry: Path) -> list:
    """The compiler warnings recorded beside ``entry`` by :func:`write_metadata`
    (none when its ``.json`` is missing or not what :func:`write_metadata` writes)."""
    try:
        return _recorded_warnings(entry)
    except (OSError, ValueError):
        return []


def _recorded_warnings(entry: Path) -> list:
    """:func:`read_warnings`, but OSError when the ``.json`` cannot be read and
    ValueError when it is not what :func:`write_metadata` writes (``null``, a list,
    a warning missing a field or of another type)."""
    meta = _read_json(entry.with_suffix(".json"))
    found = meta.get("warnings") if isinstance(meta, dict) else None
    try:
        return [_warning(w) for w in found]
    except (KeyError, TypeError) as exc:
        raise ValueError("not gradc's metadata") from exc


def _read_json(path: Path):
    """The JSON value in ``path``; ValueError if it is not JSON (or nested too deeply)."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _warning(w: dict):
    """One warning as :func:`write_metadata` records it; KeyError or TypeError if not."""
    from gradc.errors import GradcWarning, Span
    span = w["span"]
    if not (isinstance(w["message"], str) and isinstance(w["code"], str)
            and isinstance(w["notes"], list) and all(isinstance(n, str) for n in w["notes"])):
        raise TypeError("not a warning")
    if span is not None and not (isinstance(span, list) and len(span) == 5
                                 and isinstance(span[0], str)
                                 and all(isinstance(v, (int, type(None))) for v in span[1:])):
        raise TypeError("not a span")
    return GradcWarning(w["message"], None if span is None else Span(*span), w["code"],
                        w["notes"])


@dataclass(frozen=True)
class Entry:
    """One compiled module in the cache; ``meta`` is its ``.json`` (empty if missing
    or unreadable), ``files`` everything of it on disk, ``size`` their bytes."""

    path: Path
    meta: dict
    files: tuple[Path, ...]
    size: int
    mtime: float


def entries(root: Path | None = None) -> list[Entry]:
    """The entries of the cache directory ``root`` (default :func:`cache_dir`),
    oldest first; none when it does not exist."""
    root = cache_dir() if root is None else root
    out = []
    for path in sorted(root.glob("gradc_*.py")) if root.is_dir() else ():
        files = [path, *(f for f in [path.with_suffix(".json")] if f.is_file()),
                 *sorted((root / "__pycache__").glob(f"{path.stem}.*"))]
        try:
            meta = _read_json(path.with_suffix(".json"))
        except (OSError, ValueError):
            meta = {}
        sizes = []
        for f in files:
            with contextlib.suppress(OSError):
                sizes.append(f.stat().st_size)
        with contextlib.suppress(OSError):
            out.append(Entry(path, meta if isinstance(meta, dict) else {}, tuple(files),
                             sum(sizes), path.stat().st_mtime))
    return sorted(out, key=lambda e: (e.mtime, e.path.name))


def clear(root: Path | None = None) -> int:
    """Remove every entry of the cache directory (its module, metadata, bytecode and
    Numba cache files) and the temporary files of crashed writers; return how many
    entries were removed."""
    found = entries(root)
    for e in found:
        for f in e.files:
            with contextlib.suppress(OSError):
                f.unlink()
    root = cache_dir() if root is None else root
    orphans = [m for m in root.glob("gradc_*.json") if not m.with_suffix(".py").exists()] \
        if root.is_dir() else []
    for f in orphans:
        with contextlib.suppress(OSError):
            f.unlink()
    for entry in found:             # what a crashed writer of an entry left
        _remove_stale_temps(entry.path)
    return len(found)
