"""An encoder-decoder batch of sources of different lengths: right-padded, with the padding mask on
every encoder attention and cross-attention (decode_graph's ``source_mask``). Each row's greedy output
equals Hugging Face's ``generate`` on that source alone, and HF's batched generate with its
``attention_mask``; on the numpy reference and the CPU backend, from the API and from the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from conftest import run_irc

from irc.pipeline import load_graph
from irc.runtime.generate import Decoder, generate
from irc.runtime.weights import load_for_model

SOURCES = [[5, 17, 3, 44, 12, 9, 30, 2], [40, 2, 7], [8, 61, 22, 5, 1]]
NEW = 8


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5pad")
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, feed_forward_proj="relu")).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off HF's init, where a wrong mapping would not show
        for _, p in sorted(hf.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    hf.save_pretrained(root / "ckpt")
    assert run_irc(["import", str(root / "ckpt"), "-o", str(root / "t5.arch")]).rc == 0
    return hf, root


def _hf(hf, sources: list[list[int]], new: int) -> list[list[int]]:
    longest = max(map(len, sources))
    ids = torch.tensor([s + [0] * (longest - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sources])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                          decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    return out[:, 1:].tolist()


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_sources_of_different_lengths_equal_hf(t5, backend: str) -> None:
    hf, root = t5
    alone = [_hf(hf, [s], NEW)[0] for s in SOURCES]
    assert _hf(hf, SOURCES, NEW) == alone  # HF's own batched run agrees with its rows alone
    arch = root / "t5.arch"
    sizes = {"B": len(SOURCES), "S": max(map(len, SOURCES))}
    weights = load_for_model(root / "ckpt", load_graph(arch, {**sizes, "T": 1}), arch)
    d = Decoder(load_graph(arch, sizes), weights, len(SOURCES), NEW + 1, backend=backend, source_mask=True)
    padded = np.zeros((len(SOURCES), sizes["S"]), np.int64)
    for b, s in enumerate(SOURCES):
        padded[b, : len(s)] = s
    got = generate(d, [[0]] * len(SOURCES), NEW, encoder={"tokens": padded},
                   encoder_lengths=[len(s) for s in SOURCES])
    assert got.tokens == alone
    padded[1, 3:] = 77  # the padding's ids do not matter
    again = generate(Decoder(load_graph(arch, sizes), weights, len(SOURCES), NEW + 1, backend=backend,
                             source_mask=True),
                     [[0]] * len(SOURCES), NEW, encoder={"tokens": padded}, encoder_lengths=[len(s) for s in SOURCES])
    assert again.tokens == alone
    unmasked = generate(Decoder(load_graph(arch, sizes), weights, len(SOURCES), NEW + 1, backend=backend),
                        [[0]] * len(SOURCES), NEW, encoder={"tokens": padded})
    assert unmasked.tokens[0] == alone[0] and unmasked.tokens[1:] != alone[1:]  # the mask is what made them equal


def test_cli_batch_of_sources(t5) -> None:
    hf, root = t5
    argv = ["generate", str(root / "t5.arch"), "--weights", str(root / "ckpt"), "--max-new", str(NEW)]
    for s in SOURCES:
        argv += ["--encoder-tokens", ",".join(map(str, s)), "--prompt-tokens", "0"]
    result = run_irc(argv)
    assert result.rc == 0, result.err
    rows = [[int(t) for t in line.split("] ", 1)[1].split()] for line in result.out.splitlines()]
    assert rows == _hf(hf, SOURCES, NEW)
