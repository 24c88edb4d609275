"""An installed wheel works on its own: grammar and examples ship inside it."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path):
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q",
                        "-w", str(wheels)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{r.stdout}\n{r.stderr}")
    (wheel,) = wheels.glob("gradc-*.whl")
    env = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env)
    py = env / "bin" / "python"
    # the venv's own gradc, not a checkout on PYTHONPATH (a test run may set it)
    own = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if sys.prefix != sys.base_prefix:   # run from a venv: its dependencies, after the wheel
        site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip()
        outer = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
        (Path(site) / "_outer_env.pth").write_text("".join(f"{d}\n" for d in sorted(outer)))
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   timeout=600, env=own)
    code = ("import gradc, gradc.frontend.parser as p, gradc.tools.demo as d; "
            "print(gradc.__file__); print(p.grammar_path()); print(d.examples_dir())")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env=own).stdout.split()
    assert all(str(env) in line for line in out), out
    seed = Path(out[2]) / "seed.grad"
    r = subprocess.run([env / "bin" / "gradc", "check", str(seed)], capture_output=True,
                       text=True, cwd=tmp_path, env=own)
    assert r.returncode == 0, r.stderr
    assert "ok   scaled_tanh" in r.stdout
    r = subprocess.run([env / "bin" / "gradc", "testgen", str(seed), "-o", "test_seed.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=own)   # its template ships
    assert r.returncode == 0 and "74 tests" in r.stdout, r.stderr
