""".npy and .npz files read without ever unpickling, and a plain word for what a wrong file is.

The ``.npy`` header is parsed first (NumPy's literal parser: no code runs), so an object
array, which only unpickling could read, is refused before any data is touched, and a short
file is reported with both sizes. Errors name the file (and the entry, inside an archive).
"""

from __future__ import annotations

import zipfile
import zlib
from math import prod
from pathlib import Path
from typing import BinaryIO

import numpy as np

from irc.diagnostics import IrcError, did_you_mean

NPY_MAGIC = b"\x93NUMPY"
SNIFF_BYTES = 64  # enough of a file's start to say what it is


def describe(head: bytes, size: int) -> str:
    """What a file of ``size`` bytes starting with ``head`` is, as ``it is ...``."""
    if size == 0:
        return "the file is empty"
    if head.startswith(NPY_MAGIC):
        return "it is a single .npy array"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "it is a zip archive (an .npz?)"
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "it is a Python pickle, which irc never loads (unpickling can run any code)"
    if head.startswith(b"\x89HDF"):
        return "it is an HDF5 file"
    if len(head) > 8 and head[8:9] == b"{":
        return "it looks like a .safetensors file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:  # a character cut at the end of the sniffed bytes still reads as text
        text = head[:e.start].decode("utf-8") if e.start >= len(head) - 3 and len(head) == SNIFF_BYTES else ""
    if text and all(c.isprintable() or c in "\t\r\n" for c in text):
        return "it is text"
    return "it is in a binary format irc does not know"


def sniff(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    return describe(head, path.stat().st_size)


def check_file(path: Path, kind: str) -> None:
    """``path`` names a file: not a folder, not missing (with a did-you-mean from its folder)."""
    if path.exists() and not path.is_file():
        what = "a folder" if path.is_dir() else "a device or a pipe"
        raise IrcError(f"'{path}' is {what}, not {'an' if kind[0] in 'aeiou' else 'a'} {kind}")
    if not path.is_file():
        folder = path.parent if path.parent.is_dir() else None
        near = did_you_mean(path.name, [p.name for p in folder.iterdir()]) if folder else ""
        raise IrcError(f"no such {kind}: '{path}'{near}")


def read_npy(f: BinaryIO, size: int, what: str) -> np.ndarray:
    """The array in the ``.npy`` stream ``f`` (``size`` bytes); ``what`` names it in errors."""
    try:
        return _read_npy(f, size, what)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:  # a bad checksum or stream inside an .npz
        why = "its bytes no longer match their CRC checksum (changed after it was written)" if "CRC" in str(e) \
            else str(e)
        raise IrcError(f"{what} is damaged: {why}") from None


def _read_npy(f: BinaryIO, size: int, what: str) -> np.ndarray:
    head = f.read(8)
    if not head.startswith(NPY_MAGIC) or len(head) < 8:
        raise IrcError(f"{what} is not a readable .npy array: {describe(head + f.read(SNIFF_BYTES - 8), size)}")
    major = head[6]
    try:
        if major not in (1, 2, 3):
            raise ValueError(f"unknown .npy version {major}")
        # version 3 differs from 2 only in allowing UTF-8 field names
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if any(d < 0 for d in shape):
            raise ValueError(f"negative size in shape {list(shape)}")
    except ValueError as e:
        first = str(e).splitlines()[0]
        first = first[:1].lower() + first[1:]
        raise IrcError(f"{what} is not a readable .npy array: its header is damaged ({first})") from None
    if dtype.hasobject:
        raise IrcError(f"{what} holds Python objects (dtype {dtype}), which only unpickling could read; "
                       "irc never unpickles")
    need = prod(shape) * dtype.itemsize
    left = max(size - f.tell(), 0)  # checked before allocating: a damaged header may claim any size
    buf = bytearray(need if need <= left else 0)
    got = f.readinto(buf) if need <= left else left
    if got < need:
        raise IrcError(f"{what} is truncated: its header says {dtype} {list(shape)}, {need:,} bytes of data, "
                       f"but only {got:,} follow")
    arr = np.frombuffer(buf, dtype)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def read_npy_file(path: Path) -> np.ndarray:
    """One array from a ``.npy`` file (``check_file`` first)."""
    with open(path, "rb") as f:
        return read_npy(f, path.stat().st_size, f"'{path}'")


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """``{name: array}`` from an ``.npz`` archive; each entry read by :func:`read_npy`."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        found = sniff(path)
        if found.startswith("it is a zip archive"):
            found = "it starts like a zip archive but is truncated or damaged"
        raise IrcError(f"'{path}' is not an .npz archive: {found}") from None
    out: dict[str, np.ndarray] = {}
    with archive:
        entries = [i for i in archive.infolist() if not i.is_dir()]
        if any(i.filename.endswith("data.pkl") for i in entries):
            raise IrcError(f"'{path}' is a PyTorch checkpoint (torch.save), not an .npz of arrays: it holds pickles, "
                           "which irc never loads; save the weights with safetensors or numpy.savez instead")
        for info in entries:
            name = info.filename
            if not name.endswith(".npy"):
                raise IrcError(f"'{path}': entry '{name}' is not a .npy array; an .npz of weights holds only "
                               ".npy arrays, one per weight")
            with archive.open(info) as f:
                out[name.removesuffix(".npy")] = read_npy(f, info.file_size, f"'{path}': weight '{name[:-4]}'")
    return out
