"""Decompose and fusion passes: golden IR before and after each rewrite, the rewrite checked
numerically against the unfused graph, and parameters and FLOPs unchanged by lowering."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest

from irc.analysis.flops import node_cost
from irc.analysis.params import count_params
from irc.backends.numpy_ref import run_graph
from irc.graph import Graph
from irc.ops import OPS
from irc.passes import PASSES
from irc.pipeline import load_graph, run_passes
from irc.printer import print_graph
from irc.runtime.init import init_weights
from irc.runtime.inputs import random_inputs

HERE = Path(__file__).resolve().parent
PASS_CASES = sorted((HERE / "golden" / "passes").glob("*.arch"))
ROOT = HERE.parent

# what each fusion must produce (so a rule that silently stops firing fails here)
FUSED_OP = {"fuse-attention": "sdpa", "fuse-add-norm": "add_norm", "fuse-linear-act": "gemm",
            "fuse-swiglu": "gemm_glu", "fuse-qkv": "gemm_multi", "fold-bn": "conv2d_bn"}


def _passes(case: Path) -> list[str]:
    args = shlex.split(next(line[len("# args:"):] for line in case.read_text().splitlines()
                            if line.startswith("# args:")))
    return args[args.index("--passes") + 1].split(",")


def _flops(graph: Graph) -> int:
    types = graph.value_types()
    return sum(node_cost(n, [types[v] for v in n.inputs]).total for n in graph.nodes)


@pytest.mark.parametrize("case", PASS_CASES, ids=lambda p: p.stem)
def test_pass_golden_after(case: Path, golden, golden_case) -> None:
    run = golden_case(case, expected_exit=0)
    assert run.result.rc == 0, run.result.err
    golden.check(case.with_suffix(".ir"), run.result.out)


@pytest.mark.parametrize("case", PASS_CASES, ids=lambda p: p.stem)
def test_pass_golden_before(case: Path, golden) -> None:
    """The IR the last pass of the case receives."""
    graph = load_graph(case)
    graph = run_passes(graph, _passes(case)[:-1])
    golden.check(case.with_suffix(".before.ir"), print_graph(graph, with_loc=False))


def _bind(graph: Graph) -> dict[str, int]:
    sizes = {"B": 2, "T": 7, "S": 5}
    return {s: sizes.get(s, 3) for s in graph.symbols}


@pytest.mark.parametrize("case", PASS_CASES, ids=lambda p: p.stem)
def test_rewrite_matches_unfused_numerically(case: Path) -> None:
    symbolic = load_graph(case)
    graph = load_graph(case, _bind(symbolic))
    passes = _passes(case)
    rewritten = run_passes(graph, passes)
    weights = init_weights(graph, seed=1)
    inputs = random_inputs(graph, seed=2)
    ref = run_graph(graph, weights, inputs, dtype=np.float64)
    out = run_graph(rewritten, weights, inputs, dtype=np.float64)
    for label in ref:
        err = np.max(np.abs(out[label] - ref[label])) / np.max(np.abs(ref[label]))
        assert err < 1e-12, (label, err)
    fused = FUSED_OP.get(passes[-1])
    if fused and "broadcast" not in case.stem:
        assert any(n.op == fused for n in rewritten.nodes), f"{passes[-1]} did not fire on {case.name}"


def test_broadcasting_add_is_not_fused() -> None:
    graph = run_passes(load_graph(HERE / "golden" / "passes" / "add_norm_broadcast.arch"), ["fuse-add-norm"])
    assert not any(n.op == "add_norm" for n in graph.nodes)


def test_every_fusion_pass_has_a_golden_case() -> None:
    covered = {p for case in PASS_CASES for p in _passes(case)}
    for name in [*FUSED_OP, "decompose", "fuse"]:
        assert name in PASSES
        assert name in covered, f"no golden case runs pass {name}"


SMALL = {
    "gpt2_small": {"B": 2, "T": 6, "layers": 2},
    "bert_base": {"B": 2, "T": 6, "layers": 2},
    "llama2_7b": {"B": 1, "T": 6, "layers": 1, "d": 64, "heads": 4, "vocab": 50, "ff": 96},
    "mistral_7b": {"B": 1, "T": 6, "layers": 1, "d": 64, "heads": 4, "kv_heads": 2, "vocab": 50, "ff": 96},
    "t5_small": {"B": 1, "S": 5, "T": 4, "layers": 2},
    "mlp": {"B": 2},
    "lstm_lm": {"B": 2, "T": 5},
    "resnet18": {"B": 1, "H": 32, "W": 32},
    "vgg16": {"B": 1, "H": 32, "W": 32},
    "mixtral_8x7b": {"B": 1, "T": 6, "layers": 1, "d": 64, "heads": 4, "kv_heads": 2, "vocab": 50, "ff": 32,
                     "experts": 4},
    "deepseek_v2_lite": {"B": 1, "T": 6, "layers": 2, "d": 64, "heads": 4, "vocab": 50, "kv_lora": 16, "rope_dim": 8,
                         "nope_dim": 8, "v_dim": 12, "dense_ff": 48, "expert_ff": 16, "experts": 6, "top_k": 2},
    "digits_cnn": {"B": 2},
    "byte_lm": {"B": 2, "T": 8},
}


@pytest.mark.parametrize("model", sorted(SMALL))
def test_lowering_keeps_params_and_flops(model: str) -> None:
    graph = load_graph(ROOT / "models" / f"{model}.arch", SMALL[model])
    lowered = PASSES["decompose"](graph)
    fused = PASSES["fuse"](graph)
    assert count_params(lowered) == count_params(graph) == count_params(fused)
    assert _flops(fused) == _flops(graph)
    if not any(OPS[n.op].has("attention") and n.attrs.get("causal") for n in graph.nodes):
        # unfused causal attention computes the whole T×S square; everything else agrees exactly
        assert _flops(lowered) == _flops(graph)


@pytest.mark.parametrize("model", ["gpt2_small", "mistral_7b", "t5_small", "bert_base"])
def test_fused_model_matches_reference(model: str) -> None:
    graph = load_graph(ROOT / "models" / f"{model}.arch", SMALL[model])
    fused = PASSES["fuse"](graph)
    assert any(n.op == "sdpa" for n in fused.nodes)
    weights = init_weights(graph, seed=3)
    inputs = random_inputs(graph, seed=4)
    ref = run_graph(graph, weights, inputs, dtype=np.float64)
    out = run_graph(fused, weights, inputs, dtype=np.float64)
    for label in ref:
        assert np.allclose(out[label], ref[label], rtol=1e-10, atol=1e-12), label


def test_fused_ir_round_trips() -> None:
    from irc.ir_parser import parse_ir

    graph = PASSES["fuse"](load_graph(ROOT / "models" / "mistral_7b.arch", SMALL["mistral_7b"]))
    text = print_graph(graph)
    assert print_graph(PASSES["shape-infer"](parse_ir(text))) == text
