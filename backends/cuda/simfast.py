"""A faster block scheduler for numba's CUDA simulator, for tests.

The simulator meets ``cuda.syncthreads()`` by polling every thread of the block in a busy
loop, which costs ~10 ms a barrier on a small machine; kernels here meet several barriers
per block. This replaces it with a ``threading.Barrier`` per block: same semantics for
kernels in which every thread of a block reaches every barrier (the rule on a GPU too; the
kernels of this backend follow it), an error instead of a hang otherwise.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

TIMEOUT_S = 120.0


def _syncthreads(self: Any) -> None:
    try:
        self._irc_barrier.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError("a thread of this block failed or skipped a barrier") from None


def install() -> None:
    """Patch the simulator's BlockManager and BlockThread (idempotent)."""
    from irc.backends.cuda.device import cuda_module, is_simulator

    if not is_simulator(cuda_module()):
        raise RuntimeError("simfast.install() is for numba's CUDA simulator only")
    from numba.cuda.simulator import kernel as simkernel

    if getattr(simkernel.BlockManager, "_irc_fast", False):
        return
    original_thread_run = simkernel.BlockThread.run

    def thread_run(self: Any) -> None:
        original_thread_run(self)
        if self.exception is not None:
            self._irc_barrier.abort()  # release the others: the block has failed

    def manager_run(self: Any, grid_point: tuple, *args: Any) -> None:
        points = list(np.ndindex(*self._block_dim))
        barrier = threading.Barrier(len(points), timeout=TIMEOUT_S)
        threads = []
        for block_point in points:
            def target() -> None:
                self._f(*args)
            t = simkernel.BlockThread(target, self, grid_point, block_point, self._debug)
            t._irc_barrier = barrier
            threads.append(t)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [t for t in threads if t.exception]
        real = [t for t in failed if not isinstance(t.exception[0], RuntimeError)] or failed
        if real:
            raise real[0].exception[0].with_traceback(real[0].exception[1])

    simkernel.BlockThread.run = thread_run
    simkernel.BlockThread.syncthreads = _syncthreads
    simkernel.BlockManager.run = manager_run
    simkernel.BlockManager._irc_fast = True
