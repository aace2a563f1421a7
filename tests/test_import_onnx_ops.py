"""ONNX import, one mapping at a time: small graphs built with onnx.helper, run by ONNX Runtime (the oracle)
and by irc's NumPy reference on the imported graph, within 1e-5; each also checks which irc ops it became."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from irc.analysis.params import count_params
from irc.backends.numpy_ref import run_graph
from irc.frontends.onnx.importer import onnx_weights
from irc.pipeline import load_graph

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def make(tmp: Path, nodes: list, inputs: dict[str, list], inits: dict[str, np.ndarray], outputs: list[str],
         opset: int = 17) -> Path:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, F, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp / "m.onnx"
    onnx.save(model, str(path))
    return path


def check(tmp: Path, nodes: list, inputs: dict[str, list], inits: dict[str, np.ndarray] | None = None,
          outputs: tuple[str, ...] = ("y",), ops: set[str] | None = None, bindings: dict[str, int] | None = None,
          opset: int = 17) -> object:
    """Import, run both, compare; ``ops``: the irc ops the graph must consist of (besides inputs and params)."""
    path = make(tmp, nodes, inputs, inits or {}, list(outputs), opset)
    graph = load_graph(path, bindings)
    sizes = {**(bindings or {})}
    feeds = {k: rand(*[sizes.get(d, d) if isinstance(d, str) else d for d in s]) for k, s in inputs.items()}
    want = ort.InferenceSession(str(path)).run(list(outputs), feeds)
    got = run_graph(graph, onnx_weights(path, graph), feeds, np.float64)
    for label, w in zip(outputs, want):
        g = np.asarray(got[label])
        assert g.shape == w.shape, label
        assert np.abs(g - w).max() <= 1e-5 * max(1.0, np.abs(w).max()), label
    if ops is not None:
        assert {n.op for n in graph.nodes} - {"input", "param"} == ops
    return graph


def test_matmul_square_initializer_is_transposed_to_irc_layout(tmp_path: Path) -> None:
    """ONNX MatMul's weight is [in, out], irc's linear [out, in]: on a square matrix no shape check catches a
    forgotten transpose, only the numbers do (the bias Add joins the linear)."""
    w = rand(6, 6)
    graph = check(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                  {"x": [3, 6]}, {"w": w, "b": rand(6)}, ops={"linear"})
    weights = onnx_weights(tmp_path / "m.onnx", graph)
    key = next(k for k in weights if k.endswith(".weight"))
    assert np.array_equal(weights[key], w.T)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_square_weight_follows_trans_b(tmp_path: Path, trans_b: int) -> None:
    check(tmp_path, [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=trans_b)], {"x": [2, 5]},
          {"w": rand(5, 5), "b": rand(5)}, ops={"linear"})


def test_gemm_with_alpha_and_two_activations(tmp_path: Path) -> None:
    check(tmp_path, [helper.make_node("Gemm", ["x", "z", "c"], ["y"], alpha=0.5, beta=2.0, transB=1)],
          {"x": [3, 4], "z": [5, 4]}, {"c": rand(5)}, ops={"transpose", "matmul", "mul", "add"})


def test_matmul_of_activations_batched(tmp_path: Path) -> None:
    check(tmp_path, [helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [2, 3, 4, 5], "b": [2, 3, 5, 6]},
          ops={"matmul"})


def test_conv_batchnorm_relu_with_symbolic_batch(tmp_path: Path) -> None:
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 2, 1, 2], strides=[2, 1], dilations=[1, 2],
                              group=2, kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"])]
    inits = {"w": rand(6, 2, 3, 3), "cb": rand(6), "g": rand(6), "b": rand(6), "m": rand(6),
             "v": np.abs(rand(6)) + 0.5}
    graph = check(tmp_path, nodes, {"x": ["N", 4, 9, 9]}, inits, ops={"conv2d", "batchnorm", "relu"},
                  bindings={"N": 2})
    assert count_params(graph)[0] == 6 * 2 * 9 + 6 + 12


def test_conv_transpose(tmp_path: Path) -> None:
    check(tmp_path, [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                                      output_padding=[1, 1])],
          {"x": [1, 4, 5, 5]}, {"w": rand(4, 3, 3, 3), "b": rand(3)}, ops={"conv_transpose2d"})


@pytest.mark.parametrize("lo, hi, op", [(0.0, 6.0, "relu6"), (-1.0, 2.0, "clamp")])
def test_clip(tmp_path: Path, lo: float, hi: float, op: str) -> None:
    check(tmp_path, [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"x": [2, 8]},
          {"lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}, ops={op})


@pytest.mark.parametrize("node, op", [
    (helper.make_node("HardSwish", ["x"], ["y"]), "hardswish"),
    (helper.make_node("HardSigmoid", ["x"], ["y"], alpha=1 / 6), "hardsigmoid"),
    (helper.make_node("Sigmoid", ["x"], ["y"]), "sigmoid"),
    (helper.make_node("Tanh", ["x"], ["y"]), "tanh"),
    (helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.2), "leaky_relu"),
    (helper.make_node("Softmax", ["x"], ["y"], axis=1), "softmax"),
], ids=lambda v: v if isinstance(v, str) else v.op_type)
def test_activations(tmp_path: Path, node, op: str) -> None:
    check(tmp_path, [node], {"x": [3, 7]}, ops={op})


@pytest.mark.parametrize("half_first", [False, True])
def test_erf_gelu_pattern_is_one_gelu(tmp_path: Path, half_first: bool) -> None:
    consts = {"sqrt2": np.array(math.sqrt(2), np.float32), "one": np.array(1, np.float32),
              "half": np.array(0.5, np.float32)}
    head = [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"])]
    if half_first:
        tail = [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    else:
        tail = [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    check(tmp_path, head + tail, {"x": [4, 5]}, consts, ops={"gelu"})


def test_scalar_operands_and_reversed_sub_div(tmp_path: Path) -> None:
    nodes = [helper.make_node("Sub", ["two", "x"], ["s"]), helper.make_node("Div", ["three", "s"], ["d"]),
             helper.make_node("Mul", ["d", "x"], ["y"])]
    graph = check(tmp_path, nodes, {"x": [2, 3]}, {"two": np.array(2.5, np.float32),
                                                    "three": np.array([3.0], np.float32)}, ops={"sub", "div", "mul"})
    assert [n.attrs.get("reverse") for n in graph.nodes if n.op in ("sub", "div")] == [True, True]


def test_pools_and_flatten(tmp_path: Path) -> None:
    nodes = [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2], pads=[1, 1, 1, 1],
                              count_include_pad=0),
             helper.make_node("GlobalAveragePool", ["a"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    check(tmp_path, nodes, {"x": [2, 3, 9, 9]}, ops={"maxpool2d", "avgpool2d", "global_avgpool", "reshape",
                                                      "flatten"})


def test_layernorm_and_param_operand(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "pos"], ["p"]),
             helper.make_node("LayerNormalization", ["p", "g", "b"], ["y"], epsilon=1e-6)]
    graph = check(tmp_path, nodes, {"x": ["B", 5, 8]}, {"pos": rand(1, 5, 8), "g": rand(8), "b": rand(8)},
                  ops={"add", "layernorm"}, bindings={"B": 3})
    assert count_params(graph)[0] == 40 + 16


def test_shape_ops(tmp_path: Path) -> None:
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),  # [2, 12] -> [2, 3, 4]
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),  # [2, 4, 3]
             helper.make_node("Unsqueeze", ["t", "ax0"], ["u"]),  # [1, 2, 4, 3]
             helper.make_node("Squeeze", ["u", "ax0"], ["s"]),
             helper.make_node("Split", ["s", "parts"], ["p0", "p1"], axis=1),  # [2, 1, 3], [2, 3, 3]
             helper.make_node("Concat", ["p1", "p0"], ["c"], axis=1),
             helper.make_node("Slice", ["c", "st", "en", "axs"], ["sl"]),  # [:, 1:3, 0:2]
             helper.make_node("Gather", ["sl", "idx"], ["g"], axis=1),  # [2, 2]
             helper.make_node("Expand", ["g", "eshape"], ["y"])]  # [3, 2, 2]
    inits = {"shape": i64(0, 3, -1), "ax0": i64(0), "parts": i64(1, 3), "st": i64(1, 0), "en": i64(3, 2),
             "axs": i64(1, 2), "idx": np.array(1, np.int64), "eshape": i64(3, 1, 1)}
    check(tmp_path, nodes, {"x": [2, 12]}, {k: v for k, v in inits.items()},
          ops={"reshape", "transpose", "split", "concat", "slice", "select", "expand"})


def test_shape_arithmetic_folds_to_symbolic_reshape(tmp_path: Path) -> None:
    """Shape → Gather → Unsqueeze → Concat → Reshape, as exporters write x.reshape(x.shape[0], -1)."""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["nu"]), helper.make_node("Concat", ["nu", "m1"], ["shp"],
                                                                                  axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["y"])]
    graph = check(tmp_path, nodes, {"x": ["B", 3, 4]}, {"zero": np.array(0, np.int64), "ax0": i64(0), "m1": i64(-1)},
                  ops={"reshape"}, bindings={"B": 2})
    unbound = load_graph(tmp_path / "m.onnx")
    assert str(unbound.nodes[-1].types[0]) == "f32[B,12]"
    assert graph.symbols == ["B"]


@pytest.mark.parametrize("mode, coord, op_mode", [("nearest", "asymmetric", "nearest"),
                                                  ("linear", "half_pixel", "bilinear"),
                                                  ("linear", "align_corners", "bilinear")])
def test_resize(tmp_path: Path, mode: str, coord: str, op_mode: str) -> None:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coord,
                            nearest_mode="floor")
    graph = check(tmp_path, [node], {"x": [1, 2, 3, 4]}, {"scales": np.array([1, 1, 2, 2], np.float32)},
                  ops={"upsample"})
    assert graph.nodes[-1].attrs["mode"] == op_mode


def test_shared_initializer_is_one_param(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Mul", ["a", "c"], ["y"])]
    graph = check(tmp_path, nodes, {"x": [2, 4]}, {"c": rand(4)}, ops={"add", "mul"})
    assert count_params(graph)[0] == 4


def test_gather_of_an_initializer_table_is_an_embedding(tmp_path: Path) -> None:
    path = tmp_path / "e.onnx"
    table = rand(10, 4)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", 3])],
                              [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(table, "table")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    ids = np.array([[1, 9, 0], [3, 3, 7]], np.int64)
    want = ort.InferenceSession(str(path)).run(None, {"ids": ids})[0]
    g = load_graph(path, {"B": 2})
    assert [n.op for n in g.nodes] == ["input", "embedding"]
    got = run_graph(g, onnx_weights(path, g), {"ids": ids}, np.float64)["y"]
    assert np.abs(got - want).max() <= 1e-6


def test_compile_prints_ir_that_parses_back_and_lint_runs(tmp_path: Path, irc_cli) -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    path = make(tmp_path, nodes, {"x": ["N", 3, 8, 8]}, {"w": rand(4, 3, 3, 3)}, ["y"])
    first = irc_cli(["compile", str(path), "-o", str(tmp_path / "m.ir")])
    assert first.rc == 0, first.err
    text = (tmp_path / "m.ir").read_text()
    assert "input : f32[N,3,8,8]" in text and "conv2d" in text
    again = irc_cli(["compile", str(tmp_path / "m.ir")])
    assert again.rc == 0 and again.out == text
    lint = irc_cli(["lint", str(path)])
    assert lint.rc == 0, lint.err


@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_spelled_out_before_opset_17_is_one_layernorm(tmp_path: Path, affine: bool) -> None:
    """torch exports nn.LayerNorm at opset 16 as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add."""
    import warnings

    import torch

    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(8, eps=1e-6, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.normal_()
            ln.bias.normal_()
    path = tmp_path / "ln.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ln, (torch.randn(2, 3, 8),), str(path), dynamo=False, opset_version=16,
                          do_constant_folding=False, input_names=["x"], output_names=["y"])
    assert "ReduceMean" in {n.op_type for n in onnx.load(str(path)).graph.node}
    x = rand(2, 3, 8)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    graph = load_graph(path)
    assert [n.op for n in graph.nodes] == ["input", "layernorm"]
    assert graph.nodes[1].attrs["eps"] == pytest.approx(1e-6) and graph.nodes[1].attrs["affine"] is affine
    assert count_params(graph)[0] == (16 if affine else 0)
    got = run_graph(graph, onnx_weights(path, graph), {"x": x}, np.float64)["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_layernorm_pattern_whose_mean_is_also_read_stays_unfused(tmp_path: Path) -> None:
    """The mean is a second output: fusing would drop a value the graph returns, so the pattern is refused and
    the ReduceMean, which irc cannot map, is reported."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["y"])]
    path = make(tmp_path, nodes, {"x": [2, 4]}, {}, ["y", "m"], opset=17)
    from irc.diagnostics import IrcError

    with pytest.raises(IrcError, match=r"ONNX node '' \(ReduceMean\)|ReduceMean_0' \(ReduceMean\)"):
        load_graph(path)


def test_analysis_never_opens_external_weights(tmp_path: Path, irc_cli) -> None:
    """Weights saved beside the model: analysis works with that file gone; a run reads it (and names it when gone)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    path = make(tmp_path, nodes, {"x": ["B", 64]}, {"w": rand(64, 32)}, ["y"])
    m = onnx.load(str(path))
    onnx.save(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.bin", size_threshold=0)
    ext = tmp_path / "ext.onnx"
    graph = load_graph(ext, {"B": 2})
    x = rand(2, 64)
    want = ort.InferenceSession(str(ext)).run(None, {"x": x})[0]
    got = run_graph(graph, onnx_weights(ext, graph), {"x": x}, np.float64)["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    (tmp_path / "ext.bin").unlink()
    analysed = irc_cli(["analyze", str(ext)])
    assert analysed.rc == 0 and "2,048" in analysed.out, analysed.err
    ran = irc_cli(["run", str(ext)])
    assert ran.rc == 1 and "'ext.bin' next to it, which does not exist" in ran.err


def test_tanh_gelu_as_torch_exports_it_is_one_gelu(tmp_path: Path) -> None:
    import warnings

    import torch

    path = tmp_path / "g.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.nn.GELU(approximate="tanh"), (torch.randn(2, 5),), str(path), dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"])
    assert "Tanh" in {n.op_type for n in onnx.load(str(path)).graph.node}
    x = rand(2, 5) * 3
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    graph = load_graph(path)
    assert [(n.op, n.attrs.get("approx")) for n in graph.nodes[1:]] == [("gelu", "tanh")]
    got = run_graph(graph, {}, {"x": x}, np.float64)["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_tanh_gelu_with_pow(tmp_path: Path) -> None:
    k = {"three": np.array(3, np.float32), "c": np.array(0.044715, np.float32),
         "s": np.array(math.sqrt(2 / math.pi), np.float32), "one": np.array(1, np.float32),
         "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["p", "c"], ["pc"]),
             helper.make_node("Add", ["x", "pc"], ["a"]), helper.make_node("Mul", ["s", "a"], ["t"]),
             helper.make_node("Tanh", ["t"], ["th"]), helper.make_node("Add", ["th", "one"], ["u"]),
             helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "u"], ["y"])]
    graph = check(tmp_path, nodes, {"x": [3, 4]}, k, ops={"gelu"})
    assert graph.nodes[-1].attrs["approx"] == "tanh"
