"""The WGAN-GP example (examples/wgan_gp.py and examples/wgan_gp.grad), end to end.

(a) The penalty of the example's critic (a hidden layer: second order through ``@``,
    ``tanh`` and a bias) and the critic's loss match float64 central differences with
    respect to the critic's weights, in a float64 twin of ``wgan_gp.grad``.
(b) A short training run, as docs/second_order.md runs it but smaller, brings the generator's
    mean and covariance close to the real ones, and the critic's Wasserstein estimate
    down.  No timing is asserted.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import gradc
from finite_differences import fd_grad

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def wg() -> ModuleType:
    """examples/wgan_gp.py imported as a module."""
    spec = importlib.util.spec_from_file_location("wgan_gp", EXAMPLES / "wgan_gp.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_penalty_of_the_example_critic_matches_finite_differences(tmp_path) -> None:
    path = tmp_path / "wgan64.grad"
    path.write_text((EXAMPLES / "wgan_gp.grad").read_text().replace("f32", "f64"))
    m = gradc.load(path)
    rng = np.random.default_rng(5)
    b, h = 6, 4
    real, fake = rng.standard_normal((b, 2)), rng.standard_normal((b, 2))
    alpha = rng.uniform(0, 1, (b, 1))
    w = [rng.standard_normal((2, h)), 0.5 * rng.standard_normal(h), rng.standard_normal(h)]
    for op in (m.penalty_mlp, m.critic_loss):
        grads = op.vjp(real, fake, alpha, *w, 1.0)
        grads = grads[2:] if op is m.penalty_mlp else grads      # real, fake first there
        assert len(grads) == 3
        for k, g in enumerate(grads):
            def f(v, k=k):
                args = list(w)
                args[k] = v
                return float(op(real, fake, alpha, *args))
            np.testing.assert_allclose(g, fd_grad(f, w[k]), rtol=1e-6, atol=1e-8,
                                       err_msg=f"{op.__name__} d/d{('w1', 'b1', 'w2')[k]}")


def test_a_short_training_run_approaches_the_real_distribution(wg) -> None:
    m = gradc.load(wg.WGAN_GRAD)
    res = wg.train(m, steps=200, batch=128, every=50, quiet=True, seed=0)
    (mean0, cov0), (mean1, cov1) = res["start"], res["end"]
    assert mean0 == pytest.approx(np.sqrt(5.0))      # (0, 0) against (2, -1)
    assert mean1 < 0.15 * mean0, res["history"]       # seeds 0-4: 0.02 to 0.18 of 2.24
    assert cov1 < 0.35 * cov0, res["history"]         # seeds 0-4: 0.08 to 0.22 of 0.91
    first, last = res["history"][0], res["history"][-1]
    assert last[1] < 0.5 * first[1], res["history"]            # the W estimate shrinks
    assert all(np.isfinite(row).all() for row in res["history"])


def test_the_readme_command_runs(wg) -> None:
    """``python examples/wgan_gp.py`` with flags for a short run: progress lines, then
    the distances before and after."""
    env = dict(os.environ, PYTHONPATH=str(Path(gradc.__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, str(EXAMPLES / "wgan_gp.py"), "--steps", "40",
                          "--every", "20", "--batch", "64"], capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith("step   20  W estimate ") and "|mean - real|" in lines[0]
    assert any(line.startswith("distance to the real distribution: mean 2.236 -> ")
               for line in lines), out
