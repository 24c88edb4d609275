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


def _cmd_compile(args) -> int:
    if args.emit == "ir":
        if args.output:
            print("error: --emit ir prints the IR to stdout and writes no file: drop -o "
                  "(or redirect the output)", file=sys.stderr)
            return 2
        from gradc.tools.explain import emit_ir
        print(emit_ir(args.spec, args.op, check=args.debug))
        return 0
    if args.op:
        print("error: --op selects ops for --emit ir only (a module has every op)",
              file=sys.stderr)
        return 2
    if args.emit == "torch":
        return _emit_torch(args)
    options = dict(target=args.target, fuse=not args.no_fuse, fast_math=args.fast_math,
                   precise=args.precise, check=args.debug)
    if args.output == "-":                  # the module on stdout, as --emit ir prints
        from gradc import compile_source
        from gradc.frontend.parser import read_source
        sys.stdout.write(compile_source(read_source(args.spec), file=args.spec, **options))
        return 0
    from gradc import compile_file
    out = compile_file(args.spec, args.output, **options)
    print(f"wrote {out}")
    return 0


def _refuse_stdout(output: str | None, what: str) -> bool:
    """``-o -`` where the output must be a file: say so (True) rather than write a
    file named ``-``."""
    if output != "-":
        return False
    print(f"error: {what} finds the .grad file by its path relative to where it is "
          "written, so it cannot go to stdout: give -o a file path", file=sys.stderr)
    return True


def _emit_torch(args) -> int:
    """--emit torch: compile (into the cache, so errors and warnings show now) and
    write a module of PyTorch functions that loads it (gradc.adapters.emit)."""
    from gradc import load
    from gradc.adapters.emit import torch_module_text
    from gradc.loader.disk_cache import write_atomic
    options = {k: v for k, v, default in (("target", args.target, "cpu"),
                                          ("fuse", not args.no_fuse, True),
                                          ("fast_math", args.fast_math, False),
                                          ("precise", args.precise, False)) if v != default}
    if _refuse_stdout(args.output, "the PyTorch module"):
        return 2
    module = load(args.spec, **options)
    spec = Path(args.spec)
    out = Path(args.output) if args.output else spec.with_name(f"{spec.stem}_torch.py")
    write_atomic(out, torch_module_text(spec, out, list(module.OPS), options), keep=spec)
    print(f"wrote {out}")
    return 0


def _cmd_check(args) -> int:
    from gradc.audit.report import report_dict, write_report
    from gradc.frontend.check import load_program
    from gradc.audit.custom_rules import audit_program, rule_users
    from gradc.audit.gradcheck import check_program
    from gradc.tools.term import status, use_color
    from gradc.audit.report import error_report
    text = sys.stderr if args.json == "-" else sys.stdout     # stdout carries the JSON
    color = use_color(text, args.color)
    try:
        program = load_program(args.spec)
        results = check_program(program, seed=args.seed)    # compiles: shape errors raise
    except GradcError as exc:       # a CI reading the JSON gets the errors there too
        if args.json:
            write_report(error_report(args.spec, exc, args.seed), args.json)
        raise
    audits = {a.op: a for a in audit_program(program, seed=args.seed)}
    n = len(program.main_ops)
    print(f"{args.spec}: {n} op{'s' * (n != 1)} parsed, type-checked and compiled; "
          "gradient checks:", file=text)
    for r in results:
        r.audit = audits.get(r.op)
        print(status(r.line(), on=color), file=text)
        for w in r.warnings:                # the compiler's, as gradc compile shows them
            warnings.warn(w)
        if r.audit is not None and r.audit.warning is not None:
            warnings.warn(r.audit.warning)
    # rules of imported ops that this file's gradients use: audited here too (their own
    # file's check audits them as well); an unmarked wrong one fails this check
    imported = [a for name, a in audits.items() if name not in program.main_ops]
    for a in imported:
        mark = "FAIL" if a.warning is not None else "ok  "
        head = (f"{mark} {a.op} (imported from {a.span.file}; the gradients of "
                f"{', '.join(rule_users(program, a.op))} use its rule): ")
        lines = a.lines(head="")
        print(status(head + lines[0], on=color), file=text)
        for line in lines[1:]:
            print(f"       {line}", file=text)
        if a.warning is not None:
            warnings.warn(a.warning)
    if args.json:
        write_report(report_dict(args.spec, results, args.seed, imported), args.json)
        if args.json != "-":
            print(f"wrote {args.json}", file=text)
    wrong_imports = [a.op for a in imported if a.warning is not None]
    failed = [r.op for r in results if not r.passed] + wrong_imports
    if failed:
        print(f"gradient check failed for: {', '.join(failed)}", file=sys.stderr)
        unmarked = [r.op for r in results if r.unmarked_surrogate] + wrong_imports
        if unmarked:
            print(f"  custom gradients that are not the derivative and not marked "
                  f"'surrogate' (W410): {', '.join(unmarked)}; mark them "
                  f"'grad(...) -> ... surrogate {{' if that is intended", file=sys.stderr)
        return 1
    return 0


def _cmd_explain(args) -> int:
    from gradc.tools.explain import explain
    print(explain(args.spec, args.op))
    return 0


def _cmd_bench(args) -> int:
    from gradc.tools.bench import VARIANTS, ShapeError, available_variants, run_bench
    from gradc.tools.bench_report import format_report, plot_report, write_json
    from gradc.tools.term import use_color
    unknown = [v for v in (args.variants or []) + args.skip if v not in VARIANTS]
    if unknown:
        print(f"error: unknown variant(s) {', '.join(unknown)} (choose from "
              f"{', '.join(VARIANTS)})", file=sys.stderr)
        return 2
    if args.repeat < 1 or args.warmup < 0 or args.settle < 0:
        print("error: --repeat must be at least 1, --warmup and --settle not negative",
              file=sys.stderr)
        return 2
    shapes: dict = {}
    for name, dims in args.shape or ():
        if name in shapes and shapes[name] != dims:
            print(f"error: --shape {name} given twice ({','.join(map(str, shapes[name]))} "
                  f"and {','.join(map(str, dims))})", file=sys.stderr)
            return 2
        shapes[name] = dims
    variants = [v for v in args.variants or available_variants() if v not in args.skip]
    sizes = [args.n] if args.n else args.sizes
    try:
        report = run_bench(args.spec, sizes, args.repeat, args.warmup, variants, args.ops,
                           args.precise, settle=args.settle, shapes=shapes)
    except ShapeError as exc:
        print(f"error: --shape: {exc}", file=sys.stderr)
        return 2
    text = sys.stderr if args.json == "-" else sys.stdout     # stdout carries the JSON
    print(format_report(report, color=use_color(text, args.color)), file=text)
    if args.json:
        write_json(report, args.json)
        if args.json != "-":
            print(f"wrote {args.json}", file=text)
    if args.plot:
        try:
            plot_report(report, args.plot)
        except ImportError:
            print("error: --plot needs matplotlib (pip install 'gradc[bench]')",
                  file=sys.stderr)
            return 1
        print(f"wrote {args.plot}")
    return 0


def _cmd_testgen(args) -> int:
    from gradc.tools.testgen import write_tests
    if _refuse_stdout(args.output, "the test file"):
        return 2
    out, n = write_tests(args.spec, args.output)
    print(f"wrote {out}: {n} tests (run: python -m pytest {out})")
    if not (out.name.startswith("test_") or out.stem.endswith("_test")):
        print("note: pytest collects test_*.py and *_test.py files by default; name it so "
              "to have it run with the rest of your tests")
    return 0


def _output_file(text: str) -> str:
    """A file to write at the end (``-``: stdout): its folder must exist now, and it
    must not be a folder itself, so that a run of minutes does not end in an error
    about the path."""
    if text != "-" and not Path(text).parent.is_dir():
        raise argparse.ArgumentTypeError(f"no folder {str(Path(text).parent)!r} to write "
                                         f"{text!r} in")
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder: give a file name")
    return text


def _size(text: str) -> int:
    """``1000000``, ``1e6``, ``10**6`` or ``10^6``."""
    try:
        base, _, exp = text.replace("^", "**").partition("**")
        n = int(base) ** int(exp) if exp else float(text)
        if n != int(n):
            raise ValueError(text)             # 2.5 elements
        n = int(n)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a size (a whole number of elements): "
                                         f"{text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {n}")
    return n


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``x=4096,1024`` or ``x=4096x1024`` (``gradc bench --shape``)."""
    from gradc.tools.bench import parse_shape
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_graph(args) -> int:
    from gradc.tools.draw import DEFAULT_METHOD, GraphError, graph_dot, output_format, write_graph
    try:
        output_format(args.output)          # a bad suffix fails before compiling
        dot = graph_dot(args.spec, args.op, args.method or [DEFAULT_METHOD], check=args.debug)
        print(f"wrote {write_graph(dot, args.output)}")
    except GraphError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_demo(args) -> int:
    from gradc.tools.demo import run_demo
    from gradc.tools.term import use_color
    return run_demo(quick=args.quick, color=use_color(sys.stdout, args.color))


_PRECISE = ("libm for every transcendental function instead of the vectorised math "
            "library (docs/mathlib.md)")


def _color_option(parser: argparse.ArgumentParser) -> None:
    from gradc.tools.term import MODES
    parser.add_argument("--color", choices=MODES, default="auto",
                        help="colour tables and statuses: auto (default) when the output is "
                             "a terminal and NO_COLOR is not set")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gradc", description="Compile gradient rules (.grad "
                                "files) to fused Numba kernels.")
    p.add_argument("--debug", action="store_true", help="verify the IR after every pass")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a .grad file to a Python module")
    c.add_argument("spec")
    c.add_argument("-o", "--output", type=_output_file,
                   help="output .py (default: <stem>_gen.py beside it; - for stdout)")
    c.add_argument("--target", choices=("cpu", "cuda", "all"), default="cpu")
    c.add_argument("--no-fuse", action="store_true", help="one kernel per primitive")
    c.add_argument("--fast-math", action="store_true",
                   help="Numba fast-math flags that keep NaN/inf semantics")
    c.add_argument("--precise", action="store_true", help=_PRECISE)
    c.add_argument("--emit", choices=("module", "ir", "torch"), default="module",
                   help="module: write the Python module (default); ir: print each op's "
                        "optimised IR (forward, vjp, fwd_bwd, jvp graphs after simplification, "
                        "CSE and DCE) to stdout and write nothing; torch: write a module of "
                        "PyTorch functions (default <stem>_torch.py; needs gradc and torch "
                        "where it runs: docs/frameworks.md)")
    c.add_argument("--op", action="append", metavar="NAME",
                   help="with --emit ir: only this op (repeatable)")
    c.set_defaults(fn=_cmd_compile)
    k = sub.add_parser("check", help="parse, type-check and gradient-check every op (finite "
                       "differences; jvp against vjp; second order)")
    k.add_argument("spec")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--json", metavar="FILE|-", type=_output_file,
                   help="also write the results as JSON (per op: each check's name, error, "
                        "tolerance, passed); '-': JSON to stdout, the text to stderr")
    k.add_argument("--precise", action="store_true",
                   help="accepted as for compile and bench; check runs the IR interpreter, "
                        "which computes with NumPy's functions either way")
    _color_option(k)
    k.set_defaults(fn=_cmd_check)
    b = sub.add_parser("bench", help="fused vs unfused vs NumPy, numexpr, JAX and PyTorch: "
                       "time and GB/s per op")
    b.add_argument("spec")
    b.add_argument("--sizes", type=_size, nargs="+", default=[10**6, 10**7], metavar="N",
                   help="elements per array (default 1e6 1e7; 1e4 to 1e8 as memory allows)")
    b.add_argument("--n", type=_size, help="one size (same as --sizes N)")
    b.add_argument("--shape", type=_shape, action="append", metavar="NAME=DIMS",
                   help="the shape of every benchmarked op's parameter NAME, e.g. "
                        "x=4096,1024 or x=4096x1024 (repeatable); other parameters are "
                        "chosen to fit it; an op whose shapes all follow from those given "
                        "runs once")
    b.add_argument("--repeat", type=int, default=11, help="timed repeats (default 11)")
    b.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    b.add_argument("--ops", nargs="+", metavar="OP", help="only these ops")
    b.add_argument("--variants", nargs="+", metavar="V",
                   help="only these: fused+out fused unfused numpy numexpr jax.jit torch "
                        "torch.compile (default: all installed)")
    b.add_argument("--skip", nargs="+", default=[], metavar="V",
                   help="leave these variants out (torch.compile compiles for seconds per op)")
    b.add_argument("--settle", type=float, default=0.01, metavar="S",
                   help="seconds slept before each timed call (default 0.01); then it "
                        "waits until no other thread of the process runs (up to 0.2 s), so "
                        "no library's threads spin while another is timed")
    b.add_argument("--json", metavar="FILE|-", type=_output_file,
                   help="write every measurement and machine info; "
                   "'-': JSON to stdout, the tables to stderr")
    b.add_argument("--plot", metavar="FILE.png", type=_output_file,
                   help="plot effective GB/s (matplotlib)")
    b.add_argument("--precise", action="store_true", help=_PRECISE)
    _color_option(b)
    b.set_defaults(fn=_cmd_bench)
    e = sub.add_parser("explain", help="the derived gradient and the kernel plan of an op")
    e.add_argument("spec")
    e.add_argument("op")
    e.set_defaults(fn=_cmd_explain)
    g = sub.add_parser("graph", help="draw the IR of an op, its fused kernels as clusters "
                       "(DOT; SVG, PNG or PDF through Graphviz)")
    g.add_argument("spec")
    g.add_argument("op")
    g.add_argument("-o", "--output", required=True, metavar="FILE", type=_output_file,
                   help="FILE.dot or .gv (DOT text), .svg, .png or .pdf (needs Graphviz's dot)")
    g.add_argument("--method", action="append", metavar="M",
                   choices=("forward", "vjp", "fwd_bwd", "jvp", "both"),
                   help="forward, vjp, fwd_bwd (default: forward and backward in one graph), "
                        "jvp, or both (forward and vjp side by side); repeatable")
    g.set_defaults(fn=_cmd_graph)
    t = sub.add_parser("testgen", help="write a pytest file that checks every op (gradients "
                       "against finite differences, fused against unfused, jvp, dtypes)")
    t.add_argument("spec")
    t.add_argument("-o", "--output", required=True, metavar="TEST.py", type=_output_file)
    t.set_defaults(fn=_cmd_testgen)
    d = sub.add_parser("demo", help="the main job on the bundled example")
    d.add_argument("--quick", action="store_true", help="fewer elements and epochs")
    _color_option(d)
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
            status = args.fn(args)
            sys.stdout.flush()       # a closed pipe raises here, not at exit
            return status
    except GradcError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:          # e.g. piped into head
        from gradc.tools.term import close_broken_pipe
        return close_broken_pipe()
    except OSError as exc:           # a missing file, a full disk, a directory as -o ...
        # the path and why, without Python's "[Errno 2]"
        said = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else exc
        print(f"error: {said}", file=sys.stderr)
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
