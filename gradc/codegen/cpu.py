"""CPU backend: one ``@numba.njit(parallel=True)`` loop per kernel of the plan.

A kernel reads its inputs and writes its outputs as flat contiguous arrays
(the host wrapper flattens, broadcasts and validates them), loops over the
flat index with ``numba.prange``, and computes every fused node in registers.
``error_model="numpy"`` keeps division checks out of the loop (they block
vectorisation); fast-math is opt-in and never includes ``nnan``/``ninf``
(they would delete NaN guards and ``-inf`` sentinels) or ``reassoc``.
"""
from __future__ import annotations

from gradc.codegen.printer import IndentedBuffer, Printer
from gradc.codegen.quote import comment
from gradc.ir.graph import Graph
from gradc.passes.fuse import Kernel

FAST_MATH = '{"nsz", "arcp", "contract", "afn"}'


class CpuPrinter(Printer):
    backend = "cpu"


def render_kernel(graph: Graph, kernel: Kernel, name: str, *, fast_math: bool = False,
                  comments: tuple[str, ...] = ()) -> str:
    """Source of the Numba kernels ``name`` (parallel) and ``name_serial`` computing
    ``kernel``.

    Signature: ``name(*outputs, *inputs, _w)``; every array is 1-D with the
    kernel's flat size; ``_w`` is an empty array of the float compute dtype,
    whose ``dtype.type`` the kernel binds to ``_T`` (``np.float32``...).  Passing
    the dtype class itself would cost ~6 us per call in Numba's dispatcher
    (classes take its slow typing path; arrays take the fast one).
    The serial twin runs small loops, where waking threads costs more than the
    loop (and where OpenMP threads would fight BLAS's for the cores); Numba
    compiles each only when first called.
    """
    hoisted, body = loop_body(graph, kernel)
    outs = [f"_o{k}" for k in range(len(kernel.outputs))]
    ins = [f"_i{k}" for k in range(len(kernel.inputs))]
    params = ", ".join(outs + ins + ["_w"])
    fm = f", fastmath={FAST_MATH}" if fast_math else ""
    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    for suffix, par in (("", "parallel=True, "), ("_serial", "")):
        print_loop(buf, f'@numba.njit({par}cache=True, error_model="numpy"{fm})',
                   f"def {name}{suffix}({params}):", hoisted,
                   f"for _i in numba.prange({outs[0]}.size):", body)
        buf.line()
    return buf.getvalue().rstrip("\n") + "\n"


def print_loop(buf: IndentedBuffer, decorator: str, header: str, hoisted: list[str],
               loop: str, body: list[str]) -> None:
    """One kernel function: decorator, def line, the compute dtype ``_T`` from the
    witness ``_w``, the hoisted lines, then the loop over ``_i``."""
    buf.line(decorator)
    buf.line(header)
    buf.indent()
    buf.line("_T = _w.dtype.type")
    for line in hoisted:
        buf.line(line)
    buf.line(loop)
    buf.indent()
    for line in body:
        buf.line(line)
    buf.dedent()
    buf.dedent()


def loop_body(graph: Graph, kernel: Kernel, printer: type[Printer] = CpuPrinter
              ) -> tuple[list[str], list[str]]:
    """Lines before the loop (scalar inputs, read once: a 1-element array keeps
    the loop vectorisable, a stride-0 view would not) and lines of the loop,
    whose index is ``_i``; ``printer`` renders the nodes (one per backend)."""
    names: dict[int, str] = {}
    hoisted, lines = [], []
    for k, nid in enumerate(kernel.inputs):
        names[nid] = f"a{k}"
        if is_scalar_input(graph, nid):
            hoisted.append(f"a{k} = _i{k}[0]")
        else:
            lines.append(f"a{k} = _i{k}[_i]")
    printer = printer(graph, names)
    for k, nid in enumerate(kernel.nodes):
        text = printer.expr(nid)
        names[nid] = f"v{k}"
        lines.append(f"v{k} = {text}")
    for k, nid in enumerate(kernel.outputs):
        lines.append(f"_o{k}[_i] = {names[nid]}")
    return hoisted, lines


def is_scalar_input(graph: Graph, nid: int) -> bool:
    """A kernel input known to hold one element (a 0-d parameter, a full reduction)."""
    return graph.node(nid).shape.is_scalar
