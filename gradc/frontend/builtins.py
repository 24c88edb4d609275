"""The builtin functions of the .grad language (docs/language.md, *Builtins*) and
their call forms.

This table is what the checker validates calls against; how each builtin is
lowered to IR primitives lives in :mod:`gradc.ir.lower`.  The primitives marked
``public`` in the registry (:mod:`gradc.ir.primitives`) are builtins by
definition: their entries (and aliases) are derived from it, keywords included.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from gradc.ir.primitives import PRIMITIVES


@dataclass(frozen=True)
class Builtin:
    name: str
    min_args: int
    max_args: int
    kwargs: tuple[str, ...] = ()
    kind: str = "elementwise"     # elementwise | reduction | special | library
    # The kind of each keyword's value: "axis" (an int or a tuple of ints) or "bool".
    kwarg_kinds: tuple[tuple[str, str], ...] = (("axis", "axis"), ("keepdims", "bool"))


_UNARY = ("abs sign exp exp2 expm1 log log2 log10 log1p sqrt rsqrt square reciprocal "
          "sin cos tan asin acos atan sinh cosh tanh sigmoid softplus erf erfc floor "
          "ceil round ones_like zeros_like stop_gradient").split()
_REDUCE = ("sum", "mean", "prod", "logsumexp", "norm")

BUILTINS = MappingProxyType({b.name: b for b in [
    *(Builtin(n, 1, 1) for n in _UNARY),
    Builtin("atan2", 2, 2), Builtin("pow", 2, 2),
    Builtin("clip", 3, 3), Builtin("where", 3, 3), Builtin("full_like", 2, 2),
    # max/min: one argument (with axis=/keepdims=) reduces, two are elementwise.
    Builtin("max", 1, 2, ("axis", "keepdims"), "special"),
    Builtin("min", 1, 2, ("axis", "keepdims"), "special"),
    *(Builtin(n, 1, 1, ("axis", "keepdims"), "reduction") for n in _REDUCE),
    # grad(EXPR, NAME): gradient of a scalar expression w.r.t. a name.
    Builtin("grad", 2, 2, (), "special"),
    # The registry's public primitives, under their names and aliases.
    *(Builtin(name, len(p.params) + len(p.attr_params), len(p.params) + len(p.attr_params),
              tuple(k for k, kind, _ in p.keywords
                    if kind != "internal" and k not in p.attr_params),
              p.kind, tuple((k, kind) for k, kind, _ in p.keywords if kind != "internal"))
      for p in PRIMITIVES.values() if p.public for name in (p.name, *p.aliases)),
]})

CONSTANTS = MappingProxyType({"pi": 3.141592653589793, "e": 2.718281828459045,
                              "inf": float("inf")})
DTYPES = ("f16", "f32", "f64", "i32", "i64", "bool")
