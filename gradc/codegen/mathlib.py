"""The vectorisable math library of the CPU kernels, copied into generated modules.

Numba lowers ``np.exp``, ``np.log``, ``np.tanh``... to scalar libm calls (PyPI's
llvmlite has no SVML), which LLVM cannot vectorise: a fused softplus or gelu
kernel then runs at a fraction of the memory bandwidth, slower than NumPy.
Kernels therefore call ``_g_<fn>(x)``, which Numba resolves when it types the
kernel (``numba.extending.overload``): for float32 and float64 to the
straight-line implementations of :mod:`.mathlib_f32`, :mod:`.mathlib_f64` and
:mod:`.mathlib_trig`
(range reduction, minimax polynomials or rationals, exponents through bit
casts, every case computed and one selected), which LLVM vectorises once
they are inlined into the loop; for other types, and wherever :data:`FUNCTIONS`
keeps libm, to NumPy's function.  ``precise=True`` (``--precise``) resolves
every function to libm.

A function is an implementation here only where its measured error over the
whole range is within 4 ulp (float32, every float32 tested) or 2 ulp (float64,
dense samples against an extended-precision reference); the table, its
method and how to regenerate it are in docs/mathlib.md
(``python benchmarks/mathlib_errors.py``).  Special values are NumPy's: ±0
with its sign, ±inf, NaN, subnormal inputs and results, overflow at the same
thresholds.

The generated module carries the code of just the functions its kernels use
(:func:`library_source`), so it stays standalone.  The bit casts are
``@numba.extending.intrinsic`` LLVM bitcasts (:data:`INTRINSICS`); the
implementation modules define pure-NumPy stand-ins so that their functions
also run, slowly, without Numba.
"""
from __future__ import annotations

import inspect
import re

from gradc.codegen import mathlib_f32, mathlib_f64, mathlib_trig
from gradc.codegen.runtime import source_of

# name -> (libm expression in x (and y: the first and second arguments), float32
# implementation, float64 implementation).
# None keeps libm for that dtype (docs/mathlib.md says why). ``_one``/``_zero`` are
# constants of the argument's dtype. sqrt and rsqrt are not here: np.sqrt is an LLVM
# intrinsic (vsqrtps/vsqrtpd), which vectorises as it is.
FUNCTIONS = {
    "exp": ("np.exp(x)", "_g_exp_f32", "_g_exp_f64"),
    "exp2": ("np.exp2(x)", "_g_exp2_f32", "_g_exp2_f64"),
    "expm1": ("np.expm1(x)", "_g_expm1_f32", "_g_expm1_f64"),
    "log": ("np.log(x)", "_g_log_f32", "_g_log_f64"),
    "log2": ("np.log2(x)", "_g_log2_f32", "_g_log2_f64"),
    "log10": ("np.log10(x)", "_g_log10_f32", "_g_log10_f64"),
    "log1p": ("np.log1p(x)", "_g_log1p_f32", "_g_log1p_f64"),
    "tanh": ("np.tanh(x)", "_g_tanh_f32", "_g_tanh_f64"),
    "sigmoid": ("_one / (_one + np.exp(-x))", "_g_sigmoid_f32", "_g_sigmoid_f64"),
    "softplus": ("max(x, _zero) + np.log1p(np.exp(-abs(x)))", "_g_softplus_f32",
                 "_g_softplus_f64"),
    "erf": ("math.erf(x)", "_g_erf_f32", "_g_erf_f64"),
    "erfc": ("math.erfc(x)", "_g_erfc_f32", "_g_erfc_f64"),
    "sin": ("np.sin(x)", "_g_sin_f32", "_g_sin_f64"),
    "cos": ("np.cos(x)", "_g_cos_f32", "_g_cos_f64"),
    "tan": ("np.tan(x)", "_g_tan_f32", "_g_tan_f64"),
    "asin": ("np.arcsin(x)", "_g_asin_f32", "_g_asin_f64"),
    "acos": ("np.arccos(x)", "_g_acos_f32", "_g_acos_f64"),
    "atan": ("np.arctan(x)", "_g_atan_f32", "_g_atan_f64"),
    "sinh": ("np.sinh(x)", "_g_sinh_f32", "_g_sinh_f64"),
    "cosh": ("np.cosh(x)", "_g_cosh_f32", "_g_cosh_f64"),
    "atan2": ("np.arctan2(x, y)", "_g_atan2_f32", "_g_atan2_f64"),
    "pow": ("x ** y", "_g_pow_f32", "_g_pow_f64"),
}

INTRINSICS = {
    "_g_f32_bits": ("The float32 whose bits are the int32 ``i``", "float32", "int32"),
    "_g_f32_int": ("The bits of the float32 ``i`` as an int32", "int32", "float32"),
    "_g_f64_bits": ("The float64 whose bits are the int64 ``i``", "float64", "int64"),
    "_g_f64_int": ("The bits of the float64 ``i`` as an int64", "int64", "float64"),
}

_MODULES = (mathlib_f64, mathlib_trig, mathlib_f32)
_IMPLS = {name: obj for mod in _MODULES for name, obj in vars(mod).items()
          if name.startswith("_g_") and inspect.isfunction(obj) and name not in INTRINSICS
          and obj.__module__ == mod.__name__}
_TABLES = {name: obj for mod in _MODULES for name, obj in vars(mod).items()
           if name.startswith("_G_")}       # constant arrays of integers
_CALL = re.compile(r"\b_g_([a-z0-9]+)\(")


def used_functions(text: str) -> list[str]:
    """The library functions that kernel source ``text`` calls, in table order."""
    called = set(_CALL.findall(text))
    return [name for name in FUNCTIONS if name in called]


def library_source(names, *, precise: bool = False) -> str:
    """Source of the library functions ``names`` for a generated module: the
    implementations they need (none with ``precise``), then one dispatching stub
    per name."""
    impls = [] if precise else [i for n in names for i in FUNCTIONS[n][1:] if i]
    parts = [implementation_source(impls)] if impls else []
    if any("_one" in FUNCTIONS[n][0] or "_zero" in FUNCTIONS[n][0] for n in names):
        parts.append(_CONSTS)
    parts += [_dispatcher(n, precise) for n in names]
    return "\n\n\n".join(parts) + "\n" if parts else ""


def implementation_source(impls) -> str:
    """Source defining the implementation functions ``impls`` (``_g_exp_f32``...) and
    everything they call, ready to be called from Numba code: the bit-cast
    intrinsics, the functions, each wrapped by ``_g_inline``."""
    needed = _closure(impls)
    order = [n for n in _IMPLS if n in needed]
    parts = [_NOTICE] + [_intrinsic(n) for n in INTRINSICS if n in needed]
    parts += [_table(n) for n in _TABLES if n in needed]
    parts += [source_of(_IMPLS[n]) for n in order]
    parts += [_INLINE, "\n".join(f"{n} = _g_inline({n})" for n in order)]
    return "\n\n\n".join(parts)


def _closure(names) -> set[str]:
    """``names`` and every ``_g_`` function or intrinsic they call, transitively."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in _IMPLS:
            todo += [g for g in _IMPLS[n].__code__.co_names
                     if g in _IMPLS or g in INTRINSICS or g in _TABLES]
    return seen


def _table(name: str) -> str:
    """``name = np.array([...])`` for a constant table of integers."""
    values = ", ".join(str(int(v)) for v in _TABLES[name])
    lines, line = [], "   "
    for v in values.split(", "):
        if len(line) + len(v) + 2 > 92:
            lines.append(line)
            line = "   "
        line += f" {v},"
    dtype = _TABLES[name].dtype.name
    return f"{name} = np.array([\n" + "\n".join(lines + [line]) + f"\n], dtype=np.{dtype})"


def _intrinsic(name: str) -> str:
    doc, ret, arg = INTRINSICS[name]
    return (f"@numba.extending.intrinsic\n"
            f"def {name}(typingctx, i):\n"
            f'    """{doc} (an LLVM bit cast)."""\n'
            f"    def codegen(context, builder, signature, args):\n"
            f"        return builder.bitcast(args[0], context.get_value_type(numba.types.{ret}))\n"
            f"    return numba.types.{ret}(numba.types.{arg}), codegen")


_NOTICE = """\
# The math library (gradc.codegen.mathlib, docs/mathlib.md). Most float64 algorithms and
# constants are fdlibm's: Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
# Permission to use, copy, modify, and distribute this software is freely granted,
# provided that this notice is preserved. Most float32 ones are from the Cephes Math
# Library, Copyright 1984-1995 by Stephen L. Moshier."""

_INLINE = '''def _g_inline(fn):
    """``fn`` for Numba kernels: compiled once per signature (error_model="numpy", so
    no division checks) as an LLVM function marked alwaysinline, so that LLVM
    inlines it into the kernel loops and vectorises them.  (Numba's own
    ``inline="always"`` copies IR per call site, which takes seconds per kernel.)

    The calling function (the kernel's loop) is also given the string attributes
    that clang's ``-mprefer-vector-width=512`` sets: LLVM's x86 targets prefer
    256-bit vectors by default, which halves the throughput of these compute-bound
    loops on AVX-512 CPUs (1.4-1.6x measured, docs/mathlib.md); where the CPU has
    no 512-bit vectors LLVM uses the widest it has.  The library functions are
    compiled with LLVM's ``contract`` flag alone (multiply-adds may become FMAs, one
    rounding instead of two: 1.2-1.4x on these loops); the errors in docs/mathlib.md
    are measured with it.  The kernels' own arithmetic keeps its flags."""
    disp = numba.njit(error_model="numpy", fastmath={"contract"})(fn)

    def typer(typingctx, *args):
        sig = typingctx.resolve_function_type(numba.types.Dispatcher(disp), args, {})

        def codegen(context, builder, signature, llargs):
            cres = disp.overloads[signature.args]
            cres.library.get_function(cres.fndesc.llvm_func_name).add_function_attribute(
                "alwaysinline")
            context.add_linking_libs([cres.library])
            # llvmlite's FunctionAttributes accepts only enum attributes; string ones
            # are printed as they are (set.add bypasses its check).
            for attr in _G_WIDE:
                set.add(builder.function.attributes, attr)
            return context.call_internal(builder, cres.fndesc, signature, llargs)
        return sig, codegen

    call = [lambda tc, a: typer(tc, a), lambda tc, a, b: typer(tc, a, b),
            lambda tc, a, b, c: typer(tc, a, b, c)][fn.__code__.co_argcount - 1]
    return numba.extending.intrinsic(call)


_G_WIDE = (\'"prefer-vector-width"="512"\', \'"min-legal-vector-width"="512"\')'''

_CONSTS = '''def _g_consts(t):
    """One and zero of the NumPy dtype of the Numba type ``t``."""
    d = numba.np.numpy_support.as_dtype(t).type
    return d(1), d(0)'''


def _dispatcher(name: str, precise: bool) -> str:
    """A Python stub ``_g_<name>`` and its overload: the implementation for the dtypes
    that have one (none if ``precise``), libm otherwise."""
    expr, f32, f64 = FUNCTIONS[name]
    args = "x, y" if "y" in re.findall(r"\b[xy]\b", expr) else "x"
    plain = expr.replace("_one", "1").replace("_zero", "0")
    lines = [f"def _g_{name}({args}):",
             f'    """{name}: the library\'s, dispatched on the dtype inside Numba kernels."""',
             f"    return {plain}", "", "",
             f'@numba.extending.overload(_g_{name}, inline="always")',
             f"def _g_{name}_overload({args}):"]
    same = " and y == x" if args == "x, y" else ""
    for impl, ty in ((f32, "float32"), (f64, "float64")):
        if impl and not precise:
            lines += [f"    if x == numba.types.{ty}{same}:",
                      f"        return lambda {args}: {impl}({args})"]
    if "_one" in expr or "_zero" in expr:
        lines.append("    _one, _zero = _g_consts(x)")
    lines.append(f"    return lambda {args}: {expr}")
    return "\n".join(lines)
