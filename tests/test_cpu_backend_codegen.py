"""The generated module: deterministic text, names from the model kept as data, clear errors."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cpu_backend_helpers import assert_matches, build, cpu_cache, random_inputs, random_weights, reference

from irc.backends.cpu import compile_graph, emit_source
from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ir_parser import parse_ir
from irc.passes import PASSES

_ = cpu_cache

SMALL = """
model small(B, T) {
  input tokens: i32[B, T]
  emb = embedding(13, 8)
  x = emb(tokens)
  h = x + attention(layernorm(x), heads=2, causal=true)
  output logits = unembed(layernorm(h), tied=emb)
}
"""

# IR text may carry any string in scope(...) and weights(...); value names may be Python
# builtins. None of it may become code.
HOSTILE_IR = "\n".join([
    "// irc IR v1",
    "graph @__import__(B) bind(B=2) {",
    "  %__import__ = input : f32[2,4]",
    r"""  %os.system = linear %__import__ {out=3, bias=true} : f32[2,3] scope("x\")\u2028import os #")"""
    r""" weights("w'];__import__('os').system('touch CANARY');x=['")""",
    r"""  %eval = layernorm %os.system {eps=1e-05, affine=true, bias=true} : f32[2,3]"""
    r""" scope("\"\"\"; open('CANARY','w') #")""",
    r"""  %exec = relu %eval : f32[2,3] scope("\\'; raise SystemExit #")""",
    "  output exec = %exec",
    "  output breakpoint = %__import__",
    "}",
    "",
])


def _typed(graph: Graph) -> Graph:
    return PASSES["shape-infer"](graph)


def test_emit_is_deterministic_across_processes():
    graph = build(SMALL, B=2, T=5)
    text = emit_source(graph)
    assert text == emit_source(graph)
    code = ("import sys; from irc.runtime.graphs import graph_from_source; from irc.backends.cpu import emit_source; "
            "sys.stdout.write(emit_source(graph_from_source(sys.stdin.read(), {'B': 2, 'T': 5})))")
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        other = subprocess.run([sys.executable, "-c", code], input=SMALL, capture_output=True, text=True, env=env,
                               check=True).stdout
        assert other == text


def test_generated_module_is_readable_python():
    text = emit_source(build(SMALL, B=2, T=5))
    tree = ast.parse(text)
    kernels = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("k_")]
    # one kernel per distinct configuration: the two layernorms share one
    assert kernels == ["k_embedding", "k_layernorm", "k_attention_causal", "k_add_flat", "k_gemm_none"]
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name.startswith("k_"):
            assert ast.unparse(f.decorator_list[0]).startswith("njit(cache=True")
    assert "def run(weights, inputs):" in text
    assert max(len(line) for line in text.splitlines()) <= 125
    assert "# %h = add %x, %attention" in text  # each step says which node it runs


def _rename(graph: Graph, name) -> Graph:
    """The same graph with every name from the model passed through ``name``."""
    out = graph.copy()
    out.name = name(graph.name)
    out.nodes = [Node(n.op, [name(v) for v in n.inputs], [name(v) for v in n.outputs], _attrs(n.attrs, name),
                      name(n.scope), None if n.weights is None else name(n.weights), n.loc, list(n.types))
                 for n in graph.nodes]
    out.outputs = [(name(label), name(v)) for label, v in graph.outputs]
    return out


def _attrs(attrs: dict, name) -> dict:
    return {k: name(v) if k == "tied" and v is not None else v for k, v in attrs.items()}


def _shape_of_code(text: str) -> str:
    """The module's AST with every string constant blanked: what the code does, not what it names."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = "S"
    return ast.dump(tree)


def test_hostile_names_only_reach_string_constants():
    hostile = _typed(parse_ir(HOSTILE_IR))
    names = sorted({v for n in hostile.nodes for v in n.outputs} | {n.scope for n in hostile.nodes}
                   | {n.weights for n in hostile.nodes if n.weights} | {label for label, _ in hostile.outputs})
    plain = {s: f"name{i}" for i, s in enumerate(names)}
    plain[hostile.name] = "g"
    benign = _rename(hostile, lambda s: plain.get(s, s))
    text = emit_source(hostile)
    assert _shape_of_code(text) == _shape_of_code(emit_source(benign))
    described = [line for line in text.splitlines() if line.lstrip().startswith("# %")]
    assert len(described) == 3  # one comment per node, reduced to a strict character set
    for line in described + [text.splitlines()[0]]:
        assert re.fullmatch(r"\s*#[A-Za-z0-9_.,:=%@()\[\] +\-*/?']*", line.replace("irc's", "irc")), line


def test_names_with_newlines_and_quotes_built_in_python(tmp_path, cpu_cache):
    """A graph from another frontend may hold any string; newlines included."""
    base = build(SMALL, B=2, T=5)
    evil = ["\n__import__('os').system('touch CANARY')\n#", "'''", '"""', "\\", "\x00", "é\u2028\r"]
    benign = _rename(base, lambda s: f"n_{s}")
    hostile = _rename(base, lambda s: f"{evil[len(s) % len(evil)]}{s}")
    assert _shape_of_code(emit_source(hostile)) == _shape_of_code(emit_source(benign))
    # and it runs: same numbers under the hostile names
    compiled = compile_graph(hostile, cache_dir=cpu_cache)
    w = random_weights(base)
    x = random_inputs(base)
    got = compiled.run({_rename_key(k, evil): v for k, v in w.items()},
                       {f"{evil[len('tokens') % len(evil)]}tokens": x["tokens"]})
    want = reference(base, w, x)
    label = f"{evil[len('logits') % len(evil)]}logits"
    assert_matches({"logits": got[label]}, want)
    assert not (Path.cwd() / "CANARY").exists() and not (tmp_path / "CANARY").exists()


def _rename_key(key: str, evil: list[str]) -> str:
    scope, _, param = key.rpartition(".")
    return f"{evil[len(scope) % len(evil)]}{scope}.{param}"


def test_hostile_ir_compiles_and_runs(tmp_path, cpu_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graph = _typed(parse_ir(HOSTILE_IR))
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    weights, inputs = random_weights(graph), random_inputs(graph)
    assert sorted(compiled.weight_shapes) == sorted(weights)
    got = compiled.run(weights, inputs)
    assert_matches(got, reference(graph, weights, inputs))
    assert sorted(got) == ["breakpoint", "exec"]
    assert not (tmp_path / "CANARY").exists()


def test_non_finite_attributes_are_spelled_safely():
    ir = ("graph @m() {\n  %x = input : f32[1,2,4]\n  %y = mul %x {scalar=inf} : f32[1,2,4]\n"
          "  %z = add %y {scalar=nan} : f32[1,2,4]\n"
          "  %a = attention %x {heads=1, rope=true, rope_theta=inf} : f32[1,2,4]\n"
          "  output y = %z\n  output a = %a\n}\n")
    text = emit_source(_typed(parse_ir(ir)))
    assert "np.float32(np.inf)" in text and "np.float32(np.nan)" in text and "theta=float('inf')" in text
    ast.parse(text)


def test_unbound_sizes_are_an_error_naming_them():
    graph = build(SMALL)
    with pytest.raises(IrcError, match=r"unbound sizes \(B, T\).*-D"):
        emit_source(graph)


def test_an_op_without_a_kernel_is_an_error_at_its_node():
    graph = build("model m() { input x: f32[2, 4]\n output y = relu(x) }")
    graph.nodes[1].op = "fused_mystery"
    with pytest.raises(IrcError, match="no kernel for op 'fused_mystery'") as info:
        emit_source(graph)
    assert info.value.loc is not None and info.value.loc.line == 2


def test_run_checks_weights_and_inputs(cpu_cache):
    graph = build(SMALL, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    w, x = random_weights(graph), random_inputs(graph)
    with pytest.raises(IrcError, match=r"missing weight 'emb.weight' \(expected shape \[13, 8\]\)"):
        compiled.run({k: v for k, v in w.items() if k != "emb.weight"}, x)
    with pytest.raises(IrcError, match=r"weight 'emb.weight' has shape \[8, 13\], the model expects \[13, 8\]"):
        compiled.run({**w, "emb.weight": w["emb.weight"].T}, x)
    with pytest.raises(IrcError, match=r"input 'tokens' has shape \[2, 4\], the model expects \[2, 5\]"):
        compiled.run(w, {"tokens": x["tokens"][:, :4]})
    with pytest.raises(IrcError, match=r"input 'tokens' must hold integers"):
        compiled.run(w, {"tokens": x["tokens"].astype(np.float32)})
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
