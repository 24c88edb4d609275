"""Every CUDA kernel of the examples compiles to PTX for sm_80 and sm_90, in
float32 (a sample in float64 too: _sample): the check that counts (the simulator
runs Python and accepts code a GPU rejects).  The PTX must be loadable by a CUDA
13.0 driver (ISA 9.0 at most) and float32 kernels must do their arithmetic in float32.
"""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import gradc
from gradc.codegen.cuda_ptx import (MAX_PTX_ISA, kernel_args, module_ptx, ptx_isa, ptx_target,
                                    runtime_signatures)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPECS = ["seed", "activations"]


@pytest.fixture(scope="module", params=SPECS)
def module(request, cuda_toolchain, import_module_text):
    path = EXAMPLES / f"{request.param}.grad"
    text = gradc.compile_source(path.read_text(encoding="utf-8"), file=str(path),
                                target="all")
    return import_module_text(text, f"ptx_{request.param}")


CCS = [(8, 0), (9, 0)]


# The run time's kernels (_gck_gather, _gck_rows, _gck_matmul, the primitives') are
# copied from gradc into every module with its CUDA run time: their PTX is compiled
# once per text of that section (which both examples' modules share), not per module.
_RUN_TIME_PTX: dict[str, dict] = {}


def _run_time_text(module) -> str:
    """The module's CUDA run time, where every kernel of the run time is defined."""
    text = Path(module.__file__).read_text(encoding="utf-8")
    start, end = text.index("# --- CUDA run time"), text.index("# --- CUDA kernels ---")
    first, last = text.count("\n", 0, start) + 1, text.count("\n", 0, end) + 1
    from numba import types
    for name in sorted({name for name, _ in runtime_signatures(types, types.float32)}):
        line = getattr(module, name).py_func.__code__.co_firstlineno
        assert first < line < last, f"{name} is defined outside the CUDA run time"
    return text[start:end]


def _sample(module) -> dict:
    """A representative sample of a module's kernels: each op's fused fwd_bwd kernels
    (its forward's and backward's templates together; reduce and matmul-epilogue
    kernels among them).  The ones compiled in float64 too, and with --fast-math:
    every kernel compiles in float32 (the dtype whose arithmetic is checked below),
    every elementwise template in float64 and with --fast-math in
    test_every_primitive_compiles_to_ptx, and the run time's kernels in both dtypes;
    the other kernels' text differs from what is compiled only in types and flags,
    and compiling all of it doubled this file's time (numba-cuda's front end, about
    0.3 s of CPU a kernel and dtype)."""
    return {name: k for name, k in module.CUDA_KERNELS.items() if "_fwd_bwd_" in name}


@pytest.fixture(scope="module")
def ptx_by_cc(module):
    """Every kernel's PTX for sm_80 and sm_90 in float32, a sample's in float64 too
    (shared by the tests; each kernel typed and lowered once, NVVM run per
    capability)."""
    sample = SimpleNamespace(CUDA_KERNELS=_sample(module))
    assert sample.CUDA_KERNELS
    own = module_ptx(module, CCS, dtypes=("float32",), runtime=False)
    for cc, texts in module_ptx(sample, CCS, dtypes=("float64",), runtime=False).items():
        own[cc].update(texts)
    key = _run_time_text(module)
    if key not in _RUN_TIME_PTX:
        _RUN_TIME_PTX[key] = module_ptx(module, CCS, prefix="\0")   # the run time's only
    return {cc: {**own[cc], **_RUN_TIME_PTX[key][cc]} for cc in CCS}


@pytest.fixture(scope="module")
def ptx_sm90(ptx_by_cc):
    return ptx_by_cc[(9, 0)]


@pytest.mark.slow
@pytest.mark.parametrize("cc", CCS)
def test_every_kernel_compiles_to_ptx(module, ptx_by_cc, cc) -> None:
    ptx = ptx_by_cc[cc]
    kernels = {k.split("[")[0].split("#")[0] for k in ptx}
    assert set(module.CUDA_KERNELS) <= {k.split("[")[0] for k in ptx if k.endswith("[float32]")}
    assert set(_sample(module)) <= {k.split("[")[0] for k in ptx if k.endswith("[float64]")}
    assert any("_jvp_" in k for k in module.CUDA_KERNELS)     # forward mode's kernels too
    assert {"_gck_gather", "_gck_rows", "_gck_matmul"} <= kernels
    assert {k.rsplit("[", 1)[1] for k in ptx} == {"float32]", "float64]"}
    for name, text in ptx.items():
        assert ptx_target(text) == f"sm_{cc[0]}{cc[1]}", name
        assert ptx_isa(text) <= MAX_PTX_ISA["13.0"], (
            f"{name}: PTX ISA {ptx_isa(text)} needs a driver newer than CUDA 13.0's "
            f"(install the cuda extra, which pins CUDA 13.0's NVVM)")
        assert re.search(r"^\.(visible )?\.?entry ", text, re.M), name


def test_one_front_end_for_every_capability_gives_compile_ptx_s_text(module,
                                                                    ptx_by_cc) -> None:
    """kernel_ptx types and lowers a kernel once for several capabilities: each text
    (module_ptx's, by kernel_ptx) is compile_ptx's for that capability but for the
    mangled names (their ABI tags hash the compile options)."""
    from numba import cuda

    name, (kernel, dts) = sorted(module.CUDA_KERNELS.items())[0]
    args = kernel_args(dts, "float32")

    def plain(text: str) -> str:
        return re.sub(r"_cudapy_smem_\d+", "S", re.sub(r"_ZN\w+", "N", text))

    for cc in CCS:
        text = ptx_by_cc[cc][f"{name}[float32]"]
        assert plain(text) == plain(cuda.compile_ptx(kernel.py_func, args, cc=cc)[0]), cc


def test_float32_kernels_compute_in_float32(module, ptx_sm90) -> None:
    """No float64 instruction in the float32 elementwise kernels (a stray double
    constant would halve the GPU's arithmetic rate); the run time's reductions
    and every matmul kernel accumulate in float64 on purpose."""
    elementwise = {name for name, (_, dts) in module.CUDA_KERNELS.items() if "n" not in dts}
    assert elementwise
    for name, text in ptx_sm90.items():
        if name.split("[")[0] not in elementwise or not name.endswith("[float32]"):
            continue
        body = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
        assert ".f64" not in body, f"{name} computes in float64"


def test_fast_math_and_unrolled_variants_compile(cuda_toolchain, import_module_text,
                                                 monkeypatch) -> None:
    """--fast-math kernels, and the plain grid-stride loop (unroll 1), compile too
    (a sample of the kernels: _sample)."""
    path = EXAMPLES / "activations.grad"
    monkeypatch.setenv("GRADC_CUDA_UNROLL", "1")
    text = gradc.compile_source(path.read_text(encoding="utf-8"), file=str(path),
                                target="cuda", fast_math=True)
    assert "fastmath=True" in text and "while _i + " not in text
    module = import_module_text(text, "ptx_activations_fast")
    sample = _sample(module)                  # every template: the test below
    ptx = module_ptx(SimpleNamespace(CUDA_KERNELS=sample), (9, 0), dtypes=("float32",),
                     fast_math=True, runtime=False)
    assert len(ptx) == len(sample) >= 6


# Every elementwise builtin and operator, forward and backward: each CUDA template
# (gradc/codegen/cuda.py) compiles, in both dtypes.
EVERY_PRIMITIVE = """
op every(x, y, i: i32, b: bool) -> (u, v, w) {
    u = (abs(x) + sign(x) + exp(x) + exp2(x) + expm1(x) + log(x) + log2(x) + log10(x)
         + log1p(x) + sqrt(x) + rsqrt(x) + square(x) + reciprocal(x) + sin(x) + cos(x)
         + tan(x) + asin(x) + acos(x) + atan(x) + sinh(x) + cosh(x) + tanh(x))
    v = (sigmoid(x) + softplus(x) + erf(x) + erfc(x) + floor(x) + ceil(x) + round(x)
         + atan2(y, x) + pow(x, y) + x^3 + x^0.5 + clip(x, -1, 1) + max(x, y) + min(x, y)
         + where(x > y, x, y) + where(b, x, 0) + stop_gradient(y) * x + x / y - x * y
         + ones_like(x) + zeros_like(x) + full_like(x, 2) + i)
    w = (where(x >= y, x, -x) + where(x <= 2, x, y) + where(x != y, y, x)
         + where(x == 1, x, y) + where(x < 3, y, x))
}
"""


@pytest.mark.slow
@pytest.mark.parametrize("fast_math", [False, True])
def test_every_primitive_compiles_to_ptx(cuda_toolchain, import_module_text, fast_math):
    text = gradc.compile_source(EVERY_PRIMITIVE, file="every.grad", target="cuda",
                                fast_math=fast_math)
    module = import_module_text(text, f"ptx_every_{int(fast_math)}")
    ptx = module_ptx(module, (9, 0), fast_math=fast_math, prefix="_gck_every_fwd_bwd",
                     runtime=False, dtypes=("float32",) if fast_math else ("float32", "float64"))
    assert ptx and all(k.startswith("_gck_every_fwd_bwd") for k in ptx)



DRAWS = """
op mask(x: [n, k]) -> (y, s) {
    y = where(random_uniform_like(x) >= 0.5, x, 0)
    s = sum(x * random_uniform_like(x, -1, 1), axis=1)
}
op normal(x) -> y {
    y = x * random_normal_like(x)
}
"""


@pytest.mark.slow
def test_random_draws_compile_to_ptx(cuda_toolchain, import_module_text):
    """Philox4x32-10 inlined into the kernels (uint64 arithmetic, no device function):
    PTX for sm_80 and sm_90, in a reduce kernel too (mask's fwd_bwd); the uniform's
    float32 elementwise kernels without a float64 instruction (the normal's cos is
    libdevice's, whose slow path has some; a reduce kernel accumulates in float64)."""
    text = gradc.compile_source(DRAWS, file="draws.grad", target="cuda")
    module = import_module_text(text, "ptx_draws")
    assert "n" in module.CUDA_KERNELS["_gck_mask_fwd_bwd_0"][1]        # a reduce kernel
    masks = module_ptx(module, CCS, prefix="_gck_mask_fwd_bwd", runtime=False)
    vjps = module_ptx(module, CCS, prefix="_gck_mask_vjp", runtime=False, dtypes=("float32",))
    normals = module_ptx(module, CCS, prefix="_gck_normal_forward", runtime=False,
                         dtypes=("float32",))
    for cc in CCS:
        ptx = {**masks[cc], **vjps[cc], **normals[cc]}
        assert len(ptx) >= 5
        philox = set()
        for name, body in ptx.items():
            assert ptx_target(body) == f"sm_{cc[0]}{cc[1]}"
            code = "\n".join(l for l in body.splitlines() if not l.lstrip().startswith("//"))
            if "mul.lo.s64" in code or "mul.wide.u32" in code or "mul.lo.u64" in code:
                philox.add(name.split("_")[3])
            if "_mask_vjp" in name:
                assert ".f64" not in code, name
        assert philox == {"forward", "vjp", "fwd"}, philox


@pytest.mark.slow
def test_batched_matmul_epilogue_compiles_to_ptx(cuda_toolchain, import_module_text):
    """A batched product (its batches' operand offsets, the grid's z extent) with an
    elementwise epilogue: PTX for sm_80 and sm_90 (the run time's _gck_matmul, the
    same template without an epilogue, compiles in the tests above)."""
    text = gradc.compile_source("op bmm(x: [1, h, i, k], y: [b, 1, k, j]) -> z {\n"
                                "    z = tanh(x @ y)\n}\n", file="bmm.grad", target="cuda")
    assert "_gc_launch_matmul(_gck_bmm_forward_" in text
    module = import_module_text(text, "ptx_bmm")
    by_cc = module_ptx(module, CCS, prefix="_gck_bmm_forward", runtime=False)
    for cc, ptx in by_cc.items():
        assert len(ptx) == 2 and all(ptx_target(p) == f"sm_{cc[0]}{cc[1]}" for p in ptx.values())


# The row-wise examples, whose reductions are reduce kernels on CUDA
# (gradc.codegen.cuda_reduce): rowwise.grad's ops take any shape (their row plans'
# kernels), those of kernels/ declare theirs.
ROWWISE = ["rowwise", "kernels/softmax", "kernels/layer_norm", "kernels/rms_norm",
           "kernels/cross_entropy"]


def _reduce_kernels(module, split: bool) -> dict:
    """The reduce kernels of ``CUDA_KERNELS``: those ending in ``_R, _N`` (a matmul's
    geometry ends in three sizes), and (``split``) the kernels of their split rows
    (``<kernel>_seg<p>``, ``<kernel>_end``: ``_R, _N, _NS``)."""
    kernels = module.CUDA_KERNELS
    whole = {name for name, k in kernels.items() if k[1][-2:] == ("n", "n") and k[1][-3] != "n"}
    return {name: k for name, k in kernels.items() if name in whole
            or split and re.sub(r"_(seg\d+|end)$", "", name) in whole}


@pytest.mark.slow
@pytest.mark.parametrize("spec", ROWWISE)
def test_reduce_kernels_compile_to_ptx(spec, cuda_toolchain, import_module_text) -> None:
    """Every reduce kernel of kernels/'s ops in float32, their fwd_bwd ones in float64
    too, and the fwd_bwd ones of rowwise.grad's row plans with the kernels of their
    split rows in float32, for sm_90 (NVVM's time: the others differ from these in no
    way the front end sees; the other kernels are elementwise loops of the templates
    tested above).  The partials are float64 arrays, ``_R`` and ``_N`` int64
    (Kernels.arg_dtypes)."""
    path = EXAMPLES / f"{spec}.grad"
    text = gradc.compile_source(path.read_text(encoding="utf-8"), file=str(path), target="cuda")
    module = import_module_text(text, f"ptx_{spec.replace('/', '_')}")
    kernels = _reduce_kernels(module, split=spec == "rowwise")
    fwd_bwd = {n: k for n, k in kernels.items() if "_fwd_bwd_" in n}
    assert fwd_bwd
    if spec == "rowwise":
        kernels, fwd_bwd = fwd_bwd, {}
    ptx = {**module_ptx(SimpleNamespace(CUDA_KERNELS=kernels), (9, 0), dtypes=("float32",),
                        runtime=False),
           **module_ptx(SimpleNamespace(CUDA_KERNELS=fwd_bwd), (9, 0), dtypes=("float64",),
                        runtime=False)}
    assert len(ptx) == len(kernels) + len(fwd_bwd)
    if spec == "rowwise":           # every one of its kernels splits rows
        whole = {n for n in kernels if not re.search(r"_(seg\d+|end)$", n)}
        assert {n.removesuffix("_seg0") for n in kernels if n.endswith("_seg0")} == whole
    for name, body in ptx.items():
        assert ptx_target(body) == "sm_90" and ptx_isa(body) <= MAX_PTX_ISA["13.0"], name
        assert "bar.sync" in body, name             # the block trees' syncthreads
    if spec == "kernels/softmax":
        # the float32 kernel's elements in float32: exp is expf (float64's exp would
        # bring its polynomial's fma.rn.f64); the float64 accumulators add in float64
        body = "\n".join(line for line in ptx["_gck_softmax_fwd_bwd_0[float32]"].splitlines()
                         if not line.lstrip().startswith("//"))
        assert "fma.rn.f64" not in body and "add.f64" in body and "ex2.approx" in body


def test_known_maxima_compile_to_ptx(cuda_toolchain, import_module_text) -> None:
    """The forward and fwd_bwd reduce kernels of logsumexps whose max is the row's less
    the shift (``loop_ir.Shift.known``: no pass and no tree of their own; the built-in
    log_softmax, JAX's written out, lse(x - max(x))), whole rows and split, float32,
    sm_90."""
    from row_sources import KNOWN_MAX_OPS
    text = gradc.compile_source(KNOWN_MAX_OPS, file="known.grad", target="cuda")
    assert text.count(" = numba.float64(_T(u") >= 6        # each method's known max
    module = import_module_text(text, "ptx_known_max")
    kernels = {n: k for n, k in _reduce_kernels(module, split=True).items()
               if "_forward_" in n or "_fwd_bwd_" in n}
    assert any(n.endswith("_seg1") for n in kernels)
    ptx = module_ptx(SimpleNamespace(CUDA_KERNELS=kernels), (9, 0), dtypes=("float32",),
                     runtime=False)
    assert len(ptx) == len(kernels)
    for name, body in ptx.items():
        assert ptx_target(body) == "sm_90" and ptx_isa(body) <= MAX_PTX_ISA["13.0"], name


def test_softmax_fwd_bwd_is_one_reduce_kernel_on_cuda() -> None:
    """Softmax's forward and backward on CUDA: one kernel, three passes over each row,
    no reduction of the run time's (the row plan's wrapper, which the op's fused
    wrapper calls, and the plan of an op with declared shapes)."""
    from gradc.codegen.cuda_module import CudaWrapperPrinter
    from gradc.frontend.check import check_source
    from gradc.passes.fuse_reduce import ReduceKernel
    from gradc.pipeline import build_program

    path = EXAMPLES / "rowwise.grad"
    text = gradc.compile_source(path.read_text(encoding="utf-8"), file=str(path), target="cuda")
    fn = text[text.index("def _gcr0_softmax_rows_fwd_bwd("):]
    fn = fn[:fn.index("\ndef ")]
    assert fn.count("_gc_launch_rows(") == 1
    assert "_gc_reduce(" not in fn and "_gc_launch(" not in fn
    generic = text[text.index("class softmax_rows:"):]
    generic = generic[generic.index("class cuda:"):]
    generic = generic[generic.index("def fwd_bwd("):generic.index("def jvp(")]
    assert "return _g_rows_back(_gcr0_softmax_rows_fwd_bwd(" in generic
    path = EXAMPLES / "kernels" / "softmax.grad"
    method = build_program(check_source(path.read_text(encoding="utf-8"), str(path)))[
        "softmax"].methods["fwd_bwd"]
    steps = CudaWrapperPrinter.lower_plan(method.fused).steps
    assert len(steps) == 1 and isinstance(steps[0], ReduceKernel)
