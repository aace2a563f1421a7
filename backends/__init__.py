"""Backends: executors and code generators for irc graphs (installed as ``irc.backends``).

``get_backend(name)`` returns a :class:`Backend`; every backend compiles a typed graph into
an object with ``.run(weights, inputs) -> {output label: array}``. ``numpy`` is the
reference interpreter (the oracle); ``cpu`` (Numba) and ``cuda`` are imported lazily so
that a missing compiler stack only matters to whoever asks for it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from irc.diagnostics import IrcError, did_you_mean
from irc.graph import Graph


class Compiled(Protocol):
    def run(self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


# progress(done, total, what): called by a backend while it compiles (kernel by kernel)
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Backend:
    """``compile(graph, progress=None)``. A compiled object may have a ``profile`` attribute:
    set it to a dict and ``run`` adds seconds per op name to it."""

    name: str
    compile: Callable[..., Compiled]


class _NumpyCompiled:
    """The reference interpreter behind the same ``compile(graph).run(...)`` interface."""

    def __init__(self, graph: Graph, dtype: Any = np.float32):
        self.graph = graph
        self.dtype = dtype
        self.profile: dict[str, float] | None = None

    def run(self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from irc.backends.numpy_ref import run_graph

        return run_graph(self.graph, weights, inputs, self.dtype, self.profile)


def _compile_numpy(graph: Graph, progress: Progress | None = None) -> Compiled:
    return _NumpyCompiled(graph)


def _lazy_compile(module: str, what: str) -> Callable[..., Compiled]:
    def compile_graph(graph: Graph, progress: Progress | None = None) -> Compiled:
        fn = _import(module, what).compile_graph
        if progress is not None and "progress" in inspect.signature(fn).parameters:
            return fn(graph, progress=progress)
        return fn(graph)
    return compile_graph


def _import(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = e.name if isinstance(e, ModuleNotFoundError) and e.name else None
        why = (f"it needs the Python package '{missing.split('.')[0]}', which is not installed"
               if missing and not missing.startswith("irc.") else str(e))
        raise IrcError(f"the {what} backend is not available: {why}") from None


BACKENDS: dict[str, Backend] = {
    "numpy": Backend("numpy", _compile_numpy),
    "cpu": Backend("cpu", _lazy_compile("irc.backends.cpu", "cpu (Numba)")),
    "cuda": Backend("cuda", _lazy_compile("irc.backends.cuda", "cuda")),
}

# `irc compile --emit KIND` -> (module, what it is called in errors)
_EMITTERS: dict[str, tuple[str, str]] = {
    "numba": ("irc.backends.cpu", "cpu (Numba)"),
    "cuda": ("irc.backends.cuda", "cuda"),
    "torch": ("irc.backends.torch", "torch"),
    "dot": ("irc.backends.dot", "dot"),
}
# `irc compile --emit KIND -o FILE` for binary files: the module's write_file(graph, path, kind=, ...) writes them
FILE_EMITTERS: dict[str, tuple[str, str]] = {
    "onnx": ("irc.backends.onnx", "onnx"),
    "svg": ("irc.backends.dot", "dot"),
    "png": ("irc.backends.dot", "dot"),
}


def get_backend(name: str) -> Backend:
    backend = BACKENDS.get(name)
    if backend is None:
        raise IrcError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)}){did_you_mean(name, BACKENDS)}")
    return backend


def emit_source(graph: Graph, kind: str, **options: Any) -> str:
    """The generated source a backend would run, for a user to read."""
    if kind not in _EMITTERS:
        raise IrcError(f"cannot emit '{kind}' (known: {', '.join(_EMITTERS)})")
    module, what = _EMITTERS[kind]
    mod = _import(module, what)
    if not hasattr(mod, "emit_source"):
        raise IrcError(f"the {what} backend cannot emit source yet")
    return mod.emit_source(graph, **_accepted(mod.emit_source, options))


def emit_file(graph: Graph, kind: str, path: str, **options: Any) -> None:
    """Write a binary export (``onnx``, ``svg``, ``png``) of ``graph`` to ``path``."""
    module, what = FILE_EMITTERS[kind]
    mod = _import(module, what)
    mod.write_file(graph, path, kind=kind, **options)


def _accepted(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The options ``fn`` takes (an emitter without a ``depth`` never sees one)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return options
    return {k: v for k, v in options.items() if k in params}
