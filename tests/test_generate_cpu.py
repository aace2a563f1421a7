"""irc generate on the CPU backend (Numba kernels of the decode ops) against Hugging Face.

Random-weight GPT-2, Llama (GQA), Mistral (a window of 5 shorter than the sequence, so the rolling
buffer wraps) and T5 checkpoints made here with transformers, imported with ``irc import``:
- greedy generation on the CPU backend equals HF ``generate(do_sample=False)`` token for token, one
  prompt and a batch of prompts of different lengths;
- every step's logits equal HF's full forward pass over the same prefix within 1e-5;
- the caches stay the caller's buffers (the compiled module writes them in place), and a step reads
  only filled slots: every cache starts as NaN, so one read of an unfilled slot would show;
- positions the cache cannot hold are a located error, never a write out of bounds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import run_irc
from generate_models import NAMES, NEW, PROMPT, VOCAB, hf_greedy, imported, perturbed

from irc.diagnostics import IrcError
from irc.pipeline import load_graph
from irc.runtime.compare import rel_error
from irc.runtime.generate import Decoder, generate
from irc.runtime.weights import load_for_model


@pytest.fixture(scope="module", params=NAMES)
def model(request, tmp_path_factory):
    return imported(request.param, 128, tmp_path_factory.mktemp(request.param))


def _decoder(root: Path, name: str, batch: int, ctx: int, backend: str = "cpu") -> Decoder:
    arch = root / f"{name}.arch"
    weights = load_for_model(root / "ckpt", load_graph(arch, {"B": batch, "T": 1}), arch)
    return Decoder(load_graph(arch, {"B": batch}), weights, batch, ctx, backend=backend)


def _poison(d: Decoder) -> None:
    """Every slot NaN before the prefill: a kernel reading a slot no token has filled yields NaN logits."""
    for cache in d.caches.values():
        cache.fill(np.nan)


def test_cpu_greedy_and_every_step_equal_hf(model) -> None:
    name, hf, root = model
    d = _decoder(root, name, 1, len(PROMPT) + NEW)
    _poison(d)
    before = {k: id(v) for k, v in d.caches.items()}
    got = generate(d, [PROMPT], NEW, keep_logits=True)
    assert got.tokens == [hf_greedy(hf, PROMPT, NEW)]
    assert {k: id(v) for k, v in d.caches.items()} == before  # one buffer per cache for the whole generation
    seq = PROMPT + got.tokens[0]
    for i, logits in enumerate(got.step_logits):
        with torch.no_grad():
            want = hf(input_ids=torch.tensor([seq[: len(PROMPT) + i]])).logits[0, -1].numpy()
        assert np.isfinite(logits).all() and rel_error(logits[0], want) < 1e-5, (i, rel_error(logits[0], want))


def test_cpu_batch_of_prompts_of_different_lengths(model) -> None:
    name, hf, root = model
    prompts = [PROMPT, [40, 2], [7, 7, 1, 90, 3, 3, 8, 61, 22, 5]]
    d = _decoder(root, name, 3, 10 + 8)
    _poison(d)
    got = generate(d, prompts, 8)
    assert got.tokens == [hf_greedy(hf, p, 8) for p in prompts]


def test_cpu_equals_the_numpy_reference_on_a_long_prompt(model) -> None:
    """A 100-token prompt: two query tiles and the attention's parallel path (a small model's steps run
    serially), the window's rolling buffer filled by one chunk 20 times its size."""
    name, _, root = model
    prompt = [int(t) for t in np.random.default_rng(2).integers(0, VOCAB, 100)]
    ref = generate(_decoder(root, name, 1, 106, backend="numpy"), [prompt], 6, keep_logits=True)
    d = _decoder(root, name, 1, 106)
    _poison(d)
    got = generate(d, [prompt], 6, keep_logits=True)
    assert got.tokens == ref.tokens
    for mine, want in zip(got.step_logits, ref.step_logits):
        assert rel_error(mine, want) < 1e-5


def test_cpu_cli_streams_hf_greedy_tokens(model) -> None:
    name, hf, root = model
    result = run_irc(["generate", str(root / f"{name}.arch"), "--weights", str(root / "ckpt"), "--backend", "cpu",
                      "--prompt-tokens", ",".join(map(str, PROMPT)), "--max-new", str(NEW)])
    assert result.rc == 0, result.err
    assert [int(t) for t in result.out.split()] == hf_greedy(hf, PROMPT, NEW)
    assert "compiled the prefill and step graphs" in result.err and "tokens/s" in result.err


def test_a_position_the_cache_cannot_hold_is_an_error(model) -> None:
    name, _, root = model
    d = _decoder(root, name, 1, 8)
    d.prepare([PROMPT])
    step = d._compile(d.step_graph, 1)
    feeds = {d.token_input: np.array([[1]]), "pos": np.array([8]), "valid": np.array([1]), **d.caches}
    if name == "mistral":  # a rolling buffer takes any position; a negative one is still refused
        feeds["pos"] = np.array([-1])
    with pytest.raises(IrcError, match=r"cached_attention '.*': row 0 holds pos (8|-1) and writes valid 1"):
        step.run(d.weights, feeds)


def test_f16_caches_stay_on_the_reference() -> None:
    graph = load_graph(Path(__file__).resolve().parents[1] / "models" / "gpt2_small.arch",
                       {"layers": 1, "d": 32, "heads": 2, "vocab": 64, "B": 1})
    with pytest.raises(IrcError, match="the cpu backend keeps KV caches in f32"):
        Decoder(graph, {}, 1, 8, "f16", backend="cpu")
    result = run_irc(["generate", "models/gpt2_small.arch", "-D", "layers=1", "-D", "d=32", "-D", "heads=2",
                      "-D", "vocab=64", "--prompt-tokens", "1,2", "--backend", "cpu", "--cache-dtype", "f16"])
    assert result.rc == 2 and "--cache-dtype f16 needs --backend numpy" in result.err, result.err
    result = run_irc(["generate", "models/gpt2_small.arch", "-D", "layers=1", "-D", "d=32", "-D", "heads=2",
                      "-D", "vocab=64", "--prompt-tokens", "1,2", "--backend", "cuda"])
    assert result.rc == 2 and "irc generate runs on numpy or cpu" in result.err, result.err


# -- an encoder-decoder: cross_kv, cached_cross_attention and rel_position_bias_at on the CPU backend ------

SOURCE = [5, 17, 3, 44, 12, 9, 30, 2]


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5")
    torch.manual_seed(0)
    hf = perturbed(transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, feed_forward_proj="relu")))
    hf.save_pretrained(root / "ckpt")
    assert run_irc(["import", str(root / "ckpt"), "-o", str(root / "t5.arch")]).rc == 0
    return hf, root


def test_t5_on_cpu_equals_hf(t5) -> None:
    hf, root = t5
    new = 10
    arch = root / "t5.arch"
    sizes = {"B": 1, "S": len(SOURCE)}
    weights = load_for_model(root / "ckpt", load_graph(arch, {**sizes, "T": 1}), arch)
    d = Decoder(load_graph(arch, sizes), weights, 1, new + 1, backend="cpu")
    _poison(d)
    src = torch.tensor([SOURCE])
    with torch.no_grad():
        want = hf.generate(src, do_sample=False, max_new_tokens=new, min_new_tokens=new, decoder_start_token_id=0,
                           pad_token_id=0, eos_token_id=None)[0].tolist()
    got = generate(d, [[0]], new, keep_logits=True, encoder={"tokens": np.array([SOURCE])})
    assert [0] + got.tokens[0] == want
    for i, logits in enumerate(got.step_logits):
        with torch.no_grad():
            full = hf(input_ids=src, decoder_input_ids=torch.tensor([want[: i + 1]])).logits[0, -1].numpy()
        assert rel_error(logits[0], full) < 1e-5, (i, rel_error(logits[0], full))


def test_only_the_step_graph_packs_its_dense_weights(model) -> None:
    """The prefill runs once a generation: its dense layers read the weights as given; the step graph, which every
    token runs, reads its MLP and head from packed panels (gemm_stream.py), derived by prepare() before any timing."""
    name, hf, root = model
    d = _decoder(root, name, 1, len(PROMPT) + NEW)
    d.prepare([PROMPT])
    prefill, step = (d._compiled[(g.name, t)] for g, t in ((d.prefill_graph, len(PROMPT)), (d.step_graph, 1)))
    assert not any("gemm_panels" in key for key in prefill.module.DERIVED)
    assert any("gemm_panels" in key for key in step.module.DERIVED)
    assert step._prepared is not None and all(key in step._prepared[2] for key in step.module.DERIVED)
    got = generate(d, [PROMPT], NEW)
    assert got.tokens == [hf_greedy(hf, PROMPT, NEW)]
