"""Random programs drawn from arch.lark itself: syntactically valid, semantically anything.

A small walker over the grammar's compiled rules (hypothesis.extra.lark's walker leaves
whitespace out between most tokens, so keywords and names run together, and it is slow
on this grammar's deep expression rules): below a depth limit it picks any expansion,
past it only the expansions that end soonest. Terminals come from pools that reach real
ops, blocks and hostile values instead of random identifiers that would all stop at
'undefined name'.
"""

from __future__ import annotations

from functools import cache, lru_cache

from hypothesis import strategies as st

from fuzz import vocab
from fuzz.case import Case

MAX_DEPTH = 7
_LOCAL_NAMES = ("x", "y", "h", "B", "T", "d", "f", "g", "emb", "act", "heads")


@lru_cache(maxsize=1)
def _terminals() -> dict[str, st.SearchStrategy[str]]:
    from irc.frontends.arch.parse import parser

    terminals, _, _ = parser().grammar.compile(["start"], ())
    out: dict[str, st.SearchStrategy[str]] = {}
    for t in terminals:  # keywords and punctuation as they are; a regex terminal added later, from its regex
        if t.pattern.type == "str":
            out[t.name] = st.just(t.pattern.value + " ")
        else:
            out[t.name] = st.from_regex(t.pattern.to_regexp(), fullmatch=True).map(lambda s: s + " ")
    names = st.sampled_from(_LOCAL_NAMES) | st.sampled_from(vocab.op_names())
    out["NAME"] = names.map(lambda s: s + " ")
    out["NUMBER"] = st.sampled_from(["1", "2", "4", "8", "64", "0", "0.5", "1e-5", "3", "1000"]).map(
        lambda s: s + " ") | st.sampled_from([n for n in vocab.NUMBERS if n.isdigit()]).map(lambda s: s + " ")
    out["STRING"] = st.sampled_from(['"transformer.arch" ', '"main.arch" ', '"" ', '"x" ', '"nosuch.arch" '])
    out["DTYPE"] = st.sampled_from(["f32", "f16", "bf16", "f64", "i32", "i64"])  # no space: '[' must follow
    out["COMMENT"] = st.just("# comment\n")
    out["__IGNORE_1"] = st.just("\n")
    return out


@lru_cache(maxsize=1)
def _rules() -> tuple[dict[str, list[tuple[tuple[str, bool], ...]]], dict[str, int]]:
    """Nonterminal -> expansions (symbol name, is-terminal), and each nonterminal's least height."""
    from irc.frontends.arch.parse import parser

    _, rules, _ = parser().grammar.compile(["start"], ())
    table: dict[str, list[tuple[tuple[str, bool], ...]]] = {}
    for r in rules:
        table.setdefault(r.origin.name, []).append(tuple((sym.name, sym.is_term) for sym in r.expansion))
    height: dict[str, int] = {}
    changed = True
    while changed:  # least fixpoint: a rule's height is 1 + its tallest child, minimised over expansions
        changed = False
        for name, expansions in table.items():
            for exp in expansions:
                kids = [0 if term else height.get(sym, -1) for sym, term in exp]
                if -1 in kids:
                    continue
                h = 1 + max(kids, default=0)
                if h < height.get(name, 1 << 30):
                    height[name], changed = h, True
    for name in table:
        table[name].sort(key=lambda exp: (max((0 if t else height[s] for s, t in exp), default=0), len(exp)))
    return table, height


def _expand(draw, name: str, depth: int, out: list[str]) -> None:
    table, height = _rules()
    expansions = table[name]
    if depth >= MAX_DEPTH:
        least = max((0 if t else height[s] for s, t in expansions[0]), default=0)
        expansions = [e for e in expansions if max((0 if t else height[s] for s, t in e), default=0) == least]
    exp = expansions[draw(st.integers(0, len(expansions) - 1))]
    for sym, term in exp:
        if term:
            out.append(draw(_terminals()[sym]))
        else:
            _expand(draw, sym, depth + 1, out)


@cache
def rule(start: str) -> st.SearchStrategy[str]:
    @st.composite
    def walk(draw) -> str:
        out: list[str] = []
        _expand(draw, start, 0, out)
        return "".join(out)

    return walk()


STATEMENTS = ("assign_stmt", "assign_stmt", "assign_stmt", "const_stmt", "output_stmt", "block_def", "input_stmt")


@st.composite
def grammar_programs(draw) -> Case:
    """Top-level items, then a model whose statements are drawn from the grammar's rules.

    The model starts with a well-formed input and ends with an output of it, so a program
    whose drawn statements all make sense compiles, and the ones in between reach deep.
    """
    items = draw(st.lists(st.one_of(rule("block_def"), rule("const_stmt"), rule("use_stmt")), max_size=2))
    stmts = draw(st.lists(st.sampled_from(STATEMENTS).flatmap(rule), min_size=1, max_size=8))
    body = "\n  ".join(["input x: f32[B, T, 64]", *stmts, "output result = x"])
    if draw(st.integers(0, 9)) == 0:  # and now and then a model header from the grammar too
        text = "\n".join([*items, draw(rule("model_def"))])
    else:
        text = "\n".join([*items, f"model m(B, T) {{\n  {body}\n}}"])
    return Case.single(text + "\n", "grammar")
