"""Span underlines (issue 19, item 16): a diagnostic underlines the whole offending text, ``^~~~~``
under a call from its name to its ')', ``~~^~~`` under a binary expression with the caret at the
operator. Every expected span is found in the source text by the test itself (str.index and a
bracket count), never copied from irc's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from irc.diagnostics import SOURCE_LINE_LIMIT, SOURCE_WINDOW, IrcError, Loc, register_source, render, source_span
from irc.ir_parser import parse_ir

PREFIX = "       | "


def _compile_error(tmp_path: Path, irc_cli, text: str) -> tuple[str, str, str]:
    """The first line, the quoted source line and the underline of the error compiling ``text``."""
    (tmp_path / "m.arch").write_text(text, encoding="utf-8")
    r = irc_cli(["compile", "m.arch"], cwd=tmp_path)
    assert r.rc == 1, r.err
    lines = r.err.splitlines()
    assert lines[2].startswith(PREFIX), r.err
    return lines[0], lines[1].split(" | ", 1)[1], lines[2].removeprefix(PREFIX)


def _closing_paren(text: str, open_at: int) -> int:
    """The index of the ')' that closes the '(' at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError("unbalanced")


def _marked(underline: str) -> tuple[int, int, int]:
    """(first marked index, caret index, last marked index) of an underline."""
    first = len(underline) - len(underline.lstrip(" "))
    return first, underline.index("^"), len(underline.rstrip(" ")) - 1


def test_a_call_is_underlined_from_its_name_to_its_closing_parenthesis(tmp_path: Path, irc_cli) -> None:
    line = "  h = x + attention(layernorm(x), heads=12)"
    head, shown, underline = _compile_error(
        tmp_path, irc_cli, f"model m(B, T) {{\n  input x: f32[B, T, 770]\n{line}\n  output y = h\n}}\n")
    assert shown == line
    start = line.index("attention")
    end = _closing_paren(line, line.index("(", start))
    assert head.startswith(f"m.arch:3:{start + 1}: error: 'attention'")
    assert underline == " " * start + "^" + "~" * (end - start)
    assert shown[start:end + 1] == "attention(layernorm(x), heads=12)"


def test_a_call_over_several_lines_is_underlined_to_the_end_of_its_first_line(tmp_path: Path, irc_cli) -> None:
    first = "  y = attention(x,   # the queries"
    text = f"model m(B, T) {{\n  input x: f32[B, T, 770]\n{first}\n      heads=12)\n  output z = y\n}}\n"
    _, shown, underline = _compile_error(tmp_path, irc_cli, text)
    assert shown == first
    start = first.index("attention")
    assert underline == " " * start + "^" + "~" * (len(first) - start - 1)  # to the line's last character


def test_tabs_before_the_span_keep_the_underline_under_it(tmp_path: Path, irc_cli) -> None:
    line = "\t\ty =\tattention(x, heads=12)"
    _, shown, underline = _compile_error(
        tmp_path, irc_cli, f"model m(B, T) {{\n  input x: f32[B, T, 770]\n{line}\n  output z = y\n}}\n")
    assert shown == line.replace("\t", " ")  # a tab is one column, as the parser counts it
    start, end = shown.index("attention"), shown.rindex(")")
    assert _marked(underline) == (start, start, end)


def test_a_span_in_a_long_line_is_underlined_inside_its_window(tmp_path: Path, irc_cli) -> None:
    pad = " " * (SOURCE_LINE_LIMIT + 500)
    call = "attention(x, heads=12)"
    line = f"  y ={pad}{call}{pad}# past the window"
    _, shown, underline = _compile_error(
        tmp_path, irc_cli, f"model m(B, T) {{\n  input x: f32[B, T, 770]\n{line}\n  output z = y\n}}\n")
    assert shown.startswith("…") and shown.endswith("…") and len(shown) <= SOURCE_WINDOW + 2
    start = shown.index("attention")
    assert underline == " " * start + "^" + "~" * (len(call) - 1)


def test_a_span_running_out_of_the_window_is_underlined_to_its_edge(tmp_path: Path, irc_cli) -> None:
    pad = " " * (SOURCE_LINE_LIMIT + 500)
    line = f"  y ={pad}attention(x,{' ' * SOURCE_WINDOW}heads=12){pad}"
    _, shown, underline = _compile_error(
        tmp_path, irc_cli, f"model m(B, T) {{\n  input x: f32[B, T, 770]\n{line}\n  output z = y\n}}\n")
    assert shown.endswith("…")
    start = shown.index("attention")
    assert underline == " " * start + "^" + "~" * (len(shown) - 1 - start - 1)  # up to the '…'


def test_a_binary_expression_underlines_its_operands_around_a_caret_at_the_operator(tmp_path: Path,
                                                                                   irc_cli) -> None:
    line = "  output y = (v) @ v   # two vectors"
    head, shown, underline = _compile_error(tmp_path, irc_cli, f"model m() {{\n  input v: f32[8]\n{line}\n}}\n")
    at = line.index("@")
    assert head.startswith(f"m.arch:3:{at + 1}: error: 'matmul'")
    # from the '(' around the left operand (which the parser's positions leave out) to the right one
    assert _marked(underline) == (line.index("("), at, line.index("v", at))


def test_a_keyword_argument_is_underlined_with_its_value(tmp_path: Path, irc_cli) -> None:
    line = "  output y = attention(x, heads=none)"
    _, _, underline = _compile_error(tmp_path, irc_cli, f"model m() {{\n  input x: f32[2, 4, 8]\n{line}\n}}\n")
    start = line.index("heads")
    assert _marked(underline) == (start, start, line.index(")") - 1)


def test_a_name_is_underlined_whole(tmp_path: Path, irc_cli) -> None:
    line = "  output y = relu(inputs_misspelt)"
    _, _, underline = _compile_error(tmp_path, irc_cli, f"model m() {{\n  input inputs: f32[2, 4]\n{line}\n}}\n")
    start = line.index("inputs_misspelt")
    assert _marked(underline) == (start, start, start + len("inputs_misspelt") - 1)


def test_ir_text_errors_underline_the_token(tmp_path: Path) -> None:
    line = "  %y = frobnicate %x : f32[B,8]"
    text = f"graph @m(B) {{\n  %x = input : f32[B,8]\n{line}\n  output y = %y\n}}\n"
    with pytest.raises(IrcError) as info:
        parse_ir(text, "dump.ir")
    underline = render(info.value, color=False).splitlines()[2].removeprefix(PREFIX)
    start = line.index("frobnicate")
    assert _marked(underline) == (start, start, start + len("frobnicate") - 1)


def test_an_escaped_character_in_the_span_is_underlined_across_its_escape() -> None:
    shown, underline = source_span('use "a\x00b.arch"', 5, 5, 16)
    assert shown == 'use "a\\x00b.arch"'
    assert underline == "    ^" + "~" * (len(shown) - 5)


def test_the_underline_is_coloured_on_a_terminal_and_plain_otherwise() -> None:
    register_source("c.arch", "model m() {\n  output y = bad(x)\n}\n")
    err = IrcError("unknown op 'bad'", Loc("c.arch", 2, 14, 2, 20))
    assert render(err, color=True).splitlines()[2] == PREFIX + " " * 13 + "\x1b[1;32m^~~~~~\x1b[0m"
    assert render(err, color=False).splitlines()[2] == PREFIX + " " * 13 + "^~~~~~"


def test_a_location_without_an_end_keeps_a_single_caret() -> None:
    register_source("c.arch", "model m() {\n  output y = bad(x)\n}\n")
    assert render(IrcError("x", Loc("c.arch", 2, 14)), color=False).splitlines()[2] == PREFIX + " " * 13 + "^"


def test_a_location_is_its_caret_whatever_its_span() -> None:
    # the IR printer writes loc(file:line:col) and a dump parses back to equal nodes
    assert Loc("m.arch", 3, 5, 3, 9) == Loc("m.arch", 3, 5) and hash(Loc("m.arch", 3, 5, 3, 9)) == hash(
        Loc("m.arch", 3, 5))
    assert str(Loc("m.arch", 3, 5, 4, 1, 2, 7)) == "m.arch:3:5"
