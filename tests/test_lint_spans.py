"""Span underlines in irc lint (issue 19, item 16): a warning underlines the call it is about, as
errors do, and SARIF carries the span's end. Expected spans are found in the source by the test."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "       | "


def _closing_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError("unbalanced")


def test_a_warning_underlines_the_whole_call(irc_cli) -> None:
    r = irc_cli(["lint", "tests/lint/w102_unscaled.arch"], cwd=ROOT)
    lines = r.err.splitlines()
    assert "[IRC-W102]" in lines[0]
    line = (ROOT / "tests/lint/w102_unscaled.arch").read_text(encoding="utf-8").split("\n")[5]
    start = line.index("attention(")
    end = _closing_paren(line, line.index("(", start))
    assert lines[1].split(" | ", 1)[1] == line
    assert lines[2] == PREFIX + " " * start + "^" + "~" * (end - start)


def test_a_library_warning_underlines_the_users_call_of_the_block(irc_cli) -> None:
    r = irc_cli(["lint", "models/t5_small.arch"], cwd=ROOT)
    lines = r.err.splitlines()
    shown = lines[1].split(" | ", 1)[1]
    start = shown.index("t5_encoder(")
    assert lines[2] == PREFIX + " " * start + "^" + "~" * (len("t5_encoder") - 1)


def test_sarif_regions_end_where_the_call_does(irc_cli) -> None:
    r = irc_cli(["lint", "tests/lint/w102_unscaled.arch", "--format", "sarif"], cwd=ROOT)
    region = json.loads(r.out)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    line = (ROOT / "tests/lint/w102_unscaled.arch").read_text(encoding="utf-8").split("\n")[5]
    start = line.index("attention(")
    end = _closing_paren(line, line.index("(", start))
    # SARIF columns count from 1 and endColumn is the one after the region's last character
    assert region == {"startLine": 6, "startColumn": start + 1, "endLine": 6, "endColumn": end + 2}
