"""Optimizers, learning-rate schedules and gradient clipping: plain functions over NumPy arrays.

Each update follows PyTorch's own formula, operation for operation (``torch.optim.SGD``, ``Adam``,
``AdamW``, single-tensor path), so the same gradients give the same weights within rounding
(tests/test_train_optim.py checks 20 steps of each against torch within 1e-6):

- ``sgd``: ``g += wd·p``; ``p -= lr·g``
- ``momentum``: ``g += wd·p``; ``buf = g`` on the first step, then ``buf = μ·buf + g``; ``p -= lr·buf``
- ``adam``: ``g += wd·p`` (L2 in the gradient); ``m = lerp(m, g, 1 − β1)``; ``v = β2·v + (1 − β2)·g²``;
  ``p -= lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps)``
- ``adamw``: ``p *= 1 − lr·wd`` (decoupled decay, Loshchilov & Hutter 2019), then Adam without L2.

The schedules are Hugging Face's ``get_constant_schedule_with_warmup`` and
``get_cosine_schedule_with_warmup`` (LambdaLR multipliers): linear warmup from 0 over ``warmup`` steps,
then constant or half a cosine down to 0 at ``total``; with no warmup the cosine is
``CosineAnnealingLR(T_max=total, eta_min=0)``. Clipping is ``torch.nn.utils.clip_grad_norm_``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import cos, pi, sqrt

import numpy as np

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine")
# the state each optimizer keeps per weight (the names PyTorch's state_dict uses)
SLOTS: dict[str, tuple[str, ...]] = {
    "sgd": (), "momentum": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq"),
}
CLIP_EPS = 1e-6  # clip_grad_norm_'s max_norm / (total + 1e-6)


@dataclass(frozen=True)
class OptimConfig:
    kind: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def describe(self) -> str:
        if self.kind == "sgd":
            extra = ""
        elif self.kind == "momentum":
            extra = f" (momentum {self.momentum:g})"
        else:
            extra = f" (betas {self.beta1:g}, {self.beta2:g}; eps {self.eps:g})"
        return self.kind + extra + (f", weight decay {self.weight_decay:g}" if self.weight_decay else "")


def init_state(cfg: OptimConfig, params: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """``{slot: {key: zeros like the weight}}`` for the optimizer's per-weight state."""
    return {slot: {k: np.zeros_like(p) for k, p in params.items()} for slot in SLOTS[cfg.kind]}


def sgd_update(p: np.ndarray, g: np.ndarray, lr: float, weight_decay: float = 0.0) -> None:
    if weight_decay:
        g = g + weight_decay * p
    p -= lr * g


def momentum_update(p: np.ndarray, g: np.ndarray, buf: np.ndarray, lr: float, momentum: float, step: int,
                    weight_decay: float = 0.0) -> None:
    """Heavy-ball momentum, dampening 0, as torch.optim.SGD(momentum=μ): the buffer starts as the first gradient."""
    if weight_decay:
        g = g + weight_decay * p
    if step == 1:
        buf[...] = g
    else:
        buf *= momentum
        buf += g
    p -= lr * buf


def adam_update(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, lr: float, step: int, beta1: float,
                beta2: float, eps: float, weight_decay: float = 0.0, decoupled: bool = False) -> None:
    """One Adam (or, ``decoupled``, AdamW) step of weight ``p`` in place; ``step`` counts from 1."""
    if decoupled:
        p *= 1 - lr * weight_decay
    elif weight_decay:
        g = g + weight_decay * p
    m += (1 - beta1) * (g - m)  # torch's lerp for weights below 0.5
    v *= beta2
    v += (1 - beta2) * g * g
    step_size = lr / (1 - beta1 ** step)
    denom = np.sqrt(v) / sqrt(1 - beta2 ** step)
    denom += eps
    p -= step_size * (m / denom)


def apply_update(cfg: OptimConfig, params: dict[str, np.ndarray], grads: dict[str, np.ndarray],
                 state: dict[str, dict[str, np.ndarray]], lr: float, step: int) -> None:
    """Update every weight that has a gradient, in place; ``step`` is the 1-based number of this update."""
    for key, g in grads.items():
        p = params[key]
        if cfg.kind == "sgd":
            sgd_update(p, g, lr, cfg.weight_decay)
        elif cfg.kind == "momentum":
            momentum_update(p, g, state["momentum_buffer"][key], lr, cfg.momentum, step, cfg.weight_decay)
        else:
            adam_update(p, g, state["exp_avg"][key], state["exp_avg_sq"][key], lr, step, cfg.beta1, cfg.beta2,
                        cfg.eps, cfg.weight_decay, decoupled=cfg.kind == "adamw")


def lr_factor(step: int, total: int, warmup: int = 0, schedule: str = "constant") -> float:
    """The multiplier of the base learning rate for update ``step`` (0-based), as HF's LambdaLR lambdas."""
    if step < warmup:
        return step / max(1, warmup)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + cos(pi * progress)))


def global_norm(grads: Iterable[np.ndarray]) -> float:
    """The 2-norm of all gradients together (summed in float64)."""
    total = 0.0
    for g in grads:
        flat = g.ravel().astype(np.float64)  # one float64 copy at a time, not two
        total += float(np.dot(flat, flat))
    return sqrt(total)


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float) -> float:
    """Scale every gradient by ``max_norm / (total + 1e-6)`` when that is below 1; return the norm before."""
    total = global_norm(grads.values())
    coef = max_norm / (total + CLIP_EPS)
    if coef < 1.0:
        for g in grads.values():
            g *= g.dtype.type(coef)
    return total
