"""Timing and memory measurements shared by the benchmark peers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def best_of(fn: Callable[[], object], repeats: int, min_seconds: float = 0.0) -> float:
    """Seconds of the fastest of ``repeats`` calls after one warm-up call (more calls while the
    total is under ``min_seconds``). The best time is the one least disturbed by other
    programs on a shared machine."""
    fn()
    best = float("inf")
    spent = 0.0
    done = 0
    while done < repeats or spent < min_seconds:
        start = time.perf_counter()
        fn()
        t = time.perf_counter() - start
        best = min(best, t)
        spent += t
        done += 1
        if done >= 4 * repeats:
            break
    return best


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def peak_extra_bytes(fn: Callable[[], object]) -> int | None:
    """The most memory ``fn`` held beyond what the process held before it: the resident peak
    (VmHWM, reset through /proc/self/clear_refs) minus the resident size at the start."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        before = _status("VmRSS")
        fn()
        return max(0, _status("VmHWM") - before)
    except (OSError, KeyError):
        return None
