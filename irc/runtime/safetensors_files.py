""".safetensors files: the header checked by irc, so damage is named plainly, then the data read by irc.

The format: an 8-byte little-endian header length N, N bytes of JSON (``{key: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}``), then the data, which the
entries must tile exactly. The checks below are the ones the ``safetensors`` library makes,
in words that name the file, the entry and both sizes.

The data is read here rather than by the library: each tensor goes straight from the file
into one array of its declared size (the library's ``load_file`` holds a second copy), only
the tensors asked for are read, and running out of memory is an error, not a Rust panic.
"""

from __future__ import annotations

import json
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from irc.diagnostics import IrcError
from irc.runtime.array_files import MAX_DIM, SNIFF_BYTES, ArraySpec, describe

MAX_HEADER_BYTES = 100_000_000  # the library's own limit
NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "U64": np.uint64,
                "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8,
                "BOOL": np.bool_, "C64": np.complex64}
# dtypes the format has that NumPy cannot hold; bfloat16 (how most Llama, Mistral and Qwen checkpoints
# ship) is read all the same: it is the top half of a float32, so widening it is exact
OTHER_DTYPES = {"BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"}
WIDENED = {"BF16": np.float32}  # read as this NumPy dtype


def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype(WIDENED.get(name) or NUMPY_DTYPES[name]).newbyteorder("<")


def _widen_bf16(raw: bytearray, shape: list[int]) -> np.ndarray:
    """bfloat16 bits to float32: the same sign, exponent and leading mantissa bits, zeros below."""
    return (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4").reshape(shape)


def bf16_keys(path: Path) -> list[str]:
    """The tensors a .safetensors file stores as bfloat16 (from its header alone)."""
    return [key for key, e in check_header(path).items() if e["dtype"] == "BF16"]


def read_header(path: Path) -> dict[str, ArraySpec]:
    """``{key: ArraySpec}`` from the header alone (after :func:`check_header`): no data is read."""
    return {key: ArraySpec(_numpy_dtype(e["dtype"]), tuple(e["shape"]), e["data_offsets"][1] - e["data_offsets"][0])
            for key, e in check_header(path).items()}


def read_safetensors(path: Path, keys: set[str] | None = None) -> dict[str, np.ndarray]:
    """``{key: array}``, after :func:`check_header`; only the tensors in ``keys`` when given."""
    entries = check_header(path)
    with open(path, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
        out: dict[str, np.ndarray] = {}
        for key, e in entries.items():
            if keys is not None and key not in keys:
                continue
            begin, end = e["data_offsets"]
            try:
                buf = bytearray(end - begin)
            except MemoryError:
                raise IrcError(f"'{path}': weight '{_short(key)}' ({end - begin:,} bytes) does not fit in the "
                               "memory left") from None
            f.seek(start + begin)
            got = f.readinto(buf)
            if got != end - begin:  # the file shrank after check_header measured it
                raise IrcError(f"'{path}' is truncated: weight '{_short(key)}' takes data bytes {begin:,} to "
                               f"{end:,}, but the file ends first")
            if e["dtype"] == "BF16":
                out[key] = _widen_bf16(buf, e["shape"])
                continue
            dtype = np.dtype(NUMPY_DTYPES[e["dtype"]]).newbyteorder("<")  # the format is little-endian
            out[key] = np.frombuffer(buf, dtype).reshape(e["shape"])
    return out


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def check_header(path: Path) -> dict[str, Any]:
    """The header's tensor entries, once the file is known to be whole and consistent."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
        if head[8:9] != b"{":  # the header is a JSON object
            raise IrcError(f"'{path}' is not a .safetensors file: {describe(head, size)}")
        n = int.from_bytes(head[:8], "little")
        if n > MAX_HEADER_BYTES:
            raise IrcError(f"'{path}': the .safetensors header length is damaged: it says {n:,} bytes, "
                           f"more than the format allows ({MAX_HEADER_BYTES:,})")
        if 8 + n > size:
            raise IrcError(f"'{path}' is truncated: its .safetensors header is {n:,} bytes long, "
                           f"but only {size - 8:,} bytes follow the length field")
        f.seek(8)
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise IrcError(f"'{path}': the .safetensors header is not UTF-8 text (byte {e.start + 8})") from None
    except json.JSONDecodeError as e:
        raise IrcError(f"'{path}': the .safetensors header is not valid JSON: {e.msg.lower()} "
                       f"at byte {e.pos + 8}") from None
    except (ValueError, RecursionError) as e:  # Python's limit on integer digits, or lists nested thousands deep
        why = "lists nested too deep" if isinstance(e, RecursionError) else "a number with thousands of digits"
        raise IrcError(f"'{path}': the .safetensors header is damaged: it holds {why}, which no tensor table "
                       "has") from None
    problem = _header_problem(header)
    if problem:
        raise IrcError(f"'{path}': the .safetensors header is damaged: {problem}")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    for key, entry in entries.items():
        if entry["dtype"] in OTHER_DTYPES and entry["dtype"] not in WIDENED:
            raise IrcError(f"'{path}': weight '{_short(key)}' is stored as {entry['dtype']}, which NumPy cannot hold; "
                           "irc reads float32 weights (convert the file to F32)")
    data = size - 8 - n
    for key, entry in sorted(entries.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):  # the first one cut
        begin, end = entry["data_offsets"]
        if end > data:
            raise IrcError(f"'{path}' is truncated: weight '{_short(key)}' takes data bytes {begin:,} to {end:,}, "
                           f"but the file holds only {data:,} bytes of data")
    problem = _tiling_problem(entries, data)
    if problem:
        raise IrcError(f"'{path}': the .safetensors data does not match its header: {problem}")
    return entries


def _header_problem(header: Any) -> str | None:
    """Why the parsed header is not a safetensors header, or None."""
    if not isinstance(header, dict):
        return f"it is a JSON {type(header).__name__}, not an object"
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return "'__metadata__' must map names to strings"
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            return f"the entry for '{_short(key)}' must have exactly dtype, shape and data_offsets"
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or (dtype not in NUMPY_DTYPES and dtype not in OTHER_DTYPES):
            return f"weight '{_short(key)}' has unknown dtype {_short(json.dumps(dtype))}"
        if (not isinstance(shape, list) or not all(type(d) is int and 0 <= d < MAX_DIM for d in shape)
                or prod(d for d in shape if d) >= MAX_DIM):
            return f"weight '{_short(key)}' has shape {_short(json.dumps(shape))}, not a list of sizes"
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            return (f"weight '{_short(key)}' has data_offsets {_short(json.dumps(offsets))}, "
                    "not [begin, end] with begin <= end")
        if dtype in NUMPY_DTYPES or dtype == "BF16":
            need = prod(shape) * (2 if dtype == "BF16" else np.dtype(NUMPY_DTYPES[dtype]).itemsize)
            if offsets[1] - offsets[0] != need:
                return (f"weight '{_short(key)}' is {dtype} {shape}, {need:,} bytes, but its data_offsets "
                        f"{offsets} span {offsets[1] - offsets[0]:,}")
    return None


def _tiling_problem(entries: dict[str, Any], data: int) -> str | None:
    """The entries must cover the data bytes exactly, end to end, as the library requires."""
    at = 0
    for key, entry in sorted(entries.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, end = entry["data_offsets"]
        if begin != at:
            return (f"weight '{_short(key)}' starts at data byte {begin:,}, but the weights before it end at {at:,} "
                    f"({'a gap' if begin > at else 'an overlap'})")
        at = end
    if at != data:
        return f"the weights take {at:,} bytes of data, but the file holds {data:,}"
    return None
