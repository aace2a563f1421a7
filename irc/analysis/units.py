"""Number formatting for the report: thousands separators, binary byte units, SI FLOP units."""

from __future__ import annotations

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ((10**15, "P"), (10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k"))


def commas(n: int | float) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:,.3f}".rstrip("0").rstrip(".")


def _trim(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def binary_bytes(n: int | float) -> str:
    """1,024-based: 524,288 → '512 KiB', 4·2^30 → '4 GiB'."""
    value, unit = float(n), 0
    while value >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{_trim(value)} {_BYTE_UNITS[unit]}"


def si(n: int | float, unit: str) -> str:
    """1000-based: 14,000,000,000 FLOPs → '14 GFLOP'."""
    for scale, prefix in _SI:
        if abs(n) >= scale:
            return f"{_trim(n / scale)} {prefix}{unit}"
    return f"{_trim(float(n))} {unit}"


def count_words(n: int) -> str:
    """6,967,263,232 → '6.97 billion'."""
    for scale, word in ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand")):
        if n >= scale:
            return f"{_trim(n / scale)} {word}"
    return str(n)


def seconds(s: float) -> str:
    """0.00402 → '4.02 ms'; 3e-7 → '300 ns'."""
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if s >= scale:
            return f"{_trim(s / scale)} {unit}"
    return f"{_trim(s / 1e-9)} ns"


def decimal_bytes(n: int | float) -> str:
    """1000-based, as ZeRO and the data sheets write them: 31,406,250,000 → '31.41 GB'."""
    return si(n, "B")
