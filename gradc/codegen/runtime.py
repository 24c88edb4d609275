"""The run time a generated module carries: gradc's functions copied as text.

Generated modules never import gradc.  Each run-time module of gradc
(:mod:`.runtime_src` for the CPU wrappers, :mod:`.runtime_dask_src` for Dask,
:mod:`.runtime_cuda_src` for CUDA) defines its part as ordinary Python, tested as
such; :func:`runtime_objects` is the one way a module's part is picked out (by
name prefix, in source order) and :func:`source_of` the one way it is copied.
"""
from __future__ import annotations

import functools
import inspect
from types import ModuleType


def runtime_objects(module: ModuleType, prefixes: tuple[str, ...]) -> list:
    """The functions, classes and Numba intrinsics defined in ``module`` (not
    imported into it) whose names start with one of ``prefixes``, in source order
    (found once per process: a new list each call, the caller's to change)."""
    return list(_runtime_objects(module, tuple(prefixes)))


@functools.lru_cache(maxsize=None)
def _runtime_objects(module: ModuleType, prefixes: tuple[str, ...]) -> tuple:
    here = inspect.getsourcefile(module)
    found = []
    for name, obj in vars(module).items():
        if not name.startswith(prefixes) or not callable(obj):
            continue
        try:
            obj_src = inspect.unwrap(obj) if hasattr(obj, "__wrapped__") else obj
            if inspect.getsourcefile(obj_src) != here:
                continue                          # imported from another module
            line = inspect.getsourcelines(obj_src)[1]
        except TypeError:                         # a builtin: nothing to copy
            continue
        found.append((line, obj))
    return tuple(obj for _, obj in sorted(found, key=lambda p: p[0]))


def source_of(obj) -> str:
    """The source text of a run-time object, as it stands in gradc: read once per
    process and object (``inspect.getsource`` tokenizes the file from the object's
    line on, and parses the whole file for a class: most of the time of compiling
    a small op, whose module copies some 140 such objects)."""
    try:
        return _SOURCES[obj]
    except KeyError:
        text = _SOURCES[obj] = inspect.getsource(obj).rstrip("\n")
        return text
    except TypeError:                             # unhashable: read every time
        return inspect.getsource(obj).rstrip("\n")


_SOURCES: dict = {}
