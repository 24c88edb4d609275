"""``gradc demo`` writes nothing outside gradc's cache (it once left a ``gradc-demo-*``
folder in the temp folder on every run)."""
from __future__ import annotations

import sys
import tempfile

from gradc.tools import demo


def test_demo_writes_only_to_the_cache(tmp_path, monkeypatch, capsys):
    tmp, cache = tmp_path / "tmp", tmp_path / "cache"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)          # re-read TMPDIR
    monkeypatch.setenv("GRADC_CACHE_DIR", str(cache))
    for name in [k for k in sys.modules if k.startswith("gradc_seed_")]:
        monkeypatch.delitem(sys.modules, name)     # loaded by an earlier test: load again
    # steps 4 and 5 (timing at 10^6 elements, training) are tested on their own
    # (tests/tools/test_bench.py, tests/test_digits.py): here they print a line
    monkeypatch.setattr("gradc.tools.bench.bench_file", lambda *a, **k: "bench")

    class Train:
        @staticmethod
        def run(module, epochs):
            return {"test_accuracy": 1.0}
    monkeypatch.setattr(demo, "_train_module", lambda: Train)
    assert demo.run_demo(quick=True) == 0
    out = capsys.readouterr().out
    assert f"compiled to {cache}" in out
    assert list(tmp.iterdir()) == []
    assert {p.suffix for p in cache.iterdir()} >= {".py", ".json"}
