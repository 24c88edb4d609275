"""The CUDA part of a generated module: wrappers, run time, kernel table.

:class:`CudaWrapperPrinter` prints a method's host wrapper for ``NAME.cuda``
from the same kernel plan as the CPU wrapper: it only names the CUDA
helpers (``_gc_*``, :mod:`gradc.codegen.runtime_cuda_src`), launches the
CUDA kernels (:mod:`gradc.codegen.cuda`) and lowers library steps to the
run time's device routines.  Every method takes ``stream=`` (a Numba CUDA
stream, or 0 for the default stream) after ``out=``.
"""
from __future__ import annotations

from gradc.codegen import runtime_cuda_src as rt
from gradc.codegen.runtime import runtime_objects, source_of
from gradc.codegen.wrappers import Kernels, WrapperPrinter
from gradc.errors import CodegenError
from gradc.ir.primitives import PRIMITIVES
from gradc.passes.fuse import Kernel, MatmulEpilogue, attach_epilogues, recompute_residuals
from gradc.passes.fuse_reduce import ReduceKernel, fuse_reductions
from gradc.passes.loop_ir import CUDA, lower, splits


class CudaWrapperPrinter(WrapperPrinter):
    prefix = "_gc_"
    extra_kw = (("stream", "0"),)
    label = ".cuda"
    host_fast_paths = False    # device arrays and streams: _gc_ helpers throughout
    rows_min = 0               # a row plan whenever the arguments fit one: fewer launches

    def _empty(self, dtype: str, shape: str = "_s") -> str:
        return f"_gc_empty({shape}, {dtype}, stream)"

    def loop_forms(self, step: ReduceKernel) -> list:
        return [lower(self.graph, step, CUDA)]

    @staticmethod
    def lower_plan(plan):
        """Reductions fused with the loops around them into reduce kernels
        (:func:`~gradc.passes.fuse_reduce.fuse_reductions`, printed by
        :mod:`gradc.codegen.cuda_reduce`), cheap residuals recomputed where they are
        read (as on the CPU); then a matmul whose product an elementwise kernel reads
        next runs that kernel's body as its epilogue (one kernel, the product never
        stored unless needed).  Other reductions are the run time's row-reduction
        kernels."""
        return attach_epilogues(recompute_residuals(fuse_reductions(plan)))

    def _launch(self, name: str, args: list[str], step: Kernel) -> str:
        if isinstance(step, MatmulEpilogue):
            return f"_gc_launch_matmul({name}, stream, _mm, {', '.join(args + ['_a', '_b'])})"
        return f"_gc_launch({name}, stream, {', '.join(args + ['_gc_witness(_T)'])})"

    def _shape_line(self, step: Kernel) -> str:
        if isinstance(step, MatmulEpilogue):
            x, y = (self._value(a) for a in step.inputs[-2:])
            return f"_a, _b, _mm, _s = _gc_matmul_operands({x}, {y}, stream)"
        return super()._shape_line(step)

    def _loop_inputs(self, step: Kernel) -> tuple[int, ...]:
        if isinstance(step, MatmulEpilogue):
            return tuple(i for i in step.epilogue.inputs if i != step.matmul)
        return step.inputs

    grid_names = "_R, _N, _C, _Y, _NS"

    def _rows_call(self, step: ReduceKernel, empty: str | None, cols: bool) -> str:
        """``_R, _N``, the blocks ``_C`` of a reduce kernel, the rows ``_Y`` a block
        takes at a time and the segments ``_NS`` of its split rows (``_gc_row_grid``)."""
        split = ", _GC_SPLIT" if splits(self.graph, step) else ""
        return f"_gc_row_grid(_n, _s, {step.split}, {empty!r}, {cols!r}, {step.flat!r}{split})"

    def _partials(self, shape: str, nid: int, gathered: bool, into: str | None = None) -> str:
        return f"_gc_scratch({shape}, stream, {nid})"     # kept between calls

    def _gathered_into(self, step: ReduceKernel, nid: int) -> str | None:
        return None                         # partials stay the device's scratch

    def _partials_arg(self, var: str) -> str:
        return f"{var}.reshape(-1)"          # the kernels take flat arrays

    def _reduce_launch(self, name: str, args: list[str], step: ReduceKernel) -> list[str]:
        rows = f"_gc_launch_rows({name}, stream, _C, _Y, {', '.join(args + ['_R', '_N', '_gc_witness(_T)'])})"
        if not splits(self.graph, step):
            return [rows]
        split = f"{name}_split(stream, _NS, _C, {', '.join(args)}, _R, _N, _gc_witness(_T))"
        return ["if _NS:", f"    {split}", "else:", f"    {rows}"]

    def _inplace_pairs(self, inputs: list[int]) -> tuple[tuple[int, int], ...]:
        """No out= may be an input's array where a fused matmul reads its operands
        while it writes its results (a conservative rule: none at all then)."""
        if any(isinstance(s, MatmulEpilogue) for s in self.plan.steps):
            return ()
        return super()._inplace_pairs(inputs)

    def _library_text(self, node, fields: dict[str, str]) -> str:
        """The primitive's call on device arrays (its ``cuda`` template)."""
        prim = PRIMITIVES[node.op]
        if prim.cuda is None:
            raise CodegenError(f"'{node.op}' has no CUDA lowering", node.span)
        text = prim.cuda.format(**self._attrs(node), **fields)
        if node.attr("initial") is not None:     # a max or min of nothing: its initial
            text = f"{text[:-1]}, empty_ok=True)"
        return text


_CONSTANTS = '''\
# Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) runs each thread as a Python
# thread: small blocks there.
_GC_SIM = bool(numba.config.ENABLE_CUDASIM)
_GC_BLOCK = 8 if _GC_SIM else 256
_GC_RBLOCK = 4 if _GC_SIM else 256        # reductions (a power of 2: a tree)
_GC_WARP = 2 if _GC_SIM else 32           # a reduce kernel's threads of a short row
_GC_WARP_ROW = 4 if _GC_SIM else 1024     # rows of at most this many: a warp each
_GC_GRID_Y = 2 if _GC_SIM else 65535      # rows of a reduction: blocks stride over more
_GC_RGRID = 4 if _GC_SIM else 1024        # blocks of a reduce kernel at most (_gc_row_grid)
_GC_COLS = 64 if _GC_SIM else 1 << 20     # its float64 partial elements of columns at most
# Split rows (_gc_row_grid): calls of fewer rows than [0], of [1] elements or more, run
# each pass over segments of [2] elements or more, [3] blocks a pass or more where the
# segments allow (a block per row would leave most of a GPU idle; not measured yet).
_GC_SPLIT = (4, 16, 4, 16) if _GC_SIM else (256, 1 << 14, 1 << 13, 1 << 10)
_GC_TILE = 4 if _GC_SIM else 16
_GC_CCOLS = 4 if _GC_SIM else 32          # _gck_cols: columns by lanes of a block
_GC_CLANES = 2 if _GC_SIM else 8
_GC_SCRATCH = 32                          # partials' buffers kept between calls (_gc_scratch)
# _gck_rows: modes (map and combine) and epilogues.
_GC_SUM, _GC_PROD, _GC_MAX, _GC_MIN, _GC_SUMEXP, _GC_SUMSQ, _GC_MAXABS = range(7)
_GC_FIN_NONE, _GC_FIN_LSE, _GC_FIN_NORM = range(3)
# Per-process state: the device's wave of blocks, witnesses, uploaded scalars.
_GC_STATE = {}'''


def runtime_source() -> str:
    """The CUDA run time as module text: constants, device functions
    (``_gcd_``) and kernels (``_gck_``) under ``@cuda.jit``, host helpers."""
    from gradc.codegen.cuda import render_cuda_matmul, unroll_factor

    parts = [_CONSTANTS + "\n# Elements a thread of the generated kernels loads per iteration "
             f"(GRADC_CUDA_UNROLL when compiled).\n_GC_UNROLL = {unroll_factor()}"]
    for fn in runtime_objects(rt, ("_gcd_",)):
        parts.append("@cuda.jit(device=True, inline=True)\n" + source_of(fn))
    for kernel in runtime_objects(rt, ("_gck_",)):
        parts.append("@cuda.jit(cache=not _GC_SIM)\n" + source_of(kernel))
    parts.append(render_cuda_matmul(None, None, "_gck_matmul").rstrip("\n"))
    for kernel in registry_kernels():
        parts.append("@cuda.jit(cache=not _GC_SIM)\n" + source_of(kernel))
    helpers = runtime_objects(rt, ("_gc_",))
    helpers += dict.fromkeys(fn for p in PRIMITIVES.values() for fn in p.cuda_helpers)
    parts += [source_of(fn) for fn in helpers]
    parts.append("# The kernels' math: libdevice through Numba's math; Python's with CUDA's "
                 "results in the simulator\n_gcm = _gc_sim_math() if _GC_SIM else math")
    return "\n\n\n".join(parts) + "\n"


def registry_kernels() -> list:
    """The CUDA kernels of the registry's primitives (their lowerings' own)."""
    return list(dict.fromkeys(k for p in PRIMITIVES.values() for k, _ in p.cuda_kernels))


def kernel_table(kernels: Kernels) -> str:
    """``CUDA_KERNELS``: each generated kernel and the dtypes of its arguments
    ("T" is the compute dtype, "f64" float64, "n" an int64 scalar; arrays are
    flat), for ahead-of-time checks such as compiling every kernel to PTX (the
    witness ``_w`` is not listed)."""
    rows = "".join(f"    {name!r}: ({name}, {dts!r}),\n" for name, dts in kernels.arg_dtypes.items())
    return "CUDA_KERNELS = {\n" + rows + "}\n"
