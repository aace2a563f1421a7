"""Weights by scope path: which keys a graph needs, checking a set against them, and files.

A weight's key is ``<node.weights>.<param name>`` (``decoder.3.attention.wq``), exactly the
keys of :func:`irc.analysis.params.weight_table` (parameters and buffers). Files are
``.npz`` or ``.safetensors``, read by irc.runtime.array_files and safetensors_files: loading
never unpickles, and a damaged file is named with what is wrong.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path

import numpy as np

from irc.analysis.params import node_params, weight_table
from irc.diagnostics import IrcError, os_error_words
from irc.graph import Graph, Node
from irc.runtime.array_files import check_file, read_npz
from irc.runtime.safetensors_files import read_safetensors
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
    check_file(path, "weights file")
    kind = _kind(path)
    try:
        return read_npz(path) if kind == "npz" else read_safetensors(path)
    except OSError as e:  # permissions, I/O errors
        raise IrcError(f"cannot read '{path}': {os_error_words(e)}") from None


# other suffixes people reach for, and what to do instead
_SUFFIX_HINTS = {
    ".npy": "; an .npy holds one array: save every weight into one .npz with numpy.savez",
    ".pt": "; PyTorch checkpoints hold pickles, which irc never loads: convert with safetensors.torch.save_file",
    ".pth": "; PyTorch checkpoints hold pickles, which irc never loads: convert with safetensors.torch.save_file",
    ".bin": "; PyTorch checkpoints hold pickles, which irc never loads: convert with safetensors.torch.save_file",
    ".ckpt": "; PyTorch checkpoints hold pickles, which irc never loads: convert with safetensors.torch.save_file",
    ".h5": "; irc does not read HDF5: save the weights as .npz or .safetensors",
}


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".npz", ".safetensors"):
        return suffix[1:]
    raise IrcError(f"weights file '{path}' must end in .npz or .safetensors{_SUFFIX_HINTS.get(suffix, '')}")


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
