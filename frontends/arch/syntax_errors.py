"""Turn the LALR parser's "unexpected token" into a message that says what is missing.

Lark knows which terminals the parser state accepts; on its own that gives lists such as
"expected '%', '(', ')', '*', '**', '+', ',', '-', ...". This module re-lexes the text up
to the error to find the brackets still open (with where each was opened and what it
opened: a model, a call, a list...), then says the one thing that is most likely missing:
"expected ')' to close the call opened at 2:14", "expected an expression".
"""

from __future__ import annotations

from dataclasses import dataclass

from lark import Lark, Token

from irc.diagnostics import Loc, suggest
from irc.types import INPUT_DTYPES

CLOSER_OF = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}
OPENER_OF = {v: k for k, v in CLOSER_OF.items()}
TEXT = {"LPAR": "(", "RPAR": ")", "LSQB": "[", "RSQB": "]", "LBRACE": "{", "RBRACE": "}"}

# Lark terminal names -> what a user would call them
TERMINALS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string",
    "DTYPE": f"a dtype ({', '.join(INPUT_DTYPES)})",
    "COMMA": "','", "EQUAL": "'='", "COLON": "':'", "SEMICOLON": "';'", "PLUS": "'+'", "MINUS": "'-'",
    "STAR": "'*'", "SLASH": "'/'", "PERCENT": "'%'", "AT": "'@'", "__ANON_0": "'//'", "__ANON_1": "'**'",
    "$END": "end of file", **{k: f"'{v}'" for k, v in TEXT.items()},
}
EXPRESSION_START = {"NAME", "NUMBER", "STRING", "LPAR", "LSQB", "MINUS", "TRUE", "FALSE", "NONE", "REPEAT"}
OPERATORS = {"PLUS", "MINUS", "STAR", "SLASH", "__ANON_0", "PERCENT", "AT", "__ANON_1"}
STATEMENT_START = {"CONST", "INPUT", "OUTPUT", "RETURN", "BLOCK", "NAME"}
KEYWORDS = {"USE", "MODEL", "BLOCK", "CONST", "INPUT", "OUTPUT", "RETURN", "TRUE", "FALSE", "NONE", "REPEAT"}

# characters people paste from documents, and what the language spells them as
LOOKALIKES = {"×": "*", "÷": "/", "−": "-", "–": "-", "“": '"', "”": '"', "‘": '"', "’": '"', "·": "*"}


@dataclass(frozen=True)
class Open:
    """A bracket not yet closed: its terminal, where it is, and what it opened."""

    kind: str
    line: int
    col: int
    what: str


def _opened(tokens: list[Token], i: int, matching: dict[int, int]) -> str:
    """What the bracket ``tokens[i]`` opens, in words."""
    tok = tokens[i]
    before = [t.type for t in tokens[max(0, i - 2):i]]
    if tok.type == "LSQB":
        return "the shape" if before[-1:] == ["DTYPE"] else "the list"
    if tok.type == "LPAR":
        if before[-2:-1] in (["MODEL"], ["BLOCK"]):
            return "the parameter list"
        if before[-1:] == ["REPEAT"]:
            return "the repeat count"
        return "the call" if before[-1:] in (["NAME"], ["RPAR"]) else "the parenthesis"
    # '{': the body of the model or block whose header ends with the ')' before it
    if before[-1:] == ["RPAR"] and i - 1 in matching:
        j = matching[i - 1]
        if j >= 2 and tokens[j - 2].type in ("MODEL", "BLOCK"):
            return f"the {tokens[j - 2].type.lower()}"
    return "the body"


def open_brackets(parser: Lark, text: str, upto: int) -> tuple[list[Open], Token | None]:
    """The brackets open before position ``upto``, innermost last, and the token before it."""
    tokens: list[Token] = []
    try:
        for tok in parser.lex(text):
            if tok.start_pos is not None and tok.start_pos >= upto:
                break
            tokens.append(tok)
    except Exception:  # noqa: BLE001 - a lexing error after the parse error: the tokens so far do
        pass
    stack: list[int] = []
    matching: dict[int, int] = {}  # closer index -> opener index
    for i, tok in enumerate(tokens):
        if tok.type in CLOSER_OF:
            stack.append(i)
        elif tok.type in OPENER_OF and stack and tokens[stack[-1]].type == OPENER_OF[tok.type]:
            matching[i] = stack.pop()
    opens = [Open(tokens[i].type, tokens[i].line or 1, tokens[i].column or 1, _opened(tokens, i, matching))
             for i in stack]
    return opens, (tokens[-1] if tokens else None)


def describe_expected(expected: set[str], parser: Lark, inner: Open | None = None, new_line: bool = False) -> str:
    """A short list of what could come next, grouped: "an expression", "an operator", "a statement".

    After a complete expression the LALR tables accept an operator or anything that may end
    it (closers, commas, the next statement, ...); only the part that fits the innermost open
    bracket is worth saying, and on a new line the next statement is what was meant.
    """
    names: list[str] = []
    left = set(expected) - {"SEMICOLON"}  # ';' separates statements but is never required
    if len(left & OPERATORS) >= 4:
        if new_line and STATEMENT_START <= left:
            left = STATEMENT_START | ({"RBRACE"} if inner is not None and inner.kind == "LBRACE" else set())
        else:
            fits = {CLOSER_OF[inner.kind]} if inner is not None else set()
            if inner is not None and inner.kind in ("LPAR", "LSQB"):
                fits.add("COMMA")
            left = (left & OPERATORS) | (left & fits)
    if {"NAME", "NUMBER", "LPAR"} <= left:
        names.append("an expression")
        left -= EXPRESSION_START
    if len(left & OPERATORS) >= 4:
        names.append("an operator")
        left -= OPERATORS
    if STATEMENT_START <= left:
        names.append("a statement")
        left -= STATEMENT_START
    names += sorted(_terminal(t, parser) for t in left if t != "$END")
    if "$END" in left:
        names.append("end of file")
    if not names:
        return "something else"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _terminal(term: str, parser: Lark) -> str:
    if term in TERMINALS:
        return TERMINALS[term]
    for t in parser.terminals:
        if t.name == term and t.pattern.type == "str":
            return f"'{t.pattern.value}'"
    return term.lower()


def unexpected_token(parser: Lark, text: str, file: str, tok: Token, expected: set[str]) -> tuple[str, Loc]:
    """The message and location for the parser stopping at ``tok`` (``$END`` at the end of the file)."""
    at_end = tok.type == "$END"
    pos = len(text) if at_end or tok.start_pos is None else tok.start_pos
    opens, previous = open_brackets(parser, text, pos)
    here = Loc(file, tok.line or 1, tok.column or 1, tok.end_line, tok.end_column)  # the token, underlined
    after_previous = here
    if previous is not None:
        after_previous = Loc(file, previous.end_line or 1, (previous.end_column or 1))
    if at_end:
        here = after_previous
    got = "end of file" if at_end else f"'{tok}'"
    inner = opens[-1] if opens else None

    if tok.type in OPENER_OF:  # a closing bracket
        want = OPENER_OF[tok.type]
        if not any(o.kind == want for o in opens):
            return f"unexpected '{tok}': there is no '{TEXT[want]}' to close", here
        if inner is not None and inner.kind != want:
            return f"unexpected '{tok}'; {_close(inner)}", here
    if inner is not None and CLOSER_OF[inner.kind] in expected:
        if at_end:
            return f"unexpected end of file; {_close(inner)}", here
        if tok.type in ("MODEL", "USE"):  # only at the top level: the body before it is not closed
            return f"unexpected '{tok}'; {_close(inner)}", here
        if inner.kind != "LBRACE" and previous is not None and (tok.line or 0) > (previous.end_line or 0):
            # the bracket belongs at the end of the previous line, not before the next statement
            more = ", or ',' to continue it" if "COMMA" in expected else ""
            return _close(inner) + more, after_previous
    new_line = previous is not None and (tok.line or 0) > (previous.end_line or 0)
    message = f"unexpected {got}; expected {describe_expected(expected, parser, inner, new_line)}"
    if tok.type == "NAME":
        if "DTYPE" in expected:
            close = suggest(str(tok), INPUT_DTYPES)
        else:
            close = suggest(str(tok), [t.lower() for t in expected & KEYWORDS])
        if close:
            message = f"unexpected '{tok}'; did you mean '{close}'?"
    return message, here


def _close(o: Open) -> str:
    return f"expected '{TEXT[CLOSER_OF[o.kind]]}' to close {o.what} opened at {o.line}:{o.col}"


def unexpected_character(text: str, file: str, pos: int, line: int, col: int) -> tuple[str, Loc]:
    """The message for a character no token starts with."""
    loc = Loc(file, line, col)
    if pos >= len(text):
        return "unexpected end of file", loc
    ch = text[pos]
    if ch == '"':
        rest = text[pos + 1:].split("\n", 1)[0]
        if '"' not in rest:  # underlined from the quote to the end of its line
            return ("unterminated string: the closing '\"' is missing on this line",
                    Loc(file, line, col, line, col + 1 + len(rest.rstrip())))
        return "a string cannot contain '\\'", loc
    if ch in LOOKALIKES:
        return f"unexpected character {ch!r}; did you mean '{LOOKALIKES[ch]}'?", loc
    return f"unexpected character {ch!r}", loc
