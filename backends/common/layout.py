"""Keep generated driver lines readable: a long call is split one argument per line."""

from __future__ import annotations

WIDTH = 112


def _top_level(text: str) -> list[tuple[int, str]]:
    """(index, char) of the characters outside string literals, with their nesting depth skipped."""
    out: list[tuple[int, str]] = []
    quote: str | None = None
    escaped = False
    for i, ch in enumerate(text):
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
            continue
        out.append((i, ch))
    return out


def wrap_call(line: str, width: int = WIDTH) -> list[str]:
    """``f(a, b, c)`` longer than ``width`` becomes ``f(`` / one argument a line / ``)``."""
    if len(line) <= width or not line.endswith(")"):
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    chars = _top_level(line)
    depth = 0
    open_at = -1
    for i, ch in reversed(chars):  # the parenthesis that the final ')' closes
        if ch in ")]":
            depth += 1
        elif ch in "([":
            depth -= 1
            if depth == 0:
                open_at = i
                break
    if open_at <= 0:
        return [line]
    args: list[str] = []
    depth, start = 0, open_at + 1
    for i, ch in chars:
        if i <= open_at or i >= len(line) - 1:
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(line[start:i].strip())
            start = i + 1
    args.append(line[start:len(line) - 1].strip())
    return [line[: open_at + 1]] + [f"{indent}    {a}," for a in args if a] + [f"{indent})"]
