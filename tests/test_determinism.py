"""Determinism (issue 3, section 3.4): the same input gives byte-identical output,
and the same cache key, in every process whatever its ``PYTHONHASHSEED``.

The spec examples (SPEC's ``spec-examples/`` where the shared folder is present,
their copies in ``tests/frontend/spec_examples/``) and ``examples/*.grad`` are
compiled with ``gradc compile`` in subprocesses run with PYTHONHASHSEED 0, 1 and
random (at the same time), and compared with each other and with this process.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gradc
from gradc.loader.load import entry_name

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/spec-examples")


def _compiles(p: Path) -> bool:
    """Whether gradc accepts ``p`` (the shared folder also holds examples of the next
    language, such as arrays.grad, which gradc does not compile yet)."""
    try:
        gradc.compile_source(p.read_text(encoding="utf-8"), file=p.name)
    except gradc.GradcError:
        return False
    return True


SOURCES = sorted({p.read_bytes(): p for p in [
    *(p for p in SHARED.glob("*.grad") if _compiles(p)),
    *(ROOT / "tests/frontend/spec_examples").glob("*.grad"),
    *(ROOT / "examples").glob("*.grad")]}.values())

# Compiles every file given (relative paths, so that the text does not depend on
# where the repository is) through the CLI's code path, and prints the SHA-256 of
# each module's bytes and its cache key.
_SCRIPT = """
import hashlib, json, sys, warnings
from pathlib import Path
import gradc
from gradc.loader.load import entry_name
warnings.simplefilter("ignore")
out = {}
for name, dest in zip(sys.argv[1::2], sys.argv[2::2]):
    gradc.compile_file(name, dest)
    out[name] = [hashlib.sha256(Path(dest).read_bytes()).hexdigest(),
                 entry_name(Path(name).resolve(), {})[0]]
print(json.dumps(out))
"""


def _relative(p: Path) -> str:
    return os.path.relpath(p, ROOT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """seed -> {file: [sha256 of the module, cache entry name]}, from three processes."""
    procs = {}
    for seed in ("0", "1", "random"):
        out = tmp_path_factory.mktemp(f"seed{seed}")
        args = [a for i, p in enumerate(SOURCES) for a in (_relative(p), str(out / f"{i}.py"))]
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        procs[seed] = subprocess.Popen([sys.executable, "-c", _SCRIPT, *args], cwd=ROOT, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for seed, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        results[seed] = json.loads(stdout)
    return results


def test_sources_found() -> None:
    names = {p.name for p in SOURCES}
    assert {"seed.grad", "activations.grad"} <= names


def test_the_same_bytes_and_cache_key_under_every_hash_seed(runs) -> None:
    first = runs["0"]
    assert set(first) == {_relative(p) for p in SOURCES}
    for seed, result in runs.items():
        assert result == first, f"PYTHONHASHSEED={seed} differs"


@pytest.mark.filterwarnings("ignore::gradc.GradcWarning")   # clipped_relu: W401, as meant
def test_the_same_bytes_and_cache_key_in_this_process(runs, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    for p in SOURCES:
        name = _relative(p)
        text = gradc.compile_source(p.read_text(encoding="utf-8"), file=name)
        sha, key = runs["0"][name]
        assert hashlib.sha256(text.encode()).hexdigest() == sha, name
        assert entry_name(Path(name).resolve(), {})[0] == key, name


def test_the_cache_key_follows_the_options(tmp_path) -> None:
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x }\n")
    plain = entry_name(src, {})[0]
    assert entry_name(src, {})[0] == plain
    assert entry_name(src, {"fuse": False})[0] != plain
    assert entry_name(src, {"fuse": False, "fast_math": True})[0] == \
        entry_name(src, {"fast_math": True, "fuse": False})[0]
