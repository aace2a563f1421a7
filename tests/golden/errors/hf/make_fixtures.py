"""Build the checkpoint folders, indexes and configs the hf_* and run_weights_* golden cases read.

Run from anywhere: ``python tests/golden/errors/hf/make_fixtures.py``; tests/test_import_hf_errors.py
checks the files on disk are exactly what this script writes. The model of those cases is
``linear(x, 3)`` on ``f32[2, 4]``: weights ``y.weight`` [3, 4] and ``y.bias`` [3].
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
BIAS = np.zeros(3, np.float32)
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "model_type": "llama",
         "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4, "rms_norm_eps": 1e-05,
         "vocab_size": 100}


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _safetensors(**arrays: np.ndarray) -> bytes:
    from safetensors.numpy import save

    return save(arrays)


def _json(data: object) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64, "vocab_size": 100}
BERT = {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 64, "vocab_size": 100}
GEMMA = {**LLAMA, "model_type": "gemma", "head_dim": 16}
# hf_import_<name> golden cases: configs each wrong in one key
CONFIGS = {
    "unknown_type": {**LLAMA, "model_type": "lama"},
    "gemma2": {**LLAMA, "model_type": "gemma2"},
    "rope_scaling": {**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
    "rope_parameters": {**LLAMA, "rope_parameters": 10000},
    "rope_type": {**LLAMA, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}},
    "mlp_bias": {**LLAMA, "mlp_bias": True},
    "not_int": {**LLAMA, "num_hidden_layers": "2"},
    "no_layers": {**LLAMA, "num_hidden_layers": 0},
    "heads": {**LLAMA, "num_attention_heads": 6},
    "kv_heads": {**LLAMA, "num_key_value_heads": 3},
    "mistral_window": {**LLAMA, "model_type": "mistral", "sliding_window": 0},
    "qwen2_sliding": {**LLAMA, "model_type": "qwen2", "use_sliding_window": True},
    "qwen2_layer_types": {**LLAMA, "model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]},
    "gemma_kv_heads": {**GEMMA, "num_key_value_heads": 3},
    "gemma_head_dim": {**GEMMA, "head_dim": 15},
    "gpt2_activation": {**GPT2, "activation_function": "gelu_fast"},
    "gpt2_heads": {**GPT2, "n_head": 5},
    "gpt2_inner": {**GPT2, "n_inner": -3},
    "gpt2_unscaled": {**GPT2, "scale_attn_weights": False},
    "bert_activation": {**BERT, "hidden_act": "swiglu"},
    "bert_heads": {**BERT, "num_attention_heads": 5},
    "t5_head_width": {"model_type": "t5", "d_model": 64, "d_kv": 32, "num_heads": 4},
    "model_type_not_string": {**LLAMA, "model_type": 5},
    "no_model_type": {k: v for k, v in LLAMA.items() if k != "model_type"},
}
MODEL = "model m() {\n  input x: f32[2, 4]\n  output y = linear(x, 3)\n}\n"
# run_weightmap_<name> golden cases: a model, its weight map and a checkpoint in names the map reads
GOOD_MAP = {"y.weight": "lin.weight", "y.bias": "lin.bias"}
WEIGHT_MAPS = {
    "no_entry": ({"y.weight": "lin.weight"}, {}, {"lin.weight": W, "lin.bias": BIAS}),
    "missing": (GOOD_MAP, {}, {"lin.weight": W}),
    "unread": (GOOD_MAP, {}, {"lin.weight": W, "lin.bias": BIAS, "lin.scale": BIAS}),
    "tied_differs": (GOOD_MAP, {"head.weight": "lin.weight"},
                     {"lin.weight": W, "lin.bias": BIAS, "head.weight": W + 1}),
    "sum_shapes": ({**GOOD_MAP, "y.bias": {"sum": ["b1", "b2"]}}, {}, {"lin.weight": W, "b1": BIAS, "b2": W}),
    "split_uneven": ({**GOOD_MAP, "y.weight": {"from": "qkv", "split": [0, 2, 0]}}, {},
                     {"qkv": W, "lin.bias": BIAS}),
    "transpose_vector": ({**GOOD_MAP, "y.bias": {"from": "lin.bias", "transpose": True}}, {},
                         {"lin.weight": W, "lin.bias": BIAS}),
    "transposed": (GOOD_MAP, {}, {"lin.weight": W.T.copy(), "lin.bias": BIAS}),
}


def _weight_map(weights: dict, tied: dict) -> bytes:
    doc = {"format": "irc-weight-map", "version": 1, "weights": weights}
    if tied:
        doc["tied"] = tied
    return _json(doc)


def build() -> dict[str, bytes]:
    """``{path relative to this folder: bytes}``."""
    shard = "model-00001-of-00001.safetensors"
    files = {f"config_{name}.json": _json(data) for name, data in CONFIGS.items()}
    for name, (weights, tied, tensors) in WEIGHT_MAPS.items():
        files[f"wm_{name}/m.arch"] = MODEL.encode()
        files[f"wm_{name}/m.weightmap.json"] = _weight_map(weights, tied)
        files[f"wm_{name}/ckpt.safetensors"] = _safetensors(**tensors)
    files["wm_bad_json/m.arch"] = MODEL.encode()
    files["wm_bad_json/m.weightmap.json"] = b'{"format": "irc-weight-map",\n "version": 1,\n "weights": {\n'
    files["wm_bad_json/ckpt.safetensors"] = _safetensors(**{"lin.weight": W, "lin.bias": BIAS})
    return files | {
        "several/a.npz": _npz(**{"y.weight": W, "y.bias": BIAS}),
        "several/b.npz": _npz(**{"y.weight": W, "y.bias": BIAS}),
        "pickles/pytorch_model.bin": b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00.",
        "no_weights/README.txt": b"a folder without weights\n",
        "bad_json.safetensors.index.json": b'{"weight_map": {"y.weight": \n',
        "no_map.safetensors.index.json": _json({"metadata": {"total_size": 60}}),
        "path_shard.safetensors.index.json": _json({"weight_map": {"y.weight": "../w.safetensors"}}),
        f"absent/{shard}": _safetensors(**{"y.weight": W}),
        "absent/model.safetensors.index.json": _json({"weight_map": {"y.weight": shard, "y.bias": shard}}),
        f"unlisted/{shard}": _safetensors(**{"y.weight": W, "y.bias": BIAS}),
        "unlisted/model.safetensors.index.json": _json({"weight_map": {"y.weight": shard}}),
        "w_int.npz": _npz(**{"y.weight": W.astype(np.int32), "y.bias": BIAS}),
        "w_f64.npz": _npz(**{"y.weight": W.astype(np.float64), "y.bias": BIAS}),
        "w_many_wrong.npz": _npz(**{"weight": W, "bias": BIAS, "y.scale": BIAS, "y.extra": W}),
        "config_not_object.json": b"[1, 2]\n",
        "config_bad_json.json": b'{"model_type": "llama",\n  "hidden_size": 64,,\n}\n',
    }


if __name__ == "__main__":
    for name, data in build().items():
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_bytes(data)
