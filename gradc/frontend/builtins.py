"""The builtin functions of the .grad language (docs/language.md, *Builtins*) and
their call forms.

This table is what the checker validates calls against; how each builtin is
lowered to IR primitives lives in :mod:`gradc.ir.lower`.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Builtin:
    name: str
    min_args: int
    max_args: int
    kwargs: tuple[str, ...] = ()
    kind: str = "elementwise"     # elementwise | reduction | special


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
]})

CONSTANTS = MappingProxyType({"pi": 3.141592653589793, "e": 2.718281828459045,
                              "inf": float("inf")})
DTYPES = ("f16", "f32", "f64", "i32", "i64", "bool")
