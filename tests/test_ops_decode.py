"""The decode ops against PyTorch: cached_attention run as a prefill and then step by step equals
torch's full causal attention (GQA, RoPE, a sliding window) over the whole sequence; positional_at
equals a torch table lookup at the offset; parameter counts equal torch's layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from irc.backends.numpy_ref.decode import cached_attention, positional_at
from irc.graph import Node
from irc.ops import OPS
from irc.types import TensorType

ORACLE_OPS = frozenset({"cached_attention", "positional_at", "cross_kv", "cached_cross_attention",
                        "rel_position_bias_at"})
B, D, H, G, HD = 2, 32, 4, 2, 8


def _rope_torch(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    t, hd = x.shape[-2:]
    freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * freq
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    rot = torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1)
    return x * cos + rot * sin


def _torch_attention(x, w, rope: bool, window: int | None) -> np.ndarray:
    xt = torch.from_numpy(x)
    t = x.shape[1]

    def heads(y, n):
        return y.reshape(B, t, n, HD).transpose(1, 2)

    q = heads(F.linear(xt, torch.from_numpy(w["wq"])), H)
    k = heads(F.linear(xt, torch.from_numpy(w["wk"])), G)
    v = heads(F.linear(xt, torch.from_numpy(w["wv"])), G)
    if rope:
        q, k = _rope_torch(q), _rope_torch(k)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    mask = j <= i
    if window is not None:
        mask &= j > i - window
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return F.linear(out.transpose(1, 2).reshape(B, t, H * HD), torch.from_numpy(w["wo"])).numpy()


@pytest.mark.parametrize("rope,window", [(False, None), (True, None), (True, 3)])
def test_prefill_then_steps_equal_full_attention(rope: bool, window: int | None) -> None:
    rng = np.random.default_rng(0)
    t, prefill = 9, 5
    x = rng.standard_normal((B, t, D))
    w = {k: rng.standard_normal(s) * 0.3 for k, s in (("wq", (H * HD, D)), ("wk", (G * HD, D)),
                                                        ("wv", (G * HD, D)), ("wo", (D, H * HD)))}
    want = _torch_attention(x, w, rope, window)
    slots = window or t
    node = Node("cached_attention", [], [], {"heads": H, "kv_heads": G, "rope": rope, "window": window})
    kc, vc = np.zeros((B, G, slots, HD)), np.zeros((B, G, slots, HD))
    got, kc2, vc2 = cached_attention(node, [x[:, :prefill], kc, vc, np.zeros(B, np.int64), np.full(B, prefill)], w)
    assert kc2 is kc and vc2 is vc  # updated in place
    outs = [got]
    for p in range(prefill, t):
        outs.append(cached_attention(node, [x[:, p: p + 1], kc, vc, np.full(B, p), np.ones(B, np.int64)], w)[0])
    np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-9, atol=1e-9)


def test_positional_at_reads_the_table_at_the_offset() -> None:
    rng = np.random.default_rng(1)
    table = rng.standard_normal((16, D))
    x = rng.standard_normal((B, 3, D))
    pos = np.array([0, 7])
    node = Node("positional_at", [], [], {"kind": "learned", "max_len": 16})
    got = positional_at(node, [x, pos], {"weight": table})
    emb = torch.nn.Embedding.from_pretrained(torch.from_numpy(table))
    want = x + emb(torch.from_numpy(pos[:, None] + np.arange(3))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_parameter_counts_equal_torch() -> None:
    attrs = {"heads": H, "kv_heads": G, "scale": None, "head_dim": None, "bias": True, "rope": True,
             "rope_theta": None, "window": None}
    x = TensorType("f32", (B, 5, D))
    shapes = OPS["cached_attention"].param_shapes(attrs, [x])
    torch_layers = [torch.nn.Linear(D, H * HD), torch.nn.Linear(D, G * HD), torch.nn.Linear(D, G * HD),
                    torch.nn.Linear(H * HD, D)]
    assert sum(int(np.prod(s)) for s in shapes.values()) == sum(p.numel() for m in torch_layers
                                                                 for p in m.parameters())
    pos = OPS["positional_at"].param_shapes({"kind": "learned", "max_len": 16, "layout": None}, [x])
    assert pos == {"weight": (16, D)} == {"weight": tuple(torch.nn.Embedding(16, D).weight.shape)}


# -- an encoder-decoder (T5) against Hugging Face: cross_kv, cached_cross_attention and
# rel_position_bias_at decode exactly what T5ForConditionalGeneration computes ----------------------

SOURCE = [5, 17, 3, 44, 12, 9, 30, 2]
NEW = 10


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    import transformers
    from conftest import run_irc

    root = tmp_path_factory.mktemp("t5")
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, feed_forward_proj="relu")).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in sorted(hf.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    hf.save_pretrained(root / "ckpt")
    assert run_irc(["import", str(root / "ckpt"), "-o", str(root / "t5.arch")]).rc == 0
    return hf, root


def _t5_decoder(root, cache_dtype: str = "f32", ctx: int = NEW + 1):
    from irc.pipeline import load_graph
    from irc.runtime.generate import Decoder
    from irc.runtime.weights import load_for_model

    arch = root / "t5.arch"
    sizes = {"B": 1, "S": len(SOURCE)}
    weights = load_for_model(root / "ckpt", load_graph(arch, {**sizes, "T": 1}), arch)
    return Decoder(load_graph(arch, sizes), weights, 1, ctx, cache_dtype, np.float64)


def test_t5_greedy_and_every_step_equal_hf(t5) -> None:
    from irc.runtime.compare import rel_error
    from irc.runtime.generate import generate

    hf, root = t5
    src = torch.tensor([SOURCE])
    with torch.no_grad():
        want = hf.generate(src, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, decoder_start_token_id=0,
                           pad_token_id=0, eos_token_id=None)[0].tolist()
    got = generate(_t5_decoder(root), [[0]], NEW, keep_logits=True, encoder={"tokens": np.array([SOURCE])})
    assert [0] + got.tokens[0] == want
    for i, logits in enumerate(got.step_logits):
        with torch.no_grad():
            full = hf(input_ids=src, decoder_input_ids=torch.tensor([want[: i + 1]])).logits[0, -1].numpy()
        assert rel_error(logits[0], full) < 1e-5, (i, rel_error(logits[0], full))


@pytest.mark.parametrize("cache_dtype", ["f32", "f16"])
def test_t5_cross_cache_bytes_equal_irc_analyze(t5, cache_dtype: str) -> None:
    import json

    from conftest import run_irc

    from irc.runtime.generate import generate

    _, root = t5
    d = _t5_decoder(root, cache_dtype, ctx=12)
    generate(d, [[0]], 2, encoder={"tokens": np.array([SOURCE])})
    assert all(c.dtype == (np.float16 if cache_dtype == "f16" else np.float32) for c in d.cross.values())
    result = run_irc(["analyze", str(root / "t5.arch"), "--json", "--kv-dtype", cache_dtype, "--context", "12",
                      "-D", "B=1", "-D", f"S={len(SOURCE)}", "-D", "T=12"])
    totals = json.loads(result.out)["totals"]
    assert d.cross_bytes == totals["kv_cache_cross_bytes"]
    assert d.cache_bytes == totals["kv_cache_bytes"]  # the decoder's self-attention, 12 positions


def test_t5_cli_matches_hf(t5) -> None:
    from conftest import run_irc

    hf, root = t5
    with torch.no_grad():
        want = hf.generate(torch.tensor([SOURCE]), do_sample=False, max_new_tokens=6, min_new_tokens=6,
                           decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)[0, 1:].tolist()
    result = run_irc(["generate", str(root / "t5.arch"), "--weights", str(root / "ckpt"), "--encoder-tokens",
                      ",".join(map(str, SOURCE)), "--prompt-tokens", "0", "--max-new", "6"])
    assert result.rc == 0, result.err
    assert [int(t) for t in result.out.split()] == want
