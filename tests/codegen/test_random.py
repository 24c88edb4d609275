"""Random numbers (random_uniform_like, random_normal_like, seed=): the generator
against Random123's known answers, the distributions, the seed keyword and its errors,
and Dask chunks that draw the in-memory numbers.  The masks of arrays.grad's dropout
are tested in tests/test_spec_examples.py, CUDA in tests/cuda."""
from __future__ import annotations

import numpy as np
import pytest

import gradc
from gradc.errors import GradcError
from gradc.ir.primitives import _fw_random_uniform, _g_philox, _random_uniform

# Random123's kat_vectors, philox4x32 with 10 rounds: counter (4 words), key (2), result (4)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]

SOURCE = """
op draws(x, lo: nograd = -2, hi: nograd = 3) -> (u, v, z) {
    u = random_uniform_like(x)
    v = random_uniform_like(x, lo, hi=hi)
    z = random_normal_like(x)
}
op plain(x) -> y {
    y = 2 * x
}
"""


@pytest.fixture(scope="module")
def mod(import_module_text):
    return import_module_text(gradc.compile_source(SOURCE, file="draws.grad"), "gen_random")


@pytest.mark.parametrize("counter, key, want", KAT)
def test_philox_known_answers(counter, key, want) -> None:
    got = _g_philox(*(np.uint64(v) for v in (*counter, *key)))
    assert [int(w) for w in got] == list(want)


def test_uniform_is_the_top_bits_of_the_first_words() -> None:
    """Counter (0, 0, 0, 0) and key 0: Random123's first vector, as floats."""
    w0, w1, w2, w3 = KAT[0][2]
    x32, x64 = np.zeros(1, np.float32), np.zeros(1)
    assert _random_uniform(x32, 0, 0)[0] == np.float32((w0 >> 8) / 2**24)
    assert _random_uniform(x64, 0, 0)[0] == ((w0 << 21) | (w1 >> 11)) / 2**53
    assert _random_uniform(x64, 0, 0, 0, 1)[0] == ((w2 << 21) | (w3 >> 11)) / 2**53


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_distributions(mod, dt) -> None:
    """10^5 draws: uniform in [0, 1) and [lo, hi) with the moments of a uniform, the
    normal's mean, variance, skew and kurtosis, within 5 sigma; three streams."""
    x = np.zeros((100, 1000), dt)
    u, v, z = mod.draws(x, seed=3)
    n = x.size
    assert u.dtype == v.dtype == z.dtype == dt
    assert 0 <= u.min() and u.max() < 1 and -2 <= v.min() and v.max() < 3
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    assert abs(v.mean() - 0.5) < 5 * np.sqrt(25 / 12 / n)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / n)
    z = z.astype(np.float64)
    assert np.all(np.isfinite(z))
    assert abs(z.mean()) < 5 / np.sqrt(n) and abs(z.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(np.mean(z ** 3)) < 5 * np.sqrt(15 / n)
    assert abs(np.mean(z ** 4) - 3) < 5 * np.sqrt(96 / n)
    if dt == np.float32:       # 24 bits: every value a multiple of 2**-24
        assert np.all(u * 2**24 == np.floor(u * 2**24))
    assert abs(np.corrcoef(u.ravel(), (v.ravel() + 2) / 5)[0, 1]) < 5 / np.sqrt(n)


def test_seed_keyword(mod) -> None:
    x = np.zeros(64)
    a, b = mod.draws(x, seed=1), mod.draws(x, seed=1)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not np.array_equal(mod.draws(x, seed=2)[0], a[0])
    assert not np.array_equal(mod.draws(x)[0], mod.draws(x)[0])     # fresh per call
    assert np.array_equal(mod.draws(x, seed=-1)[0], mod.draws(x, seed=2**64 - 1)[0])
    assert np.array_equal(mod.draws(x, seed=np.int64(7))[0], mod.draws(x, seed=7)[0])
    for bad in (1.0, "1", True, np.array([1, 2])):
        with pytest.raises(TypeError, match="seed= must be an int"):
            mod.draws(x, seed=bad)
    with pytest.raises(TypeError, match="seed"):
        mod.plain(x, seed=1)                  # an op that does not draw takes no seed=


def test_a_seed_parameter_of_a_drawing_op_is_an_error() -> None:
    with pytest.raises(GradcError, match=r"E207.*'seed' in an op that draws"):
        gradc.compile_source("op f(x, seed = 1) -> y {\n    y = x * random_uniform_like(x)\n}\n",
                             file="f.grad")
    gradc.compile_source("op g(x, seed = 1) -> y {\n    y = x * seed\n}\n", file="g.grad")


def test_two_calls_of_a_drawing_op_draw_two_streams(import_module_text) -> None:
    src = ("op drop(x) -> y {\n    y = where(random_uniform_like(x) < 0.5, x, 0)\n}\n"
           "op twice(x) -> (a, b) {\n    a = drop(x)\n    b = drop(x)\n}\n")
    m = import_module_text(gradc.compile_source(src, file="t.grad"), "gen_twice")
    a, b = m.twice(np.ones(1000), seed=4)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, m.drop(np.ones(1000), seed=4))     # the first: stream 0


def test_dask_chunks_draw_the_in_memory_numbers(mod) -> None:
    da = pytest.importorskip("dask.array")
    x = np.zeros((6, 10))
    want = mod.draws(x, seed=9)
    for chunks in ((3, 10), (2, 5)):           # rows; rows and columns (rechunked whole)
        got = mod.draws(da.from_array(x, chunks=chunks), seed=9)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g.compute(), w)


def test_framework_lowering_draws_the_same_numbers() -> None:
    """The 32-bit-word Philox of the JAX and PyTorch lowerings: the kernels' bits."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    for seed in (0, 12345678901234, -5):
        for part in (0, 1):
            want = _random_uniform(np.zeros((3, 40), np.float32), seed, 7, 3, part)
            j = _fw_random_uniform(jnp.zeros((3, 40), jnp.float32), seed, 7, 3, part)
            t = _fw_random_uniform(torch.zeros((3, 40), dtype=torch.float64), seed, 7, 3, part)
            np.testing.assert_array_equal(np.asarray(j), want)
            np.testing.assert_array_equal(
                t.numpy(), _random_uniform(np.zeros((3, 40)), seed, 7, 3, part))
