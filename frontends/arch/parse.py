"""Parse ``.arch`` text with the Lark grammar; turn Lark's exceptions into diagnostics."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lark import Lark, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from irc.diagnostics import IrcError, Loc, register_source

_GRAMMAR = Path(__file__).with_name("arch.lark")

# Lark terminal names -> what a user would call them
_TERMINALS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "DTYPE": "a dtype (f32, i32, ...)",
    "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "EQUAL": "'='", "COLON": "':'", "SEMICOLON": "';'", "PLUS": "'+'", "MINUS": "'-'",
    "STAR": "'*'", "SLASH": "'/'", "PERCENT": "'%'", "AT": "'@'", "__ANON_0": "'//'", "__ANON_1": "'**'",
    "$END": "end of file",
}


@lru_cache(maxsize=1)
def parser() -> Lark:
    return Lark(_GRAMMAR.read_text(), parser="lalr", lexer="basic", propagate_positions=True, maybe_placeholders=True)


def _describe_expected(expected: set[str]) -> str:
    names = sorted({_TERMINALS.get(t, _keyword(t)) for t in expected})
    if len(names) > 8:
        names = names[:8] + ["..."]
    return ", ".join(names)


def _keyword(term: str) -> str:
    p = parser()
    for t in p.terminals:
        if t.name == term and t.pattern.type == "str":
            return f"'{t.pattern.value}'"
    return term.lower()


def parse_text(text: str, file: str) -> Tree:
    register_source(file, text)
    try:
        return parser().parse(text)
    except UnexpectedToken as e:
        tok = e.token
        got = "end of file" if tok.type == "$END" else f"'{tok}'"
        line = tok.line if tok.line is not None else e.line
        col = tok.column if tok.column is not None else e.column
        raise IrcError(f"unexpected {got}; expected {_describe_expected(e.expected)}",
                       Loc(file, line, col)) from None
    except UnexpectedCharacters as e:
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else "end of file"
        raise IrcError(f"unexpected character {ch!r}", Loc(file, e.line, e.column)) from None
    except UnexpectedEOF as e:
        lines = text.splitlines() or [""]
        raise IrcError(f"unexpected end of file; expected {_describe_expected(set(e.expected))}",
                       Loc(file, len(lines), len(lines[-1]) + 1)) from None
    except UnexpectedInput as e:  # pragma: no cover - other Lark errors
        raise IrcError(str(e).splitlines()[0], Loc(file, e.line, e.column)) from None
