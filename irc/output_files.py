"""Writing the user's output files: atomically, and with an error that names what is in the way.

A file is written to a temporary name in its folder and renamed over the target, so a
failed or interrupted write never leaves half a file behind. A rehearsal makes the same
write and keeps nothing: commands that work for long check ``-o`` with it first, so a bad
path costs an error up front rather than the results at the end.

The temporary file is ``.<name>.<pid>-<random>.irc-tmp``: ``irc.cli`` turns SIGTERM into an
exit that removes it, and a write finds and removes the ones a killed irc (SIGKILL, power
loss) left beside its target, by their process id. The file gets the mode a plain ``open``
would give it (the umask; an existing file's own mode), not ``mkstemp``'s 0600. A missing
folder is an error: a typo in ``-o`` should not create a tree of folders.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from irc.diagnostics import UsageError, os_error_words, quote

TEMP_SUFFIX = ".irc-tmp"
NAME_MAX = 255  # bytes in one file name on Linux and macOS file systems
_TEMP = re.compile(r"\.(?P<stem>.*)\.(?P<pid>[0-9]+)-[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX))


def check_output_path(path: str, flag: str = "-o") -> None:
    """Refuse an empty file name before any work is done (``-o ''`` would otherwise write nowhere)."""
    if not path:
        raise UsageError(f"{flag}: the file name is empty")


def same_file(a: str | Path, b: str | Path) -> bool:
    """``a`` and ``b`` name one file (through links, ``./`` and the like)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def refuse_overwriting_input(output: str, inputs: dict[str, str | Path], flag: str = "-o") -> None:
    """``-o`` naming one of the command's own input files would destroy it: refuse up front."""
    for what, given in inputs.items():
        if given and same_file(output, given):
            raise UsageError(f"{flag} '{quote(output)}' is the {what}; writing there would destroy it "
                             "(choose another file name)")


def _temp_stem(name: str) -> str:
    """The part of ``name`` the temporary name keeps: short enough that ``.stem.pid-random.irc-tmp``
    fits in NAME_MAX bytes whatever the target's length (cut at a character boundary)."""
    room = NAME_MAX - len(".") - len(".4194304-") - 8 - len(TEMP_SUFFIX)
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= room:
        return name
    return raw[:room].decode("utf-8", "ignore")


def _remove_stale_temps(folder: Path, stem: str) -> None:
    """Remove temporary files of ours for this target whose writer is no longer running."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            m = _TEMP.fullmatch(entry.name)
            if not m or m.group("stem") != stem:
                continue
            pid = int(m.group("pid"))
            if pid == os.getpid() or _alive(pid):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process: leave its file alone
    return True


def _mode_for(target: Path) -> int:
    """The permission bits ``open(target, "w")`` would leave: the existing file's, else 0666 minus the umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(path: str, write: Callable[[BinaryIO], None], *, rehearse: bool = False) -> None:
    """Create ``path`` (in a folder that exists) with the bytes ``write`` puts into the file it is given."""
    check_output_path(path)
    target = Path(path)
    folder = target.parent
    try:
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not folder.is_dir():
            blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
            if blocker is None:
                raise UsageError(f"cannot write '{quote(path)}': the folder '{quote(str(folder))}' does not exist "
                                 "(irc does not create folders; make it first)")
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        stem = _temp_stem(target.name)
        _remove_stale_temps(folder, stem)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}.{os.getpid()}-", suffix=TEMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            if not rehearse:
                os.chmod(tmp, _mode_for(target))
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except OSError as e:
        raise UsageError(f"cannot write '{quote(path)}': {why_unwritable(target, e)}") from None


def why_unwritable(target: Path, e: OSError) -> str:
    """Plain words for a failed write: name the path component that is in the way."""
    blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"'{quote(str(blocker))}' is not a folder"
    if target.is_dir():
        return "it is a folder"
    return os_error_words(e)
