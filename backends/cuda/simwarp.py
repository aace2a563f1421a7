"""Warp shuffles for numba's CUDA simulator, so the GPU's shuffle path can be tested without a GPU.

The simulator runs each CUDA thread as a Python thread and has no ``shfl_*_sync``. This adds
``cuda.shfl_xor_sync`` to it: the lanes of a warp meet at a barrier, publish their values,
read their partner's, and meet again. It is an emulation for tests (lockstep at every call,
full-warp masks only), not a model of the hardware's timing; nothing runs it on a GPU.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()
TIMEOUT_S = 120.0  # a kernel whose lanes never meet fails instead of hanging the tests


class _Warp:
    def __init__(self, lanes: int):
        self.barrier = threading.Barrier(lanes, timeout=TIMEOUT_S)
        self.values: dict[int, Any] = {}


def _warp_state(thread: Any) -> tuple[_Warp, int]:
    manager = thread._manager
    bx, by, bz = manager._block_dim
    nthreads = bx * by * bz
    warp, lane = divmod(thread.thread_id, 32)
    with _LOCK:
        warps = manager.__dict__.setdefault("_irc_warps", {})
        state = warps.get(warp)
        if state is None:
            state = warps[warp] = _Warp(min(32, nthreads - warp * 32))
    return state, lane


def _shfl_xor_sync(self: Any, mask: int, value: Any, lane_mask: int) -> Any:
    thread = threading.current_thread()
    state, lane = _warp_state(thread)
    state.values[lane] = value
    state.barrier.wait()
    result = state.values.get(lane ^ lane_mask, value)  # a partner outside the warp: own value
    state.barrier.wait()
    return result


def install() -> None:
    """Give the simulator's fake ``cuda`` module ``shfl_xor_sync`` (idempotent)."""
    from irc.backends.cuda.device import cuda_module, is_simulator

    cuda = cuda_module()
    if not is_simulator(cuda):
        raise RuntimeError("simwarp.install() is for numba's CUDA simulator only")
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    FakeCUDAModule.shfl_xor_sync = _shfl_xor_sync  # type: ignore[attr-defined]
