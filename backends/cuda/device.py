"""numba.cuda, imported one careful way: the NumPy shim, the simulator, and whether a GPU is there.

Everything in this backend that touches numba.cuda gets it from :func:`cuda_module`, so the
``np.row_stack`` shim (numba-cuda 0.30 still names it; NumPy 2.5 removed it) is always in place
before numba.cuda is imported, and "no GPU" becomes an :class:`IrcError`, never a traceback.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

import numpy as np

from irc.diagnostics import IrcError

SIM_ENV = "NUMBA_ENABLE_CUDASIM"
# Which block reduction the generated kernels use: "shuffle" (warp shuffles, the GPU path) or
# "shared" (a shared-memory tree, the path numba's simulator can run). Unset: chosen per device.
REDUCE_ENV = "IRC_CUDA_REDUCE"
REDUCTIONS = ("shuffle", "shared")


def _shim_numpy() -> None:
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # type: ignore[attr-defined]


def use_simulator() -> ModuleType:
    """Switch this process to numba's CUDA simulator and return its ``numba.cuda``.

    Must run before anything imports ``numba.cuda``; afterwards the choice is fixed, so a
    process that already holds the real numba.cuda gets an error instead of a silent GPU.
    """
    if "numba.cuda" in sys.modules and not is_simulator(sys.modules["numba.cuda"]):
        raise RuntimeError("numba.cuda is already imported for a real GPU; "
                           f"set {SIM_ENV}=1 before the process imports it")
    os.environ[SIM_ENV] = "1"
    from numba.core import config

    config.reload_config()
    return cuda_module()


def cuda_module() -> ModuleType:
    _shim_numpy()
    from numba import cuda

    return cuda


def kernel_jit(**options):
    """The decorator generated kernels use: ``cuda.jit(cache=True, **options)``. Launch bounds
    are dropped where numba's CUDA target does not take them (the simulator, old numba)."""
    cuda = cuda_module()
    if is_simulator(cuda):
        options.pop("launch_bounds", None)
    try:
        return cuda.jit(cache=True, **options)
    except TypeError:
        options.pop("launch_bounds", None)
        return cuda.jit(cache=True, **options)


def is_simulator(cuda: ModuleType | None = None) -> bool:
    cuda = cuda if cuda is not None else cuda_module()
    return str(getattr(cuda.to_device, "__module__", "")).startswith("numba.cuda.simulator")


def require_device() -> ModuleType:
    """numba.cuda when kernels can run here (a GPU, or the simulator); else an IrcError."""
    try:
        cuda = cuda_module()
    except Exception as e:  # a broken install: numba-cuda missing or failing at import
        raise IrcError(f"the cuda backend cannot import numba.cuda: {type(e).__name__}: {e}") from None
    if is_simulator(cuda):
        return cuda
    try:
        available = bool(cuda.is_available())
    except Exception:  # the driver probe itself failed
        available = False
    if not available:
        raise IrcError("the cuda backend needs an NVIDIA GPU with a working CUDA driver, and none was found",
                       notes=[f"to run the kernels in numba's CUDA simulator instead (slow; small sizes only), "
                              f"set {SIM_ENV}=1", "or use --backend cpu"])
    return cuda


def reduction_path(cuda: ModuleType | None = None) -> str:
    """``shuffle`` on a GPU, ``shared`` in the simulator (it has no warp shuffles), unless
    ``IRC_CUDA_REDUCE`` names one (the shuffle path in the simulator needs
    :func:`irc.backends.cuda.simwarp.install`)."""
    forced = os.environ.get(REDUCE_ENV, "").strip()
    if forced:
        if forced not in REDUCTIONS:
            raise IrcError(f"{REDUCE_ENV}={forced!r}: expected one of {', '.join(REDUCTIONS)}")
        return forced
    return "shared" if is_simulator(cuda) else "shuffle"


def device_name(cuda: ModuleType | None = None) -> str:
    cuda = cuda if cuda is not None else cuda_module()
    if is_simulator(cuda):
        return "numba CUDA simulator"
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return f"{name} (compute capability {dev.compute_capability[0]}.{dev.compute_capability[1]})"
