"""Mutations of IR text (golden dumps and printed models) for the IR parser and the .ir pipeline.

The judge parses the mutant with irc.ir_parser.parse_ir (a graph or an IrcError at a line
and column of the IR text) and then loads it as ``irc compile`` does an .ir file (verify,
shape inference), where the same property holds.
"""

from __future__ import annotations

import re

from hypothesis import strategies as st

from fuzz import vocab
from fuzz.case import Case
from fuzz.corpus import ir_seeds
from fuzz.mutate import defines

_TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<value>%[A-Za-z_][A-Za-z0-9_.]*)|(?P<type>[a-z][a-z0-9]*\[[^\]\n]*\])
    |(?P<string>"(?:[^"\\\n]|\\.)*")|(?P<number>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
    |(?P<name>@?[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>.)""",
    re.VERBOSE,
)

IR_NUMBERS = ("0", "-1", "1", "2", "1.5", "1e400", "-1e400", "nan", "inf", "-inf", "1e5", "99999999999999999999999",
              "9223372036854775808", "-9223372036854775809", "1" + "0" * 5000, "0.0", "-0", "00", "1.", ".5", "1e")
IR_TYPES = ("f32[]", "f32[0]", "f32[-1]", "f32[B,,4]", "f32[B+]", "f32[(B]", "f32[B)]", "f32[B//0]", "f32[max(B)]",
            "f32[max(B,T)]", "f32[B*B*B*B*B*B*B*B]", "f32[99999999999999999999999]", "f99[B]", "bool[B]", "i8[4]",
            "f32[" + "(" * 2000 + "B" + ")" * 2000 + "]", "f32[" + "-" * 2000 + "B]", "f32[B" + "+B" * 3000 + "]",
            "f32[é]", "f32[B T]", "f32[1e3]", "f32[B, 4]", "i32[B,T]", "f32[4611686018427387904,4]")
IR_SNIPPETS = ("{", "}", "(", ")", ",", "=", ":", "[", "]", "%", "@", '"', "\\", "sym(", 'sym("B")', 'sym("(((")',
               'scope("', 'loc("x":0:0)', 'loc("x":-5:1)', 'loc("x":1.5:2)', 'loc("x":99999999999999999999:1)',
               "weights(none)", 'weights("")', "output", "graph @g() {", "bind(B=0)", "bind(B=1e3)", "bind(B=-1)",
               "// comment")


def tokenize(text: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "punct", m.group()) for m in _TOKEN.finditer(text)]


def _pick(draw, toks, kinds: tuple[str, ...] | None = None) -> int | None:
    idx = [i for i, (k, _) in enumerate(toks) if k != "ws" and (kinds is None or k in kinds)]
    return idx[draw(st.integers(0, len(idx) - 1))] if idx else None


def _set(toks, i, text):
    return toks[:i] + [("punct", text)] + toks[i + 1:]


def delete_token(toks, draw):
    i = _pick(draw, toks)
    return toks if i is None else toks[:i] + toks[i + 1:]


def replace_number(toks, draw):
    i = _pick(draw, toks, ("number",))
    return toks if i is None else _set(toks, i, draw(st.sampled_from(IR_NUMBERS)))


def replace_type(toks, draw):
    i = _pick(draw, toks, ("type",))
    return toks if i is None else _set(toks, i, draw(st.sampled_from(IR_TYPES)))


def replace_value(toks, draw):
    """Use a value before it is defined, define one twice, or name one that never exists."""
    i = _pick(draw, toks, ("value",))
    if i is None:
        return toks
    values = sorted({t for k, t in toks if k == "value"}) + ["%nosuch", "%", "%1x"]
    return _set(toks, i, draw(st.sampled_from(values)))


def replace_name(toks, draw):
    i = _pick(draw, toks, ("name",))
    pool = list(vocab.op_names()) + ["graph", "output", "scope", "weights", "loc", "sym", "bind", "true", "false",
                                     "none", "é"]
    return toks if i is None else _set(toks, i, draw(st.sampled_from(pool)))


def swap_tokens(toks, draw):
    i, j = _pick(draw, toks), _pick(draw, toks)
    if i is None or j is None:
        return toks
    out = list(toks)
    out[i], out[j] = out[j], out[i]
    return out


def insert(toks, draw):
    i = draw(st.integers(0, len(toks)))
    text = draw(st.sampled_from(IR_SNIPPETS + vocab.UNICODE))
    return toks[:i] + [("punct", text)] + toks[i:]


def _lines(toks, draw, how):
    lines = "".join(t for _, t in toks).split("\n")
    if len(lines) < 2:
        return toks
    i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
    if how == "drop":
        del lines[i]
    elif how == "dup":
        lines.insert(i, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return tokenize("\n".join(lines))


def drop_line(toks, draw):
    return _lines(toks, draw, "drop")


def duplicate_line(toks, draw):
    return _lines(toks, draw, "dup")


def swap_lines(toks, draw):
    return _lines(toks, draw, "swap")


IR_STRINGS = ('"a\\"b"', '"a b"', '""', '"a\\\\b"', '"é"', '"a.b"', '"0"', '"%x"', '"a\\nb"', '"}"')


def hostile_string(toks, draw):
    """A quoted name (scope, weights, loc file, a ref attribute) with quotes, spaces, dots or nothing."""
    i = _pick(draw, toks, ("string",))
    return toks if i is None else _set(toks, i, draw(st.sampled_from(IR_STRINGS)))


_TRAILER = re.compile(r'\s(?:scope|weights|loc)\((?:"(?:[^"\\\n]|\\.)*"(?::-?\d+:-?\d+)?|none)\)')


def strip_trailers(toks, draw):
    """Drop every scope/weights/loc trailer, as a hand-written .ir file would."""
    return tokenize(_TRAILER.sub("", "".join(t for _, t in toks)))


def drop_types(toks, draw):
    """Drop the ': type' of one line: the parser allows it, so everything after must cope."""
    lines = "".join(t for _, t in toks).split("\n")
    typed = [i for i, line in enumerate(lines) if " : " in line]
    if not typed:
        return toks
    i = typed[draw(st.integers(0, len(typed) - 1))]
    head, _, tail = lines[i].partition(" : ")
    rest = tail.split(" ", 1)
    lines[i] = head + (" " + rest[1] if len(rest) > 1 else "")
    return tokenize("\n".join(lines))


def truncate(toks, draw):
    text = "".join(t for _, t in toks)
    return tokenize(text[: draw(st.integers(0, max(len(text) - 1, 0)))])


EDITS = (delete_token, replace_number, replace_type, replace_value, replace_name, swap_tokens, insert, drop_line,
         duplicate_line, swap_lines, truncate, hostile_string, strip_trailers, drop_types)


@st.composite
def mutated_ir(draw) -> Case:
    seed = draw(st.sampled_from(ir_seeds()))
    toks = tokenize(seed.text)
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(EDITS))
        kinds.append(edit.__name__)
        toks = edit(toks, draw)
    text = "".join(t for _, t in toks)
    flags = draw(defines(text)) if draw(st.integers(0, 5)) == 0 else ()
    return Case((("main.ir", text),), "main.ir", flags, None, "ir", False, "ir-mutate", notes=(seed.name, *kinds))
