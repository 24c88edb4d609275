"""The generated module: header, helpers, kernels, wrappers, ``OPS``.

The module imports only numpy and numba, never gradc; its text is
deterministic (same input, same bytes).  For each op and each method
(``forward``, ``vjp``, ``fwd_bwd``, ``jvp``), fused and unfused, it holds a host
wrapper that validates arguments, allocates or checks ``out=`` buffers,
runs the plan's steps (Numba kernels and NumPy library calls) and returns
the results (printed by :mod:`gradc.codegen.wrappers`, and for the CUDA and Dask
targets by :mod:`gradc.codegen.cuda_module` and :mod:`gradc.codegen.dask_module`).
:func:`compile_program` is the whole way from a checked program to that text.
"""
from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from gradc.codegen import mathlib, runtime_dask_src, runtime_src
from gradc.codegen.quote import comment, docstring, py_name
from gradc.codegen.runtime import runtime_objects, source_of
from gradc.codegen.wrappers import Kernels, WrapperPrinter
from gradc.errors import GradcWarning, Span
from gradc.frontend.limits import out_of_stack
from gradc.ir.primitives import PRIMITIVES
from gradc.passes.loop_ir import ONLINE_AGAIN, ONLINE_ROWS, PREFETCH_ROWS, SPLIT, SPLIT_COLS
from gradc.pipeline import METHODS, CompiledOp, build_program, issue_warnings
from gradc.version import __version__


def param_text(p) -> str:
    """A parameter (a :class:`~gradc.ir.lower.ParamInfo`) as .grad source: ``x``,
    ``w1: f32[i, h]``, ``alpha: nograd = 0.01``."""
    t = (p.dtype or "") + (f"[{', '.join(map(str, p.shape))}]" if p.shape else "")
    if not p.differentiable and p.dtype not in ("i32", "i64", "bool"):
        t = ("nograd " + t).strip()
    return p.name + (f": {t}" if t else "") + (f" = {p.default!r}" if p.has_default else "")


def signature_text(cop: CompiledOp) -> str:
    """The op's signature as .grad source: ``(x, w: f32[n]) -> y``."""
    parts = [param_text(p) for p in cop.params]
    outs = cop.op.outputs
    ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    return f"({', '.join(parts)}) -> {ret}"


def render_op(cop: CompiledOp, kernels: Kernels | None, cuda_kernels: Kernels | None = None
              ) -> str:
    """The wrappers of one op, as functions in a namespace class named after it
    (so Python's own argument errors read ``scaled_tanh.vjp() missing ...``),
    then the op object, which takes over the name.  ``kernels`` collects the
    CPU kernels (None: no CPU target), ``cuda_kernels`` the CUDA ones (None: no
    CUDA target); the CUDA wrappers live in the nested class ``cuda``."""
    from gradc.codegen.cuda_module import CudaWrapperPrinter
    from gradc.codegen.dask_module import DaskWrapperPrinter

    name = py_name(cop.op.name)
    sig = _signature(cop)
    out = [f"_SIG_{name} = {sig!r}\n_SPEC_{name} = {cop.op.source!r}\n",
           f"class {name}:\n    \"\"\"The wrappers of op {cop.op.name}; the name is rebound "
           f"to the op below.\"\"\"\n"]
    targets = [(k, printer, ns, depth, variants) for k, printer, ns, depth, variants in (
        (kernels, WrapperPrinter, "", 1, ("fused", "unfused")),
        (kernels, DaskWrapperPrinter, "dask", 2, ("fused",)),     # kernels: the CPU ones
        (cuda_kernels, CudaWrapperPrinter, "cuda", 2, ("fused", "unfused")))
        if k is not None]
    # the row plans' wrappers (gradc.passes.row_plan), which the fused CPU and CUDA
    # ones call
    rows = [(kernels, WrapperPrinter, "r"), (cuda_kernels, CudaWrapperPrinter, "cr")]
    in_place = {}       # wrapper name -> the (out, input) pairs it allows in place
    for i, variant in enumerate(cop.rows if kernels or cuda_kernels else ()):
        out.insert(-1, f"_SIG_gr{i}_{name} = {_signature(variant.cop)!r}\n")
        for kset, printer, tag in rows:
            for m in (m for m in METHODS if m in cop.methods and kset is not None):
                w = printer(variant.cop, variant.cop.methods[m], variant.cop.methods[m].fused,
                            kset, f"_g{tag}{i}_{name}_{m}", f"_g{tag}k{i}_{name}_{m}")
                w.sig, w.row_plan = f"_SIG_gr{i}_{name}", True
                out.insert(-1, w.render())
                in_place[w.fn_name] = w.inplace_pairs
    for kset, printer, ns, depth, variants in targets:
        if ns:
            out.append(f"    class {ns}:\n")
        for variant in variants:
            if variant == "unfused":
                out.append("    " * depth + "class unfused:\n")
            pad = "    " * (depth + (variant == "unfused"))
            for m in (m for m in METHODS if m in cop.methods):
                method = cop.methods[m]
                plan = method.fused if variant == "fused" else method.unfused
                base = f"_g{'' if ns == 'dask' else ns[:1]}k_{name}_{m}"
                w = printer(cop, method, plan, kset, m, base)
                w.label += ".unfused" if variant == "unfused" else ""   # in its errors
                if ns != "dask" and variant == "fused":
                    tag = "cr" if ns == "cuda" else "r"
                    w.rows = [(v, f"_g{tag}{i}_{name}_{m}", in_place[f"_g{tag}{i}_{name}_{m}"])
                              for i, v in enumerate(cop.rows)]
                out.append("".join(pad + line if line else line
                                   for line in w.render().splitlines(keepends=True)))
    methods = lambda ns: "{" + ", ".join(f"{m!r}: {ns}.{m}" for m in METHODS
                                         if m in cop.methods) + "}"
    sig_text = signature_text(cop)
    # Keyword-only parameters whose Python name differs: the op renames them.
    renamed = {p.name: py_name(p.name) for p in cop.params
               if p.has_default and py_name(p.name) != p.name}
    kw = f", keywords={renamed!r}" if renamed else ""
    # Methods this op cannot have (jvp through a nonlinear grad block): the error.
    kw += f", missing={cop.missing!r}" if cop.missing else ""
    dask = f", dask={methods(name + '.dask')}" if kernels is not None else ""

    def op(ns: str | None, extra: str = "") -> str:
        if ns is None:
            note = ", note='this module was compiled with --target cuda only: use .cuda'"
            return (f"_GradcOp({cop.op.name!r}, _SPEC_{name}, {sig_text!r}, {{}}{note},\n"
                    f"    unfused=_GradcOp({cop.op.name!r}, _SPEC_{name}, {sig_text!r}, "
                    f"{{}}{note}){extra})")
        return (f"_GradcOp({cop.op.name!r}, _SPEC_{name}, {sig_text!r}, {methods(ns)}{kw}"
                f"{dask if ns == name else ''},\n"
                f"    unfused=_GradcOp({cop.op.name!r}, _SPEC_{name}, "
                f"{sig_text!r}, {methods(ns + '.unfused')}{kw}){extra})")

    cuda = f",\n    cuda={op(name + '.cuda')}" if cuda_kernels is not None else ""
    out.append(f"{name} = {op(name if kernels is not None else None, cuda)}\n")
    return "\n".join(out)


def _signature(cop) -> tuple:
    """What ``_g_inputs`` checks of each parameter: ``(name, dtype, dims)``."""
    return tuple((p.name, p.dtype if p.dtype else None, p.shape) for p in cop.params)


def render_unsupported(name: str, message: str) -> str:
    var = py_name(name)
    return (f"{var} = _GradcOp({name!r}, '', '', {{}}, note={message!r})\n"
            f"{var}.unfused = {var}\n")


def render_module(file: str, source_sha: str, version: str, compiled: dict,
                  *, fast_math: bool = False, precise: bool = False,
                  target: str = "cpu") -> str:
    """The whole module text for ``compiled`` (op name -> CompiledOp or error message);
    ``precise`` makes the kernels' math library call libm for every function;
    ``target`` is "cpu", "cuda" or "all" (CUDA kernels need numba-cuda to run,
    not to be written)."""
    from gradc.codegen import cuda_module

    kernels = Kernels(fast_math) if target in ("cpu", "all") else None
    cuda_kernels = Kernels(fast_math, "cuda") if target in ("cuda", "all") else None
    op_texts = []
    for name, cop in compiled.items():
        if isinstance(cop, CompiledOp):
            op_texts.append(f"# {'=' * 70}\n# {comment(f'op {name} ({cop.op.span})')}\n\n"
                            + render_op(cop, kernels, cuda_kernels))
        else:
            op_texts.append(f"# op {name}: not available\n" + render_unsupported(name, cop))
    cpu_sources = kernels.sources if kernels is not None else []
    lib = mathlib.library_source(mathlib.used_functions("".join(cpu_sources)), precise=precise)
    helpers = "\n\n\n".join([*(source_of(obj) for obj in _HELPERS), *([lib] if lib else [])])
    names = sorted(compiled)
    # Line 1 names the encoding, so that Python never reads one from line 2, which
    # holds the file name (a name like 'coding=utf-16 x.grad' would decide it there).
    head = ("# -*- coding: utf-8 -*-\n"
            f"# Generated by gradc {version} from {comment(file)}. Do not edit: edit the .grad "
            f"file\n# and recompile.\n"
            f'"""Kernels compiled by gradc from {docstring(file)}.\n\n'
            f'Ops: {", ".join(names)}.\n"""\n'
            "import ctypes\nimport functools\nimport inspect\nimport math\nimport os\n"
            "import site\nimport sys\n"
            + ("import threading\n" if cuda_kernels is not None else "")
            + "\nimport numba\nimport numba.extending\nimport numpy as np\n"
            + ("from numba import cuda\n" if cuda_kernels is not None else "") + "\n"
            f"__gradc_version__ = {version!r}\nSOURCE_SHA256 = {source_sha!r}\n"
            f"TARGET = {target!r}\n")
    tail = ("OPS = {" + ", ".join(f"{n!r}: {py_name(n)}" for n in names) + "}\n"
            f"__all__ = {['OPS', *map(py_name, names)]!r}\n")
    parts = [head, RUNTIME_MARK, _CONSTANTS, helpers,
             _PARALLEL_MIN, GENERATED_MARK, *cpu_sources]
    if cuda_kernels is not None:
        parts += [CUDA_RUNTIME_MARK, cuda_module.runtime_source(),
                  "# --- CUDA kernels ---\n", *cuda_kernels.sources,
                  cuda_module.kernel_table(cuda_kernels)]
    parts += ["# --- ops ---\n", *op_texts, tail]
    return "\n\n".join(p.rstrip("\n") + "\n" for p in parts)


# The CPU and Dask run time (gradc.codegen.runtime), then the run-time functions of the
# registry's primitives (their CPU and Dask lowerings, their run-time shapes).
_HELPERS = (*runtime_objects(runtime_src, ("_g_", "_Gradc")),
            *runtime_objects(runtime_dask_src, ("_gd_",)),
            *dict.fromkeys(fn for p in PRIMITIVES.values()
                           for fn in (*p.helpers, p.np_shape, p.dask) if fn))
_CONSTANTS = ("_G_FLOATS = {'f16': np.float16, 'f32': np.float32, 'f64': np.float64}\n"
              "_G_INTS = {'i32': np.int32, 'i64': np.int64, 'bool': np.bool_}\n"
              "# An empty array per compute dtype: kernels read their dtype from it.\n"
              "_G_WITNESS = {t: np.empty(0, t) for t in (np.float32, np.float64)}\n"
              "# The native float dtypes: wrappers' fast paths compare dtypes by identity.\n"
              "_G_F32, _G_F64 = np.dtype(np.float32), np.dtype(np.float64)\n"
              "# The draw offset of a loop over whole arrays (a Dask chunk's is its own).\n"
              "_G_NO_OFFSET = np.zeros((), np.int64)\n"
              "# Loops of rows of fewer elements copy an input that holds one row to the\n"
              "# loop's size first rather than read it per row (_g_broadcast_rows).\n"
              "_G_BROADCAST_ROW = 64\n")


_PARALLEL_MIN = ("# Loops of fewer elements run on one thread (waking threads costs more there).\n"
                 "_G_PARALLEL_MIN = _g_env_count('GRADC_PARALLEL_MIN',\n"
                 "                               os.environ.get('GRADC_PARALLEL_MIN'), 1 << 17)\n"
                 "# Calls of fewer elements run the generic plan, not a row plan (_g_row_shape).\n"
                 "_G_ROWS_MIN = _g_env_count('GRADC_ROWS_MIN', os.environ.get('GRADC_ROWS_MIN'), "
                 "1 << 12)\n"
                 "# Calls of fewer rows than [0], of [1] elements or more, split each row into\n"
                 "# segments of [2] or more, run in parallel (_g_rows).\n"
                 f"_G_SPLIT = {SPLIT!r}\n"
                 "# A kernel with sums across rows splits up to this many times [0] rows.\n"
                 f"_G_SPLIT_COLS = {SPLIT_COLS!r}\n"
                 "# Rows of [0] bytes or more run a kernel's online form where it has one\n"
                 "# (its sums of exp(x - max(x)) in the pass of the max: a pass fewer); of\n"
                 "# [1] or more where that form computes an exp again (more where the CPU\n"
                 "# has no 512-bit vectors, _g_wide_vectors).\n"
                 f"_G_ONLINE = ({ONLINE_ROWS!r}, {ONLINE_AGAIN[0]!r} "
                 f"if _g_wide_vectors(numba.config) else {ONLINE_AGAIN[1]!r})\n"
                 "# A reduce kernel prefetches the next row on rows of more than [0] bytes\n"
                 "# (fewer where the CPU has no 512-bit vectors) and at most [1].\n"
                 f"_G_PREFETCH = ({PREFETCH_ROWS[0][0]!r} if _g_wide_vectors(numba.config) "
                 f"else {PREFETCH_ROWS[0][1]!r}, {PREFETCH_ROWS[1]!r})\n"
                 "# Numba's TBB threading layer unless the user chose one (_g_numba_threads):\n"
                 "# OpenMP's spinning workers would slow PyTorch, JAX and BLAS after each loop.\n"
                 "_G_THREADING = _g_numba_threads(os.environ, numba.config)\n")


# The sections of a module: the run time copied from gradc (the same in every module,
# tested as the code it is, tests/codegen) and what is generated for the .grad file.
RUNTIME_MARK = "# --- runtime helpers (copied from gradc) ---\n"
GENERATED_MARK = "# --- kernels ---\n"
CUDA_RUNTIME_MARK = "# --- CUDA run time (copied from gradc) ---\n"


def generated_part(text: str) -> str:
    """``text`` (a generated module) without the run time copied from gradc: the
    header and what is generated for the ops, the part a golden file pins down."""
    head, _, rest = text.partition(RUNTIME_MARK)
    _, _, generated = rest.partition(GENERATED_MARK)
    return head + "# [run time copied from gradc: left out]\n\n\n" + GENERATED_MARK + generated


def source_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def program_sha256(program) -> str:
    """The ``SOURCE_SHA256`` of the module compiled from the checked ``program``: of
    its main text followed by every imported file's text (``program.sources``)."""
    return source_sha256("\n\0\n".join(program.sources))


def compile_program(program, file: str, *, target: str = "cpu", fuse: bool = True,
                    fast_math: bool = False, precise: bool = False, check: bool = False) -> str:
    """:func:`gradc.compile_source` of a checked program (the texts it was checked from:
    ``program.sources``, read from disk once, for :func:`gradc.load`'s cache key too).
    The compiler's warnings are issued as the caller of ``compile_source`` would get them."""
    try:
        compiled = build_program(program, check=check, fuse=fuse)
    except RecursionError:
        raise out_of_stack(file) from None
    issue_warnings(compiled, 4)                 # compile_source's caller
    if not program.main_ops:                    # an empty file, or imports only
        warnings.warn(GradcWarning(f"{Path(file).name} defines no op: the module has none",
                                   Span(file, 1, 1), "W101",
                                   ["an op is 'op NAME(PARAMS) -> OUTPUTS { ... }'; the ops "
                                    "of an imported file are not the module's"]),
                      stacklevel=3)
    return render_module(Path(file).name, program_sha256(program), __version__, compiled,
                         fast_math=fast_math, precise=precise, target=target)
