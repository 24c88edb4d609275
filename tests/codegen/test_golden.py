"""Golden test: the exact generated module for ``tests/golden/scaled_tanh.grad``.

The expected text is ``tests/golden/scaled_tanh.cpu.py``: the generated part of
the module (its header, kernels and ops), without the run time copied from gradc,
which is the same in every module and is tested as the code it is (the tests of
``gradc/codegen/runtime_src.py`` and the wrappers).  After an intended change of
the generated code, regenerate it with ``pytest --update-golden`` and review the
diff.  The generated module is also imported and run, and the
generated text is checked for the properties SPEC §2 promises: deterministic,
standalone (never imports gradc), a header with the version and source hash.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradc
from gradc.codegen.module import generated_part

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASE = GOLDEN / "scaled_tanh.grad"
EXPECTED = GOLDEN / "scaled_tanh.cpu.py"


def generate() -> str:
    # a bare file name keeps the text independent of where the repository lives
    return gradc.compile_source(CASE.read_text(encoding="utf-8"), file=CASE.name)


@pytest.fixture(scope="module")
def text() -> str:
    return generate()


def test_generated_module_matches_the_golden_file(text: str, update_golden: bool) -> None:
    text = generated_part(text)
    if update_golden:
        EXPECTED.write_text(text, encoding="utf-8")
        pytest.skip(f"rewrote {EXPECTED.name}")
    assert EXPECTED.exists(), f"{EXPECTED} is missing: run pytest --update-golden"
    expected = EXPECTED.read_text(encoding="utf-8")
    if text != expected:
        import difflib
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(EXPECTED.name), "generated", n=2))
        pytest.fail("generated module differs from the golden file "
                    "(run pytest --update-golden if the change is intended):\n" + diff[:6000])


@pytest.fixture(scope="module")
def golden(import_module_text, text):
    """The generated module (the golden file's part with the run time), imported as a
    module: it must run without gradc."""
    return import_module_text(text, "gradc_golden_scaled_tanh")


def test_the_golden_file_is_the_generated_part_only(text: str) -> None:
    expected = EXPECTED.read_text(encoding="utf-8")
    assert "def _g_finish(" in text and "def _g_finish(" not in expected
    assert len(expected.splitlines()) < len(text.splitlines()) / 2


def test_golden_module_runs(golden) -> None:
    x = np.array([-1.0, 0.0, 1.0, 2.0])
    t = np.tanh(x)
    for op in (golden.scaled_tanh, golden.scaled_tanh.unfused):
        np.testing.assert_allclose(op(x), t, rtol=1e-12)
        (dx,) = op.vjp(x, np.ones(4))
        np.testing.assert_allclose(dx, 0.5 * (1 - t ** 2), rtol=1e-12)
        y, dx2 = op.fwd_bwd(x, np.full(4, 2.0))
        np.testing.assert_allclose(y, t, rtol=1e-12)
        np.testing.assert_allclose(dx2, 2 * dx, rtol=1e-12)
    # float32 in, float32 out (the spec example's values)
    for op in (golden.scaled_tanh, golden.scaled_tanh.unfused):
        y, dx = op.fwd_bwd(np.array([0.0, 1.0], np.float32), np.ones(2, np.float32))
        assert y.dtype == dx.dtype == np.float32
        np.testing.assert_allclose(y, [0.0, 0.7615942], rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(dx, [0.5, 0.2099871], rtol=2e-6)
    x32 = np.array([-2.0, 3.0], np.float32)
    for op in (golden.leaky_relu, golden.leaky_relu.unfused):
        y = op(x32, alpha=0.1)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, [-0.2, 3.0], rtol=1e-6)
        (dx,) = op.vjp(x32, np.ones(2, np.float32))
        assert dx.dtype == np.float32
        np.testing.assert_allclose(dx, [0.01, 1.0], rtol=1e-6)
    assert golden.leaky_relu.spec.startswith("op leaky_relu(")
    assert "alpha" in golden.leaky_relu.signature


def test_compiling_twice_gives_identical_bytes(text: str) -> None:
    assert generate().encode() == text.encode()


_COMPILE = ("import sys, gradc; from pathlib import Path; p = Path(sys.argv[1]); "
            "sys.stdout.buffer.write(gradc.compile_source(p.read_text(encoding='utf-8'), "
            "file=p.name).encode())")


@pytest.mark.parametrize("source", [CASE], ids=["golden"])
def test_output_does_not_depend_on_the_process(source: Path) -> None:
    """Same bytes under different string-hash seeds (no set or dict-order leaks); the
    examples are checked so under three seeds in tests/test_determinism.py."""
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outs.append(subprocess.run([sys.executable, "-c", _COMPILE, str(source)], env=env,
                                   check=True, capture_output=True, timeout=120).stdout)
    here = gradc.compile_source(source.read_text(encoding="utf-8"), file=source.name)
    assert outs[0] == outs[1] == here.encode()


def _imports(text: str, where=ast.walk) -> list[str]:
    names = []
    for node in where(ast.parse(text)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


def test_module_never_imports_gradc(text: str) -> None:
    """numpy, numba and the standard library only: the module ships without gradc.
    Only the Dask helpers import more (dask.array, operator), inside themselves,
    when called with a Dask array (docs/dask.md); the intrinsics' code generators
    import Numba's own code-generation layer (numba.core, numba.np.arrayobj, llvmlite) inside themselves,
    when Numba types a kernel that calls them, and _g_wide_vectors llvmlite.binding (the
    host CPU's features) at import."""
    imports = _imports(text, where=ast.iter_child_nodes)      # at import time
    assert imports, "no imports found"
    assert all(n.split(".")[0] in ("numpy", "numba", "ctypes", "functools", "inspect", "math",
                                   "os", "site", "sys") for n in imports), imports
    lazy = set(_imports(text)) - set(imports)
    dask, codegen = {"dask.array", "operator"}, {"llvmlite", "llvmlite.binding", "numba.core",
                                                 "numba.np.arrayobj"}
    assert lazy == dask | codegen, lazy
    for fn in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)):
        inside = set(_imports(ast.unparse(fn)))
        if inside & dask:
            assert fn.name.startswith("_gd_"), fn.name
        if inside & codegen:
            assert fn.name.startswith("_g_") or fn.name == "codegen", fn.name
    lines = [line for line in text.splitlines() if re.match(r"\s*(import|from)\s", line)]
    assert all("gradc" not in line for line in lines), lines


def test_header_has_version_and_source_hash(text: str, golden) -> None:
    head = "\n".join(text.splitlines()[:12])
    assert f"gradc {gradc.__version__}" in head and "Do not edit" in head
    assert f"__gradc_version__ = {gradc.__version__!r}" in text
    sha = hashlib.sha256(CASE.read_text(encoding="utf-8").encode()).hexdigest()
    assert f"SOURCE_SHA256 = {sha!r}" in text
    assert golden.SOURCE_SHA256 == sha and golden.__gradc_version__ == gradc.__version__


def test_ops_and_all_are_exported(golden) -> None:
    assert set(golden.OPS) == {"scaled_tanh", "leaky_relu"}
    assert golden.OPS["scaled_tanh"] is golden.scaled_tanh
    assert set(golden.__all__) == {"OPS", "scaled_tanh", "leaky_relu"}


def test_kernels_say_where_they_came_from(text: str) -> None:
    # every kernel is preceded by comments naming its op/method and source line
    for m in re.finditer(r"\n((?:#[^\n]*\n)+)@numba\.njit[^\n]*\ndef (\w+)\(", text):
        comments, name = m.group(1), m.group(2)
        assert "from scaled_tanh.grad:" in comments, name


def test_the_run_time_copied_is_its_source_as_it_stands() -> None:
    """gradc.codegen.runtime reads each run-time object's source once per process
    (the time of compiling a small op): the text copied is still inspect's, every
    object is found again in source order, and a caller may change the list it gets."""
    import inspect

    from gradc.codegen import runtime, runtime_cuda_src, runtime_src
    for module, prefixes in ((runtime_src, ("_g_", "_Gradc")), (runtime_cuda_src, ("_gck_",))):
        objects = runtime.runtime_objects(module, prefixes)
        assert objects and objects == runtime.runtime_objects(module, prefixes)
        lines = [inspect.getsourcelines(inspect.unwrap(o) if hasattr(o, "__wrapped__")
                                        else o)[1] for o in objects]
        assert lines == sorted(lines)
        objects.append(None)                     # the caller's list, not the cached one
        assert None not in runtime.runtime_objects(module, prefixes)
        for obj in objects[:-1]:
            assert runtime.source_of(obj) == inspect.getsource(obj).rstrip("\n")
            assert runtime.source_of(obj) is runtime.source_of(obj)      # read once
