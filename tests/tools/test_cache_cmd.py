"""``python -m gradc.tools.cache_cmd info|clear`` and the metadata beside each entry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import gradc
from gradc.loader.disk_cache import entries
from gradc.tools.cache_cmd import human_age, human_size, main


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("GRADC_CACHE_DIR", str(d))
    return d


def _two_entries(tmp_path):
    a, b = tmp_path / "a.grad", tmp_path / "b.grad"
    a.write_text("op f(x) -> y { y = 2 * x }\n")
    b.write_text("op g(x) -> y { y = x * x }\n")
    ma, mb = gradc.load(a), gradc.load(b, fuse=False)
    ma.f(1.0)                                  # Numba writes its cache files beside it
    return a, b, ma, mb


def test_info_lists_each_entry(tmp_path, cache, capsys) -> None:
    assert main(["info"]) == 0
    assert capsys.readouterr().out == f"cache directory: {cache}\n0 entries, 0 B\n"
    a, b, ma, mb = _two_entries(tmp_path)
    old = time.time() - 7200
    os.utime(ma.__file__, (old, old))
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"cache directory: {cache}"
    found = entries()
    total = sum(e.size for e in found)
    assert lines[1] == f"2 entries, {human_size(total)}"
    assert lines[2].split() == ["source", "options", "age", "size"]
    assert lines[3].split()[:4] == [str(a.resolve()), "{}", "2", "h"]       # oldest first
    assert lines[4].split()[:3] == [str(b.resolve()), '{"fuse":', "false}"]
    assert lines[3].endswith(human_size(found[0].size))
    numba_files = [f for f in found[0].files if f.suffix in (".nbi", ".nbc")]
    assert numba_files and found[0].size > os.path.getsize(ma.__file__)


def test_info_json(tmp_path, cache, capsys) -> None:
    a, b, ma, mb = _two_entries(tmp_path)
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cache_dir"] == str(cache) and data["entries"] == 2
    assert [m["source"] for m in data["modules"]] == [str(a.resolve()), str(b.resolve())]
    assert [m["options"] for m in data["modules"]] == [{}, {"fuse": False}]
    assert data["size"] == sum(m["size"] for m in data["modules"]) > 0
    assert [m["module"] for m in data["modules"]] == [os.path.basename(ma.__file__),
                                                      os.path.basename(mb.__file__)]


def test_an_entry_without_metadata_is_listed(tmp_path, cache, capsys) -> None:
    _, _, ma, _ = _two_entries(tmp_path)
    os.remove(ma.__file__[:-3] + ".json")
    assert main(["info"]) == 0
    assert f"? ({os.path.basename(ma.__file__)}, no metadata)" in capsys.readouterr().out


def test_info_on_metadata_of_any_shape(tmp_path) -> None:
    """Metadata of another shape, or naming files that are not UTF-8 or hold terminal
    escapes, is listed (was TypeError or UnicodeEncodeError); in a fresh process, whose
    output is not a terminal (strict UTF-8)."""
    metas = ["null", "[1, 2]", '{"source": 5, "options": "fast"}', '{"source": ["a"]}',
             '{"source": "/p/ops\\udcff.grad", "options": {"fuse": false}}',
             '{"source": "/p/\\u001b[2Jops.grad", "options": {"x": "\\ud800"}}']
    for i, meta in enumerate(metas):
        (tmp_path / f"gradc_m{i}_0123.py").write_text("# not a module\n")
        (tmp_path / f"gradc_m{i}_0123.json").write_text(meta)
    def info(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "gradc.tools.cache_cmd", "--dir", str(tmp_path),
                               "info", *args], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"}).stdout

    text = info()
    assert "6 entries" in text and "/p/ops\\udcff.grad" in text and "\x1b" not in text
    rows = json.loads(info("--json"))["modules"]
    assert [(r["source"], r["options"]) for r in rows] == [
        (None, None), (None, None), (None, None), (None, None),
        ("/p/ops\udcff.grad", {"fuse": False}), ("/p/\x1b[2Jops.grad", {"x": "\ud800"})]


def test_clear_removes_the_entries_and_numba_files(tmp_path, cache, capsys) -> None:
    _two_entries(tmp_path)
    (cache / "gradc_orphan_0123.json").write_text("{}")
    assert main(["clear"]) == 0
    assert capsys.readouterr().out == f"removed 2 entries from {cache}\n"
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == []
    assert main(["clear"]) == 0
    assert capsys.readouterr().out == f"removed 0 entries from {cache}\n"


def test_python_dash_m(tmp_path, cache) -> None:
    out = subprocess.run([sys.executable, "-m", "gradc.tools.cache_cmd", "--dir", str(tmp_path / "none"),
                          "info"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"cache directory: {tmp_path / 'none'}\n0 entries")
    bad = subprocess.run([sys.executable, "-m", "gradc.tools.cache_cmd", "purge"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "invalid choice: 'purge'" in bad.stderr


@pytest.mark.parametrize("command", [["-m", "gradc.tools.cache_cmd", "info"], ["-m", "gradc", "--help"],
                                     ["-m", "gradc", "compile", "examples/activations.grad",
                                      "--emit", "ir"]])
def test_output_into_a_closed_pipe_ends_quietly(command) -> None:
    """``... | head``: the reader is gone before the first write; no traceback, exit 0."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, *command], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                     (1536, "1.5 KiB"), (5 * 2**20, "5.0 MiB"),
                                     (3 * 2**40, "3072.0 GiB")])
def test_human_size(n, text) -> None:
    assert human_size(n) == text


@pytest.mark.parametrize("s, text", [(0, "0 s"), (59, "59 s"), (60, "1 min"), (7200, "2 h"),
                                     (3 * 86400 + 5, "3 d")])
def test_human_age(s, text) -> None:
    assert human_age(s) == text
