"""Every CUDA kernel of the examples compiles to PTX for sm_80 and sm_90, in
float32 and float64: the check that counts (the simulator runs Python and
accepts code a GPU rejects).  The PTX must be loadable by a CUDA 13.0 driver
(ISA 9.0 at most) and float32 kernels must do their arithmetic in float32.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import gradc
from gradc.codegen.cuda_ptx import MAX_PTX_ISA, module_ptx, ptx_isa, ptx_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPECS = ["seed", "activations"]


@pytest.fixture(scope="module", params=SPECS)
def module(request, cuda_toolchain, import_module_text):
    path = EXAMPLES / f"{request.param}.grad"
    text = gradc.compile_source(path.read_text(encoding="utf-8"), file=str(path),
                                target="all")
    return import_module_text(text, f"ptx_{request.param}")


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_every_kernel_compiles_to_ptx(module, cc) -> None:
    ptx = module_ptx(module, cc)
    kernels = {k.split("[")[0].split("#")[0] for k in ptx}
    assert set(module.CUDA_KERNELS) <= kernels
    assert {"_gck_gather", "_gck_rows", "_gck_matmul"} <= kernels
    for name, text in ptx.items():
        assert ptx_target(text) == f"sm_{cc[0]}{cc[1]}", name
        assert ptx_isa(text) <= MAX_PTX_ISA["13.0"], (
            f"{name}: PTX ISA {ptx_isa(text)} needs a driver newer than CUDA 13.0's "
            f"(install the cuda extra, which pins CUDA 13.0's NVVM)")
        assert re.search(r"^\.(visible )?\.?entry ", text, re.M), name


def test_float32_kernels_compute_in_float32(module) -> None:
    """No float64 instruction in the float32 generated kernels (a stray double
    constant would halve the GPU's arithmetic rate); the run time's reductions
    and matmul accumulate in float64 on purpose and are not checked."""
    ptx = module_ptx(module, (9, 0), dtypes=("float32",))
    for name, text in ptx.items():
        if name.startswith("_gck_gather") or not name.startswith(("_gck_", "_gu_")) \
                or name.startswith(("_gck_rows", "_gck_matmul")):
            continue
        body = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
        assert ".f64" not in body, f"{name} computes in float64"


def test_fast_math_and_unrolled_variants_compile(cuda_toolchain, import_module_text,
                                                 monkeypatch) -> None:
    """--fast-math kernels, and the plain grid-stride loop (unroll 1), compile too."""
    path = EXAMPLES / "activations.grad"
    monkeypatch.setenv("GRADC_CUDA_UNROLL", "1")
    text = gradc.compile_source(path.read_text(encoding="utf-8"), file=str(path),
                                target="cuda", fast_math=True)
    assert "fastmath=True" in text and "while _i + " not in text
    module = import_module_text(text, "ptx_activations_fast")
    ptx = module_ptx(module, (9, 0), dtypes=("float32",), fast_math=True)
    assert ptx
