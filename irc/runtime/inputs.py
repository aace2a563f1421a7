"""Model inputs for ``irc run``: read from ``.npy`` files or drawn at random from a seed."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from irc.diagnostics import IrcError, UsageError, os_error_words
from irc.graph import Graph, Node
from irc.runtime.array_files import ArraySpec, check_file, read_npy_file, read_npy_header_file
from irc.runtime.weights import fmt_shape

INT_RANGE = 16  # integer inputs that feed no embedding draw from [0, 16)


def concrete_shape(node: Node) -> tuple[int, ...]:
    shape = node.types[0].shape
    free = sorted({str(d) for d in shape if not isinstance(d, int)})
    if free:
        raise IrcError(f"input '{node.outputs[0]}' has symbolic shape {node.types[0]}; bind {', '.join(free)} "
                       "with -D", node.loc)
    return tuple(shape)


def token_bound(graph: Graph, node: Node) -> int | None:
    """The smallest vocabulary among the embeddings this input feeds, if any."""
    vocabs = [u.attrs["vocab"] for u in graph.users().get(node.outputs[0], []) if u.op == "embedding"]
    return min(vocabs) if vocabs else None


def random_inputs(graph: Graph, seed: int, given: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Fill every input not in ``given``: token ids in [0, vocab), other ints in [0, 16), floats N(0, 1)."""
    out = dict(given or {})
    for node in graph.inputs():
        name = node.outputs[0]
        if name in out:
            continue
        shape = concrete_shape(node)
        rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(f"input:{name}".encode())])
        t = node.types[0]
        if t.is_float:
            out[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            high = token_bound(graph, node) or INT_RANGE
            out[name] = rng.integers(0, high, shape).astype(np.int32 if t.dtype == "i32" else np.int64)
    return out


def load_input_files(graph: Graph, specs: list[str]) -> dict[str, np.ndarray]:
    """``NAME=FILE.npy`` flags to arrays, checked against the model's inputs."""
    nodes = {n.outputs[0]: n for n in graph.inputs()}
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--input expects NAME=FILE.npy, got '{spec}'")
        if name not in nodes:
            raise IrcError(f"--input {name}: model '{graph.name}' has no input '{name}' "
                           f"(inputs: {', '.join(nodes) or 'none'})")
        if name in out:
            raise UsageError(f"--input {name} is given twice")
        arr = _read_npy(Path(file), header_only=True)  # shape and dtype checked before any data is read
        node = nodes[name]
        shape = concrete_shape(node)
        if tuple(arr.shape) != shape:
            raise IrcError(f"--input {name}: '{file}' holds shape {fmt_shape(arr.shape)}, "
                           f"but the model expects {fmt_shape(shape)}")
        if node.types[0].is_float and arr.dtype.kind != "f":
            raise IrcError(f"--input {name}: '{file}' holds {arr.dtype} values, but input '{name}' is "
                           f"{node.types[0].dtype} (floats)")
        if not node.types[0].is_float and arr.dtype.kind not in "iu":
            raise IrcError(f"--input {name}: '{file}' holds {arr.dtype} values, but input '{name}' is "
                           f"{node.types[0].dtype}: it expects integer ids")
        arr = _read_npy(Path(file))
        bound = token_bound(graph, node)
        if bound is not None and arr.size and (arr.min() < 0 or arr.max() >= bound):
            bad = arr.min() if arr.min() < 0 else arr.max()
            raise IrcError(f"--input {name}: token id {bad} in '{file}' is outside the vocabulary [0, {bound})")
        out[name] = arr
    return out


def _read_npy(path: Path, header_only: bool = False) -> np.ndarray | ArraySpec:
    check_file(path, "input file")
    try:
        return read_npy_header_file(path) if header_only else read_npy_file(path)
    except OSError as e:  # permissions, I/O errors
        raise IrcError(f"cannot read '{path}': {os_error_words(e)}") from None
