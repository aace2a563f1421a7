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
from test_cuda_helpers import check_graph, cuda_cache, random_inputs, random_weights, reference

from irc.backends.cuda import compile_graph, emit_source
from irc.backends.cuda.device import REDUCE_ENV, SIM_ENV, reduction_path
from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ir_parser import parse_ir
from irc.passes import PASSES
from irc.runtime.graphs import graph_from_source

_ = cuda_cache
ROOT = Path(__file__).resolve().parents[1]

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


def _env(simulator: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SIM_ENV}
    if simulator:
        env[SIM_ENV] = "1"
    return env


def _build(source: str, **bindings: int) -> Graph:
    return graph_from_source(source, bindings or None)


def test_emit_is_deterministic_and_needs_no_gpu():
    """The same text twice, and in fresh processes with other hash seeds and no simulator."""
    graph = _build(SMALL, B=2, T=5)
    text = emit_source(graph)
    assert text == emit_source(graph)
    code = ("import sys; from irc.runtime.graphs import graph_from_source; from irc.backends.cuda import emit_source; "
            "sys.stdout.write(emit_source(graph_from_source(sys.stdin.read(), {'B': 2, 'T': 5})))")
    for seed in ("1", "2"):
        other = subprocess.run([sys.executable, "-c", code], input=SMALL, capture_output=True, text=True,
                               env={**_env(False), "PYTHONHASHSEED": seed}, check=True).stdout
        assert other == text


def test_generated_module_is_readable_python():
    text = emit_source(_build(SMALL, B=2, T=5))
    tree = ast.parse(text)
    kernels = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("k_")]
    assert kernels == [
        "k_embedding",
        "k_layernorm_g_b_d8__shuffle", "k_layernorm_g_b_d8__shared",  # both reduction paths
        "k_gemm_nt_32x32x8_split3",  # Q, K, V: one GEMM over the merged weights, three results
        "k_copy4",  # the head transposes: [B, T, H, d] <-> [B, H, T, d]
        "k_sdpa_d4_8x8x8x8_causal__shuffle", "k_sdpa_d4_8x8x8x8_causal__shared",
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


def _rename(graph: Graph, name) -> Graph:
    out = graph.copy()
    out.name = name(graph.name)
    out.nodes = [Node(n.op, [name(v) for v in n.inputs], [name(v) for v in n.outputs],
                      {k: name(v) if k == "tied" and v is not None else v for k, v in n.attrs.items()},
                      name(n.scope), None if n.weights is None else name(n.weights), n.loc, list(n.types))
                 for n in graph.nodes]
    out.outputs = [(name(label), name(v)) for label, v in graph.outputs]
    return out


def _shape_of_code(text: str) -> str:
    """The module's AST with every string constant blanked: what the code does, not what it names."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = "S"
    return ast.dump(tree)


def test_hostile_names_only_reach_string_constants():
    hostile = PASSES["shape-infer"](parse_ir(HOSTILE_IR))
    names = sorted({v for n in hostile.nodes for v in n.outputs} | {n.scope for n in hostile.nodes}
                   | {n.weights for n in hostile.nodes if n.weights} | {label for label, _ in hostile.outputs})
    plain = {s: f"name{i}" for i, s in enumerate(names)}
    plain[hostile.name] = "g"
    benign = _rename(hostile, lambda s: plain.get(s, s))
    text = emit_source(hostile)
    assert _shape_of_code(text) == _shape_of_code(emit_source(benign))
    described = [line for line in text.splitlines() if line.lstrip().startswith("# %")]
    assert len(described) == 3  # one comment per node that runs a kernel (params need none)
    for line in described + [text.splitlines()[0]]:  # reduced to a strict character set
        assert re.fullmatch(r"\s*#[A-Za-z0-9_.,:=%@()\[\] +\-*/?]*", line.replace("irc's", "irc")), line


def test_names_with_newlines_and_quotes_run(tmp_path, cuda_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = _build(SMALL, B=2, T=5)
    evil = ["\n__import__('os').system('touch CANARY')\n#", "'''", '"""', "\\", "\x00", "é\u2028\r"]
    benign = _rename(base, lambda s: f"n_{s}")
    hostile = _rename(base, lambda s: f"{evil[len(s) % len(evil)]}{s}")
    assert _shape_of_code(emit_source(hostile)) == _shape_of_code(emit_source(benign))
    compiled = compile_graph(hostile, cache_dir=cuda_cache)
    w, x = random_weights(base), random_inputs(base)

    def key(k: str) -> str:
        scope, _, param = k.rpartition(".")
        return f"{evil[len(scope) % len(evil)]}{scope}.{param}"

    got = compiled.run({key(k): v for k, v in w.items()}, {f"{evil[len('tokens') % len(evil)]}tokens": x["tokens"]})
    want = reference(base, w, x)["logits"]
    np.testing.assert_allclose(got[f"{evil[len('logits') % len(evil)]}logits"], want, rtol=1e-4, atol=1e-5)
    assert not (tmp_path / "CANARY").exists()


def test_slots_are_reused_across_a_deep_chain():
    """Twelve LayerNorms in a row need two buffers, not thirteen: values die and free their slot."""
    body = "\n".join(f"  x{i + 1} = layernorm(x{i})" for i in range(12))
    graph = _build(f"model m() {{\n  input x0: f32[4, 64]\n{body}\n  output y = x12\n}}")
    text = emit_source(graph)
    slots = ast.literal_eval(re.search(r"^SLOTS = (.*?)  #", text, re.M).group(1))
    assert slots == (("f32", 256), ("f32", 256))  # two that alternate (the input's, once it is read)


def test_cache_reuses_and_repairs_the_module(cuda_cache, tmp_path):
    graph = _build("model m() { input x: f32[2, 8]\n output y = relu(x) }")
    first = compile_graph(graph, cache_dir=tmp_path)
    assert first.rebuilt
    again = compile_graph(graph, cache_dir=tmp_path)
    assert not again.rebuilt and again.path == first.path
    first.path.write_text(first.path.read_text().replace("def run(", "def run_(", 1))
    repaired = compile_graph(graph, cache_dir=tmp_path)
    assert repaired.rebuilt and "def run(" in repaired.path.read_text()
    check_graph(repaired, graph)


def test_profile_times_each_kernel(cuda_cache):
    graph = _build("model m() { input x: f32[2, 8]\n output y = softmax(relu(x)) }")
    compiled = compile_graph(graph, cache_dir=cuda_cache)
    compiled.profile = {}
    compiled.run({}, random_inputs(graph))
    assert {"k_relu", "k_softmax_d8", "driver (input copies, launches)"} <= set(compiled.profile)


def test_run_checks_weights_and_inputs(cuda_cache):
    graph = _build(SMALL, B=2, T=5)
    compiled = compile_graph(graph, cache_dir=cuda_cache)
    w, x = random_weights(graph), random_inputs(graph)
    with pytest.raises(IrcError, match=r"missing weight 'emb.weight' \(expected shape \[13, 8\]\)"):
        compiled.run({k: v for k, v in w.items() if k != "emb.weight"}, x)
    with pytest.raises(IrcError, match=r"input 'tokens' has shape \[2, 4\], the model expects \[2, 5\]"):
        compiled.run(w, {"tokens": x["tokens"][:, :4]})
    with pytest.raises(IrcError, match=r"input 'tokens' must hold integers"):
        compiled.run(w, {"tokens": x["tokens"].astype(np.float32)})


def test_unbound_sizes_and_unknown_ops_are_errors_at_the_node():
    with pytest.raises(IrcError, match=r"unbound sizes \(B, T\).*-D"):
        emit_source(_build(SMALL))
    graph = _build("model m() { input x: f32[2, 4]\n output y = relu(x) }")
    graph.nodes[1].op = "fused_mystery"
    with pytest.raises(IrcError, match="unknown op 'fused_mystery'") as info:
        emit_source(graph)
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
