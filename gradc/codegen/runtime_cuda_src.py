"""The CUDA run time of generated modules: host helpers and library kernels.

Copied into generated modules compiled with ``--target cuda|all``, like
:mod:`gradc.codegen.runtime_src` for the CPU: functions named ``_gc_*`` are
host helpers, copied as they are; the functions listed in :data:`KERNELS`
are copied under a ``@cuda.jit`` decorator
(they are plain functions here, so gradc imports without numba-cuda).  The
module binds ``cuda`` (``numba.cuda``), ``_GC_SIM`` (Numba's CUDA simulator
is on) and ``_GC_BLOCK`` (threads per block: 256, or 8 in the simulator,
whose threads are Python threads).

Arrays.  Inputs and outputs are device arrays: Numba's, or any object with
``__cuda_array_interface__`` (CuPy arrays, PyTorch CUDA tensors), taken
without a copy; they must be C-contiguous.  Host arrays are a TypeError
(nothing is copied behind the caller's back); Python and NumPy scalars are
uploaded (and cached: a 0-d parameter such as ``alpha=0.2`` costs one
upload per distinct value).  float16 is not supported on CUDA yet.

Launches.  Elementwise kernels are grid-stride loops of ``_GC_BLOCK``
threads per block and at most one full wave of blocks (multiprocessors
times resident blocks per multiprocessor, read from the device).
Reductions are two-stage block tree reductions in shared memory with a
fixed split for a given device and shape, and no atomics: the same input
gives the same bits on every run.  Partial results are accumulated in
float64.  The reduce kernels of the plan (:mod:`gradc.codegen.cuda_reduce`) run
on a grid that depends on the shape alone (:func:`_gc_row_grid`), their partials
combined by :func:`_gc_combine`.  Matmul is a tiled shared-memory kernel (16x16 tiles, float64
accumulation, batches along the grid's z extent), printed by
:func:`gradc.codegen.cuda.render_cuda_matmul`, which also prints the matmul
kernels with a fused elementwise epilogue.
"""
from __future__ import annotations

import math
import os
import threading

import numpy as np

try:                                  # bound in generated modules
    from numba import cuda
    import numba
except ImportError:                   # pragma: no cover - gradc itself needs no numba-cuda
    cuda = numba = None

_GC_SIM = False
_gcm = math                           # modules: _gc_sim_math() in the simulator
_GC_BLOCK = 256
_GC_RBLOCK = 256
_GC_GRID_Y = 65535
_GC_RGRID = 1024
_GC_TILE = 16
_GC_CCOLS = 32
_GC_CLANES = 8
_GC_SCRATCH = 32
_GC_WARP = 32
_GC_WARP_ROW = 1024

def _gc_sim_math():
    """The kernels' math (``_gcm``) in Numba's CUDA simulator, which runs them as
    Python: Python's ``math``, but where it raises (``exp(1000)``, ``log(0)``,
    ``sqrt(-1)``, ``floor(inf)``) NumPy's IEEE result, which is CUDA's (inf, -inf,
    NaN), so that the simulator runs kernels on the values a GPU takes; and floats
    where Python's gives ints (``floor(1e308)`` is a float on a GPU)."""
    numpy_names = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "atan2": "arctan2",
                   "pow": "power", "asinh": "arcsinh", "acosh": "arccosh", "atanh": "arctanh"}

    class SimMath:
        def __getattr__(self, name):
            f = getattr(math, name)
            if isinstance(f, float):            # inf, nan, pi
                return f

            def call(*args):
                try:
                    r = f(*args)
                    return float(r) if isinstance(r, int) else r    # floor, ceil: floats
                except (OverflowError, ValueError):
                    with np.errstate(all="ignore"):
                        return float(getattr(np, numpy_names.get(name, name))(*args))
            return call
    return SimMath()


# Modes of _gc_rows: how an element is mapped and combined.
_GC_SUM, _GC_PROD, _GC_MAX, _GC_MIN, _GC_SUMEXP, _GC_SUMSQ, _GC_MAXABS = range(7)
# Epilogues of the last stage: none, log(acc) + shift (logsumexp), scaled sqrt (norm).
_GC_FIN_NONE, _GC_FIN_LSE, _GC_FIN_NORM = range(3)


# --------------------------------------------------------------------------
# Device functions (copied under @cuda.jit(device=True)) and kernels (@cuda.jit)


def _gck_gather(dst, src, shape, strides):
    """``dst[i] = src[offset(i)]``: ``dst`` flat over ``shape`` (C order), element
    ``i``'s source offset is its index dotted with ``strides`` (elements; 0 on
    broadcast dimensions).  Broadcasts, transposes, casts on store."""
    nd = len(shape)
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        rest = i
        off = 0
        for d in range(nd - 1, -1, -1):
            n = shape[d]
            off += (rest % n) * strides[d]
            rest //= n
        dst[i] = src[off]


def _gcd_identity(mode):
    """The value a reduction by ``mode`` starts from (_GC_SUM, _GC_PROD, _GC_MAX, _GC_MIN)."""
    return 1.0 if mode == _GC_PROD else (
        -math.inf if mode == _GC_MAX else (math.inf if mode == _GC_MIN else 0.0))


def _gcd_combine(mode, a, b):
    """``a`` and ``b`` combined by ``mode``; max and min propagate NaN, as NumPy's do."""
    if mode == _GC_SUM:
        return a + b
    if mode == _GC_PROD:
        return a * b
    if mode == _GC_MAX:
        return b if (b > a or b != b) else a
    return b if (b < a or b != b) else a


def _gcd_sync_row(whole):
    """Synchronise the threads of a reduce kernel's row: the block's (``whole``, a
    uniform condition), else the warp's (a warp per row)."""
    if whole:
        cuda.syncthreads()
    else:
        cuda.syncwarp()


def _gck_rows(out, x, shift, rows, inner, chunk, nch, mode, final, scale):
    """One stage of a row reduction of ``x`` (``rows`` by ``inner``, flat, C order).

    Block ``(c, r)`` combines row ``r``'s elements ``[c*chunk, (c+1)*chunk)`` into
    ``out[r*nch + c]``: a strided per-thread loop, then a tree in shared memory
    (float64).  ``mode`` maps and combines (_GC_SUM... _GC_MAXABS); ``shift[r]``
    is the row's max for _GC_SUMEXP and its max |x| for _GC_SUMSQ; ``final`` is
    the epilogue applied when ``nch == 1`` (the last stage), then ``* scale``.
    Max and min propagate NaN, as NumPy's do.
    """
    acc_s = cuda.shared.array(_GC_RBLOCK, numba.float64)
    t = cuda.threadIdx.x
    c = cuda.blockIdx.x
    lo = c * chunk
    hi = min(lo + chunk, inner)
    cmode = mode
    if mode == _GC_SUMEXP or mode == _GC_SUMSQ:
        cmode = _GC_SUM
    elif mode == _GC_MAXABS:
        cmode = _GC_MAX
    r = cuda.blockIdx.y
    while r < rows:
        s = 0.0
        if mode == _GC_SUMEXP:
            s = shift[r]
            s = s if s - s == 0.0 else 0.0              # finite max, else 0
        elif mode == _GC_SUMSQ:
            s = shift[r]
            s = s if (s > 0.0 and s - s == 0.0) else 1.0
        acc = _gcd_identity(cmode)
        for i in range(lo + t, hi, cuda.blockDim.x):
            v = numba.float64(x[r * inner + i])
            if mode == _GC_SUMEXP:
                v = _gcm.exp(v - s)
            elif mode == _GC_SUMSQ:
                v = v / s
                v = v * v
            elif mode == _GC_MAXABS:
                v = abs(v)
            acc = _gcd_combine(cmode, acc, v)
        acc_s[t] = acc
        cuda.syncthreads()
        w = cuda.blockDim.x // 2
        while w > 0:
            if t < w:
                acc_s[t] = _gcd_combine(cmode, acc_s[t], acc_s[t + w])
            cuda.syncthreads()
            w //= 2
        if t == 0:
            a = acc_s[0]
            if nch == 1 and final == _GC_FIN_LSE:
                m = numba.float64(shift[r])
                a = _gcm.log(a) + (m if m - m == 0.0 else 0.0)
            elif nch == 1 and final == _GC_FIN_NORM:
                m = numba.float64(shift[r])
                a = m if math.isinf(m) else _gcm.sqrt(a) * (
                    m if (m > 0.0 and m - m == 0.0) else 1.0)
            out[r * nch + c] = a * scale
        cuda.syncthreads()
        r += cuda.gridDim.y


def _gck_cols(out, part, g, n, mode, scale):
    """Combine a reduce kernel's per-block partials (float64, ``g`` by ``n``, C
    order) down the columns: ``out[c]`` is ``part[j*n + c]`` reduced over ``j``
    (_GC_SUM, _GC_PROD, _GC_MAX, _GC_MIN; max and min propagate NaN), ``* scale``.

    A block is _GC_CCOLS columns by _GC_CLANES lanes: lane ``l`` of a column
    combines ``j = l, l + _GC_CLANES, ...`` in order, then the lanes meet in a fixed
    tree in shared memory, so the result does not depend on timing.  A warp reads
    adjacent columns of one partial row (coalesced); no transpose is needed.
    """
    acc_s = cuda.shared.array((_GC_CLANES, _GC_CCOLS), numba.float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    c = cuda.blockIdx.x * _GC_CCOLS + tx
    acc = _gcd_identity(mode)
    if c < n:
        for j in range(ty, g, _GC_CLANES):
            acc = _gcd_combine(mode, acc, part[j * n + c])
    acc_s[ty, tx] = acc
    cuda.syncthreads()
    w = _GC_CLANES // 2
    while w > 0:
        if ty < w:
            acc_s[ty, tx] = _gcd_combine(mode, acc_s[ty, tx], acc_s[ty + w, tx])
        cuda.syncthreads()
        w //= 2
    if ty == 0 and c < n:
        out[c] = acc_s[0, tx] * scale


# The kernels above (_gck_*) are copied into the module under @cuda.jit
# (gradc.codegen.runtime); _gck_matmul is printed by gradc.codegen.cuda.render_cuda_matmul, like the matmul
# kernels with a fused epilogue.


# --------------------------------------------------------------------------
# Host helpers

_GC_STATE = {}


def _gc_is_device(v):
    """Whether ``v`` is a device array: Numba's (or the simulator's) or any
    ``__cuda_array_interface__`` object."""
    if _GC_SIM:
        return type(v).__name__ == "FakeCUDAArray"
    # Numba's own first: asking for __cuda_array_interface__ builds a dict each time
    return isinstance(v, cuda.cudadrv.devicearray.DeviceNDArray) or cuda.is_cuda_array(v)


def _gc_as_device(v):
    """``v`` as a Numba device array over the same memory (no copy)."""
    if _GC_SIM or isinstance(v, cuda.cudadrv.devicearray.DeviceNDArray):
        return v
    return cuda.as_cuda_array(v)


def _gc_c_contiguous(a):
    if _GC_SIM:
        return a._ary.flags.c_contiguous
    return a.is_c_contiguous()


def _gc_span(a):
    """``(first byte, end)`` of a device array's memory, for overlap checks."""
    if _GC_SIM:
        ary = a._ary
        lo = ary.__array_interface__["data"][0]
        return lo, lo + ary.size * ary.dtype.itemsize     # C-contiguous
    ptr = a.__cuda_array_interface__["data"][0]
    return ptr, ptr + a.size * a.dtype.itemsize


def _gc_extent(a):
    """:func:`_gc_span` of a non-empty device array, else None (it overlaps nothing)."""
    return _gc_span(a) if _gc_is_device(a) and a.size else None


def _gc_meet(sa, sb):
    """Whether two :func:`_gc_extent` values share a byte."""
    return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def _gc_overlap(a, b):
    return _gc_meet(_gc_extent(a), _gc_extent(b))


def _gc_device_input(op, what, name, v, want_kind):
    """A device-array argument, checked: C-contiguous, of kind ``want_kind``
    ("f", or the NumPy dtype of an integer parameter, which a narrower integer
    dtype it holds exactly also passes: :func:`_gc_inputs` widens it)."""
    if isinstance(v, np.ndarray) or hasattr(v, "__array__") and not _gc_is_device(v):
        raise TypeError(
            f"{op}: {what} '{name}' is a host array ({type(v).__name__}); the .cuda methods "
            f"take device arrays: numba.cuda.to_device(x), a CuPy array or a CUDA torch "
            f"tensor (or call the CPU method)")
    if not _gc_is_device(v):
        raise TypeError(f"{op}: {what} '{name}' must be a device array, got "
                        f"{type(v).__name__}")
    a = _gc_as_device(v)
    if not a.dtype.isnative:
        raise TypeError(f"{op}: {what} '{name}' has a non-native byte order ({a.dtype}); "
                        f"the CUDA kernels read native float32/float64")
    if want_kind == "f":
        if a.dtype.char not in "fd":
            raise TypeError(f"{op}: {what} '{name}' must be a float32 or float64 device "
                            f"array, got {a.dtype}")
    elif a.dtype != want_kind and not (a.dtype.kind in "iu" and
                                       np.can_cast(a.dtype, want_kind, "safe")):
        raise TypeError(f"{op}: {what} '{name}' must be {np.dtype(want_kind).name}, got "
                        f"{a.dtype}")
    if not _gc_c_contiguous(a):
        raise ValueError(f"{op}: {what} '{name}' must be C-contiguous (copy it first: "
                         f".contiguous() in PyTorch, cupy.ascontiguousarray)")
    return a


def _gc_inputs(op, sig, values, stream):
    """Validate the arguments of a ``.cuda`` method; as :func:`_g_inputs` returns
    ``(arrays, T, RT, dims)``: device arrays (host 0-d arrays for scalars) in
    the compute dtype ``T``.  Raises TypeError for host arrays, a wrong dtype or
    float16, ValueError for a wrong shape or a non-contiguous array."""
    if not (type(stream) is int and stream == 0) and not (
            hasattr(stream, "synchronize") and hasattr(stream, "auto_synchronize")):
        raise TypeError(f"{op}: stream= must be 0 (the default stream) or a Numba CUDA "
                        f"stream (numba.cuda.stream(); another library's stream through "
                        f"numba.cuda.external_stream(ptr)), got {type(stream).__name__}")
    arrays, rt, dims = _g_resolve(op, sig, values,
                                  lambda name, dt, v: _gc_argument(op, name, dt, v))
    t = rt.type
    for i, ((name, dt, shape), a) in enumerate(zip(sig, arrays)):
        want = np.dtype(_G_INTS[dt]) if dt in _G_INTS else t
        if a.dtype != want:         # a float cast, or int32 labels for an i64 parameter
            arrays[i] = (np.asarray(a, dtype=want) if isinstance(a, np.ndarray)
                         else _gc_copy(a, want, stream))
    return arrays, t, rt, dims


def _gc_argument(op, name, dt, v):
    """One argument of a ``.cuda`` method: a host scalar (0-d array) or a checked
    device array; float16 and a float dtype other than the declared one are
    TypeErrors."""
    if dt == "f16":
        raise TypeError(f"{op}: parameter '{name}' is declared f16, which the CUDA target "
                        f"does not support yet (declare f32, or call the CPU method)")
    if isinstance(v, (bool, int, float, np.generic)):
        a = (_g_int_input(op, name, v, np.dtype(_G_INTS[dt])) if dt in _G_INTS
             else _g_float_input(op, "argument", name, v, _G_FLOATS.get(dt)))
    else:
        a = _gc_device_input(op, "argument", name, v,
                             np.dtype(_G_INTS[dt]) if dt in _G_INTS else "f")
    if dt not in _G_INTS:
        if a.dtype == np.float16:
            raise TypeError(f"{op}: argument '{name}' is float16, which the CUDA "
                            f"target does not support yet; use float32")
        if dt in _G_FLOATS and a.dtype.type is not _G_FLOATS[dt]:
            raise TypeError(f"{op}: argument '{name}' must be "
                            f"{np.dtype(_G_FLOATS[dt]).name}, got {a.dtype}")
    return a


def _gc_upstream(op, name, v, shape, t, stream):
    """A cotangent argument: a device array of the output's shape (or a scalar
    for a 0-d output), in the compute dtype ``t``."""
    if isinstance(v, (int, float, np.generic)) and not isinstance(v, bool):
        a = _g_float_input(op, "upstream", name, v)
    else:
        a = _gc_device_input(op, "upstream", name, v, "f")
    if a.shape != tuple(shape):
        raise ValueError(f"{op}: upstream '{name}' must have the output's shape "
                         f"{tuple(shape)}, got {a.shape}")
    if isinstance(a, np.ndarray):
        return np.asarray(a, dtype=t)
    return a if a.dtype == t else _gc_copy(a, t, stream)


def _gc_tangent(op, name, v, shape, t, stream):
    """A tangent argument of ``jvp``: a device array (or a host scalar) of its
    parameter's shape or of one that broadcasts to it (broadcast on the device,
    one gather), in the compute dtype ``t``."""
    if isinstance(v, (int, float, np.generic)) and not isinstance(v, bool):
        a = _g_float_input(op, "tangent", name, v)
    else:
        a = _gc_device_input(op, "tangent", name, v, "f")
    shape = tuple(shape)
    if _g_tangent_broadcast(op, name, a.shape, shape):
        a = _gc_broadcast(np.asarray(a, dtype=t) if isinstance(a, np.ndarray) else a,
                          shape, stream)
    if isinstance(a, np.ndarray):
        return np.asarray(a, dtype=t)
    return a if a.dtype == t else _gc_copy(a, t, stream)


def _gc_out_tuple(op, out, shapes, kinds, inputs, names, inplace=(), stream=0):
    """Check ``out=`` before any work, as :func:`_g_out_tuple` does, for device
    arrays; returns Numba views of them (written in place and returned)."""
    if out is None:
        return None
    if type(out) is _GradcChecked:          # a row plan's, checked by the method calling it
        return out
    n = len(shapes)
    outs = (out,) if not isinstance(out, (tuple, list)) else out
    if len(outs) != n:
        got = ("one array" if not isinstance(out, (tuple, list)) else
               f"a {type(out).__name__} of {len(outs)}")
        raise TypeError(f"{op}: out= must be {'a device array or ' if n == 1 else ''}"
                        f"a tuple of {n} device arrays, got {got}")
    views, spans = [], []
    extents = [_gc_extent(a) for a in inputs]      # each array's once, not per pair
    for k, o in enumerate(outs):
        if not _gc_is_device(o):
            raise TypeError(f"{op}: out[{k}] must be a device array, got {type(o).__name__}")
        o = _gc_as_device(o)
        if o.shape != tuple(shapes[k]):
            raise ValueError(f"{op}: out[{k}] must have shape {tuple(shapes[k])}, got "
                             f"{o.shape}")
        _g_out_dtype(op, k, kinds[k], o.dtype, "fd", "a float32 or float64 device array")
        if not _gc_c_contiguous(o):
            raise ValueError(f"{op}: out[{k}] must be a C-contiguous device array")
        so = _gc_extent(o)
        for j, (a, sa) in enumerate(zip(inputs, extents)):
            if not _gc_meet(so, sa):
                continue
            if (k, j) in inplace and so == sa and o.shape == a.shape and o.dtype == a.dtype:
                continue
            raise ValueError(f"{op}: out[{k}] overlaps input '{names[j]}'")
        for j in range(k):
            if _gc_meet(so, spans[j]):
                raise ValueError(f"{op}: out[{k}] overlaps out[{j}]")
        views.append(o)
        spans.append(so)
    return tuple(views)


def _gc_buffer(op, outs, k, shape, t, rt, stream):
    """Where result ``k`` is computed: the caller's out[k] when its dtype is ``t``, the
    result dtype ``rt`` too (:func:`_g_buffer`)."""
    if outs is not None and outs[k].dtype == t and rt == t:
        return outs[k]
    return cuda.device_array(tuple(shape), dtype=t, stream=stream)


def _gc_empty(shape, dtype, stream):
    return cuda.device_array(tuple(shape), dtype=dtype, stream=stream)


def _gc_scratch(shape, stream, slot):
    """A float64 device array of ``shape`` for a reduce kernel's partials, which only
    the same call reads (:func:`_gc_combine`), kept for the next call: one per
    thread, stream and ``slot`` (a number of the call's own), so that the usual call
    allocates nothing (each Numba allocation is a driver call).  The next call from
    the same thread on the same stream runs after this one's kernels, so it may
    overwrite the values.  At most _GC_SCRATCH are kept, the least recently used
    dropped (freed as any Numba array is: after the kernels queued on it)."""
    pool = _GC_STATE.setdefault("scratch", {})
    key = (threading.get_ident(), 0 if type(stream) is int else id(stream), slot)
    n = math.prod(shape)
    hit = pool.pop(key, None)
    if hit is None or hit[1].size < n:
        hit = (stream, cuda.device_array(max(n, 1), np.float64, stream=stream))
    pool[key] = hit            # most recent last; the stream held, so its id stays its own
    while len(pool) > _GC_SCRATCH:
        del pool[next(iter(pool))]
    return hit[1][:n].reshape(tuple(shape))


def _gc_upload(a, stream):
    """A host value on the device; scalars are cached by value and dtype (device
    copies are never written, so sharing them is safe)."""
    a = np.asarray(a)
    if a.size != 1:
        return cuda.to_device(np.array(a, order="C"), stream=stream)
    cache = _GC_STATE.setdefault("scalars", {})
    key = (a.dtype.str, a.reshape(-1)[0].tobytes(), a.shape)
    d = cache.get(key)
    if d is None:
        if len(cache) >= 256:
            cache.clear()
        d = cache[key] = cuda.to_device(np.array(a, order="C"), stream=stream)   # 0-d stays 0-d
    return d


def _gc_dev(a, stream):
    return a if _gc_is_device(a) else _gc_upload(a, stream)


def _gc_blocks(n):
    """Blocks for a grid-stride loop over ``n`` elements: enough to cover it, at
    most :func:`_gc_waves` waves of blocks at full occupancy on the current device
    (several waves, so that a kernel whose registers allow fewer resident
    blocks does not end on a partly idle wave)."""
    cap = _GC_STATE.get("wave")
    if cap is None:
        if _GC_SIM:
            cap = 2
        else:
            dev = cuda.get_current_device()
            cap = dev.MULTIPROCESSOR_COUNT * max(1, dev.MAX_THREADS_PER_MULTIPROCESSOR
                                                 // _GC_BLOCK) * _gc_waves()
        _GC_STATE["wave"] = cap
    return max(1, min((n + _GC_BLOCK - 1) // _GC_BLOCK, cap))


def _gc_waves():
    """The cap on grid-stride grids, in waves: GRADC_CUDA_WAVES (read at the first
    launch, so a bad value breaks no import and no CPU method), else 64."""
    w = _GC_STATE.get("waves")
    if w is None:
        text = os.environ.get("GRADC_CUDA_WAVES", "64")
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"GRADC_CUDA_WAVES must be a positive integer, got {text!r}")
        w = _GC_STATE["waves"] = int(text)
    return w


def _gc_witness(t):
    """An empty device array of dtype ``t``: kernels read their compute dtype from it."""
    w = _GC_STATE.get(t)
    if w is None:
        w = _GC_STATE[t] = cuda.device_array(0, dtype=t)
    return w


def _gc_launch(kernel, stream, *args):
    """Run an elementwise kernel over ``args[0].size`` elements."""
    n = args[0].size
    if n:
        kernel[_gc_blocks(n), _GC_BLOCK, stream](*args)


def _gc_ravel(a):
    """A C-contiguous device array as 1-D (a view; 0-d gives one element)."""
    return a if a.ndim == 1 else a.reshape(a.size)


def _gc_flat(a, shape, stream):
    """``a`` as a flat contiguous device array over the loop of ``shape``; a
    broadcast is materialised (one gather)."""
    a = _gc_dev(a, stream)
    shape = tuple(shape)
    if a.shape == shape or (shape == () and a.size == 1):
        return _gc_ravel(a)
    return _gc_ravel(_gc_broadcast(a, shape, stream))


def _gc_strides(shape):
    """C-order strides of ``shape``, in elements."""
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def _gc_gather(src, shape, strides, dtype, stream):
    """A new C-contiguous array of ``shape`` and ``dtype`` whose element at index
    ``i`` is ``src``'s flat element ``i . strides``."""
    shape = tuple(int(n) for n in shape)
    out = _gc_empty(shape, dtype, stream)
    if out.size:
        if not shape:
            shape, strides = (1,), (0,)
        _gck_gather[_gc_blocks(out.size), _GC_BLOCK, stream](
            _gc_ravel(out), _gc_ravel(src), shape, tuple(int(s) for s in strides))
    return out


def _gc_broadcast(a, shape, stream):
    """NumPy's ``broadcast_to(a, shape)``, materialised."""
    a = _gc_dev(a, stream)
    shape = tuple(shape)
    lead = len(shape) - a.ndim
    if lead < 0 or any(m != 1 and m != n for m, n in zip(a.shape, shape[lead:])):
        raise ValueError(f"cannot broadcast shape {a.shape} to {shape}")
    own = _gc_strides(a.shape)
    st = (0,) * lead + tuple(0 if m == 1 else s for m, s in zip(a.shape, own))
    return _gc_gather(a, shape, st, a.dtype, stream)


def _gc_copy(a, dtype, stream):
    """A contiguous copy of device array ``a`` cast to ``dtype``."""
    return _gc_gather(a, a.shape, _gc_strides(a.shape), dtype, stream)


def _gc_transpose(a, stream):
    a = _gc_dev(a, stream)
    return _gc_gather(a, a.shape[::-1], _gc_strides(a.shape)[::-1], a.dtype, stream)


def _gc_rows(x, rows, inner, mode, final, scale, shift, dtype, stream, into=None):
    """Reduce each row of flat ``x`` (``rows`` by ``inner``) to one value of ``dtype``
    (in flat ``into`` when given): split into chunks when rows are few and long
    (deterministic two stages)."""
    cap = _gc_blocks(1 << 62)
    nch = 1
    if inner > 4 * _GC_RBLOCK and rows < cap:
        nch = min((inner + 4 * _GC_RBLOCK - 1) // (4 * _GC_RBLOCK), max(1, cap // rows))
    chunk = max(1, (inner + nch - 1) // nch)
    nch = max(1, (inner + chunk - 1) // chunk)
    sh = shift if shift is not None else _gc_witness(np.float64)
    if nch == 1:
        out = _gc_empty((rows,), dtype, stream) if into is None else into
        _gck_rows[(1, min(rows, _GC_GRID_Y)), _GC_RBLOCK, stream](
            out, x, sh, rows, inner, chunk, 1, mode, final, scale)
        return out
    part = _gc_empty((rows * nch,), np.float64, stream)
    _gck_rows[(nch, min(rows, _GC_GRID_Y)), _GC_RBLOCK, stream](
        part, x, sh, rows, inner, chunk, nch, mode, final, 1.0)
    second = _GC_MAX if mode == _GC_MAXABS else (_GC_SUM if mode >= _GC_SUMEXP else mode)
    out = _gc_empty((rows,), dtype, stream) if into is None else into
    _gck_rows[(1, min(rows, _GC_GRID_Y)), _GC_RBLOCK, stream](
        out, part, sh, rows, nch, nch, 1, second, final, scale)
    return out


def _gc_reduce(kind, x, axis, keepdims, stream, empty_ok=False):
    """``np.<kind>(x, axis=axis, keepdims=keepdims)`` on the device, for ``kind`` in
    sum, mean, prod, max, min, logsumexp, norm (the conventions of gradc's
    ``_g_logsumexp`` and ``_g_norm``).  A 0-d result is a 0-d device array.
    ``empty_ok``: a max or min of an empty slice is -inf or inf (NumPy's
    ``initial=``), not an error."""
    x = _gc_dev(x, stream)
    nd = x.ndim
    out_shape = _g_reduce_shape(x.shape, axis=axis, keepdims=keepdims)
    axes = sorted(range(nd) if axis is None else {ax % nd for ax in axis})
    kept = [i for i in range(nd) if i not in axes]
    rows = int(np.prod([x.shape[i] for i in kept], dtype=np.int64))
    inner = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    if inner == 0 and kind in ("max", "min") and not empty_ok:
        raise ValueError(f"zero-size array to reduction operation {kind}imum which has "
                         f"no identity")
    if rows == 0:
        return _gc_empty(out_shape, x.dtype, stream)
    if kept and kept != list(range(len(kept))):          # reduced axes last
        perm = kept + axes
        st = _gc_strides(x.shape)
        x = _gc_gather(x, [x.shape[i] for i in perm], [st[i] for i in perm], x.dtype, stream)
    flat = _gc_ravel(x)
    if inner == 0:
        flat = _gc_empty((0,), x.dtype, stream)
    t = x.dtype
    if kind == "logsumexp":
        m = _gc_rows(flat, rows, inner, _GC_MAX, _GC_FIN_NONE, 1.0, None, np.float64, stream)
        r = _gc_rows(flat, rows, inner, _GC_SUMEXP, _GC_FIN_LSE, 1.0, m, t, stream)
    elif kind == "norm":
        m = _gc_rows(flat, rows, inner, _GC_MAXABS, _GC_FIN_NONE, 1.0, None, np.float64,
                     stream)
        r = _gc_rows(flat, rows, inner, _GC_SUMSQ, _GC_FIN_NORM, 1.0, m, t, stream)
    else:
        mode = {"sum": _GC_SUM, "mean": _GC_SUM, "prod": _GC_PROD, "max": _GC_MAX,
                "min": _GC_MIN}[kind]
        scale = (1.0 / inner if inner else math.nan) if kind == "mean" else 1.0
        r = _gc_rows(flat, rows, inner, mode, _GC_FIN_NONE, scale, None, t, stream)
    return r.reshape(out_shape) if out_shape != (rows,) else r


def _gc_row_grid(op, shape, k, empty, cols=False, flat=False, split=None):
    """``(R, N, G, Y, S)`` of a reduce kernel (:mod:`gradc.codegen.cuda_reduce`) over
    the loop ``shape`` split at ``k``: rows and row length as :func:`_g_rows` gives
    them (its error for a max of empty rows too), the blocks ``G`` and the rows a
    block takes at a time ``Y``, a function of the shape alone (so the partials,
    and the results' bits, do not depend on the device): rows of at most
    _GC_WARP_ROW elements a warp each (``Y`` of them per block), longer rows, and
    the rows of a kernel with column partials, a whole block each (``Y`` = 1); a
    block per ``Y`` rows up to _GC_RGRID
    (``flat``: rows of one element, a block per _GC_RBLOCK of them); ``cols``: at
    most _GC_COLS float64 partial elements (a row of ``N`` per block).  At
    least one block, which writes the partials' initial values when there are no
    rows.  ``S``: the segments of a row where the kernel runs split rows (``split``,
    the rule _GC_SPLIT: few long rows, each pass a block per segment of ``G`` rows at
    a time, those blocks striding over the rows), else 0."""
    r, n, _, _ = _g_rows(op, shape, k, empty)
    cap = max(1, _GC_COLS // max(n, 1)) if cols else r
    if split and not flat and 0 < r < split[0] and n >= split[1]:
        s = min(n // split[2], -(-split[3] // r))
        if s > 1:
            return r, n, min(r, cap), 1, s
    # not with column partials: a row of them per warp would make 8x as many rows for
    # _gck_cols to combine, a lane's loop over them latency-bound (not measured yet)
    y = _GC_RBLOCK // _GC_WARP if (n <= _GC_WARP_ROW and not flat and not cols
                                   and _gc_warps()) else 1
    g = (r + _GC_RBLOCK - 1) // _GC_RBLOCK if flat else (r + y - 1) // y
    return r, n, max(1, min(g, cap, _GC_RGRID)), y, 0


def _gc_warps():
    """Whether reduce kernels may run a warp per row: on a GPU, and in the simulator
    once gradc's ``fast_simulator`` gave it the ``syncwarp`` it lacks."""
    if not _GC_SIM:
        return True
    from numba.cuda.simulator import kernelapi
    return hasattr(kernelapi.FakeCUDAModule, "syncwarp")


def _gc_launch_rows(kernel, stream, blocks, y, *args):
    """Run a reduce kernel on ``blocks`` blocks of _GC_RBLOCK threads (its trees need
    exactly that many), as ``y`` rows of ``_GC_RBLOCK // y`` threads."""
    kernel[blocks, (_GC_RBLOCK // y, y), stream](*args)


def _gc_combine(op, kind, partials, count, shape, t, empty_ok=False, into=None, stream=0):
    """:func:`_g_combine` on the device: a chunk reduction's value from a reduce
    kernel's per-block partials (float64, ``(G,)`` or ``(G, N)``), reduced over the
    blocks in float64 (one launch, deterministic: a row reduction of the ``G``
    values, or :func:`_gck_cols` down the columns), as a device array
    of ``shape`` and dtype ``t`` (``into``, when given: written and returned); a
    mean divides by ``count``."""
    if kind in ("max", "min") and count == 0 and not empty_ok:
        raise ValueError(f"{op}: zero-size array to reduction operation "
                         f"{'maximum' if kind == 'max' else 'minimum'} which has no identity")
    mode = {"sum": _GC_SUM, "mean": _GC_SUM, "prod": _GC_PROD, "max": _GC_MAX,
            "min": _GC_MIN}[kind]
    scale = ((1.0 / count) if count else math.nan) if kind == "mean" else 1.0
    g = partials.shape[0]
    n = partials.size // g
    out = _gc_empty(tuple(shape), t, stream) if into is None else into
    if n == 0:
        return out
    if partials.ndim == 1:                  # one value: a row of g partials
        _gc_rows(partials, 1, g, mode, _GC_FIN_NONE, scale, None, t, stream,
                 into=_gc_ravel(out))
    else:
        _gck_cols[(n + _GC_CCOLS - 1) // _GC_CCOLS, (_GC_CCOLS, _GC_CLANES), stream](
            _gc_ravel(out), _gc_ravel(partials), g, n, mode, scale)
    return out


def _gc_rows_own(outs, inputs, inplace, stream=0):
    """:func:`_g_rows_own` for device arrays: each input j that out[k] meets for a pair
    ``(k, j)`` of ``inplace`` copied on ``stream`` (an out that meets an input is that
    input itself: ``_gc_out_tuple`` refused any other overlap)."""
    if outs is None:
        return inputs
    so, si = [_gc_extent(o) for o in outs], [_gc_extent(a) for a in inputs]
    own = {j for k, j in inplace if _gc_meet(so[k], si[j])}
    return tuple(_gc_copy(a, a.dtype, stream) if j in own else a
                 for j, a in enumerate(inputs))


def _gc_matmul_operands(a, b, stream):
    """The operands of ``np.matmul(a, b)`` (rank 1 or more, one float dtype) as flat
    device arrays, with the product's geometry ``(m, n, k, offsets of a's matrices,
    of b's)`` (a 1-d ``a`` a row, a 1-d ``b`` a column; one offset per batch of the
    product, its batch dims broadcast) and the result's shape; ValueError as
    :func:`_g_matmul_shape`'s."""
    a, b = _gc_dev(a, stream), _gc_dev(b, stream)
    shape = _g_matmul_shape(a.shape, b.shape)
    sa = (1,) + tuple(a.shape) if a.ndim == 1 else tuple(a.shape)
    sb = tuple(b.shape) + (1,) if b.ndim == 1 else tuple(b.shape)
    m, k, n = sa[-2], sa[-1], sb[-1]
    batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    geometry = (m, n, k, _gc_batch_offsets(sa[:-2], batch, m * k),
                _gc_batch_offsets(sb[:-2], batch, k * n))
    return _gc_ravel(a), _gc_ravel(b), geometry, shape


def _gc_batch_offsets(own, batch, size):
    """The offset (int64, on the device) of the matrix of each batch (C order over
    ``batch``) in a flat operand of batch dims ``own`` and ``size`` elements per
    matrix: ``own`` broadcast to ``batch``.  Cached by shapes (never written), so
    uploaded synchronously: a later call on another stream finds it there."""
    cache = _GC_STATE.setdefault("batch offsets", {})
    key = (tuple(own), tuple(batch), size)
    d = cache.get(key)
    if d is None:
        off = np.arange(int(np.prod(own, dtype=np.int64)), dtype=np.int64) * size
        off = np.ascontiguousarray(np.broadcast_to(off.reshape(own), batch)).reshape(-1)
        if len(cache) >= 256:
            cache.clear()
        d = cache[key] = cuda.to_device(off)
    return d


def _gc_launch_matmul(kernel, stream, geometry, *args):
    """Run a tiled matmul kernel (``args``: outputs, inputs, the two operands) over
    each batch's ``m`` by ``n`` product: one block of _GC_TILE^2 threads per tile."""
    m, n, k, ao, bo = geometry
    if m and n and ao.size:
        grid = ((n + _GC_TILE - 1) // _GC_TILE, min((m + _GC_TILE - 1) // _GC_TILE, _GC_GRID_Y),
                min(ao.size, _GC_GRID_Y))
        kernel[grid, (_GC_TILE, _GC_TILE), stream](*args, ao, bo, m, n, k,
                                                   _gc_witness(args[-1].dtype))


def _gc_matmul(a, b, stream):
    """``np.matmul`` (float, same dtype; batch dims broadcast): the product stored
    (``_gck_matmul``); with k = 0, zeros."""
    fa, fb, geometry, shape = _gc_matmul_operands(a, b, stream)
    c = _gc_empty(shape, fa.dtype, stream)
    if c.size:
        _gc_launch_matmul(_gck_matmul, stream, geometry, _gc_ravel(c), fa, fb)
    return c


def _gc_sum_to(g, shape, stream):
    """:func:`_g_sum_to` on the device: sum ``g`` down to ``shape`` (the adjoint of
    broadcasting), or broadcast it up."""
    g = _gc_dev(g, stream)
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead >= 0:
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                          if n == 1 and g.shape[lead + i] != 1)
        if axes:
            g = _gc_reduce("sum", g, axes, True, stream)
            g = g.reshape(g.shape[lead:])
    return g if g.shape == shape else _gc_broadcast(g, shape, stream)


def _gc_broadcast_in(a, shape, axis, keepdims, stream):
    """:func:`_g_broadcast_in` on the device: re-insert reduced axes, broadcast."""
    a = _gc_dev(a, stream)
    shape = tuple(shape)
    if not keepdims:
        nd = len(shape)
        axes = set(range(nd) if axis is None else (ax % nd for ax in axis))
        it = iter(a.shape)
        a = a.reshape(tuple(1 if i in axes else next(it) for i in range(nd)))
    return _gc_broadcast(a, shape, stream)


def _gc_finish(op, outs, results, shapes, rt, inputs, stream):
    """Results as device arrays of the result dtype, or written into ``out``."""
    final = []
    for k, (r, shape) in enumerate(zip(results, shapes)):
        shape = tuple(shape)
        r = _gc_dev(r if _gc_is_device(r) else np.asarray(r), stream)
        if r.shape != shape:
            r = _gc_broadcast(r, shape, stream)
        if outs is not None:
            o = outs[k]
            if r is not o:
                if r.dtype.kind == "f" and o.dtype.kind != "f":
                    raise TypeError(f"{op}: out[{k}] must be a floating-point array, "
                                    f"got {o.dtype}")
                if r.dtype == o.dtype and _gc_c_contiguous(r) and o.size:
                    o.copy_to_device(r, stream=stream)      # a device-to-device memcpy
                elif o.size:
                    _gck_gather[_gc_blocks(o.size), _GC_BLOCK, stream](
                        _gc_ravel(o), _gc_ravel(r), shape or (1,),
                        _gc_strides(shape) or (1,))
            final.append(o)
            continue
        if r.dtype.kind == "f" and r.dtype != rt:
            r = _gc_copy(r, rt, stream)
        elif any(_gc_overlap(r, a) for a in inputs) or any(_gc_overlap(r, f) for f in final):
            c = _gc_empty(r.shape, r.dtype, stream)
            if c.size:
                c.copy_to_device(r, stream=stream)
            r = c
        final.append(r)
    return tuple(final)
