"""Weights by scope path: which keys a graph needs, checking a set against them, and files.

A weight's key is ``<node.weights>.<param name>`` (``decoder.3.attention.wq``), exactly the
keys of :func:`irc.analysis.params.weight_table` (parameters and buffers). Files are
``.npz`` (read with ``allow_pickle=False``: loading never unpickles) or ``.safetensors``.
"""

from __future__ import annotations

import difflib
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from irc.analysis.params import node_params, weight_table
from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.types import TensorType

WEIGHT_DTYPE = np.dtype(np.float32)


def fmt_shape(shape: tuple) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def expected_weights(graph: Graph) -> dict[str, tuple[int, ...]]:
    """Every key the graph reads, with its concrete shape (symbols must be bound)."""
    params, buffers = weight_table(graph)
    out: dict[str, tuple[int, ...]] = {}
    for key, shape in {**params, **buffers}.items():
        if not all(isinstance(d, int) for d in shape):
            free = sorted({str(d) for d in shape if not isinstance(d, int)})
            raise IrcError(f"weight '{key}' has symbolic shape {fmt_shape(shape)}; bind {', '.join(free)} with -D")
        out[key] = tuple(shape)
    return out


def node_weight_keys(node: Node, types: dict[str, TensorType]) -> dict[str, str]:
    """The node's parameter names mapped to full keys (a tied unembedding reads the embedding's table)."""
    params, buffers = node_params(node, types)
    keys = {name: f"{node.weights}.{name}" for name in {**params, **buffers}}
    if node.op == "unembed" and node.attrs.get("tied") is not None:
        keys["weight"] = f"{node.attrs['tied']}.weight"
    return keys


def check_weights(graph: Graph, weights: dict[str, np.ndarray], source: str = "the weights") -> None:
    """Raise IrcError on a missing or extra key, a wrong shape or a wrong dtype."""
    expected = expected_weights(graph)
    missing = [k for k in expected if k not in weights]
    if missing:
        key = missing[0]
        unexpected = [k for k in weights if k not in expected]
        same_shape = [k for k in unexpected if tuple(np.shape(weights[k])) == expected[key]]
        near = _near(key, same_shape, cutoff=0.0) or _near(key, unexpected)
        hint = f"; the file has '{near}' instead, renamed?" if near else ""
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise IrcError(f"{source}: missing weight '{key}' of shape {fmt_shape(expected[key])}{more}{hint}")
    extra = [k for k in weights if k not in expected]
    if extra:
        key = extra[0]
        near = _near(key, list(expected))
        hint = f"; did you mean '{near}'?" if near else ""
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise IrcError(f"{source}: unexpected weight '{key}' of shape {fmt_shape(np.shape(weights[key]))}, "
                       f"which model '{graph.name}' does not have{more}{hint}")
    for key, shape in expected.items():
        arr = weights[key]
        if tuple(arr.shape) != shape:
            raise IrcError(f"{source}: weight '{key}' has shape {fmt_shape(arr.shape)}, "
                           f"but the model expects {fmt_shape(shape)}")
        if arr.dtype != WEIGHT_DTYPE:
            raise IrcError(f"{source}: weight '{key}' has dtype {arr.dtype}, but the model expects {WEIGHT_DTYPE} "
                           f"(shape {fmt_shape(shape)})")


def _near(key: str, candidates: list[str], cutoff: float = 0.6) -> str | None:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=cutoff)
    return close[0] if close else None


# -- files -------------------------------------------------------------------------


def load_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Read an ``.npz`` or ``.safetensors`` file into ``{key: array}``; never unpickles."""
    path = Path(path)
    if not path.is_file():
        raise IrcError(f"no such weights file: '{path}'")
    kind = _kind(path)
    try:
        if kind == "npz":
            return _load_npz(path)
        from safetensors.numpy import load_file

        return dict(load_file(str(path)))
    except IrcError:
        raise
    except ImportError:
        raise IrcError("reading .safetensors needs the 'safetensors' package (pip install safetensors)") from None
    except Exception as e:  # zip, npy-header and safetensors errors all mean "not a weights file"
        raise IrcError(f"'{path}' is not a readable {kind} weights file "
                       f"(truncated or another format?): {type(e).__name__}: {e}") from None


def _kind(path: Path) -> str:
    if path.suffix == ".npz":
        return "npz"
    if path.suffix == ".safetensors":
        return "safetensors"
    raise IrcError(f"weights file '{path}' must end in .npz or .safetensors")


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(path):
        raise IrcError(f"'{path}' is not an .npz archive (a pickle, a truncated file or another format); "
                       "irc never unpickles weights")
    out: dict[str, np.ndarray] = {}
    with np.load(path, allow_pickle=False) as archive:
        for key in archive.files:
            try:
                arr = archive[key]
            except ValueError as e:  # object arrays need pickle: refused
                raise IrcError(f"'{path}': entry '{key}' cannot be read without unpickling ({e})") from None
            out[key] = arr
    return out


def save_weights(path: str | Path, weights: dict[str, np.ndarray]) -> None:
    """Write atomically (a half-written file is never left behind), keys in sorted order."""
    path = Path(path)
    kind = _kind(path)
    ordered = {k: np.ascontiguousarray(weights[k]) for k in sorted(weights)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp.{kind}")
    os.close(fd)
    try:
        if kind == "npz":
            with open(tmp, "wb") as f:
                np.savez(f, **ordered)
        else:
            from safetensors.numpy import save_file

            save_file(ordered, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checked(path: str | Path, graph: Graph) -> dict[str, np.ndarray]:
    weights = load_weights(path)
    check_weights(graph, weights, f"'{path}'")
    return weights
