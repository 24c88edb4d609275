"""Numbers are weak (they take the dtype of the arrays they meet), negated or combined
with other numbers too: ``labels + -1`` is an integer array, as ``labels - 1`` is
(``-1`` made the sum a float array, and ``max(labels, -1)`` no index: helper 63)."""
from __future__ import annotations

import numpy as np
import pytest

import gradc

OPS = """
op minus(labels: i64[n]) -> y {
    y = labels + -1
}
op times(labels: i64[n]) -> y {
    y = labels * -3
}
op folded(labels: i64[n]) -> y {
    y = labels + (0 - 100) * 2
}
op floor(x: [n, k], labels: i64[n]) -> y {
    y = x[arange(n), max(labels, -1.0)]
}
op scaled(x: f32[n]) -> y {
    y = x * -0.5 + (1 - 3)
}
"""


@pytest.fixture(scope="module")
def m(import_module_text):
    return import_module_text(gradc.compile_source(OPS, file="literals.grad"), "literals_ops")


def test_negative_and_folded_integers_keep_the_labels_dtype(m) -> None:
    labels = np.array([2**60 + 1, 3, -7])
    for op, want in (("minus", labels - 1), ("times", labels * -3),
                     ("folded", labels - 200)):
        got = getattr(m, op)(labels)
        assert got.dtype == np.int64, op
        np.testing.assert_array_equal(got, want)


def test_a_negative_literal_in_an_index_expression(m) -> None:
    x = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(m.floor(x, np.array([0, -3, 2, 1])), [0.0, 5.0, 8.0, 10.0])


def test_a_negative_float_literal_keeps_float32(m) -> None:
    x = np.array([1.0, -2.0, 4.0], np.float32)
    got = m.scaled(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, x * np.float32(-0.5) - np.float32(2))
