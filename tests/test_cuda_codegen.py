"""The generated CUDA module: deterministic text, names from the model kept as data, the
buffer plan, the cache, and the command line with and without a GPU."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from backend_cases import (
    SMALL,
    assert_run_checks_its_arguments,
    build,
    emitted_elsewhere,
    mystery_op_graph,
    names_only_in_strings_and_comments,
    run_under_evil_names,
)
from test_cuda_helpers import check_graph, cuda_cache, random_inputs, random_weights

from irc.backends.cuda import compile_graph, emit_source
from irc.backends.cuda.device import REDUCE_ENV, SIM_ENV, reduction_path
from irc.diagnostics import IrcError

_ = cuda_cache
ROOT = Path(__file__).resolve().parents[1]


def _env(simulator: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SIM_ENV}
    if simulator:
        env[SIM_ENV] = "1"
    return env


def test_emit_is_deterministic_and_needs_no_gpu():
    """The same text twice, and in fresh processes with other hash seeds and no simulator."""
    graph = build(SMALL, B=2, T=5)
    text = emit_source(graph)
    assert text == emit_source(graph)
    for seed in ("1", "2"):
        assert emitted_elsewhere("cuda", seed, _env(False)) == text


def test_generated_module_is_readable_python():
    text = emit_source(build(SMALL, B=2, T=5))
    tree = ast.parse(text)
    kernels = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("k_")]
    assert kernels == [
        "k_embedding",
        "k_layernorm_g_b_d8__shuffle", "k_layernorm_g_b_d8__shared",  # both reduction paths
        "k_gemm_nt_32x32x8_split3",  # Q, K, V: one GEMM over the merged weights, three results
        "k_copy4",  # the head transposes: [B, T, H, d] <-> [B, H, T, d]
        "k_sdpa_d4_16x8x4x8_causal__shuffle", "k_sdpa_d4_16x8x4x8_causal__shared",
        "k_gemm_nt_32x32x8",
        "k_add_layernorm_g_b_nosum_d8__shuffle", "k_add_layernorm_g_b_nosum_d8__shared",  # fused; sum unread
    ]
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name.startswith("k_"):
            assert ast.unparse(f.decorator_list[0]) == "kernel_jit()"  # cuda.jit(cache=True)
    for name in ("prepare", "views", "load", "launch", "run", "use_reduction", "check_ids"):
        assert f"def {name}(" in text
    assert "# %h, %layernorm.1 = add_norm %x, %attention" in text  # each step says which node it runs
    assert "shfl_xor_sync" in text.split("def k_layernorm_g_b_d8__shared")[0]
    assert "shfl_xor_sync" not in text.split("def k_layernorm_g_b_d8__shared")[1].split("def ")[0]


def test_hostile_names_only_reach_string_constants():
    # comment lines reduced to a strict character set
    described = names_only_in_strings_and_comments(emit_source, r"\s*#[A-Za-z0-9_.,:=%@()\[\] +\-*/?]*")
    assert len(described) == 3  # one comment per node that runs a kernel (params need none)


def test_names_with_newlines_and_quotes_run(tmp_path, cuda_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got, want = run_under_evil_names(emit_source, lambda g: compile_graph(g, cache_dir=cuda_cache),
                                     build(SMALL, B=2, T=5))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not (tmp_path / "CANARY").exists()


def test_slots_are_reused_across_a_deep_chain():
    """Twelve LayerNorms in a row need three buffers, not thirteen: values die and free their slot,
    except the input's, which stays the input's for the whole pass (so a pass can run again)."""
    body = "\n".join(f"  x{i + 1} = layernorm(x{i})" for i in range(12))
    graph = build(f"model m() {{\n  input x0: f32[4, 64]\n{body}\n  output y = x12\n}}")
    text = emit_source(graph)
    slots = ast.literal_eval(re.search(r"^SLOTS = (.*?)  #", text, re.M).group(1))
    assert slots == (("f32", 256), ("f32", 256), ("f32", 256))  # the input's, then two that alternate


def test_cache_reuses_and_repairs_the_module(cuda_cache, tmp_path):
    graph = build("model m() { input x: f32[2, 8]\n output y = relu(x) }")
    first = compile_graph(graph, cache_dir=tmp_path)
    assert first.rebuilt
    again = compile_graph(graph, cache_dir=tmp_path)
    assert not again.rebuilt and again.path == first.path
    first.path.write_text(first.path.read_text().replace("def run(", "def run_(", 1))
    repaired = compile_graph(graph, cache_dir=tmp_path)
    assert repaired.rebuilt and "def run(" in repaired.path.read_text()
    check_graph(repaired, graph)


def test_profile_times_each_kernel(cuda_cache):
    graph = build("model m() { input x: f32[2, 8]\n output y = softmax(relu(x)) }")
    compiled = compile_graph(graph, cache_dir=cuda_cache)
    compiled.profile = {}
    compiled.run({}, random_inputs(graph))
    assert {"k_relu", "k_softmax_d8", "driver (input copies, launches)"} <= set(compiled.profile)


def test_run_checks_weights_and_inputs(cuda_cache):
    graph = build(SMALL, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cuda_cache)
    assert_run_checks_its_arguments(compiled, random_weights(graph), random_inputs(graph))


def test_unbound_sizes_and_unknown_ops_are_errors_at_the_node():
    with pytest.raises(IrcError, match=r"unbound sizes \(B, T\).*-D"):
        emit_source(build(SMALL))
    with pytest.raises(IrcError, match="unknown op 'fused_mystery'") as info:
        emit_source(mystery_op_graph())
    assert info.value.loc is not None and info.value.loc.line == 2


def test_reduction_path_override(monkeypatch):
    monkeypatch.setenv(REDUCE_ENV, "shuffle")
    assert reduction_path() == "shuffle"
    monkeypatch.setenv(REDUCE_ENV, "warp")
    with pytest.raises(IrcError, match="expected one of shuffle, shared"):
        reduction_path()


MODEL = "model tiny(B) {\n  input x: f32[B, 8]\n  output y = layernorm(linear(x, 4))\n}\n"


def _irc(args: list[str], simulator: bool, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**_env(simulator), "IRC_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "irc.cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_cli_without_a_gpu_says_so(tmp_path):
    (tmp_path / "tiny.arch").write_text(MODEL)
    done = _irc(["run", "tiny.arch", "-D", "B=2", "--backend", "cuda"], False, tmp_path)
    assert done.returncode == 1
    assert "needs an NVIDIA GPU" in done.stderr and f"{SIM_ENV}=1" in done.stderr
    assert "Traceback" not in done.stderr
    shown = _irc(["compile", "tiny.arch", "-D", "B=2", "--emit", "cuda"], False, tmp_path)
    assert shown.returncode == 0 and "def k_gemm_nt_32x32x8_biascol(" in shown.stdout


def test_cli_runs_and_checks_in_the_simulator(tmp_path):
    (tmp_path / "tiny.arch").write_text(MODEL)
    done = _irc(["run", "tiny.arch", "-D", "B=2", "--backend", "cuda", "--check"], True, tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"  y: \d\.\d+e-\d\d  ok", done.stdout), done.stdout
