"""Renderer tables, op name -> function writing that node's driver lines and kernels."""

from __future__ import annotations

from collections.abc import Callable

from irc.backends.cpu.render import (
    attention,
    conv,
    dense,
    elementwise,
    embedding,
    gemm,
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
for _family in (elementwise, dense, gemm, conv, norm, embedding, recurrent, attention, sdpa, shape, resample):
    RENDERERS.update(_family.RENDERERS)
RENDERERS.update(moe.RENDERERS)  # mixtures of experts (irc/ops/moe.py)

__all__ = ["RENDERERS", "NodeCtx", "Renderer"]
