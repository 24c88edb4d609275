"""CUDA backend: one ``@cuda.jit`` grid-stride kernel per kernel of the plan.

The plan is the CPU backend's (:func:`gradc.passes.fuse.plan_kernels`): the
same fused regions, the same inputs and outputs, the same loop body
(:func:`gradc.codegen.cpu.loop_body`); only the loop and the math differ.
A kernel's threads stride over the flat index, so any grid covers any size
and the launch picks the grid from the device (``_gc_launch``).  Math goes
to libdevice through Numba's ``math`` lowering (``__nv_expf``...): accurate
by default; with ``fast_math`` the kernel is compiled with ``fastmath=True``,
which selects CUDA's fast intrinsics (``__expf``, ``__logf``, approximate
division and square root, flush-to-zero).  Functions NumPy has and CUDA's
``math`` lacks are written out here (sigmoid, softplus, sign, rint) with
the conventions of the CPU library (docs/numerics.md).
"""
from __future__ import annotations

import os
import re

from gradc.codegen.cpu import loop_body, print_loop
from gradc.codegen.printer import IndentedBuffer, Printer
from gradc.codegen.quote import comment
from gradc.errors import CodegenError, GradcError
from gradc.ir.graph import Graph
from gradc.passes.fuse import Kernel, MatmulEpilogue

# Templates that differ from the CPU's (gradc.ir.primitives): libdevice through
# ``math`` (``_gcm``: the simulator's runs on inf and NaN as CUDA does), and NumPy
# functions CUDA kernels cannot call.
TEMPLATES = {
    "pow": "_gcm.pow({x}, {y})",
    "atan2": "_gcm.atan2({y}, {x})",
    "sign": "(_T(1) if {x} > _T(0) else (_T(-1) if {x} < _T(0) else ({x} if {x} != {x} else _T(0))))",
    "floor": "_gcm.floor({x})",
    "ceil": "_gcm.ceil({x})",
    # NumPy's rint (half to even), sign of zero kept: x - floor(x) is exact, so is the
    # tie test. Written out: a kernel calling a device function cannot be compiled to
    # PTX without a GPU (numba-cuda asks the current device for its compute capability).
    "round": ("_gcm.copysign((_gcm.floor({x}) + _T(1)) if ({x} - _gcm.floor({x}) > _T(0.5) or "
              "({x} - _gcm.floor({x}) == _T(0.5) and _gcm.fmod(_gcm.floor({x}), _T(2)) != "
              "_T(0))) else _gcm.floor({x}), {x})"),
    "sqrt": "_gcm.sqrt({x})",
    "rsqrt": "(_T(1) / _gcm.sqrt({x}))",
    "exp": "_gcm.exp({x})",
    "exp2": "_gcm.exp2({x})",
    "expm1": "_gcm.expm1({x})",
    "log": "_gcm.log({x})",
    "log2": "_gcm.log2({x})",
    "log10": "_gcm.log10({x})",
    "log1p": "_gcm.log1p({x})",
    "sin": "_gcm.sin({x})",
    "cos": "_gcm.cos({x})",
    "tan": "_gcm.tan({x})",
    "asin": "_gcm.asin({x})",
    "acos": "_gcm.acos({x})",
    "atan": "_gcm.atan({x})",
    "sinh": "_gcm.sinh({x})",
    "cosh": "_gcm.cosh({x})",
    "tanh": "_gcm.tanh({x})",
    # exp of -|x| only: 1/(1 + exp(-x)) would overflow exp for x < -88.7 (float32)
    # and return 0 where sigmoid is still a normal or subnormal number.
    "sigmoid": ("((_T(1) / (_T(1) + _gcm.exp(-{x}))) if {x} >= _T(0) else "
                "(_gcm.exp({x}) / (_T(1) + _gcm.exp({x}))))"),
    "softplus": "(max({x}, _T(0)) + _gcm.log1p(_gcm.exp(-abs({x}))))",
    "erf": "_gcm.erf({x})",
    "erfc": "_gcm.erfc({x})",
}
# Calls CUDA kernels cannot make: NumPy functions and the CPU math library (NumPy's
# scalar types as casts and its constants are fine).
_CPU_CALL = re.compile(r"\b(?:_g_\w+|np\.(?!u?int32\(|u?int64\(|bool_\(|float32\(|float64\()\w+)\(")


def check_device_lines(name: str, lines) -> None:
    """Raise CodegenError where a line of CUDA kernel ``name`` calls a CPU function."""
    for line in lines:
        if _CPU_CALL.search(line):
            raise CodegenError(f"CUDA kernel {name} would call a CPU function: {line.strip()}")


class CudaPrinter(Printer):
    backend = "cuda"

    def template(self, op: str) -> str | None:
        return TEMPLATES.get(op) or super().template(op)


# Elements each thread loads before it computes (see render_cuda_kernel); the
# environment variable GRADC_CUDA_UNROLL overrides it when a module is compiled.
UNROLL = 2


def unroll_factor() -> int:
    value = os.environ.get("GRADC_CUDA_UNROLL", "")
    if not value:
        return UNROLL
    if not value.isdigit() or not 1 <= int(value) <= 8:
        raise GradcError(f"the environment variable GRADC_CUDA_UNROLL must be an integer "
                         f"from 1 to 8, got {value!r}", code="E501")
    return int(value)


def render_cuda_kernel(graph: Graph, kernel: Kernel, name: str, *, fast_math: bool = False,
                       comments: tuple[str, ...] = (), unroll: int | None = None) -> str:
    """Source of the CUDA kernel ``name`` computing ``kernel``.

    Signature as on the CPU: ``name(*outputs, *inputs, _w)``, every array a flat
    C-contiguous device array of the kernel's size (scalar inputs: one
    element), ``_w`` an empty device array of the compute dtype.  Each thread
    starts at its global index and strides by the grid's size.  With
    ``unroll`` k > 1 a thread takes k elements a grid-stride apart per
    iteration and issues all their loads before any arithmetic or store (the
    compiler cannot move a load above a store to an array that may alias it):
    k times the bytes in flight per thread, which a bandwidth-bound loop
    needs on a GPU whose resident threads alone cannot cover the memory
    latency; a plain grid-stride loop finishes the last elements.
    """
    if isinstance(kernel, MatmulEpilogue):
        return render_cuda_matmul(graph, kernel, name, fast_math=fast_math, comments=comments)
    unroll = unroll_factor() if unroll is None else unroll
    # k elements a grid-stride apart: the body printed once per element, its locals
    # suffixed _1, _2..., its index _i_1, _i_2... (the hoisted scalars shared)
    elements = [loop_body(graph, kernel, CudaPrinter, index=f"_i_{j}" if j else "_i",
                          suffix=f"_{j}" if j else "") for j in range(max(unroll, 1))]
    hoisted, body = elements[0].hoisted, elements[0].lines()
    check_device_lines(name, hoisted + body)
    outs = [f"_o{k}" for k in range(len(kernel.outputs))]
    ins = [f"_i{k}" for k in range(len(kernel.inputs))]
    fm = ", fastmath=True" if fast_math else ""
    decorator = f"@cuda.jit(cache=not _GC_SIM{fm})"
    header = f"def {name}({', '.join(outs + ins + ['_w'])}):"
    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    if unroll <= 1:
        print_loop(buf, decorator, header, hoisted,
                   f"for _i in range(cuda.grid(1), {outs[0]}.size, cuda.gridsize(1)):", body)
        return buf.getvalue()
    setup = [f"_n = {outs[0]}.size", "_st = cuda.gridsize(1)", "_i = cuda.grid(1)"]
    steps = [f"_i_{j} = _i + {j} * _st" if j > 1 else "_i_1 = _i + _st"
             for j in range(1, unroll)]
    ordered = [line for e in elements for line in e.load_lines()] + \
        [line for e in elements for line in e.compute] + \
        [line for e in elements for line in e.store_lines()]
    print_loop(buf, decorator, header, hoisted + setup,
               f"while _i + {unroll - 1} * _st < _n:",
               steps + ordered + [f"_i += {unroll} * _st"])
    buf.indent()                       # the last elements, one per thread
    buf.line("while _i < _n:")
    buf.indent()
    for line in body + ["_i += _st"]:
        buf.line(line)
    return buf.getvalue()


def render_cuda_matmul(graph: Graph | None, step, name: str, *, fast_math: bool = False,
                       comments: tuple[str, ...] = ()) -> str:
    """Source of a tiled matmul kernel ``name``; with ``step`` (a
    :class:`~gradc.passes.fuse.MatmulEpilogue`) the epilogue's loop body runs on
    each element of the product where it is computed, without ``step`` the
    product is stored (the run time's ``_gck_matmul``).

    Signature: ``name(*outputs, *inputs, _a, _b, _ao, _bo, _m, _n, _k, _w)``:
    the epilogue's outputs and inputs as in :func:`render_cuda_kernel` (flat, of
    the product's size; the product itself is no input), then the operands, flat
    C-contiguous, and the offsets (int64) of each batch's ``_m`` by ``_k`` and
    ``_k`` by ``_n`` matrices in them (one per batch of the product, in C order;
    equal offsets where a batch dim is broadcast).  Blocks of _GC_TILE x
    _GC_TILE threads, one tile of the product each (the grid's z extent strides
    over the batches, its y extent over the row tiles); operand tiles are
    staged through shared memory and the dot products accumulate in float64.
    """
    if step is None:
        hoisted, body, outs, ins = [], ["_o0[_i] = _acc"], ["_o0"], []
    else:
        epi, m = step.epilogue, step.matmul
        element = loop_body(graph, epi, CudaPrinter)
        k_m = epi.inputs.index(m)
        # the product's element is the accumulator, not a load
        element.loads = [ld for ld in element.loads if ld[1] != f"_i{k_m}"]
        element.compute.insert(0, f"a{k_m} = _T(_acc)")
        if step.store:
            element.stores.append((f"_o{len(epi.outputs)}", "_i", f"a{k_m}"))
        hoisted, body = element.hoisted, element.lines()
        outs = [f"_o{j}" for j in range(len(step.outputs))]
        ins = [f"_i{j}" for j, nid in enumerate(epi.inputs) if nid != m]
        check_device_lines(name, hoisted + body)
    fm = ", fastmath=True" if fast_math else ""
    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    setup = [
        "_sa = cuda.shared.array((_GC_TILE, _GC_TILE), numba.float64)",
        "_sb = cuda.shared.array((_GC_TILE, _GC_TILE), numba.float64)",
        "_tx = cuda.threadIdx.x",
        "_ty = cuda.threadIdx.y",
        "_col = cuda.blockIdx.x * _GC_TILE + _tx",
    ]
    # Blocks stride over the batches and the row tiles: a grid's z and y extents are
    # at most 65535.
    tiles = [
        "_row = _rt * _GC_TILE + _ty",
        "_acc = 0.0",
        "for _t0 in range(0, _k, _GC_TILE):",
        "    _sa[_ty, _tx] = _a[_oa + _row * _k + _t0 + _tx] "
        "if (_row < _m and _t0 + _tx < _k) else 0.0",
        "    _sb[_ty, _tx] = _b[_ob + (_t0 + _ty) * _n + _col] "
        "if (_col < _n and _t0 + _ty < _k) else 0.0",
        "    cuda.syncthreads()",
        "    for _j in range(_GC_TILE):",
        "        _acc += _sa[_ty, _j] * _sb[_j, _tx]",
        "    cuda.syncthreads()",
        "if _row < _m and _col < _n:",
        "    _i = (_p * _m + _row) * _n + _col",
        *("    " + line for line in body),
    ]
    batch = [
        "_oa = _ao[_p]",
        "_ob = _bo[_p]",
        "for _rt in range(cuda.blockIdx.y, (_m + _GC_TILE - 1) // _GC_TILE, cuda.gridDim.y):",
        *("    " + line for line in tiles),
    ]
    args = outs + ins + ["_a", "_b", "_ao", "_bo", "_m", "_n", "_k", "_w"]
    print_loop(buf, f"@cuda.jit(cache=not _GC_SIM{fm})", f"def {name}({', '.join(args)}):",
               hoisted + setup, "for _p in range(cuda.blockIdx.z, _ao.size, cuda.gridDim.z):",
               batch)
    return buf.getvalue()
