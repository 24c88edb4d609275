"""Argument checking and buffer handling for generated wrappers.

Copied verbatim into generated modules (``inspect.getsource``), like
:mod:`gradc.codegen.prelude`; uses only ``np``, ``numba`` and the standard library.
Numba kernels do not check bounds, so these checks are what stands between a bad
argument and a write out of bounds: every array a kernel touches passes through them.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import os
import site
import sys

import numba
import numba.extending
import numpy as np

_G_FLOATS = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
_G_INTS = {"i32": np.int32, "i64": np.int64, "bool": np.bool_}
_G_PARALLEL_MIN = 1 << 17      # _g_env_count('GRADC_PARALLEL_MIN', ...) in modules
_G_ROWS_MIN = 1 << 12          # _g_env_count('GRADC_ROWS_MIN', ...) in modules
_G_BROADCAST_ROW = 64          # rows of fewer elements: the broadcast inputs copied
_G_WITNESS = {t: np.empty(0, t) for t in (np.float32, np.float64)}
_G_F32, _G_F64 = np.dtype(np.float32), np.dtype(np.float64)
_G_NO_OFFSET = np.zeros((), np.int64)


def _g_env_count(name, text, default):
    """The non-negative integer an environment variable ``name`` holds (``text``, None
    when unset: ``default``); ``"1e5"`` is read as 100000.  Anything else is a
    ValueError naming the variable, not a traceback from ``int()``."""
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value.is_integer()):
        raise ValueError(f"environment variable {name}={text!r}: expected a non-negative "
                         f"whole number of elements (such as 131072 or 1e5); unset it for "
                         f"the default {default}")
    return int(value)


def parallel_min() -> int:
    """The loop size from which a generated module runs a kernel on all its threads:
    ``_G_PARALLEL_MIN`` there (GRADC_PARALLEL_MIN, else ``1 << 17``).  For gradc's own
    code (gradc bench's copy kernel follows it); the ``_g_`` names are the module's."""
    return _g_env_count("GRADC_PARALLEL_MIN", os.environ.get("GRADC_PARALLEL_MIN"),
                        _G_PARALLEL_MIN)


def _g_numba_threads(environ, config):
    """Where nobody chose how Numba runs its threads, make its TBB threading layer
    loadable; returns what decided the layer, for ``_G_THREADING``.

    Numba's default order is TBB, then OpenMP, then workqueue, but pip puts the ``tbb``
    package's ``libtbb.so.12`` in ``<prefix>/lib``, where Numba does not look, so it
    falls back to OpenMP, whose workers spin for milliseconds after each parallel loop
    and take the cores from PyTorch's, JAX's and BLAS's threads.  TBB's workers yield
    and sleep, and TBB is safe for launches from several threads at once (Dask's
    threaded scheduler; the workqueue layer aborts the process there).  Loading the
    library is all this does: no variable or setting changes, and nothing happens when
    the user chose (``NUMBA_THREADING_LAYER``, ``NUMBA_THREADING_LAYER_PRIORITY``,
    ``numba.config``), when Numba's threads already run (the layer is chosen once per
    process) or where no ``libtbb.so.12`` is installed (Numba's own choice stands)."""
    for name in ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY"):
        if environ.get(name):
            return f"{name}={environ[name]}"
    if config.THREADING_LAYER != "default":
        return f"numba.config.THREADING_LAYER={config.THREADING_LAYER!r}"
    try:
        return f"chosen before this module: {numba.threading_layer()}"
    except ValueError:                  # no parallel loop has run yet
        pass
    # this environment's, the user site's, and the base's (a venv that sees its packages)
    for root in dict.fromkeys((sys.prefix, site.getuserbase(), sys.base_prefix)):
        path = os.path.join(root, "lib", "libtbb.so.12")
        if sys.platform.startswith("linux") and os.path.exists(path):
            try:
                ctypes.CDLL(path)
            except OSError as exc:
                return f"numba's default ({path} did not load: {exc})"
            return f"tbb ({path})"
    return "numba's default (no tbb package)"


def _g_wide_vectors(config):
    """Whether Numba compiles for a CPU with 512-bit vectors (AVX-512F): the host's
    features, unless ``NUMBA_CPU_FEATURES`` names others or ``NUMBA_CPU_NAME`` another
    CPU (then False: a portable build, ``generic``, has none).  ``config``:
    ``numba.config``.  An exp costs half as much per float there, which decides from
    which rows an online form that computes it again pays (``_G_ONLINE``); and the
    CPUs measured with it (Zen 4, not Zen 3) ran rows of a page faster without the
    next row's prefetch hints (``_G_PREFETCH``)."""
    features = config.CPU_FEATURES
    if features is None:
        if config.CPU_NAME not in (None, "host"):
            return False
        import llvmlite.binding
        features = llvmlite.binding.get_host_cpu_features().flatten()
    return "+avx512f" in features.split(",")


def _g_inputs(op, sig, values):
    """Validate and convert call arguments.

    ``sig`` holds one ``(name, dtype, dims)`` per parameter (dtype None for a
    generic float, dims None for any shape).  Returns ``(arrays, T, RT, dims)``:
    C-contiguous arrays, the float compute dtype ``T`` (float32 for float16
    inputs), the result dtype ``RT`` and the sizes of named dims.  Python
    scalars are weak (they take the arrays' dtype, as in NumPy 2 and JAX), except
    for a parameter annotated with a float dtype, whose dtype they take
    (``x: f32`` given ``0.1`` is float32, as ``np.float32(0.1)`` would be).
    Raises TypeError for a wrong dtype, ValueError for a wrong shape.

    Fast path, for the usual call (a few microseconds matter on small arrays):
    every argument an exact ``np.ndarray``, C-contiguous, of one native float32
    or float64 dtype (the dtype objects compared by identity) that its parameter
    accepts, of a shape that fits, or a Python ``float`` for a parameter without
    a dtype or shape annotation.  The full checks below would take such arguments as they
    are (weak floats converted); anything else goes through them.
    """
    t, weak, dims, where = None, False, {}, {}
    for (name, dt, shape), v in zip(sig, values):
        if type(v) is np.ndarray:
            d = v.dtype
            if d is not t and (t is not None or d is not _G_F32 and d is not _G_F64) \
                    or dt is not None and _G_FLOATS.get(dt) is not d.type \
                    or not v.flags.c_contiguous:
                break
            t = d
            if shape is not None:
                try:
                    _g_bind_dims(op, name, v.shape, shape, dims, where)
                except ValueError:          # raised again below
                    break
        elif type(v) is float and not shape and dt is None:
            weak = True
        else:
            break
    else:
        if t is not None:
            if weak:
                values = [v if type(v) is np.ndarray else np.asarray(v, dtype=t)
                          for v in values]
            return values, t.type, t, dims
    arrays, rt, dims = _g_resolve(op, sig, values, lambda name, dt, v: (
        _g_int_input(op, name, v, np.dtype(_G_INTS[dt])) if dt in _G_INTS
        else _g_float_input(op, "argument", name, v, _G_FLOATS.get(dt))))
    t = np.float32 if rt == np.float16 else rt.type
    for i, ((name, dt, shape), a) in enumerate(zip(sig, arrays)):
        if dt not in _G_INTS:
            arrays[i] = np.asarray(a, dtype=t, order="C")
    return arrays, t, rt, dims


def _g_resolve(op, sig, values, read):
    """Each argument through ``read(name, dtype, value)`` (which checks it and
    returns an array), the sizes of named dims bound and checked across the
    arguments, and the result dtype of the float ones (Python ``int`` and
    ``float`` are weak: they do not take part, except as the declared dtype of
    an annotated parameter).  Returns ``(arrays, RT, dims)``."""
    arrays, floats, dims, where = [], [], {}, {}
    for (name, dt, shape), v in zip(sig, values):
        a = read(name, dt, v)
        if dt in _G_FLOATS:
            floats.append(_G_FLOATS[dt])
        elif dt not in _G_INTS and type(v) is not int and type(v) is not float:
            floats.append(a.dtype.type)
        if shape is not None:
            _g_bind_dims(op, name, a.shape, shape, dims, where)
        arrays.append(a)
    rt = np.result_type(*floats) if floats else np.dtype(np.float64)
    return arrays, rt, dims


def _g_float_input(op, what, name, v, want=None):
    """A float argument as an array (not yet converted to the compute dtype).

    Accepted: Python ``int`` and ``float`` (weak scalars), and arrays or array-likes
    (what ``np.asarray`` reads: sequences, NumPy scalars, ``__array__``,
    ``__array_interface__`` and buffer objects) whose NumPy dtype is float16,
    float32 or float64, in either byte order; ``want`` demands one of them.
    Integer, bool, complex, longdouble, object and string data is a TypeError, and
    so is a masked array (``np.asarray`` would drop its mask, which ufuncs honour).
    """
    if type(v) is float:
        return np.asarray(v)
    if type(v) is int:
        try:
            return np.asarray(float(v))
        except OverflowError:
            raise OverflowError(f"{op}: {what} '{name}' = {v} does not fit a float") from None
    _g_not_masked(op, what, name, v)
    try:
        lazy = hasattr(v, "__dask_graph__")     # not np.asarray: that would compute it
        a = None if lazy else np.asarray(v)
    except Exception as exc:
        raise TypeError(f"{op}: {what} '{name}' is not an array ({exc})") from None
    if lazy:
        raise _GradcDask(op)
    if a.dtype.char not in "efd":
        got = type(v).__name__ if isinstance(v, (bool, complex, str)) or v is None else a.dtype
        raise TypeError(f"{op}: {what} '{name}' must be a floating-point array "
                        f"(float16, float32 or float64), got {got}")
    if want is not None and a.dtype.type is not want:
        raise TypeError(f"{op}: {what} '{name}' must be {np.dtype(want).name}, "
                        f"got {a.dtype} (convert with .astype(np.{np.dtype(want).name}))")
    return a


def _g_not_masked(op, what, name, v):
    """A TypeError for a masked array (``np.asarray`` would drop its mask, which
    NumPy's ufuncs honour)."""
    if isinstance(v, np.ma.MaskedArray):
        raise TypeError(f"{op}: {what} '{name}' is a masked array; the kernels would ignore "
                        "its mask (pass v.filled(fill_value) or v.data)")


def _g_int_input(op, name, v, want):
    """An integer or bool argument: an array of ``want``, or of a narrower integer
    dtype that ``want`` holds exactly (int32 labels for an ``i64`` parameter, as
    NumPy's ``safe`` casting: widened, a copy; never narrowed, never from bool or a
    float); a Python scalar must fit it (no silent wrap-around), and so must each int of
    a list or tuple of Python ints, which is then of ``want`` (``[0, 1]`` for an ``i32``
    parameter, as a Python int is).  A masked array is
    a TypeError, as for float arguments (:func:`_g_float_input`)."""
    if type(v) is (bool if want.kind == "b" else int):
        if want.kind != "b" and not np.iinfo(want).min <= v <= np.iinfo(want).max:
            raise OverflowError(f"{op}: argument '{name}' = {v} does not fit {want.name}")
        return np.asarray(v, dtype=want)
    if type(v) in (list, tuple) and want.kind != "b":     # of Python ints: as an int, each
        items = np.array(v, dtype=object)
        if all(type(i) is int for i in items.flat):
            info = np.iinfo(want)
            for i in items.flat:
                if not info.min <= i <= info.max:
                    raise OverflowError(f"{op}: argument '{name}' holds {i}, which does not "
                                        f"fit {want.name}")
            return np.array(v, dtype=want)
    _g_not_masked(op, "argument", name, v)
    try:
        lazy = hasattr(v, "__dask_graph__")
        a = None if lazy else np.asarray(v)
    except Exception as exc:
        raise TypeError(f"{op}: argument '{name}' is not an array ({exc})") from None
    if lazy:
        raise _GradcDask(op)
    if a.dtype.type is not want.type and not (
            a.dtype.kind in "iu" and want.kind in "iu" and np.can_cast(a.dtype, want, "safe")):
        if type(v) in (bool, int, float, complex, str) or v is None:   # no .astype
            got, fix = type(v).__name__, "pass True or False" if want.kind == "b" else \
                "pass an int"
        else:
            got, fix = a.dtype, f"convert with .astype(np.{want.name})"
        raise TypeError(f"{op}: argument '{name}' must be {want.name}, got {got} ({fix})")
    return np.asarray(a, dtype=want, order="C")


def _g_seed(op, seed):
    """The seed of a call's random numbers, as a 0-d int64 array: ``seed`` (an int; its
    low 64 bits) or, where it is None, 64 fresh bits of the operating system's entropy
    (NumPy's ``SeedSequence``)."""
    if seed is None:
        seed = np.random.SeedSequence().entropy
    elif isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{op}: seed= must be an int, got {type(seed).__name__}")
    return np.asarray((int(seed) + (1 << 63)) % (1 << 64) - (1 << 63), dtype=np.int64)


def call_seed(op: str, seed) -> int:
    """The seed of one call of a drawing op (its methods' ``seed=``) as an int, as the
    generated module computes it (:func:`_g_seed`): for the framework adapters."""
    return int(_g_seed(op, seed))


def _g_bind_dims(op, name, actual, dims_spec, dims, where):
    if len(dims_spec) == 0 and len(actual) != 0:
        raise ValueError(f"{op}: argument '{name}' must be a scalar (a parameter with a "
                         f"default and no shape annotation), got shape {actual}")
    if len(actual) != len(dims_spec):
        raise ValueError(f"{op}: argument '{name}' must have {len(dims_spec)} "
                         f"dim{'s' if len(dims_spec) != 1 else ''} {list(dims_spec)}, "
                         f"got shape {actual}")
    for axis, (d, n) in enumerate(zip(dims_spec, actual)):
        if isinstance(d, int):
            if d != n:
                raise ValueError(f"{op}: argument '{name}' must have size {d} on axis "
                                 f"{axis}, got shape {actual}")
        elif dims.setdefault(d, n) != n:
            raise ValueError(f"{op}: dim '{d}' is {dims[d]} in argument '{where[d]}' "
                             f"but {n} in argument '{name}' (shape {actual})")
        else:
            where.setdefault(d, name)


def _g_bshape(op, names, *shapes):
    """NumPy broadcasting of run-time shapes, with the op and the arguments
    (``names``, one per shape) named in the error."""
    for s in shapes:                        # fast path: all the same
        if s != shapes[0]:
            break
    else:
        if shapes:
            return tuple(shapes[0])
    try:
        out = _g_broadcast_of(shapes)       # the same shapes every call of a loop
    except TypeError:                       # a shape given as a list
        out = _g_broadcast_of(tuple(map(tuple, shapes)))
    if out is None:
        raise ValueError(f"{op}: shapes do not broadcast together: " + ", ".join(
            f"{n} {tuple(s)}" for n, s in zip(names, shapes)))
    return out


@functools.lru_cache(maxsize=1024)
def _g_broadcast_of(shapes):
    """The broadcast shape of ``shapes`` (tuples), None where they do not broadcast
    (np.broadcast_shapes takes 3x as long)."""
    out = [1] * max((len(s) for s in shapes), default=0)
    for s in shapes:
        lead = len(out) - len(s)
        for i, d in enumerate(s):
            if d != out[lead + i]:
                if out[lead + i] != 1 and d != 1:
                    return None
                if d != 1:
                    out[lead + i] = int(d)
    return tuple(out)


def _g_upstream(op, name, v, shape, t):
    """A cotangent argument: float (cast to the compute dtype ``t``), exactly the
    shape of its output (a scalar for 0-d)."""
    if type(v) is np.ndarray and v.dtype is _G_WITNESS[t].dtype and v.shape == shape \
            and v.flags.c_contiguous:       # fast path: what the checks below accept as is
        return v
    a = _g_float_input(op, "upstream", name, v)
    if a.shape != tuple(shape):
        raise ValueError(f"{op}: upstream '{name}' must have the output's shape "
                         f"{tuple(shape)}, got {a.shape}")
    return np.asarray(a, dtype=t, order="C")


def _g_unused_upstream(op, name, v, shape):
    """The cotangent of an integer output (an index, a count), which no gradient reads:
    None, or anything of the output's shape (JAX's ``float0``, PyTorch's zeros of the
    index dtype, a float array); 0.0 stands for it."""
    if v is not None and tuple(np.shape(v)) != tuple(shape):
        raise ValueError(f"{op}: upstream '{name}' must have the output's shape "
                         f"{tuple(shape)} (or be None: its output is an integer, which "
                         f"takes no gradient), got {tuple(np.shape(v))}")
    return 0.0


def _g_tangent(op, name, v, shape, t):
    """A tangent argument of ``jvp``: float (cast to the compute dtype ``t``), of
    its parameter's shape or of one that broadcasts to it (a scalar, say), which
    is broadcast (a read-only view, not a copy)."""
    if type(v) is np.ndarray and v.dtype is _G_WITNESS[t].dtype and v.shape == shape \
            and v.flags.c_contiguous:       # fast path: what the checks below accept as is
        return v
    a = _g_float_input(op, "tangent", name, v)
    shape = tuple(shape)
    if _g_tangent_broadcast(op, name, a.shape, shape):
        return np.broadcast_to(np.asarray(a, dtype=t), shape)
    return np.asarray(a, dtype=t, order="C")


def _g_tangent_broadcast(op, name, got, shape):
    """Whether a tangent of shape ``got`` must be broadcast to its parameter's
    ``shape``; a ValueError when it does not broadcast to it."""
    if got == shape:
        return False
    try:
        fits = np.broadcast_shapes(got, shape) == shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{op}: tangent '{name}' must have its parameter's shape "
                         f"{shape} (or one that broadcasts to it), got {got}")
    return True


def _g_out_tuple(op, out, shapes, kinds, inputs, names, inplace=()):
    """Check the ``out=`` argument before any work: None, an array (one result) or a
    tuple of ``len(shapes)`` arrays, each C-contiguous, writeable, of its result's
    shape and of a dtype for its kind (``kinds[k]``: :func:`_g_out_dtype`), and
    overlapping neither another out nor an input.  A subclass of ``np.ndarray``
    (``np.matrix``, whose reshape stays 2-d; ``np.memmap``) is written through a plain
    view of its memory, which is returned; a masked array is a TypeError (its mask
    would not be honoured).

    ``inputs`` are the arguments (``names`` theirs); ``inplace`` lists the
    ``(k, j)`` pairs for which out[k] may be the very array of input j: the
    compiler found every read of input j done before out[k] is written, or done
    by the loop that writes it, element by element at the same index.
    """
    if out is None:
        return None
    if type(out) is _GradcChecked:
        return out
    n = len(shapes)
    outs = (out,) if isinstance(out, np.ndarray) else out
    if not isinstance(outs, (tuple, list)) or len(outs) != n:
        got = ("one array" if isinstance(out, np.ndarray) else
               f"a {type(outs).__name__} of {len(outs)}" if isinstance(outs, (tuple, list))
               else type(out).__name__)
        raise TypeError(f"{op}: out= must be {'an array or ' if n == 1 else ''}"
                        f"a tuple of {n} array{'s' if n != 1 else ''}, got {got}")
    outs = list(outs)
    for k, o in enumerate(outs):
        if not isinstance(o, np.ndarray):
            raise TypeError(f"{op}: out[{k}] must be a numpy.ndarray, got {type(o).__name__}")
        if isinstance(o, np.ma.MaskedArray):
            raise TypeError(f"{op}: out[{k}] is a masked array; the kernels would write "
                            "through its mask (pass its .data)")
        if type(o) is not np.ndarray:       # np.matrix reshapes to 2-d: a plain view
            outs[k] = o = o.view(np.ndarray)
        if o.shape != shapes[k]:
            raise ValueError(f"{op}: out[{k}] must have shape {shapes[k]}, got {o.shape}")
        _g_out_dtype(op, k, kinds[k], o.dtype)
        if not o.flags.c_contiguous or not o.flags.writeable:
            raise ValueError(f"{op}: out[{k}] must be a writeable C-contiguous array")
        for j, a in enumerate(inputs):
            if type(a) is float or type(a) is int or not _g_may_overlap(o, a):
                continue
            if (k, j) in inplace and _g_same_array(o, a):
                continue
            raise ValueError(
                f"{op}: out[{k}] overlaps input '{names[j]}'" + (
                    "" if not _g_same_array(o, a) else
                    f" (in place: this method reads '{names[j]}' after writing out[{k}]; "
                    "pass another array)"))
        for j in range(k):
            if _g_may_overlap(o, outs[j]):
                raise ValueError(f"{op}: out[{k}] overlaps out[{j}]")
    return tuple(outs)


def _g_out_dtype(op, k, kind, dtype, floats=None, what="a floating-point array"):
    """A TypeError unless out[k]'s ``dtype`` fits its result's ``kind``: ``"f"``, a
    float result, any float dtype (of ``floats`` where given), written with a cast; else
    the result's own dtype (``"i64"``, ``"i32"`` or ``"bool"``: an index, a count; NumPy
    2 casts an index into a narrower ``out=``, which could wrap)."""
    if kind == "f":
        if dtype.kind != "f" if floats is None else dtype.char not in floats:
            raise TypeError(f"{op}: out[{k}] must be {what}, got {dtype}")
    elif dtype.type is not _G_INTS[kind]:
        raise TypeError(f"{op}: out[{k}] must be of the result's dtype, "
                        f"{np.dtype(_G_INTS[kind]).name}, got {dtype}")


def _g_may_overlap(o, a):
    """``np.may_share_memory(o, a)``, at once False for two arrays that each own
    their memory (the usual case: a tenth of the time)."""
    if isinstance(a, np.ndarray) and o is not a and o.flags.owndata and a.flags.owndata:
        return False
    return np.may_share_memory(o, a)


def _g_same_array(o, a):
    """Whether ``a`` is ``o``'s memory with ``o``'s shape, dtype and (C) layout (the
    cheap tests first: the addresses cost microseconds)."""
    return (isinstance(a, np.ndarray) and _g_may_overlap(o, a) and a.shape == o.shape
            and a.dtype == o.dtype and a.flags.c_contiguous
            and a.__array_interface__["data"][0] == o.__array_interface__["data"][0])


class _GradcChecked(tuple):
    """``out=`` buffers that a wrapper has checked (:func:`_g_out_tuple`,
    ``_gc_out_tuple``), reshaped for the row plan's wrapper it calls: that wrapper's
    check returns them as they are (an out[k] that is an argument's memory is one the
    row plan allows there, or the argument was copied: :func:`_g_rows_own`)."""


def _g_buffer(op, outs, k, shape, t, rt):
    """Where result ``k`` is computed (in the compute dtype ``t``): the caller's out[k]
    when it fits and the result dtype ``rt`` is ``t`` (float16 results are rounded
    from the float32 values first, by :func:`_g_finish`), else new."""
    if outs is None:
        return np.empty(shape, dtype=t)
    shape = tuple(shape)
    o = outs[k]
    if o.shape != shape:
        raise ValueError(f"{op}: out[{k}] must have shape {shape}, got {o.shape}")
    if o.dtype.kind != "f":
        raise TypeError(f"{op}: out[{k}] must be a floating-point array, got {o.dtype}")
    if o.dtype == t and rt.type is t:
        return o
    return np.empty(shape, dtype=t)


def _g_flat(a, shape):
    """``a`` as a flat contiguous array over the loop of ``shape`` (broadcast)."""
    if type(a) is np.ndarray and a.shape == shape and a.flags.c_contiguous:
        return a.ravel()                    # a view, as reshape(-1) below
    a = np.asarray(a)
    shape = tuple(shape)
    if a.shape == shape and a.flags.c_contiguous:
        return a.reshape(-1)
    n = 1
    for s in shape:
        n *= s
    if a.size == 1:
        return np.broadcast_to(a.reshape(-1), (n,))
    lead = a.ndim - len(shape)              # a row (1, k) of a loop over rows (k,)
    if lead > 0 and all(d == 1 for d in a.shape[:lead]):
        a = a.reshape(a.shape[lead:])
        if a.shape == shape and a.flags.c_contiguous:
            return a.reshape(-1)
    flat = np.empty(shape, a.dtype)          # np.broadcast_to's copy, at a third of
    np.copyto(flat, a)                      # its time for small arrays
    return flat.reshape(-1)


def _g_broadcast_rows(shape, arrays):
    """A loop over ``shape`` as rows, where some of ``arrays`` (its array inputs) hold
    one row that every row reads (a bias of shape ``(k,)`` or ``(1, k)`` added to an
    ``(n, k)`` array), so that the kernel's ``_rows`` form reads them once per row
    instead of each broadcast to ``shape`` first (a copy of the whole loop's size):
    ``(n, strides, flat)``, rows of the last dims of ``shape`` holding ``n`` elements,
    ``strides[j]`` ``n`` for an array of the whole shape and 0 for a row (broadcast
    within the row where it has 1s there), ``flat`` the arrays as the kernel takes
    them.  None (broadcast them all first) unless some array is a row of the loop's
    last dims (not all of them) and the rows hold ``_G_BROADCAST_ROW`` elements or
    more."""
    shape = tuple(shape)
    k = 0
    for a in arrays:
        s = a.shape if type(a) is np.ndarray else np.shape(a)
        if s != shape:
            lead = 0                        # the dims before the row are 1s
            pad = len(shape) - len(s)
            while lead < len(s) and s[lead] == 1:
                lead += 1
            k = max(k, len(shape) - pad - lead)
    if k == 0 or k >= len(shape):
        return None
    n = 1
    for d in shape[len(shape) - k:]:
        n *= d
    if n < _G_BROADCAST_ROW:
        return None
    row = shape[len(shape) - k:]
    flat, strides = [], []
    for a in arrays:
        whole = np.shape(a) == shape
        flat.append(_g_flat(a, shape if whole else row))
        if not whole and not flat[-1].flags.c_contiguous:    # a stride-0 view of one value
            flat[-1] = np.ascontiguousarray(flat[-1])
        strides.append(n if whole else 0)
    return n, tuple(strides), tuple(flat)


def _g_finish(op, outs, results, shapes, rt, inputs):
    """Results as fresh arrays of the result dtype, or written into ``out``.

    ``inputs`` are the arrays a result returned without ``out=`` must not share
    memory with (it is copied if it does); wrappers pass ``()`` when no result
    can.  No two results share memory either (``b = a`` gives two arrays).  Fast paths:
    without ``out=``, C-contiguous writeable arrays of their output's shape and of the
    result dtype (or not floating-point) are returned as they are, where ``inputs`` is
    ``()`` or each result owns its memory and is no input (an array the call allocated:
    no input can be a view of it, and the wrappers never take an input's ``base``);
    with ``out=``, the outs when every result was computed in its out[k].
    """
    if outs is None:
        if len(results) == 1 or len(set(map(id, results))) == len(results):
            given = set(map(id, inputs))
            for r, shape in zip(results, shapes):
                if type(r) is not np.ndarray or r.shape != shape \
                        or r.dtype is not rt and r.dtype.kind == "f":
                    break
                flags = r.flags
                if not flags.c_contiguous or not flags.writeable:
                    break
                if given and (r.base is not None or id(r) in given):
                    break
            else:
                return results
    else:
        for r, o, shape in zip(results, outs, shapes):
            if r is not o or o.shape != shape:
                break
        else:
            return outs
    final = []
    for k, (r, shape) in enumerate(zip(results, shapes)):
        r = np.asarray(r)
        if r.shape != tuple(shape):
            r = np.broadcast_to(r, tuple(shape))
        if outs is not None:
            o = outs[k]
            if o.shape != tuple(shape):
                raise ValueError(f"{op}: out[{k}] must have shape {tuple(shape)}, "
                                 f"got {o.shape}")
            if r is not o:
                if r.dtype.kind == "f" and o.dtype.kind != "f":
                    raise TypeError(f"{op}: out[{k}] must be a floating-point array, "
                                    f"got {o.dtype}")
                if not np.can_cast(r.dtype, o.dtype, "same_kind"):
                    raise TypeError(f"{op}: out[{k}] must be able to hold {r.dtype} "
                                    f"values, got {o.dtype}")
                if r.dtype.kind == "f" and r.dtype != rt:     # float16 results: as NumPy,
                    r = r.astype(rt)                          # rounded, then cast to out
                np.copyto(o, r, casting="same_kind")
            final.append(o)
            continue
        if (r.dtype != rt and r.dtype.kind == "f") or not r.flags.c_contiguous \
                or not r.flags.writeable or any(np.may_share_memory(r, a) for a in inputs) \
                or any(np.may_share_memory(r, f) for f in final):    # b = a: two arrays
            r = np.array(r, dtype=rt if r.dtype.kind == "f" else r.dtype, order="C")
        final.append(r)
    return tuple(final)


class _GradcMissing(NotImplementedError, AttributeError):
    """A method or target the module was not compiled with: a NotImplementedError
    that is also an AttributeError, so ``hasattr(op, "cuda")`` is False."""


class _GradcDask(Exception):
    """Raised by the in-memory argument checks, before any work, on a Dask array
    argument: ``_GradcOp`` then runs the op's Dask wrapper (``NAME.dask``)."""


class _GradcOp:
    """A compiled op: call it for the forward pass; ``vjp``, ``fwd_bwd``, ``jvp``,
    ``unfused`` and ``cuda`` as in docs/generated-module.md; ``spec`` is its source
    text and ``signature`` its parameter list.  ``keywords`` maps the keyword-only
    parameters whose Python name in the wrappers differs (``lambda`` is
    ``lambda_`` there) to that name; ``missing`` maps a method the op cannot
    have (``jvp`` through a grad block that is not linear) to the compiler's
    error, which calling it raises as a NotImplementedError.  ``dask`` maps methods
    to their Dask wrappers, run when an argument is a Dask array (docs/dask.md)."""

    def __init__(self, name, spec, signature, methods, unfused=None, note=None, keywords=None,
                 cuda=None, missing=None, dask=None):
        self.__name__ = name
        self._dask = dask or {}
        self._cuda = cuda
        self.spec = spec
        self.signature = signature
        self._methods = methods
        self.unfused = unfused
        self._note = note
        self._keywords = keywords or {}
        # The wrappers, called straight (a frame less per call: a small call costs a
        # few microseconds) unless keywords need renaming or the method is missing.
        self._missing = missing or {}
        self._forward, self._vjp, self._fwd_bwd, self._jvp = (
            methods[m] if m in methods and not self._keywords else self._runner(m)
            for m in ("forward", "vjp", "fwd_bwd", "jvp"))
        # vjp, fwd_bwd and jvp are per op, so that inspect.signature and help() show
        # the wrapper's own parameters (a method of this class would show *args)
        self.vjp, self.fwd_bwd, self.jvp = (self._method(m) for m in ("vjp", "fwd_bwd", "jvp"))
        if "forward" in methods and not self._keywords:
            self.__signature__ = inspect.signature(methods["forward"])

    def _runner(self, method):
        return lambda *args, **kwargs: self._run(method, args, kwargs)

    def _get(self, method):
        fn = self._methods.get(method)
        if fn is None:
            why = self._missing.get(method) or self._note or "not available"
            raise NotImplementedError(f"{self.__name__}.{method}: {why}")
        return fn

    def _run(self, method, args, kwargs):
        fn = self._get(method)
        if self._keywords:
            kwargs = self._rename(method, kwargs)
        return fn(*args, **kwargs)

    def _failed(self, method, exc):
        """Raise ``exc`` of a call of ``method`` again, clearer, where it can be: a
        ValueError named after the op (:meth:`_relabel`), and Python's TypeError for too
        many positional arguments (raised binding them, before the wrapper ran) naming
        the keyword-only parameters; return to let it propagate as it is."""
        if isinstance(exc, (ValueError, IndexError)):
            self._relabel(method, exc)
            return
        fn = self._methods.get(method)
        if exc.__traceback__.tb_next is not None or fn is None or \
                "positional argument" not in str(exc) or "given" not in str(exc):
            return
        code, back = fn.__code__, {v: k for k, v in self._keywords.items()}
        names = [back.get(n, n) for n in
                 code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
                 if n not in ("out", "stream", "seed")]
        if names:
            call = fn.__qualname__.removesuffix(".forward")     # op[.unfused][.vjp]
            raise TypeError(f"{exc}: {', '.join(names)} {'is' if len(names) == 1 else 'are'} "
                            f"keyword-only, as every parameter with a default: "
                            f"{call}(..., {names[0]}=...)") from None

    def _bare(self, exc):
        """``exc`` without the frames below the public method when it is one of the
        op's own argument errors (its message starts with the op's name), so that a
        traceback ends at the caller's line; any other keeps its frames."""
        return exc.with_traceback(None) if str(exc).startswith(self.__name__) else exc

    def _relabel(self, method, exc):
        """Raise NumPy's own ValueErrors (an AxisError as one: a ValueError and an
        IndexError, whichever step raised it) and the IndexErrors of an index out of
        range (a label of a gather, NumPy's or gradc's message) again, of the same type,
        with the method's name (``op.unfused.vjp`` for an unfused one); return if
        ``exc`` has it (ours do)."""
        if not str(exc).startswith(f"{self.__name__}."):
            fn = self._methods.get(method)
            name = getattr(fn, "__qualname__", f"{self.__name__}.{method}")
            axis_error = getattr(np, "exceptions", np).AxisError     # np.AxisError < 1.25
            kind = (axis_error if isinstance(exc, axis_error)
                    else IndexError if isinstance(exc, IndexError) else ValueError)
            raise kind(f"{name}: {exc}") from exc

    def _rename(self, method, kwargs):
        out = {}
        for key, value in kwargs.items():
            if key not in self._keywords and key in self._keywords.values():
                raise TypeError(f"{self.__name__}.{method}() got an unexpected keyword "
                                f"argument {key!r}")
            out[self._keywords.get(key, key)] = value
        return out

    def __call__(self, /, *args, **kwargs):
        try:
            return self._forward(*args, **kwargs)
        except (ValueError, TypeError, IndexError) as exc:
            self._failed("forward", exc)
            raise self._bare(exc)  # a refused argument: the checks' frames left out
        except _GradcDask:
            return self._run_dask("forward", args, kwargs)

    def _method(self, method):
        """The op's ``method`` (vjp, fwd_bwd, jvp): its wrapper, with clearer errors
        (:meth:`_failed`) and Dask arguments sent to the Dask wrapper."""
        run = getattr(self, f"_{method}")

        def call(*args, **kwargs):
            try:
                return run(*args, **kwargs)
            except (ValueError, TypeError, IndexError) as exc:
                self._failed(method, exc)
                raise self._bare(exc)  # a refused argument: the checks' frames left out
            except _GradcDask:
                return self._run_dask(method, args, kwargs)

        fn = self._methods.get(method)
        call.__name__, call.__qualname__ = method, getattr(fn, "__qualname__", method)
        if fn is not None and not self._keywords:
            call.__signature__, call.__doc__ = inspect.signature(fn), fn.__doc__
        return call

    def _run_dask(self, method, args, kwargs):
        """``method`` on arguments of which some are Dask arrays: lazy results."""
        fn = self._dask.get(method)
        if fn is None:
            raise TypeError(f"{self.__name__}.{method}: Dask arrays are not supported here "
                            "(the unfused and CUDA methods take in-memory arrays); "
                            "call the fused method")
        if self._keywords:
            kwargs = self._rename(method, kwargs)
        try:
            return fn(*args, **kwargs)
        except ValueError as exc:
            self._relabel(method, exc)
            raise

    @property
    def cuda(self):
        """The same methods on CUDA device arrays (modules compiled with
        ``--target cuda`` or ``all``)."""
        if self._cuda is None:
            raise _GradcMissing(f"{self.__name__}.cuda: this module was compiled for "
                                "the CPU only; recompile with --target cuda or all")
        return self._cuda

    def __repr__(self):
        return f"<gradc op {self.__name__}{self.signature}>"


def _g_rows(op, shape, k, empty, cols=False, split=None, cols_split=1):
    """Rows ``R`` (dims before ``k``), row length ``N``, chunks ``C`` and segments ``S``
    of a reduce kernel's loop ``shape``; ``empty``: None, or the NumPy name
    (``maximum``) of a reduction of the kernel that has no identity, NumPy's ValueError
    for empty rows.  A chunk holds at least 4096 elements and there are at most 64:
    enough to share among threads, and fixed by the shape alone, so a reduction's bits
    do not depend on the thread count.  ``cols``: the kernel keeps a float64 partial of
    a row's length per chunk (a reduction across rows, ``dw``), so long rows get fewer
    chunks: at most 2^17 partial elements (1 MB), at least 2 chunks (32 rows of 65536:
    2 chunks, where 32 would write and read 8 MB of float32; with 2^19, each call's new
    partials' page faults and the sum of the chunks made layer and RMS norm's fwd_bwd
    1.2-1.6x slower at 64 x 16384, 256 x 8192 and 32 x 65536 float32, session 48).
    ``split`` (a kernel that splits rows: ``_G_SPLIT``, fewer rows than, row length
    from, segment length from): few long rows run split, one chunk, ``S`` segments a
    row (else ``S`` is 0); with ``cols``, up to ``cols_split`` times ``split[0]`` rows
    (``_G_SPLIT_COLS``)."""
    r = n = 1
    for d in shape[:k]:
        r *= d
    for d in shape[k:]:
        n *= d
    if empty and n == 0 and r:
        raise ValueError(f"{op}: zero-size array to reduction operation {empty} "
                         f"which has no identity")
    if split is not None and 0 < r <= (cols_split * split[0] if cols else split[0] - 1) \
            and n >= split[1]:
        return r, n, 1, n // split[2]
    c = max(1, min(r, 64, (r * n) >> 12))
    return r, n, min(c, max(2, (1 << 17) // max(n, 1))) if cols else c, 0


def _g_reassoc_codegen(op):
    """The code generator of an ``fadd`` or ``fmul`` (``op``) flagged ``reassoc``, both
    operands cast to the result's type first."""
    def codegen(context, builder, signature, args):
        t = signature.return_type
        a, b = (context.cast(builder, v, ty, t) for v, ty in zip(args, signature.args))
        return getattr(builder, op)(a, b, flags=("reassoc",))
    return codegen


def _g_reassoc_type(typingctx, a, b):
    """The type of ``a + b`` (``a * b``) of two numbers, None (no match) unless a float."""
    t = typingctx.unify_types(a, b)
    return t if isinstance(t, numba.types.Float) else None


@numba.extending.intrinsic
def _g_radd(typingctx, a, b):
    """``a + b`` for a reduce kernel's sum, the type ``a + b`` has: an ``fadd`` flagged
    ``reassoc``, which lets LLVM vectorise the reduction in lanes of partial sums. The
    flag is on this instruction only: the kernel's other arithmetic is not reassociated
    (``x / s * w`` kept, not ``x * w / s``, which overflows first)."""
    t = _g_reassoc_type(typingctx, a, b)
    return (t(a, b), _g_reassoc_codegen("fadd")) if t is not None else None


@numba.extending.intrinsic
def _g_rmul(typingctx, a, b):
    """``a * b`` for a reduce kernel's product, as :func:`_g_radd`."""
    t = _g_reassoc_type(typingctx, a, b)
    return (t(a, b), _g_reassoc_codegen("fmul")) if t is not None else None


@numba.extending.intrinsic
def _g_rmax(typingctx, a, b):
    """``max(a, b)`` of two floats of one type for a reduce kernel's row max: a compare
    and select flagged ``nnan nsz``, which LLVM vectorises as a max reduction (a NaN's
    result is left undefined: the kernels track NaN apart, ``cpu_reduce._max_update``)."""
    def codegen(context, builder, signature, args):
        c = builder.fcmp_ordered(">", args[0], args[1], flags=("nnan", "nsz"))
        return builder.select(c, args[0], args[1], flags=("nnan", "nsz"))
    return a(a, b), codegen


@numba.extending.intrinsic
def _g_rmin(typingctx, a, b):
    """``min(a, b)`` as :func:`_g_rmax` does ``max``."""
    def codegen(context, builder, signature, args):
        c = builder.fcmp_ordered("<", args[0], args[1], flags=("nnan", "nsz"))
        return builder.select(c, args[0], args[1], flags=("nnan", "nsz"))
    return a(a, b), codegen


def _g_prefetch_codegen(write):
    """The code generator of :func:`_g_prefetch` (``write`` 0) and
    :func:`_g_prefetch_w` (1)."""
    from llvmlite import ir
    from numba.core import cgutils

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        n = builder.extract_value(ary.shape, 0)
        zero = ir.Constant(n.type, 0)
        lo = builder.select(builder.icmp_signed("<", args[1], zero), zero, args[1])
        hi = builder.select(builder.icmp_signed(">", args[2], n), n, args[2])
        line = max(1, 64 // context.get_abi_sizeof(context.get_data_type(aryty.dtype)))
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        with cgutils.for_range_slice(builder, lo, hi, ir.Constant(n.type, line)) as (i, _):
            ptr = builder.bitcast(builder.gep(ary.data, [i]), i8p)
            builder.call(fn, [ptr, i32(write), i32(2), i32(1)])
        return context.get_dummy_value()
    return codegen


@numba.extending.intrinsic
def _g_prefetch(typingctx, a, start, stop):
    """Ask the CPU to bring the elements ``a[start:stop]`` of a 1-d array into its L2
    cache: one ``llvm.prefetch`` (read, locality 2: ``prefetcht1`` on x86, which leaves
    the L1 to the row being computed) per 64-byte line, the step a constant of the
    dtype.  A hint: it never faults, and the range is clipped to the array.  Reduce
    kernels prefetch the next row while they compute on this one (``cpu_reduce``)."""
    return numba.types.void(a, numba.types.intp, numba.types.intp), _g_prefetch_codegen(0)


@numba.extending.intrinsic
def _g_prefetch_w(typingctx, a, start, stop):
    """:func:`_g_prefetch` for elements about to be written (``prefetchw`` on x86): the
    lines arrive owned, so the stores to them wait for no read for ownership."""
    return numba.types.void(a, numba.types.intp, numba.types.intp), _g_prefetch_codegen(1)


@numba.extending.intrinsic
def _g_view(typingctx, a, start, stop):
    """``a[start:stop]`` of a 1-d array (``start`` and ``stop`` clipped to it as a slice
    would be, ``stop`` to ``start`` at least; no negative indices from the end): a view
    of the same type and stride that holds no reference of its own (no meminfo, as
    ``numba.carray``'s), borrowed from ``a``, which the caller keeps alive.  A Numba
    slice increments and decrements the array's reference count, an atomic operation:
    reduce kernels take a few views per row, and at rows of 64 float32 their counts
    were 15-25 % of the kernel's time (``cpu_reduce``)."""
    if not (isinstance(a, numba.types.Array) and a.ndim == 1):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        from numba.core import cgutils
        from numba.np.arrayobj import make_array, populate_array
        src = make_array(signature.args[0])(context, builder, args[0])
        out = make_array(signature.return_type)(context, builder)
        n = builder.extract_value(src.shape, 0)
        zero = ir.Constant(n.type, 0)

        def clip(v, lo):
            v = builder.select(builder.icmp_signed("<", v, lo), lo, v)
            return builder.select(builder.icmp_signed(">", v, n), n, v)
        lo = clip(args[1], zero)
        hi = clip(args[2], lo)
        step = builder.extract_value(src.strides, 0)
        data = builder.gep(src.data, [lo])
        if signature.args[0].layout != "C":       # a stride other than the item size
            data = builder.inttoptr(
                builder.add(builder.ptrtoint(src.data, step.type), builder.mul(lo, step)),
                src.data.type)
        populate_array(out, data=data, shape=cgutils.pack_array(builder, [builder.sub(hi, lo)]),
                       strides=cgutils.pack_array(builder, [step]), itemsize=src.itemsize,
                       meminfo=None)
        return out._getvalue()
    return a(a, numba.types.intp, numba.types.intp), codegen


@numba.extending.intrinsic
def _g_row_len(typingctx, n):
    """A reduce kernel's row length ``n``: a constant where the caller passed a literal
    (``loop_ir.static_rows``: the kernel's entry for rows of 64 calls its body with
    ``64``, which Numba types ``Literal[int](64)``), so that LLVM compiles the body's
    loops for that trip count; else ``n`` itself."""
    if not isinstance(n, numba.types.Integer):
        return None
    value = getattr(n, "literal_value", None)

    def codegen(context, builder, signature, args):
        if value is not None:
            return context.get_constant(numba.types.intp, value)
        return context.cast(builder, args[0], n, numba.types.intp)
    return numba.types.intp(n), codegen


def _g_row_shape(arrays, forms, rank, least=None):
    """``(R, K)``: the rows and row length of the arguments of a row plan when they fit
    it (``forms``: per argument ``f`` full, ``c`` a column, ``-`` as declared), else
    None.  The full ones must share one shape of rank >= 1 (``rank`` 1: >= 2, 2: exactly
    2) whose leading dims make the ``R`` rows, of at least ``least`` elements (default
    ``_G_ROWS_MIN``; the CUDA wrappers, 0); the columns must be of shape ``(K,)``.
    (Smaller arrays run the generic plan, whose NumPy reductions sum in NumPy's order:
    the same bits as NumPy where a sum cancels, and the row plan would save
    microseconds.)  Arrays of any kind with a ``shape``: device arrays too."""
    s = None
    for a, f in zip(arrays, forms):
        if f == "f":
            s = tuple(a.shape)          # (the CUDA simulator's shapes index from 0 only)
            break
    if not s or rank == 2 and len(s) != 2 or rank == 1 and len(s) < 2:
        return None
    k = s[-1]
    for a, f in zip(arrays, forms):
        if f == "f" and tuple(a.shape) != s or f == "c" and tuple(a.shape) != (k,):
            return None
    r = 1
    for d in s[:-1]:
        r *= d
    return (r, k) if r * k >= (_G_ROWS_MIN if least is None else least) else None


def _g_rows_own(outs, inputs, inplace):
    """A row plan's ``inputs``, each input j that out[k] is for a pair ``(k, j)`` of
    ``inplace`` (a pair the method allows in place and its row plan does not: a pass
    reads the input after another has stored over it) copied first: the row plan then
    reads the copy as it writes out[k] over the input, with the bits of the call out of
    place (the generic plan in place would sum in its own order, and take several
    kernels)."""
    if outs is None:
        return inputs
    own = {j for k, j in inplace if _g_same_array(outs[k], inputs[j])}
    return tuple(a.copy() if j in own else a for j, a in enumerate(inputs))


def _g_rows_back(results, shapes, outs, single):
    """A row plan's results with the call's shapes (reshaped views); ``outs`` when
    given (its results are in them)."""
    if outs is not None:
        return outs[0] if single else outs
    if single:
        return _g_reshaped(results, shapes[0])
    return tuple(_g_reshaped(r, s) for r, s in zip(results, shapes))


def _g_reshaped(a, shape):
    """``a.reshape(shape)``, or ``a`` itself when of that shape already: an array that
    owns its memory is quicker to check as an ``out=`` later (:func:`_g_may_overlap`)."""
    return a if a.shape == tuple(shape) else a.reshape(shape)


@numba.njit(cache=True)
def _g_rows_far(a, b, gap):
    """Whether the rows of ``a`` and ``b``, flat arrays of rows of one length that a
    reduce kernel reads and writes at the same offsets, lie ``gap`` bytes or more from
    each other: their starts do.  Where they do not (an output written in place of an
    input, small arrays side by side), LLVM's run-time check of a vector loop that
    stores to one and reads the other fails (:func:`_g_apart` for arrays of other
    shapes)."""
    return abs(np.int64(a.ctypes.data) - np.int64(b.ctypes.data)) >= gap


@numba.njit(cache=True)
def _g_apart(a, b, gap):
    """Whether the memory of arrays ``a`` and ``b`` lies ``gap`` bytes or more apart."""
    pa, pb = np.int64(a.ctypes.data), np.int64(b.ctypes.data)
    return pa >= pb + b.nbytes + gap or pb >= pa + a.nbytes + gap


@numba.njit(cache=True)
def _g_gathers_straight(rows, chunks, k):
    """Whether a reduce kernel gathers its sums across rows (``dw``, ``db``) straight
    into their partials: no chunk of ``rows`` in ``chunks`` has more rows than it
    gathers at a time (``k``), so the one row it would gather them in and add to the
    partial once is the partial's row itself (then of the compute dtype: the wrapper
    makes it so).  Called by the wrapper and by the kernel, on the same numbers."""
    return rows <= k * chunks


def _g_gather_row(q, straight, n, ap, w):
    """The row a reduce kernel gathers a chunk's sums across rows in: the partial's
    row ``q`` where it gathers ``straight`` into it (:func:`_g_gathers_straight`), else
    a new row of ``n`` zeros of the compute dtype (``w``'s), ``ap`` elements apart from
    any other array, added to ``q`` every few rows.  (For Numba: a float64 ``q`` of a
    float32 kernel is never gathered into, and types must agree.)"""
    return q if straight else np.zeros(n + 2 * ap, w.dtype)[ap:ap + n]


@numba.extending.overload(_g_gather_row)
def _g_gather_row_typed(q, straight, n, ap, w):
    if q.dtype == w.dtype:
        return lambda q, straight, n, ap, w: (
            q if straight else np.zeros(n + 2 * ap, w.dtype)[ap:ap + n])
    return lambda q, straight, n, ap, w: np.zeros(n + 2 * ap, w.dtype)[ap:ap + n]


@numba.njit(cache=True)
def _g_gather_flush(q, g, straight):
    """Add the gathered row ``g`` to the partial's row ``q`` and zero it, unless the
    kernel gathers ``straight`` into ``q`` (then ``g`` is ``q``).  A function of its
    own: printed in the kernel's loop over rows, the same loop made layer norm's
    ``fwd_bwd`` at rows of 1024 1.1x slower in cache (1.5x behind the flag); called,
    0.57 ns an element where it took 0.64, LLVM's doing."""
    if not straight:
        for c in range(q.size):
            q[c] += g[c]
            g[c] = 0.0


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _g_sum_chunks(partials, count, into):
    """``into`` (flat) = the sum over the chunks of ``partials`` ``(C, N)``, in chunk
    order as NumPy's ``sum(axis=0)`` adds them where ``N > 1`` (of one column, NumPy
    sums pairwise: :func:`_g_combine` leaves those to it), divided by ``count`` (a
    mean) unless it is -1: blocks of columns in parallel, each block's float64 sums
    in a row of its own that each chunk's block is added to in turn (a vector loop;
    summed a column at a time, each column's chain of adds waited on the one before:
    0.74 ms for 64 chunks of 8192, 0.06 ms for 16; NumPy's sum, a temporary and a cast
    took 0.25 ms per partial of 2 x 262144, one thread)."""
    n = partials.shape[1]
    for b in numba.prange((n + 2047) // 2048):
        lo = b * 2048
        m = min(2048, n - lo)
        s = np.empty(m, np.float64)
        for c in range(m):
            s[c] = partials[0, lo + c]          # float32 partials are added in float64
        for k in range(1, partials.shape[0]):
            for c in range(m):
                s[c] += partials[k, lo + c]
        if count == -1:
            for c in range(m):
                into[lo + c] = s[c]
        else:
            for c in range(m):
                into[lo + c] = s[c] / count


def _g_partial_rows(into, chunks, n, t, straight, inputs):
    """The partials of a sum across rows a reduce kernel gathers (``chunks`` rows of
    ``n``): ``into`` itself, the result's buffer (None: a new one), where one chunk
    gathers ``straight`` in the compute dtype ``t`` (few long rows) and ``into`` is
    none of the ``inputs`` (out= in place of one: the kernel reads it while it
    gathers), else new (of ``t`` where ``straight``, else float64)."""
    if straight and chunks == 1 and into is not None and into.dtype == t \
            and into.size == n and into.flags.c_contiguous \
            and not any(isinstance(a, np.ndarray) and _g_may_overlap(into, a) for a in inputs):
        return into.reshape(1, n)
    return np.empty((chunks, n), dtype=t if straight else np.float64)


def _g_combine(op, kind, partials, count, shape, t, empty_ok=False, into=None):
    """A chunk reduction's value from its per-chunk partials (float64, deterministic;
    a sum across rows of the compute dtype where no chunk has more rows than a CPU
    kernel gathers, added in float64 all the same); ``empty_ok``: a max or min of
    nothing is its initial value (the partials' -inf or inf), not NumPy's error;
    ``into``: an array of ``shape`` and dtype ``t`` to write it in (and return).  A sum
    of one chunk gathered straight (few long rows) is its row itself, not a copy (and
    where that row is ``into``'s memory, nothing is left to do)."""
    if kind in ("max", "min") and count == 0 and not empty_ok:
        raise ValueError(f"{op}: zero-size array to reduction operation "
                         f"{'maximum' if kind == 'max' else 'minimum'} which has no identity")
    if kind == "sum" and partials.ndim == 2 and partials.shape[0] == 1 \
            and partials.dtype == t:      # gathered straight into one chunk's row: the sum
        if into is None:
            return _g_reshaped(partials[0], shape)
        if partials.size == into.size and partials.ctypes.data == into.ctypes.data:
            return into                   # (_g_partial_rows: the row is into's memory)
    if kind in ("sum", "mean") and partials.ndim == 2 and partials.shape[0] and \
            partials.shape[1] > 1 and partials.size >= _G_PARALLEL_MIN:
        res = np.empty(shape, t) if into is None else into
        if res.dtype in (_G_F32, _G_F64) and res.flags.c_contiguous:
            _g_sum_chunks(partials, count if kind == "mean" else -1, res.reshape(-1))
            return res
    if kind == "sum" and partials.ndim == 2 and partials.shape[0] == 1 \
            and partials.dtype == np.float64:
        r = partials[0]                   # (NumPy's sum of one row, without its 3 us)
    elif kind == "sum":
        r = partials.sum(axis=0, dtype=np.float64)
    elif kind == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            r = partials.sum(axis=0, dtype=np.float64) / count
    elif kind == "prod":
        r = partials.prod(axis=0)
    elif kind == "max":
        r = partials.max(axis=0)
    else:
        r = partials.min(axis=0)
    if into is not None:
        into[...] = np.reshape(r, into.shape)
        return into
    return _g_reshaped(np.asarray(r).astype(t), shape)
