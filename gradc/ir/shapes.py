"""Shape classes: what the compiler knows about an array's shape before run time.

A :class:`Shape` is ``broadcast(static, *runtime_shape(s) for s in dyn)``:

* ``static`` is a tuple of dims, each an ``int`` or a dim name from an
  annotation (``f32[b, 784]`` gives ``("b", 784)``);
* ``dyn`` is a set of node ids whose shapes are only known at run time
  (generic parameters, and reductions or matmuls of them).

``Shape(("b", "h"))`` is fully static; a generic parameter ``x`` (node 0) has
``Shape((), {0})``.  Two nodes of equal shape class have equal runtime shapes,
which is what fusion needs.  Broadcasting follows NumPy: dims align on the
right, and a 1 stretches.  Named dims are trusted to be equal to any int but
1 at compile time and checked at run time by the generated wrappers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

Dim = int | str


class BroadcastError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class Shape:
    static: tuple[Dim, ...] = ()
    dyn: frozenset[int] = field(default_factory=frozenset)

    @property
    def rank(self) -> int | None:
        """The number of dims, or None when a run-time shape takes part."""
        return None if self.dyn else len(self.static)

    @property
    def is_scalar(self) -> bool:
        return not self.dyn and all(d == 1 for d in self.static)

    def substitute(self, mapping: dict[int, int]) -> "Shape":
        if not self.dyn or not (self.dyn & mapping.keys()):
            return self
        return Shape(self.static, frozenset(mapping.get(d, d) for d in self.dyn))

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.static)
        text = f"({dims}{',' if len(self.static) == 1 else ''})"
        if self.dyn:
            text += " ⊔ " + " ⊔ ".join(f"shape(%{d})" for d in sorted(self.dyn))
        return text


SCALAR = Shape()


class _DimArithmetic:
    """Integer arithmetic of dims (``h - 1``, ``2 * h``, ``-h``): a :class:`DimExpr`,
    folded where both sides are ints."""

    def __add__(self, other):
        return dim_op("+", self, other)

    def __radd__(self, other):
        return dim_op("+", other, self)

    def __sub__(self, other):
        return dim_op("-", self, other)

    def __rsub__(self, other):
        return dim_op("-", other, self)

    def __mul__(self, other):
        return dim_op("*", self, other)

    def __rmul__(self, other):
        return dim_op("*", other, self)

    def __neg__(self):
        return dim_op("-", 0, self)


@dataclass(frozen=True)
class DimRef(_DimArithmetic):
    """An integer attribute that is a dim of the op's signature (the depth of
    ``one_hot(t, k)`` for ``x: [n, k]``): known at call time.  Its ``repr`` is how
    the generated wrappers read it (their dict of the call's dims, ``_d``); the
    interpreter and the framework lowerings look it up with :func:`resolve_dims`."""

    name: str

    def __repr__(self) -> str:
        return f"_d[{self.name!r}]"


@dataclass(frozen=True)
class DimExpr(_DimArithmetic):
    """``lhs op rhs`` of ints and dims (``op``: ``+ - *``), known at call time: a slice
    bound ``x[..., :h - 1]``.  Its ``repr`` is the Python expression over ``_d``."""

    op: str
    lhs: object
    rhs: object

    def __repr__(self) -> str:
        return f"({self.lhs!r} {self.op} {self.rhs!r})"


_DIM_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def dim_op(op: str, lhs, rhs):
    """``lhs op rhs`` for ints, DimRefs and DimExprs (TypeError for anything else, a
    float among them)."""
    for v in (lhs, rhs):
        if isinstance(v, bool) or not isinstance(v, (int, DimRef, DimExpr)):
            return NotImplemented
    if isinstance(lhs, int) and isinstance(rhs, int):
        return _DIM_OPS[op](lhs, rhs)
    return DimExpr(op, lhs, rhs)


def affine(v) -> tuple[dict[str, int], int] | None:
    """``v`` (an int, DimRef or DimExpr) as a sum of dims times ints plus an int
    (``({"b": 1}, 1)`` for ``b + 1``), or None where it is not one (a product of dims)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return {}, v
    if isinstance(v, DimRef):
        return {v.name: 1}, 0
    if not isinstance(v, DimExpr):
        return None
    a, b = affine(v.lhs), affine(v.rhs)
    if a is None or b is None:
        return None
    if v.op == "*":
        if a[0] and b[0]:
            return None
        k, (terms, d) = (a[1], b) if not a[0] else (b[1], a)     # int k times terms + d
        return {n: k * m for n, m in terms.items() if k * m}, k * d
    sign = 1 if v.op == "+" else -1
    terms = dict(a[0])
    for n, m in b[0].items():
        terms[n] = terms.get(n, 0) + sign * m
    return {n: m for n, m in terms.items() if m}, a[1] + sign * b[1]


def resolve_dim(v, dims: dict[str, int]):
    """``v`` with its DimRefs and DimExprs replaced by their sizes in ``dims``, in tuples
    too (a slice's key)."""
    if isinstance(v, DimRef):
        return dims[v.name]
    if isinstance(v, DimExpr):
        return _DIM_OPS[v.op](resolve_dim(v.lhs, dims), resolve_dim(v.rhs, dims))
    if isinstance(v, tuple):
        return tuple(resolve_dim(i, dims) for i in v)
    return v


def bound_dims(params: Iterable[tuple[Shape, tuple[int, ...]]]) -> dict[str, int]:
    """The sizes of the named dims of parameters of these shape classes, given their
    run-time shapes (a parameter's class is static where it is annotated)."""
    dims: dict[str, int] = {}
    for shape, actual in params:
        if not shape.dyn and len(shape.static) == len(actual):
            dims.update((d, int(n)) for d, n in zip(shape.static, actual) if isinstance(d, str))
    return dims


def resolve_dims(attrs: dict, dims: dict[str, int]) -> dict:
    """``attrs`` with each :class:`DimRef` and :class:`DimExpr` (alone or in tuples)
    replaced by its size in ``dims``."""
    return {k: resolve_dim(v, dims) for k, v in attrs.items()}


def broadcast_static(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """NumPy broadcasting of two static dim tuples; raises BroadcastError."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out: list[Dim] = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif isinstance(x, str) and isinstance(y, int):
            out.append(x)          # the name must equal y at run time
        elif isinstance(y, str) and isinstance(x, int):
            out.append(y)
        else:
            raise BroadcastError(f"dims {x!r} and {y!r} do not broadcast")
    return tuple(out)


def broadcast(shapes: Iterable[Shape]) -> Shape:
    """The shape class of an elementwise result of operands of these classes."""
    static: tuple[Dim, ...] = ()
    dyn: set[int] = set()
    for s in shapes:
        static = broadcast_static(static, s.static)
        dyn |= s.dyn
    return Shape(static, frozenset(dyn))


def _g_axes(ndim, axes, op):
    """``axes`` (a tuple of ints) as non-negative axes of a rank-``ndim`` array;
    ValueError as NumPy's for one out of bounds or repeated."""
    out = []
    for a in axes:
        if not -ndim <= a < ndim:       # NumPy's AxisError (a ValueError, an IndexError)
            raise getattr(np, "exceptions", np).AxisError(
                f"{op}: axis {a} is out of bounds for array of dimension {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axis in {tuple(axes)}")
    return tuple(out)


def normalize_axis(axis: tuple[int, ...] | None, rank: int) -> tuple[int, ...]:
    """Axes as non-negative ints, sorted; all axes when ``axis`` is None."""
    if axis is None:
        return tuple(range(rank))
    try:
        return tuple(sorted(_g_axes(rank, axis, "reduce")))
    except ValueError as exc:
        raise BroadcastError(str(exc)) from None


# The run time's axis check (copied into generated modules by the registry's layout
# primitives), under a public name.
checked_axes = _g_axes


def reduce_static(dims: tuple[Dim, ...], axis: tuple[int, ...] | None,
                  keepdims: bool) -> tuple[Dim, ...]:
    axes = normalize_axis(axis, len(dims))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(dims))
    return tuple(d for i, d in enumerate(dims) if i not in axes)


def matmul_static(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Result dims of ``a @ b`` by ``np.matmul``'s rules: operands of rank >= 1; a 1-d
    ``a`` is a row (a 1-d ``b`` a column) whose added dim is removed from the result;
    the dims before the last two are batch dims, which broadcast.  A named dim is
    trusted to equal an int (checked at run time); two different names are an error."""
    if not a or not b:
        raise BroadcastError("a 0-d operand has no dim to contract (scale with '*')")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    ka, kb = a2[-1], b2[-2]
    if ka != kb and isinstance(ka, str) == isinstance(kb, str):
        raise BroadcastError(f"contracted dims {ka!r} and {kb!r} differ")
    try:
        batch = broadcast_static(a2[:-2], b2[:-2])
    except BroadcastError as exc:
        raise BroadcastError(f"batch {exc}") from None
    return batch + a2[-2:-1] * (len(a) > 1) + b2[-1:] * (len(b) > 1)
