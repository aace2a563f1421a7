"""The coverage matrix: every registered op against every place an op must be known.

A column is covered by the op's own record (its type rule, params with init rules, cost, receptive
field, lint classes), by a backend's table keyed by the op (numpy reference, CPU and CUDA renderers),
or by the tests and docs (a golden IR, an error case, a PyTorch oracle test, the semantics page). An op
may declare a column "not applicable" in its record (``OpDef.na``) with a reason. ``missing()`` lists
every (op, column) that is neither covered nor excused, so a half-added op fails the suite by name.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from irc.ops import OPS
from irc.ops.registry import COLUMNS, OpDef

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
ORACLE_MODULES = ("test_torch_oracle_layers", "test_torch_oracle_attention", "test_torch_oracle_recurrent",
                  "test_t5_oracle", "test_torch_oracle_misc", "test_grad_ops", "test_grad_moe")
ORACLE_GLOB = "test_ops_*.py"  # the new op families' oracle tests declare ORACLE_OPS too


@cache
def golden_ir_ops() -> frozenset[str]:
    """Ops that appear in some golden IR dump (ops, and the passes' before/after pairs)."""
    found: set[str] = set()
    for path in list((GOLDEN / "ops").glob("*.ir")) + list((GOLDEN / "passes").glob("*.ir")):
        found.update(re.findall(r"^\s*%[^=]+= ([a-z_0-9]+)\b", path.read_text(), flags=re.M))
    return frozenset(found)


@cache
def error_texts() -> str:
    return "\n".join(p.read_text() for p in (GOLDEN / "errors").glob("*.err"))


@cache
def oracle_ops() -> frozenset[str]:
    """Ops some PyTorch/Hugging Face oracle test checks: each such module declares
    ``ORACLE_OPS = frozenset({...})`` (read from the source, so nothing is imported)."""
    paths = [ROOT / "tests" / f"{m}.py" for m in ORACLE_MODULES] + sorted((ROOT / "tests").glob(ORACLE_GLOB))
    found: set[str] = set()
    for path in paths:
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ORACLE_OPS"
                                                    for t in node.targets):
                value = node.value
                if isinstance(value, ast.Call) and value.args:  # frozenset({...})
                    value = value.args[0]
                found |= set(ast.literal_eval(value))
    return frozenset(found)


@cache
def semantics_text() -> str:
    return (ROOT / "docs" / "semantics.md").read_text()


def _tables() -> dict[str, Iterable[str]]:
    from irc.backends.cpu.render import RENDERERS as CPU
    from irc.backends.cuda.render import RENDERERS as CUDA
    from irc.backends.numpy_ref.interpreter import OPS as NUMPY

    return {"numpy": NUMPY, "cpu": CPU, "cuda": CUDA}


def covered(name: str, op: OpDef, column: str, tables: dict[str, Iterable[str]]) -> bool:
    """Whether the op's record, a backend table, or the tests and docs cover ``column``."""
    if column == "type":
        return callable(op.infer)
    if column == "params":  # parameters are declared (or the op has none: it declares no init either)
        return op.params is not None or op.buffers is not None or op.init is None
    if column == "init":  # rules for the parameters are checked per instance in test_op_coverage.py
        return op.init is not None or (op.params is None and op.buffers is None)
    if column == "flops":
        return op.cost is not None
    if column == "bytes":  # bytes moved follow from the types, except for views (declared with the class)
        return op.cost is not None and bool(op.classes)
    if column == "receptive":
        return op.receptive is not None
    if column == "lint":
        return bool(op.classes)
    if column in tables:
        return name in tables[column]
    if column == "golden_ir":
        return name in golden_ir_ops()
    if column == "error_case":
        return f"'{name}'" in error_texts()
    if column == "torch_oracle":
        return name in oracle_ops()
    if column == "grad":  # reverse-mode autodiff: the record's vector-Jacobian product (irc/passes/grad.py)
        return op.vjp is not None
    if column == "semantics":
        return re.search(rf"`{re.escape(name)}[`(]", semantics_text()) is not None
    raise AssertionError(f"unknown column {column}")


def missing(ops: dict[str, OpDef] | None = None, tables: dict[str, Iterable[str]] | None = None) -> list[str]:
    """'op: column' for every cell neither covered nor declared not applicable."""
    ops = OPS if ops is None else ops
    tables = _tables() if tables is None else tables
    out = []
    for name, op in sorted(ops.items()):
        for column in COLUMNS:
            if column in op.na:
                continue
            if not covered(name, op, column, tables):
                out.append(f"{name}: {column}")
    return out
