"""Which loops of the row-wise kernels LLVM left scalar, and why.

A loop LLVM does not vectorise runs 2-8x slower and gives no other sign: cross-entropy's
forward had one, 1.9x slower, until these remarks named it (a NaN flag carried from
block to block; docs/performance.md, session 40).  This runs the ops of
``examples/rowwise.grad`` (or a module compiled from it) in float32 with LLVM's
loop-vectorizer remarks on, through every form of their row kernels (whole rows, rows
in blocks, online sums, split rows), and prints each loop LLVM did not vectorise with
the generated module's line, the kernel and LLVM's reason::

    python benchmarks/vector_remarks.py                 # examples/rowwise.grad
    python benchmarks/vector_remarks.py after.py --ops xent_rows --methods forward

Only the loops over a row's elements are listed (``for _c in ...``: the kernels mean
LLVM to vectorise those), and not those around calls (prefetch hints), unless
``--all``.  Kernels are compiled afresh (a temporary Numba cache, removed at the end)
with debug line information, and otherwise as they are.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("forward", "vjp", "fwd_bwd", "jvp")
# (rows, row length) float32, and the module's online thresholds: every form of a row
# kernel once (rows of 64: the whole-row loops; 4096: in blocks; 131072 in 2 rows: split)
SHAPES = ((64, 64), (8, 4096), (2, 131072))
NEVER = 1 << 62
# remarks of loops that hold calls or loops (outer loops): not a vector loop by design
_OUTER = ("call instruction cannot be vectorized", "Cannot vectorize uncountable loop",
          "could not determine number of loop iterations")
_REMARK = re.compile(r"remark: (?P<file>[^:\s]+):(?P<line>\d+):\d+: (?P<text>.*)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("module", nargs="?", help="a module compiled from rowwise.grad "
                    "(default: compile examples/rowwise.grad)")
    ap.add_argument("--ops", nargs="+", default=None)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--shapes", nargs="+", default=[f"{r}x{c}" for r, c in SHAPES],
                    metavar="RxC", help="float32 shapes (default: one of each form)")
    ap.add_argument("--all", action="store_true", help="list the outer loops too")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gradc-remarks-") as tmp:
        os.environ["NUMBA_CACHE_DIR"] = tmp         # before Numba is imported: afresh
        path = Path(args.module) if args.module else _compile(Path(tmp))
        log = Path(tmp, "remarks.txt")
        shapes = [tuple(int(v) for v in x.split("x")) for x in args.shapes]
        _run_with_remarks(path, args.ops, args.methods, shapes, log)
        remarks = _parse(log.read_text(errors="replace"), path, args.all)
    listed = [r for r in remarks if args.all or not any(o in r[3] for o in _OUTER)]
    for line, kernel, code, text in listed:
        print(f"{path.name}:{line}  {kernel}\n    {code}\n    {text}")
    print(f"{len(listed)} remark(s) of loops not vectorised"
          + ("" if args.all else " over a row's elements (--all: every loop)"))
    return 0


def _compile(tmp: Path) -> Path:
    import gradc

    path = tmp / "rowwise_remarks.py"
    source = ROOT / "examples" / "rowwise.grad"
    path.write_text(gradc.compile_source(source.read_text(), file=str(source)))
    return path


def _run_with_remarks(path: Path, ops, methods, shapes, log: Path) -> None:
    """Run ``ops``' ``methods`` from the module at ``path`` at ``shapes``, in the online
    forms and the others, LLVM's remarks (written to file descriptor 2 by LLVM itself)
    in ``log``."""
    import importlib.util

    import llvmlite.binding as llvm
    import numba
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rowwise_cases import make_inputs

    for kind in ("missed", "analysis"):
        llvm.set_option("", f"-pass-remarks-{kind}=loop-vectorize")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    njit = numba.njit
    numba.njit = _with_lines(njit)
    try:
        spec.loader.exec_module(module)
    finally:
        numba.njit = njit
    module._G_ROWS_MIN = 0
    saved = os.dup(2)
    with open(log, "w") as f:
        sys.stderr.flush()
        os.dup2(f.fileno(), 2)
        try:
            for online in ((NEVER, NEVER), (0, 0)):
                module._G_ONLINE = online
                for shape in shapes:
                    for op in ops or list(module.OPS):
                        params, ups = make_inputs(op, shape)
                        for method in methods:
                            _call(module.OPS[op], method, params, ups, np)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _with_lines(njit):
    """``numba.njit`` for the module's serial kernels with debug line information (the
    remarks' lines), without what Numba's debug mode adds that changes the code LLVM
    sees: variables kept alive to the end of their scope (softmax's segment loops were
    not vectorised with them) and bounds checks."""
    def with_lines(*args, **options):
        if args and callable(args[0]):                 # @numba.njit without arguments
            return with_lines(**options)(args[0])
        if not options.get("parallel"):
            options = {"debug": True, "_dbg_extend_lifetimes": False,
                       "boundscheck": False, **options}
        return njit(*args, **options)
    return with_lines


def _call(op, method, params, ups, np) -> None:
    if method == "forward":
        op(*params)
    elif method == "vjp":
        op.vjp(*params, *ups)
    elif method == "fwd_bwd":
        op.fwd_bwd(*params, *ups)
    else:
        # a tangent per differentiable parameter: the nograd ones come last
        tangents = [np.ones_like(p) for p in params]
        for k in range(len(params), 1, -1):
            try:
                op.jvp(*params, *tangents[:k])
                return
            except TypeError:                           # too many tangents
                continue
        op.jvp(*params, tangents[0])


def _parse(text: str, path: Path, every: bool) -> list[tuple[int, str, str, str]]:
    """The remarks of loops not vectorised, one per line of the module and reason:
    (line, the kernel around it, the line's code, LLVM's reason).  A remark's line is
    the loop's or that of the instruction it stopped at; unless ``every``, only those in
    a loop over a row's elements (``for _c in ...``), which the kernels mean LLVM to
    vectorise (the loops over rows, blocks and a split row's segments are not)."""
    lines = path.read_text().splitlines()
    found: dict[tuple[int, str], None] = {}
    for m in _REMARK.finditer(text):
        t = m.group("text")
        if Path(m.group("file")).name != path.name or t.startswith("vectorized loop") \
                or "interleaving is not beneficial" in t or t == "loop not vectorized" \
                or "or the loop has already been vectorized" in t:
            continue
        line = int(m.group("line"))
        if every or _loop_of(lines, line).startswith("for _c in "):
            found[line, t] = None
    out = []
    for line, t in sorted(found):
        kernel = next((s[4:s.index("(")] for s in reversed(lines[:line])
                       if s.startswith("def ")), "?")
        out.append((line, kernel, lines[line - 1].strip(), t))
    return out


def _loop_of(lines: list[str], line: int) -> str:
    """The ``for`` statement of the innermost loop holding line ``line`` (1-based), or
    the line itself where it is one."""
    code = lines[line - 1]
    indent = len(code) - len(code.lstrip())
    if code.lstrip().startswith("for "):
        return code.strip()
    for s in reversed(lines[:line - 1]):
        i = len(s) - len(s.lstrip())
        if s.strip() and i < indent:
            if s.lstrip().startswith("for "):
                return s.strip()
            if s.lstrip().startswith("def "):
                return ""
            indent = i
    return ""


if __name__ == "__main__":
    sys.exit(main())
