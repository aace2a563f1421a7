"""Writing .arch text that reads like a hand-written model: named constants, short lines."""

from __future__ import annotations

import keyword
import re
import textwrap
from dataclasses import dataclass, field

from irc.runtime.weight_map import WeightMap

LINE = 110  # wrap constant lists before this width


def number(value: int | float) -> str:
    """A config value as an .arch literal: ``500000`` rather than ``500000.0``, ``1e-05`` kept as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def const_lines(pairs: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    """``const a = 1, b = 2`` lines, wrapped; each pair is (name, expression text)."""
    lines: list[str] = []
    current = ""
    for name, expr in pairs:
        item = f"{name} = {expr}"
        if current and len(indent) + len(current) + 2 + len(item) > LINE:
            lines.append(indent + current)
            current = ""
        current = f"{current}, {item}" if current else f"const {item}"
    if current:
        lines.append(indent + current)
    return lines


def head_lines(x: str, table: str, tied: bool) -> list[str]:
    """The language-model head on ``x``: the embedding ``table`` read backwards when HF ties them,
    else a head of its own named ``lm_head`` as in HF's checkpoints (the weight map's rule)."""
    if tied:
        return [f"  output logits = unembed({x}, tied={table})"]
    return [f"  lm_head = unembed({x}, vocab_size)", "  output logits = lm_head"]


def call_lines(head: str, args: list[str], indent: str = "    ") -> list[str]:
    """``head(arg, arg, ...)`` over as many lines as it takes; ``head`` ends just before the parenthesis."""
    lines: list[str] = []
    current = head + "("
    for i, arg in enumerate(args):
        piece = arg + (")" if i == len(args) - 1 else ",")
        if len(current) + 1 + len(piece) > LINE and not current.endswith("("):
            lines.append(current)
            current = indent + piece
        else:
            current += ("" if current.endswith("(") else " ") + piece
    lines.append(current)
    return lines


def model_name(stem: str) -> str:
    """A valid .arch name from a file name: ``gpt2-medium`` -> ``gpt2_medium``."""
    name = re.sub(r"\W", "_", stem)
    if not name or name[0].isdigit() or keyword.iskeyword(name):
        name = "m_" + name
    return name


@dataclass
class Imported:
    """What an importer makes of one config: the .arch text, its weight map, notes for the user."""

    name: str
    text: str
    weight_map: WeightMap
    hf_class: str  # the transformers class whose outputs the model reproduces
    notes: list[str] = field(default_factory=list)


def header(title: str, config: str, lines: list[str]) -> list[str]:
    """The comment at the top of an imported model: what it is, where it came from, how weights load."""
    text = [*textwrap.wrap(title, LINE - 2), f"Imported by `irc import` from {config};",
            "its constants are named after the config's keys.", *lines]
    return [f"# {line}" for line in text]
