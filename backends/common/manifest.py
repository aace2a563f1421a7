"""Numba's files for a cached module are used only as irc sealed them.

Numba caches a module's compiled code in ``__pycache__/<stem>.*.nbi`` (an index: a pickle)
and ``<stem>.*.nbc`` (pickled object code); unpickling runs code, so a planted or damaged
file must never reach Numba. After irc compiles a module's kernels (numba has then written
those files) it seals them: ``<stem>.numba`` beside the module lists each file's sha256,
written atomically. Before Numba may read them again they are checked against that list:
any file that is unlisted, changed, or not a regular file, and any set of files without a
manifest, is deleted with the manifest, so Numba compiles afresh (and irc seals again).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from irc.backends.common.cache import clear, private_subdir, write_atomic

SUFFIXES = (".nbi", ".nbc")


def pycache(path: Path) -> Path:
    """The ``__pycache__`` folder where Numba caches the module at ``path``, made private."""
    return private_subdir(path.parent / "__pycache__")


def numba_cache_files(path: Path) -> list[Path]:
    """Numba's index and data files for the module at ``path`` (``__pycache__/<stem>.*``)."""
    folder = path.parent / "__pycache__"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(path.stem + ".") and p.suffix in SUFFIXES)


def manifest_path(path: Path) -> Path:
    return path.with_suffix(".numba")


def _digest(file: Path) -> str | None:
    """The sha256 of a regular file (not a link), or None."""
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return hashlib.sha256(f.read()).hexdigest()


def _listed(path: Path) -> dict[str, str] | None:
    try:
        data = json.loads(manifest_path(path).read_bytes())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None
    return files


def seal(path: Path) -> None:
    """Record Numba's files for ``path`` as they are now (irc has just compiled them)."""
    files = {f.name: _digest(f) for f in numba_cache_files(path)}
    if not files:
        _remove(manifest_path(path))
        return
    text = json.dumps({"module": path.name, "files": files}, indent=1, sort_keys=True) + "\n"
    write_atomic(manifest_path(path), text.encode("utf-8"))


def forget(path: Path) -> None:
    """Delete Numba's files for ``path`` and their manifest."""
    for f in numba_cache_files(path):
        _remove(f)
    _remove(manifest_path(path))


def _remove(path: Path) -> None:
    clear(path)  # a folder or a link in a file's place
    path.unlink(missing_ok=True)


def verify(path: Path) -> bool:
    """True when Numba's files for ``path`` are exactly those irc sealed, unchanged; otherwise
    (nothing cached, unsealed, damaged, planted) they are deleted and the answer is False.
    The ``__pycache__`` folder is made private first (:func:`pycache`). Call it holding the
    module's lock: Numba writes its files only under that lock, so a temporary file there is
    one a killed process left behind."""
    folder = pycache(path)
    for leftover in folder.glob(f"{path.stem}.*.tmp.*"):  # a write Numba did not finish (killed)
        _remove(leftover)
    present = numba_cache_files(path)
    listed = _listed(path)
    if present and listed is not None and {f.name for f in present} == set(listed):
        if all(_digest(f) == listed[f.name] for f in present):
            return True
    forget(path)
    return False
