"""The on-disk cache of generated modules (cpu and cuda): validated ``.py`` files in folders
that only this user can change.

An entry is ``g_<key>.py`` whose first line is ``# irc-cache key=<key> sha256=<digest of
the rest>``; the key is the sha256 of the IR text (without locations) and the backend
version. An entry is used only when its header, checksum and body all match what this
process would write; anything else (half-written, corrupted, tampered, a folder in its
place) is rebuilt. Writes go to a temporary file and ``os.replace``; a per-entry lock file
serialises processes compiling the same graph, so the second one finds Numba's cache filled.

The cache holds code that is executed and Numba's pickles, so every folder of it must belong
to this user and be writable by no one else: the cache directory itself (refused otherwise,
an error), each folder above it (owned by this user or root, and not writable by others
unless sticky, as /tmp is), and each folder inside it (``kernels/``, ``__pycache__/``: one
that is not private is deleted and made again). Modules are executed from the bytes irc
checked (:mod:`.loader`), never from ``.pyc`` files, and Numba's files are checked against
irc's manifest before Numba reads them (:mod:`.manifest`).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from irc.diagnostics import IrcError, os_error_words
from irc.graph import Graph
from irc.printer import print_graph

HEADER_PREFIX = "# irc-cache "
HEADER_LINES = 1  # the header is one line: the body's line n is the file's line n + 1


class UnsafeCache(OSError):
    """A folder inside the cache that is not private and could not be made so."""


def note(message: str) -> None:
    print(f"irc: note: {message}", file=sys.stderr)


def default_cache_dir(backend: str) -> Path:
    """``$IRC_CACHE_DIR/<backend>``, or ``~/.cache/irc/<backend>``."""
    env = os.environ.get("IRC_CACHE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "irc"
    return base / backend


def cache_key(graph: Graph, backend: str, version: int) -> str:
    """The sha256 of the backend's name and version and the IR text without locations."""
    text = f"irc {backend} backend v{version}\n" + print_graph(graph, with_loc=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def entry_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"g_{key}.py"


def header(key: str, body: str) -> str:
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"{HEADER_PREFIX}key={key} sha256={digest}\n"


def read_entry(path: Path, key: str) -> str | None:
    """The body of a valid entry for ``key``, or None (missing, truncated, corrupted, not a file)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        data = path.read_bytes()
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    first, sep, body = text.partition("\n")
    if not sep or first + "\n" != header(key, body):
        return None
    return body


def clear(path: Path) -> None:
    """Remove whatever is at ``path`` that is not a regular file (a folder, a link, a fifo), so
    a file can be written there: the cache repairs itself instead of failing on every run."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def write_atomic(path: Path, data: bytes) -> None:
    """Readers see the old file or the whole new one, never a part (a temporary file, then
    ``os.replace``; the temporary file is removed if anything fails)."""
    clear(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_entry(path: Path, key: str, body: str) -> None:
    write_atomic(path, (header(key, body) + body).encode("utf-8"))


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1


def _others_can_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _make_private(directory: Path) -> None:
    """Create ``directory`` and any missing folder above it, each ``0700`` (``mkdir(parents=True)``
    would make the parents with the umask's mode, which may let the group write)."""
    missing = []
    for d in [directory, *directory.parents]:
        if d.exists() or d.is_symlink():
            break
        missing.append(d)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)


def _check_above(cache_dir: Path) -> None:
    """The folders above the cache (symbolic links resolved): owned by this user or root, and
    writable by no one else unless sticky (in a sticky folder such as /tmp others cannot
    move our entries)."""
    uid = _uid()
    here = Path.cwd().resolve()
    for d in cache_dir.resolve().parents:
        shown = d if cache_dir.is_absolute() else Path(os.path.relpath(d, here))
        st = d.stat()
        if st.st_uid not in (uid, 0):
            raise IrcError(f"cache directory '{cache_dir}' is inside '{shown}', which belongs to another user; "
                           "its files would run as code (set IRC_CACHE_DIR to a directory of your own)")
        if _others_can_write(st) and not st.st_mode & stat.S_ISVTX:
            raise IrcError(f"cache directory '{cache_dir}' is inside '{shown}', which others can write; "
                           "its files would run as code (set IRC_CACHE_DIR to a directory of your own)")


def prepare_dir(cache_dir: Path) -> Path:
    """Create the directory (private to this user) and refuse one that others can change."""
    if cache_dir.exists() and not cache_dir.is_dir():
        raise IrcError(f"cache directory '{cache_dir}' is not a directory (set IRC_CACHE_DIR to a directory)")
    try:
        _make_private(cache_dir)
        st = cache_dir.stat()
    except OSError as e:
        raise IrcError(f"cannot use cache directory '{cache_dir}': {os_error_words(e)}") from None
    if hasattr(os, "geteuid"):
        if st.st_uid != os.geteuid():
            raise IrcError(f"cache directory '{cache_dir}' belongs to another user; "
                           "its files would run as code (set IRC_CACHE_DIR to a directory of your own)")
        if _others_can_write(st):
            raise IrcError(f"cache directory '{cache_dir}' is writable by others; "
                           "its files would run as code (chmod go-w it, or set IRC_CACHE_DIR)")
        _check_above(cache_dir)
    return cache_dir


def private_subdir(directory: Path) -> Path:
    """A folder inside a checked cache directory, made private: one that is missing is created
    ``0700``; one that is a link or a file, belongs to another user or is writable by others
    is deleted (its contents cannot be trusted) and created again, with a note. UnsafeCache
    when that fails."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            why = "it is not a folder"
        elif hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            why = "it belongs to another user"
        elif _others_can_write(st):
            why = "others can write it"
        else:
            return directory
        note(f"deleted '{directory}' from the kernel cache and made it again: {why}")
        try:
            if stat.S_ISREG(st.st_mode):
                os.unlink(directory)
            else:
                clear(directory)
        except OSError as e:
            raise UnsafeCache(e.errno, f"'{directory}' ({why}) cannot be deleted: {os_error_words(e)}") from None
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    return directory


def fresh_cache_dir() -> Path:
    """A private cache for this process only (removed when it exits): where a run compiles when
    its cache cannot be used (a full disk, a folder that cannot be repaired)."""
    directory = Path(tempfile.mkdtemp(prefix="irc-cache-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


@contextlib.contextmanager
def entry_lock(cache_dir: Path, key: str) -> Iterator[None]:
    """An exclusive lock on one entry (POSIX ``flock``; no lock where that is missing). A lock
    path that is a folder or a link is removed first (the lock file holds nothing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = cache_dir / f"g_{key}.lock"
    clear(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


T = TypeVar("T")


def with_fallback(directory: Path, attempt: Callable[[Path], T]) -> T:
    """``attempt(directory)``; when the cache cannot be written or repaired there (a full
    disk, a folder irc cannot delete), say so and compile into a fresh private folder for
    this run instead. An IrcError when that fails too."""
    try:
        return attempt(directory)
    except OSError as e:
        fresh = fresh_cache_dir()
        note(f"cannot use the kernel cache '{directory}': {_words(e)}; compiling into '{fresh}' for this run")
        try:
            return attempt(fresh)
        except OSError as again:
            raise IrcError(f"cannot compile: the kernel cache '{directory}' cannot be used ({_words(e)}), "
                           f"nor a fresh folder for this run ({_words(again)})") from None


def _words(e: OSError) -> str:
    return str(e.strerror) if isinstance(e, UnsafeCache) else os_error_words(e)
