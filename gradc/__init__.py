"""gradc: a source-to-source compiler for gradient rules.

Public API (docs/generated-module.md describes it):

* :func:`compile_source` — .grad text to the text of a standalone Python module;
* :func:`compile_file` — a .grad file to a module file;
* :func:`load` — compile (cached on disk) and import a .grad file;
* :func:`install_import_hook`, :func:`uninstall_import_hook` — ``import NAME`` of a
  ``NAME.grad`` on ``sys.path`` (:mod:`gradc.loader.import_hook`).
"""
from __future__ import annotations

import os
from pathlib import Path

from gradc.errors import GradcError, GradcErrors, GradcWarning
from gradc.version import __version__

__all__ = ["compile_source", "compile_file", "load", "install_import_hook",
           "uninstall_import_hook", "GradcError", "GradcErrors", "GradcWarning",
           "__version__"]


def compile_source(text: str, *, file: str = "<string>", target: str = "cpu",
                   fuse: bool = True, fast_math: bool = False, precise: bool = False,
                   check: bool = False) -> str:
    """Compile .grad source ``text`` to the source of a standalone Python module.

    ``file`` names the source in errors and in the module header (imports are
    resolved relative to it).  ``target``: "cpu", "cuda" (every op's methods
    under ``NAME.cuda``, on device arrays; the CPU methods raise) or "all"
    (both); running CUDA kernels needs numba-cuda (the ``cuda`` extra), writing
    them does not.  ``fuse=False`` makes the default
    methods use the unfused plans too.  ``fast_math`` enables Numba's
    fast-math flags that keep IEEE NaN/inf semantics.  ``precise=True`` makes the
    kernels call libm for every transcendental function instead of the
    vectorised math library (docs/mathlib.md).  ``check=True`` verifies
    the IR after every pass.  Raises :class:`GradcError` (or
    :class:`GradcErrors` for several) on a user error.
    """
    from gradc.codegen.module import compile_program
    from gradc.frontend.check import check_source
    from gradc.frontend.limits import out_of_stack
    if target not in ("cpu", "cuda", "all"):
        raise ValueError(f"target must be 'cpu', 'cuda' or 'all', got {target!r}")
    try:        # the limits of gradc.frontend.limits keep the recursion shallow
        program = check_source(text, file)
    except RecursionError:
        raise out_of_stack(file) from None
    return compile_program(program, file, target=target, fuse=fuse, fast_math=fast_math,
                           precise=precise, check=check)


def compile_file(path: str | os.PathLike, out: str | os.PathLike | None = None,
                 **options) -> Path:
    """Compile the .grad file ``path`` to ``out`` (default: ``<stem>_gen.py`` beside it).

    Returns the path written.  Options as for :func:`compile_source`.  The module
    is written to a temporary file and renamed, so ``out`` is never left
    half-written, and is left as it was when compiling fails.
    """
    from gradc.frontend.parser import read_source
    from gradc.loader.disk_cache import write_atomic
    path = Path(path)
    text = read_source(path)
    module = compile_source(text, file=str(path), **options)
    out = Path(out) if out is not None else path.with_name(f"{path.stem}_gen.py")
    write_atomic(out, module, keep=path)    # replaced whole or not at all; never the .grad
    return out


def load(path: str | os.PathLike, **options):
    """Compile ``path`` (cached on disk by source, gradc, Numba and NumPy versions and
    options) and return the imported module."""
    from gradc.loader.load import load as _load
    return _load(path, **options)


def install_import_hook(**options):
    """Make ``import NAME`` compile and import ``NAME.grad`` found on ``sys.path``
    (a ``NAME.py`` takes precedence), through :func:`load`'s cache; ``options`` as
    for :func:`compile_source`.  Returns the finder, a context manager that
    uninstalls it.  See :mod:`gradc.loader.import_hook`."""
    from gradc.loader.import_hook import install_import_hook as _install
    return _install(**options)


def uninstall_import_hook() -> bool:
    """Remove the hook of :func:`install_import_hook`; returns whether one was there."""
    from gradc.loader.import_hook import uninstall_import_hook as _uninstall
    return _uninstall()
