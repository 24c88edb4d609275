"""CPU backend: one ``@numba.njit(parallel=True)`` loop per kernel of the plan.

A kernel reads its inputs and writes its outputs as flat contiguous arrays
(the host wrapper flattens, broadcasts and validates them), loops over the
flat index with ``numba.prange``, and computes every fused node in registers.
``error_model="numpy"`` keeps division checks out of the loop (they block
vectorisation); fast-math is opt-in and never includes ``nnan``/``ninf``
(they would delete NaN guards and ``-inf`` sentinels) or ``reassoc``.
"""
from __future__ import annotations

from dataclasses import dataclass

from gradc.codegen.printer import IndentedBuffer, Printer
from gradc.codegen.quote import comment
from gradc.ir.graph import Graph
from gradc.passes.fuse import Kernel

# LLVM's fast-math flags of --fast-math, and the fastmath= text of an elementwise kernel.
FAST_MATH_FLAGS = ("nsz", "contract")
FAST_MATH = "{" + ", ".join(f'"{f}"' for f in FAST_MATH_FLAGS) + "}"


class CpuPrinter(Printer):
    backend = "cpu"


def render_kernel(graph: Graph, kernel: Kernel, name: str, *, fast_math: bool = False,
                  comments: tuple[str, ...] = ()) -> str:
    """Source of the Numba kernels ``name`` (parallel) and ``name_serial`` computing
    ``kernel``.

    Signature: ``name(*outputs, *inputs, _w)``; every array is 1-D with the
    kernel's flat size, except the :func:`row_inputs` (a bias), which have the
    flat size of their own shape and are read at the column index of a loop over
    rows; ``_w`` is an empty array of the float compute dtype,
    whose ``dtype.type`` the kernel binds to ``_T`` (``np.float32``...).  Passing
    the dtype class itself would cost ~6 us per call in Numba's dispatcher
    (classes take its slow typing path; arrays take the fast one).
    The serial twin runs small loops, where waking threads costs more than the
    loop (and where OpenMP threads would fight BLAS's for the cores); Numba
    compiles each only when first called.
    """
    rows = row_inputs(graph, kernel)
    element = loop_body(graph, kernel, rows=rows or None)
    hoisted, body = element.hoisted, element.lines()
    outs = [f"_o{k}" for k in range(len(kernel.outputs))]
    ins = [f"_i{k}" for k in range(len(kernel.inputs))]
    params = ", ".join(outs + ins + ["_w"])
    fm = f", fastmath={FAST_MATH}" if fast_math else ""
    loop = f"for _i in numba.prange({outs[0]}.size):"
    if rows:
        # Rows of _n elements; each full-size array through its row's slice (an
        # index computed from _r and _c kept LLVM from vectorising the threaded loop).
        hoisted = hoisted + [f"_n = _i{kernel.inputs.index(min(rows))}.size"]
        loop = f"for _r in numba.prange({outs[0]}.size // max(_n, 1)):"
        full = outs + [f"_i{k}" for k, i in enumerate(kernel.inputs)
                       if i not in rows and not is_scalar_input(graph, i)]
        body = ["_lo = _r * _n", *(f"{a}r = {a}[_lo:_lo + _n]" for a in full),
                "for _c in range(_n):", *("    " + b for b in body)]
    buf = IndentedBuffer()
    for c in comments:
        buf.line(f"# {comment(c)}")
    # The serial loop releases the GIL: Dask's threads run it on several chunks at once.
    for suffix, par in (("", "parallel=True, "), ("_serial", "nogil=True, ")):
        print_loop(buf, f'@numba.njit({par}cache=True, error_model="numpy"{fm})',
                   f"def {name}{suffix}({params}):", hoisted, loop, body)
        buf.line()
    if broadcast_rows(graph, kernel):
        _broadcast_kernels(buf, graph, kernel, name, fm)
    return buf.getvalue().rstrip("\n") + "\n"


def _broadcast_kernels(buf: IndentedBuffer, graph: Graph, kernel: Kernel, name: str,
                       fm: str) -> None:
    """``name_rows`` and ``name_rows_serial`` (:func:`broadcast_rows`): the loop over
    rows of ``_n`` elements, the ``j``-th array input's row ``_r`` at ``_st[j] * _r``
    (``_st[j]``: ``_n`` for an input of the loop's shape, 0 for one row that every row
    reads: a bias), each array through its row's view."""
    element = loop_body(graph, kernel, rows={})
    outs = [f"_o{k}" for k in range(len(kernel.outputs))]
    ins = [f"_i{k}" for k in range(len(kernel.inputs))]
    arrays = [f"_i{k}" for k, i in enumerate(kernel.inputs) if not is_scalar_input(graph, i)]
    body = ["_lo = _r * _n", *(f"{a}r = _g_view({a}, _lo, _lo + _n)" for a in outs),
            *(f"{a}r = _g_view({a}, _st[{j}] * _r, _st[{j}] * _r + _n)"
              for j, a in enumerate(arrays)),
            "for _c in range(_n):", *("    " + b for b in element.lines())]
    loop = f"for _r in numba.prange({outs[0]}.size // max(_n, 1)):"
    params = ", ".join(outs + ins + ["_n", "_st", "_w"])
    for suffix, par in (("_rows", "parallel=True, "), ("_rows_serial", "nogil=True, ")):
        print_loop(buf, f'@numba.njit({par}cache=True, error_model="numpy"{fm})',
                   f"def {name}{suffix}({params}):", element.hoisted, loop, body)
        buf.line()


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


@dataclass
class LoopBody:
    """One element's work in a kernel's loop, in parts a schedule can reorder:
    ``hoisted`` runs once before the loop (scalar inputs), then per element the
    ``loads`` (``local = array[index]``), the ``compute`` statements, and the
    ``stores`` (``array[index] = local``)."""

    hoisted: list[str]
    loads: list[tuple[str, str, str]]        # (local, array, index)
    compute: list[str]
    stores: list[tuple[str, str, str]]       # (array, index, local)

    def load_lines(self) -> list[str]:
        return [f"{local} = {array}[{index}]" for local, array, index in self.loads]

    def store_lines(self) -> list[str]:
        return [f"{array}[{index}] = {local}" for array, index, local in self.stores]

    def lines(self) -> list[str]:
        """The loop's statements: loads, compute, stores."""
        return self.load_lines() + self.compute + self.store_lines()


def loop_body(graph: Graph, kernel: Kernel, printer: type[Printer] = CpuPrinter,
              rows: dict[int, int] | None = None, index: str = "_i",
              suffix: str = "") -> LoopBody:
    """The :class:`LoopBody` of ``kernel``: scalar inputs hoisted (read once: a
    1-element array keeps the loop vectorisable, a stride-0 view would not),
    elements read and written at the flat index ``index``; ``printer`` renders
    the nodes (one per backend).  ``suffix`` is appended to the locals of the
    element (``a0_1``, ``v3_1``: a second element of an unrolled loop) but not to
    the hoisted ones.  With ``rows`` (:func:`row_inputs`), the body of the loop
    over the columns ``_c`` of one row: those inputs at ``_c``, the other arrays
    through their row's slices ``_i0r``, ``_o0r``..."""
    names: dict[int, str] = {}
    body = LoopBody([], [], [], [])

    def at(a: str, nid: int | None = None) -> tuple[str, str]:
        if rows is None:
            return a, index
        return (a, "_c") if nid in rows else (f"{a}r", "_c")

    for k, nid in enumerate(kernel.inputs):
        if is_scalar_input(graph, nid):
            names[nid] = f"a{k}"
            body.hoisted.append(f"a{k} = _i{k}[0]")
        else:
            names[nid] = f"a{k}{suffix}"
            body.loads.append((names[nid], *at(f"_i{k}", nid)))
    printer = printer(graph, names, index if rows is None else "(_lo + _c)")
    for k, nid in enumerate(kernel.nodes):
        body.compute += printer.lines(nid, f"v{k}{suffix}")
        names[nid] = f"v{k}{suffix}"
    for k, nid in enumerate(kernel.outputs):
        body.stores.append((*at(f"_o{k}"), names[nid]))
    return body


def row_inputs(graph: Graph, kernel: Kernel) -> dict[int, int]:
    """Inputs read once per row rather than broadcast to the loop's size first:
    input id -> ``k``, where the input's shape is the last ``k`` dims of the
    loop's (a bias ``b: f32[h]`` in a loop over ``(n, h)``), known at compile
    time (after leading 1s: ``c: f32[1, h]`` too).  The wrapper passes them as they
    are and the loop runs over rows of the last ``k`` dims.  One ``k`` per kernel: the
    one most inputs have (the others are broadcast by the wrapper; inputs of run-time
    shapes: :func:`broadcast_rows`)."""
    dims = kernel.shape.static
    if kernel.shape.dyn:
        return {}
    fits = {}
    for nid in kernel.inputs:
        shape = graph.node(nid).shape
        row = shape.static
        while row and row[0] == 1:          # c: [1, k] is the row c: [k]
            row = row[1:]
        k = len(row)
        if not shape.dyn and not shape.is_scalar and 0 < k < len(dims) and \
                row == dims[len(dims) - k:]:
            fits[nid] = k
    if not fits:
        return {}
    counts = list(fits.values())
    best = max(counts, key=lambda k: (counts.count(k), k))
    return {n: k for n, k in fits.items() if k == best}


def broadcast_rows(graph: Graph, kernel: Kernel) -> bool:
    """Whether a CPU loop of a run-time shape also runs as rows, its inputs that hold
    one row read per row rather than broadcast to the loop's size first (a bias ``b``
    of shape ``(k,)`` or ``(1, k)`` added to ``x`` of ``(n, k)``: ``name_rows``; the
    wrapper decides by the arguments' shapes, ``_g_broadcast_rows``): a loop of no
    static shape with two array inputs or more, one of them of a shape that may not be
    the loop's (``x * b``, where ``tanh(x) * dy`` has ``dy`` of ``x``'s shape)."""
    arrays = [i for i in kernel.inputs if not is_scalar_input(graph, i)]
    return bool(kernel.shape.dyn) and len(arrays) >= 2 and type(kernel) is Kernel and \
        any(graph.node(i).shape != kernel.shape for i in arrays)


def is_scalar_input(graph: Graph, nid: int) -> bool:
    """A kernel input known to hold one element (a 0-d parameter, a full reduction)."""
    return graph.node(nid).shape.is_scalar
