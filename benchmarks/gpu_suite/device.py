"""This checkout's irc, numba.cuda (the simulator or a GPU) and torch, and the helpers that move
tensors between them and time kernels on the device."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _import_irc() -> None:
    """Use this checkout's irc, installed or not: irc.backends lives in backends/ (setuptools
    maps it when installed; here the irc package's search path gets the repository root)."""
    sys.path.insert(0, str(ROOT))
    import irc

    try:
        import irc.backends  # noqa: F401
    except ImportError:
        irc.__path__.append(str(ROOT))


_import_irc()

import numpy as np  # noqa: E402

from irc.backends.cuda.device import cuda_module, is_simulator  # noqa: E402  (the np.row_stack shim first)

cuda = cuda_module()
import torch  # noqa: E402

from irc.ir_parser import parse_ir  # noqa: E402
from irc.passes import PASSES  # noqa: E402

SIM = is_simulator(cuda)
DEV = "cpu" if SIM else "cuda"
TOL = 1e-4


def sync() -> None:
    if SIM:
        return
    torch.cuda.synchronize()
    cuda.synchronize()


def bench(fn: Callable[[], Any], batch: int, reps: int) -> float:
    """Milliseconds per call: the median over ``reps`` batches of ``batch`` queued calls."""
    if SIM:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    fn()
    sync()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(2_000_000)  # keep the GPU busy while Python queues the batch
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / batch)
    return statistics.median(times)


def as_torch(dev_array: Any) -> torch.Tensor:
    """A device array as a torch tensor: the same memory on a GPU, a copy in the simulator."""
    if SIM:
        return torch.from_numpy(dev_array.copy_to_host())
    return torch.as_tensor(dev_array, device="cuda")


def fill(dev_array: Any, value: torch.Tensor) -> None:
    if SIM:
        dev_array.copy_to_device(np.ascontiguousarray(value.cpu().numpy()))
    else:
        as_torch(dev_array).copy_(value)


def poison(dev_array: Any) -> None:
    fill(dev_array, torch.full(tuple(dev_array.shape), float("nan"), dtype=torch.float32, device=DEV))


def kernel_arg(t: torch.Tensor) -> Any:
    """A torch tensor as a numba kernel argument (the simulator writes numpy arrays in place)."""
    return t.numpy() if SIM else cuda.as_cuda_array(t)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.to(DEV, torch.float64), ref.to(DEV, torch.float64)
    if not torch.isfinite(out64).all():
        return float("inf")  # NaN: an element was never written (or a real overflow)
    return float(torch.linalg.norm(out64 - ref64) / torch.linalg.norm(ref64))


def fresh_generator() -> torch.Generator:
    """Fresh random inputs for every case (a kernel that only works on one seed is caught)."""
    return torch.Generator(device=DEV).manual_seed(time.time_ns() % 2**31)


def randn(*shape: int, gen: torch.Generator, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=DEV, dtype=torch.float32) * scale).to(dtype)


def gbs(nbytes: float, ms: float) -> str:
    return f"{nbytes / ms / 1e6:.0f} GB/s"


def tflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e9:.1f} TFLOP/s"


def graph_of(ir: str):
    """A graph from IR text (no .arch parser needed on the device machine)."""
    return PASSES["shape-infer"](parse_ir(ir))


def shape_text(shape: tuple[int, ...]) -> str:
    return "f32[" + ",".join(str(d) for d in shape) + "]"
