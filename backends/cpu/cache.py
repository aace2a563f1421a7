"""The on-disk cache of generated modules: one validated ``.py`` file per graph.

An entry is ``g_<key>.py`` whose first line is ``# irc-cache key=<key> sha256=<digest of
the rest>``; the key is the sha256 of the IR text (without locations) and the backend
version. An entry is used only when its header, checksum and body all match what this
process would write; anything else (half-written, corrupted, tampered) is rebuilt.
Writes go to a temporary file and ``os.replace``; a per-entry lock file serialises
processes compiling the same graph, so the second one finds Numba's cache filled.

The cache holds code that is executed, as does Numba's own cache beside it (``__pycache__``,
pickles): the directory must belong to this user and not be writable by others.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from irc.diagnostics import IrcError, os_error_words
from irc.graph import Graph
from irc.printer import print_graph

HEADER_PREFIX = "# irc-cache "
HEADER_LINES = 1  # the header is one line: the body's line n is the file's line n + 1


def default_cache_dir() -> Path:
    env = os.environ.get("IRC_CACHE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "irc"
    return base / "cpu"


def cache_key(graph: Graph, version: int) -> str:
    text = f"irc cpu backend v{version}\n" + print_graph(graph, with_loc=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def entry_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"g_{key}.py"


def header(key: str, body: str) -> str:
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"{HEADER_PREFIX}key={key} sha256={digest}\n"


def read_entry(path: Path, key: str) -> str | None:
    """The body of a valid entry for ``key``, or None (missing, truncated, corrupted)."""
    try:
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


def write_entry(path: Path, key: str, body: str) -> None:
    """Write atomically: readers see the old entry or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(header(key, body))
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def prepare_dir(cache_dir: Path) -> Path:
    """Create the directory (private to this user) and refuse one that others can write."""
    if cache_dir.exists() and not cache_dir.is_dir():
        raise IrcError(f"cache directory '{cache_dir}' is not a directory (set IRC_CACHE_DIR to a directory)")
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = cache_dir.stat()
    except OSError as e:
        raise IrcError(f"cannot use cache directory '{cache_dir}': {os_error_words(e)}") from None
    if hasattr(os, "getuid"):
        if st.st_uid != os.getuid():
            raise IrcError(f"cache directory '{cache_dir}' belongs to another user; "
                           "its files would run as code (set IRC_CACHE_DIR to a directory of your own)")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise IrcError(f"cache directory '{cache_dir}' is writable by others; "
                           "its files would run as code (chmod go-w it, or set IRC_CACHE_DIR)")
    return cache_dir


@contextlib.contextmanager
def entry_lock(cache_dir: Path, key: str) -> Iterator[None]:
    """An exclusive lock on one entry (POSIX ``flock``; no lock where that is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(cache_dir / f"g_{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
