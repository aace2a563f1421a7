"""Source locations of parse-tree items, for the builder's diagnostics."""

from __future__ import annotations

from lark import Token, Tree

from irc.diagnostics import Loc


def tree_loc(file: str, item: Tree | Token) -> Loc:
    if isinstance(item, Token):
        return Loc(file, item.line or 1, item.column or 1)
    meta = item.meta
    return Loc(file, getattr(meta, "line", 1) or 1, getattr(meta, "column", 1) or 1)


def text_position(text: str, pos: int) -> tuple[int, int]:
    """(line, column), both from 1, of the character at ``pos``."""
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1
