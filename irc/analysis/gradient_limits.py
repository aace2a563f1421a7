"""How large a model the gradient measurement runs on: ``irc analyze --gradients`` and ``irc lint --measure``.

The measurement runs forward + backward on the float64 NumPy reference once per batch (twice for a
recurrent layer's time profile). On this class of machine that moves ~10 GFLOP/s, and each parameter
costs ~32 bytes (the float64 weight, its gradient, and the copies in flight). ResNet-18 (1.2e7
parameters, 1.1e10 training FLOPs at B = 1) takes ~4 s a batch. A lint is a quick check, so ``--measure``
stays within seconds; ``analyze --gradients`` is asked for explicitly, so it may take minutes, but not
hours, and not more memory than a workstation has.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    params: float
    training_flops: float  # per batch: forward + backward, irc analyze's flops_training
    flag: str  # the option the limit belongs to, for the message


LINT = Limits(5e7, 5e10, "--measure")
ANALYZE = Limits(5e8, 2e12, "--gradients")


def big(x: float) -> str:
    """7.0e9, 5.0e7: counts too large for commas to read at a glance."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def refusal(totals: dict, limits: Limits) -> str | None:
    """Why a model whose analysis ``totals`` are given is too large to measure, or None."""
    params, flops = totals["params"], totals["flops_training"]
    if not isinstance(params, int | float) or not isinstance(flops, int | float):
        return "its sizes are not all bound (bind them with -D)"
    if params > limits.params:
        return f"{big(params)} parameters exceed {limits.flag}'s limit of {big(limits.params)}"
    if flops > limits.training_flops:
        return (f"{big(flops)} training FLOPs per batch exceed {limits.flag}'s limit of "
                f"{big(limits.training_flops)} (bind smaller sizes with -D)")
    return None
