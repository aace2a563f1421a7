"""Weights by scope path: which keys a graph needs, checking a set against them, and files.

A weight's key is ``<node.weights>.<param name>`` (``decoder.3.attention.wq``), exactly the
keys of :func:`irc.analysis.params.weight_table` (parameters and buffers). Files are
``.npz`` or ``.safetensors``, read by irc.runtime.array_files and safetensors_files: loading
never unpickles, and a damaged file is named with what is wrong.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from irc.analysis.params import node_params, weight_table
from irc.diagnostics import IrcError, os_error_words, read_source
from irc.graph import Graph, Node
from irc.runtime.array_files import check_file, read_npz
from irc.runtime.safetensors_files import bf16_keys, read_safetensors
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


def check_weights(graph: Graph, weights: dict[str, np.ndarray], source: str = "the weights",
                  floats_converted: bool = False) -> None:
    """Raise IrcError naming every missing and extra key, every wrong shape, or a wrong dtype.

    ``floats_converted``: float16/bfloat16/float64 entries pass (a loader converts them to
    float32 with a note); other dtypes never do."""
    expected = expected_weights(graph)
    missing = [k for k in expected if k not in weights]
    extra = [k for k in weights if k not in expected]
    if missing or extra:
        raise IrcError(f"{source}: " + _key_problems(graph, expected, weights, missing, extra))
    wrong = [key for key, shape in expected.items() if tuple(weights[key].shape) != shape]
    if wrong:
        raise IrcError(f"{source}: " + "; ".join(
            f"weight '{key}' has shape {fmt_shape(weights[key].shape)}, but the model expects "
            f"{fmt_shape(expected[key])}" + ("; transposed?" if _transposed(weights[key].shape, expected[key]) else "")
            for key in wrong))
    for key, shape in expected.items():
        dtype = np.dtype(weights[key].dtype)
        if dtype != WEIGHT_DTYPE and not (floats_converted and dtype.kind == "f"):
            raise IrcError(f"{source}: weight '{key}' has dtype {dtype}, but the model expects {WEIGHT_DTYPE} "
                           f"(shape {fmt_shape(shape)})")


def _transposed(have: tuple[int, ...], want: tuple[int, ...]) -> bool:
    return len(have) == 2 and tuple(have) == tuple(want)[::-1]


def _key_problems(graph: Graph, expected: dict[str, tuple[int, ...]], weights: dict[str, np.ndarray],
                  missing: list[str], extra: list[str]) -> str:
    """Every missing key (with the file's likely rename of it) and every unexpected one, in one message."""
    left = list(extra)
    parts: list[str] = []
    described = []
    for key in missing:
        near = _rename_of(key, expected[key], left, weights)
        if near is not None:
            left.remove(near)  # explained as this key's rename: not listed again as unexpected
        hint = f"; the file has '{near}' instead, renamed?" if near else ""
        described.append((key, hint))
    if len(described) == 1:
        key, hint = described[0]
        parts.append(f"missing weight '{key}' of shape {fmt_shape(expected[key])}{hint}")
    elif described:
        parts.append(f"missing {len(described)} weights: " + ", ".join(
            f"'{key}' of shape {fmt_shape(expected[key])}" + (f" ({hint[2:]})" if hint else "")
            for key, hint in described))
    if len(left) == 1:
        key = left[0]
        near = _near(key, list(expected))
        hint = f"; did you mean '{near}'?" if near and not parts else ""
        parts.append(f"unexpected weight '{key}' of shape {fmt_shape(np.shape(weights[key]))}, "
                     f"which model '{graph.name}' does not have{hint}")
    elif left:
        parts.append(f"{len(left)} unexpected weights, which model '{graph.name}' does not have: "
                     + ", ".join(f"'{k}' of shape {fmt_shape(np.shape(weights[k]))}" for k in left))
    return "; ".join(parts)


def _rename_of(key: str, shape: tuple[int, ...], candidates: list[str], weights: dict[str, np.ndarray]) -> str | None:
    """The file's likeliest name for ``key``: one that ends with it (a framework prefix such as
    ``transformer.``) or that it ends with, then one of the same shape, then one that looks alike."""
    def ends(c: str) -> bool:
        return c.endswith("." + key) or key.endswith("." + c)

    def same(c: str) -> bool:
        return tuple(np.shape(weights[c])) == tuple(shape)

    for pool in ([c for c in candidates if ends(c) and same(c)], [c for c in candidates if ends(c)]):
        if pool:
            return min(pool, key=len)
    return _near(key, [c for c in candidates if same(c)], cutoff=0.0) or _near(key, candidates)


def _near(key: str, candidates: list[str], cutoff: float = 0.6) -> str | None:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=cutoff)
    return close[0] if close else None


# -- files -------------------------------------------------------------------------


def load_weights(path: str | Path, note: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """Read an ``.npz`` or ``.safetensors`` file into ``{key: array}``; never unpickles. bfloat16 tensors
    arrive widened to float32 (exactly), said through ``note``."""
    path = Path(path)
    check_file(path, "weights file")
    kind = _kind(path)
    try:
        if kind == "npz":
            return read_npz(path)
        widened = bf16_keys(path) if note is not None else []
        if widened:
            note(f"'{path}': widened {len(widened)} bfloat16 weight(s) to float32 on load (exact)")
        return read_safetensors(path)
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
    """Write atomically, keys in sorted order, by the rules of every irc output file (irc.output_files:
    the folder must exist, the umask or an existing file's mode is kept, no temporary is left behind)."""
    from irc.output_files import write_atomically

    kind = _kind(Path(path))
    ordered = {k: np.ascontiguousarray(weights[k]) for k in sorted(weights)}

    def write(f) -> None:
        if kind == "npz":
            np.savez(f, **ordered)
        else:
            from safetensors.numpy import save

            f.write(save(ordered))
    write_atomically(str(path), write)


def load_checked(path: str | Path, graph: Graph, note: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """One weights file keyed by irc's own names, checked; float16/float64 entries become float32
    (said through ``note``)."""
    from irc.runtime.weight_headers import read_weights_header

    # headers first: a wrong key, shape or dtype costs no data read (an entry may claim gigabytes)
    check_weights(graph, read_weights_header(path), f"'{path}'", floats_converted=True)  # type: ignore[arg-type]
    weights = to_float32(load_weights(path, note), f"'{path}'", note)
    check_weights(graph, weights, f"'{path}'")
    return weights


def to_float32(weights: dict[str, np.ndarray], source: str,
               note: Callable[[str], None] | None) -> dict[str, np.ndarray]:
    """Float weights of another width converted to float32, counted by dtype in one note."""
    converted: dict[str, int] = {}
    out: dict[str, np.ndarray] = {}
    for key, arr in weights.items():
        if arr.dtype.kind == "f" and arr.dtype != WEIGHT_DTYPE:
            converted[str(arr.dtype)] = converted.get(str(arr.dtype), 0) + 1
            arr = arr.astype(WEIGHT_DTYPE)
        out[key] = arr
    if converted and note is not None:
        what = ", ".join(f"{n} from {dtype}" for dtype, n in sorted(converted.items()))
        note(f"{source}: converted {sum(converted.values())} weight(s) to float32 on load ({what})")
    return out


# -- checkpoints as they ship: a folder, a sharded index, names mapped by the model's weight map -----

INDEX_SUFFIX = ".safetensors.index.json"
_PICKLED = (".bin", ".pt", ".pth", ".ckpt")


def _folder_checkpoint(folder: Path) -> Path:
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    for preferred in ("model" + INDEX_SUFFIX, "model.safetensors"):
        if preferred in names:
            return folder / preferred
    indexes = [n for n in names if n.endswith(INDEX_SUFFIX)]
    files = [n for n in names if n.endswith((".safetensors", ".npz"))]
    if len(indexes) == 1:
        return folder / indexes[0]
    if len(files) == 1 and not indexes:
        return folder / files[0]
    if indexes or files:
        several = indexes or files
        shown = ", ".join(several[:8]) + (f", and {len(several) - 8} more" if len(several) > 8 else "")
        raise IrcError(f"'{folder}' holds several checkpoints ({shown}); name one with --weights")
    pickled = [n for n in names if n.endswith(_PICKLED)]
    if pickled:
        raise IrcError(f"'{folder}' holds only PyTorch pickles ({', '.join(pickled)}), which irc never loads: save "
                       "the model with save_pretrained(..., safe_serialization=True) or safetensors.torch.save_file")
    raise IrcError(f"'{folder}' holds no weights: irc looks for model.safetensors, model{INDEX_SUFFIX}, "
                   f"or one .safetensors or .npz file (it holds: {', '.join(names) or 'nothing'})")


def _index(path: Path) -> dict[str, Path]:
    """``{key: shard file}`` from a Hugging Face ``*.safetensors.index.json``."""
    import json

    check_file(path, "checkpoint index")
    try:
        data = json.loads(read_source(path, str(path), "a checkpoint index"))
    except json.JSONDecodeError as e:
        raise IrcError(f"'{path}' is not a valid checkpoint index: {e.msg.lower()} at line {e.lineno}, "
                       f"column {e.colno}") from None
    table = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table or not all(isinstance(v, str) for v in table.values()):
        raise IrcError(f"'{path}' is not a checkpoint index: it needs a \"weight_map\" from each key to its "
                       "shard's file name")
    shards: dict[str, Path] = {}
    for key, name in table.items():
        if Path(name).name != name:
            raise IrcError(f"'{path}': key '{key}' names shard '{name}', which is not a file in the index's folder")
        shards[key] = path.parent / name
    return shards


def load_checkpoint(path: str | Path, note: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a file, a folder or a sharded index; a key the index puts in one shard must be there."""
    path = Path(path)
    if path.is_dir():
        path = _folder_checkpoint(path)
    if not path.name.endswith(INDEX_SUFFIX):
        return load_weights(path, note)
    table = _index(path)
    out: dict[str, np.ndarray] = {}
    for shard in sorted(set(table.values())):
        tensors = load_weights(shard, note)
        listed = {k for k, s in table.items() if s == shard}
        absent = sorted(listed - set(tensors))
        if absent:
            raise IrcError(f"'{path}' puts {len(absent)} weight(s) in '{shard.name}' that it does not hold: "
                           + ", ".join(f"'{k}'" for k in absent))
        unlisted = sorted(set(tensors) - listed)
        if unlisted:
            raise IrcError(f"'{shard}' holds {len(unlisted)} weight(s) that its index '{path.name}' does not list: "
                           + ", ".join(f"'{k}'" for k in unlisted))
        out.update(tensors)
    return out


def load_for_model(path: str | Path, graph: Graph, model_file: str | Path | None,
                   note: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """``irc run --weights``: irc-keyed files as they are; anything else through the model's weight map."""
    from irc.runtime.weight_map import apply_map, load_map, map_path_for

    path = Path(path)
    map_file = map_path_for(model_file) if model_file is not None else None
    has_map = map_file is not None and map_file.is_file()
    resolved = _folder_checkpoint(path) if path.is_dir() else path
    if not has_map and not resolved.name.endswith(INDEX_SUFFIX):
        return load_checked(resolved, graph, note)  # one file in irc's keys: its headers are checked first
    tensors = load_checkpoint(resolved, note)
    expected = expected_weights(graph)
    source = f"'{path}'"
    irc_keyed = 2 * len(set(tensors) & set(expected)) > len(tensors)  # a file in irc's own keys needs no map
    if has_map and not irc_keyed:
        assert map_file is not None
        tensors = apply_map(load_map(map_file), tensors, expected, source, str(map_file))
    weights = to_float32(tensors, source, note)
    check_weights(graph, weights, source)
    return weights
