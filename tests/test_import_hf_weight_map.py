"""Weight maps (irc/runtime/weight_map.py) step by step, and checkpoints as they ship (folders, shards).

Every transform is tested on a square matrix, where a shape check cannot catch a mistake: the
oracle is PyTorch's own module (Conv1D, nn.LSTM) or NumPy's arithmetic, never irc's output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from irc.diagnostics import IrcError
from irc.runtime.compare import rel_error
from irc.runtime.graphs import graph_from_source
from irc.runtime.weight_map import Rule, WeightMap, apply_map, load_map, map_path_for, parse_map
from irc.runtime.weights import expected_weights, load_checkpoint, load_for_model, save_weights

SQUARE = "model m() {\n  input x: f32[3, 6]\n  output y = linear(x, 6)\n}\n"


def _square_graph():
    return graph_from_source(SQUARE)


def test_transpose_of_a_square_conv1d_weight() -> None:
    """GPT-2's Conv1D computes x @ W + b with W [in, out]: only the map's explicit transpose matches it."""
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    conv = Conv1D(6, 6)
    with torch.no_grad():
        conv.weight.normal_()
        conv.bias.normal_()
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    want = conv(torch.from_numpy(x)).detach().numpy()
    tensors = {"c.weight": conv.weight.detach().numpy(), "c.bias": conv.bias.detach().numpy()}
    graph = _square_graph()
    expected = expected_weights(graph)
    from irc.backends.numpy_ref import run_graph

    good = WeightMap({"y.weight": Rule(("c.weight",), transpose=True), "y.bias": Rule(("c.bias",))})
    w = apply_map(good, tensors, expected, "ckpt", "map")
    assert rel_error(run_graph(graph, w, {"x": x}, np.float32)["y"], want) < 1e-6
    bad = WeightMap({"y.weight": Rule(("c.weight",)), "y.bias": Rule(("c.bias",))})  # same shape, wrong layout
    w = apply_map(bad, tensors, expected, "ckpt", "map")
    assert rel_error(run_graph(graph, w, {"x": x}, np.float32)["y"], want) > 0.1


def test_split_takes_the_part_along_the_axis() -> None:
    fused = np.arange(6 * 18, dtype=np.float32).reshape(6, 18)  # [in, 3·out], GPT-2's c_attn layout
    expected = {f"a.w{c}": (6, 6) for c in "qkv"}
    wmap = WeightMap({f"a.w{c}": Rule(("c_attn",), (1, 3, i), transpose=True) for i, c in enumerate("qkv")})
    out = apply_map(wmap, {"c_attn": fused}, expected, "ckpt", "map")
    for i, c in enumerate("qkv"):
        np.testing.assert_array_equal(out[f"a.w{c}"], fused[:, 6 * i:6 * (i + 1)].T)


def test_sum_of_pytorch_lstm_biases_matches_torch() -> None:
    """irc's LSTM keeps one bias: PyTorch's bias_ih + bias_hh, summed by the map."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4, batch_first=True)
    with torch.no_grad():
        for p in lstm.parameters():
            p.normal_()
    x = np.random.default_rng(1).standard_normal((2, 5, 4)).astype(np.float32)
    want = lstm(torch.from_numpy(x))[0].detach().numpy()
    graph = graph_from_source("model m() {\n  input x: f32[2, 5, 4]\n  y, h, c = lstm(x, 4)\n  output y = y\n}\n")
    sd = {k: v.detach().numpy() for k, v in lstm.state_dict().items()}
    wmap = parse_map({"format": "irc-weight-map", "version": 1,
                      "weights": {"lstm.weight_ih": "weight_ih_l0", "lstm.weight_hh": "weight_hh_l0",
                                  "lstm.bias": {"sum": ["bias_ih_l0", "bias_hh_l0"]}}}, "m")
    w = apply_map(wmap, sd, expected_weights(graph), "ckpt", "map")
    from irc.backends.numpy_ref import run_graph

    assert rel_error(run_graph(graph, w, {"x": x}, np.float32)["y"], want) < 1e-6
    np.testing.assert_allclose(w["lstm.bias"], sd["bias_ih_l0"] + sd["bias_hh_l0"], rtol=1e-6)


def test_tied_copy_must_equal_its_target() -> None:
    table = np.ones((4, 3), np.float32)
    wmap = WeightMap({"e.weight": Rule(("emb",))}, tied={"head": "emb"})
    ok = apply_map(wmap, {"emb": table, "head": table.copy()}, {"e.weight": (4, 3)}, "ckpt", "map")
    assert list(ok) == ["e.weight"]
    with pytest.raises(IrcError, match="'head' differs from 'emb'.*untied head"):
        apply_map(wmap, {"emb": table, "head": table * 2}, {"e.weight": (4, 3)}, "ckpt", "map")


def test_every_missing_and_unread_tensor_is_named() -> None:
    wmap = WeightMap({"l.{i}.w": Rule(("h.{i}.w",))}, ignore=("h.{i}.buf", "cls.*"))
    expected = {"l.0.w": (2,), "l.1.w": (2,), "l.2.w": (2,)}
    tensors = {"h.0.w": np.zeros(2, np.float32), "h.0.buf": np.zeros(1), "cls.x.y": np.zeros(1)}
    with pytest.raises(IrcError, match=r"missing 2 weight\(s\) the weight map reads: 'h.1.w' \(for l.1.w\), "
                                       r"'h.2.w' \(for l.2.w\)"):
        apply_map(wmap, tensors, expected, "'ckpt'", "map")
    tensors = {**{f"h.{i}.w": np.zeros(2, np.float32) for i in range(3)}, "odd": np.zeros(3), "odd2": np.zeros(1)}
    with pytest.raises(IrcError, match=r"2 weight\(s\) that the weight map 'map' does not read.*'odd' \[3\], "
                                       r"'odd2' \[1\]"):
        apply_map(wmap, tensors, expected, "'ckpt'", "map")


def test_a_wrong_transform_is_named_with_its_source() -> None:
    wmap = WeightMap({"y.weight": Rule(("w",)), "y.bias": Rule(("b",))})
    with pytest.raises(IrcError, match=r"'y.weight' \('w'\) has shape \[4, 6\], but the model expects \[6, 4\]; "
                                       "transposed?"):
        apply_map(wmap, {"w": np.zeros((4, 6), np.float32), "b": np.zeros(6, np.float32)},
                  {"y.weight": (6, 4), "y.bias": (6,)}, "'ckpt'", "map")


def test_base_prefix_loads_bare_and_headed_checkpoints() -> None:
    wmap = WeightMap({"e.weight": Rule(("transformer.wte",))}, base_prefix="transformer.")
    for key in ("transformer.wte", "wte"):
        out = apply_map(wmap, {key: np.zeros((2, 2), np.float32)}, {"e.weight": (2, 2)}, "ckpt", "map")
        assert list(out) == ["e.weight"]


def test_map_json_round_trips_and_rejects_malformed_maps(tmp_path: Path) -> None:
    wmap = WeightMap({"a.{i}.w": Rule(("x.{i}",), (1, 3, 2), True), "b": Rule(("p", "q")), "c": Rule(("r",))},
                     {"head": "r"}, ("buf",), "m.", "test")
    path = tmp_path / "m.weightmap.json"
    path.write_text(wmap.dumps())
    assert load_map(path) == wmap
    assert map_path_for(tmp_path / "m.arch") == path
    for bad, why in [({"format": "x"}, "format"), ({"format": "irc-weight-map", "version": 2}, "version 2"),
                     ({"format": "irc-weight-map", "version": 1, "weights": {"a": {"from": "x", "flip": 1}}},
                      "unknown step"),
                     ({"format": "irc-weight-map", "version": 1, "weights": {"a": {"from": "x", "split": [0, 2, 2]}}},
                      "0 <= part < parts")]:
        with pytest.raises(IrcError, match=why):
            parse_map(bad, "m")


# -- checkpoints as they ship ------------------------------------------------------------


def _linear_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    w = {"lin.weight": rng.standard_normal((6, 6)).astype(np.float32),
         "lin.bias": rng.standard_normal(6).astype(np.float32)}
    model = tmp_path / "m.arch"
    model.write_text(SQUARE)
    (tmp_path / "m.weightmap.json").write_text(WeightMap({"y.weight": Rule(("lin.weight",)),
                                                          "y.bias": Rule(("lin.bias",))}).dumps())
    return model, w


def test_sharded_index_and_folder_load(tmp_path: Path) -> None:
    model, w = _linear_checkpoint(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_weights(ckpt / "model-00001-of-00002.safetensors", {"lin.weight": w["lin.weight"]})
    save_weights(ckpt / "model-00002-of-00002.safetensors", {"lin.bias": w["lin.bias"]})
    index = {"metadata": {"total_size": 168}, "weight_map": {"lin.weight": "model-00001-of-00002.safetensors",
                                                             "lin.bias": "model-00002-of-00002.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    graph = _square_graph()
    for source in (ckpt, ckpt / "model.safetensors.index.json"):
        got = load_for_model(source, graph, model)
        np.testing.assert_array_equal(got["y.weight"], w["lin.weight"])
        np.testing.assert_array_equal(got["y.bias"], w["lin.bias"])
    index["weight_map"]["lin.bias"] = "model-00001-of-00002.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(IrcError, match="puts 1 weight\\(s\\) in 'model-00001-of-00002.safetensors' that it does "
                                       "not hold: 'lin.bias'"):
        load_checkpoint(ckpt)


def test_half_and_double_precision_files_convert_with_a_note(tmp_path: Path) -> None:
    model, w = _linear_checkpoint(tmp_path)
    notes: list[str] = []
    save_weights(tmp_path / "w.safetensors", {"lin.weight": w["lin.weight"].astype(np.float16),
                                              "lin.bias": w["lin.bias"].astype(np.float64)})
    got = load_for_model(tmp_path / "w.safetensors", _square_graph(), model, notes.append)
    assert got["y.weight"].dtype == got["y.bias"].dtype == np.float32
    np.testing.assert_array_equal(got["y.weight"], w["lin.weight"].astype(np.float16).astype(np.float32))
    assert notes == [f"'{tmp_path / 'w.safetensors'}': converted 2 weight(s) to float32 on load "
                     "(1 from float16, 1 from float64)"]


def test_folder_with_only_pickles_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(IrcError, match="only PyTorch pickles \\(pytorch_model.bin\\), which irc never loads"):
        load_checkpoint(tmp_path)


def test_a_file_in_irc_keys_loads_as_it_is_next_to_a_map(tmp_path: Path) -> None:
    """irc weights --template (or any file in irc's own keys) needs no map, even where one sits."""
    model, w = _linear_checkpoint(tmp_path)
    own = {"y.weight": w["lin.weight"], "y.bias": w["lin.bias"]}
    save_weights(tmp_path / "own.safetensors", own)
    got = load_for_model(tmp_path / "own.safetensors", _square_graph(), model)
    assert all(np.array_equal(got[k], own[k]) for k in own)
