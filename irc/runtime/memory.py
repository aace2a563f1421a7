"""A memory estimate taken before anything large is allocated, and the guard that uses it."""

from __future__ import annotations

import os
import re
from fractions import Fraction

from irc.graph import Graph
from irc.runtime.weights import expected_weights
from irc.types import DTYPE_BYTES

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """'8G', '512MiB', '1.5GB', '1000000' -> bytes (K/M/G alone are binary)."""
    m = re.fullmatch(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"'{text}' is not a size (examples: 8G, 512MiB, 2000000000)")
    return int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()])  # exact: no float overflow on long numbers


def fmt_bytes(n: float) -> str:
    """Bytes the way ``irc analyze`` prints them (one formatter: ``25.1 GiB`` everywhere)."""
    from irc.analysis.units import binary_bytes

    return binary_bytes(n)


def available_bytes() -> tuple[int, str] | None:
    """The tightest of the limits this process lives under, with its name; None when none is known.

    Counted: the system's MemAvailable, the container's cgroup limit less its usage (v2
    ``memory.max``, v1 ``memory.limit_in_bytes``), and the address-space limit (``ulimit -v``)
    less what the process has mapped already.
    """
    limits: list[tuple[int, str]] = []
    meminfo = _meminfo_available()
    if meminfo is not None:
        limits.append((meminfo, "the memory available"))
    cgroup = _cgroup_room()
    if cgroup is not None:
        limits.append((cgroup, "the container's memory limit (cgroup) less its usage"))
    address = _address_space_room()
    if address is not None:
        limits.append((address, "the address-space limit (ulimit -v) less what irc has mapped"))
    return min(limits) if limits else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _read_number(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) and the like


def _cgroup_room(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The cgroup's memory limit less its current usage, for this process's own cgroup (v2, else v1)."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        if controllers == "":  # v2: one unified hierarchy, the files in the process's own folder
            names, bases = ("memory.max", "memory.current"), (f"{root}{where}".rstrip("/"), root)
        elif "memory" in controllers.split(","):
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes")
            bases = (f"{root}/memory{where}".rstrip("/"), f"{root}/memory")
        else:
            continue
        for base in bases:
            limit = _read_number(f"{base}/{names[0]}")
            if limit is not None and limit < 2**60:  # v1 spells "no limit" as a huge number, v2 as "max"
                return max(limit - (_read_number(f"{base}/{names[1]}") or 0), 0)
    return None


def _address_space_room() -> int | None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    mapped = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(soft - mapped, 0)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) else 1
    return n


def estimate_bytes(graph: Graph, float_bytes: int = 4) -> tuple[int, int]:
    """(weight bytes, peak live activation bytes) for one forward pass in ``float_bytes`` floats.

    Activations follow the interpreter's liveness: a value lives from its node to its last
    reader. Attention adds its score and probability matrices [B, H, T, S] while it runs.
    """
    weights = sum(_numel(s) for s in expected_weights(graph).values()) * float_bytes
    types = graph.value_types()
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = i
    for _, v in graph.outputs:
        last[v] = len(graph.nodes)

    def size(v: str) -> int:
        t = types[v]
        per = float_bytes if t.is_float else int(DTYPE_BYTES.get(t.dtype, 8))
        return _numel(t.shape) * per

    live, peak = 0, 0
    for i, node in enumerate(graph.nodes):
        out = sum(size(v) for v in node.outputs)
        scratch = 0
        if node.op == "attention":
            x = types[node.inputs[0]].shape
            s = types[node.inputs[-1]].shape[1]
            scratch = 2 * _numel((x[0], node.attrs["heads"], x[1], s)) * float_bytes
        peak = max(peak, live + out + scratch)
        live += out
        live -= sum(size(v) for v in set(node.inputs) if last.get(v) == i)
        live -= sum(size(v) for v in node.outputs if v not in last)
    return weights, peak


ACTIVATION_SLACK = 1.25  # measured: NumPy temporaries put the reference's peak up to ~1.3x the liveness estimate
# extra copies of the weights a backend holds (the cpu backend merges some weights, packs others)
BACKEND_WEIGHT_COPIES = {"cpu": 1.0}


def run_phases(graph: Graph, backend: str, check: bool, random_weights: bool) -> list[tuple[str, dict[str, int]]]:
    """What each phase of ``irc run`` holds at its peak, by part; the run needs the largest phase.

    Phases: reading or drawing the weights, the backend's run, ``--check``'s float64 reference
    run, and the comparison (done in chunks, so it holds the outputs and their reference only).
    The output summaries and the comparison work in bounded chunks and are not counted.
    """
    w32, a32 = estimate_bytes(graph, 4)
    largest = max((_numel(s) * 4 for s in expected_weights(graph).values()), default=0)
    types = graph.value_types()
    outputs = sum(_numel(types[v].shape) * (4 if types[v].is_float else int(DTYPE_BYTES.get(types[v].dtype, 8)))
                  for _, v in graph.outputs)
    acts = int(a32 * ACTIVATION_SLACK)
    phases: list[tuple[str, dict[str, int]]] = [
        ("loading", {"weights": w32, "the weight being drawn" if random_weights else "": largest if random_weights
                     else 0}),
    ]
    run = {"weights": w32, "activations": acts}
    extra = int(w32 * BACKEND_WEIGHT_COPIES.get(backend, 0.0))
    if extra:
        run[f"the {backend} backend's merged weights"] = extra
    phases.append(("run", run))
    if check:
        w64, a64 = estimate_bytes(graph, 8)
        phases.append(("check", {"weights": w32, "outputs": outputs,
                                 "--check's float64 reference": w64 + int(a64 * ACTIVATION_SLACK)}))
        phases.append(("compare", {"weights": w32, "outputs": outputs, "--check's float64 reference": 2 * outputs}))
    return [(name, {k: v for k, v in parts.items() if k and v}) for name, parts in phases]
