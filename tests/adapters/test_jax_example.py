"""examples/jax_digits.py: the guide's classifier trained in JAX with gradc ops inside
the model (both lowerings), beside the same model in pure JAX, for a few steps."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_digits.py"


def test_four_models_follow_one_trajectory(capsys):
    spec = importlib.util.spec_from_file_location("jax_digits", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results = mod.main(["--steps", "12", "--hidden", "32", "--quiet"])
    assert list(results) == ["gradc scaled_tanh", "gradc scaled_tanh, kernels",
                             "gradc mlp + xent", "pure JAX"]
    losses = [r["loss"] for r in results.values()]
    assert np.allclose(losses, losses[-1], rtol=1e-4), losses     # same function, same steps
    assert all(r["steps"] == 12 and r["step_s"] > 0 for r in results.values())
    assert losses[-1] < np.log(10)                  # it learns: below chance-level loss
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["model", "ms/step", "first", "step", "s", "loss", "accuracy"]
    assert [line.split()[0] for line in table[1:]] == ["gradc", "gradc", "gradc", "pure"]
