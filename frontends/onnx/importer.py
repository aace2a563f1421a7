"""The entry points: ``.onnx`` file → typed irc Graph (for ``irc.pipeline.load_graph``), and its weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from irc.diagnostics import IrcError, UsageError, quote
from irc.graph import Graph

from .convert import Source, import_model
from .reader import load_model


def load_onnx(path: str | Path, bindings: dict | None = None) -> Graph:
    """The graph of an ONNX file with ``-D`` sizes bound (the caller verifies and types it); no weight is read."""
    path = Path(path)
    odd = next((k for k, v in (bindings or {}).items() if not isinstance(v, int)), None)
    if odd is not None:
        raise UsageError(f"-D {odd}: an ONNX model has no constants to override, and its sizes are whole numbers")
    graph, _ = import_model(path, load_model(path, with_data=False))
    if bindings:
        from irc.passes.bind import bind_symbols

        graph = bind_symbols(graph, bindings)
    return graph


def onnx_weights(path: str | Path, graph: Graph) -> dict[str, np.ndarray]:
    """``{irc key: float32 array}`` for every weight of ``graph`` (imported from ``path``), from its initializers."""
    from onnx import numpy_helper

    from irc.runtime.weights import expected_weights

    keys = expected_weights(graph)
    path = Path(path)
    model = load_model(path, with_data=True)
    _, sources = import_model(path, model)
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, np.ndarray] = {}
    for key, shape in keys.items():
        src: Source | None = sources.get(key)
        if src is None:
            raise IrcError(f"'{quote(str(path))}' gives no value for the weight '{quote(key)}'")
        array = numpy_helper.to_array(inits[src.weight]) if src.weight is not None else src.array
        assert array is not None
        if src.perm is not None:
            array = np.transpose(array, src.perm)
        out[key] = np.ascontiguousarray(array, dtype=np.float32).reshape(shape)
    return out


def initializer_weights(path: str | Path, graph: Graph) -> dict[str, np.ndarray] | None:
    """``irc run``'s weights when the model file is ONNX (by content, as ``load_graph`` decides), else None."""
    from irc.file_kinds import ONNX, file_kind

    path = Path(path)
    if not path.is_file() or file_kind(path) != ONNX:
        return None
    return onnx_weights(path, graph)
