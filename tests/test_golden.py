"""Golden IR dumps: each tests/golden/ops/*.arch compiles to exactly its .ir file.

The .ir files were checked by hand against each op's shape formula (the comment at the top
of each .arch states it); tests/test_language.py re-checks the non-trivial ones against
PyTorch. Rewrite them with ``pytest --update-golden`` (see tests/conftest.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from irc.ops import OPS
from irc.ops.registry import OpDef

OPS_DIR = Path(__file__).resolve().parent / "golden" / "ops"
CASES = sorted(OPS_DIR.glob("*.arch"))
_NODE_OP = re.compile(r"^\s*%[^=]+ = ([A-Za-z_][A-Za-z0-9_]*)\b", re.M)


@pytest.mark.parametrize("arch", CASES, ids=lambda p: p.stem)
def test_op_golden(arch: Path, golden, golden_case) -> None:
    run = golden_case(arch)
    assert run.result.rc == 0, run.result.err
    assert run.result.err == ""
    golden.check(arch.with_suffix(".ir"), run.result.out)


PASSES_DIR = OPS_DIR.parent / "passes"  # the primitives that decompose and fusion produce


def _golden_ops() -> set[str]:
    dumps = [*OPS_DIR.glob("*.ir"), *PASSES_DIR.glob("*.ir")]
    return {op for ir in dumps for op in _NODE_OP.findall(ir.read_text(encoding="utf-8"))}


def test_every_op_has_a_golden() -> None:
    missing = sorted(set(OPS) - _golden_ops())
    assert not missing, f"ops without a golden in tests/golden/ops or tests/golden/passes: {missing}"


def test_every_alias_is_spelled_in_some_golden() -> None:
    sources = "\n".join(p.read_text(encoding="utf-8") for p in CASES)
    op_defs: list[OpDef] = list(OPS.values())
    aliases = {a for d in op_defs for a in d.aliases}
    missing = sorted(a for a in aliases if not re.search(rf"\b{a}\(", sources))
    assert not missing, f"aliases no golden .arch calls: {missing}"


def test_no_orphan_golden_dumps() -> None:
    orphans = sorted(p.name for p in OPS_DIR.glob("*.ir") if not p.with_suffix(".arch").exists())
    assert not orphans, f".ir files without their .arch: {orphans}"


def test_goldens_are_deterministic(golden_case) -> None:
    """Compiling twice gives byte-identical IR (names, attribute order, symbol order)."""
    for arch in CASES[:5]:
        assert golden_case(arch).result.out == golden_case(arch).result.out
