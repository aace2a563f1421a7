"""IR text round-trips: print → parse → print is byte-identical, shape-infer on parsed IR
reproduces the types, and ``irc compile dump.ir`` reprints the dump.

Runs over every golden op model and every model in models/ (globbed when the tests are
collected, so new models join automatically; files that only hold blocks are used by others).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from irc.ir_parser import parse_ir
from irc.passes import PASSES
from irc.printer import print_graph

ROOT = Path(__file__).resolve().parents[1]
OPS_DIR = Path(__file__).resolve().parent / "golden" / "ops"
_MODEL = re.compile(r"^\s*model\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.M)
_ARGS = re.compile(r"^# args:(.*)$", re.M)


def _cases() -> list[tuple[Path, list[str]]]:
    """(file, extra argv) for each model: golden op models and everything under models/."""
    out: list[tuple[Path, list[str]]] = []
    for arch in sorted(OPS_DIR.glob("*.arch")):
        m = _ARGS.search(arch.read_text(encoding="utf-8"))
        out.append((arch, shlex.split(m.group(1)) if m else []))
    for arch in sorted((ROOT / "models").glob("**/*.arch")):
        names = _MODEL.findall(arch.read_text(encoding="utf-8"))
        for name in names:
            out.append((arch, ["--model", name] if len(names) > 1 else []))
    return out


CASES = _cases()


def _id(case: tuple[Path, list[str]]) -> str:
    path, args = case
    rel = path.relative_to(ROOT).as_posix()
    return rel + ("[" + " ".join(args) + "]" if args else "")


@pytest.fixture(params=CASES, ids=[_id(c) for c in CASES])
def dump(request, irc_cli) -> str:
    path, args = request.param
    r = irc_cli(["compile", path.name, *args], cwd=path.parent)
    assert r.rc == 0, r.err
    return r.out


def test_print_parse_print_is_identical(dump: str) -> None:
    assert print_graph(parse_ir(dump)) == dump


def test_shape_infer_on_parsed_ir_gives_the_same_types(dump: str) -> None:
    graph = parse_ir(dump)
    for node in graph.nodes:
        if node.op != "input":
            node.types = []
    assert print_graph(PASSES["shape-infer"](graph)) == dump


def test_compile_of_a_dump_reprints_it(dump: str, irc_cli, tmp_path: Path) -> None:
    path = tmp_path / "model.ir"
    path.write_text(dump, encoding="utf-8")
    r = irc_cli(["compile", str(path), "-W", "no-all"])  # lints are tested in test_lint.py
    assert (r.rc, r.err) == (0, "")
    assert r.out == dump


def test_models_folder_is_covered() -> None:
    """The glob finds the shipped models (a safeguard against a wrong pattern)."""
    shipped = [p for p, _ in CASES if p.is_relative_to(ROOT / "models")]
    assert len(shipped) >= 1


NO_LOC_IR = """// irc IR v1
graph @m(B) {
  %x = input : f32[B,8]
    %y = linear %x {out=4} : f32[B,4] scope("y")
  %z = relu %y : f32[B,4] loc("m.arch":7:3)
  output o = %z
}
"""


def test_nodes_without_loc_carry_their_ir_line() -> None:
    from irc.diagnostics import Loc

    graph = parse_ir(NO_LOC_IR, "dump.ir")
    locs = {n.outputs[0]: n.loc for n in graph.nodes}
    # the column counts from the line as written, indentation included
    assert locs == {"x": Loc("dump.ir", 3, 3), "y": Loc("dump.ir", 4, 5), "z": Loc("m.arch", 7, 3)}
    assert graph.loc == Loc("dump.ir", 2, 7)


def test_shape_errors_in_ir_point_into_the_ir_file() -> None:
    from irc.diagnostics import IrcError

    bad = NO_LOC_IR.replace("%y = linear %x {out=4} : f32[B,4]", "%y = matmul %x, %x")
    with pytest.raises(IrcError) as info:
        PASSES["shape-infer"](parse_ir(bad, "dump.ir"))
    assert str(info.value.loc) == "dump.ir:4:5"
    assert info.value.message.startswith("'matmul': cannot show that the inner sizes 8 and B are equal")
