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
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, else physical pages; None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


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
