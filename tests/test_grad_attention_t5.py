"""An attention layer with its own T5 table (``attention(..., rel_buckets=)``) against Hugging Face's
T5Attention: forward and every gradient, after the decompose pass lowers the table to rel_position_bias
over the layer's own key (``<layer>.rel_bias.weight``).

Encoder self-attention (bidirectional buckets), decoder self-attention (causal, one-directional buckets)
and a second additive bias on top of the table; sequences long enough to reach the log-spaced buckets
and the max_distance clip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.models.t5.modeling_t5 import T5Attention

from irc.backends.numpy_ref import run_graph
from irc.passes.decompose import GRAD_RULES
from irc.passes.grad import attach_loss, grad_label
from irc.passes.rewrite import apply_rules
from irc.pipeline import load_graph, run_passes

D, HEADS, BUCKETS, MAX_DISTANCE = 32, 4, 16, 20
B, T = 2, 30


def _hf(causal: bool) -> T5Attention:
    config = transformers.T5Config(d_model=D, d_kv=D // HEADS, num_heads=HEADS, relative_attention_num_buckets=BUCKETS,
                                   relative_attention_max_distance=MAX_DISTANCE, dropout_rate=0.0,
                                   is_decoder=causal)
    config._attn_implementation = "eager"
    return T5Attention(config, has_relative_attention_bias=True, is_causal=causal).double().eval()


def _graph(tmp_path: Path, causal: bool, extra_bias: bool):
    bias = ", attn_bias=m" if extra_bias else ""
    extra = "  input m: f32[B, 1, T, T]\n" if extra_bias else ""
    src = (f"model t5a(B, T) {{\n  input x: f32[B, T, {D}]\n{extra}"
           f"  a = attention(x, heads={HEADS}, scale=1.0, causal={'true' if causal else 'false'}, "
           f"rel_buckets={BUCKETS}, rel_max_distance={MAX_DISTANCE}{bias})\n  output y = a\n}}\n")
    path = tmp_path / "t5a.arch"
    path.write_text(src)
    return load_graph(path, {"B": B, "T": T})


@pytest.mark.parametrize("causal,extra_bias", [(False, False), (True, False), (False, True)])
def test_attention_with_its_own_table_against_t5attention(tmp_path: Path, causal: bool, extra_bias: bool) -> None:
    torch.manual_seed(0)
    hf = _hf(causal)
    with torch.no_grad():  # a table well away from 0, so every bucket's gradient matters
        hf.relative_attention_bias.weight.normal_(0, 1.0)
    weights = {"a.wq": hf.q.weight, "a.wk": hf.k.weight, "a.wv": hf.v.weight, "a.wo": hf.o.weight,
               "a.rel_bias.weight": hf.relative_attention_bias.weight}
    rng = np.random.default_rng(3)
    x = rng.normal(size=(B, T, D))
    targets = rng.normal(size=(B, T, D))
    m = rng.normal(size=(B, 1, T, T))
    inputs = {"x": x, "targets": targets, **({"m": m} if extra_bias else {})}

    xt = torch.tensor(x, requires_grad=True)
    mask = torch.tensor(m) if extra_bias else torch.zeros(B, 1, T, T, dtype=torch.float64)
    if causal:  # HF's decoder passes its causal mask as an additive bias
        mask = mask + torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    y = hf(xt, mask=mask)[0]
    loss = F.mse_loss(y, torch.tensor(targets))
    loss.backward()

    graph = _graph(tmp_path, causal, extra_bias)
    np_w = {k: v.detach().numpy() for k, v in weights.items()}
    given = {k: v for k, v in inputs.items() if k != "targets"}
    fwd = run_graph(apply_rules(graph, GRAD_RULES, max_rounds=2), np_w, given, dtype=np.float64)
    assert np.abs(fwd["y"] - y.detach().numpy()).max() <= 1e-10 * np.abs(fwd["y"]).max()
    out = run_graph(run_passes(attach_loss(graph, "mse"), ["grad"]), np_w, inputs, dtype=np.float64)
    assert abs(float(out["loss"]) - loss.item()) <= 1e-10 * loss.item()
    taken = {"loss"}
    for key, t in weights.items():
        want = t.grad.numpy()
        got = out[grad_label(key, taken)]
        assert np.abs(got - want).max() <= 1e-10 * np.abs(want).max(), key
    assert np.abs(out[grad_label("x", taken)] - xt.grad.numpy()).max() <= 1e-10 * np.abs(xt.grad.numpy()).max()


def test_the_grad_lowering_reads_the_layer_own_key(tmp_path: Path) -> None:
    """The grad pass's lowered graph asks for the same weights as the layer (a checkpoint loads either way);
    inference's decompose keeps the layer whole (its kernels read the table, no T×S bias tensor)."""
    from irc.runtime.weights import expected_weights

    graph = _graph(tmp_path, False, False)
    lowered = apply_rules(graph, GRAD_RULES, max_rounds=2)
    assert expected_weights(lowered) == expected_weights(graph)
    assert [n.op for n in lowered.nodes].count("rel_position_bias") == 1
    assert [n.op for n in run_passes(graph, ["decompose"]).nodes].count("attention") == 1
