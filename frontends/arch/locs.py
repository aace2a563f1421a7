"""Source locations of parse-tree items, for the builder's diagnostics."""

from __future__ import annotations

from lark import Token, Tree

from irc.diagnostics import SOURCES, Loc


def _start(item: Tree | Token) -> tuple[int, int]:
    if isinstance(item, Token):
        return item.line or 1, item.column or 1
    return getattr(item.meta, "line", 1) or 1, getattr(item.meta, "column", 1) or 1


def _end(item: Tree | Token) -> tuple[int | None, int | None]:
    """Where ``item`` ends: the column just past its last character (Lark's end_column)."""
    holder = item if isinstance(item, Token) else item.meta
    return getattr(holder, "end_line", None), getattr(holder, "end_column", None)


def tree_loc(file: str, item: Tree | Token, to: Tree | Token | None = None) -> Loc:
    """The place of ``item``, spanning it (or on to the end of ``to``: a call's name to its ')')."""
    line, col = _start(item)
    end_line, end_col = _end(item if to is None else to)
    return Loc(file, line, col, end_line, end_col)


def between(file: str, caret: tuple[int, int], caret_end: tuple[int, int], first: Tree | Token,
            last: Tree | Token) -> Loc:
    """A caret at ``caret`` (a binary operator, ending at ``caret_end``) in a span from the start
    of ``first`` to the end of ``last`` (its operands), taking in the parentheses around an operand:
    Lark's positions leave them out, and ``(a + b) * c`` should not be underlined from ``a``."""
    start_line, start_col = _start(first)
    end_line, end_col = _end(last)
    text = SOURCES.get(file)
    a = getattr(first if isinstance(first, Token) else first.meta, "start_pos", None)
    b = getattr(last if isinstance(last, Token) else last.meta, "end_pos", None)
    if text is not None and a is not None and b is not None:
        a, b = _take_in_parentheses(text, a, b)
        (start_line, start_col), (end_line, end_col) = text_position(text, a), text_position(text, b)
    if end_line is None or end_col is None:
        end_line, end_col = caret_end
    return Loc(file, caret[0], caret[1], end_line, end_col, start_line, start_col)


def _take_in_parentheses(text: str, a: int, b: int) -> tuple[int, int]:
    """``text[a:b]`` widened to the '(' and ')' its unmatched ')' and '(' pair with."""
    unopened = unclosed = 0
    i = a
    while i < b:
        c = text[i]
        if c == "#":  # a comment runs to the end of its line
            i = text.find("\n", i, b)
            i = b if i < 0 else i
            continue
        if c == '"':  # a string holds no brackets
            i = text.find('"', i + 1, b)
            i = b if i < 0 else i
        elif c == "(":
            unclosed += 1
        elif c == ")":
            if unclosed:
                unclosed -= 1
            else:
                unopened += 1
        i += 1
    while unopened:
        j = a - 1
        while j >= 0 and text[j] in " \t\r\n":
            j -= 1
        if j < 0 or text[j] != "(":
            break
        a, unopened = j, unopened - 1
    while unclosed:
        j = b
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
        if j >= len(text) or text[j] != ")":
            break
        b, unclosed = j + 1, unclosed - 1
    return a, b


def text_position(text: str, pos: int) -> tuple[int, int]:
    """(line, column), both from 1, of the character at ``pos``."""
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1
