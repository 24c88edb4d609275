"""The inputs of the ops of ``examples/arrays.grad`` (the spec's ``arrays.grad``), as
its comments give them: shared by the tests that run those ops on other backends
(the CUDA simulator, Dask arrays).  Imported by name (pytest puts ``tests/`` on
``sys.path``)."""
from __future__ import annotations

import numpy as np

LOGITS, LABELS = np.array([[1.0, 2, 3], [1, 0, 0]]), np.array([2, 0], np.int64)

# op -> (inputs, upstream cotangents); integer arrays stay int64, the float ones are
# cast to the dtype under test.
ARRAYS_INPUTS = {
    "xent_labels": ([LOGITS, LABELS], [np.array(1.0)]),
    "xent_gather": ([LOGITS, LABELS], [np.array(1.0)]),
    "smooth_xent": ([LOGITS, LABELS], [np.array(1.0)]),
    "st_argmax": ([np.array([[0.5, 2, -1], [3, 1, 1]])], [np.array([[1.0, 0, 0], [0, 0, 1]])]),
    "attention": ([np.array([[[[0, 0.3], [-0.3, -0.9]], [[-0.5, -1], [0.1, 1.3]]]]),
                   np.array([[[[-0.5, -0.6], [0.5, 0.4], [0.1, -0.9]],
                              [[0, 0.7], [-1.3, -0.5], [-1.9, -1.3]]]]),
                   np.array([[[[-1.8, -0.2], [-1.3, 0.3], [0.2, -0.2]],
                              [[-2.5, -0.5], [0, 0.1], [-1.5, -0.5]]]])],
                  [np.ones((1, 2, 2, 2))]),
    "rope": ([np.array([[1.0, 2, 3, 4]]), np.array([[0.5, 1]]), np.array([[0.25, 0]])],
             [np.array([[1.0, 0, 0, 1]])]),
    "bias_nchw": ([np.zeros((2, 3, 2, 2)), np.array([1.0, 2, 3])], [np.ones((2, 3, 2, 2))]),
    "cumsum_rows": ([np.array([[3.0, 1, 2]])], [np.array([[1.0, 2, 3]])]),
    "sorted_weighted": ([np.array([[3.0, 1, 2]]), np.array([1, 0.5, 0.25])], [np.array([1.0])]),
    "softplus": ([np.array([-30.0, 0, 30])], [np.ones(3)]),
}


def cast(values, dtype) -> list:
    """``values`` with the float arrays as ``dtype``."""
    return [v.astype(dtype) if v.dtype.kind == "f" else v for v in values]
