"""Renderer tables, op name -> function writing that node's driver lines and kernels."""

from __future__ import annotations

from collections.abc import Callable

from irc.backends.cpu.render import (
    attention,
    conv,
    conv_bn,
    decode,
    dense,
    elementwise,
    embedding,
    gemm,
    grad_conv,
    grad_elementwise,
    grad_losses,
    grad_norm,
    grad_recurrent,
    grad_sdpa,
    grad_tables,
    moe,
    norm,
    recurrent,
    resample,
    sdpa,
    shape,
)
from irc.backends.cpu.render.context import NodeCtx

Renderer = Callable[[NodeCtx], None]

RENDERERS: dict[str, Renderer] = {}
for _family in (elementwise, dense, gemm, conv, conv_bn, norm, embedding, recurrent, attention, sdpa, shape, resample):
    RENDERERS.update(_family.RENDERERS)
RENDERERS.update(decode.RENDERERS)  # the KV-cache decoding ops (irc/ops/decode.py)
RENDERERS.update(moe.RENDERERS)  # mixtures of experts (irc/ops/moe.py)
# the backward primitives (irc/ops/grad_*.py, losses.py); grad_norm also takes over batchnorm (training mode)
for _family in (grad_elementwise, grad_losses, grad_norm, grad_tables, grad_conv, grad_recurrent, grad_sdpa):
    RENDERERS.update(_family.RENDERERS)

__all__ = ["RENDERERS", "NodeCtx", "Renderer"]
