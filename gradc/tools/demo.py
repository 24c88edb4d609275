"""``gradc demo``: the main job on the bundled example, end to end.

1. compile ``examples/seed.grad`` (the custom-gradient guide's ops) and import it;
2. print the guide's values beside gradc's;
3. gradient-check every op against finite differences;
4. time fused against unfused kernels;
5. train the guide's classifier on scikit-learn's handwritten digits with
   every forward and backward pass in generated kernels.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

# (op, inputs, upstream, the guide's printed outputs, the guide's printed gradient)
GUIDE = [
    ("custom_linear", [3.0], [1.0], [6.0], [1.0]),
    ("sign_ste", [-2, -1, 0, 1, 2], [1] * 5, [-1, -1, 0, 1, 1], [1, 1, 1, 1, 1]),
    ("clipped_relu", [-2, -1, 0, 1, 2], [1] * 5, [0, 0, 0, 1, 2], [0, 0, 0, 1, 1]),
    ("clipped_relu", [1, 2], [5, -3], [1, 2], [1, -1]),
    ("scaled_tanh", [0, 1], [1, 1], [0, 0.7615942], [0.5, 0.2099871]),
]


def examples_dir() -> Path:
    """The bundled examples: ``gradc/examples`` when installed, else the repo's."""
    try:
        from importlib.resources import files
        path = Path(str(files("gradc.examples")))
        if (path / "seed.grad").is_file():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "examples"


def _fmt(a) -> str:
    return np.array2string(np.asarray(a, dtype=np.float32), precision=7, separator=", ")


def guide_table(module) -> tuple[str, bool]:
    """The guide's printed values beside gradc's, and whether all match (float32)."""
    lines, ok = [], True
    for name, x, dy, y_ref, dx_ref in GUIDE:
        op = getattr(module, name)
        y, dx = op.fwd_bwd(np.asarray(x, np.float32), np.asarray(dy, np.float32))
        good = (np.allclose(y, y_ref, rtol=1e-6, atol=1e-7)
                and np.allclose(dx, dx_ref, rtol=1e-6, atol=1e-7))
        ok &= good
        lines.append(f"{name}(x={_fmt(x)}, dy={_fmt(dy)})  {'ok' if good else 'MISMATCH'}")
        lines.append(f"    y : guide {_fmt(y_ref):<28} gradc {_fmt(y)}")
        lines.append(f"    dx: guide {_fmt(dx_ref):<28} gradc {_fmt(dx)}")
    return "\n".join(lines), ok


def _train_module():
    try:
        from gradc.examples import train_digits
        return train_digits
    except ModuleNotFoundError:
        path = examples_dir() / "train_digits.py"
        spec = importlib.util.spec_from_file_location("gradc_train_digits", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def run_demo(quick: bool = False, color: bool = False) -> int:
    """Run the five steps, printing to stdout (``color``: ANSI styles for a
    terminal); progress bars go to a terminal's stderr (benchmark) and stdout
    (training) only.  Returns the exit status: 0, or 1 when a value or a
    gradient check disagrees."""
    import gradc
    from gradc.audit.gradcheck import check_program
    from gradc.frontend.check import load_program
    from gradc.tools.bench import bench_file
    from gradc.tools.term import status, style

    def head(text: str) -> None:
        print(style(text, "bold", "cyan", on=color))

    seed = examples_dir() / "seed.grad"
    head(f"== 1. compile {seed}")
    module = gradc.load(seed)
    out = Path(module.__file__)
    print(f"compiled to {out} in gradc's cache ({len(out.read_text().splitlines())} lines) "
          "and imported (Numba compiles the kernels on first use and caches them there)")
    head("\n== 2. the guide's values beside gradc's (float32, fwd_bwd)")
    table, ok = guide_table(module)
    print("\n".join(status(line, on=color) for line in table.splitlines()))
    head("\n== 3. gradient check (float64 finite differences)")
    results = check_program(load_program(seed))
    for r in results:
        print(status(r.line(), on=color))
    ok &= all(r.passed for r in results)
    n = 10**6 if quick else 10**7
    head(f"\n== 4. fused vs unfused (fwd_bwd of the elementwise ops, n = {n:,})")
    print(bench_file(seed, n=n, repeat=5 if quick else 9, progress=None, color=color))
    head("\n== 5. the guide's classifier on scikit-learn's handwritten digits")
    result = _train_module().run(module, epochs=10 if quick else 30)
    print(f"held-out accuracy: {result['test_accuracy']:.2%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_demo(quick="--quick" in sys.argv))
