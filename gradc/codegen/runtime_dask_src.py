"""The Dask path of generated wrappers: their ``NAME.dask`` methods.

Copied verbatim into generated modules (``inspect.getsource``), like
:mod:`gradc.codegen.runtime_src`; uses only ``np`` at import time and imports
``dask.array`` inside the helpers, so a module runs where Dask is not installed
until a Dask array is passed.  :mod:`gradc.codegen.dask_module` prints the
wrappers that call these helpers; docs/dask.md describes the path.

A wrapper builds a Dask graph and computes nothing: each kernel step of the
op's fused plan becomes one ``blockwise`` task per chunk that runs the fused
kernel (its serial loop: Dask's workers are the threads) on that chunk, and
each library step (reductions, ``@``, transposes, un-broadcasting) the Dask
function doing the same (tree reductions, blocked matmul).  Tasks name their
kernel by string and look it up in this module, so they pickle by reference
to the module (which Dask's workers must be able to import; docs/dask.md).
"""
from __future__ import annotations

import numpy as np

from gradc.codegen.runtime_src import (_G_NO_OFFSET, _G_WITNESS, _g_flat, _g_float_input, _g_int_input,
                                       _g_resolve, _g_tangent,
                                       _g_tangent_broadcast,
                                       _g_upstream,
                                       _G_INTS, _G_FLOATS)


def _gd_is_dask(v):
    """Whether ``v`` is a Dask collection (duck typing: no import of dask)."""
    return hasattr(v, "__dask_graph__")


def _gd_probe(op, v):
    """A 0-d NumPy stand-in of Dask array ``v``'s dtype and its shape, checked known;
    TypeError for another object with a ``__dask_graph__`` (a Dask bag or dataframe)."""
    import dask.array as da
    if not isinstance(v, da.Array):
        raise TypeError(f"{op}: an argument of type {type(v).__name__} has __dask_graph__ "
                        "but is not a Dask array (dask.array.Array); pass a Dask or NumPy "
                        "array")
    shape = tuple(v.shape)
    if any(d != d for d in shape):              # NaN: chunk sizes unknown
        raise ValueError(f"{op}: a Dask argument has unknown chunk sizes (shape {shape}); "
                         "call .compute_chunk_sizes() on it first")
    return np.zeros((), dtype=v.dtype), shape


def _gd_unempty(v):
    """Dask array ``v`` without its empty chunks (a slice's or a concatenation's, of 0
    rows or columns): Dask's own ``max`` and ``min`` fail on one, and so did the
    blocks of rows with a row of weights; an empty array stays as it is."""
    if v.size == 0 or not any(0 in c for c in v.chunks):
        return v
    return v.rechunk(tuple(tuple(n for n in c if n) for c in v.chunks))


def _gd_inputs(op, sig, values):
    """``_g_inputs`` for arguments of which some are Dask arrays: the same checks
    and errors (dtype, shape, named dims) on stand-ins that hold no data, then
    Dask arrays cast lazily to the compute dtype ``T`` (NumPy arrays of any rank
    become one-chunk Dask arrays, 0-d values stay NumPy).  Returns
    ``(arrays, T, RT, dims)``."""
    import dask.array as da

    def read(name, dt, v):
        if not _gd_is_dask(v):
            return (_g_int_input(op, name, v, np.dtype(_G_INTS[dt])) if dt in _G_INTS
                    else _g_float_input(op, "argument", name, v, _G_FLOATS.get(dt)))
        probe, shape = _gd_probe(op, v)
        if dt in _G_INTS:
            _g_int_input(op, name, probe, np.dtype(_G_INTS[dt]))
        else:
            _g_float_input(op, "argument", name, probe, _G_FLOATS.get(dt))
        return np.broadcast_to(probe, shape)    # a view of one zero: shapes bound on it

    checked, rt, dims = _g_resolve(op, sig, values, read)
    t = np.float32 if rt == np.float16 else rt.type
    arrays = []
    for (name, dt, shape), v, a in zip(sig, values, checked):
        want = np.dtype(_G_INTS[dt]) if dt in _G_INTS else np.dtype(t)
        if _gd_is_dask(v):
            arrays.append(_gd_unempty(v.astype(want)))
        else:
            a = np.asarray(a, dtype=want)
            arrays.append(da.from_array(a) if a.ndim else a)
    return arrays, t, rt, dims


def _gd_upstream(op, name, v, shape, t):
    """A cotangent, checked as ``_g_upstream`` does; a Dask array in dtype ``t``
    (or a 0-d NumPy value)."""
    import dask.array as da
    if not _gd_is_dask(v):
        a = _g_upstream(op, name, v, shape, t)
        return da.from_array(a) if a.ndim else a
    probe, got = _gd_probe(op, v)
    _g_float_input(op, "upstream", name, probe)
    if got != tuple(shape):
        raise ValueError(f"{op}: upstream '{name}' must have the output's shape "
                         f"{tuple(shape)}, got {got}")
    return _gd_unempty(v.astype(t))


def _gd_tangent(op, name, v, shape, t):
    """A tangent of ``jvp``, checked as ``_g_tangent`` does and broadcast to its
    parameter's shape (lazily)."""
    import dask.array as da
    if not _gd_is_dask(v):
        a = _g_tangent(op, name, v, shape, t)
        return da.from_array(a) if a.ndim else a
    probe, got = _gd_probe(op, v)
    _g_float_input(op, "tangent", name, probe)
    shape = tuple(shape)
    v = _gd_unempty(v.astype(t))
    return da.broadcast_to(v, shape) if _g_tangent_broadcast(op, name, got, shape) else v


def _gd_out_tuple(op, out, shapes, kinds, inputs, names, inplace=()):
    """``out=`` has no meaning for lazy results: a TypeError unless None."""
    if out is not None:
        raise TypeError(f"{op}: out= is not supported with Dask arrays (the results are "
                        "lazy); write them with dask.array.store(results, targets)")
    return None


def _gd_index(s, v):
    """Blockwise indices of ``v`` in a loop over ``s`` (NumPy's trailing alignment);
    None for a value passed whole to every task (a 0-d NumPy value)."""
    if not _gd_is_dask(v):
        return None
    return tuple(range(len(s)))[len(s) - v.ndim:]


def _gd_template(s, values, likes):
    """A Dask array of zeros (a view of one) over ``s`` when no value spans some
    axis of the loop (a loop that reads only a shape, as ``ones_like(dy)``), so
    that the loop's chunks exist; its chunks are those of a ``likes`` array of
    shape ``s``.  None when the values span every axis."""
    import dask.array as da
    spanned = set()
    for v in values:
        if _gd_is_dask(v):
            lead = len(s) - v.ndim
            spanned.update(lead + i for i, d in enumerate(v.shape) if d == s[lead + i])
    if len(spanned) == len(s):
        return None
    chunks = next((l.chunks for l in likes if _gd_is_dask(l) and tuple(l.shape) == tuple(s)),
                  "auto")
    return da.broadcast_to(np.zeros((), np.bool_), tuple(s), chunks=chunks)


def _gd_kernel(op, name, s, values, rows, scalars, dtypes, t, likes=()):
    """One ``blockwise`` task per chunk of the loop over ``s`` running kernel
    ``name`` (its serial loop) on that chunk of ``values``: its results, one Dask
    array per dtype in ``dtypes``.  ``rows[k]`` is the number of trailing dims of
    a value the kernel reads once per row (0: elementwise), ``scalars[k]`` marks
    one-element values."""
    import operator
    import dask.array as da
    s = tuple(s)
    values = list(values)
    template = _gd_template(s, [v for v in values if v is not _G_NO_OFFSET], likes)
    flags = list(zip(rows, scalars))
    if template is not None:
        values.append(template)
        flags.append((-1, False))                   # read for its chunk's shape only
    if s and any(v is _G_NO_OFFSET for v in values):
        values = _gd_draw_values(s, values)
    args = []
    for v in values:
        args += [v, _gd_index(s, v)]
    multi = len(dtypes) > 1
    meta = np.empty((0,) * len(s), dtype=dtypes[0])
    res = da.blockwise(_gd_block, tuple(range(len(s))), *args, dtype=dtypes[0], meta=meta,
                       token=f"gradc-{op.replace('.', '-')}", kname=name, flags=tuple(flags),
                       dtypes=tuple(dtypes), t=t, multi=multi)
    if not multi:
        return (res,)
    return tuple(res.map_blocks(operator.getitem, k, dtype=dt, meta=np.empty((0,) * len(s), dt))
                 for k, dt in enumerate(dtypes))


def _gd_draw_values(s, values):
    """The values of a loop over ``s`` that draws random numbers, whose counters are
    flat indices of the whole array: its chunks made runs of whole rows (the Dask values
    rechunked whole along every axis but the first), so that a chunk's elements are a
    range of flat indices, and the draw offset ``_G_NO_OFFSET`` replaced by the flat
    index of each row (an array of shape ``(s[0], 1, ...)``), whose block's first
    element is its chunk's offset (``_gd_block``)."""
    import dask.array as da
    rows = next((v.chunks[0] for v in values if _gd_is_dask(v) and v.ndim == len(s)
                 and v.shape[0] == s[0]), (s[0],))
    size = 1
    for n in s[1:]:
        size *= n
    out = []
    for v in values:
        if v is _G_NO_OFFSET:
            v = (da.arange(s[0], chunks=(rows,), dtype=np.int64) * size).reshape(
                (s[0],) + (1,) * (len(s) - 1))
        elif _gd_is_dask(v) and v.ndim:
            lead = len(s) - v.ndim
            v = v.rechunk({a: -1 for a in range(v.ndim) if lead + a > 0})
        out.append(v)
    return out


def _gd_block(*blocks, kname, flags, dtypes, t, multi):
    """The task of one chunk: kernel ``kname`` over the chunk's loop shape (the
    broadcast of the blocks' shapes), results in new arrays (a tuple if ``multi``)."""
    s = np.broadcast_shapes(*(np.shape(b) for b, (r, sc) in zip(blocks, flags) if not sc))
    outs = [np.empty(s, dtype=dt) for dt in dtypes]
    if 0 in s:              # a chunk of no rows (or none along a dim): nothing to run
        return tuple(outs) if multi else outs[0]
    ins = []
    for b, (r, sc) in zip(blocks, flags):
        if r < 0:
            continue
        if sc:              # (a draw's offset: the first of its chunk's row offsets)
            ins.append(_g_flat(b.reshape(-1)[:1] if np.size(b) > 1 else b, ()))
        elif r:             # read once per row: the row, from the first of its copies
            lead = len(s) - r
            ins.append(_g_flat(np.broadcast_to(b, s)[(0,) * lead], s[lead:]))
        else:
            ins.append(_g_flat(b, s))
    kernel = globals().get(kname + "_serial")
    if kernel is None:          # this function was pickled by value, without its module
        raise RuntimeError(f"gradc: kernel {kname} not found: the worker could not import the "
                           "generated module; ship it to the workers (docs/dask.md)")
    kernel(*(o.reshape(-1) for o in outs), *ins, _G_WITNESS[t])
    return tuple(outs) if multi else outs[0]


def _gd_finish(op, outs, results, shapes, rt, inputs):
    """The results as Dask arrays of their output's shape in the result dtype ``rt``
    (floats; others keep theirs), nothing computed."""
    import dask.array as da
    final = []
    for r, shape in zip(results, shapes):
        r = r if _gd_is_dask(r) else da.from_array(np.asarray(r))
        if tuple(r.shape) != tuple(shape):
            r = da.broadcast_to(r, tuple(shape))
        final.append(r.astype(rt) if r.dtype.kind == "f" else r)
    return tuple(final)


