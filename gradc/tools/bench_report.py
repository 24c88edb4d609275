"""The report of ``gradc bench``: aligned tables, the JSON file and the plot."""
from __future__ import annotations

import importlib.util

import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Sequence

from gradc.tools.term import style, table, use_color, write_output

# gradc's own variants; the others in a report are its peers (the "best other" column)
GRADC_VARIANTS = ("fused+out", "fused", "unfused")

_LEGEND = (
    ("fused+out", "gradc's fused fwd_bwd writing preallocated out= buffers"),
    ("fused", "the same, allocating its results (as users call it)"),
    ("unfused", "gradc's kernels one per primitive, intermediates stored (out=)"),
    ("numpy", "{numpy}"),
    ("numexpr", "one expression per output, printed from gradc's IR (out=)"),
    ("jax.jit", "jax.vjp of the IR evaluated with jax.numpy (jax.custom_vjp for grad "
                "blocks), jitted"),
    ("torch", "torch.autograd of the IR in torch ops (autograd.Function for grad blocks)"),
    ("torch.compile", "the same, the forward under torch.compile"),
    ("best other", "the fastest non-gradc variant; its time over fused+out's (> 1: gradc "
                   "is faster)"),
    ("GB/s", "each input and upstream read once and each result written once, over the "
             "median time; %: of the bandwidth of the numba 2-read/2-write kernel timed in "
             "the same repeats"),
    ("unfused / fused+out", "time: unfused's median over fused+out's; bytes per element: "
                            "what each plan moves over the largest loop (at float32 unless "
                            "marked), the most fusion can gain where both are memory-bound"),
)


def _legend(numpy: str, variants: Sequence[str]) -> list[str]:
    """The meaning of each column shown."""
    import textwrap
    return [textwrap.fill(f"{term}: {text.format(numpy=numpy)}", 92, subsequent_indent="    ")
            for term, text in _LEGEND
            if term in variants or term in ("best other", "GB/s")
            or term == "unfused / fused+out" and {"unfused", "fused+out"} <= set(variants)]


_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER",
        "NUMEXPR_NUM_THREADS", "XLA_FLAGS", "GRADC_PARALLEL_MIN")
"""Environment variables that change threading, reported with the results."""


def machine_info(variants: Sequence[str] = ()) -> dict:
    """CPU count and model, memory, versions and thread counts of every library used."""
    import numba
    import numpy as np

    import gradc
    info = {"cpu_count": os.cpu_count(), "cpu_model": _cpu_model(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "memory_gb": _memory_gb(),
            "versions": {"gradc": gradc.__version__, "numpy": np.__version__,
                         "numba": numba.__version__},
            "threads": {"numba": numba.get_num_threads(), "numba_layer": _numba_layer()},
            "environment": {k: os.environ[k] for k in _ENV if k in os.environ}}
    if "numexpr" in variants:
        import numexpr
        info["versions"]["numexpr"] = numexpr.__version__
        info["threads"]["numexpr"] = numexpr.get_num_threads()
    if "jax.jit" in variants:
        import jax
        info["versions"]["jax"] = jax.__version__
        info["threads"]["jax_devices"] = [str(d) for d in jax.devices()]
    if any(v.startswith("torch") for v in variants):
        import torch
        info["versions"]["torch"] = torch.__version__
        info["threads"]["torch"] = torch.get_num_threads()
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _numba_layer() -> str:
    import numba
    try:
        return numba.threading_layer()
    except ValueError:
        return "not chosen yet"


# -- text -----------------------------------------------------------------------------


def _num(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    for limit, digits in ((100, 0), (10, 1), (1, 2), (0.01, 3)):
        if v >= limit:
            return f"{v:.{digits}f}"
    return f"{v:.4f}"


def format_report(report: dict, color: bool = False) -> str:
    """Per size: median ms, effective GB/s (% of copy) and max relative error."""
    m = report["machine"]
    v, t = m["versions"], m["threads"]
    libs = [f"numpy {v['numpy']}", f"numba {v['numba']} ({t['numba']} threads, "
            f"{t['numba_layer']})"]
    libs += [f"numexpr {v['numexpr']} ({t['numexpr']} threads)"] if "numexpr" in v else []
    libs += [f"jax {v['jax']} ({', '.join(t['jax_devices'])})"] if "jax" in v else []
    libs += [f"torch {v['torch']} ({t['torch']} threads)"] if "torch" in v else []
    out = [f"gradc bench {report['spec']}: fwd_bwd, median of {report['repeat']} interleaved "
           f"repeats after {report['warmup']} warm-ups",
           f"{m['cpu_count']} CPUs ({m['cpu_model']}), {', '.join(libs)}"]
    if m.get("environment"):
        out.append("environment: " + ", ".join(f"{k}={v}" for k, v in m["environment"].items()))
    if m.get("loadavg_before"):
        out.append(f"load average (1 min) before {m['loadavg_before'][0]}, after "
                   f"{m['loadavg_after'][0]} (this run adds up to its thread count; more "
                   "means other work shared the cores)")
    out += [style(w, "bold", on=color) for w in interference(report)]
    for n in report["sizes"]:
        cases = [r for r in report["results"] if r["n"] == n and not r.get("shapes_given")]
        if cases:
            out += [""] + _size_block(n, cases, report["variants"], color)
    shaped: dict[str, list[dict]] = {}      # shapes given (--shape): a block per shapes
    for r in report["results"]:
        if r.get("shapes_given"):
            shaped.setdefault(shapes_label(r["shapes"]), []).append(r)
    for label, cases in shaped.items():
        out += [""] + _size_block(cases[0]["n"], cases, report["variants"], color, label)
    out += [""] + _legend(report["numpy"], report["variants"])
    notes = _notes(report)
    return "\n".join(out + ([""] + notes if notes else []))


LOAD_IDLE = 0.5
"""A 1-minute load average from which other work is taken to share the cores."""


def interference(report: dict) -> list[str]:
    """Warnings that the times may include other work's: a load average of
    :data:`LOAD_IDLE` or more before the run (other work running), or above the usable
    cores after it (more threads ran than there are cores: this run alone keeps at
    most one per core busy while it is timed), and variants timed while a thread of
    this process still ran (one that never slept within the bench's limit)."""
    m, out = report["machine"], []
    before, after = m.get("loadavg_before"), m.get("loadavg_after")
    cores = m.get("cpus_usable") or m.get("cpu_count") or 1
    if before and after and (before[0] >= LOAD_IDLE or after[0] > cores):
        out.append(f"warning: interference: load average {before[0]} before the run and "
                   f"{after[0]} after it on {cores} usable cores: other work competed for "
                   "the cores, so the times may be inflated and the ratios skewed; rerun "
                   "on an idle machine")
    busy: dict[str, int] = {}
    for r in report["results"]:
        for v, k in r.get("busy", {}).items():
            busy[v] = busy.get(v, 0) + k
    if busy:
        out.append("warning: another thread of this process still ran when these were "
                   "timed (times per variant): " + ", ".join(f"{v} {k}" for v, k in busy.items()))
    return out


def shapes_label(shapes: dict) -> str:
    """``{"x": [8, 16], "b": [16], "alpha": []}`` -> ``"x 8×16, b 16"`` (scalars left out)."""
    return ", ".join(f"{k} {'×'.join(map(str, v))}" for k, v in shapes.items() if v)


def _size_block(n: int, cases: list[dict], order: Sequence[str], color: bool,
                label: str | None = None) -> list[str]:
    """The tables of the cases at size ``n``, or (``label``) of the shapes given."""
    import numpy as np
    cols = [v for v in order if any(v in c["variants"] for c in cases)]
    ref = {k: float(np.median([c["references"][k]["median_s"] for c in cases]))
           for k in ("copy 2r/2w", "np.copyto")}
    gbs = {k: float(np.median([c["references"][k]["gbs"] for c in cases])) for k in ref}
    dt = cases[0]["dtype"]
    mb = n * np.dtype(dt).itemsize / 1e6
    head = f"shapes {label} ({dt}, {mb:g} MB in the largest array)" if label is not None \
        else f"n = {n:,} ({dt}, {mb:g} MB per array)"
    out = [f"{head}; copy: "
           f"numba 2-read/2-write {_num(ref['copy 2r/2w'] * 1e3)} ms = "
           f"{gbs['copy 2r/2w']:.1f} GB/s, np.copyto {_num(ref['np.copyto'] * 1e3)} ms = "
           f"{gbs['np.copyto']:.1f} GB/s (medians over ops)"]
    ms_rows, gb_rows, err_rows, bold = [], [], [], []
    for c in cases:
        vs = c["variants"]
        ms_rows.append([c["op"]] + [_num(vs[k]["median_s"] * 1e3) if k in vs else "-"
                                    for k in cols] + [_best_other(vs)])
        gb_rows.append([c["op"]] + [f"{vs[k]['gbs']:.1f} ({vs[k]['pct_copy']:.0f}%)"
                                    if k in vs else "-" for k in cols])
        err_rows.append([c["op"]] + [f"{vs[k]['max_rel_err']:.0e}" if k in vs else "-"
                                     for k in cols[1:]])
        fastest = min((k for k in cols if k in vs), key=lambda k: vs[k]["median_s"],
                      default=None)
        bold.append(None if fastest is None else 1 + cols.index(fastest))
    out += table(["median ms", *cols, "best other"], ms_rows, bold, color)
    out += [""] + table(["GB/s (% copy)", *cols], gb_rows, [None] * len(cases), color)
    out += [""] + table(["max rel err", *cols[1:]], err_rows, [None] * len(cases), color)
    fusion = [[c["op"], f"{vs['unfused']['median_s'] / vs['fused+out']['median_s']:.1f}x",
               f"{t['unfused_B']} / {t['fused_B']} B = {t['unfused_B'] / t['fused_B']:.1f}x"
               + ("" if t.get("dtype", "float32") == "float32" else f" ({t['dtype']})")]
              for c in cases for vs, t in [(c["variants"], c.get("traffic"))]
              if t and t["fused_B"] and {"unfused", "fused+out"} <= vs.keys()]
    if fusion:
        out += [""] + table(["unfused / fused+out", "time", "bytes per element"], fusion,
                             [None] * len(fusion), color)
    return out


def _best_other(vs: dict) -> str:
    others = {k: r["median_s"] for k, r in vs.items() if k not in GRADC_VARIANTS}
    if not others or "fused+out" not in vs:
        return "-"
    k = min(others, key=others.get)
    return f"{others[k] / vs['fused+out']['median_s']:.1f}x {k}"


def _notes(report: dict) -> list[str]:
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in report["results"]:
        for v, why in r["unavailable"].items():
            ops = reasons.setdefault((v, why), [])
            if r["op"] not in ops:
                ops.append(r["op"])
    notes = [f"not run: {v} for {', '.join(ops)}: {why}" for (v, why), ops in reasons.items()]
    left_out = [v for v in ("numexpr", "jax.jit", "torch", "torch.compile")
                if v not in report["variants"]]
    absent = [v for v in left_out if importlib.util.find_spec(v.split(".")[0]) is None]
    if absent:
        notes.append(f"not installed: {', '.join(absent)} (pip install gradc[bench])")
    if len(absent) < len(left_out):
        notes.append("not selected: " + ", ".join(v for v in left_out if v not in absent)
                     + " (--variants)")
    for s in report["skipped"]:
        at = f" at shapes {shapes_label(s['shapes'])}" if s.get("shapes") else \
            f" at n = {s['n']:,}" if "n" in s else ""
        notes.append(f"skipped: {s['op']}{at}: {s['reason']}")
    return notes


# -- files ----------------------------------------------------------------------------


def write_json(report: dict, path: str | Path) -> None:
    """The report with every sample, strict JSON (inf and NaN as null), to ``path``
    (written atomically) or to stdout when ``path`` is ``-``."""
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    write_output(path, json.dumps(clean(report), indent=1, allow_nan=False) + "\n")


def plot_report(report: dict, path: str | Path) -> None:
    """Effective GB/s per variant: bars per op at one size, lines over sizes otherwise."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    res = report["results"]
    ops = list(dict.fromkeys(r["op"] for r in res))
    variants = [v for v in report["variants"] if any(v in r["variants"] for r in res)]
    sizes = sorted({r["n"] for r in res})
    if len(sizes) == 1:
        fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(ops) + 2), 4.5))
        w = 0.8 / len(variants)
        for k, v in enumerate(variants):
            ys = [next((r["variants"][v]["gbs"] for r in res if r["op"] == o
                        and v in r["variants"]), 0) for o in ops]
            ax.bar(np.arange(len(ops)) + k * w, ys, w, label=v)
        copy = np.median([r["references"]["copy 2r/2w"]["gbs"] for r in res])
        ax.axhline(copy, color="k", ls="--", lw=1, label="copy 2r/2w")
        ax.set_xticks(np.arange(len(ops)) + 0.4 - w / 2, ops, rotation=30, ha="right")
        ax.set_ylabel("effective GB/s")
        ax.set_title(f"{Path(report['spec']).name}: fwd_bwd at n = {sizes[0]:,}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        cols = min(4, len(ops))
        rows = math.ceil(len(ops) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3 * rows), squeeze=False)
        for ax, o in zip(axes.flat, ops):
            mine = sorted((r for r in res if r["op"] == o), key=lambda r: r["n"])
            for v in variants:
                pts = [(r["n"], r["variants"][v]["gbs"]) for r in mine if v in r["variants"]]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=v)
            ax.plot([r["n"] for r in mine],
                    [r["references"]["copy 2r/2w"]["gbs"] for r in mine], "k--", lw=1,
                    label="copy 2r/2w")
            ax.set_xscale("log")
            ax.set_title(o, fontsize=9)
            ax.set_ylabel("effective GB/s", fontsize=8)
        for ax in list(axes.flat)[len(ops):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=6)
        fig.suptitle(f"{Path(report['spec']).name}: fwd_bwd, effective GB/s over n")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def stdout_is_tty() -> bool:
    """Whether stdout gets colour under ``--color auto`` (see :mod:`gradc.tools.term`)."""
    return use_color(sys.stdout)
