"""The only ways text and values of a .grad file enter a generated module.

* :func:`py_name` — a user name (op, parameter, upstream) as a Python identifier;
* :func:`comment` — text inside a ``#`` comment line;
* :func:`docstring` — text inside a ``\"\"\"`` docstring;
* :func:`py_literal` — a number (a default, a constant) as a Python expression;
* everything else goes through :func:`repr` of a ``str``, which escapes every
  character that is not printable (newlines, NUL, U+2028, lone surrogates...).

``py_name`` is a bijection from user names to identifiers that never start with
``_``: the generated module's own names all start with ``_`` (``_g_inputs``,
``_GradcOp``, ``_T``, ``_SIG_<op>``...) or are in :data:`RESERVED`, so a user
name can neither collide with them nor with another user name.
"""
from __future__ import annotations

import keyword
import math
import numbers

# Names the generated module binds or reads without a leading underscore: its
# imports, its public names, the ``out=`` keyword of every method (``stream=``
# of the CUDA ones, ``seed=`` of an op that draws), and the
# builtins its helpers call (a test keeps this list complete).  A fixed list,
# not ``dir(builtins)``, so that the output does not depend on the Python version.
RESERVED = frozenset({
    "np", "numba", "ctypes", "inspect", "math", "os", "site", "sys", "threading", "OPS",
    "SOURCE_SHA256",
    "out", "seed",
    "cuda", "stream", "TARGET", "CUDA_KERNELS",
    "AttributeError", "Exception", "IndexError", "NotImplementedError", "OSError",
    "OverflowError",
    "RuntimeError", "TypeError", "ValueError",
    "abs", "all", "any", "bool", "complex", "dict", "enumerate", "float", "getattr",
    "globals", "hasattr", "id", "int", "isinstance", "iter", "len", "list", "map", "max", "min", "next",
    "object",
    "property", "range", "repr", "reversed", "set", "slice", "sorted", "str", "sum", "super",
    "Ellipsis",
    "tuple", "type", "zip",
})


def is_plain(name: str) -> bool:
    """A name used in generated code as it is: not a keyword, not reserved,
    neither starting nor ending with ``_``."""
    return (name.isidentifier() and name.isascii() and not keyword.iskeyword(name)
            and name not in RESERVED and not name.startswith("_") and not name.endswith("_"))


def py_name(name: str) -> str:
    """``name`` as a safe identifier: plain names as they are, others end in ``_``.

    ``lambda`` -> ``lambda_``, ``x_`` -> ``x__``, ``np`` -> ``np_``, and names
    starting with ``_`` get a ``u`` at both ends (``_T`` -> ``u_Tu_``), so no
    result starts with ``_``.  Injective: plain results never end in ``_``; the
    others do, and ``n + "_"`` (``n`` not plain) never equals ``"u" + m + "u_"``
    because ``"u" + m + "u"`` is plain.
    """
    if not (name.isidentifier() and name.isascii()):
        raise ValueError(f"not an ASCII identifier: {name!r}")   # the grammar ensures it
    if is_plain(name):
        return name
    if name.startswith("_"):
        return f"u{name}u_"
    return f"{name}_"


def _escape(c: str) -> str:
    """One character as a Python escape (``\\r``, ``\\x00``, ``\\u2028``, ``\\"``)."""
    return '\\"' if c == '"' else repr(c)[1:-1]


def comment(text: str) -> str:
    """``text`` for one comment line: characters that are not printable (line
    breaks of any kind, NUL, bidi controls, surrogates) as backslash escapes."""
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def docstring(text: str) -> str:
    """``text`` inside a ``\"\"\"`` docstring: as :func:`comment`, and backslashes and
    double quotes escaped, so that the docstring's value is ``text``."""
    return "".join(_escape(c) if c in '\\"' or not c.isprintable() else c for c in text)


def py_literal(value: float | int | bool | None) -> str:
    """A default or constant as a Python expression (``math.inf`` and ``math.nan``
    for the values ``repr`` writes as the undefined names ``inf`` and ``nan``)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if getattr(getattr(value, "dtype", None), "kind", None) == "b":     # numpy.bool_
        return repr(bool(value))
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if not isinstance(value, numbers.Real):
        raise TypeError(f"not a number: {value!r}")
    value = float(value)
    if math.isfinite(value):
        return repr(value)
    return "math.nan" if math.isnan(value) else "math.inf" if value > 0 else "-math.inf"
