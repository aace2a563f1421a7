"""irc compile --emit onnx: every model of the zoo and every op exports to a checked ONNX model that
ONNX Runtime runs to within 1e-5 of irc's NumPy reference (float64), the oracle.

The zoo runs at the small sizes of tests/test_cpu_models_check.py, made smaller still where a
table dominates (``vocab``, ``fc``, ``hidden`` overrides). OP_MODELS cover every registered op the
zoo does not use; they are also run after ``decompose`` and ``fuse``, so the primitives and fused
ops export too. tests/test_export_torch.py reuses these cases.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_fusion import SMALL as _SMALL

from irc.ops import OPS, canonical_name

ROOT = Path(__file__).resolve().parents[1]
MODEL_FILES = {p.stem: p for p in [*sorted((ROOT / "models").glob("*.arch")),
                                   *sorted((ROOT / "models" / "seed").glob("*.arch"))]}
TOLERANCE = 1e-5  # max|out - ref| / max|ref| (irc.runtime.compare.rel_error)

_SEED_LM = {"d": 64, "heads": 4, "layers": 1, "vocab": 50, "B": 1, "T": 5}
# per model: the bindings and constant overrides (-D) an export test runs it at
EXPORT_BINDINGS: dict[str, dict[str, int]] = {
    "gpt2_small": {"B": 2, "T": 6, "layers": 2, "vocab": 300},
    "bert_base": {"B": 2, "T": 6, "layers": 2, "vocab": 300},
    "llama2_7b": {"B": 1, "T": 6, "layers": 1, "d": 64, "heads": 4, "vocab": 50, "ff": 96},
    "mistral_7b": {"B": 1, "T": 6, "layers": 1, "d": 64, "heads": 4, "kv_heads": 2, "vocab": 50, "ff": 96, "window": 3},
    "t5_small": {"B": 1, "S": 5, "T": 4, "layers": 2, "vocab": 300},
    "mlp": {"B": 2},
    "lstm_lm": {"B": 2, "T": 5, "vocab": 300, "hidden": 32},
    "resnet18": {"B": 1, "H": 32, "W": 32},
    "vgg16": {"B": 1, "H": 32, "W": 32, "fc": 64},
    "conv3x3": {"B": 1, "H": 8, "W": 8},
    "dense_on_image": {"B": 1},
    "dilated_stack": {"B": 1, "H": 16, "W": 16},
    "flatten_head": {"B": 2},
    "fold_deep": {"B": 2}, "fold_deep20": {"B": 2}, "fold_shallow": {"B": 2},
    "gap_head": {"B": 2},
    "gru_512": {"B": 2, "T": 4},
    "lstm_512": {"B": 2, "T": 4},
    "llm_40x5120": _SEED_LM,
    "mha_4096": {"d": 64, "heads": 4, "B": 1, "T": 5},
    "resnet_stem": {"B": 1, "H": 16, "W": 16},
    "swiglu_7b": _SEED_LM,
    "transformer_7b": {**_SEED_LM, "kv_heads": 4},
    "transformer_7b_gqa": {**_SEED_LM, "kv_heads": 2},
    "transformer_7b_mqa": {**_SEED_LM, "kv_heads": 1},
    "vgg_stack": {"B": 1, "H": 16, "W": 16},
    "mobilenet_v2": {"B": 2, "H": 32, "W": 32}, "efficientnet_b0": {"B": 2, "H": 32, "W": 32},
    "convnext_tiny": {"B": 1, "H": 32, "W": 32}, "densenet121": {"B": 1, "H": 32, "W": 32},
    "vit_b_16": {"B": 2, "image": 32, "d": 64, "heads": 4, "layers": 2, "mlp": 128},
    "unet": {"B": 1, "height": 32, "width": 32},
    "whisper_tiny_encoder": {"B": 2, "mels": 8, "frames": 16, "d": 64, "heads": 4, "layers": 2, "ff": 128},
    # the small sizes the CPU and fusion tests run these at (tests/test_fusion.py)
    **{name: _SMALL[name] for name in ("mixtral_8x7b", "deepseek_v2_lite", "digits_cnn", "byte_lm")},
}

# the registered ops the zoo does not use, at small sizes
OP_MODELS: dict[str, str] = {
    "conv_pool_1d": """model conv_pool_1d(B, L) {
  input seq: f32[B, 8, L]
  a = conv1d(seq, 8, 3, padding=1)
  b = conv1d(a, 8, 4, padding=same, groups=4, bias=false)
  c = conv1d(b, 6, 3, stride=2, dilation=2, padding=2)
  d = maxpool1d(c, 2)
  e = avgpool1d(c, 3, stride=1, padding=1, count_include_pad=false)
  f = avgpool1d(c, 2)
  output y1 = d
  output y2 = e
  output y3 = global_avgpool(f)
}""",
    "conv_pool_2d": """model conv_pool_2d(B, H, W) {
  input img: f32[B, 4, H, W]
  a = conv2d(img, 8, [3, 2], stride=[2, 1], padding=[1, 0])
  b = conv2d(a, 8, 4, padding=same, groups=2)
  c = maxpool2d(b, 3, stride=1, padding=1, dilation=1)
  d = avgpool2d(c, 3, stride=2, padding=1, count_include_pad=false)
  e = batchnorm(d)
  output y1 = adaptive_avgpool2d(e, [3, 2])
  output y2 = adaptive_avgpool2d(e, 1)
  output y3 = leaky_relu(avgpool2d(e, [2, 1]), slope=0.2)
}""",
    "elementwise": """model elementwise(B) {
  input x: f32[B, 6, 8]
  input v: f32[8]
  a = gelu(x)
  b = gelu(a, approx=tanh)
  c = silu(b) + sigmoid(x) * tanh(x)
  d = abs(c) - v
  e = identity(d) / (abs(v) + 1)
  f = 2 - e
  g = e / 3
  h = 1.5 / (abs(g) + 1)
  i = softmax(h, axis=1)
  j = dropout(i, p=0.3)
  output y = j + softmax(x)
}""",
    "shapes": """model shapes(B, T) {
  input x: f32[B, T, 12]
  input box: f32[2, 10, 8]
  q, k, v = split(x, 3)
  a, b = split(x, [5, 7])
  c = concat(q, k, v, a, b, axis=-1)
  d = reshape(c, [B, T, 4, 6])
  e = transpose(d, [0, 2, 1, 3])
  f = flatten(e, start=2)
  g = flatten(box)
  h = flatten(box, start=0, end=1)
  i = reshape(f, [B, -1])
  output y1 = select(x, axis=1, index=0)
  output y2 = slice(box, axis=1, start=2, end=5)
  output y3 = slice(box, 1, 0, -2)
  output y4 = slice(x, axis=-1, start=-3)
  output y5 = g
  output y6 = h
  output y7 = i
  output y8 = reshape(i, [B*T, 24])
  output y9 = select(box, 1, -1)
}""",
    "recurrent": """model recurrent(B, T) {
  input x: f32[B, T, 6]
  s = rnn(x, 5)
  y, h = rnn(x, 4, act=relu, bias=false)
  g1, gh = gru(s, 7)
  g2, gh2 = gru(g1, 5, variant=torch)
  g3, gh3 = gru(g2, 3, bias=false)
  l, lh, lc = lstm(g3, 4, bias=false)
  output seq = l
  output h1 = h
  output h2 = gh2
  output h3 = gh3
  output c = lc
  output y = y
}""",
    "norms_dense": """model norms_dense(B, T) {
  input x: f32[B, T, 16]
  input m: f32[16, 5]
  a = layernorm(x, eps=1e-6, affine=false)
  b = layernorm(a, bias=false)
  c = rmsnorm(b, 1e-5, false)
  d = batchnorm(c, axis=-1)
  e = ffn(d, 24, act=silu, bias=false)
  f = ffn(e, 20, act=tanh, out=8)
  g = swiglu(e, 12, bias=true)
  output y1 = f
  output y2 = g @ m
  output y3 = unembed(e, 11, bias=true)
  output y4 = ffn(e, 10, act=gelu)
}""",
    "attention_options": """model attention_options(B, T, S) {
  input x: f32[B, T, 32]
  input mem: f32[B, S, 32]
  input bias: f32[4, T, T]
  a = attention(x, heads=4, causal=true, rope=true, bias=qkvo)
  b = attention(a, heads=4, kv_heads=2, rope=true, rope_theta=500000, head_dim=16, causal=true, window=2)
  c = attention(b, mem, heads=4, kv_heads=1, scale=0.3)
  d = attention(c, heads=4, rel_buckets=8, rel_max_distance=16)
  e = attention(d, heads=4, causal=true, rel_buckets=8, rel_max_distance=16, attn_bias=bias)
  pb = rel_position_bias(x, heads=4, buckets=8, max_distance=20)
  cb = rel_position_bias(x, mem, heads=4, buckets=6, max_distance=10, bidirectional=false)
  output y1 = e
  output y2 = attention(e, heads=4, attn_bias=pb)
  output y3 = attention(e, mem, heads=4, attn_bias=cb)
  output y4 = positional(x)
}""",
    "bounded_and_resampled": """model bounded_and_resampled(B, H, W) {
  input x: f32[B, 8, H, W]
  input img: f32[B, 3, 5, 6]
  input seq: f32[B, 4, 7]
  input col: f32[8, 1, 1]
  input tok: f32[1, 1, 6]
  a = relu6(x * 4) + hardtanh(x, min=-2, max=2.5) + clamp(x, min=0) + clamp(x, max=0.5)
  b = hardswish(a) + hardsigmoid(x * 3) + mish(x) + elu(x, alpha=0.5)
  c = maximum(b, col) + minimum(col, x)
  d = groupnorm(c, 4)
  e = instancenorm(groupnorm(d, groups=2, eps=1e-6, affine=false), affine=true, eps=1e-3)
  f = layernorm(e, axis=1)
  g = layernorm(f, axis=-3, bias=false)
  output y1 = pixel_unshuffle(pixel_shuffle(g, 2), 2)
  output y2 = upsample(g, 2)
  output y3 = upsample(img, [2, 3], mode=bilinear)
  output y4 = upsample(img, 2, mode=bilinear, align_corners=true)
  output y5 = upsample(seq, 3)
  output y6 = conv_transpose2d(g, 6, 3, stride=2, padding=1, output_padding=1)
  output y7 = conv_transpose2d(img, out=6, kernel=[3, 2], stride=[2, 3], padding=[1, 0], output_padding=[1, 2],
                               dilation=[1, 2], groups=3)
  output y8 = conv_transpose1d(seq, 6, 4, stride=3, padding=2, output_padding=2, groups=2)
  output y9 = expand(tok, [B, 3, -1])
}""",
    "recurrent_torch_layout": """model recurrent_torch_layout(B, T) {
  input x: f32[B, T, 10]
  s1, h1, c1 = lstm(x, 6, layers=2, bidirectional=true, dropout=0.2, layout=torch)
  s2, h2 = gru(s1, 5, variant=torch, layers=2, layout=torch)
  s3, h3 = rnn(s2, 4, bias=false, act=relu, bidirectional=true, layout=torch)
  output y = positional(s3, sinusoidal, layout=concat)
  output h = h1
  output c = c1
  output g = h2
  output r = h3
}""",
    "edges": """model edges(B) {
  input x: f32[B, 4, 4]
  input ids: i32[B, 3]
  s = causal_mask(x)
  output p = softmax(s, axis=1)
  output q = ids * 3 + 2
  output r = 3 - ids
}""",
}
OP_BINDINGS: dict[str, int] = {"B": 2, "T": 5, "S": 3, "L": 11, "H": 9, "W": 7}

CASES = [*MODEL_FILES, *OP_MODELS]


@functools.cache
def case(name: str, passes: tuple[str, ...] = ()) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray],
                                                         dict[str, np.ndarray]]:
    """(graph, weights, inputs, float64 reference outputs) of a zoo model or an op model."""
    from irc.backends.numpy_ref import run_graph
    from irc.pipeline import load_graph, run_passes
    from irc.runtime.graphs import graph_from_source
    from irc.runtime.init import init_weights
    from irc.runtime.inputs import random_inputs

    if name in OP_MODELS:
        text = OP_MODELS[name]
        header = text.split("{")[0]
        graph = graph_from_source(text, {k: v for k, v in OP_BINDINGS.items() if k in header})
    else:
        graph = load_graph(MODEL_FILES[name], EXPORT_BINDINGS[name])
    if passes:
        graph = run_passes(graph, list(passes))
    weights = init_weights(graph, seed=3)
    inputs = random_inputs(graph, seed=4)
    return graph, weights, inputs, run_graph(graph, weights, inputs, np.float64)


def ort_outputs(model: Any, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {i.name: inputs[i.name] for i in session.get_inputs()})))


def assert_close(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], what: str) -> None:
    from irc.runtime.compare import rel_error

    assert set(got) == set(ref), what
    for label, want in ref.items():
        assert got[label].shape == want.shape, f"{what} {label}: {got[label].shape} vs {want.shape}"
        assert np.all(np.isfinite(got[label])), f"{what} {label} has non-finite values"
        err = rel_error(got[label], want)
        assert err <= TOLERANCE, f"{what} {label}: relative error {err:.2e}"


def test_every_model_has_export_bindings() -> None:
    assert set(EXPORT_BINDINGS) == set(MODEL_FILES)


@pytest.mark.parametrize("name", CASES)
def test_export_runs_in_onnx_runtime_like_the_reference(name: str) -> None:
    import onnx

    from irc.backends.onnx import to_model
    from irc.backends.onnx.context import OPSET

    graph, weights, inputs, ref = case(name)
    model = to_model(graph, weights)
    if sum(w.nbytes for w in weights.values()) < 100e6:  # the bigger ones were checked inside to_model
        onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    assert {t.name for t in model.graph.initializer} >= set(weights)  # weights keep irc's keys
    assert_close(ort_outputs(model, inputs), ref, name)


@pytest.mark.parametrize("name, passes", [("gpt2_small", ("fuse",)), ("llama2_7b", ("fuse",)),
                                          ("mistral_7b", ("decompose",)), ("t5_small", ("fuse",)),
                                          ("recurrent", ("decompose",)), ("attention_options", ("fuse",)),
                                          ("norms_dense", ("decompose",))])
def test_lowered_and_fused_graphs_export(name: str, passes: tuple[str, ...]) -> None:
    from irc.backends.onnx import to_model

    graph, weights, inputs, ref = case(name, passes)
    assert_close(ort_outputs(to_model(graph, weights), inputs), ref, f"{name} after {passes}")


def test_every_op_exports_or_says_why_not() -> None:
    """A new op in irc/ops/ fails here until it has an exporter (backends/onnx/ops_*.py) or a reason."""
    from irc.backends.onnx import EXPORTERS, NO_EXPORT

    missing = sorted(op for op in OPS if op not in EXPORTERS and op not in NO_EXPORT)
    assert not missing, f"ops with neither an ONNX exporter nor a NO_EXPORT reason: {missing}"
    assert not set(EXPORTERS) & set(NO_EXPORT)


def test_every_activation_choice_exports() -> None:
    from irc.backends.onnx.context import ACTS

    choices = {c for op in OPS.values() for a in op.attrs if a.name == "act" for c in a.choices}
    assert choices and choices <= set(ACTS)


def test_exercised_ops_cover_the_exporter_table() -> None:
    """The cases of this file run every exporter at least once (so none is untested)."""
    from irc.backends.onnx import EXPORTERS

    seen: set[str] = set()
    for name in CASES:
        seen |= {canonical_name(n.op) for n in case(name)[0].nodes}
    for name, passes in [("gpt2_small", ("fuse",)), ("llama2_7b", ("fuse",)), ("mistral_7b", ("decompose",)),
                         ("recurrent", ("decompose",)), ("norms_dense", ("decompose",))]:
        seen |= {canonical_name(n.op) for n in case(name, passes)[0].nodes}
    assert sorted(set(EXPORTERS) - seen) == []


def test_symbolic_sizes_stay_symbolic() -> None:
    """Unbound B and T export as named dim_params: one file runs at any batch and length."""
    from irc.backends.numpy_ref import run_graph
    from irc.backends.onnx import to_model
    from irc.passes.bind import bind_symbols
    from irc.passes.shape_infer import shape_infer
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights
    from irc.runtime.inputs import random_inputs

    graph = load_graph(MODEL_FILES["gpt2_small"], {"layers": 1, "vocab": 300})
    weights = init_weights(graph, 0)
    model = to_model(graph, weights)
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["B", "T"]
    out_dims = model.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in out_dims] == ["B", "T", 300]
    # every value carries a shape (Netron draws it on the edge), every node is named by its layer
    typed = {v.name: v for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]}
    for node in model.graph.node:
        for out in node.output:
            shape = typed[out].type.tensor_type.shape
            assert all(d.HasField("dim_value") or d.HasField("dim_param") for d in shape.dim), out
    assert any(n.name.startswith("pre_ln_decoder.0.attn/") for n in model.graph.node)
    assert "LayerNormalization" in {n.op_type for n in model.graph.node}
    for b, t in ((1, 3), (2, 7)):
        bound = shape_infer(bind_symbols(graph, {"B": b, "T": t}))
        inputs = random_inputs(bound, seed=t)
        assert_close(ort_outputs(model, inputs), run_graph(bound, weights, inputs, np.float64), f"B={b} T={t}")


@pytest.mark.parametrize("name, op_types", [("resnet18", {"Conv", "BatchNormalization", "MaxPool", "Gemm"}),
                                            ("lstm_lm", {"LSTM", "Gather"}), ("gru_512", {"GRU"}),
                                            ("recurrent", {"RNN", "GRU", "LSTM"}),
                                            ("bert_base", {"LayerNormalization", "Softmax", "MatMul"})])
def test_layers_export_as_the_standard_onnx_ops(name: str, op_types: set[str]) -> None:
    from irc.backends.onnx import to_model

    graph, weights, _, _ = case(name)
    assert op_types <= {n.op_type for n in to_model(graph, weights).graph.node}


def test_cli_writes_the_model_with_given_or_initial_weights(tmp_path: Path, irc_cli) -> None:
    import onnx

    from irc.backends.numpy_ref import run_graph
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights
    from irc.runtime.inputs import random_inputs
    from irc.runtime.weights import save_weights

    path = MODEL_FILES["mlp"]
    graph = load_graph(path, {"B": 2})
    inputs = random_inputs(graph, 1)
    initial = init_weights(graph, 0)
    trained = {k: (v * 1.5 + 0.01).astype(np.float32) for k, v in initial.items()}
    save_weights(tmp_path / "w.npz", trained)
    for extra, weights in (([], initial), (["--weights", str(tmp_path / "w.npz")], trained)):
        result = irc_cli(["compile", str(path), "-D", "B=2", "--emit", "onnx", "-o", str(tmp_path / "m.onnx"), *extra])
        assert result.rc == 0, result.err
        model = onnx.load(str(tmp_path / "m.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert_close(ort_outputs(model, inputs), run_graph(graph, weights, inputs, np.float64), str(extra))


def test_cli_refuses_a_binary_onnx_on_stdout(irc_cli) -> None:
    result = irc_cli(["compile", str(MODEL_FILES["mlp"]), "--emit", "onnx"])
    assert result.rc == 2
    assert "give its path with -o" in result.err


def test_export_is_deterministic() -> None:
    from irc.backends.onnx import to_model

    graph, weights, _, _ = case("t5_small")
    assert to_model(graph, weights).SerializeToString() == to_model(graph, weights).SerializeToString()


# -- error paths no command line can stage (counted by the error catalogue, tests/test_diagnostics.py) -------------

BN_LINE = "  y, m, v = batchnorm(x, train=true)"  # a training-mode BatchNorm, its call at column 13


def _staged():  # imported lazily: the catalogue's own module defines Staged
    from test_error_catalogue_runtime import Staged

    tiny = "model m() {\n  input x: f32[2, 4]\n  output y = relu(x)\n}\n"

    def graph():
        from irc.runtime.graphs import graph_from_source

        return graph_from_source(tiny)

    def onnx_missing(mp: pytest.MonkeyPatch) -> None:
        import builtins

        real = builtins.__import__

        def fake(name, *args, **kwargs):
            if name == "onnx" or name.startswith("onnx."):
                raise ModuleNotFoundError("No module named 'onnx'", name="onnx")
            return real(name, *args, **kwargs)

        mp.setattr(builtins, "__import__", fake)
        from irc.backends.onnx import to_model

        to_model(graph(), {})

    def onnx_no_exporter(mp: pytest.MonkeyPatch) -> None:
        from irc.backends import onnx as exporter

        mp.delitem(exporter.EXPORTERS, "relu")
        exporter.to_model(graph(), {})

    def bn_train():
        from irc.runtime.graphs import graph_from_source

        return graph_from_source(f"model m() {{\n  input x: f32[2, 3, 4, 4]\n{BN_LINE}\n  output out = y\n}}\n")

    def onnx_training_mode(mp: pytest.MonkeyPatch) -> None:
        from irc.backends import onnx as exporter

        exporter.to_model(bn_train(), {})

    def torch_training_mode(mp: pytest.MonkeyPatch) -> None:
        from irc.backends import torch as emitter

        emitter.emit_source(bn_train())

    def torch_no_renderer(mp: pytest.MonkeyPatch) -> None:
        from irc.backends import torch as emitter

        mp.delitem(emitter.RENDERERS, "relu")
        emitter.emit_source(graph())

    def dot_missing(mp: pytest.MonkeyPatch) -> None:
        import shutil

        from irc.backends.dot import render

        mp.setattr(shutil, "which", lambda name: None)
        render("digraph g {}", "png")

    def dot_fails(mp: pytest.MonkeyPatch) -> None:
        import shutil
        import subprocess

        from irc.backends.dot import render

        mp.setattr(shutil, "which", lambda name: "/usr/bin/dot")
        mp.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, b"", b"Error: syntax error\n"))
        render("digraph g {", "svg")

    def depth_negative(mp: pytest.MonkeyPatch) -> None:
        from irc.backends.dot import emit_source

        emit_source(graph(), depth=-1)

    def binary_to_stdout(mp: pytest.MonkeyPatch) -> None:
        from irc.cli import build_parser

        args = build_parser().parse_args(["compile", str(MODEL_FILES["mlp"]), "--emit", "png"])
        args.func(args)

    return [
        Staged("export_onnx_not_installed", onnx_missing,
               "irc: error: --emit onnx needs the Python package 'onnx', which is not installed "
               "(pip install 'irc[onnx]')"),
        Staged("export_onnx_op_without_exporter", onnx_no_exporter,
               "<input>:3:14: error: onnx export: 'relu' has no exporter (add one to a table in "
               "backends/onnx/ops_*.py)\n     3 |   output y = relu(x)\n       |              ^~~~~~~"),
        *(Staged(f"export_{which}_training_mode", fn,
                 f"<input>:3:13: error: {which} export: 'batchnorm' with train=true runs in training mode (BatchNorm: "
                 "the batch's own statistics; a stacked recurrent layer: dropout between its layers), a training "
                 "step's forward (irc.ops.grad_train): export or compile the inference graph "
                 f"(leave train= out), and train with irc train\n     3 | {BN_LINE}\n       | {' ' * 12}^{'~' * 23}")
          for which, fn in (("onnx", onnx_training_mode), ("torch", torch_training_mode))),
        Staged("export_torch_op_without_renderer", torch_no_renderer,
               "<input>:3:14: error: torch export: 'relu' has no renderer (add one to a table in "
               "backends/torch/ops_*.py)\n     3 |   output y = relu(x)\n       |              ^~~~~~~"),
        Staged("export_dot_not_installed", dot_missing,
               "irc: error: --emit png needs Graphviz's 'dot' program, which is not on PATH: install Graphviz "
               "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; conda: conda install "
               "graphviz), or write DOT with --emit dot and render it elsewhere"),
        Staged("export_dot_failed", dot_fails, "irc: error: Graphviz's dot failed (exit 1): Error: syntax error"),
        Staged("export_depth_negative", depth_negative, "irc: error: --depth must be 0 or more, got -1"),
        Staged("export_binary_needs_output", binary_to_stdout,
               "irc: error: --emit png writes a binary file: give its path with -o (e.g. -o model.png)"),
    ]


EXPORT_STAGED = _staged()


def test_weights_past_the_protobuf_limit_go_to_a_data_file(tmp_path: Path, monkeypatch) -> None:
    """A 7B model's weights do not fit one protobuf (2 GiB): they are written beside it as ONNX external
    data, which ONNX Runtime reads (the limit is lowered here so a small model takes that path)."""
    import onnx

    import irc.backends.onnx as exporter

    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 1000)
    graph, weights, inputs, ref = case("mlp")
    from irc.runtime.weights import save_weights

    save_weights(tmp_path / "w.npz", weights)
    exporter.write_file(graph, str(tmp_path / "m.onnx"), weights_path=str(tmp_path / "w.npz"))
    assert (tmp_path / "m.onnx.data").stat().st_size >= 0.99 * sum(w.nbytes for w in weights.values())
    assert (tmp_path / "m.onnx").stat().st_size < 100_000
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert_close(dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs))), ref, "external data")


def test_exporters_were_written_for_the_attributes_ops_have(golden) -> None:
    """Every op's attribute names, as the ONNX and torch exporters were last written for them.

    An attribute an exporter does not read would export the default's graph for a node that asked
    for something else: when an op gains one, this golden changes. Make both exporters honour it
    (or refuse it with an error naming it), add a case to OP_MODELS, then rewrite the golden with
    pytest --update-golden.
    """
    from irc.backends.onnx import NO_EXPORT

    lines = [f"{name}: {', '.join(a.name for a in op.attrs) or '-'}" for name, op in sorted(OPS.items())
             if name not in NO_EXPORT]  # an op no exporter writes cannot export a default's graph
    golden.check(ROOT / "tests" / "golden" / "export" / "op_attributes.txt", "\n".join(lines) + "\n")
