"""The CUDA backend: numba.cuda kernels for a fused graph, one generated module on disk.

``emit_source(graph)`` gives the module's text (``irc compile --emit cuda``; no GPU needed);
``compile_graph(graph)`` fuses the graph, writes the module into the cache (keyed by the
fused IR and :data:`BACKEND_VERSION`), imports it, compiles its kernels and returns a
:class:`~irc.backends.cuda.compiled.CompiledGraph` whose ``run(weights, inputs)`` returns
``{label: array}``. Without a GPU it raises an IrcError, unless ``NUMBA_ENABLE_CUDASIM=1``
selects numba's simulator. numba.cuda is imported only when a graph is compiled; see
docs/cuda.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from irc.backends.cuda.emit import BACKEND_VERSION, emit_source
from irc.backends.cuda.loader import Progress
from irc.graph import Graph

if TYPE_CHECKING:
    from irc.backends.cuda.compiled import CompiledGraph


def compile_graph(graph: Graph, cache_dir: str | Path | None = None, progress: Progress | None = None,
                  reduction: str | None = None) -> CompiledGraph:
    """Fuse, cache, import and compile ``graph``; ``progress(done, total, kernel)`` reports each kernel."""
    from irc.backends.cuda.compiled import compile_graph as _compile

    return _compile(graph, cache_dir=cache_dir, progress=progress, reduction=reduction)


__all__ = ["BACKEND_VERSION", "Progress", "compile_graph", "emit_source"]
