"""Parse ``.arch`` text with the Lark grammar; turn Lark's exceptions into diagnostics."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lark import Lark, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from irc.diagnostics import IrcError, Loc, register_source
from irc.frontends.arch.locs import tree_loc
from irc.frontends.arch.syntax_errors import unexpected_character, unexpected_token

_GRAMMAR = Path(__file__).with_name("arch.lark")
# The builder walks the tree recursively; real models nest a few dozen levels, and a bound
# here turns `x + x + ... (3000 terms)` into an error at its place instead of a stack overflow.
MAX_DEPTH = 100


@lru_cache(maxsize=1)
def parser() -> Lark:
    return Lark(_GRAMMAR.read_text(), parser="lalr", lexer="basic", propagate_positions=True, maybe_placeholders=True)


def parse_text(text: str, file: str) -> Tree:
    register_source(file, text)
    try:
        tree = parser().parse(text)
    except UnexpectedToken as e:
        message, loc = unexpected_token(parser(), text, file, e.token, set(e.expected))
        raise IrcError(message, loc) from None
    except UnexpectedCharacters as e:
        message, loc = unexpected_character(text, file, e.pos_in_stream, e.line, e.column)
        raise IrcError(message, loc) from None
    except UnexpectedInput as e:  # pragma: no cover - LALR with the basic lexer raises only the two above
        raise IrcError(str(e).splitlines()[0], Loc(file, e.line, e.column)) from None
    _check_depth(tree, file)
    return tree


_STRUCTURE = {"start", "model_def", "block_def", "body", "const_stmt", "const_item", "input_stmt", "tensor_type",
              "assign_stmt", "target_list", "output_stmt", "return_stmt", "use_stmt", "name_list", "param_list",
              "param"}


def _check_depth(tree: Tree, file: str) -> None:
    """Refuse trees deeper than MAX_DEPTH, pointing at the start of the expression that is."""
    stack: list[tuple[Tree, int, Tree]] = [(tree, 1, tree)]
    while stack:
        node, depth, anchor = stack.pop()
        if depth > MAX_DEPTH:
            raise IrcError(f"this nests deeper than {MAX_DEPTH} levels; give some of its parts names",
                           tree_loc(file, anchor))  # the whole expression, underlined
        for c in node.children:
            if isinstance(c, Tree):
                # the anchor is the outermost expression: the first node below the statements
                stack.append((c, depth + 1, anchor if anchor.data not in _STRUCTURE else c))
