"""Writing the user's output files: atomically, and with an error that names what is in the way.

A file is written to a temporary name in its folder and renamed over the target, so a
failed or interrupted write never leaves half a file behind. A rehearsal makes the same
write and keeps nothing: commands that work for long check ``-o`` with it first, so a bad
path costs an error up front rather than the results at the end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from irc.diagnostics import UsageError, os_error_words


def write_atomically(path: str, write: Callable[[BinaryIO], None], *, rehearse: bool = False) -> None:
    """Create ``path`` (and its folders) with the bytes ``write`` puts into the file it is given."""
    target = Path(path)
    try:
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            if not rehearse:
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except OSError as e:
        raise UsageError(f"cannot write '{path}': {why_unwritable(target, e)}") from None


def why_unwritable(target: Path, e: OSError) -> str:
    """Plain words for a failed write: name the path component that is in the way."""
    blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"'{blocker}' is not a folder"
    if target.is_dir():
        return "it is a folder"
    return os_error_words(e)
