"""One rule for unbound sizes, -D numbers, --profile's warm-up and median, the cache message,
files that are not models, and --help (issue 19, items 12 to 16)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from irc import backends
from irc.runtime import cli as run_cli

SEQ = "model s(B, T) {\n  const eps = 1e-5\n  input x: f32[B, T, 8]\n  output y = layernorm(x, eps=eps)\n}\n"


@pytest.fixture
def seq(tmp_path: Path) -> Path:
    path = tmp_path / "s.arch"
    path.write_text(SEQ)
    return path


def test_run_and_compile_emit_use_the_defaults_analyze_uses(seq: Path, irc_cli) -> None:
    note = ("irc: note: unbound sizes take their defaults: B=1 (default batch), T=1,024 (default sequence); "
            "bind them with -D\n")
    r = irc_cli(["run", str(seq)])
    assert (r.rc, r.err) == (0, note)
    assert "f32[1,1024,8]" in r.out
    r = irc_cli(["compile", str(seq), "--emit", "numba"])
    assert (r.rc, r.err) == (0, note)
    assert "def run(" in r.out
    ir = irc_cli(["compile", str(seq)])  # the IR keeps its sizes symbolic
    assert ir.rc == 0 and "f32[B,T,8]" in ir.out and ir.err == ""
    analyze = irc_cli(["analyze", str(seq), "--json"])
    assert analyze.rc == 0 and '"T"' in analyze.out and "1024" in analyze.out


def test_d_takes_decimals_for_constants_and_k_for_sizes(seq: Path, irc_cli) -> None:
    r = irc_cli(["compile", str(seq), "-D", "eps=1e-6", "-D", "T=4k"])
    assert r.rc == 0, r.err
    assert "eps=1e-06" in r.out and "f32[B,4096,8]" in r.out
    r = irc_cli(["compile", str(seq), "-D", "T=1.5"])
    assert r.rc == 1 and "a dimension must be an integer or a symbol, got the number 1.5" in r.err
    r = irc_cli(["compile", str(seq), "-D", "T=-3"])
    assert r.rc == 2 and "-D T: a size must be positive, got -3" in r.err
    r = irc_cli(["compile", str(seq), "-D", "eps=1e-x"])
    assert r.rc == 2 and "is not a number" in r.err


class _Counting:
    """A backend that counts its runs and reports a per-op profile, the way the cpu backend does."""

    runs = 0

    def __init__(self, graph):
        self.graph, self.profile, self.stats = graph, None, type("S", (), {"compiled": 0})()

    def run(self, weights, inputs):
        from irc.backends.numpy_ref import run_graph

        type(self).runs += 1
        if self.profile is not None:
            self.profile["layernorm"] = self.profile.get("layernorm", 0.0) + 0.001 * type(self).runs
        return run_graph(self.graph, weights, inputs)


def test_profile_warms_up_and_reports_the_median(seq: Path, irc_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    _Counting.runs = 0
    monkeypatch.setitem(backends.BACKENDS, "counting", backends.Backend("counting", lambda g, progress=None:
                                                                        _Counting(g)))
    r = irc_cli(["run", str(seq), "-D", "T=4", "--backend", "counting", "--profile", "--warmup", "2",
                 "--repeat", "3"])
    assert r.rc == 0, r.err
    assert _Counting.runs == 5
    assert re.search(r"^run: median [\d.]+ ms of 3 runs \(min [\d.]+, max [\d.]+\) after 2 warm-up runs$", r.out, re.M)
    assert "profile (counting backend, median of 3 runs):" in r.out
    row = re.search(r"^\s+layernorm\s+([\d.]+)\s+100.0%$", r.out, re.M)
    assert row and float(row.group(1)) == pytest.approx(4.0, abs=1e-3)  # runs 3, 4, 5 took 3, 4, 5 ms
    _Counting.runs = 0
    assert irc_cli(["run", str(seq), "-D", "T=4", "--backend", "counting", "--profile"]).rc == 0
    assert _Counting.runs == run_cli.PROFILE_WARMUP + run_cli.PROFILE_REPEAT
    assert irc_cli(["run", str(seq), "--repeat", "0"]).rc == 2


def test_a_cached_compile_does_not_claim_to_be_the_first(seq: Path, irc_cli, monkeypatch) -> None:
    import time

    def slow_cached(graph, progress=None):
        time.sleep(0.05)
        return _Counting(graph)  # stats.compiled == 0: every kernel came from the cache

    monkeypatch.setitem(backends.BACKENDS, "cached", backends.Backend("cached", slow_cached))
    monkeypatch.setattr(run_cli, "PROGRESS_AFTER_S", 0.01)
    r = irc_cli(["run", str(seq), "-D", "T=2", "--backend", "cached"])
    assert r.rc == 0, r.err
    assert "first compile" not in r.err
    assert re.search(r"loaded from the kernel cache in [\d.]+ s", r.err)


@pytest.mark.parametrize("name, data, says", [
    ("config.json", b'{\n  "architectures": ["GPT2LMHeadModel"],\n  "model_type": "gpt2"\n}\n',
     "is a Hugging Face config, not an .arch model: turn it into one with 'irc import config.json -o model.arch'"),
    ("model.onnx", b"\x08\x09\x12\x07pytorch\x1a\x052.5.0:\xb6\x01\n\x00\x01\x02\x03\x80\x81",
     "is an ONNX model"),
    ("weights.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{}              ", "is a .safetensors weights file"),
    ("model.pt", None, "is a PyTorch checkpoint (torch.save)"),
    ("blob.bin", bytes(range(256)) * 4, "is a binary file, not an .arch model"),
])
def test_files_that_are_not_models_are_named(tmp_path: Path, irc_cli, name: str, data: bytes | None,
                                             says: str) -> None:
    path = tmp_path / name
    if data is None:  # the layout torch.save writes: a zip with archive/data.pkl
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
            z.writestr("archive/version", b"3\n")
    else:
        path.write_bytes(data)
    r = irc_cli(["compile", name], cwd=tmp_path)
    assert (r.rc, r.out) == (1, "")
    assert r.err.startswith(f"irc: error: '{name}' {says}"), r.err
    assert len(r.err) < 400 and "\x00" not in r.err


def test_the_onnx_file_torch_writes_is_recognised(tmp_path: Path) -> None:
    import torch

    from irc.file_kinds import ONNX, file_kind

    torch.onnx.export(torch.nn.Linear(2, 3), (torch.zeros(1, 2),), str(tmp_path / "lin.onnx"), dynamo=False)
    renamed = tmp_path / "lin.bin"  # by content, whatever the name
    renamed.write_bytes((tmp_path / "lin.onnx").read_bytes())
    assert file_kind(tmp_path / "lin.onnx") == ONNX and file_kind(renamed) == ONNX


def test_help_states_defaults_and_examples(irc_cli) -> None:
    top = irc_cli(["--help"]).out
    assert "cheat sheet" not in top and "architecture lints (docs/lints.md)" in top
    assert "Unbound sizes: analyze, lint, run and compile --emit numba|cuda all use one rule" in top
    run = irc_cli(["run", "--help"]).out
    for text in ("(default 1e-4)", "--warmup N", "--repeat N", "seed of the random weights and inputs (default 0)",
                 "read the model input NAME from an .npy file", "examples:\n  irc run "):
        assert text in run, text
    assert "examples:\n  irc compile " in irc_cli(["compile", "--help"]).out
