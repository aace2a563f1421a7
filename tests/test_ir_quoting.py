"""Strings in IR dumps (file names, scopes, weight keys) stay on their line and parse back, whatever
characters they hold: a model file whose name has a newline once made a dump that did not parse."""

from __future__ import annotations

from pathlib import Path

from irc.ir_parser import parse_ir
from irc.pipeline import load_graph
from irc.printer import print_graph

MODEL = "model m(B) {\n  input x: f32[B, 4]\n  output y = linear(x, 3)\n}\n"


def test_a_file_name_with_control_characters_round_trips(tmp_path: Path) -> None:
    path = tmp_path / 'odd\nname\t"q"\\x\x01.arch'
    path.write_text(MODEL)
    text = print_graph(load_graph(path))
    lines = text.splitlines()
    assert len(lines) == 6 and all('loc("' not in line or line.count('loc("') == 1 for line in lines)
    assert "\\n" in text and "\\t" in text and "\\x01" in text
    again = parse_ir(text, "dump.ir")
    assert print_graph(again) == text
    assert again.nodes[0].loc.file == str(path)  # decoded back to the real name
