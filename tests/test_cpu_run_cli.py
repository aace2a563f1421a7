"""``irc run --backend cpu``: the fused graph by default, ``--passes`` / ``--no-fuse`` to choose,
``--check`` against the reference on the graph as written, ``--profile`` per op and per node.

The run parser's ``--passes`` and ``--no-fuse`` flags belong to irc/cli.py; these tests drive
``irc.runtime.cli.cmd_run`` with the namespace that parser makes, flags included."""

from __future__ import annotations

import argparse
import re

import pytest

from irc.diagnostics import UsageError
from irc.runtime import cli as run_cli

GPT = """
use "transformer.arch"
model tiny_gpt(B, T) {
  input tokens: i32[B, T]
  wte = embedding(30, 16)
  x = repeat(2) pre_ln_decoder(wte(tokens), heads=2, ff=32, act=gelu_tanh)
  output logits = unembed(layernorm(x), tied=wte)
}
"""


def _args(path, **extra) -> argparse.Namespace:
    base = dict(file=str(path), defines=["B=2", "T=5"], model=None, backend="cpu", weights=None, inputs=[], seed=0,
                check=True, tolerance=None, profile=False, max_memory=None, output=None)
    return argparse.Namespace(**{**base, **extra})


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("IRC_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny_gpt.arch"
    path.write_text(GPT)
    return path


def test_passes_default_to_fuse_for_generated_backends():
    ns = argparse.Namespace
    assert run_cli.backend_passes(ns(backend="cpu")) == ["fuse", "fold-bn"]
    assert run_cli.backend_passes(ns(backend="numpy")) == []
    assert run_cli.backend_passes(ns(backend="cpu", no_fuse=True)) == []
    assert run_cli.backend_passes(ns(backend="cpu", passes="decompose, fuse-attention")) == [
        "decompose", "fuse-attention"]
    with pytest.raises(UsageError, match="cannot be combined"):
        run_cli.backend_passes(ns(backend="cpu", passes="fuse", no_fuse=True))


def test_cpu_runs_the_fused_graph_and_checks_it(model, capsys):
    assert run_cli.cmd_run(_args(model)) == 0
    out = capsys.readouterr().out
    assert re.search(r"passes: fuse, fold-bn \(\d+ nodes -> \d+\)", out)
    assert re.search(r"logits: \d\.\d+e-\d+  ok", out)


@pytest.mark.parametrize("extra", [{"no_fuse": True}, {"passes": "decompose,fuse-attention"}])
def test_passes_can_be_chosen(model, capsys, extra):
    assert run_cli.cmd_run(_args(model, **extra)) == 0
    out = capsys.readouterr().out
    assert ("passes:" in out) == ("passes" in extra)
    assert "  ok" in out


def test_profile_per_op_and_per_node(model, capsys):
    assert run_cli.cmd_run(_args(model, profile=True, check=False)) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\s+(\w+)\s+([\d.]+)\s+([\d.]+)%$", out, re.M)
    ops = {op for op, _, _ in rows}
    assert {"sdpa", "add_norm", "gemm", "embedding", "total"} <= ops, ops
    assert sum(float(s) for op, _, s in rows if op != "total") == pytest.approx(100, abs=0.5)
    nodes = re.findall(r"^\s+%(\S+) \((\w+)\)\s+([\d.]+) ms\s+([\d.]+)%$", out, re.M)
    assert len(nodes) == run_cli.TOP_NODES
    assert {op for _, op, _, _ in nodes} <= ops
    times = [float(ms) for _, _, ms, _ in nodes]
    assert times == sorted(times, reverse=True)


def test_unknown_pass_is_a_usage_error(model):
    with pytest.raises(UsageError, match="unknown pass 'fuse-everything'"):
        run_cli.cmd_run(_args(model, passes="fuse-everything"))
