"""How the lints print numbers: the chapter's style (2.7e-8, 8.06, 84,000×, 512 KiB)."""

from __future__ import annotations

import math

from irc.analysis.units import binary_bytes

__all__ = ["binary_bytes", "commas", "fixed", "percent", "sci", "sig", "times"]


def commas(n: int) -> str:
    return f"{n:,}"


def sci(x: float) -> str:
    """0.37 stays a decimal; smaller values go to the chapter's 2.7e-8 (no exponent padding)."""
    if x == 0:
        return "0"
    if abs(x) >= 0.01:
        return f"{x:.2g}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def fixed(x: float, places: int = 2) -> str:
    return f"{x:.{places}f}"


def sig(x: float, digits: int = 2) -> str:
    """Round to ``digits`` significant figures and print with separators: 84,000.56 -> 84,000."""
    if x == 0:
        return "0"
    scale = digits - 1 - math.floor(math.log10(abs(x)))
    rounded = round(x, scale)
    return f"{rounded:,.{max(scale, 0)}f}"


def times(x: float) -> str:
    return f"{sig(x)}×"


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%"
