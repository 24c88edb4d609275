"""``benchmarks/vector_remarks.py``: LLVM's reasons for the loops it left scalar."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gradc

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "benchmarks" / "vector_remarks.py"


def _run(module: Path, tmp_path: Path) -> str:
    r = subprocess.run([sys.executable, str(TOOL), str(module), "--ops", "xent_rows",
                        "--methods", "forward", "--shapes", "8x4096"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_cross_entropys_forward_loops_are_vectorised(tmp_path) -> None:
    """Its max (with a NaN flag) and dot in one loop per block: vectorised since the
    flag is the block's (a row's flag carried through the blocks left it scalar)."""
    module = tmp_path / "rowwise_now.py"
    module.write_text(gradc.compile_source((ROOT / "examples" / "rowwise.grad").read_text(),
                                           file="rowwise.grad"))
    out = _run(module, tmp_path)
    assert out.strip().endswith("0 remark(s) of loops not vectorised over a row's elements "
                                "(--all: every loop)"), out


def test_a_loop_left_scalar_is_listed_with_its_line_and_reason(tmp_path) -> None:
    """The same kernel with a block's sum of x * t added in order, not reassociated:
    LLVM leaves that loop scalar and says why, at the line of the sum."""
    text = gradc.compile_source((ROOT / "examples" / "rowwise.grad").read_text(),
                                file="rowwise.grad")
    name = "_grk1_xent_rows_forward_0_chunks"
    start = text.index(f"def {name}(")
    end = text.index("\n@numba.njit", start)
    kernel = text[start:end]
    blocks = kernel.index("for _b in range(0, _N, 256):")     # the loop in blocks only
    assert kernel[blocks:].count("_f2 = _g_radd(_f2, v1)") == 1
    kernel = kernel[:blocks] + kernel[blocks:].replace("_f2 = _g_radd(_f2, v1)", "_f2 = _f2 + v1")
    module = tmp_path / "rowwise_before.py"
    module.write_text(text[:start] + kernel + text[end:])
    out = _run(module, tmp_path)
    assert f"  {name}\n    _f2 = _f2 + v1\n    loop not vectorized: cannot prove it is safe " \
           "to reorder floating-point operations" in out, out
    assert out.strip().endswith("1 remark(s) of loops not vectorised over a row's elements "
                                "(--all: every loop)"), out
