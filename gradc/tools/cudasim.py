"""Numba's CUDA simulator made fast enough and safe for gradc's kernels.

``NUMBA_ENABLE_CUDASIM=1`` runs CUDA kernels as Python, without a GPU: gradc's tests
and ``benchmarks/gpu_check.py`` run every CUDA method of the examples so.  Call
:func:`fast_simulator` once, in a process where the simulator is on, before launching
kernels.
"""
from __future__ import annotations

import sys

import numpy as np


def fast_simulator() -> None:
    """Numba's CUDA simulator, faster and with its shared arrays made safe.

    It runs a block's threads as Python threads and polls them while they wait at
    syncthreads(); at Python's default 5 ms switch interval each barrier costs
    milliseconds. 50 us makes a simulated reduction 10-20x faster. But the
    simulator creates a block's shared array at the first ``cuda.shared.array``
    call of its threads, looked up and stored without a lock (numba-cuda 0.30.4,
    ``FakeCUDAShared.array``): at 50 us two threads sometimes each create one and
    read each other's zeros (about 1 tiled-matmul call in 40 of the seed
    example's unfused methods gave wrong results); here the look-up and the store
    are one step under a lock."""
    import threading

    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    sys.setswitchinterval(5e-5)
    if getattr(kernelapi.FakeCUDAShared.array, "gradc_locked", False):
        return                                     # done already in this process
    lock, simulated = threading.Lock(), kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:    # dynamic shared memory: one buffer
            return simulated(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)   # the simulator's key
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    array.gradc_locked = True
    kernelapi.FakeCUDAShared.array = array
