"""attention's per-projection biases (``bias=qvo``: Whisper; ``bias=qkv``: Qwen2) against PyTorch
and Hugging Face: the parameters each layout declares (counted against the HF modules), the bias
adds in the FLOP count, the numpy reference, the cpu backend (unfused and fused) and the cuda
backend in the simulator on the same weights, and the QKV fusion that only merges bias-free
projections.

Tolerances: float32 runs within 1e-5 of PyTorch in float64 (max |ours − torch| / max |torch|),
the float64 reference within 1e-10.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_cpu_backend_helpers import cpu_cache
from test_cuda_helpers import cuda_cache
from transformers import Qwen2Config, WhisperConfig
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2RotaryEmbedding
from transformers.models.whisper.modeling_whisper import WhisperAttention

from irc.analysis.flops import node_cost
from irc.diagnostics import IrcError
from irc.pipeline import run_passes
from irc.printer import print_graph
from irc.runtime.compare import reference_errors, rel_error
from irc.runtime.graphs import graph_from_source

ORACLE_OPS = frozenset({"attention"})
_ = cpu_cache, cuda_cache
TOL32, TOL64 = 1e-5, 1e-10
D, HEADS, T = 16, 4, 5


def _graph(bias: str, extra: str = "", d: int = D, t: int = T):
    return graph_from_source(f"model m() {{ input x: f32[2, {t}, {d}]\n"
                             f" output y = attention(x, heads={HEADS}{extra}, bias={bias}) }}")


def _param_shapes(graph) -> dict[str, tuple]:
    node = next(n for n in graph.nodes if n.op == "attention")
    from irc.ops import get_op

    types = graph.value_types()
    return get_op("attention").param_shapes(node.attrs, [types[v] for v in node.inputs])


@pytest.mark.parametrize("bias,keys", [
    ("qvo", {"bq", "bv", "bo"}), ("qkv", {"bq", "bk", "bv"}), ("o", {"bo"}), ("vkq", {"bq", "bk", "bv"}),
    ("true", {"bq", "bk", "bv", "bo"}), ("false", set()), ("qkvo", {"bq", "bk", "bv", "bo"}),
])
def test_bias_letters_declare_exactly_those_biases(bias, keys):
    shapes = _param_shapes(_graph(bias))
    assert {k for k in shapes if k.startswith("b")} == keys
    assert {"wq", "wk", "wv", "wo"} <= set(shapes)


def test_dumps_print_canonical_letters_and_true_false_as_before():
    text = print_graph(graph_from_source(
        "model m() { input x: f32[1, 3, 16]\n a = attention(x, heads=4, bias=ovq)\n"
        " b = attention(a, heads=4, bias=qkvo)\n c = attention(b, heads=4)\n"
        " output y = attention(c, heads=4, bias=true) }"))
    assert "bias=qvo" in text  # canonical order
    assert text.count("bias=true") == 2 and text.count("bias=false") == 1  # all four letters is bias=true
    from irc.ir_parser import parse_ir

    assert print_graph(parse_ir(text, "m.ir")) == text


@pytest.mark.parametrize("bad", ["qx", "qq", '""', "1"])
def test_bad_letters_are_refused(bad):
    with pytest.raises(IrcError, match="must be true, false or letters from q, k, v, o"):
        _graph(bad)


def test_whisper_and_qwen2_parameter_counts_match_hugging_face():
    whisper = WhisperAttention(64, 4, bias=True, config=WhisperConfig(d_model=64, encoder_attention_heads=4))
    ours = sum(int(np.prod(s)) for s in _param_shapes(_graph("qvo", d=64)).values())
    assert ours == sum(p.numel() for p in whisper.parameters()) == 4 * 64 * 64 + 3 * 64
    cfg = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    qwen = Qwen2Attention(cfg, 0)
    ours = sum(int(np.prod(s)) for s in _param_shapes(_graph("qkv", ", kv_heads=2", d=64)).values())
    assert ours == sum(p.numel() for p in qwen.parameters()) == 2 * 64 * 64 + 2 * 32 * 64 + 64 + 2 * 32


def _flops(graph) -> int:
    types = graph.value_types()
    node = next(n for n in graph.nodes if n.op == "attention")
    return node_cost(node, [types[v] for v in node.inputs]).total


def test_flops_count_only_the_biased_projections():
    plain = _flops(_graph("false", ", kv_heads=2"))
    for bias, per_token in [("qvo", D + D // 2 + D), ("qkv", D + 2 * (D // 2)), ("true", D + 2 * (D // 2) + D)]:
        extra = _flops(_graph(bias, ", kv_heads=2")) - plain
        assert extra == 2 * T * per_token, bias  # one add per biased output element, batch 2


def _torch_weights(module: torch.nn.Module, names: dict[str, str]) -> dict[str, np.ndarray]:
    state = module.state_dict()
    return {f"y.{ours}": state[theirs].detach().numpy().astype(np.float32) for ours, theirs in names.items()
            if theirs in state}


WHISPER_NAMES = {"wq": "q_proj.weight", "bq": "q_proj.bias", "wk": "k_proj.weight", "wv": "v_proj.weight",
                 "bv": "v_proj.bias", "wo": "out_proj.weight", "bo": "out_proj.bias"}
QWEN_NAMES = {"wq": "q_proj.weight", "bq": "q_proj.bias", "wk": "k_proj.weight", "bk": "k_proj.bias",
              "wv": "v_proj.weight", "bv": "v_proj.bias", "wo": "o_proj.weight"}


def _randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)  # biases too: HF starts them at zero
    return module.double().eval()


def _whisper_case():
    cfg = WhisperConfig(d_model=D, encoder_attention_heads=HEADS)
    cfg._attn_implementation = "eager"
    whisper = _randomised(WhisperAttention(D, HEADS, bias=True, config=cfg), 1)
    x = np.random.default_rng(2).standard_normal((2, T, D)).astype(np.float32)
    with torch.no_grad():
        want = whisper(torch.from_numpy(x.astype(np.float64)))[0].numpy()
    return _graph("qvo"), _torch_weights(whisper, WHISPER_NAMES), {"x": x}, want


def _qwen_case():
    cfg = Qwen2Config(hidden_size=D, num_attention_heads=HEADS, num_key_value_heads=2, head_dim=D // HEADS,
                      rope_theta=10000.0)
    cfg._attn_implementation = "eager"
    qwen = _randomised(Qwen2Attention(cfg, 0), 3)
    x = np.random.default_rng(4).standard_normal((2, T, D)).astype(np.float32)
    xt = torch.from_numpy(x.astype(np.float64))
    pos = torch.arange(T)[None].expand(2, T)
    cos, sin = Qwen2RotaryEmbedding(cfg)(xt, pos)
    with torch.no_grad():  # no mask: every query sees every key (irc's causal=false)
        want = qwen(xt, (cos.double(), sin.double()), None)[0].numpy()
    return _graph("qkv", ", kv_heads=2, rope=true"), _torch_weights(qwen, QWEN_NAMES), {"x": x}, want


CASES = {"whisper": _whisper_case, "qwen2": _qwen_case}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_matches_hugging_face(case):
    graph, weights, inputs, want = CASES[case]()
    (err32, err64), = reference_errors(graph, weights, inputs, {"y": want}).values()
    tol64 = 1e-6 if case == "qwen2" else TOL64  # HF builds its RoPE frequencies in float32
    assert err32 <= TOL32 and err64 <= tol64, (err32, err64)
    # the check can fail: the same layer without its biases is far off (a bias on k alone would not
    # be: it adds q·b_k to every score of a query, which softmax cancels, and why Whisper drops it)
    wrong_graph = _graph("false", ", kv_heads=2, rope=true" if case == "qwen2" else "")
    wrong = {k: v for k, v in weights.items() if not k.startswith("y.b")}
    (bad32, _), = reference_errors(wrong_graph, wrong, inputs, {"y": want}).values()
    assert bad32 > 1e-2


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("fused", [False, True])
def test_cpu_matches_hugging_face(case, fused, cpu_cache):
    from irc.backends.cpu import compile_graph

    graph, weights, inputs, want = CASES[case]()
    if fused:
        graph = run_passes(graph, ["fuse"])
    got = compile_graph(graph, cache_dir=cpu_cache).run(weights, inputs)["y"]
    assert rel_error(got, want) <= TOL32


@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_simulator_matches_hugging_face(case, cuda_cache):
    from irc.backends.cuda import compile_graph

    graph, weights, inputs, want = CASES[case]()
    got = compile_graph(graph, cache_dir=cuda_cache).run(weights, inputs)["y"]
    assert rel_error(got, want) <= TOL32


@pytest.mark.parametrize("bias,merged", [("false", True), ("o", True), ("qvo", False), ("qkv", False),
                                         ("true", False)])
def test_qkv_fusion_merges_only_bias_free_projections(bias, merged):
    fused = run_passes(_graph(bias), ["decompose", "fuse-qkv"])
    ops = [n.op for n in fused.nodes]
    assert ("gemm_multi" in ops) == merged, ops
    biased = [n for n in fused.nodes if n.op == "gemm" and len(n.inputs) == 3]
    assert len(biased) == len(_param_shapes(_graph(bias))) - 4  # one biased gemm per bias vector


def test_layer_level_kernels_read_partial_biases(cpu_cache, cuda_cache):
    """A layer with its own T5 table stays whole through fusion: the cpu and cuda attention
    kernels then read bq, bv, bo and no bk themselves (against the float64 reference)."""
    from test_cuda_helpers import check_graph

    from irc.backends.cpu import compile_graph as cpu_compile
    from irc.backends.cuda import compile_graph as cuda_compile
    from irc.backends.numpy_ref import run_graph

    graph = _graph("qvo", ", rel_buckets=8, causal=true")
    assert {k for k in _param_shapes(graph) if k.startswith("b")} == {"bq", "bv", "bo"}
    assert [n.op for n in run_passes(graph, ["fuse"]).nodes].count("attention") == 1
    check_graph(cuda_compile(graph, cache_dir=cuda_cache), graph)
    rng = np.random.default_rng(5)
    weights = {f"y.{k}": (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in _param_shapes(graph).items()}
    inputs = {"x": rng.standard_normal((2, T, D)).astype(np.float32)}
    want = run_graph(graph, weights, inputs, np.float64)["y"]
    assert rel_error(cpu_compile(graph, cache_dir=cpu_cache).run(weights, inputs)["y"], want) <= TOL32
    no_bias = {k: v for k, v in weights.items() if not k.startswith("y.b")}  # the biases matter
    assert rel_error(run_graph(_graph("false", ", rel_buckets=8, causal=true"), no_bias, inputs)["y"], want) > 1e-2
