""".npy and .npz files read without ever unpickling, and a plain word for what a wrong file is.

The ``.npy`` header is parsed first (NumPy's literal parser: no code runs), so an object
array, which only unpickling could read, is refused before any data is touched, and a short
file is reported with both sizes. Errors name the file (and the entry, inside an archive).

Everything a header says is checked before any data is read: the reader first lists each
entry's dtype, shape and size (:func:`read_npz_header`), the caller checks them against the
model, and only then are the arrays read, each into one buffer of its declared size, so an
archive entry that inflates past its size, or a weight the model does not have, costs no memory.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ArraySpec:
    """What a file's header says about one array, before its data is read (``.shape`` and
    ``.dtype`` as on an ndarray, so checks written for arrays take it too)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int


MAX_DIM = 2**62  # the IR's own bound on a size: larger cannot index an int64 array


def _npy_header(f: BinaryIO, size: int, what: str) -> tuple[ArraySpec, bool]:
    """The ``.npy`` header of the stream ``f`` (``size`` bytes), checked; (spec, fortran order)."""
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
    except (ValueError, TypeError, SyntaxError, MemoryError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        first = first[:1].lower() + first[1:]
        raise IrcError(f"{what} is not a readable .npy array: its header is damaged ({_short(first)})") from None
    if dtype.hasobject:
        raise IrcError(f"{what} holds Python objects (dtype {dtype}), which only unpickling could read; "
                       "irc never unpickles")
    if dtype.subdtype is not None or dtype.names is not None:
        raise IrcError(f"{what} has the compound dtype {_short(str(dtype))}; irc reads arrays of plain numbers "
                       "(save it with a plain dtype such as float32)")
    if any(d >= MAX_DIM for d in shape) or prod(d for d in shape if d) >= MAX_DIM:
        raise IrcError(f"{what}: its header claims shape {_short(str(list(shape)))}, too large for any array")
    need = prod(shape) * dtype.itemsize
    left = max(size - f.tell(), 0)  # checked before allocating: a damaged header may claim any size
    if need > left:
        raise IrcError(f"{what} is truncated: its header says {dtype} {list(shape)}, {need:,} bytes of data, "
                       f"but only {left:,} follow")
    return ArraySpec(dtype, tuple(shape), need), bool(fortran)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _read_data(f: BinaryIO, spec: ArraySpec, fortran: bool, what: str) -> np.ndarray:
    """The array's data: one buffer of exactly the declared size, filled in place (no copies)."""
    try:
        buf = bytearray(spec.nbytes)
    except MemoryError:
        raise IrcError(f"{what}: its {spec.nbytes:,} bytes do not fit in the memory left") from None
    view, got = memoryview(buf), 0
    while got < spec.nbytes:  # a decompressing stream may return less than asked
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    if got < spec.nbytes:
        raise IrcError(f"{what} is truncated: its header says {spec.dtype} {list(spec.shape)}, "
                       f"{spec.nbytes:,} bytes of data, but only {got:,} follow")
    arr = np.frombuffer(buf, spec.dtype)
    return arr.reshape(spec.shape[::-1]).T if fortran else arr.reshape(spec.shape)


def _damaged(what: str, e: Exception) -> IrcError:
    """A bad checksum or stream inside an .npz, in words."""
    why = ("its bytes no longer match their CRC checksum (changed after it was written)" if "CRC" in str(e)
           else _short(str(e) or type(e).__name__))
    return IrcError(f"{what} is damaged: {why}")


def read_npy(f: BinaryIO, size: int, what: str) -> np.ndarray:
    """The array in the ``.npy`` stream ``f`` (``size`` bytes); ``what`` names it in errors."""
    try:
        spec, fortran = _npy_header(f, size, what)
        return _read_data(f, spec, fortran, what)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:
        raise _damaged(what, e) from None


def read_npy_file(path: Path) -> np.ndarray:
    """One array from a ``.npy`` file (``check_file`` first)."""
    with open(path, "rb") as f:
        return read_npy(f, path.stat().st_size, f"'{path}'")


def read_npy_header_file(path: Path) -> ArraySpec:
    """What a ``.npy`` file's header says, checked against its size; no data is read."""
    with open(path, "rb") as f:
        return _npy_header(f, path.stat().st_size, f"'{path}'")[0]


# compression methods Python's zipfile can inflate (numpy.savez_compressed writes DEFLATE)
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
            zipfile.ZIP_LZMA: "lzma"}


def _open_npz(path: Path) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo]]:
    """The archive and its array entries, each checked as far as the zip directory tells."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        found = sniff(path)
        if found.startswith("it is a zip archive"):
            found = "it starts like a zip archive but is truncated or damaged"
        raise IrcError(f"'{path}' is not an .npz archive: {found}") from None
    entries = [i for i in archive.infolist() if not i.is_dir()]
    seen: set[str] = set()
    for info in entries:
        name = info.filename
        if name.endswith("data.pkl"):
            archive.close()
            raise IrcError(f"'{path}' is a PyTorch checkpoint (torch.save), not an .npz of arrays: it holds "
                           "pickles, which irc never loads; save the weights with safetensors or numpy.savez instead")
    for info in entries:
        name, what = info.filename, f"'{path}': entry '{_short(info.filename)}'"
        problem = None
        if not name.endswith(".npy"):
            problem = f"{what} is not a .npy array; an .npz of weights holds only .npy arrays, one per weight"
        elif info.flag_bits & 0x1:
            problem = f"{what} is encrypted; irc reads only plain .npz archives (numpy.savez writes them)"
        elif info.compress_type not in _METHODS:
            problem = (f"{what} is compressed with zip method {info.compress_type}, which irc cannot inflate "
                       f"(it reads {', '.join(_METHODS.values())}; numpy.savez_compressed writes deflate)")
        elif name in seen:
            problem = f"{what} appears twice in the archive; each weight must be stored once"
        if problem:
            archive.close()
            raise IrcError(problem)
        seen.add(name)
    return archive, entries


def _weight_name(path: Path, info: zipfile.ZipInfo) -> str:
    return f"'{path}': weight '{_short(info.filename.removesuffix('.npy'))}'"


def read_npz_header(path: Path) -> dict[str, ArraySpec]:
    """``{name: ArraySpec}`` of an ``.npz`` archive, from each entry's ``.npy`` header: no data is read
    (only the first bytes of each entry are inflated)."""
    out: dict[str, ArraySpec] = {}
    archive, entries = _open_npz(path)
    with archive:
        for info in entries:
            what = _weight_name(path, info)
            try:
                with archive.open(info) as f:
                    out[info.filename.removesuffix(".npy")] = _npy_header(f, info.file_size, what)[0]
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError) as e:
                raise _damaged(what, e) from None
    return out


def read_npz(path: Path, keys: set[str] | None = None) -> dict[str, np.ndarray]:
    """``{name: array}`` from an ``.npz`` archive, only the entries named in ``keys`` when given;
    each array is read into one buffer of its declared size (inflating stops there)."""
    out: dict[str, np.ndarray] = {}
    archive, entries = _open_npz(path)
    with archive:
        for info in entries:
            name = info.filename.removesuffix(".npy")
            if keys is not None and name not in keys:
                continue
            what = _weight_name(path, info)
            try:
                with archive.open(info) as f:
                    spec, fortran = _npy_header(f, info.file_size, what)
                    out[name] = _read_data(f, spec, fortran, what)
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError) as e:
                raise _damaged(what, e) from None
    return out
