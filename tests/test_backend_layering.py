"""The cpu and cuda code generators share code only through backends/common (and the shared
top-level modules of backends/): neither imports the other, as DESIGN.md's layering says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[1] / "backends"


def imported_modules(text: str, package: str) -> set[str]:
    """Every module ``text`` (a file of ``package``) imports, absolute, wherever the import
    stands (top level, in a function, under ``if TYPE_CHECKING``); relative imports resolved."""
    parts = package.split(".")
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{module}" if module else base
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)  # ``from irc.backends import cuda``
    return out


def crossings(text: str, package: str, other: str) -> list[str]:
    """The imports of backend ``other`` among those of ``text``."""
    banned = f"irc.backends.{other}"
    return sorted(m for m in imported_modules(text, package) if m == banned or m.startswith(banned + "."))


@pytest.mark.parametrize(("backend", "other"), [("cpu", "cuda"), ("cuda", "cpu")])
def test_backend_imports_nothing_of_the_other(backend: str, other: str) -> None:
    files = sorted((BACKENDS / backend).rglob("*.py"))
    assert len(files) > 5, f"backends/{backend} has no files to scan"
    found = {}
    for path in files:
        package = ".".join(["irc", "backends", *path.relative_to(BACKENDS).parent.parts])
        if hits := crossings(path.read_text(), package, other):
            found[str(path.relative_to(BACKENDS.parent))] = hits
    assert found == {}, "shared code belongs in backends/common"


def test_every_spelling_of_an_import_is_seen() -> None:
    """The scan itself: each way a cuda file could import the cpu backend is caught."""
    probes = ["from irc.backends.cpu.cache import entry_path", "import irc.backends.cpu.loader",
              "from irc.backends import cpu", "from ..cpu import jit", "from .. import cpu",
              "def f():\n    from irc.backends.cpu import compile_graph",
              "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from irc.backends.cpu.jit import jit"]
    for text in probes:
        assert crossings(text, "irc.backends.cuda", "cpu"), text
    assert crossings("from irc.backends.common.cache import entry_path\nfrom . import emit", "irc.backends.cuda",
                     "cpu") == []
