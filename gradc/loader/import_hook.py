"""An opt-in import hook: ``import my_ops`` finds ``my_ops.grad`` on ``sys.path``.

:func:`install_import_hook` appends a :class:`GradFinder` to ``sys.meta_path``.
It is asked last, so it only sees names that every other finder (Python
modules, packages, extension modules, namespace packages) failed to find: a
``my_ops.py`` (or a package ``my_ops/``) anywhere on ``sys.path`` takes precedence
over ``my_ops.grad``, and the hook costs nothing for imports that succeed without
it.  ``import pkg.my_ops`` looks for ``my_ops.grad`` in ``pkg.__path__`` (a regular or
a namespace package).  The module is compiled through :func:`gradc.load`'s cache
(:mod:`gradc.loader.disk_cache`) and registered in ``sys.modules`` under the imported
name; its ``__file__`` is the .grad file, its attributes (``OPS``, the ops) are those
of the module :func:`gradc.load` returns for the file, which is also in
``sys.modules`` under its own name, ``__gradc_module__``.  ``importlib.reload`` compiles again when
the file (or a file it imports) changed.  An error in the file raises the
:class:`gradc.GradcError` (``file:line:col`` with a caret), not an ImportError.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

SUFFIX = ".grad"
_OWN = ("__name__", "__file__", "__spec__", "__loader__", "__package__", "__path__",
        "__cached__", "__builtins__")


class GradLoader(importlib.abc.Loader):
    """Compiles (through the cache) and runs the module of one .grad file."""

    def __init__(self, path: Path, options: dict):
        self.path = path
        self.options = options

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None                      # the default module object

    def exec_module(self, module: ModuleType) -> None:
        """Fill ``module`` with the attributes of ``gradc.load(path)``'s module (its
        name, file, spec and loader stay the imported ones'): the kernels keep the
        cache entry's module name, which Numba's on-disk cache records and imports."""
        from gradc.loader.load import load
        compiled = load(self.path, **self.options)
        own = {k: module.__dict__[k] for k in _OWN if k in module.__dict__}
        module.__dict__.update(compiled.__dict__)
        module.__dict__.update(own)
        module.__gradc_module__ = compiled.__name__


class GradFinder(importlib.abc.MetaPathFinder):
    """Finds ``<name>.grad`` in the directories of ``sys.path`` (top-level names) or
    of the parent package's ``__path__``.  ``options`` are compile options, as for
    :func:`gradc.compile_source`.  A context manager: leaving the ``with`` block
    uninstalls it."""

    def __init__(self, **options):
        self.options = options

    def find_spec(self, fullname: str, path=None, target=None):
        name = fullname.rpartition(".")[2]
        for entry in sys.path if path is None else path:
            if not isinstance(entry, (str, os.PathLike)):
                continue
            candidate = Path(entry or os.getcwd()) / f"{name}{SUFFIX}"
            if candidate.is_file():
                candidate = candidate.resolve()     # __file__ is the .grad file
                return importlib.util.spec_from_file_location(
                    fullname, candidate, loader=GradLoader(candidate, self.options))
        return None

    def __enter__(self) -> GradFinder:
        return self

    def __exit__(self, *exc) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def __repr__(self) -> str:
        return f"GradFinder({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


def install_import_hook(**options) -> GradFinder:
    """Make ``import NAME`` find ``NAME.grad`` on ``sys.path`` (see this module's
    docstring); ``options`` (``target``, ``fuse``, ``fast_math``, ``precise``) are
    passed to the compiler.  Replaces a hook installed before; returns the finder,
    which can be used as a context manager (``with gradc.install_import_hook():``)."""
    uninstall_import_hook()
    finder = GradFinder(**options)
    sys.meta_path.append(finder)
    return finder


def uninstall_import_hook() -> bool:
    """Remove the import hook; modules it imported stay imported.  Returns whether
    one was installed."""
    found = [f for f in sys.meta_path if isinstance(f, GradFinder)]
    for f in found:
        sys.meta_path.remove(f)
    return bool(found)
