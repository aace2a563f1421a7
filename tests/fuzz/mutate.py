"""Mutations of real .arch files: token edits, hostile values, unicode, deep nesting, -D flags.

Every mutation works on the file's tokens (a lexer that accepts any text), so an edit
lands on a whole number or name rather than in the middle of one; the strategy draws a
seed file, then one to three edits, each with the position it applies at.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import strategies as st

from fuzz import vocab
from fuzz.case import Case
from fuzz.corpus import ROOT, Seed, arch_seeds

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\f\r\n]+)|(?P<comment>\#[^\n]*)|(?P<string>"[^"\\\n]*")
    |(?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|\*\*|[-+*/%@()\[\]{},=:;])|(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)

Tok = tuple[str, str]  # (kind, text)


def tokenize(text: str) -> list[Tok]:
    return [(m.lastgroup or "other", m.group()) for m in _TOKEN.finditer(text)]


def _significant(toks: list[Tok], kind: str | None = None) -> list[int]:
    return [i for i, (k, _) in enumerate(toks) if k not in ("ws", "comment") and (kind is None or k == kind)]


def _join(toks: list[Tok]) -> str:
    return "".join(t for _, t in toks)


# -- the edits: each takes the tokens and hypothesis's draw, and returns new tokens ------------


def _pick(draw, idx: list[int]) -> int | None:
    return idx[draw(st.integers(0, len(idx) - 1))] if idx else None


def delete_token(toks, draw):
    i = _pick(draw, _significant(toks))
    return toks if i is None else toks[:i] + toks[i + 1:]


def duplicate_token(toks, draw):
    i = _pick(draw, _significant(toks))
    return toks if i is None else toks[:i + 1] + [("ws", " "), toks[i]] + toks[i + 1:]


def _swap_two(toks, draw, idx):
    """Two of the tokens at ``idx`` trade places."""
    i, j = _pick(draw, idx), _pick(draw, idx)
    if i is None or j is None:
        return toks
    out = list(toks)
    out[i], out[j] = out[j], out[i]
    return out


def swap_tokens(toks, draw):
    return _swap_two(toks, draw, _significant(toks))


def swap_numbers(toks, draw):
    return _swap_two(toks, draw, _significant(toks, "number"))


def _replace(toks, i, text):
    return toks[:i] + [("other", text)] + toks[i + 1:]


def hostile_number(toks, draw):
    i = _pick(draw, _significant(toks, "number") or _significant(toks))
    return toks if i is None else _replace(toks, i, draw(st.sampled_from(vocab.NUMBERS)))


def wrong_type(toks, draw):
    i = _pick(draw, _significant(toks, "number") + _significant(toks, "name"))
    return toks if i is None else _replace(toks, i, draw(st.sampled_from(vocab.WRONG_TYPES)))


def other_name(toks, draw):
    idx = _significant(toks, "name")
    i = _pick(draw, idx)
    if i is None:
        return toks
    own = sorted({toks[j][1] for j in idx})
    return _replace(toks, i, draw(st.sampled_from(own + list(vocab.names()))))


def insert_at(toks, draw, pool):
    i = draw(st.integers(0, len(toks)))
    return toks[:i] + [("other", draw(st.sampled_from(pool)))] + toks[i:]


def unicode(toks, draw):
    return insert_at(toks, draw, vocab.UNICODE)


def snippet(toks, draw):
    return insert_at(toks, draw, vocab.SNIPPETS)


def truncate(toks, draw):
    text = _join(toks)
    return tokenize(text[: draw(st.integers(0, max(len(text) - 1, 0)))])


def line_endings(toks, draw):
    ending = draw(st.sampled_from(["\r\n", "\r", "\n\n", "\u2028", "\x0c\n"]))
    return tokenize(_join(toks).replace("\n", ending))


DEPTHS = (8, 50, 200, 400, 1000, 3000, 10000)
NESTINGS = {
    "parens": lambda t, n: "(" * n + t + ")" * n,
    "calls": lambda t, n: "relu(" * n + t + ")" * n,
    "negation": lambda t, n: "-" * n + t,
    "sum": lambda t, n: t + f" + {t}" * n,
    "power": lambda t, n: t + " ** 1" * n,
    "lists": lambda t, n: "[" * n + t + "]" * n,
    "args": lambda t, n: "max(" * n + t + ", 1)" * n,
}


def deep_nesting(toks, draw):
    """Wrap one name or number in thousands of parentheses, calls, minus signs, operators or lists."""
    i = _pick(draw, _significant(toks, "name") + _significant(toks, "number"))
    if i is None:
        return toks
    how = draw(st.sampled_from(sorted(NESTINGS)))
    return _replace(toks, i, NESTINGS[how](toks[i][1], draw(st.sampled_from(DEPTHS))))


EDITS = (delete_token, hostile_number, wrong_type, swap_numbers, duplicate_token, swap_tokens, other_name,
         truncate, snippet, unicode, deep_nesting, line_endings)

# -- -D flags --------------------------------------------------------------------------------

DEFINE_VALUES = ("1", "7", "64", "0", "-1", "2**10", "1e3", "1_000", "abc", "", " 5", "4611686018427387903",
                 "4611686018427387904", "99999999999999999999999")


def _header_names(text: str) -> list[str]:
    names = []
    for m in re.finditer(r"(?:model\s+\w+|graph\s+@\w+)\s*\(([^)]*)\)", text):
        names += [n.strip() for n in m.group(1).split(",") if n.strip()]
    names += re.findall(r"const\s+(\w+)", text)
    return sorted(set(names))


@st.composite
def defines(draw, text: str) -> tuple[str, ...]:
    names = _header_names(text) + ["nosuch", "B", "T", ""]
    flags = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(DEFINE_VALUES)), max_size=3))
    out = [f"{n}={v}" for n, v in flags]
    if draw(st.booleans()) and out:
        out.append(out[0].split("=")[0])  # a flag without '='
    return tuple(out)


# -- the strategy ----------------------------------------------------------------------------


def companions(seed: Seed) -> tuple[tuple[str, str], ...]:
    """Files the seed pulls in with a relative ``use``, so the mutant compiles in a fresh folder."""
    out: dict[str, str] = {}
    todo = [(Path(seed.name).parent, seed.text)]
    while todo:
        folder, text = todo.pop()
        for rel in re.findall(r'use\s+"([^"\n]*)"', text):
            path = ROOT / folder / rel
            if rel not in out and _is_file(path) and path.suffix == ".arch":
                out[rel] = path.read_text(encoding="utf-8", errors="surrogateescape")
                todo.append((folder, out[rel]))
    return tuple(sorted(out.items()))


def _is_file(path: Path) -> bool:
    """Path.is_file, except that a name the OS refuses (a golden input's 300-character use) is no file."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


@st.composite
def mutated_models(draw) -> Case:
    seed: Seed = draw(st.sampled_from(arch_seeds()))
    toks = tokenize(seed.text)
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(EDITS))
        kinds.append(edit.__name__)
        toks = edit(toks, draw)
    text = _join(toks)
    flags = seed.defines + (draw(defines(text)) if draw(st.integers(0, 5)) == 0 else ())
    files = (("main.arch", text), *((n, t) for n, t in companions(seed) if n != "main.arch"))
    return Case(files, "main.arch", flags, seed.model, "arch", False, "mutate", notes=(seed.name, *kinds))


# -- valid models, nudged: odd but plausible sizes that still compile, for analyze, lint and run --

SMALL_NUMBERS = ("1", "2", "3", "4", "5", "7", "8", "9", "15", "16", "17", "31", "33", "63", "64", "65", "100")


def small_number(toks, draw):
    i = _pick(draw, _significant(toks, "number"))
    return toks if i is None else _replace(toks, i, draw(st.sampled_from(SMALL_NUMBERS)))


def nearby_name(toks, draw):
    """Another name of the same program: an op, a value, an activation or a keyword argument."""
    idx = _significant(toks, "name")
    i = _pick(draw, idx)
    if i is None:
        return toks
    return _replace(toks, i, draw(st.sampled_from(sorted({toks[j][1] for j in idx}))))


NUDGES = (small_number, small_number, small_number, nearby_name, swap_numbers, delete_token, duplicate_token)


@st.composite
def nudged_valid_models(draw) -> Case:
    """A generated valid model with one to three small edits: it often still compiles, to a graph the
    generator would not write (sizes that do not divide, ops on the wrong operand), and so reaches
    the commands after compile with shapes no other strategy gives them."""
    from fuzz.valid_models import valid_models

    base: Case = draw(valid_models())
    toks = tokenize(base.main_text)
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(NUDGES))
        kinds.append(edit.__name__)
        toks = edit(toks, draw)
    return Case((("main.arch", _join(toks)),), "main.arch", base.defines, None, "arch", False, "nudge",
                notes=tuple(kinds))
