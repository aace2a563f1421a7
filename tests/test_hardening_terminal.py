"""Terminal safety and colour (issue 19, items 10 and 16): what irc quotes from a user's file is
escaped and cut short, and labels are coloured only on a terminal without NO_COLOR."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest

from irc.diagnostics import IrcError, Loc, quote, register_source, render, source_window, terminal_safe

ESC = "\x1b"


def test_escape_sequences_in_a_model_comment_are_not_sent_raw(tmp_path: Path, irc_cli) -> None:
    (tmp_path / "m.arch").write_text(f"model m() {{\n  input x: f32[2, 4]\n"
                                     f"  output y = nosuch(x)  # {ESC}]0;owned{ESC}\\{ESC}[2J\n}}\n")
    r = irc_cli(["compile", "m.arch"], cwd=tmp_path)
    assert r.rc == 1
    assert ESC not in r.err
    assert "# \\x1b]0;owned\\x1b\\\\x1b[2J" in r.err  # shown, escaped, where it stands
    lines = r.err.splitlines()
    assert lines[1].index("nosuch") == lines[2].index("^")  # the caret still points at the op


def test_a_file_of_nuls_is_not_echoed(tmp_path: Path, irc_cli) -> None:
    (tmp_path / "zeros.arch").write_bytes(bytes(5_000_000))
    r = irc_cli(["compile", "zeros.arch"], cwd=tmp_path)
    assert r.rc == 1
    assert "\x00" not in r.err
    assert len(r.err) < 2_000, len(r.err)
    assert r.err.startswith("zeros.arch:1:1: error: ")


def test_a_weight_key_with_control_characters_is_escaped(tmp_path: Path, irc_cli) -> None:
    (tmp_path / "m.arch").write_text("model m() {\n  input x: f32[2, 4]\n  output y = linear(x, 3)\n}\n")
    key = f"y.{ESC}[31mweight" + "x" * 5000
    header = {key: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    text = json.dumps(header).encode()
    (tmp_path / "w.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(4))
    r = irc_cli(["run", "m.arch", "--weights", "w.safetensors"], cwd=tmp_path)
    assert r.rc == 1
    assert ESC not in r.err and "\\x1b[31m" in r.err
    assert len(r.err) < 3_000  # a 5,000-character key is cut


def test_a_file_name_with_a_newline_stays_on_one_line(tmp_path: Path, irc_cli) -> None:
    r = irc_cli(["compile", "no\nsuch.arch"], cwd=tmp_path)
    assert r.rc == 1
    assert r.err == "irc: error: no such file: 'no\\x0asuch.arch'\n"


def test_terminal_safe_and_quote() -> None:
    assert terminal_safe("plain text, ünïcode") == "plain text, ünïcode"
    assert terminal_safe(f"a{ESC}[0mb\x00c\x7f\u202e") == "a\\x1b[0mb\\x00c\\x7f\\u202e"
    assert terminal_safe("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert quote("a\nb") == "a\\x0ab"
    long = quote("k" * 1000, limit=21)
    assert len(long) == 21 and long == "k" * 10 + "…" + "k" * 10


def test_source_window_keeps_the_caret_on_its_character() -> None:
    line = "a" * 5000 + "X" + "b" * 5000
    shown, caret = source_window(line, 5001)
    assert shown[caret] == "X"
    assert shown.startswith("…") and shown.endswith("…") and len(shown) <= 202
    assert source_window("x = 1" * 100, 3) == ("x = 1" * 100, 2)  # an ordinary line is quoted whole
    shown, caret = source_window("\x00\x00X", 3)
    assert (shown, caret) == ("\\x00\\x00X", 8)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def located() -> IrcError:
    register_source("c.arch", "model m() {\n  output y = bad(x)\n}\n")
    return IrcError("unknown op 'bad'", Loc("c.arch", 2, 14), notes=["ops are listed in docs/ops.md"])


def test_colour_on_a_terminal_and_never_with_no_color(located: IrcError, monkeypatch: pytest.MonkeyPatch) -> None:
    from irc import diagnostics

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert diagnostics.use_color(_Tty()) is True
    assert diagnostics.use_color(io.StringIO()) is False  # a pipe or a file: tests and goldens stay plain
    monkeypatch.setenv("NO_COLOR", "1")
    assert diagnostics.use_color(_Tty()) is False
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert diagnostics.use_color(_Tty()) is False
    painted = render(located, color=True)
    assert "\x1b[1;31merror:\x1b[0m" in painted and "\x1b[1;36mnote:\x1b[0m" in painted
    plain = render(located, color=False)
    assert ESC not in plain
    assert plain == ("c.arch:2:14: error: unknown op 'bad'\n     2 |   output y = bad(x)\n"
                     "       |              ^\nnote: ops are listed in docs/ops.md")
    # with colour off, the escapes are exactly what was added: the text is the same
    assert painted.replace("\x1b[1;31m", "").replace("\x1b[1;36m", "").replace("\x1b[1;32m", "") \
        .replace("\x1b[1m", "").replace("\x1b[0m", "") == plain


def test_the_command_line_is_plain_when_stderr_is_not_a_terminal(tmp_path: Path, irc_cli) -> None:
    (tmp_path / "m.arch").write_text("model m() {\n  input x: f32[2, 4]\n  output y = nosuch(x)\n}\n")
    r = irc_cli(["compile", "m.arch"], cwd=tmp_path)
    assert r.rc == 1 and ESC not in r.err
