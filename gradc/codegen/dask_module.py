"""The Dask wrappers of the generated module: ``NAME.dask.<method>``.

``_GradcOp`` sends a call with a Dask array among its arguments here (the
in-memory checks see it and raise ``_GradcDask`` before any work).  The
wrapper is the CPU wrapper's text over the op's fused plan *before* the CPU
lowering (:func:`gradc.passes.fuse_reduce.cpu_plan` fuses reductions into row
loops that need whole rows in memory): each elementwise kernel step becomes
one ``blockwise`` task per chunk running that fused kernel, each library step
(reductions, ``@``, transposes, un-broadcasting) the Dask function that does
it, through the helpers of :mod:`gradc.codegen.runtime_dask_src`.  Nothing is
computed until the caller computes the results (docs/dask.md).
"""
from __future__ import annotations

import inspect

from gradc.codegen.cpu import is_scalar_input
from gradc.codegen.wrappers import OUT_DTYPE, WrapperPrinter
from gradc.errors import CodegenError
from gradc.ir.primitives import PRIMITIVES
from gradc.passes.fuse import Kernel, KernelPlan


class DaskWrapperPrinter(WrapperPrinter):
    """Prints the Dask wrapper of one method: the CPU wrapper's checks (on
    stand-ins that hold no data) and steps, each step a lazy Dask operation."""

    prefix = "_gd_"
    host_fast_paths = False    # lazy arrays: _gd_ helpers throughout

    @staticmethod
    def lower_plan(plan: KernelPlan) -> KernelPlan:
        """The fused plan as planned: elementwise kernels and library calls."""
        return plan

    def _kernel(self, step: Kernel, k: int) -> None:
        g, b = self.graph, self.buf
        name = self.kernels.add(g, step, f"{self.kernel_base}_{k}", self._comments(step))
        b.line(self._shape_line(step))
        rows = self.kernels.rows(g, step)
        values = [self._value(i) for i in step.inputs]
        for nid in step.outputs:
            self.vars[nid] = f"_v{nid}"
        outs = "".join(f"_v{nid}, " for nid in step.outputs)
        dtypes = ", ".join(OUT_DTYPE[g.node(nid).dtype] for nid in step.outputs)
        likes = [self.vars[d] for d in sorted(step.shape.dyn) if d in self.vars]
        b.line(f"({outs}) = _gd_kernel(_n, {name!r}, _s, ({self._tuple(values)}), "
               f"{tuple(rows.get(i, 0) for i in step.inputs)!r}, "
               f"{tuple(is_scalar_input(g, i) for i in step.inputs)!r}, "
               f"({dtypes},), _T, ({self._tuple(likes)}))")

    @staticmethod
    def _tuple(items: list[str]) -> str:
        return "".join(f"{x}, " for x in items)

    def _library_text(self, node, fields: dict[str, str]) -> str:
        """The primitive's own Dask function (``Primitive.dask``) of the operands."""
        prim = PRIMITIVES[node.op]
        if prim.dask is None:
            raise CodegenError(f"'{node.op}' has no Dask lowering", node.span)
        kw = "".join(f", {k}={v!r}" for k, v in self._attrs(node).items())
        kw += ", empty_ok=True" if node.attr("initial") is not None else ""
        if "op" in inspect.signature(prim.dask).parameters:    # it raises when computed
            kw += ", op=_n"
        return f"{prim.dask.__name__}(_T{''.join(', ' + v for v in fields.values())}{kw})"
