"""User-facing errors with source locations, printed the way clang and rustc do."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def raise_site(depth: int = 2) -> str:
    """``path:line`` of the code that raised, so tests can check every error path is covered."""
    frame = sys._getframe(depth)
    try:
        path = Path(frame.f_code.co_filename).resolve().relative_to(_ROOT)
    except ValueError:
        path = Path(frame.f_code.co_filename)
    return f"{path.as_posix()}:{frame.f_lineno}"


@dataclass(frozen=True)
class Loc:
    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class IrcError(Exception):
    """An error in the user's input: reported as ``file:line:col: error: message``."""

    def __init__(self, message: str, loc: Loc | None = None, notes: list[str] | None = None,
                 origin: str | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.notes = notes or []
        self.origin = origin or raise_site()


class UsageError(Exception):
    """Bad command-line usage (exit code 2)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.origin = raise_site()


# file name -> source text, so diagnostics can quote the offending line
SOURCES: dict[str, str] = {}


def register_source(file: str, text: str) -> None:
    SOURCES[file] = text


def render(err: IrcError, severity: str = "error") -> str:
    """Render ``err`` as the location, message, source line and a caret."""
    if err.loc is None:
        lines = [f"irc: {severity}: {err.message}"]
    else:
        lines = [f"{err.loc}: {severity}: {err.message}"]
        text = SOURCES.get(err.loc.file)
        if text is not None:
            src_lines = text.splitlines()
            if 1 <= err.loc.line <= len(src_lines):
                src = src_lines[err.loc.line - 1].expandtabs(1)
                lines.append(f"  {err.loc.line:>4} | {src}")
                lines.append(f"       | {' ' * max(err.loc.col - 1, 0)}^")
    lines.extend(f"note: {n}" for n in err.notes)
    return "\n".join(lines)
