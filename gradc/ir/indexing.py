"""Lowering NumPy's indexing and the builtins whose arguments vary in number.

``x[...]`` (docs/language.md, *Indexing*) becomes the registry's primitives:

* basic indexing (integers, slices ``a:b:s``, ``...``; bounds that are constants or
  dims of the signature) is one ``slice`` node, a view whose VJP writes the cotangent
  into zeros (``slice_transpose``);
* integer-array (advanced) indexing follows NumPy's rules: the index arrays broadcast
  together; adjacent ones put their broadcast dims in place, else first (the indexed
  axes are moved to the front, ``permute_dims``).  Each index is checked and wrapped
  (``wrap_index``: an IndexError before any read), several become one flat index into
  their axes merged (``merge_axes``), and the read is ``take``, whose VJP is the
  scatter-add (duplicates accumulate).  An integer beside an index array is an index
  array too (NumPy's rule); a bool mask is an error (its shape depends on the data).

``arange``, ``eye``, ``concat`` (alias ``concatenate``) and ``stack`` take a number of
arguments no fixed operand list says: ``arange`` is the registry's ``arange`` (int64;
float arguments: ``start + step * arange(n)``), ``eye`` a comparison of two of them,
``concat`` a chain of the binary ``concat``, ``stack`` a concat of ``expand_dims``.
"""
from __future__ import annotations

import math
from gradc.errors import TypeError_
from gradc.frontend import ast
from gradc.frontend.to_ast import leftmost_span, operands_span
from gradc.ir.graph import FLOAT
from gradc.ir.primitives import COMPARE_OPS
from gradc.ir.shapes import BroadcastError, DimExpr, DimRef, broadcast

# ``lw`` below is the gradc.ir.expr.ExprLowerer lowering the expression (which imports
# this module), ``scope`` its names: node ids, or a rule's attributes (expr.Attr).

FULL = (None, None, None)           # ':' in a slice's key
SPECIAL_CALLS = ("arange", "eye", "concat", "concatenate", "stack")
_COMPARISONS = frozenset(COMPARE_OPS.values())


def _error(message: str, span, notes=()) -> TypeError_:
    return TypeError_(message, span, "E309", notes)


def static_value(lw, e: ast.Expr, scope: dict, floats: bool = False):
    """``e``'s value where it is a constant expression of numbers, consts and dims of
    the signature (an int, or a DimRef or DimExpr known at call time; a float when
    ``floats``), else None (an array: an index array)."""
    match e:
        case ast.Num():
            if not e.is_int and not floats:
                raise _error(f"an index must be an integer, got {e.text}", e.span)
            return int(e.value) if e.is_int and math.isfinite(e.value) else e.value
        case ast.Neg():
            v = static_value(lw, e.operand, scope, floats)
            return None if v is None else -v
        case ast.Name(id=name):
            v = scope.get(name)
            if v is not None and not isinstance(v, int):     # a rule's attribute (Attr)
                return v.value
            if v is not None:
                return lw._dim_attr(v, e) if lw.graph.node(v).op == "dim_size" else None
            if name in lw.consts:
                c = lw.consts[name]
                if float(c).is_integer():
                    return int(c)
                if not floats:
                    raise _error(f"an index must be an integer: '{name}' is {c}", e.span)
                return c
            return None
        case ast.BinOp(op=op) if op in "+-*/":
            a = static_value(lw, e.lhs, scope, floats)
            b = static_value(lw, e.rhs, scope, floats)
            if a is None or b is None:
                return None
            if op == "/":
                if floats and isinstance(a, (int, float)) and isinstance(b, (int, float)):
                    return a / b
                raise _error("an index must be an integer: '/' divides into a float "
                             "(write the bound as a product or a sum of dims)", e.span)
            return {"+": a + b, "-": a - b, "*": a * b}[op]
    return None


def lower_index(lw, e: ast.Index, scope: dict) -> int:
    """The node of ``e.value[e.items]``."""
    b, graph = lw.b, lw.graph
    x = lw.expr(e.value, scope)
    ellipses = [i for i in e.items if isinstance(i, ast.EllipsisIndex)]
    if len(ellipses) > 1:
        raise _error("an index can only have a single ellipsis ('...')", ellipses[1].span)
    items = []                        # (kind, value, the item): kind int, slice, array, ...
    for item in e.items:
        if isinstance(item, ast.EllipsisIndex):
            items.append(("...", Ellipsis, item))
        elif isinstance(item, ast.Slice):
            items.append(("slice", _slice_bounds(lw, item, scope), item))
        else:
            v = static_value(lw, item, scope)
            items.append(("int", v, item) if v is not None else
                         ("array", _index_array(lw, item, scope), item))
    rank = graph.node(x).shape.rank
    used = sum(kind != "..." for kind, _, _ in items)
    if rank is not None and used > rank:
        raise _error(f"too many indices for array: array is {rank}-dimensional, but {used} "
                     "were indexed", e.span)
    axes = _axes(items, rank)
    dims = graph.node(x).shape.static if rank is not None else ()
    for (kind, v, item), ax in zip(items, axes):
        if kind == "int" and isinstance(v, int) and dims and isinstance(dims[ax], int) and \
                not -dims[ax] <= v < dims[ax]:
            raise _error(f"index {v} is out of bounds for axis {ax} with size {dims[ax]}",
                         item.span if hasattr(item, "span") else e.span)
    if not any(kind == "array" for kind, _, _ in items):
        key = tuple(v for _, v, _ in items)
        if all(v in (FULL, Ellipsis) for v in key):
            return x                                   # x[:], x[...]: x itself
        return b.apply("slice", (x,), {"key": key}, span=e.span)
    # Advanced: slice first (keeping every axis), then gather the indexed axes.
    key = tuple(v if kind in ("slice", "...") else FULL for kind, v, _ in items)
    if any(v not in (FULL, Ellipsis) for v in key):
        x = b.apply("slice", (x,), {"key": key}, span=e.span)
    adv = [(ax, _as_index(lw, kind, v, item, scope)) for (kind, v, item), ax in
           zip(items, axes) if kind in ("int", "array")]
    where = [ax for ax, _ in adv]
    if not _adjacent(where, rank):
        if rank is None:
            raise _error("integer-array indices with a slice or '...' between them put their "
                         "dims first (NumPy's rule), which needs the array's rank: annotate "
                         "its dims", e.span)
        perm = where + [a for a in range(rank) if a not in where]
        x = b.apply("permute_dims", (x,), {"axes": tuple(perm)}, span=e.span)
        where = list(range(len(where)))
    shapes = [b.graph.node(idx).shape for _, idx in adv]
    try:
        broadcast(shapes)
    except BroadcastError:
        raise _error("shape mismatch: indexing arrays could not be broadcast together with "
                     f"shapes {' '.join(map(str, shapes))}", e.span) from None
    flat = None
    for ax, (shown, idx) in zip(where, adv):
        attrs = {"axis": (ax,), "shown": None if shown == ax else shown}
        w = b.apply("wrap_index", (idx, x), attrs, span=e.span)
        if flat is None:
            flat = w
        else:
            n = b.apply("dim_size", (x,), {"index": ax}, span=e.span)
            flat = b.apply("add", (b.apply("mul", (flat, n), span=e.span), w), span=e.span)
    if len(where) > 1:
        x = b.apply("merge_axes", (x,), {"axis": (where[0],), "count": len(where)},
                    span=e.span)
    return b.apply("take", (x, flat), {"axis": (where[0],)}, span=e.span)


def key_text(key: tuple) -> str:
    """A slice's key as it is written: ``..., 1:h:2, 0``."""
    def bound(v) -> str:
        if v is None:
            return ""
        if isinstance(v, DimRef):
            return v.name
        if isinstance(v, DimExpr):
            return f"({bound(v.lhs)} {v.op} {bound(v.rhs)})"
        return str(v)

    def item(k) -> str:
        if k is Ellipsis:
            return "..."
        if not isinstance(k, tuple):
            return bound(k)
        start, stop, step = map(bound, k)
        return f"{start}:{stop}" + (f":{step}" if step else "")
    return ", ".join(item(k) for k in key)


def _slice_bounds(lw, s: ast.Slice, scope: dict) -> tuple:
    out = []
    for bound in (s.start, s.stop, s.step):
        if bound is None:
            out.append(None)
            continue
        v = static_value(lw, bound, scope)
        if v is None:
            raise _error("a slice bound must be an integer constant or a dim of the "
                         "signature (known when the op is called)", leftmost_span(bound),
                         ["to select by values computed in the op, index by an integer "
                          "array: x[arange(n), idx]"])
        out.append(v)
    if out[2] == 0:
        raise _error("slice step cannot be zero", getattr(s.step, "span", s.span))
    return tuple(out)


def _index_array(lw, item: ast.Expr, scope: dict) -> int:
    nid = lw.expr(item, scope)
    node = lw.graph.node(nid)
    # a comparison is 0 and 1 in its operands' dtype, integers for integer operands:
    # x[labels != 0] is a mask to a NumPy reader, never rows 0 and 1
    compared = isinstance(item, ast.Compare) or node.op in _COMPARISONS
    if node.dtype in ("i32", "i64") and not compared:
        return nid
    what = ("a bool array" if node.dtype == "bool" else
            "the 0 and 1 of a comparison" if compared else "a float value")
    mask = node.dtype == "bool" or compared                     # x[x > 0]: floats 0, 1
    raise _error(f"an index array must be an integer array (i32 or i64), got {what}",
                 operands_span(item),
                 ["a mask (x[x > 0]) is not supported: its size depends on the data; "
                  "write where(mask, x, 0)"] if mask else
                 ["declare the indices' parameter i32 or i64 (labels: i64[n]); a float "
                  "array of whole numbers is still floats to the compiler"])


def _as_index(lw, kind: str, v, item, scope: dict) -> int:
    """An advanced index as a node: an index array, or an integer as a 0-d int64."""
    if kind == "array":
        return v
    if isinstance(v, int):
        return lw.b.const(v, "i64", item.span)
    return lw.expr(item, scope)                     # a dim or a sum of dims: int64


def _axes(items, rank: int | None) -> list:
    """The axis each item indexes: from the front before '...', from the end after it
    (non-negative where the rank is known)."""
    split = next((i for i, (k, _, _) in enumerate(items) if k == "..."), len(items))
    after = len(items) - split - 1
    out = []
    for i in range(len(items)):
        ax = i if i <= split else i - split - 1 - after
        out.append(ax % rank if rank is not None and ax < 0 else ax)
    return out


def _adjacent(axes: list, rank: int | None) -> bool:
    """Whether advanced indices at ``axes`` are next to each other (NumPy keeps their
    dims in place then)."""
    if rank is None and len({a < 0 for a in axes}) > 1:
        return False
    return axes == list(range(axes[0], axes[0] + len(axes)))


# ---- arange, eye, concat, stack ---------------------------------------------------

def lower_special(lw, e: ast.Call, scope: dict) -> int:
    """The node of a call of arange, eye, concat (concatenate) or stack."""
    if e.func == "arange":
        return _arange(lw, e, scope)
    if e.func == "eye":
        return _eye(lw, e, scope)
    axis = dict(e.kwargs).get("axis")
    axis = (0,) if axis is None else lw._attr("axis", axis, scope)
    if len(axis) != 1:
        raise _error(f"'{e.func}' takes one axis, got {axis}", e.span)
    xs = [lw.expr(a, scope) for a in e.args]
    if e.func == "stack":
        xs = [lw.b.apply("expand_dims", (x,), {"axis": axis}, span=e.span) for x in xs]
    out = xs[0]
    for y in xs[1:]:
        out = lw.b.apply("concat", (out, y), {"axis": axis}, span=e.span)
    if len(xs) == 1 and lw.graph.node(out).shape.rank == 0:
        raise _error("zero-dimensional arrays cannot be concatenated", e.span)
    return out


def _constants(lw, e: ast.Call, scope, names, floats=True) -> dict:
    given = dict(zip(names, e.args))
    given.update(e.kwargs)
    out = {}
    for name, arg in given.items():
        v = static_value(lw, arg, scope, floats)
        if v is None:
            raise TypeError_(f"'{e.func}' takes numbers, consts and dims of the signature "
                             f"(known when the op is called); its {name} is an array",
                             getattr(arg, "span", e.span), "E304")
        out[name] = v
    return out


def _arange(lw, e: ast.Call, scope: dict) -> int:
    v = _constants(lw, e, scope, ("start", "stop", "step"))
    start, stop, step = v.get("start"), v.get("stop"), v.get("step", 1)
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise TypeError_("arange: the step must not be zero", e.span, "E304")
    if not any(isinstance(a, float) for a in (start, stop, step)):
        return lw.b.apply("arange", (), {"start": start, "stop": stop, "step": step},
                          span=e.span)
    if not all(isinstance(a, (int, float)) for a in (start, stop, step)):
        raise TypeError_("arange with float arguments takes numbers only (not dims)",
                         e.span, "E304")
    n = max(0, math.ceil((stop - start) / step))      # np.arange's length
    count = lw.b.apply("cast", (lw.b.apply("arange", (), {"start": 0, "stop": n, "step": 1},
                                           span=e.span),), span=e.span)
    scaled = lw.b.apply("mul", (count, lw.b.const(step, FLOAT, e.span)), span=e.span)
    return lw.b.apply("add", (scaled, lw.b.const(start, FLOAT, e.span)), span=e.span)


def _eye(lw, e: ast.Call, scope: dict) -> int:
    """eye(n, m, k)[i, j] = (j - i == k): arange(n)[:, None] + k == arange(m)[None, :]."""
    v = _constants(lw, e, scope, ("n", "m", "k"), floats=False)
    n, m, k = v["n"], v.get("m", v["n"]), v.get("k", 0)
    b = lw.b
    rows = b.apply("expand_dims", (b.apply("arange", (), {"start": 0, "stop": n, "step": 1},
                                           span=e.span),), {"axis": (-1,)}, span=e.span)
    cols = b.apply("expand_dims", (b.apply("arange", (), {"start": 0, "stop": m, "step": 1},
                                           span=e.span),), {"axis": (0,)}, span=e.span)
    if k != 0:
        k_arg = dict(zip(("n", "m", "k"), e.args)) | dict(e.kwargs)
        shift = (b.const(k, "i64", e.span) if isinstance(k, int) else
                 lw.expr(k_arg["k"], scope))
        rows = b.apply("add", (rows, shift), span=e.span)
    return b.apply("cast", (b.apply("eq", (rows, cols), span=e.span),), span=e.span)
