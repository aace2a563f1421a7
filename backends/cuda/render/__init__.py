"""Renderer tables, op name -> function writing that node's kernels and driver lines."""

from __future__ import annotations

from collections.abc import Callable

from irc.backends.cuda.render import attention, conv, dense, elementwise, embedding, norm, recurrent, resample, shape
from irc.backends.cuda.render.context import Ctx

Renderer = Callable[[Ctx], None]

RENDERERS: dict[str, Renderer] = {}
for _family in (elementwise, dense, conv, norm, embedding, recurrent, attention, shape, resample):
    RENDERERS.update(_family.RENDERERS)

__all__ = ["RENDERERS", "Ctx", "Renderer"]
