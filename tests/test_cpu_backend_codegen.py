"""The generated module: deterministic text, names from the model kept as data, clear errors."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from backend_cases import (
    SMALL,
    assert_run_checks_its_arguments,
    emitted_elsewhere,
    hostile_graph,
    mystery_op_graph,
    names_only_in_strings_and_comments,
    run_under_evil_names,
)
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph, emit_source
from irc.diagnostics import IrcError
from irc.ir_parser import parse_ir
from irc.passes import PASSES

_ = cpu_cache


def test_emit_is_deterministic_across_processes():
    graph = build(SMALL, B=2, T=5)
    text = emit_source(graph)
    assert text == emit_source(graph)
    for seed in ("1", "2"):
        assert emitted_elsewhere("cpu", seed) == text


def test_generated_module_is_readable_python():
    text = emit_source(build(SMALL, B=2, T=5))
    tree = ast.parse(text)
    kernels = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("k_")]
    # one kernel per distinct configuration: the two layernorms share one
    # (the head: 10 rows of x stream the weight, gemm_stream.py)
    assert kernels == ["k_embedding", "k_layernorm", "k_attention_causal", "k_add_flat", "k_gemm_stream10_none"]
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name.startswith("k_"):
            assert ast.unparse(f.decorator_list[0]).startswith("njit(cache=True")
    assert "def run(weights, inputs, buffers=None):" in text
    assert max(len(line) for line in text.splitlines()) <= 125
    assert "# %h = add %x, %attention" in text  # each step says which node it runs


def test_hostile_names_only_reach_string_constants():
    described = names_only_in_strings_and_comments(emit_source, r"\s*#[A-Za-z0-9_.,:=%@()\[\] +\-*/?']*")
    assert len(described) == 3  # one comment per node, reduced to a strict character set


def test_names_with_newlines_and_quotes_built_in_python(tmp_path, cpu_cache):
    """A graph from another frontend may hold any string; newlines included."""
    # the same shape of code as under plain names, and it runs: same numbers under the hostile names
    got, want = run_under_evil_names(emit_source, lambda g: compile_graph(g, cache_dir=cpu_cache),
                                     build(SMALL, B=2, T=5))
    assert_matches({"logits": got}, {"logits": want})
    assert not (Path.cwd() / "CANARY").exists() and not (tmp_path / "CANARY").exists()


def test_hostile_ir_compiles_and_runs(tmp_path, cpu_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graph = hostile_graph()
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights, inputs = random_weights(graph), random_inputs(graph)
    assert sorted(compiled.weight_shapes) == sorted(weights)
    got = compiled.run(weights, inputs)
    assert_matches(got, reference(graph, weights, inputs))
    assert sorted(got) == ["breakpoint", "exec"]
    assert not (tmp_path / "CANARY").exists()


def test_non_finite_attributes_never_reach_generated_code():
    """inf and nan are refused where an attribute is read (a float32 number is required), so no kernel is
    ever written with one; the largest float32 is still spelled as a literal that parses back."""
    for bad in ("scalar=inf", "scalar=nan", "scalar=-inf"):
        with pytest.raises(IrcError, match="float32 number"):
            PASSES["shape-infer"](parse_ir(f"graph @m() {{\n  %x = input : f32[1,2,4]\n"
                                            f"  %y = mul %x {{{bad}}} : f32[1,2,4]\n  output y = %y\n}}\n"))
    ir = ("graph @m() {\n  %x = input : f32[1,2,4]\n  %y = mul %x {scalar=3.4028234663852886e+38} : f32[1,2,4]\n"
          "  %a = attention %x {heads=1, rope=true, rope_theta=1e+38} : f32[1,2,4]\n"
          "  output y = %y\n  output a = %a\n}\n")
    text = emit_source(PASSES["shape-infer"](parse_ir(ir)))
    assert "3.4028234663852886e+38" in text and "1e+38" in text
    ast.parse(text)


def test_unbound_sizes_are_an_error_naming_them():
    graph = build(SMALL)
    with pytest.raises(IrcError, match=r"unbound sizes \(B, T\).*-D"):
        emit_source(graph)


def test_an_op_without_a_kernel_is_an_error_at_its_node():
    with pytest.raises(IrcError, match="no kernel for op 'fused_mystery'") as info:
        emit_source(mystery_op_graph())
    assert info.value.loc is not None and info.value.loc.line == 2


def test_run_checks_weights_and_inputs(cpu_cache):
    graph = build(SMALL, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    w, x = random_weights(graph), random_inputs(graph)
    assert_run_checks_its_arguments(compiled, w, x)  # a missing weight, an input's shape and dtype
    with pytest.raises(IrcError, match=r"weight 'emb.weight' has shape \[8, 13\], the model expects \[13, 8\]"):
        compiled.run({**w, "emb.weight": w["emb.weight"].T}, x)
    with pytest.raises(IrcError, match=r"unknown input 'ids'"):
        compiled.run(w, {**x, "ids": x["tokens"]})
    # float64 weights are accepted and converted: same result as float32
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    assert np.array_equal(compiled.run(w64, x)["logits"], compiled.run(w, x)["logits"])


def test_cli_emits_the_module(tmp_path, irc_cli):
    src = tmp_path / "small.arch"
    src.write_text(SMALL)
    out = tmp_path / "kernels.py"
    result = irc_cli(["compile", str(src), "-D", "B=2", "-D", "T=5", "--emit", "numba", "-o", str(out)])
    assert result.rc == 0, result.err
    assert out.read_text() == emit_source(build(SMALL, B=2, T=5))


def test_profile_times_every_op(cpu_cache):
    """The line tracer gives each node's time to its op; results are unchanged by it."""
    graph = build(SMALL, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    w, x = random_weights(graph), random_inputs(graph)
    plain = compiled.run(w, x)
    compiled.profile = {}
    profiled = compiled.run(w, x)
    assert np.array_equal(plain["logits"], profiled["logits"])
    ops = {n.op for n in graph.nodes if n.op != "input"}
    assert ops <= set(compiled.profile) and all(t >= 0 for t in compiled.profile.values())
    assert set(compiled.node_profile) - {-1} <= set(range(len(graph.nodes)))
    compiled.profile = None
    assert np.array_equal(compiled.run(w, x)["logits"], plain["logits"])


def test_read_only_arrays_are_accepted(cpu_cache):
    graph = build(SMALL, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    w, x = random_weights(graph), random_inputs(graph)
    frozen = {k: v.copy() for k, v in w.items()}
    for v in frozen.values():
        v.flags.writeable = False  # as from a memory-mapped file
    tokens = x["tokens"].copy()
    tokens.flags.writeable = False
    assert np.array_equal(compiled.run(frozen, {"tokens": tokens})["logits"], compiled.run(w, x)["logits"])
