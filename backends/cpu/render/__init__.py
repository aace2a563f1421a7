"""Renderer tables, op name -> function writing that node's driver lines and kernels."""

from __future__ import annotations

from collections.abc import Callable

from irc.backends.cpu.render import attention, conv, dense, elementwise, embedding, norm, recurrent, shape
from irc.backends.cpu.render.context import NodeCtx

Renderer = Callable[[NodeCtx], None]

RENDERERS: dict[str, Renderer] = {}
for _family in (elementwise, dense, conv, norm, embedding, recurrent, attention, shape):
    RENDERERS.update(_family.RENDERERS)

__all__ = ["RENDERERS", "NodeCtx", "Renderer"]
