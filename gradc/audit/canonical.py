"""A canonical form of graph values, for comparing two graphs symbolically.

:func:`canonical` maps a value to ``(c, key)``, meaning ``c * key``, where equal
keys are equal expressions: products are flattened with their constant factors
multiplied into ``c``, sums are sorted terms with the first coefficient taken
out, commutative operands are sorted, ``full_like(_, k)`` is the constant ``k``,
autodiff's NaN-safe product ``zero_masked(ct, g)`` (0 only where ``g == 0`` and
``ct`` is NaN) is ``ct``, and ``sigmoid(-a)`` is ``1 - sigmoid(a)``.  Parameters
are keyed by name, so values of two different graphs over the same parameters
compare.  Used by the custom-gradient audit
(:mod:`gradc.audit.custom_rules`): ``rule = c * derivative`` is seen exactly.
"""
from __future__ import annotations

from gradc.ir.graph import Graph
from gradc.ir.primitives import PRIMITIVES

ONE = ("1",)                   # the key of a constant
_COMMUTATIVE = frozenset("maximum minimum eq ne".split())


def _r(c: float) -> float:
    return float(f"{c:.12g}")


def canonical(g: Graph, nid: int, unit: frozenset = frozenset(), memo: dict | None = None
              ) -> tuple[float, object]:
    """``(c, key)`` with value ``c * key`` for the value ``nid`` of ``g``: equal keys
    are equal expressions, whatever their graphs (parameters named in ``unit`` are
    taken as 1).  ``memo`` caches the forms of ``g``'s nodes."""
    memo = {} if memo is None else memo
    if nid in memo:
        return memo[nid]
    node = g.node(nid)
    op = node.op
    args = [canonical(g, a, unit, memo) for a in node.args] if op != "const" else []
    if op == "const" or (op == "param" and node.attr("name") in unit):
        out = (float(node.value) if op == "const" else 1.0, ONE)
    elif op == "full_like" and g.node(node.args[1]).op == "const":
        out = args[1]
    elif op == "param":
        out = (1.0, ("param", node.attr("name")))
    elif op in ("neg", "identity"):
        out = ((-1.0 if op == "neg" else 1.0) * args[0][0], args[0][1])
    elif op in ("mul", "square"):
        out = _product(args if op == "mul" else args * 2)
    elif op == "div" and args[1][1] == ONE and args[1][0] != 0:
        out = (args[0][0] / args[1][0], args[0][1])
    elif op in ("add", "sub"):
        b = args[1] if op == "add" else (-args[1][0], args[1][1])
        out = _sum([args[0], b])
    elif op == "zero_masked":
        out = args[0]        # zero_masked(ct, g): ct, up to NaN
    elif op == "sigmoid" and args[0][0] < 0:
        # sigmoid(-a) = 1 - sigmoid(a): sigmoid's derivative rule is out * sigmoid(-x),
        # a rule written out * (1 - out) is the same expression
        flipped = (1.0, (op, node.attrs, ((_r(-args[0][0]), args[0][1]),)))
        out = _sum([(1.0, ONE), (-1.0, flipped[1])])
    else:
        keys = [(_r(c), k) for c, k in args]
        if op in _COMMUTATIVE:
            keys.sort(key=repr)
        out = (1.0, (op, node.attrs, tuple(keys)))
    if out[0] == 0:
        out = (0.0, ONE)
    memo[nid] = out
    return out


def _product(terms) -> tuple[float, object]:
    c, factors = 1.0, []
    for tc, key in terms:
        c *= tc
        if key != ONE:
            factors += list(key[1]) if key[0] == "mul" else [key]
    if c == 0 or not factors:
        return (c, ONE)
    return (c, factors[0] if len(factors) == 1 else ("mul", tuple(sorted(factors, key=repr))))


def _sum(terms) -> tuple[float, object]:
    coef: dict = {}
    for tc, key in terms:
        parts = [(tc * c, k) for k, c in key[1]] if key[0] == "add" else [(tc, key)]
        for c, k in parts:
            coef[k] = coef.get(k, 0.0) + c
    items = sorted(((k, c) for k, c in coef.items() if c != 0), key=lambda kc: repr(kc[0]))
    if not items:
        return (0.0, ONE)
    if len(items) == 1:
        return (items[0][1], items[0][0])
    lead = items[0][1]
    return (lead, ("add", tuple((k, _r(c / lead)) for k, c in items)))


def proportion(cg: Graph, c: int, tg: Graph, t: int, unit: frozenset = frozenset()
               ) -> tuple[str, float] | None:
    """How value ``c`` of ``cg`` relates to value ``t`` of ``tg`` (parameters named in
    ``unit`` taken as 1): ``("zero", 0.0)`` when ``t`` is identically 0 and ``c`` is
    not, ``("scaled", k)`` when ``c = k * t`` (``k = 1``: equal), None when the
    canonical forms do not tell (the values may still be equal)."""
    cc, ck = canonical(cg, c, unit)
    tc, tk = canonical(tg, t, unit)
    if tc == 0:
        return ("zero", 0.0) if cc != 0 else ("scaled", 1.0)
    if ck == tk:
        return ("scaled", cc / tc)
    return None


def reads_params(g: Graph, nid: int, names: set) -> bool:
    """Whether the value ``nid`` depends on the values (not only the shape) of a
    parameter named in ``names``."""
    todo, seen = [nid], set()
    while todo:
        n = todo.pop()
        node = g.node(n)
        if node.op == "param" and node.attr("name") in names:
            return True
        skip = PRIMITIVES[node.op].shape_only
        new = [a for i, a in enumerate(node.args) if i not in skip and a not in seen]
        seen.update(new)
        todo += new
    return False


def clip_bounds(g: Graph, out: int) -> list[tuple[float, float]]:
    """The constant bounds of every clip the value ``out`` depends on: ``clip(_, lo,
    hi)``, or ``min(max(_, lo), hi)`` and ``max(min(_, hi), lo)`` written out."""
    found = []
    for nid in sorted(g.ancestors([out]) | {out}):
        node = g.node(nid)
        if node.op == "clip":
            lo, hi = (g.node(a) for a in node.args[1:])
            bounds = (lo.value, hi.value) if lo.op == hi.op == "const" else None
        else:
            bounds = _nested_bounds(g, node)
        if bounds is not None and bounds[0] < bounds[1]:
            found.append((float(bounds[0]), float(bounds[1])))
    return found


def _nested_bounds(g: Graph, node) -> tuple[float, float] | None:
    """(lo, hi) of ``minimum(maximum(_, lo), hi)`` or ``maximum(minimum(_, hi), lo)``
    with constant bounds, in either operand order."""
    inner_op = {"minimum": "maximum", "maximum": "minimum"}.get(node.op)
    if inner_op is None:
        return None
    args = [g.node(a) for a in node.args]
    outer = next((a.value for a in args if a.op == "const"), None)
    inner = next((a for a in args if a.op == inner_op), None)
    if outer is None or inner is None:
        return None
    bound = next((g.node(a).value for a in inner.args if g.node(a).op == "const"), None)
    if bound is None:
        return None
    return (bound, outer) if node.op == "minimum" else (outer, bound)
