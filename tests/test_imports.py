"""The compiler's core has no import cycle, counting imports inside functions.

Dependencies point one way: the front end, the IR, autodiff, the passes and the
pipeline.  The lowering of ops imports autodiff (it expands ``grad()`` nodes once an
op is lowered); autodiff lowers rules with :mod:`gradc.ir.expr` and copies in a
grad block that the lowering lowered once (a template its custom region's rule
holds), so it never imports :mod:`gradc.ir.lower`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import gradc

PACKAGE = Path(gradc.__file__).parent
CORE = ("gradc.frontend", "gradc.ir", "gradc.autodiff", "gradc.passes", "gradc.pipeline",
        "gradc.errors")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """gradc's modules, with an edge for every import of another (at any depth)."""
    files = {_module_name(f): f for f in sorted(PACKAGE.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    g = nx.DiGraph()
    g.add_nodes_from(files)
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith("gradc") else None
                if target is not None and target != mod:
                    g.add_edge(mod, target)
    return g


def test_no_import_cycle_in_the_core():
    g = import_graph()
    core = [m for m in g if m.startswith(CORE)]
    cycles = list(nx.simple_cycles(g.subgraph(core)))
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles)


def test_autodiff_never_imports_the_lowering_of_ops():
    g = import_graph()
    for mod in (m for m in g if m.startswith("gradc.autodiff")):
        assert "gradc.ir.lower" not in nx.descendants(g, mod), mod
