"""Ahead-of-time PTX for a generated module's CUDA kernels, without a GPU.

Numba's CUDA simulator runs kernels as Python and so accepts code a GPU
rejects; compiling every kernel to PTX with NVVM (numba-cuda's
``compile_ptx``; NVVM comes from the ``cuda`` extra's wheels) is the check
that counts.  The ``cuda`` extra pins CUDA 13.0's NVVM, whose PTX (ISA 9.0)
a CUDA 13.0 driver loads.
"""
from __future__ import annotations

import re
from types import ModuleType

from gradc.ir.primitives import PRIMITIVES

# PTX ISA versions by CUDA release (PTX ISA notes): what a driver can JIT.
MAX_PTX_ISA = {"13.0": (9, 0)}

_DTYPES = {"T": None, "i32": "int32", "i64": "int64", "bool": "boolean", "f64": "float64"}


def runtime_signatures(types, t):
    """``(kernel name, argument types)`` pairs for the run time's kernels at float
    type ``t``: what a module's ``_gck_*`` kernels are called with."""
    flat = types.Array(t, 1, "C")
    f64 = types.Array(types.float64, 1, "C")
    i64 = types.int64
    sigs = []
    for nd in (1, 2, 3):
        tup = types.UniTuple(i64, nd)
        sigs.append(("_gck_gather", (flat, flat, tup, tup)))
    one = types.UniTuple(i64, 1)            # int32 labels widened for an i64 parameter
    sigs.append(("_gck_gather", (types.Array(i64, 1, "C"), types.Array(types.int32, 1, "C"),
                                 one, one)))
    for out, src in ((flat, flat), (f64, flat), (flat, f64)):
        sigs.append(("_gck_rows", (out, src, f64, i64, i64, i64, i64, i64, i64, types.float64)))
    offsets = types.Array(i64, 1, "C")
    sigs.append(("_gck_matmul", (flat, flat, flat, offsets, offsets, i64, i64, i64, flat)))
    for prim in PRIMITIVES.values():          # the registry's primitives' own kernels
        for kernel, signatures in prim.cuda_kernels:
            sigs += [(kernel.__name__, s) for s in signatures(types, t)]
    return list(dict.fromkeys(sigs))          # a kernel two primitives share, once


def kernel_args(arg_dtypes: tuple[str, ...], dtype: str) -> tuple:
    """Numba's argument types of a generated kernel whose ``CUDA_KERNELS`` entry lists
    ``arg_dtypes`` ("T" the compute dtype ``dtype``, "n" a size), the dtype witness
    last."""
    from numba import types

    t = getattr(types, dtype)
    args = [types.int64 if d == "n" else
            types.Array(t if d == "T" else getattr(types, _DTYPES[d]), 1, "C")
            for d in arg_dtypes]
    return (*args, types.Array(t, 1, "C"))


def kernel_ptx(fn, args: tuple, ccs, fast_math: bool = False) -> list[str]:
    """PTX of kernel ``fn`` (a Python function) at argument types ``args``, one text
    per compute capability in ``ccs``.  Numba types and lowers the kernel once and
    NVVM compiles that LLVM IR for each capability (what ``compile_ptx`` does per
    capability; its front end is most of the time).  With a numba-cuda whose
    internals differ, ``compile_ptx`` once per capability."""
    from numba import cuda
    from numba.cuda import compiler

    ccs = list(ccs)
    compile_once = getattr(compiler, "_compile_pyfunc_with_fixup", None)
    if compile_once is not None:
        try:
            lib, _ = compile_once(fn, args, debug=False, device=False, fastmath=fast_math,
                                  cc=min(ccs), abi="numba")
            out = []
            for cc in ccs:
                texts = lib.get_asm_strs(cc=cc)
                if len(texts) != 1:
                    break
                out.append(texts[0])
            else:
                return out
        except TypeError:                     # another signature: the public way below
            pass
    return [cuda.compile_ptx(fn, args, cc=cc, fastmath=fast_math)[0] for cc in ccs]


def module_ptx(module: ModuleType, cc, dtypes=("float32", "float64"),
               fast_math: bool = False, prefix: str = "", runtime: bool = True
               ) -> dict[str, str]:
    """PTX of every CUDA kernel of generated ``module`` (those whose name starts
    with ``prefix``; the run time's too unless ``runtime=False``) for compute
    capability ``cc``, at each float dtype: ``{"name[float32]": ptx}``.  ``cc`` may
    be a list of capabilities: then ``{cc: {"name[float32]": ptx}}``, each kernel
    typed and lowered once for all (:func:`kernel_ptx`).  Raises numba's errors for
    a kernel that does not compile (the point of the check)."""
    from numba import types

    ccs = [tuple(c) for c in cc] if isinstance(cc, list) else [tuple(cc)]
    out: dict = {c: {} for c in ccs}

    def add(key: str, fn, args: tuple, fm: bool) -> None:
        for c, text in zip(ccs, kernel_ptx(fn, args, ccs, fm)):
            out[c][key] = text

    for dtype in dtypes:
        t = getattr(types, dtype)
        for name, (kernel, arg_dtypes) in sorted(module.CUDA_KERNELS.items()):
            if not name.startswith(prefix):
                continue
            add(f"{name}[{dtype}]", kernel.py_func, kernel_args(arg_dtypes, dtype), fast_math)
        for k, (name, args) in enumerate(runtime_signatures(types, t) if runtime else ()):
            add(f"{name}#{k}[{dtype}]", getattr(module, name).py_func, args, False)
    return out if isinstance(cc, list) else out[ccs[0]]


def ptx_isa(ptx: str) -> tuple[int, int]:
    """The ``.version`` of a PTX text, as ``(major, minor)``."""
    m = re.search(r"^\.version (\d+)\.(\d+)", ptx, re.M)
    if m is None:
        raise ValueError("no .version directive in PTX")
    return int(m.group(1)), int(m.group(2))


def ptx_target(ptx: str) -> str:
    m = re.search(r"^\.target (\S+)", ptx, re.M)
    if m is None:
        raise ValueError("no .target directive in PTX")
    return m.group(1).rstrip(",")
