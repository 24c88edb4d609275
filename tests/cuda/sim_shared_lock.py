"""A lock around Numba's CUDA simulator's shared-array allocation.

The simulator runs a block's threads as Python threads, and
``FakeCUDAShared.array`` looks an allocation up by its source line and creates it
when missing: a check, then a set, without a lock.  A thread switch between the
two gives two threads of one block two different "shared" arrays, and a block
reduction then combines only some of its threads' values: wrong results now and
then, more often at the short switch interval the simulator tests use.  A GPU has
no such race; this makes the simulator's arrays shared as on a GPU.
"""
from __future__ import annotations

import sys
import threading
import traceback

import numpy as np


def lock_shared_arrays() -> None:
    """Make ``cuda.shared.array`` in the simulator look up and create under a lock
    (once per process); dynamic shared memory (``shape == 0``) is left as it is."""
    from numba.cuda.simulator import kernelapi
    from numba.core import types
    from numba.np import numpy_support

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "_gradc_locked", False):
        return
    lock = threading.Lock()
    unlocked = shared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return unlocked(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = traceback.extract_stack(sys._getframe(1), limit=1)[0][0:2]  # as Numba's
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    array._gradc_locked = True
    shared.array = array
