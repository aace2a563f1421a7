"""The machine a benchmark ran on: CPU, cores, memory, library versions, BLAS and threads."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's name, with its family and model numbers: a VM's name can hide the generation (AMD's family 25
    is Zen 3/4, 26 is Zen 5, whose FMA units are twice as wide: the ratios move with it)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f", family {fields['cpu family']} model {fields['model']}"
    return name


def cache_sizes() -> str:
    """L1d, L2 and L3 as the kernel reports them for CPU 0 (sizes a core sees)."""
    out = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(base.glob("index*")):
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            out.append(f"L{(index / 'level').read_text().strip()} {(index / 'size').read_text().strip()}")
    except OSError:
        return "?"
    return ", ".join(out) or "?"


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    except OSError:
        pass
    return "?"


def memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "?"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


# Some hosts set these (to keep older OpenBLAS builds off kernels that crash there). They pin a current OpenBLAS
# to older, narrower kernels: NumPy's sgemm and irc's BLAS calls would run slower, torch's MKL and ONNX Runtime's
# MLAS would not. Every peer runs without them, and RESULTS.md lists what was removed.
PEER_ENV_DROPPED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def peer_env(**extra: str) -> dict[str, str]:
    """The environment a benchmark peer runs in: this one less PEER_ENV_DROPPED, warnings off, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in PEER_ENV_DROPPED}
    return {**env, "PYTHONWARNINGS": "ignore", **extra}


def dropped_from_peers() -> str:
    """What PEER_ENV_DROPPED removed here, for the machine table."""
    dropped = [f"{k}={os.environ[k]}" for k in PEER_ENV_DROPPED if k in os.environ]
    return ", ".join(dropped) or "nothing (none of " + ", ".join(PEER_ENV_DROPPED) + " is set)"


def describe() -> dict[str, str]:
    """Everything the results depend on, as (what, value) rows."""
    import numba
    import numpy as np
    import scipy

    from irc.backends.cpu.threads import blas_libs
    from irc.backends.cpu.threads import describe as threads

    rows = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "CPU": f"{cpu_model()} ({cpu_flags()})",
        "cores": str(os.cpu_count()),
        "caches (a core)": cache_sizes(),
        "memory": memory_gib(),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "scipy": scipy.__version__,
    }
    try:
        import torch

        rows["torch"] = f"{torch.__version__} ({torch.get_num_threads()} threads; BLAS: "
        rows["torch"] += "MKL" if torch.backends.mkl.is_available() else "?"
        rows["torch"] += ", oneDNN" if torch.backends.mkldnn.is_available() else ""
        rows["torch"] += ")"
    except ImportError:
        rows["torch"] = "not installed"
    for lib in blas_libs():
        rows[f"OpenBLAS {Path(lib.path).name}"] = f"{lib.threads()} threads by default"
    rows.update({f"irc run: {k}": v for k, v in threads().items() if not k.startswith("BLAS")})
    rows["irc run: BLAS while a graph runs"] = "1 thread (Numba's pool owns the cores; see backends/cpu/threads.py)"
    rows["removed from the peers' environment"] = dropped_from_peers()
    return rows
