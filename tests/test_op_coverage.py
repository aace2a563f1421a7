"""One op, one record: the coverage matrix over every registered op (tests/op_coverage.py), and
the checks that make it able to fail."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from op_coverage import _tables, covered, missing

from irc.diagnostics import IrcError
from irc.ops import OPS
from irc.ops.registry import CLASSES, COLUMNS, INIT_RULES
from irc.pipeline import load_graph

ROOT = Path(__file__).resolve().parents[1]


def test_every_op_is_covered_in_every_column() -> None:
    gaps = missing()
    assert not gaps, "ops not covered (add the entry, or declare na={column: reason} in the op's record):\n  " + \
        "\n  ".join(gaps)


def test_every_not_applicable_says_why() -> None:
    for name, op in OPS.items():
        for column, reason in op.na.items():
            assert column in COLUMNS and isinstance(reason, str) and len(reason.split()) >= 3, (name, column)


def test_the_matrix_fails_on_a_removed_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # a record that forgets its receptive-field rule, its cost or its classes
    ops = dict(OPS)
    ops["relu"] = dataclasses.replace(OPS["relu"], receptive=None)
    ops["conv2d"] = dataclasses.replace(OPS["conv2d"], cost=None)
    ops["layernorm"] = dataclasses.replace(OPS["layernorm"], classes=frozenset())
    # a backend table that lost a kernel
    tables = {k: set(v) for k, v in _tables().items()}
    tables["cpu"].discard("batchnorm")
    gaps = missing(ops, tables)
    for want in ("relu: receptive", "conv2d: flops", "layernorm: lint", "batchnorm: cpu"):
        assert want in gaps
    # and excusing a column needs the record to say so
    ops["relu"] = dataclasses.replace(OPS["relu"], receptive=None, na={"receptive": "a reason given here"})
    assert "relu: receptive" not in missing(ops, tables)


def test_the_docs_and_tests_columns_look_at_real_files() -> None:
    tables = _tables()
    op = OPS["layernorm"]
    assert covered("layernorm", op, "semantics", tables)
    assert not covered("no_such_op", op, "semantics", tables)
    assert not covered("no_such_op", op, "golden_ir", tables)
    assert not covered("no_such_op", op, "error_case", tables)
    assert not covered("no_such_op", op, "torch_oracle", tables)


def _instances() -> list[Path]:
    return sorted((ROOT / "tests" / "golden" / "ops").glob("*.arch")) + sorted((ROOT / "models").glob("*.arch")) \
        + sorted((ROOT / "models" / "seed").glob("*.arch"))


def test_every_parameter_of_every_instance_has_an_init_rule() -> None:
    """A parameter without a declared rule would start as whatever a default does (the groupnorm
    'weight' that initialised to zero): every param and buffer of every golden op and zoo model has one."""
    checked = 0
    for path in _instances():
        try:
            graph = load_graph(path)
        except IrcError:
            continue  # a golden that is an error case of its own is checked elsewhere
        types = graph.value_types()
        for node in graph.nodes:
            op = OPS[node.op] if node.op in OPS else None
            if op is None:
                continue
            ins = [types[v] for v in node.inputs]
            names = set(op.param_shapes(node.attrs, ins)) | set(op.buffer_shapes(node.attrs, ins))
            rules = op.init_rules(node.attrs)
            assert names <= set(rules), f"{path.name}: '{node.op}' has no init rule for {sorted(names - set(rules))}"
            assert set(rules[n] for n in names) <= set(INIT_RULES), f"{path.name}: '{node.op}' names an unknown rule"
            checked += len(names)
    assert checked > 100


def test_classes_are_a_closed_vocabulary() -> None:
    from irc.ops.registry import OpDef, register

    with pytest.raises(AssertionError, match="unknown classes"):
        register(OpDef("bogus_op", ("x",), (), lambda a, ts: ts, classes=frozenset({"activaton"})))
    assert "bogus_op" not in OPS
    assert all(op.classes <= set(CLASSES) for op in OPS.values())
