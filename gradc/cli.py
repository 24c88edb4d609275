"""The ``gradc`` command line: a thin argparse layer over the API.

Exit status: 0 on success, 1 on a user error (message on stderr), 2 on bad
usage or an internal error (with a traceback).
"""
from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from pathlib import Path

from gradc.errors import GradcError, GradcWarning

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _cmd_compile(args) -> int:
    from gradc import compile_file
    out = compile_file(args.spec, args.output, target=args.target, fuse=not args.no_fuse,
                       fast_math=args.fast_math, precise=args.precise, check=args.debug)
    print(f"wrote {out}")
    return 0


def _cmd_check(args) -> int:
    from gradc.frontend.check import load_program
    from gradc.gradcheck import check_program
    program = load_program(args.spec)
    print(f"{args.spec}: parsed and checked, {len(program.main_ops)} ops")
    results = check_program(program, seed=args.seed)
    for r in results:
        print(r.line())
    failed = [r.op for r in results if not r.ok]
    if failed:
        print(f"gradient check failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _cmd_explain(args) -> int:
    from gradc.explain import explain
    print(explain(args.spec, args.op))
    return 0


def _cmd_bench(args) -> int:
    from gradc.bench import bench_file
    print(bench_file(args.spec, n=args.n, repeat=args.repeat, precise=args.precise))
    return 0


def _cmd_graph(args) -> int:
    print("gradc graph: not implemented yet in this version (use 'gradc explain' for the "
          "IR as text)", file=sys.stderr)
    return 2


def _cmd_demo(args) -> int:
    from gradc.demo import run_demo
    return run_demo(quick=args.quick)


_PRECISE = ("libm for every transcendental function instead of the vectorised math "
            "library (docs/mathlib.md)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gradc", description="Compile gradient rules (.grad "
                                "files) to fused Numba kernels.")
    p.add_argument("--debug", action="store_true", help="verify the IR after every pass")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a .grad file to a Python module")
    c.add_argument("spec")
    c.add_argument("-o", "--output", help="output .py (default: <stem>_gen.py beside it)")
    c.add_argument("--target", choices=("cpu", "cuda", "all"), default="cpu")
    c.add_argument("--no-fuse", action="store_true", help="one kernel per primitive")
    c.add_argument("--fast-math", action="store_true",
                   help="Numba fast-math flags that keep NaN/inf semantics")
    c.add_argument("--precise", action="store_true", help=_PRECISE)
    c.set_defaults(fn=_cmd_compile)
    k = sub.add_parser("check", help="parse, type-check and gradient-check every op")
    k.add_argument("spec")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--precise", action="store_true",
                   help="accepted as for compile and bench; check runs the IR interpreter, "
                        "which computes with NumPy's functions either way")
    k.set_defaults(fn=_cmd_check)
    b = sub.add_parser("bench", help="fused vs unfused vs NumPy, time and GB/s per op")
    b.add_argument("spec")
    b.add_argument("--n", type=int, default=10**7, help="elements (default 10^7)")
    b.add_argument("--repeat", type=int, default=11)
    b.add_argument("--precise", action="store_true", help=_PRECISE)
    b.set_defaults(fn=_cmd_bench)
    e = sub.add_parser("explain", help="the derived gradient and the kernel plan of an op")
    e.add_argument("spec")
    e.add_argument("op")
    e.set_defaults(fn=_cmd_explain)
    g = sub.add_parser("graph", help="draw the IR of an op (not implemented yet)")
    g.add_argument("spec")
    g.add_argument("op")
    g.add_argument("-o", "--output", required=True)
    g.set_defaults(fn=_cmd_graph)
    d = sub.add_parser("demo", help="the main job on the bundled example")
    d.add_argument("--quick", action="store_true", help="fewer elements and epochs")
    d.set_defaults(fn=_cmd_demo)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Compiler warnings print like errors (file:line:col, caret); others as Python's."""
    text = message.render() if isinstance(message, GradcWarning) else \
        warnings.formatwarning(message, category, filename, lineno, line).rstrip()
    print(text, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            warnings.simplefilter("always", GradcWarning)
            return args.fn(args)
    except GradcError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:          # e.g. piped into head
        sys.stderr.close()
        return 0
    except OSError as exc:           # a missing file, a full disk, a directory as -o ...
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except NotImplementedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        print("gradc: internal error (a bug in gradc; please report it with the input)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
