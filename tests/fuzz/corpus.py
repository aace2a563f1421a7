"""The seed files that mutations start from: every model and golden input in the repository."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCH_DIRS = ("models", "tests/golden", "frontends/arch/lib")


@dataclass(frozen=True)
class Seed:
    name: str  # path relative to the repository root
    text: str
    defines: tuple[str, ...] = ()
    model: str | None = None


def _directives(text: str) -> tuple[tuple[str, ...], str | None]:
    """-D flags and --model from a golden input's ``# args:`` line."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() == "args":
            try:
                words = shlex.split(value)
            except ValueError:
                return (), None
            defines = tuple(words[i + 1] for i, w in enumerate(words[:-1]) if w == "-D")
            model = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--model"), None)
            return defines, model
    return (), None


@cache
def arch_seeds() -> tuple[Seed, ...]:
    """Every .arch file under models/, tests/golden/ and the shipped library, sorted (determinism)."""
    out = []
    for d in ARCH_DIRS:
        for path in sorted((ROOT / d).rglob("*.arch")):
            text = path.read_text(encoding="utf-8", errors="surrogateescape")  # some goldens are not UTF-8 on purpose
            defines, model = _directives(text)
            out.append(Seed(str(path.relative_to(ROOT)), text, defines, model))
    return tuple(out)


@cache
def ir_seeds() -> tuple[Seed, ...]:
    """IR text: the golden dumps, plus the printed IR of every model in models/ that compiles."""
    from irc.pipeline import load_graph
    from irc.printer import print_graph

    out = [Seed(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8", errors="surrogateescape"))
           for p in sorted((ROOT / "tests" / "golden").rglob("*.ir"))]
    for seed in arch_seeds():
        if not seed.name.startswith("models/"):
            continue
        try:
            graph = load_graph(ROOT / seed.name)
        except Exception:  # noqa: BLE001 - a model that does not compile is another test's business
            continue
        text = print_graph(graph, with_loc=len(out) % 2 == 0)
        if len(text) < 60_000:  # the big zoo models add nothing a smaller one lacks, but cost time
            out.append(Seed(seed.name.replace(".arch", ".ir"), text))
    return tuple(out)
