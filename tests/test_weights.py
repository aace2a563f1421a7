"""Weights: deterministic initialisation by the chapter's rules, and .npz/.safetensors files.

Expected spreads come from the init formulas (He: sd sqrt(2/fan_in); Xavier uniform: bound
sqrt(6/(fan_in + fan_out)); GPT-2: sd 0.02), not from irc's output.
"""

from __future__ import annotations

import pickle
from math import sqrt

import numpy as np
import pytest

from irc.analysis.params import weight_table
from irc.diagnostics import IrcError
from irc.runtime.graphs import graph_from_source
from irc.runtime.init import init_weights
from irc.runtime.weights import check_weights, load_checked, load_weights, save_weights

NET = """model net(B) {
  input img: f32[B, 3, 8, 8]
  input tokens: i32[B, 6]
  x = relu(batchnorm(conv2d(img, 64, 3, padding=1)))
  x = linear(flatten(x), 256)
  logits = linear(relu(linear(x, 512)), 10)
  emb = embedding(100, 64)
  s = attention(layernorm(emb(tokens)), heads=4)
  seq, h, c = lstm(s, 128)
  output logits
  output h
}
"""


@pytest.fixture(scope="module")
def graph():
    return graph_from_source(NET, {"B": 2})


@pytest.fixture(scope="module")
def weights(graph):
    return init_weights(graph, seed=0)


def test_keys_are_the_weight_table(graph, weights):
    params, buffers = weight_table(graph)
    assert list(weights) == list({**params, **buffers})
    assert all(w.dtype == np.float32 for w in weights.values())
    check_weights(graph, weights)


def test_deterministic_per_seed(graph, weights):
    again = init_weights(graph, seed=0)
    other = init_weights(graph, seed=1)
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    assert not np.array_equal(weights["x.weight"], other["x.weight"])


def test_a_weight_does_not_depend_on_the_rest_of_the_graph(weights):
    small = graph_from_source("model m(B) { input img: f32[B, 3, 8, 8]\n"
                              " x = relu(batchnorm(conv2d(img, 64, 3, padding=1)))\n output x }", {"B": 1})
    assert np.array_equal(init_weights(small, 0)["conv2d.weight"], weights["conv2d.weight"])


def test_he_for_layers_feeding_relu(weights):
    # conv → batchnorm → relu: He with fan_in = 3·3·3
    assert weights["conv2d.weight"].std() == pytest.approx(sqrt(2 / 27), rel=0.05)
    # linear(x, 512) feeds a relu: fan_in 256
    assert weights["linear.weight"].std() == pytest.approx(sqrt(2 / 256), rel=0.02)


def test_xavier_otherwise(weights):
    w = weights["x.weight"]  # 4096 → 256, feeds another linear
    bound = sqrt(6 / (4096 + 256))
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.99 * bound
    assert w.std() == pytest.approx(bound / sqrt(3), rel=0.02)  # uniform(−a, a) has sd a/√3


def test_transformer_parts_normal_002(weights):
    for key in ("emb.weight", "s.wq", "s.wk", "s.wv", "s.wo"):
        assert weights[key].std() == pytest.approx(0.02, rel=0.1), key
        assert abs(weights[key].mean()) < 0.005


def test_lstm_forget_gate_bias_is_one(weights):
    b = weights["lstm.bias"]
    h = 128
    assert np.all(b[h:2 * h] == 1.0)  # gates i, f, g, o
    assert np.all(b[:h] == 0) and np.all(b[2 * h:] == 0)


def test_norms_and_buffers(weights):
    assert np.all(weights["layernorm.gain"] == 1) and np.all(weights["layernorm.bias"] == 0)
    assert np.all(weights["batchnorm.gain"] == 1) and np.all(weights["batchnorm.bias"] == 0)
    assert np.all(weights["batchnorm.running_mean"] == 0) and np.all(weights["batchnorm.running_var"] == 1)
    assert np.all(weights["x.bias"] == 0) and np.all(weights["conv2d.bias"] == 0)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_save_load_roundtrip(graph, weights, tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    save_weights(path, weights)
    loaded = load_checked(path, graph)
    assert set(loaded) == set(weights)
    assert all(np.array_equal(loaded[k], weights[k]) and loaded[k].dtype == np.float32 for k in weights)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_file_errors_name_the_key_and_both_shapes(graph, weights, tmp_path, suffix):
    bad = dict(weights)
    bad["x.weight"] = np.zeros((256, 100), np.float32)
    save_weights(tmp_path / f"shape{suffix}", bad)
    with pytest.raises(IrcError, match=r"'x.weight' has shape \[256, 100\].*expects \[256, 4096\]"):
        load_checked(tmp_path / f"shape{suffix}", graph)

    missing = {k: v for k, v in weights.items() if k != "s.wk"}
    save_weights(tmp_path / f"missing{suffix}", missing)
    with pytest.raises(IrcError, match=r"missing weight 's.wk' of shape \[64, 64\]"):
        load_checked(tmp_path / f"missing{suffix}", graph)

    extra = dict(weights, **{"s.wz": np.zeros((3, 3), np.float32)})
    save_weights(tmp_path / f"extra{suffix}", extra)
    with pytest.raises(IrcError, match=r"unexpected weight 's.wz' of shape \[3, 3\]"):
        load_checked(tmp_path / f"extra{suffix}", graph)

    wrong = dict(weights, **{"emb.weight": weights["emb.weight"].astype(np.int32)})  # floats convert on load
    save_weights(tmp_path / f"dtype{suffix}", wrong)
    with pytest.raises(IrcError, match=r"'emb.weight' has dtype int32.*float32 \(shape \[100, 64\]\)"):
        load_checked(tmp_path / f"dtype{suffix}", graph)


def test_renamed_key_suggests_the_close_match(graph, weights, tmp_path):
    renamed = {("s.query" if k == "s.wq" else k): v for k, v in weights.items()}
    save_weights(tmp_path / "w.npz", renamed)
    with pytest.raises(IrcError, match="missing weight 's.wq' .*the file has 's.query' instead"):
        load_checked(tmp_path / "w.npz", graph)


class Evil:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled!')",))


def _bad_files(tmp_path, weights):
    save_weights(tmp_path / "good.npz", weights)
    save_weights(tmp_path / "good.safetensors", weights)
    data = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    st = (tmp_path / "good.safetensors").read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(st[: len(st) // 2])
    (tmp_path / "pickle.npz").write_bytes(pickle.dumps({"linear.weight": Evil()}))
    (tmp_path / "text.safetensors").write_text("not weights\n")
    (tmp_path / "text.npz").write_text("not weights\n")
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "array.npz").write_bytes((tmp_path / "array.npy").read_bytes())
    np.savez(tmp_path / "object.npz", **{"linear.weight": np.array([Evil()], dtype=object)})
    return ["truncated.npz", "truncated.safetensors", "pickle.npz", "text.safetensors", "text.npz",
            "array.npz", "object.npz"]


def test_bad_files_are_errors_and_never_unpickled(tmp_path, weights):
    for name in _bad_files(tmp_path, weights):
        with pytest.raises(IrcError):
            load_weights(tmp_path / name)
    with pytest.raises(IrcError, match="must end in .npz or .safetensors"):
        load_weights(tmp_path / "array.npy")
    with pytest.raises(IrcError, match="no such weights file"):
        load_weights(tmp_path / "absent.npz")


def test_bad_weights_through_the_cli(tmp_path, weights, irc_cli):
    model = tmp_path / "net.arch"
    model.write_text(NET)
    names = _bad_files(tmp_path, weights)
    for name in names:
        r = irc_cli(["run", str(model), "--weights", str(tmp_path / name)])
        assert r.rc == 1, (name, r.err)
        assert "error:" in r.err and "Traceback" not in r.err
    bad = dict(weights, **{"logits.weight": np.zeros((10, 3), np.float32)})
    save_weights(tmp_path / "shape.safetensors", bad)
    r = irc_cli(["run", str(model), "--weights", str(tmp_path / "shape.safetensors")])
    assert r.rc == 1
    assert "'logits.weight' has shape [10, 3], but the model expects [10, 512]" in r.err
