"""The ``irc`` command line: exit codes, --version, --help, -o, --emit json, IR dumps, no tracebacks."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from irc.ir_parser import parse_ir

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"
SMALL = """\
model small(B, T) {
  input x: f32[B, T, 16]
  h = layernorm(x)
  output y = linear(h, 8)
}
"""


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.arch"
    path.write_text(SMALL, encoding="utf-8")
    return path


# -- exit codes -------------------------------------------------------------------------


def test_success_exits_0_and_prints_ir(irc_cli, small: Path) -> None:
    r = irc_cli(["compile", str(small)])
    assert (r.rc, r.err) == (0, "")
    assert r.out.startswith("// irc IR v1\ngraph @small(B, T) {\n")
    assert "%y = linear %h {out=8, bias=true} : f32[B,T,8]" in r.out


def test_model_error_exits_1(irc_cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.arch"
    bad.write_text(SMALL.replace("16]", "15]").replace("linear(h, 8)", "h + x + linear(h, 8)"), encoding="utf-8")
    r = irc_cli(["compile", "bad.arch"], cwd=tmp_path)
    assert r.rc == 1
    assert r.out == ""
    assert r.err.startswith("bad.arch:4:20: error: 'add': cannot broadcast f32[B,T,15] with f32[B,T,8]")


@pytest.mark.parametrize("argv, message", [
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["compile", "{small}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["compile"], "the following arguments are required: file"),
    (["compile", "{small}", "--emit", "pdf"], "invalid choice: 'pdf'"),
    (["compile", "{small}", "-D", "T"], "-D expects NAME=VALUE, got 'T'"),
    (["compile", "{small}", "-D", "T=ten"], "-D T: 'ten' is not a number"),
    (["compile", "{small}", "-D", "T=-3"], "-D T: a size must be positive, got -3"),
    (["compile", "{small}", "-D", "T=4", "-D", "T=8"], "-D T is given twice with different values (4 and 8)"),
    (["compile", "{small}", "--passes", "no-such-pass"], "unknown pass 'no-such-pass'"),
])
def test_usage_errors_exit_2(irc_cli, small: Path, argv: list[str], message: str) -> None:
    r = irc_cli([a.replace("{small}", str(small)) for a in argv])
    assert r.rc == 2
    assert message in r.err
    assert r.out == ""
    assert "Traceback" not in r.err


def test_same_define_twice_is_fine(irc_cli, small: Path) -> None:
    r = irc_cli(["compile", str(small), "-D", "T=4", "-D", "T=4", "--no-loc"])
    assert r.rc == 0
    assert "%x = input : f32[B,4,16]" in r.out


def test_no_command_prints_help_and_exits_2(irc_cli) -> None:
    r = irc_cli([])
    assert r.rc == 2
    assert "usage: irc" in r.out + r.err


@pytest.mark.parametrize("content, message", [
    (None, "irc: error: no such file: 'missing.arch'"),
    (b"model m(B) {\xff\xfe}\n", "binary.arch:1:13: error: the file is not UTF-8 text (byte 0xff)"),
])
def test_unreadable_inputs_exit_1(irc_cli, tmp_path: Path, content: bytes | None, message: str) -> None:
    name = "missing.arch" if content is None else "binary.arch"
    if content is not None:
        (tmp_path / name).write_bytes(content)
    r = irc_cli(["compile", name], cwd=tmp_path)
    assert r.rc == 1
    assert message in r.err


def test_a_directory_is_not_a_model(irc_cli, tmp_path: Path) -> None:
    (tmp_path / "dir.arch").mkdir()
    r = irc_cli(["compile", "dir.arch"], cwd=tmp_path)
    assert r.rc == 1
    assert r.err == "irc: error: 'dir.arch' is a folder, not an .arch file\n"


# -- --version and --help ----------------------------------------------------------------


def test_version_matches_pyproject(irc_cli) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    r = irc_cli(["--version"])
    assert r.rc == 0
    assert r.out.strip() == f"irc {version}"


def test_help_lists_commands_and_examples(irc_cli) -> None:
    r = irc_cli(["--help"])
    assert r.rc == 0
    for word in ("compile", "analyze", "run", "lint", "--version", "-D NAME=VALUE", "examples:"):
        assert word in r.out
    assert re.search(r"irc compile \S+\.arch", r.out)


def test_compile_help_lists_every_option(irc_cli) -> None:
    r = irc_cli(["compile", "--help"])
    assert r.rc == 0
    for option in ("-D NAME=VALUE", "--emit", "--passes", "--print-ir-after-all", "-o OUTPUT", "--model", "--no-loc"):
        assert option in r.out
    assert "{ir,json" in r.out


# -- outputs -----------------------------------------------------------------------------


def test_output_file_is_written_whole_and_no_temp_is_left(irc_cli, small: Path, tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "small.ir"
    (tmp_path / "deeper").mkdir()  # irc makes no folders (tests/test_hardening_cli.py)
    r = irc_cli(["compile", str(small), "-o", str(out)])
    assert (r.rc, r.out, r.err) == (0, "", "")
    assert out.read_text(encoding="utf-8") == irc_cli(["compile", str(small)]).out
    assert sorted(p.name for p in out.parent.iterdir()) == ["small.ir"]
    r = irc_cli(["compile", str(small), "-o", str(out), "-D", "T=3"])  # overwrite in place
    assert "f32[B,3,16]" in out.read_text(encoding="utf-8")
    assert sorted(p.name for p in out.parent.iterdir()) == ["small.ir"]


def test_output_error_leaves_old_file_alone(irc_cli, small: Path, tmp_path: Path) -> None:
    out = tmp_path / "keep.ir"
    out.write_text("previous\n", encoding="utf-8")
    small.write_text(SMALL.replace("linear(h, 8)", "linear(h, 0)"), encoding="utf-8")
    r = irc_cli(["compile", str(small), "-o", str(out)])
    assert r.rc == 1
    assert out.read_text(encoding="utf-8") == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.ir", "small.arch"]


def test_unwritable_output_is_a_usage_error(irc_cli, small: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    r = irc_cli(["compile", str(small), "-o", str(blocker / "x.ir")])
    assert r.rc == 2
    assert r.err.startswith("irc: error: cannot write")


def test_emit_json_has_the_same_nodes_as_the_ir(irc_cli) -> None:
    arch = GOLDEN / "ops" / "attention_gqa.arch"
    text = irc_cli(["compile", arch.name], cwd=arch.parent).out
    r = irc_cli(["compile", arch.name, "--emit", "json"], cwd=arch.parent)
    assert r.rc == 0
    data = json.loads(r.out)
    graph = parse_ir(text)
    assert data["graph"] == graph.name == "attention_gqa"
    assert data["symbols"] == graph.symbols
    assert len(data["nodes"]) == len(graph.nodes)
    for item, node in zip(data["nodes"], graph.nodes):
        assert (item["op"], item["outputs"], item["inputs"], item["scope"]) == (
            node.op, node.outputs, node.inputs, node.scope)
        shapes = [f"{t['dtype']}[{','.join(str(d) for d in t['shape'])}]" for t in item["types"]]
        assert shapes == [str(t) for t in node.types]
        assert item["loc"] == {"file": node.loc.file, "line": node.loc.line, "col": node.loc.col}
    assert [(o["name"], o["value"]) for o in data["outputs"]] == graph.outputs
    assert data["nodes"][1]["attrs"] == {"heads": 32, "kv_heads": 8, "causal": True, "bias": False, "rope": False}


def test_emit_json_keeps_symbols_as_strings_and_sizes_as_ints(irc_cli, small: Path) -> None:
    data = json.loads(irc_cli(["compile", str(small), "--emit", "json", "-D", "T=5"]).out)
    assert data["bindings"] == {"T": 5}
    assert data["nodes"][0]["types"] == [{"dtype": "f32", "shape": ["B", 5, 16]}]


def test_print_ir_after_all_goes_to_stderr(irc_cli, small: Path) -> None:
    plain = irc_cli(["compile", str(small)])
    r = irc_cli(["compile", str(small), "--print-ir-after-all"])
    assert r.rc == 0
    assert r.out == plain.out
    assert r.err.startswith("// ----- IR after shape-infer -----\n")
    assert plain.out in r.err


def test_no_loc_drops_locations(irc_cli, small: Path) -> None:
    r = irc_cli(["compile", str(small), "--no-loc"])
    assert r.rc == 0
    assert "loc(" not in r.out
    assert "loc(" in irc_cli(["compile", str(small)]).out


def test_compile_reads_an_ir_dump(irc_cli, small: Path, tmp_path: Path) -> None:
    dump = tmp_path / "small.ir"
    irc_cli(["compile", str(small), "-o", str(dump)])
    r = irc_cli(["compile", str(dump)])
    assert r.rc == 0
    assert r.out == dump.read_text(encoding="utf-8")
    bound = irc_cli(["compile", str(dump), "-D", "T=7", "--no-loc"])
    assert bound.rc == 0
    assert "%y = linear %h {out=8, bias=true} : f32[B,7,8]" in bound.out


# -- no tracebacks -----------------------------------------------------------------------

ERROR_SAMPLES = ["syntax_unexpected_token.arch", "attention_kv_heads.arch", "use_cycle_two_files.arch",
                 "define_conflict.arch", "ir_unknown_op.ir", "dim_too_large.arch"]


def test_real_process_never_prints_a_traceback() -> None:
    """A few error cases through a real interpreter: stderr has the diagnostic and no traceback."""
    errors = GOLDEN / "errors"
    for name in ERROR_SAMPLES:
        extra = ["-D", "T=4", "-D", "T=5"] if name == "define_conflict.arch" else []
        proc = subprocess.run([sys.executable, "-m", "irc.cli", "compile", name, *extra], cwd=errors,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode in (1, 2), (name, proc.stderr)
        assert "Traceback" not in proc.stderr, name
        assert proc.stderr.strip(), name
        assert proc.stdout == ""


def test_output_to_a_pipe_writes_through_it(tmp_path: Path, irc_cli) -> None:
    """-o onto a device or a pipe writes into it; replacing it with a file would destroy it."""
    import threading

    small = tmp_path / "m.arch"
    small.write_text("model m(B) { input x: f32[B, 4]\n output y = relu(x) }\n", encoding="utf-8")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text(encoding="utf-8")))
    reader.start()
    r = irc_cli(["compile", str(small), "-o", str(fifo)])
    reader.join(timeout=30)
    assert r.rc == 0, r.err
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert received and "relu" in received[0]
