"""Every error the ONNX frontend raises, each from a small .onnx file this test builds, with its exact text.

The expected stderr of case NAME is ``tests/golden/errors/onnx_import/NAME.err`` (rewrite with
``pytest --update-golden`` and read every changed message). ``test_every_raise_has_a_case`` checks that
the cases reach every ``raise`` in frontends/onnx/ (or that UNREACHED says why one cannot be reached), as
tests/test_diagnostics.py does for the rest of irc.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from irc.diagnostics import IrcError, UsageError

GOLDEN = Path(__file__).resolve().parent / "golden" / "errors" / "onnx_import"
ROOT = Path(__file__).resolve().parents[1]
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def vi(name: str, shape: list | None, elem: int = F):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes: list, inputs: list, inits: dict[str, np.ndarray] | None = None, outputs: tuple[str, ...] = ("y",),
          opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, [vi(o, None) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def node(op: str, ins: list[str], outs: tuple[str, ...] = ("y",), name: str = "", **attrs) -> onnx.NodeProto:
    return helper.make_node(op, ins, list(outs), name=name or f"/block/{op}", **attrs)


X4 = [vi("x", ["B", 2, 8, 8])]
X2 = [vi("x", [3, 4])]
W = np.ones((4, 2, 3, 3), np.float32)
i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
f32 = lambda *v: np.array(v, np.float32)  # noqa: E731


def one(op: str, ins: list[str], inputs: list | None = None, inits: dict | None = None, outs=("y",), opset=17,
        **attrs) -> bytes:
    return model([node(op, ins, outs, **attrs)], inputs if inputs is not None else X4, inits, outs[:1], opset)


def _external(tmp: Path) -> bytes:
    """A model whose weights live in a side file that was then deleted."""
    m = onnx.load_from_string(one("Conv", ["x", "w"], inits={"w": np.ones((4, 2, 3, 3), np.float32)},
                                  kernel_shape=[3, 3]))
    onnx.save(m, str(tmp / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.weights", size_threshold=0)
    (tmp / "ext.weights").unlink()
    return (tmp / "ext.onnx").read_bytes()


@dataclass
class Case:
    name: str
    build: Callable[[Path], bytes]
    args: list[str] = field(default_factory=list)
    command: str = "analyze"
    exit: int = 1


def c(name: str, data: bytes | Callable[[Path], bytes], *args: str, command: str = "analyze", exit: int = 1) -> Case:
    return Case(name, data if callable(data) else (lambda tmp, d=data: d), list(args), command, exit)


def _with_input_type(t: onnx.TypeProto) -> bytes:
    v = onnx.ValueInfoProto(name="x", type=t)
    return model([node("Relu", ["x"])], [v])


_seq = onnx.TypeProto()
_seq.sequence_type.elem_type.tensor_type.elem_type = F
_noshape = onnx.TypeProto()
_noshape.tensor_type.elem_type = F
_unnamed = onnx.TypeProto()
_unnamed.tensor_type.elem_type = F
_unnamed.tensor_type.shape.dim.add()
_unnamed.tensor_type.shape.dim.add().dim_value = 4

CASES = [
    # the file itself
    c("malformed", b"\x08\x07\x12\xff\xff\xff\xff\x0fnot a protobuf at all"),
    c("no_nodes", model([], [vi("x", [2])], outputs=("x",))),
    c("external_weights_missing", _external, "-D", "B=1", command="run"),
    c("decimal_define", one("Relu", ["x"]), "-D", "B=0.5", exit=2),
    # graph inputs
    c("input_not_tensor", _with_input_type(_seq)),
    c("input_dtype", model([node("Relu", ["x"])], [vi("x", [2, 3], TensorProto.UINT8)])),
    c("input_no_shape", _with_input_type(_noshape)),
    c("input_zero_size", model([node("Relu", ["x"])], [vi("x", [0, 3])])),
    c("input_unnamed_dynamic_size", _with_input_type(_unnamed)),
    c("input_bad_dim_param", model([node("Relu", ["x"])], [vi("x", ["batch size", 3])])),
    c("initializer_dtype", one("Add", ["x", "s"], X2, {"s": np.array([1, 2, 3, 4], np.uint16)})),
    # the graph
    c("output_constant", model([node("Constant", [], value=numpy_helper.from_array(f32(1.0), "k"))], X2)),
    c("undefined_value", one("Relu", ["nowhere"], X2)),
    c("custom_domain", model([helper.make_node("Fancy", ["x"], ["y"], name="/fancy", domain="com.example")], X2)),
    c("constant_sparse", model([node("Constant", [], ("k",), sparse_value=helper.make_sparse_tensor(
        numpy_helper.from_array(f32(1.0)), numpy_helper.from_array(i64(0)), [2])), node("Add", ["x", "k"])], X2)),
    c("unmapped_op", one("Pad", ["x", "pads"], inits={"pads": i64(0, 0, 1, 1, 0, 0, 1, 1)})),
    c("dynamic_shape", model([node("Shape", ["x"], ("s",)), node("Cast", ["s"], ("f",), name="/cast", to=F),
                              node("Sqrt", ["f"], ("r",), name="/sqrt"), node("Mul", ["x", "r"])], X4)),
    c("symbolic_operand", model([node("Shape", ["x"], ("s",)), node("Add", ["x", "s"])], X4)),
    c("integer_operand", one("Add", ["x", "k"], X2, {"k": i64(1, 2, 3, 4)})),
    c("irc_refuses_shapes", one("Add", ["x", "z"], [vi("x", [3, 4]), vi("z", [5])])),
    c("weight_shape", one("Conv", ["x", "w"], inits={"w": np.ones((4, 3, 3, 3), np.float32)}, kernel_shape=[3, 3])),
    # layers
    c("conv_weight_is_input", one("Conv", ["x", "w"], [*X4, vi("w", [4, 2, 3, 3])])),
    c("conv_same_stride", one("Conv", ["x", "w"], inits={"w": W}, auto_pad="SAME_UPPER", strides=[2, 2])),
    c("conv_asymmetric_pads", one("Conv", ["x", "w"], inits={"w": W}, pads=[0, 0, 1, 1])),
    c("conv_kernel_shape", one("Conv", ["x", "w"], inits={"w": W}, kernel_shape=[5, 5])),
    c("conv_3d", one("Conv", ["x", "w"], [vi("x", [1, 2, 4, 4, 4])], {"w": np.ones((4, 2, 1, 1, 1), np.float32)})),
    c("conv_transpose_output_shape", one("ConvTranspose", ["x", "w"], inits={"w": W}, output_shape=[16, 16])),
    c("conv_transpose_auto_pad", one("ConvTranspose", ["x", "w"], inits={"w": W}, auto_pad="SAME_UPPER")),
    c("batchnorm_training", one("BatchNormalization", ["x", "g", "b", "m", "v"], outs=("y", "rm", "rv"),
                                inits={k: np.ones(2, np.float32) for k in "gbmv"}, training_mode=1)),
    c("layernorm_axis", one("LayerNormalization", ["x", "g"], inits={"g": np.ones((2, 8, 8), np.float32)},
                            axis=1)),
    c("layernorm_stats", one("LayerNormalization", ["x", "g"], outs=("y", "mean"),
                             inits={"g": np.ones(8, np.float32)})),
    c("matmul_vector", one("MatMul", ["x", "v"], [vi("x", [3, 4]), vi("v", [4])])),
    c("pool_ceil_mode", one("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    c("pool_auto_pad", one("MaxPool", ["x"], kernel_shape=[3, 3], auto_pad="SAME_UPPER")),
    c("maxpool_indices", one("MaxPool", ["x"], outs=("y", "idx"), kernel_shape=[2, 2])),
    c("avgpool_dilated", one("AveragePool", ["x"], kernel_shape=[2, 2], dilations=[2, 2], opset=19)),
    c("global_pool_rank", one("GlobalAveragePool", ["x"], [vi("x", [1, 2, 8])])),
    c("reduce_mean_axes", one("ReduceMean", ["x"], axes=[3], keepdims=0)),
    # primitives
    c("dropout_mask", one("Dropout", ["x"], outs=("y", "mask"))),
    c("hardsigmoid_slope", one("HardSigmoid", ["x"], alpha=0.2)),
    c("clip_runtime_bound", one("Clip", ["x", "lo"], [*X4, vi("lo", [])])),
    c("max_three", one("Max", ["x", "x", "x"])),
    c("softmax_old_opset", one("Softmax", ["x"], opset=11, axis=1)),
    c("reshape_runtime_shape", one("Reshape", ["x", "s"], [*X4, vi("s", [2], I64)])),
    c("squeeze_size", one("Squeeze", ["x", "a"], inits={"a": i64(1)})),
    c("slice_step", one("Slice", ["x", "st", "en", "ax", "sp"], inits={"st": i64(0), "en": i64(8), "ax": i64(2),
                                                                       "sp": i64(2)})),
    c("gather_runtime_indices", one("Gather", ["x", "i"], [*X4, vi("i", [2], I64)])),
    c("gather_many", one("Gather", ["x", "i"], inits={"i": i64(0, 1)}, axis=1)),
    c("expand_mismatch", one("Expand", ["x", "s"], inits={"s": i64(1, 3, 8, 8)})),
    c("cast_dtype", one("Cast", ["x"], to=TensorProto.DOUBLE)),
    c("resize_rank", one("Resize", ["x", "", "s"], [vi("x", [1, 2, 8])], {"s": f32(1, 1, 2)})),
    c("resize_sizes_fraction", one("Resize", ["x", "", "", "z"], [vi("x", [1, 2, 8, 8])], {"z": i64(1, 2, 12, 12)})),
    c("resize_sizes_channels", one("Resize", ["x", "", "", "z"], [vi("x", [1, 2, 8, 8])], {"z": i64(1, 4, 16, 16)})),
    c("resize_fractional_scale", one("Resize", ["x", "", "s"], inits={"s": f32(1, 1, 1.5, 1.5)})),
    c("resize_no_scale", one("Resize", ["x"], opset=10, mode="nearest")),
    c("resize_mode", one("Resize", ["x", "", "s"], inits={"s": f32(1, 1, 2, 2)}, mode="cubic")),
]

# raise sites no file can reach, and why
UNREACHED: dict[tuple[str, str], str] = {
    ("frontends/onnx/reader.py", "needs the Python package 'onnx'"): "staged by test_without_the_onnx_package",
    ("frontends/onnx/convert.py", "is not available in this build"): "every op the mappings name is registered",
    ("frontends/onnx/importer.py", "gives no value for the weight"):
        "the importer records a source for every weight key it creates",
    ("frontends/onnx/reader.py", "has no dtype for"): "reached through initializer_dtype",
}


def _write(case: Case, tmp: Path) -> Path:
    path = tmp / f"{case.name}.onnx"
    path.write_bytes(case.build(tmp))
    return path


@pytest.mark.parametrize("case", CASES, ids=lambda k: k.name)
def test_error_text(case: Case, tmp_path: Path, irc_cli, golden) -> None:
    path = _write(case, tmp_path)
    result = irc_cli([case.command, path.name, *case.args], cwd=tmp_path)
    assert result.rc == case.exit, result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    golden.check(GOLDEN / f"{case.name}.err", result.err)


def raise_case(case: Case, tmp: Path) -> IrcError | UsageError:
    from irc.frontends.onnx.importer import onnx_weights
    from irc.pipeline import load_graph, parse_defines

    path = _write(case, tmp)
    try:
        defines = parse_defines([a for a in case.args if a != "-D"])
        graph = load_graph(path, defines)
        if case.command == "run":
            onnx_weights(path, graph)
    except (IrcError, UsageError) as e:
        return e
    raise AssertionError(f"case {case.name} raised no error")


def test_without_the_onnx_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from irc.diagnostics import render
    from irc.frontends.onnx.reader import need_onnx

    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(IrcError) as info:
        need_onnx()
    assert render(info.value, color=False) == ("irc: error: reading .onnx files needs the Python package 'onnx', "
                                               "which is not installed (pip install 'irc[onnx]')")


def test_every_raise_has_a_case(tmp_path: Path) -> None:
    reached = set()
    for i, case in enumerate(CASES):
        folder = tmp_path / str(i)
        folder.mkdir()
        reached.add(raise_case(case, folder).origin)
    missing = []
    for path in sorted((ROOT / "frontends" / "onnx").glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        for no, line in enumerate(lines, start=1):
            if not re.search(r"\braise (IrcError|UsageError|imp\.|self\.)", line):
                continue
            text = "\n".join(lines[no - 1:no + 3])
            if f"{rel}:{no}" in reached or any(f == rel and s in text for (f, s) in UNREACHED):
                continue
            missing.append(f"{rel}:{no}: {line.strip()}")
    assert not missing, "raises no case reaches:\n" + "\n".join(missing)
