"""The Numba CPU backend: one generated ``.py`` module per graph, cached on disk.

``emit_source(graph)`` gives the module's text (``irc compile --emit numba``);
``compile_graph(graph)`` writes it into the cache (keyed by the IR text and
:data:`BACKEND_VERSION`), imports it, compiles its kernels and returns a
:class:`~irc.backends.cpu.compiled.CompiledGraph` whose ``run(weights, inputs)`` returns
``{label: array}``. Numba is imported only when a graph is compiled. See README.md here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from irc.backends.cpu.emit import BACKEND_VERSION, emit_source
from irc.backends.cpu.loader import Progress
from irc.graph import Graph

if TYPE_CHECKING:
    from irc.backends.cpu.compiled import CompiledGraph


def compile_graph(graph: Graph, cache_dir: str | Path | None = None,
                  progress: Progress | None = None, pack_weights: bool = True) -> CompiledGraph:
    """Cache, import and compile ``graph``; ``progress(done, total, kernel)`` reports each kernel;
    ``pack_weights=False`` keeps dense layers on the weights as given (no packed copy)."""
    from irc.backends.cpu.compiled import compile_graph as _compile

    return _compile(graph, cache_dir=cache_dir, progress=progress, pack_weights=pack_weights)


__all__ = ["BACKEND_VERSION", "Progress", "compile_graph", "emit_source"]
