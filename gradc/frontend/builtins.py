"""The builtin functions of the .grad language (docs/language.md, *Builtins*) and
their call forms.

This table is what the checker validates calls against; how each builtin is
lowered to IR primitives lives in :mod:`gradc.ir.lower`.  The primitives marked
``public`` in the registry (:mod:`gradc.ir.primitives`) are builtins by
definition: their entries (and aliases) are derived from it, keywords included.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

from gradc.ir.primitives import PRIMITIVES


@dataclass(frozen=True)
class Builtin:
    name: str
    min_args: int
    max_args: int
    kwargs: tuple[str, ...] = ()
    kind: str = "elementwise"     # elementwise | reduction | special | library
    # The kind of each keyword's value: "axis" (an int or a tuple of ints), "bool", or
    # "value" (an operand with a default: any expression, ``random_uniform_like``'s lo=;
    # arange's stop=, a number or a dim).
    kwarg_kinds: tuple[tuple[str, str], ...] = (("axis", "axis"), ("keepdims", "bool"))
    # The kinds of the trailing positional arguments that are constants (attributes):
    # "axis", "shape" (a tuple of ints and dims) or "int".
    arg_kinds: tuple[str, ...] = ()
    # Their names: each may be given by keyword instead, as NumPy's are
    # (``expand_dims(x, axis=-1)``, ``swapaxes(x, 0, axis2=1)``).
    attrs: tuple[str, ...] = ()

    def position(self, key: str) -> int | None:
        """The position of keyword ``key`` when it is an optional operand, else None."""
        values = [k for k, kind in self.kwarg_kinds if kind == "value"]
        return self.min_args + values.index(key) if key in values else None


MAX_JOINED = 1024       # the most arrays one concat or stack joins
_REDUCTION_KWARGS = (("axis", "axis"), ("keepdims", "bool"))


def _derived(p) -> list[Builtin]:
    """The builtins of a public primitive: its name and aliases, taking its operands
    and attributes passed positionally, and its keywords (a reduction's axis= and
    keepdims=, the optional operands)."""
    n = len(p.params) + len(p.attr_params)
    kinds = (_REDUCTION_KWARGS if p.kind == "reduction" else
             tuple((k, kind) for k, kind, _ in p.keywords
                   if kind != "internal" and k not in p.attr_params))
    kinds += tuple((k, "value") for k, _ in p.optional)
    arg_kinds = tuple({k: kind for k, kind, _ in p.keywords}[a] for a in p.attr_params)
    return [Builtin(name, n - len(p.optional), n, tuple(k for k, _ in kinds), p.kind, kinds,
                    arg_kinds, p.attr_params)
            for name in (p.name, *p.aliases)]


BUILTINS = MappingProxyType({b.name: b for b in [
    # The registry's public primitives, under their names and aliases.
    *(b for p in PRIMITIVES.values() if p.public for b in _derived(p)),
    # Sugar: full_like(x, 1) and full_like(x, 0).
    Builtin("ones_like", 1, 1), Builtin("zeros_like", 1, 1),
    # max/min: one argument (with axis=/keepdims=) reduces, two are elementwise.
    Builtin("max", 1, 2, ("axis", "keepdims"), "special"),
    Builtin("min", 1, 2, ("axis", "keepdims"), "special"),
    # grad(EXPR, NAME): gradient of a scalar expression w.r.t. a name.
    Builtin("grad", 2, 2, (), "special"),
    # Creation and joining, of a varying number of arguments (gradc.ir.indexing lowers
    # them to the registry's arange and concat): arange(start, stop, step), eye(n, m, k)
    # of numbers and dims; concat(xs..., axis=) (alias concatenate), stack(xs..., axis=).
    Builtin("arange", 1, 3, ("stop", "step"), "library", (("stop", "value"), ("step", "value"))),
    Builtin("eye", 1, 3, ("m", "k"), "library", (("m", "value"), ("k", "value"))),
    *(Builtin(name, 1, MAX_JOINED, ("axis",), "library", (("axis", "axis"),))
      for name in ("concat", "concatenate", "stack")),
    # transpose(x) without axes reverses them, as NumPy's (x.T; gradc.ir.expr lowers it)
    *(replace(b, min_args=1) for b in _derived(PRIMITIVES["permute_dims"])
      if b.name == "transpose"),
]})

# true and false are values anywhere (bool constants: 1 and 0 in arithmetic, as Python's).
CONSTANTS = MappingProxyType({"pi": 3.141592653589793, "e": 2.718281828459045,
                              "inf": float("inf"), "true": True, "false": False})
DTYPES = ("f16", "f32", "f64", "i32", "i64", "bool")
