"""positional(x, sinusoidal, layout=concat): Whisper's [sin | cos] table, against Hugging Face's
WhisperEncoder.embed_positions (built by its ``sinusoids()``) on a small config; the numpy
reference (float32 within 1e-5, float64 within 1e-10), the cpu backend and the cuda backend in
the simulator (float32 within 1e-5; max|ours − HF| / max|HF|); the default (interleaved)
layout is unchanged and differs; the layout's errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_cpu_backend_helpers import cpu_cache
from test_cuda_helpers import cuda_cache
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from irc.diagnostics import IrcError
from irc.printer import print_graph
from irc.runtime.compare import reference_errors, rel_error
from irc.runtime.graphs import graph_from_source

ORACLE_OPS = frozenset({"positional"})
_ = cpu_cache, cuda_cache
TOL32, TOL64 = 1e-5, 1e-10
B, T, D, MAX = 2, 24, 32, 30


def _whisper_table() -> np.ndarray:
    """HF's encoder position table (sinusoids(max_source_positions, d_model)), in float64."""
    cfg = WhisperConfig(d_model=D, encoder_layers=1, encoder_attention_heads=2, decoder_layers=1,
                        decoder_attention_heads=2, max_source_positions=MAX, num_mel_bins=4, encoder_ffn_dim=8,
                        decoder_ffn_dim=8)
    return WhisperEncoder(cfg).embed_positions.weight.detach().numpy().astype(np.float64)


def _whisper_sinusoids_in_float64(length: int, channels: int) -> np.ndarray:
    """Whisper's sinusoids() formula (openai/whisper model.py), computed by torch in float64."""
    inc = np.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2, dtype=torch.float64))
    scaled = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1).numpy()


def _case(layout: str = ", layout=concat"):
    graph = graph_from_source(f"model m() {{ input x: f32[{B}, {T}, {D}]\n output y = positional(x, sinusoidal"
                              f"{layout}) }}")
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32)
    return graph, {"x": x}


def test_hf_table_is_the_formula():
    """HF builds its table in float32: within float32 rounding of the float64 formula."""
    assert rel_error(_whisper_table(), _whisper_sinusoids_in_float64(MAX, D)) <= 1e-6


def test_reference_matches_whisper():
    graph, inputs = _case()
    hf = inputs["x"].astype(np.float64) + _whisper_table()[:T]
    exact = inputs["x"].astype(np.float64) + _whisper_sinusoids_in_float64(T, D)
    (err32, _), = reference_errors(graph, {}, inputs, {"y": hf}).values()
    (_, err64), = reference_errors(graph, {}, inputs, {"y": exact}).values()
    assert err32 <= TOL32 and err64 <= TOL64, (err32, err64)
    interleaved, _ = _case("")  # the default layout is another table: the check can fail
    (bad32, _), = reference_errors(interleaved, {}, inputs, {"y": hf}).values()
    assert bad32 > 0.1


def test_cpu_matches_whisper(cpu_cache):
    from irc.backends.cpu import compile_graph

    graph, inputs = _case()
    got = compile_graph(graph, cache_dir=cpu_cache).run({}, inputs)["y"]
    assert rel_error(got, inputs["x"].astype(np.float64) + _whisper_table()[:T]) <= TOL32


def test_cuda_simulator_matches_whisper(cuda_cache):
    from irc.backends.cuda import compile_graph

    graph, inputs = _case()
    got = compile_graph(graph, cache_dir=cuda_cache).run({}, inputs)["y"]
    assert rel_error(got, inputs["x"].astype(np.float64) + _whisper_table()[:T]) <= TOL32


def test_default_dump_is_unchanged():
    assert "layout" not in print_graph(_case("")[0])
    assert "layout=concat" in print_graph(_case()[0])
    assert "layout=interleaved" in print_graph(_case(", layout=interleaved")[0])


@pytest.mark.parametrize("src,message", [
    ("positional(x, learned, max_len=8, layout=concat)", "a learned table has none"),
    ("positional(slice(x, axis=2, start=0, end=2), sinusoidal, layout=concat)", "needs a width of at least 4"),
])
def test_layout_errors(src, message):
    with pytest.raises(IrcError, match=message):
        graph_from_source(f"model m() {{ input x: f32[1, 3, 8]\n output y = {src} }}")
