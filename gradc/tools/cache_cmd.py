"""``python -m gradc.tools.cache_cmd info|clear``: what :func:`gradc.load` has cached, and
removing it.  A thin argparse layer over :mod:`gradc.loader.disk_cache`.

``info`` prints the cache directory, the number of entries and their total size,
then per entry (oldest first) the .grad file it was compiled from, the compile
options, its age and its size on disk (the module, its metadata, Python's bytecode
and Numba's cache files of its kernels); ``--json`` prints the same as JSON.
``clear`` removes every entry with those files and says how many it removed.
Exit status: 0, or 2 on bad usage.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gradc.codegen.quote import comment
from gradc.loader.disk_cache import cache_dir, clear, entries
from gradc.tools.term import close_broken_pipe, table


def human_size(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``12.0 MiB``...: binary prefixes, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float) -> str:
    """``42 s``, ``5 min``, ``3 h``, ``2 d``."""
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds // length:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def info(root: Path, as_json: bool = False) -> str:
    """The text (or JSON) ``python -m gradc.tools.cache_cmd info`` prints for ``root``."""
    now = time.time()
    found = entries(root)
    # The metadata is read as JSON, but may hold anything: a field of another type is
    # shown as unknown.
    rows = [{"module": e.path.name, "source": _field(e.meta, "source", str),
             "options": _field(e.meta, "options", dict), "age_s": round(now - e.mtime, 1),
             "size": e.size} for e in found]
    if as_json:
        return json.dumps({"cache_dir": str(root), "entries": len(rows),
                           "size": sum(r["size"] for r in rows), "modules": rows}, indent=2)
    lines = [f"cache directory: {comment(str(root))}",
             f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}, "
             f"{human_size(sum(r['size'] for r in rows))}"]
    if rows:
        # comment(): names with line breaks, terminal escapes, undecodable bytes
        body = [[comment(r["source"] or f"? ({r['module']}, no metadata)"),
                 json.dumps(r["options"]) if r["options"] is not None else "?",
                 human_age(r["age_s"]), human_size(r["size"])] for r in rows]
        lines += table(["source", "options", "age", "size"], body, [None] * len(body), False)
    return "\n".join(lines)


def _field(meta: dict, name: str, kind: type):
    value = meta.get(name)
    return value if isinstance(value, kind) else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradc.tools.cache_cmd",
                                description="The cache of modules compiled by gradc.load "
                                            "($GRADC_CACHE_DIR, else ~/.cache/gradc).")
    p.add_argument("--dir", type=Path, help="the cache directory (default: the one "
                                            "gradc.load uses)")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("info", help="the entries: source, options, age and size")
    i.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("clear", help="remove every entry (and Numba's cache files of it)")
    args = p.parse_args(argv)
    root = args.dir or cache_dir()
    try:
        if args.command == "info":
            print(info(root, args.json), flush=True)
        else:
            n = clear(root)
            print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {root}", flush=True)
    except BrokenPipeError:          # e.g. piped into head
        return close_broken_pipe()
    return 0


if __name__ == "__main__":
    sys.exit(main())
