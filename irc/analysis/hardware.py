"""The accelerator table behind ``--hardware NAME``: peaks per dtype, bandwidths, efficiencies.

The table ships as ``irc/analysis/hardware.toml`` and a user can pass another with
``--hardware-file``; each entry states its source. Times are computed from the peaks scaled by
the entry's ``compute_efficiency`` and ``bandwidth_efficiency`` (flags override both), so a
changed factor always changes the result.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from irc.diagnostics import UsageError, did_you_mean, os_error_words

TABLE = Path(__file__).with_name("hardware.toml")
PEAK_KEYS = ("f32", "tf32", "bf16", "f16", "fp8", "int8")
_NUMBERS = ("memory", "memory_bandwidth", "interconnect", "compute_efficiency", "bandwidth_efficiency")


@dataclass(frozen=True)
class Hardware:
    key: str
    name: str
    source: str
    memory: float  # bytes of device memory
    memory_bandwidth: float  # bytes/s
    interconnect: float  # bytes/s to peers, one direction
    compute_efficiency: float
    bandwidth_efficiency: float
    peak: dict[str, float]  # FLOP/s by dtype

    def matmul_peak(self, dtype: str) -> float:
        """FLOP/s of products at ``dtype`` after the efficiency factor; int8 weights compute at f16."""
        key = {"int8": "f16"}.get(dtype, dtype)
        if key not in self.peak:
            key = "f32"
        return self.peak[key] * self.compute_efficiency

    @property
    def vector_peak(self) -> float:
        """FLOP/s of elementwise work, norms and softmax: plain FP32 units, not the matrix engines."""
        return self.peak["f32"] * self.compute_efficiency

    @property
    def bandwidth(self) -> float:
        return self.memory_bandwidth * self.bandwidth_efficiency


def _entry(key: str, raw: Any, file: str) -> Hardware:
    problems: list[str] = []
    if not isinstance(raw, dict):
        problems.append("it must be a table of numbers")
        raw = {"peak": {"f32": 1}, **{n: 1 for n in _NUMBERS}}
    for name in _NUMBERS:
        v = raw.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            problems.append(f"'{name}' must be a positive number")
    peak = raw.get("peak")
    if not isinstance(peak, dict) or "f32" not in peak:
        problems.append("'peak' must be a table with at least f32 (FLOP/s)")
        peak = {}
    for k, v in peak.items():
        if k not in PEAK_KEYS or isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            problems.append(f"peak.{k} must be one of {', '.join(PEAK_KEYS)} with a positive FLOP/s")
    for name in ("compute_efficiency", "bandwidth_efficiency"):
        v = raw.get(name)
        if isinstance(v, (int, float)) and v > 1:
            problems.append(f"'{name}' is a fraction of the peak, at most 1 (got {v})")
    if problems:
        raise UsageError(f"{file}: [{key}]: " + "; ".join(problems))
    return Hardware(key, str(raw.get("name", key)), str(raw.get("source", "")),
                    *(float(raw[n]) for n in _NUMBERS), {k: float(v) for k, v in peak.items()})


def load_table(path: str | Path | None = None) -> dict[str, Hardware]:
    file = Path(path) if path else TABLE
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        why = os_error_words(e) if isinstance(e, OSError) else f"not a TOML table ({e})"
        raise UsageError(f"--hardware-file: cannot read '{file}': {why}") from None
    return {k: _entry(k, v, str(file)) for k, v in raw.items()}


def find_hardware(name: str, path: str | None = None, compute_efficiency: float | None = None,
                  bandwidth_efficiency: float | None = None) -> Hardware:
    table = load_table(path)
    key = name.strip().lower()
    if key not in table:
        longer = [k for k in table if k.startswith(key)]  # 'h100' means 'h100-sxm' more than 'h200'
        hint = f"; did you mean '{longer[0]}'?" if len(longer) == 1 else did_you_mean(key, list(table))
        raise UsageError(f"--hardware {name}: not in the table{hint} "
                         f"(known: {', '.join(table)}; add one to {path or TABLE.name})")
    hw = table[key]
    for flag, value in (("--compute-efficiency", compute_efficiency), ("--bandwidth-efficiency", bandwidth_efficiency)):
        if value is not None and not 0 < value <= 1:
            raise UsageError(f"{flag} must be a fraction in (0, 1], got {value}")
    if compute_efficiency is not None:
        hw = replace(hw, compute_efficiency=compute_efficiency)
    if bandwidth_efficiency is not None:
        hw = replace(hw, bandwidth_efficiency=bandwidth_efficiency)
    return hw
