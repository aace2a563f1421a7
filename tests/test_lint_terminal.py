"""Lint warnings quote the user's file as safely as errors do: escape sequences escaped, colour only
on a terminal without NO_COLOR (issue 19, items 10 and 16)."""

from __future__ import annotations

import io
from pathlib import Path

from irc.lint.cli import print_lints
from irc.pipeline import load_graph

# a comment on the warned line carries an escape sequence that would clear the screen
MODEL = "model m(B) {\n  input x: f32[B, 3, 32, 32]\n  output y = linear(flatten(x), 10)  # \x1b[2J\n}\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lint_quotes_escape_control_characters_and_colour_only_terminals(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "m.arch"
    path.write_text(MODEL)
    graph = load_graph(path)
    plain = io.StringIO()
    print_lints(graph, [], plain)
    text = plain.getvalue()
    assert "IRC-W110" in text and "\x1b" not in text and "\\x1b[2J" in text
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    tty = _Terminal()
    print_lints(graph, [], tty)
    assert "\x1b[1;35mwarning:\x1b[0m" in tty.getvalue() and "\x1b[2J" not in tty.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    quiet = _Terminal()
    print_lints(graph, [], quiet)
    assert "\x1b[1;35m" not in quiet.getvalue()
