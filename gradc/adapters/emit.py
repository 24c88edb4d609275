"""``gradc compile --emit torch``: a Python module of PyTorch functions, one per op.

The module it writes imports gradc and torch (not only numpy and numba, unlike the
generated module): on import it loads the ``.grad`` file through gradc's cache
(:func:`gradc.load`, with the options given here) and exposes
``gradc.adapters.torch.as_torch(op)`` for every op, as ``OPS[name]`` and, where the
name is a plain identifier, as a module attribute.  The ``.grad`` file is found by
its path relative to the written module, so the two can move together.
"""
from __future__ import annotations

import keyword
import os
from pathlib import Path

from gradc.codegen.quote import docstring

_OWN = {"OPS", "MODULE", "SOURCE", "as_torch", "gradc", "warnings", "Path"}


def torch_module_text(spec: str | os.PathLike, out: str | os.PathLike, ops: list[str],
                      options: dict) -> str:
    """The text of the PyTorch module for the ``.grad`` file ``spec``, to be written
    at ``out``; ``ops`` are the op names (in the module's order) and ``options``
    those of :func:`gradc.load` (target, fuse, fast_math, precise)."""
    spec, out = Path(spec).resolve(), Path(out).resolve()
    rel = Path(os.path.relpath(spec, out.parent)).as_posix()
    names = [n for n in ops if n.isidentifier() and not keyword.iskeyword(n) and n not in _OWN]
    opts = "".join(f", {k}={v!r}" for k, v in sorted(options.items()))
    lines = [
        f'"""PyTorch functions of the ops of {docstring(spec.name)}, written by gradc compile '
        "--emit torch.",
        "",
        "Each is gradc.adapters.torch.as_torch(op) (docs/frameworks.md). Needs gradc and torch;",
        "the kernels are compiled into gradc's cache on first import. Do not edit: recompile.",
        '"""',
        "import warnings",
        "from pathlib import Path",
        "",
        "import gradc",
        "from gradc.adapters.torch import as_torch",
        "",
        f"SOURCE = Path(__file__).resolve().parent / {rel!r}",
        "with warnings.catch_warnings():     # gradc compile printed them",
        '    warnings.simplefilter("ignore", gradc.GradcWarning)',
        f"    MODULE = gradc.load(SOURCE{opts})",
        "OPS = {name: as_torch(op) for name, op in MODULE.OPS.items()}",
        "",
        *(f"{n} = OPS[{n!r}]" for n in names),
        "",
        f"__all__ = {['OPS', *names]!r}",
        "",
    ]
    return "\n".join(lines)
