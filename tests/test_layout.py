"""The package's layout, read from the source with ``ast`` (every import statement, at
any depth, inside functions too): the package root holds only the public API, the errors,
the version and the pipeline; no module imports another's private names; the modules'
imports form no cycle; no two modules share a name; pyproject.toml ships every package."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gradc"

# The root: the public API (__init__, and __main__ for python -m gradc), the errors, the
# pipeline, and the version, which the loader's disk cache and the module header need
# without importing the public API (that imports them: a cycle) or the pipeline (slow).
ROOT_FILES = {"__init__.py", "__main__.py", "errors.py", "pipeline.py", "version.py"}

# The generated module's namespace: the run time, helpers and math library copied into
# every generated module (gradc/codegen/runtime*_src.py, prelude.py, mathlib_*.py) are
# written with a ``_g_``/``_G_`` prefix (its op class: ``_Gradc``), to keep clear of user
# names there; the files of gradc/codegen import them from each other, nothing else does.
GENERATED_PREFIXES = ("_g_", "_G_", "_Gradc")

# ir.lower -> autodiff.higher -> autodiff.reverse -> ir.lower (and higher <-> reverse):
# issue 21 item 2 removes it; test_no_cycle_through_lower_and_autodiff says when it is gone.


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@dataclass(frozen=True)
class Use:
    """Module ``source`` imports module ``target`` (line ``line``), and with it the
    name ``name`` (None for the module itself); ``attribute``: read as
    ``module.name`` rather than imported."""
    source: str
    target: str
    name: str | None
    line: int
    attribute: bool = False


def _owner(dotted: str) -> str | None:
    """The gradc module ``dotted`` names or lies in (a package: its __init__)."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def uses(source: str) -> list[Use]:
    """Every gradc module ``source`` imports, with the names it takes from each, and its
    reads of ``alias._name`` where ``alias`` is an imported gradc module."""
    path = MODULES[source]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found, aliases = [], {}          # local name -> gradc module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                target = _owner(a.name)
                if target is not None:
                    found.append(Use(source, target, None, node.lineno))
                    if a.asname:
                        aliases[a.asname] = target
                    else:
                        aliases[a.name.partition(".")[0]] = _owner(a.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if _owner(base) is None:
                continue
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:         # a module: from gradc.x import y
                    found.append(Use(source, f"{base}.{a.name}", None, node.lineno))
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                else:
                    found.append(Use(source, _owner(base), a.name, node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            base = _dotted(node.value)
            if base is None:
                continue
            head, _, rest = base.partition(".")
            if head in aliases:
                target = _owner(f"{aliases[head]}.{rest}" if rest else aliases[head])
                if target is not None and target != source:
                    found.append(Use(source, target, node.attr, node.lineno, attribute=True))
    return found


ALL_USES = [u for m in MODULES for u in uses(m)]


def _private(name: str | None) -> bool:
    return name is not None and name.startswith("_") and not name.startswith("__")


def _allowed(u: Use) -> bool:
    """A ``_g_`` name of the generated module's namespace, used within gradc/codegen."""
    return (u.name.startswith(GENERATED_PREFIXES) and u.source.startswith("gradc.codegen.")
            and u.target.startswith("gradc.codegen."))


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    g.add_edges_from((u.source, u.target) for u in ALL_USES
                     if not u.attribute and u.source != u.target)
    return g


def test_the_package_root_holds_only_the_api_errors_version_and_pipeline():
    found = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.is_dir()}
    assert found <= ROOT_FILES, sorted(found - ROOT_FILES)


def test_no_private_name_is_used_across_modules():
    bad = [f"{MODULES[u.source].relative_to(ROOT)}:{u.line}: {u.target}"
           f"{'.' if u.attribute else ' import '}{u.name}"
           for u in ALL_USES if u.source != u.target and _private(u.name) and not _allowed(u)]
    assert not bad, "\n".join(bad)


def test_the_generated_namespace_is_used_only_in_codegen():
    bad = [f"{MODULES[u.source].relative_to(ROOT)}:{u.line}: {u.target} {u.name}"
           for u in ALL_USES if u.name and u.name.startswith(GENERATED_PREFIXES)
           and not u.source.startswith("gradc.codegen.")]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "\n".join(" -> ".join(c + c[:1]) for c in cycles)


def test_no_two_modules_share_a_name():
    by_name: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(name)
    shared = {k: v for k, v in by_name.items() if len(v) > 1}
    assert not shared, shared


def test_pyproject_ships_every_package():
    tomllib = pytest.importorskip("tomllib")            # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(project["tool"]["setuptools"]["packages"])
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert packages <= listed, sorted(packages - listed)
    assert {p for p in listed if p not in project["tool"]["setuptools"]["package-dir"]} \
        <= packages, "packages listed that do not exist"
