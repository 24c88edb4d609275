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
    """Numba's CUDA simulator, faster, with its shared arrays made safe and a
    ``syncwarp``.

    It runs a block's threads as Python threads and polls them while they wait at
    syncthreads(); at Python's default 5 ms switch interval each barrier costs
    milliseconds. 50 us makes a simulated reduction 10-20x faster. But the
    simulator creates a block's shared array at the first ``cuda.shared.array``
    call of its threads, looked up and stored without a lock (numba-cuda 0.30.4,
    ``FakeCUDAShared.array``): at 50 us two threads sometimes each create one and
    read each other's zeros (about 1 tiled-matmul call in 40 of the seed
    example's unfused methods gave wrong results); here the look-up and the store
    are one step under a lock.  And the thread that polls a block's threads yields
    the GIL once a poll (:func:`_run_block`)."""
    import threading

    from numba.core import types
    from numba.cuda.simulator import kernel, kernelapi
    from numba.np import numpy_support

    sys.setswitchinterval(5e-5)
    if getattr(kernelapi.FakeCUDAShared.array, "gradc_locked", False):
        return                                     # done already in this process
    kernel.BlockManager.run = _run_block
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
    barriers = {}

    def syncwarp(self, mask=0xFFFFFFFF):
        """``cuda.syncwarp()``, which the simulator lacks: a barrier of the threads of
        the caller's row of the block (its threadIdx.y and .z), the warp where the
        block's x extent is a warp's 32 threads, as gradc's reduce kernels launch a
        warp per row (``_GC_WARP`` threads in the simulator)."""
        t = threading.current_thread()
        width = t._manager._block_dim[0]
        key = (id(t._manager), width, t.threadIdx.y, t.threadIdx.z)
        with lock:
            barrier = barriers.get(key)
            if barrier is None or barrier.broken:
                barrier = barriers[key] = threading.Barrier(width)
        barrier.wait(timeout=60)      # a lane that never comes: an error, not a hang

    kernelapi.FakeCUDAModule.syncwarp = syncwarp


def _run_block(self, grid_point, *args):
    """``BlockManager.run`` of Numba's CUDA simulator (numba-cuda 0.30.4, the same
    steps): a thread per thread of the block, polled until every one has ended; when
    all that live wait at syncthreads(), all are released.  One change: the polling
    thread yields the GIL after each poll (``time.sleep(0)``), where it held it for
    whole switch intervals while the block's threads waited for it; the simulator's
    tests ran 1.3-1.5x faster (a simulated reduction and matmul file: 28 s -> 20 s)."""
    import time

    from numba.cuda.simulator.kernel import BlockThread

    threads, live, blocked = [], set(), set()
    for block_point in np.ndindex(*self._block_dim):
        t = BlockThread(lambda: self._f(*args), self, grid_point, block_point, self._debug)
        t.start()
        threads.append(t)
        live.add(t)
    while live:
        for t in live:
            if t.syncthreads_blocked:
                blocked.add(t)
            elif t.exception:
                # abort every other thread (not joined: the failing one is kept
                # for debugging), and raise its exception here
                for other in threads:
                    other.abort = True
                    other.syncthreads_blocked = False
                    other.syncthreads_event.set()
                raise t.exception[0].with_traceback(t.exception[1])
        if live == blocked:
            for t in blocked:
                t.syncthreads_blocked = False
                t.syncthreads_event.set()
            blocked = set()
        live = {t for t in live if t.is_alive()}
        if live:
            time.sleep(0)
    for t in threads:          # an exception set after the last poll saw its thread
        if t.exception:
            raise t.exception[0].with_traceback(t.exception[1])
