"""irc generate and its KV-cache runtime against Hugging Face transformers.

Random-weight GPT-2, Llama (GQA) and Mistral (a window shorter than the sequence) checkpoints are
made here with transformers, perturbed off HF's init, saved and imported with ``irc import``:
- greedy generation equals HF ``generate(do_sample=False)`` token for token, one prompt and a
  batch of prompts of different lengths (each row against HF on that prompt alone);
- every step's logits equal HF's full forward pass over the same prefix within 1e-5;
- the cache's measured bytes equal ``irc analyze --json``'s KV-cache figure;
- the cache is one buffer per layer for the whole generation (updated in place).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_irc
from generate_models import NAMES, NEW, PROMPT, hf_greedy, imported

from irc.pipeline import load_graph
from irc.runtime.compare import rel_error
from irc.runtime.generate import Decoder, Sampling, generate, pick
from irc.runtime.weights import load_for_model


@pytest.fixture(scope="module", params=NAMES)
def model(request, tmp_path_factory):
    return imported(request.param, 64, tmp_path_factory.mktemp(request.param))


def _decoder(root: Path, name: str, batch: int, ctx: int, cache_dtype: str = "f32", dtype=np.float64) -> Decoder:
    arch = root / f"{name}.arch"
    weights = load_for_model(root / "ckpt", load_graph(arch, {"B": batch, "T": 1}), arch)
    return Decoder(load_graph(arch, {"B": batch}), weights, batch, ctx, cache_dtype, dtype)


def test_greedy_equals_hf_generate(model) -> None:
    name, hf, root = model
    got = generate(_decoder(root, name, 1, len(PROMPT) + NEW), [PROMPT], NEW)
    assert got.tokens == [hf_greedy(hf, PROMPT, NEW)]
    assert got.prefill_tokens == len(PROMPT) and got.decode_tokens == NEW - 1


def test_batch_of_prompts_of_different_lengths(model) -> None:
    name, hf, root = model
    prompts = [PROMPT, [40, 2], [7, 7, 1, 90, 3, 3, 8, 61, 22, 5]]
    got = generate(_decoder(root, name, 3, 10 + 8, dtype=np.float32), prompts, 8)
    assert got.tokens == [hf_greedy(hf, p, 8) for p in prompts]


def test_every_step_equals_a_full_forward_pass(model) -> None:
    name, hf, root = model
    got = generate(_decoder(root, name, 1, len(PROMPT) + NEW), [PROMPT], NEW, keep_logits=True)
    seq = PROMPT + got.tokens[0]
    assert len(got.step_logits) == NEW
    for i, logits in enumerate(got.step_logits):
        prefix = seq[: len(PROMPT) + i]
        with torch.no_grad():
            want = hf(input_ids=torch.tensor([prefix])).logits[0, -1].numpy()
        assert rel_error(logits[0], want) < 1e-5, (i, rel_error(logits[0], want))


def test_f16_cache_stays_close(model) -> None:
    """An f16 cache rounds the stored keys and values: the logits move by about f16's precision, not more."""
    name, _, root = model
    ref = generate(_decoder(root, name, 1, 19), [PROMPT], NEW, keep_logits=True)
    half = _decoder(root, name, 1, 19, "f16")
    assert all(c.dtype == np.float16 for c in half.caches.values())
    got = generate(half, [PROMPT], NEW, keep_logits=True)
    assert rel_error(got.step_logits[1][0], ref.step_logits[1][0]) < 5e-3


def test_cache_is_updated_in_place(model) -> None:
    name, _, root = model
    d = _decoder(root, name, 1, 19)
    before = {k: id(v) for k, v in d.caches.items()}
    generate(d, [PROMPT], 5)
    assert {k: id(v) for k, v in d.caches.items()} == before
    assert any(np.abs(v).sum() > 0 for v in d.caches.values())
    assert list(d.lengths) == [len(PROMPT) + 4]


@pytest.mark.parametrize("cache_dtype,ctx", [("f16", 20), ("f32", 3), ("f16", 64)])
def test_cache_bytes_equal_irc_analyze(model, cache_dtype, ctx) -> None:
    name, _, root = model
    d = _decoder(root, name, 1, ctx, cache_dtype)
    result = run_irc(["analyze", str(root / f"{name}.arch"), "--json", "--kv-dtype", cache_dtype,
                      "--context", str(ctx), "-D", "B=1", "-D", f"T={ctx}"])
    assert result.rc == 0, result.err
    assert d.cache_bytes == json.loads(result.out)["totals"]["kv_cache_bytes"]


def test_cli_streams_hf_greedy_tokens(model) -> None:
    name, hf, root = model
    result = run_irc(["generate", str(root / f"{name}.arch"), "--weights", str(root / "ckpt"),
                      "--prompt-tokens", ",".join(map(str, PROMPT)), "--max-new", str(NEW)])
    assert result.rc == 0, result.err
    assert [int(t) for t in result.out.split()] == hf_greedy(hf, PROMPT, NEW)
    assert "tokens/s" in result.err and "KV cache" in result.err


# -- sampling, against its definition computed here with NumPy ------------------------------------------

LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 2.5])


def test_greedy_and_sampling_rules() -> None:
    rng = np.random.default_rng(0)
    assert pick(LOGITS, Sampling(), rng) == 3
    assert {pick(LOGITS, Sampling(1.0, top_k=1), rng) for _ in range(20)} == {3}
    assert {pick(LOGITS, Sampling(1.0, top_k=2), rng) for _ in range(200)} == {3, 5}
    p = np.exp(LOGITS - LOGITS.max())
    p /= p.sum()
    # top-p keeps the most likely tokens until their mass reaches p: here the top two (3 and 5)
    assert p[3] < 0.6 < p[3] + p[5]
    assert {pick(LOGITS, Sampling(1.0, top_p=0.6), rng) for _ in range(200)} == {3, 5}
    draws = np.array([pick(LOGITS, Sampling(1.0), rng) for _ in range(4000)])
    freq = np.bincount(draws, minlength=6) / len(draws)
    assert np.abs(freq - p).max() < 0.03


def test_sampling_is_reproducible_from_the_seed(model) -> None:
    name, _, root = model
    s = Sampling(0.9, top_k=20, top_p=0.95, seed=7)
    a = generate(_decoder(root, name, 1, 19), [PROMPT], NEW, s).tokens
    b = generate(_decoder(root, name, 1, 19), [PROMPT], NEW, s).tokens
    c = generate(_decoder(root, name, 1, 19), [PROMPT], NEW, Sampling(0.9, 20, 0.95, seed=8)).tokens
    assert a == b and a != c


def test_stop_token_ends_a_row(model) -> None:
    name, hf, root = model
    want = hf_greedy(hf, PROMPT, NEW)
    stop = want[3]
    got = generate(_decoder(root, name, 1, 19), [PROMPT], NEW, stop=frozenset({stop})).tokens[0]
    assert got == want[: want.index(stop) + 1]


def test_text_prompt_through_a_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<unk>", "the", "cat", "sat", "on", "mat"] + [f"w{i}" for i in range(94)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    argv = ["models/gpt2_small.arch", "-D", "layers=1", "-D", "d=32", "-D", "heads=2", "-D", "vocab=100",
            "--max-new", "4"]
    by_text = run_irc(["generate", *argv, "--prompt", "the cat sat", "--tokenizer", str(tmp_path / "tokenizer.json")])
    by_ids = run_irc(["generate", *argv, "--prompt-tokens", "1,2,3"])
    assert by_text.rc == 0 and by_ids.rc == 0, by_text.err + by_ids.err
    assert [vocab[w] for w in by_text.out.split()] == [int(t) for t in by_ids.out.split()]


@pytest.mark.parametrize("args,message", [
    ([], "give the prompts as --prompt-tokens"),
    (["--prompt", "hi"], "--prompt TEXT needs --tokenizer"),
    (["--prompt-tokens", "1,x"], "expected comma-separated token ids"),
    (["--prompt-tokens", "1", "--top-p", "0"], "--top-p in (0, 1]"),
    (["--prompt-tokens", "1", "-D", "T=4"], "-D B and -D T are set by irc generate"),
    (["--prompt-tokens", "1,100"], "token id 100 is outside the vocabulary [0, 100)"),
])
def test_usage_errors(args, message) -> None:
    result = run_irc(["generate", "models/gpt2_small.arch", "-D", "layers=1", "-D", "d=32", "-D", "heads=2",
                      "-D", "vocab=100", *args])
    assert result.rc == 2 and message in result.err and "Traceback" not in result.err, result.err


def test_a_full_context_is_an_error() -> None:
    result = run_irc(["generate", "models/gpt2_small.arch", "-D", "layers=1", "-D", "d=32", "-D", "heads=2",
                      "-D", "vocab=100", "--prompt-tokens", "1,2,3", "--ctx", "4", "--max-new", "5"])
    assert result.rc == 1 and "the context is full: 5 tokens do not fit in --ctx 4" in result.err, result.err


# -- every decoder in models/ at small bindings: both graphs derive, and each step equals irc's own full
# forward pass (the numpy reference on the model as written) over the same prefix ------------------------

SMALL = {
    "gpt2_small": {"layers": 2, "d": 32, "heads": 4, "vocab": 64},
    "llama2_7b": {"layers": 2, "d": 32, "heads": 4, "vocab": 64, "ff": 48},
    "mistral_7b": {"layers": 2, "d": 32, "heads": 4, "kv_heads": 2, "vocab": 64, "ff": 48, "window": 4},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_models_decode_like_their_full_forward(name: str) -> None:
    from irc.backends.numpy_ref.interpreter import interpret
    from irc.runtime.init import init_weights

    path = Path(__file__).resolve().parents[1] / "models" / f"{name}.arch"
    weights = init_weights(load_graph(path, {**SMALL[name], "B": 1, "T": 1}), seed=3)
    prompt, new = [3, 1, 4, 1, 5, 9], 6
    d = Decoder(load_graph(path, {**SMALL[name], "B": 1}), weights, 1, len(prompt) + new, dtype=np.float64)
    assert {n.op for n in d.step_graph.nodes} >= {"cached_attention"}
    assert "attention" not in {n.op for n in d.step_graph.nodes}
    got = generate(d, [prompt], new, keep_logits=True)
    seq = prompt + got.tokens[0]
    for i, logits in enumerate(got.step_logits):
        prefix = np.array([seq[: len(prompt) + i]])
        full = load_graph(path, {**SMALL[name], "B": 1, "T": prefix.shape[1]})
        want = interpret(full, weights, {"tokens": prefix}, np.float64)["logits"][0, -1]
        assert rel_error(logits[0], want) < 1e-6, (i, rel_error(logits[0], want))  # an f32 cache, f64 compute
