"""User-facing errors with source locations, printed the way clang and rustc do."""

from __future__ import annotations

import difflib
import errno
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
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
    """A place in a source file: ``line:col`` (both from 1) is where the caret goes.

    ``end_line:end_col`` is where the offending text ends (the column just past its last
    character, as Lark counts), so a diagnostic underlines all of it; ``start_line:start_col``
    is where it starts when that is before the caret (a binary expression: the caret is at its
    operator). Both are optional and take no part in equality: a location is its caret.
    """

    file: str
    line: int
    col: int
    end_line: int | None = field(default=None, compare=False)
    end_col: int | None = field(default=None, compare=False)
    start_line: int | None = field(default=None, compare=False)
    start_col: int | None = field(default=None, compare=False)

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


def render(err: IrcError, severity: str = "error", color: bool | None = None) -> str:
    """Render ``err`` as the location, message, source line and its underline (:func:`excerpt`).

    Everything quoted from the user's files is made safe for a terminal (:func:`terminal_safe`)
    and a long source line is cut to a window around the caret. ``color`` paints the labels the
    way clang does; ``None`` means: when stderr is a terminal and ``NO_COLOR`` is not set.
    """
    paint = use_color(sys.stderr) if color is None else color
    label = _paint(f"{severity}:", severity, paint)
    if err.loc is None:
        lines = [f"irc: {label} {_message(err.message)}"]
    else:
        lines = [f"{_paint(f'{quote(str(err.loc))}:', 'bold', paint)} {label} {_message(err.message)}"]
        lines.extend(excerpt(err.loc, paint))
    lines.extend(f"{_paint('note:', 'note', paint)} {_message(n)}" for n in err.notes)
    return "\n".join(lines)


# -- terminal safety: what irc quotes from a file never drives the terminal ------------------

SOURCE_LINE_LIMIT = 2000  # a source line up to this long is quoted whole
SOURCE_WINDOW = 200  # of a longer one (a file of NULs is one line), this many characters around the caret
QUOTE_LIMIT = 120  # characters of a quoted name (a file name, a weight key) before it is cut
# bidirectional overrides and isolates reorder what a terminal shows ("trojan source")
_BIDI = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069}


def _escape_char(c: str) -> str:
    o = ord(c)
    if o < 0x20 or o == 0x7F or 0x80 <= o < 0xA0 or o in _BIDI:
        return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"
    return c


def terminal_safe(text: str) -> str:
    """``text`` with control characters (escape sequences, NULs, bidi overrides) written as ``\\xNN``;
    newlines and tabs stay, so a message of several lines still reads as one."""
    if text.isprintable():
        return text
    return "".join(c if c in "\n\t" else _escape_char(c) for c in text)


MESSAGE_LIMIT = 2000  # characters of one message line: a name irc quotes may be a megabyte long


def _message(text: str) -> str:
    """A message made terminal-safe, each line cut in the middle past MESSAGE_LIMIT."""
    return "\n".join(quote(line, MESSAGE_LIMIT) if len(line) > MESSAGE_LIMIT else terminal_safe(line)
                     for line in text.split("\n"))


def quote(text: str, limit: int = QUOTE_LIMIT) -> str:
    """A name from the user's input, ready to put between quotes in a message: every control
    character escaped (a newline too), and cut in the middle when longer than ``limit``."""
    safe = "".join(_escape_char(c) for c in text)
    if len(safe) <= limit:
        return safe
    half = (limit - 1) // 2
    return f"{safe[:half]}…{safe[-half:]}"


def source_window(line: str, col: int) -> tuple[str, int]:
    """The part of a source line to print, escaped, and the caret's offset in it."""
    shown, underline = source_span(line, col, col, col)
    return shown, len(underline) - len(underline.lstrip(" "))


def source_span(line: str, col: int, first: int, stop: int) -> tuple[str, str]:
    """The part of a source line to print, escaped, and the text to print under it: ``^`` under
    column ``col`` and ``~`` under the rest of the columns ``first`` up to (not including) ``stop``.

    Each character is underlined across the width it is shown with (``\\x00`` takes four), and a
    span that runs out of the window is underlined to its edge.
    """
    if len(line) <= SOURCE_LINE_LIMIT:
        start, end = 0, len(line)
    else:
        start = max(col - 1 - SOURCE_WINDOW // 2, 0)
        end = min(start + SOURCE_WINDOW, len(line))
    shown: list[str] = ["…"] if start > 0 else []
    marks: list[str] = [" "] if start > 0 else []
    caret = min(max(col - 1, start), end)  # a caret past the line's end (it ends early) goes just after it
    for i in range(start, end):  # i is the 0-based index of column i + 1
        text = _escape_char(line[i])
        shown.append(text)
        if i == caret:
            marks.append("^" + "~" * (len(text) - 1))
        else:
            marks.append(("~" if first - 1 <= i < stop - 1 else " ") * len(text))
    if caret == end:
        marks.append("^")
    if end < len(line):
        shown.append("…")
    return "".join(shown), "".join(marks).rstrip()


def excerpt(loc: Loc, color: bool = False) -> list[str]:
    """The source line of ``loc`` and the underline of its span under it (``^~~~~``: the caret,
    then the rest of the span on that line), or nothing when the file's text is not known.

    A span that goes on past its first line is underlined to that line's end; one that starts on
    an earlier line (an operand before an operator) from the first character that is not a space.
    """
    text = SOURCES.get(loc.file)
    if text is None:
        return []
    # lines end at '\n' only, as the parsers count them (str.splitlines also splits at \f, \x85, ...)
    src_lines = [ln.removesuffix("\r") for ln in text.split("\n")]
    if not 1 <= loc.line <= len(src_lines):
        return []
    line = src_lines[loc.line - 1].expandtabs(1)  # a tab is one column, as the parsers count it
    first, stop = loc.col, loc.col + 1
    if loc.end_line is not None and loc.end_col is not None:
        if loc.end_line > loc.line:
            stop = len(line.rstrip()) + 1
        elif loc.end_line == loc.line:
            stop = max(loc.end_col, stop)
    if loc.start_line is not None and loc.start_col is not None:
        if loc.start_line < loc.line:
            first = min(len(line) - len(line.lstrip()) + 1, first)
        elif loc.start_line == loc.line:
            first = min(loc.start_col, first)
    shown, underline = source_span(line, loc.col, first, stop)
    return [f"  {loc.line:>4} | {shown}", f"       | {_paint_underline(underline, color)}"]


def _paint_underline(underline: str, color: bool) -> str:
    """The underline with its marks painted and the spaces before it left plain."""
    body = underline.lstrip(" ")
    return " " * (len(underline) - len(body)) + _paint(body, "caret", color)


# -- colour -------------------------------------------------------------------------------

_COLORS = {"error": "\033[1;31m", "warning": "\033[1;35m", "note": "\033[1;36m", "bold": "\033[1m",
           "caret": "\033[1;32m"}
_RESET = "\033[0m"


def use_color(stream: object) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set (https://no-color.org) or TERM is dumb."""
    import os

    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


def _paint(text: str, kind: str, on: bool) -> str:
    return f"{_COLORS[kind]}{text}{_RESET}" if on and kind in _COLORS else text


# -- wording helpers shared by every diagnostic ---------------------------------------------


def plural(n: int, word: str) -> str:
    """``1 argument``, ``2 arguments``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def where(loc: Loc, here: str | None = None) -> str:
    """``4:9`` for a place in the file ``here``, else ``file:4:9``."""
    return f"{loc.line}:{loc.col}" if loc.file == here else str(loc)


def format_number(v: int | Fraction | float) -> str:
    """A number as a user wrote it: ``1.5`` rather than ``3/2``, ``1/3`` when no decimal is exact."""
    if isinstance(v, Fraction):
        if v.denominator == 1:
            return str(v.numerator)
        den = v.denominator
        for p in (2, 5):
            while den % p == 0:
                den //= p
        if den == 1:  # a finite decimal
            digits = 0
            while (v * 10**digits).denominator != 1:
                digits += 1
            text = f"{abs(v.numerator) * 10**digits // v.denominator:0{digits + 1}d}"
            sign = "-" if v < 0 else ""
            return f"{sign}{text[:-digits]}.{text[-digits:]}"
        return f"{v.numerator}/{v.denominator}"
    return str(v)


def _one_edit_apart(a: str, b: str) -> bool:
    """One insertion, deletion, substitution or swap of neighbours turns ``a`` into ``b``."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i in range(len(short)) if short[i] != long[i]), len(short))
    return short[i:] == long[i + 1:]


def suggest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` is most likely a misspelling of, or None when none is close.

    Close means: the same but for letter case, one edit away (for names of two or more
    letters), ``name`` with a ``_suffix`` added, or a difflib ratio of at least 0.75.
    """
    pool = sorted({c for c in candidates if c and c != name})
    folded = [c for c in pool if c.lower() == name.lower()]
    if folded:
        return folded[0]
    if len(name) >= 2:
        near = [c for c in pool if _one_edit_apart(name, c)]
        if near:
            return max(near, key=lambda c: difflib.SequenceMatcher(None, name, c).ratio())
    stems = [c for c in pool if len(c) >= 3 and name.startswith(c + "_")]
    if stems:
        return max(stems, key=len)
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.75)
    return close[0] if close else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``; did you mean 'x'?`` or the empty string."""
    close = suggest(name, candidates)
    return f"; did you mean '{close}'?" if close else ""


# OS error numbers -> plain words
_OS_WORDS = {
    errno.ENOENT: "no such file or folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "it is a folder",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.ENOSPC: "no space left on the device",
    errno.EROFS: "the file system is read-only",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ELOOP: "too many symbolic links",
}


def os_error_words(e: OSError) -> str:
    """An OS error in plain words, without ``[Errno N]``."""
    if e.errno in _OS_WORDS:
        return _OS_WORDS[e.errno]
    return (e.strerror or str(e)).lower()


# -- reading the user's files ----------------------------------------------------------------


def decode_source(raw: bytes, file: str) -> str:
    """UTF-8 text (a leading byte-order mark is dropped); a bad byte is an error at its line and column."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
        good = raw[start:e.start].decode("utf-8")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        register_source(file, raw[start:].decode("utf-8", errors="replace"))
        raise IrcError(f"the file is not UTF-8 text (byte 0x{raw[e.start]:02x})", Loc(file, line, col)) from None


def read_source(path: Path, file: str, kind: str, used_at: Loc | None = None, hint: str = "") -> str:
    """The text of ``path`` (named ``file`` in diagnostics); ``kind`` names what it should be.

    Errors point at ``used_at`` (the ``use`` that named the file) when there is one; ``hint``
    (a did-you-mean) is added when the file does not exist.
    """
    if path.is_dir():
        raise IrcError(f"'{file}' is a folder, not {kind}", used_at)
    if path.exists() and not path.is_file():  # a device or a pipe could be read forever
        raise IrcError(f"'{file}' is not a regular file, so it cannot be {kind}", used_at)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IrcError(f"cannot find '{file}'{hint}", used_at) from None
    except OSError as e:  # permissions, I/O errors: not reproducible in a checked-in case
        raise IrcError(f"cannot read '{file}': {os_error_words(e)}", used_at) from None
    return decode_source(raw, file)
