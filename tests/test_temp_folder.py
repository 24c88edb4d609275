"""A run of the suite leaves the temp folder as it found it (tests/conftest.py): a test
that leaves a file there fails the run, and the run's own temp folder is removed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")


def run_suite(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(CONFTEST, suite / "conftest.py")
    (suite / "test_it.py").write_text(f"import tempfile\n\ndef test_it(tmp_path):\n    {body}\n")
    env = {k: v for k, v in os.environ.items() if k != "GRADC_TEST_TMPDIR"}
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-p", "no:randomly", str(suite)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=suite)


def test_a_leaking_test_fails_the_run(tmp_path):
    r = run_suite(tmp_path, 'tempfile.mkdtemp(prefix="leaky-")')
    assert r.returncode == 1, r.stdout + r.stderr
    assert "left 1 file(s) in the temp folder" in r.stdout and "leaky-" in r.stdout
    assert list((tmp_path / "tmp").iterdir()) == []          # removed all the same


def test_a_clean_run_leaves_the_temp_folder_as_it_was(tmp_path):
    r = run_suite(tmp_path, '(tmp_path / "x").write_text("kept by pytest")')
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


def test_this_run_has_a_temp_folder_of_its_own():
    private = os.environ.get("GRADC_TEST_TMPDIR")
    assert private and Path(tempfile.gettempdir()) == Path(private)
