"""gradc.load: compile through the on-disk cache and import."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import gradc
from gradc.loader.disk_cache import cache_dir, entries, entry_is_valid
from gradc.loader.load import entry_name


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("GRADC_CACHE_DIR", str(d))
    return d


def test_load_compiles_once_and_reuses(tmp_path, cache):
    src = tmp_path / "ops.grad"
    src.write_text("op double(x) -> y { y = 2 * x }\n")
    m1 = gradc.load(src)
    assert cache_dir() == cache
    files = sorted(cache.glob("*.py"))
    assert len(files) == 1
    m2 = gradc.load(src)
    assert m2 is m1
    np.testing.assert_array_equal(m1.double(np.arange(3.0)), [0.0, 2.0, 4.0])


def test_changed_source_recompiles(tmp_path, cache):
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = 2 * x }\n")
    a = gradc.load(src)
    src.write_text("op f(x) -> y { y = 3 * x }\n")
    b = gradc.load(src)
    assert a is not b
    assert float(b.f(np.float64(1.0))) == 3.0
    assert len(list(cache.glob("*.py"))) == 2


def test_changed_import_recompiles(tmp_path, cache):
    (tmp_path / "lib.grad").write_text("op g(x) -> y { y = x + 1 }\n")
    src = tmp_path / "main.grad"
    src.write_text('import "lib.grad"\nop f(x) -> y { y = g(x) }\n')
    a = gradc.load(src)
    (tmp_path / "lib.grad").write_text("op g(x) -> y { y = x + 2 }\n")
    b = gradc.load(src)
    assert float(a.f(np.float64(0.0))) == 1.0 and float(b.f(np.float64(0.0))) == 2.0


def test_concurrent_processes_both_get_a_module(tmp_path, cache):
    """Two processes that start compiling the same file at the same moment (both wait
    for a start file, after importing gradc) both import a correct module, and the
    cache ends with one valid entry."""
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = x * x }\n")
    go = tmp_path / "go"
    code = ("import os, time, gradc, numpy as np\n"
            f"open({str(tmp_path)!r} + '/ready-' + str(os.getpid()), 'w').close()\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
            f"m = gradc.load({str(src)!r})\n"
            "print(m.__file__, float(m.f(np.float64(3.0))))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    entry = cache / f"{entry_name(src.resolve(), {})[0]}.py"
    assert outs == [[str(entry), "9.0"]] * 2
    assert [e.path for e in entries()] == [entry] and entry_is_valid(entry)
    assert entries()[0].meta["source"] == str(src.resolve())
    assert not list(cache.glob(".*.tmp"))


def test_load_errors(tmp_path, cache):
    with pytest.raises(FileNotFoundError):
        gradc.load(tmp_path / "missing.grad")
    bad = tmp_path / "bad.grad"
    bad.write_text("op f(x) -> y { y = q }\n")
    with pytest.raises(gradc.GradcError, match="undefined name 'q'"):
        gradc.load(bad)


def test_target_and_cuda_unroll_are_part_of_the_key(tmp_path, cache, monkeypatch):
    """A module written for another target, or with another GRADC_CUDA_UNROLL, is
    another cache entry (writing CUDA kernels needs no numba-cuda)."""
    src = tmp_path / "ops.grad"
    src.write_text("op f(x) -> y { y = 2 * x }\n")
    names = {entry_name(src.resolve(), {})[0], entry_name(src.resolve(), {"target": "all"})[0]}
    monkeypatch.setenv("GRADC_CUDA_UNROLL", "4")
    names.add(entry_name(src.resolve(), {"target": "all"})[0])
    assert len(names) == 3


def test_compiler_warnings_are_shown_again_from_the_cache(tmp_path, cache):
    """The compile shows its warnings (W405 here), with the caret, attributed to the
    caller's line; a warning about a rule marked 'surrogate' (intended) is not shown
    again by a process that reads the module from the cache."""
    src = tmp_path / "ops.grad"
    src.write_text("op c(x) -> y {\n    y = 2 * x\n} grad(dy) -> dx surrogate {\n"
                   "    dx = ones_like(dy)\n}\n")
    code = ("import sys, warnings, gradc\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            f"    gradc.load({str(src)!r})\n"
            "print(len(caught))\n"
            "if caught: print(caught[0].filename); print(caught[0].message)\n")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout for _ in range(2)]
    assert len(entries(cache)) == 1                 # the second run compiled nothing
    assert runs[1].startswith("0\n")                 # intended: shown once, when compiled
    count, filename, message = runs[0].split("\n", 2)
    assert count == "1" and filename == "<string>"
    assert f"{src}:4:5: warning[W405]: op 'c' has no forward mode" in message
    assert "4 |     dx = ones_like(dy)" in message and "|     ^^" in message



def test_a_refused_argument_raises_from_the_public_method(tmp_path, cache):
    """The traceback of an argument error ends one frame below the caller's line (the
    public method), not 3-8 frames into the generated module's checks."""
    import traceback
    import numpy as np
    import gradc
    src = tmp_path / "t.grad"
    src.write_text("op t(x) -> y {\n    y = tanh(x)\n}\n")
    m = gradc.load(src)
    for call in (lambda: m.t.fwd_bwd(np.ones(3), np.ones(4)), lambda: m.t(np.ones(3), out=1)):
        try:
            call()
        except (ValueError, TypeError) as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            # this test, its lambda, the public method: none of the checks' frames
            assert str(exc).startswith("t") and len(frames) == 3, frames
            assert frames[-1].name in ("call", "__call__"), frames
        else:
            raise AssertionError("no error")
