"""bfloat16 checkpoints (how most Llama, Mistral and Qwen weights ship) load, widened exactly to float32.

Oracle: PyTorch's own bfloat16 → float32 conversion of the same tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from irc.diagnostics import IrcError
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import expected_weights, load_checked

MODEL = "model m() {\n  input x: f32[2, 8]\n  output y = linear(x, 5)\n}\n"


def test_a_bfloat16_file_loads_as_torch_widens_it(tmp_path: Path) -> None:
    graph = graph_from_source(MODEL)
    torch.manual_seed(0)
    tensors = {k: torch.randn(*shape).to(torch.bfloat16) for k, shape in expected_weights(graph).items()}
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    notes: list[str] = []
    weights = load_checked(path, graph, notes.append)
    for key, t in tensors.items():
        assert weights[key].dtype == np.float32
        assert np.array_equal(weights[key], t.float().numpy())  # bit for bit
    assert any("widened 2 bfloat16 weight(s)" in n for n in notes)


def test_a_bfloat16_entry_with_the_wrong_size_is_refused(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(10))
    with pytest.raises(IrcError, match=r"BF16 \[2, 3\], 12 bytes, but its data_offsets"):
        load_checked(path, graph_from_source(MODEL))
