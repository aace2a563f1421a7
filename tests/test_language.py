"""The .arch language (issue 2, item 3), and the golden dumps checked against independent oracles.

Part 1 tests each language feature on a small model. Part 2 re-derives the shapes in the
non-trivial golden dumps (tests/golden/ops/*.ir) with PyTorch and NumPy, and parameter
counts with the chapter's formulas and torch.nn modules, so a golden is never just irc's
own output read back.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from irc.analysis.params import count_params, weight_table
from irc.diagnostics import IrcError
from irc.dims import Sym, prod, subs
from irc.graph import Graph
from irc.ir_parser import parse_ir
from irc.pipeline import load_graph
from irc.types import TensorType

OPS_DIR = Path(__file__).resolve().parent / "golden" / "ops"


def compile_text(tmp_path: Path, text: str, bindings: dict[str, int] | None = None,
                 name: str = "model.arch") -> Graph:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_graph(path, bindings)


def types(graph: Graph) -> dict[str, str]:
    return {v: str(t) for v, t in graph.value_types().items()}


def params_under(graph: Graph, prefix: str) -> int:
    params, _ = weight_table(graph)
    total = sum(prod(s) for k, s in params.items() if k.startswith(prefix + "."))
    assert isinstance(total, int)
    return total


def node(graph: Graph, value: str):
    return next(n for n in graph.nodes if value in n.outputs)


# ==== Part 1: language features ==========================================================


def test_comments_and_semicolons_change_nothing(tmp_path: Path) -> None:
    plain = "model m(B) {\n  input x: f32[B, 8]\n  h = relu(x)\n  output y = linear(h, 4)\n}\n"
    commented = (
        "# a file comment\nmodel m(B) { # after the brace\n"
        "  # a whole line\n  input x: f32[B, 8]   # after a statement\n"
        "  h = relu(x);\n  output y = linear(h, 4) # the end\n}\n# trailing\n"
    )
    a = compile_text(tmp_path, plain, name="a.arch")
    b = compile_text(tmp_path, commented, name="b.arch")
    assert types(a) == types(b) == {"x": "f32[B,8]", "h": "f32[B,8]", "y": "f32[B,4]"}


def test_header_symbols_stay_symbolic_and_bind(tmp_path: Path) -> None:
    text = "model m(B, T, D) {\n  input x: f32[B, T, D]\n  output y = linear(x, 2 * D)\n}\n"
    g = compile_text(tmp_path, text)
    assert g.symbols == ["B", "T", "D"]
    y = node(g, "y").type
    assert y.shape == (Sym.var("B"), Sym.var("T"), 2 * Sym.var("D"))
    bound = compile_text(tmp_path, text, {"T": 64, "D": 16})
    assert str(node(bound, "y").type) == "f32[B,64,32]"
    assert bound.bindings == {"T": 64, "D": 16}


@pytest.mark.parametrize("expr, value", [
    ("round_up(8*d/3, 256)", 11_008),  # SwiGLU width at d = 4,096 (the chapter's 11,008)
    ("8*d/3*3/8", 4096),  # exact rationals: no float rounding on the way
    ("d + 4 - 2*2", 4096), ("d // 3", 1365), ("d / 8", 512), ("ceil(d/3)", 1366), ("floor(d/3)", 1365),
    ("min(d, 100, 7*3)", 21), ("max(3, d/2)", 2048), ("round_up(d + 1, 128)", 4224), ("(d - 96) * 2 // 5", 1600),
])
def test_constant_arithmetic(tmp_path: Path, expr: str, value: int) -> None:
    text = f"model m(B) {{\n  const d = 4096, w = {expr}\n  input x: f32[B, 8]\n  output y = linear(x, w)\n}}\n"
    assert node(compile_text(tmp_path, text), "y").attrs["out"] == value


def test_define_overrides_a_model_constant(tmp_path: Path) -> None:
    text = "model m(B) {\n  const w = 8, layers = 4\n  input x: f32[B, 8]\n" \
           "  block f(h) { return linear(h, w) }\n  output y = repeat(layers) f(x)\n}\n"
    assert len(compile_text(tmp_path, text).nodes) == 1 + 4
    g = compile_text(tmp_path, text, {"layers": 2, "w": 8})
    assert len(g.nodes) == 1 + 2


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64", "i32", "i64"])
def test_typed_inputs_of_each_dtype(tmp_path: Path, dtype: str) -> None:
    op = "embedding(x, 10, 4)" if dtype.startswith("i") else "relu(x)"
    out = "f32[B,3,4]" if dtype.startswith("i") else f"{dtype}[B,3]"
    g = compile_text(tmp_path, f"model m(B) {{\n  input x: {dtype}[B, 3]\n  output y = {op}\n}}\n")
    assert types(g) == {"x": f"{dtype}[B,3]", "y": out}


def test_positional_and_keyword_arguments_mean_the_same(tmp_path: Path) -> None:
    text = ("model m(B) {\n  input x: f32[B, 3, 16, 16]\n  a = conv2d(x, 8, 3, 2, 1, 1, 1, false)\n"
            "  b = conv2d(x, out=8, kernel=3, stride=2, padding=1, bias=false)\n"
            "  c = conv2d(x, 8, 3, padding=1, stride=2, bias=false)\n  output y = a + b + c\n}\n")
    g = compile_text(tmp_path, text)
    assert node(g, "a").attrs == node(g, "b").attrs == node(g, "c").attrs
    assert str(node(g, "a").type) == "f32[B,8,8,8]"


def test_named_instance_called_twice_shares_one_weight(tmp_path: Path) -> None:
    text = ("model m(B) {\n  input x: f32[B, 16]\n  proj = linear(16)\n"
            "  a = proj(x)\n  b = proj(a)\n  c = linear(b, 16)\n  output y = c\n}\n")
    g = compile_text(tmp_path, text)
    params, _ = weight_table(g)
    assert sorted(params) == ["c.bias", "c.weight", "proj.bias", "proj.weight"]
    assert node(g, "a").weights == node(g, "b").weights == "proj"
    assert count_params(g)[0] == 2 * (16 * 16 + 16)


def test_tied_unembedding_reuses_the_embedding_table(tmp_path: Path) -> None:
    text = ("model m(B, T) {{\n  input t: i32[B, T]\n  emb = embedding(1000, 64)\n"
            "  output logits = unembed(emb(t), {head})\n}}\n")
    tied = compile_text(tmp_path, text.format(head="tied=emb"), name="tied.arch")
    untied = compile_text(tmp_path, text.format(head="1000"), name="untied.arch")
    assert sorted(weight_table(tied)[0]) == ["emb.weight"]
    assert count_params(tied)[0] == 1000 * 64
    assert count_params(untied)[0] == 2 * 1000 * 64
    assert str(node(tied, "logits").type) == "f32[B,T,1000]"


@pytest.mark.parametrize("a, b", [
    ((8, 1, 6, 1), (7, 1, 5)), ((5, 4), (1,)), ((15, 3, 5), (15, 1, 5)), ((3, 1), (1, 4)), ((1,), (2, 3, 4)),
])
@pytest.mark.parametrize("op", ["+", "-", "*", "/"])
def test_broadcasting_matches_numpy(tmp_path: Path, a: tuple, b: tuple, op: str) -> None:
    def shape(s: tuple) -> str:
        return ", ".join(map(str, s))
    text = f"model m() {{\n  input a: f32[{shape(a)}]\n  input b: f32[{shape(b)}]\n  output y = a {op} b\n}}\n"
    want = np.broadcast_shapes(a, b)
    assert node(compile_text(tmp_path, text), "y").type.shape == want


_FLOATS = ["f16", "bf16", "f32", "f64"]


@pytest.mark.parametrize("x, y", [(x, y) for x in _FLOATS for y in _FLOATS])
def test_float_promotion_matches_torch(tmp_path: Path, x: str, y: str) -> None:
    _check_promotion(tmp_path, x, y)


_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


def _check_promotion(tmp_path: Path, x: str, y: str) -> None:
    want = {v: k for k, v in _TORCH.items()}[torch.promote_types(_TORCH[x], _TORCH[y])]
    text = f"model m(B) {{\n  input a: {x}[B, 4]\n  input b: {y}[4]\n  output o = a + b\n}}\n"
    assert node(compile_text(tmp_path, text), "o").type.dtype == want


def test_scalar_operands_and_negation(tmp_path: Path) -> None:
    text = "model m(B) {\n  input x: f32[B, 4]\n  a = 2 * x\n  b = 1 - a\n  c = a / 4\n  output y = -c\n}\n"
    g = compile_text(tmp_path, text)
    assert node(g, "a").attrs == {"scalar": 2.0, "reverse": None}
    assert node(g, "b").attrs == {"scalar": 1.0, "reverse": True}
    assert node(g, "c").attrs == {"scalar": 4.0, "reverse": None}
    assert node(g, "y").op == "mul" and node(g, "y").attrs["scalar"] == -1.0


def test_blocks_with_default_parameters(tmp_path: Path) -> None:
    text = ("model m(B) {\n  const d = 8\n  input x: f32[B, d]\n"
            "  block proj(h, width=2*d, bias=true) { return linear(h, width, bias=bias) }\n"
            "  a = proj(x)\n  b = proj(a, 3)\n  c = proj(b, bias=false, width=5)\n  output y = c\n}\n")
    g = compile_text(tmp_path, text)
    assert [n.attrs for n in g.nodes if n.op == "linear"] == [
        {"out": 16, "bias": True}, {"out": 3, "bias": True}, {"out": 5, "bias": False}]
    assert [n.scope for n in g.nodes if n.op == "linear"] == ["proj.linear", "proj_1.linear", "proj_2.linear"]


def test_repeat_makes_numbered_scopes_with_their_own_weights(tmp_path: Path) -> None:
    text = ("model m(B, T) {\n  const d = 64\n  input x: f32[B, T, d]\n"
            "  block decoder(h) {\n    a = h + attention(layernorm(h), heads=4)\n"
            "    return a + ffn(layernorm(a), hidden=4*d)\n  }\n  output y = repeat(6) decoder(x)\n}\n")
    g = compile_text(tmp_path, text)
    scopes = sorted({n.scope.split(".")[1] for n in g.nodes if n.scope.startswith("decoder.")}, key=int)
    assert scopes == [str(i) for i in range(6)]
    d = 64
    per_layer = 4 * d * d + (d * 4 * d + 4 * d + 4 * d * d + d) + 2 * 2 * d  # attention, ffn, two layernorms
    assert params_under(g, "decoder.0") == per_layer
    assert count_params(g)[0] == 6 * per_layer


def test_several_outputs_keep_their_order(tmp_path: Path) -> None:
    text = "model m(B) {\n  input x: f32[B, 4]\n  output first = relu(x)\n  output second = tanh(x)\n" \
           "  h = sigmoid(x)\n  output h\n}\n"
    g = compile_text(tmp_path, text)
    assert [label for label, _ in g.outputs] == ["first", "second", "h"]


def test_use_brings_blocks_and_constants_from_other_files(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "base.arch").write_text("const width = 24\n", encoding="utf-8")
    (tmp_path / "lib" / "blocks.arch").write_text(
        'use "base.arch"\nblock widen(x, by=2) { return linear(x, width * by) }\n', encoding="utf-8")
    text = 'use "lib/blocks.arch"\nmodel m(B) {\n  input x: f32[B, width]\n  output y = widen(x, by=3)\n}\n'
    g = compile_text(tmp_path, text)
    assert types(g) == {"x": "f32[B,24]", "widen.linear": "f32[B,72]"}
    lin = node(g, "widen.linear")
    assert lin.loc is not None and lin.loc.file.endswith("blocks.arch") and lin.loc.line == 2


def test_multi_result_assignment(tmp_path: Path) -> None:
    text = ("model m(B, T) {\n  input x: f32[B, T, 16]\n  y, h, c = lstm(x, 32)\n"
            "  q, k, v = split(linear(y, 96), 3)\n  s = gru(x, 8)\n"
            "  output o1 = y\n  output o2 = h\n  output o3 = c\n  output o4 = v\n  output o5 = s\n}\n")
    g = compile_text(tmp_path, text)
    vt = g.value_types()
    out = {label: str(vt[v]) for label, v in g.outputs}
    assert out == {"o1": "f32[B,T,32]", "o2": "f32[B,32]", "o3": "f32[B,32]", "o4": "f32[B,T,32]",
                   "o5": "f32[B,T,8]"}


def test_multi_result_values_take_the_assigned_names(tmp_path: Path) -> None:
    text = ("model m(B, T) {\n  input x: f32[B, T, 16]\n"
            "  block heads(h) {\n    q, k, v = split(h, 3, axis=1)\n    return q + k + v\n  }\n"
            "  input w: f32[B, 6, 4]\n  a = heads(w)\n  b = heads(w)\n"
            "  y, h, c = lstm(x, 32)\n"
            "  s1 = relu(gru(x, 8))\n  s2 = relu(gru(x, 8))\n"
            "  output o1 = a\n  output o2 = b\n  output o3 = s2\n  output o4 = c\n}\n")
    g = compile_text(tmp_path, text)
    outputs = {n.op + ":" + ",".join(n.outputs) for n in g.nodes if len(n.outputs) > 1}
    assert outputs == {"split:heads.q,heads.k,heads.v", "split:heads_1.q,heads_1.k,heads_1.v",
                       "lstm:y,h,c", "gru:gru,gru.h", "gru:gru.1,gru.1.h"}
    params, _ = weight_table(g)  # the weights keep the layer's name: lstm.weight_ih, not y.weight_ih
    assert {k.split(".")[0] for k in params} == {"lstm", "gru", "gru_1"}


def test_use_cycle_through_another_folder_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.arch").write_text('use "../model.arch"\nconst w = 4\n', encoding="utf-8")
    text = 'use "sub/b.arch"\nmodel m(B) {\n  input x: f32[B, w]\n  output y = relu(x)\n}\n'
    (tmp_path / "model.arch").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(IrcError, match="'use' cycle: model.arch → sub/b.arch → model.arch") as info:
        load_graph("model.arch")
    assert info.value.loc is not None and (info.value.loc.file, info.value.loc.line) == ("sub/b.arch", 1)


def test_a_file_used_twice_by_different_paths_is_loaded_once(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    (tmp_path / "common.arch").write_text("block twice(x) { return x + x }\n", encoding="utf-8")
    (tmp_path / "a" / "one.arch").write_text('use "../common.arch"\n', encoding="utf-8")
    (tmp_path / "b" / "two.arch").write_text('use "../a/../common.arch"\n', encoding="utf-8")
    text = ('use "a/one.arch"\nuse "b/two.arch"\nmodel m(B) {\n  input x: f32[B, 4]\n'
            "  output y = twice(x)\n}\n")
    assert types(compile_text(tmp_path, text))["twice.add"] == "f32[B,4]"


@pytest.mark.parametrize("expr", ["1e999999999", "1e-999999999", "10 ** 10 ** 10", "2 ** 4000000000",
                                  "(1/3) ** 100000000", "round_up(9 * 10 ** 299, 7 * 10 ** 299)",
                                  "T ** 1000000", "sqrt(10 ** 299) ** 1000"])
def test_huge_numbers_are_refused_at_once(tmp_path: Path, expr: str) -> None:
    text = f"model m(B, T) {{\n  input x: f32[B, T]\n  const c = {expr}\n  output y = relu(x)\n}}\n"
    start = time.perf_counter()
    with pytest.raises(IrcError, match="out of range|powers 0 to 64") as info:
        compile_text(tmp_path, text)
    assert time.perf_counter() - start < 2.0
    assert info.value.loc is not None and info.value.loc.line == 3


def test_split_into_a_huge_count_is_refused_at_once(tmp_path: Path) -> None:
    text = "model m(B) {\n  input x: f32[B, 8]\n  y = split(x, 10 ** 9)\n  output y\n}\n"
    start = time.perf_counter()
    with pytest.raises(IrcError, match="must be at most 4,096"):
        compile_text(tmp_path, text)
    assert time.perf_counter() - start < 2.0


def test_symbolic_powers_and_exact_division(tmp_path: Path) -> None:
    text = ("model m(B, T) {\n  input x: f32[B, T ** 2]\n  a = reshape(x, [B, T, -1])\n"
            "  b = reshape(a, [B * T, T * T // T])\n  output y = reshape(b, [(B * T ** 2) / (B * T), -1])\n}\n")
    g = compile_text(tmp_path, text)
    got = types(g)
    assert (got["x"], got["a"], got["b"], got["y"]) == ("f32[B,T*T]", "f32[B,T,T]", "f32[B*T,T]", "f32[T,B*T]")
    want = np.empty((2, 9)).reshape(2, 3, -1).reshape(6, 3).reshape(3, -1).shape
    assert subs(node(g, "y").type.shape[1], {"B": 2, "T": 3}) == want[1]


def test_deep_nesting_is_an_error_at_its_place_and_nested_blocks_still_build(tmp_path: Path) -> None:
    text = "model m(B) {\n  input x: f32[B, 8]\n  output y = x" + " + x" * 3000 + "\n}\n"
    with pytest.raises(IrcError, match="nests deeper than 100 levels") as info:
        compile_text(tmp_path, text)
    assert (info.value.loc.line, info.value.loc.col) == (3, 14)
    # 64 blocks (the block limit), each calling the last 45 calls deep: 2,900 nested Python calls
    lines = ["model m(B) {", "  input x: f32[B, 8]", "  block b0(h) { return h" + " + h" * 80 + " }"]
    lines += [f"  block b{i}(h) {{ return " + "relu(" * 45 + f"b{i - 1}(h)" + ")" * 45 + " }" for i in range(1, 64)]
    g = compile_text(tmp_path, "\n".join([*lines, "  output y = b63(x)", "}"]) + "\n")
    assert len(g.nodes) == 1 + 80 + 63 * 45


@pytest.mark.parametrize("expr", ["T * (1/2)", "T + 0.5", "T * sqrt(4)"])
def test_symbolic_sizes_refuse_non_integers(tmp_path: Path, expr: str) -> None:
    text = f"model m(B, T) {{\n  input x: f32[B, T]\n  const c = {expr}\n  output y = relu(x)\n}}\n"
    with pytest.raises(IrcError, match="symbolic size T and the non-integer"):
        compile_text(tmp_path, text)


# ==== Part 2: the goldens against PyTorch, NumPy and the chapter ==========================


def golden_types(name: str) -> dict[str, TensorType]:
    return parse_ir((OPS_DIR / f"{name}.ir").read_text(encoding="utf-8")).value_types()


def concrete(t: TensorType, env: dict[str, int]) -> tuple[int, ...]:
    dims = tuple(subs(d, env) for d in t.shape)
    assert all(isinstance(d, int) for d in dims), t
    return dims


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


def conv(x: tuple, out: int, k, groups: int = 1, **kw) -> tuple[int, ...]:
    ks = k if isinstance(k, tuple) else (k,) * (len(x) - 2)
    fn = F.conv1d if len(x) == 3 else F.conv2d
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # padding='same' with an even kernel
        return tuple(fn(meta(*x), meta(out, x[1] // groups, *ks), groups=groups, **kw).shape)


# (golden, value, bindings for its symbols, the shape PyTorch computes with B = 1)
SHAPE_ORACLES = [
    ("conv2d_padding", "a", {}, lambda: conv((1, 3, 32, 32), 16, 3, padding=1)),
    ("conv2d_padding", "b", {}, lambda: conv((1, 3, 32, 32), 16, 3)),
    ("conv2d_padding", "c", {}, lambda: conv((1, 3, 32, 32), 16, 5, padding="same")),
    ("conv2d_padding", "d", {}, lambda: conv((1, 3, 32, 32), 16, 5, padding="valid")),
    ("conv2d_padding", "e", {}, lambda: conv((1, 3, 32, 32), 8, 3, padding="same", dilation=2)),
    ("conv2d_padding", "f", {}, lambda: conv((1, 3, 32, 32), 8, 4, padding="same")),
    ("conv2d_stride", "a", {}, lambda: conv((1, 3, 224, 224), 64, 7, stride=2, padding=3)),
    ("conv2d_stride", "b", {}, lambda: conv((1, 8, 7, 7), 8, 3, stride=2, padding=1)),
    ("conv2d_stride", "c", {}, lambda: conv((1, 8, 10, 10), 8, 3, stride=3)),
    ("conv2d_stride", "d", {}, lambda: conv((1, 64, 56, 56), 128, 1, stride=2)),
    ("conv2d_dilation", "a", {}, lambda: conv((1, 4, 32, 32), 8, 3, dilation=2)),
    ("conv2d_dilation", "b", {}, lambda: conv((1, 4, 17, 17), 8, 3, padding=1, dilation=3)),
    ("conv2d_dilation", "c", {}, lambda: conv((1, 4, 32, 32), 8, 3, stride=2, padding=2, dilation=2)),
    ("conv2d_groups", "a", {"H": 9, "W": 12}, lambda: conv((1, 8, 9, 12), 16, 3, groups=4, padding=1)),
    ("conv2d_groups", "b", {}, lambda: conv((1, 32, 14, 14), 32, 3, groups=32, padding=1)),
    ("conv2d_pairs", "a", {}, lambda: conv((1, 3, 15, 20), 6, (3, 5), stride=(2, 1), padding=(1, 2),
                                           dilation=(1, 2))),
    ("conv2d_symbolic_bound", "a", {}, lambda: conv((1, 3, 224, 225), 16, 3, stride=2, padding=1)),
    ("conv1d", "b", {"L": 37}, lambda: conv((1, 16, 37), 32, 3, stride=2)),
    ("conv1d", "c", {}, lambda: conv((1, 16, 100), 8, 5, stride=3, padding=2, dilation=2)),
    ("conv1d", "d", {}, lambda: conv((1, 16, 100), 8, 7, padding="valid")),
    ("conv1d", "e", {}, lambda: conv((1, 16, 100), 8, 4, groups=4, padding="same")),
    ("maxpool2d", "a", {}, lambda: F.max_pool2d(meta(1, 64, 112, 112), 3, 2, 1).shape),
    ("maxpool2d", "b", {}, lambda: F.max_pool2d(meta(1, 64, 112, 112), 2).shape),
    ("maxpool2d", "c", {}, lambda: F.max_pool2d(meta(1, 64, 112, 112), 3, stride=1, dilation=2).shape),
    ("maxpool2d", "d", {}, lambda: F.max_pool2d(meta(1, 4, 10, 9), (2, 3), stride=(2, 1)).shape),
    ("avgpool2d", "a", {}, lambda: F.avg_pool2d(meta(1, 64, 56, 56), 2).shape),
    ("avgpool2d", "b", {}, lambda: F.avg_pool2d(meta(1, 64, 56, 56), 3, 1, 1, count_include_pad=False).shape),
    ("avgpool2d", "c", {}, lambda: F.avg_pool2d(meta(1, 64, 56, 56), (3, 2), stride=2).shape),
    ("pool1d", "a", {}, lambda: F.max_pool1d(meta(1, 8, 50), 3, stride=2).shape),
    ("pool1d", "b", {}, lambda: F.max_pool1d(meta(1, 8, 50), 2, padding=1, dilation=2).shape),
    ("pool1d", "c", {}, lambda: F.avg_pool1d(meta(1, 8, 50), 4).shape),
    ("pool1d", "d", {}, lambda: F.avg_pool1d(meta(1, 8, 50), 3, 1, 1).shape),
    ("global_pool", "c", {"H": 13, "W": 17}, lambda: F.adaptive_avg_pool2d(meta(1, 512, 13, 17), 7).shape),
    ("global_pool", "a", {"H": 13, "W": 17}, lambda: meta(1, 512, 13, 17).mean((2, 3)).shape),
    ("flatten", "a", {}, lambda: meta(1, 512, 7, 7).flatten(1).shape),
    ("flatten", "b", {"T": 5}, lambda: meta(1, 5, 64).flatten(0, 1).shape),
    ("flatten", "c", {}, lambda: np.empty((2, 3, 4, 5)).reshape(2, 12, 5).shape),
    ("reshape", "a", {}, lambda: np.empty((2, 3, 4)).reshape(6, -1).shape),
    ("reshape", "d", {"T": 5}, lambda: meta(1, 5, 768).reshape(-1, 768).shape),
    ("transpose", "b", {"T": 5}, lambda: np.empty((1, 5, 12, 64)).transpose(0, -1, 1, 2).shape),
    ("concat", "d", {"T": 5, "S": 3}, lambda: torch.cat([meta(1, 5, 8), meta(1, 3, 8)], 1).shape),
    ("select", "last", {}, lambda: np.empty((2, 5, 3))[:, -1].shape),
    ("slice", "b", {}, lambda: np.empty((2, 10, 8))[:, -3:].shape),
    ("slice", "c", {}, lambda: np.empty((2, 10, 8))[:, 0:-2].shape),
    ("slice", "d", {"T": 9}, lambda: np.empty((1, 9, 64))[:, 1:5].shape),
    ("split", "c", {"T": 5}, lambda: torch.split(meta(1, 5, 8), [2, 3, 3], -1)[2].shape),
    ("matmul", "m2", {}, lambda: np.matmul(np.zeros((2, 1, 4, 5)), np.zeros((3, 5, 6))).shape),
]


@pytest.mark.parametrize("golden, value, env, oracle", SHAPE_ORACLES,
                         ids=[f"{g}:{v}" for g, v, _, _ in SHAPE_ORACLES])
def test_golden_shape_matches_pytorch(golden: str, value: str, env: dict[str, int], oracle) -> None:
    t = golden_types(golden)[value]
    assert concrete(t, {"B": 1, **env}) == tuple(oracle())


@pytest.mark.parametrize("h", [1, 2, 7, 8, 31, 224, 225])
def test_symbolic_conv_golden_matches_pytorch_at_every_size(h: int) -> None:
    t = golden_types("conv2d_symbolic")["b"]
    assert all(isinstance(d, Sym) for d in t.shape[2:])  # still symbolic: H and W
    assert "H" in str(t.shape[2]) and "W" in str(t.shape[3])
    first = conv((1, 3, h, h + 1), 16, 3, stride=2, padding=1)
    assert concrete(t, {"B": 1, "H": h, "W": h + 1}) == conv(first, 16, 3, padding=1)


def test_bound_golden_equals_the_symbolic_one_substituted() -> None:
    sym, bound = golden_types("conv2d_symbolic"), golden_types("conv2d_symbolic_bound")
    for v in ("a", "b"):
        assert bound[v].shape == sym[v].subs({"H": 224, "W": 225}).shape


def test_symbols_stay_symbolic_until_bound(tmp_path: Path) -> None:
    text = ("model m(B, T) {\n  input t: i32[B, T]\n  x = embedding(t, 100, 32)\n"
            "  h = attention(x, heads=4, causal=true)\n  output y = reshape(h, [-1, 32])\n}\n")
    g = compile_text(tmp_path, text)
    assert str(node(g, "y").type) == "f32[B*T,32]"
    assert str(node(compile_text(tmp_path, text, {"T": 64}), "y").type) == "f32[64*B,32]"
    both = compile_text(tmp_path, text, {"T": 64, "B": 2})
    assert str(node(both, "y").type) == "f32[128,32]"
    assert count_params(g)[0] == count_params(both)[0] == 100 * 32 + 4 * 32 * 32


def test_reshape_with_minus_one_divides_symbolic_sizes(tmp_path: Path) -> None:
    text = ("model m(B, T) {\n  input x: f32[B, T, 768]\n  a = reshape(x, [B, T, 12, -1])\n"
            "  output y = reshape(a, [B, -1])\n}\n")
    g = compile_text(tmp_path, text)
    assert str(node(g, "a").type) == "f32[B,T,12,64]"
    assert str(node(g, "y").type) == "f32[B,768*T]"


# -- parameter counts: the chapter's formulas and torch.nn ---------------------------------


def _golden_graph(name: str) -> Graph:
    return load_graph(OPS_DIR / f"{name}.arch")


def test_gqa_and_mqa_projection_shapes() -> None:
    g = _golden_graph("attention_gqa")
    params, _ = weight_table(g)
    d, heads = 4096, 32
    hd = d // heads  # 128
    assert params["a.wq"] == (heads * hd, d) == (4096, 4096)
    assert params["a.wk"] == params["a.wv"] == (8 * hd, d) == (1024, 4096)
    assert params["b.wk"] == params["b.wv"] == (1 * hd, d)
    assert params["a.wo"] == (d, heads * hd)
    # KV width shrinks by heads / kv_heads: the chapter's 4x (GQA, 8 of 32) and 32x (MQA)
    assert d // params["a.wk"][0] == 4 and d // params["b.wk"][0] == 32
    assert params_under(g, "a") == 2 * d * d + 2 * d * (d // 4)


def test_attention_with_bias_counts_like_torch_multihead_attention() -> None:
    torch_count = sum(p.numel() for p in torch.nn.MultiheadAttention(768, 12, bias=True).parameters())
    assert params_under(_golden_graph("attention_self"), "a") == torch_count == 4 * 768 * 768 + 4 * 768


def test_head_dim_and_cross_attention_projections() -> None:
    params, _ = weight_table(_golden_graph("attention_options"))
    assert params["b.wq"] == (8 * 64, 256) and params["b.wo"] == (256, 8 * 64)
    cross, _ = weight_table(_golden_graph("attention_cross"))
    assert cross["b.wq"] == (512, 512) and cross["b.wk"] == (512, 256) and cross["b.wv"] == (512, 256)
    t5, _ = weight_table(_golden_graph("attention_t5"))
    assert t5["a.rel_bias.weight"] == (32, 8)


def test_recurrent_params_follow_the_chapter_and_torch() -> None:
    lstm = _golden_graph("lstm")
    d, h = 32, 128
    assert params_under(lstm, "lstm") == 4 * (d * h + h * h + h)  # the chapter's formula: one bias per gate
    torch_lstm = sum(p.numel() for p in torch.nn.LSTM(d, h).parameters())
    assert params_under(lstm, "lstm") == torch_lstm - 4 * h  # torch keeps two bias vectors
    gru = _golden_graph("gru")
    assert params_under(gru, "gru") == 3 * (32 * 48 + 48 * 48 + 48)
    assert params_under(gru, "gru_1") == sum(p.numel() for p in torch.nn.GRU(48, 24).parameters())
    rnn = _golden_graph("rnn")
    assert params_under(rnn, "s") == 32 * 64 + 64 * 64 + 64


def test_conv_params_chapter_example_and_grouped_like_torch(tmp_path: Path) -> None:
    g = compile_text(tmp_path, "model m(B) {\n  input x: f32[B, 3, 32, 32]\n  output y = conv2d(x, 64, 3)\n}\n")
    assert count_params(g)[0] == 1_792  # 3×3, 3→64: k²·C_in·C_out + C_out
    grouped = _golden_graph("conv2d_groups")
    assert params_under(grouped, "a") == sum(p.numel() for p in torch.nn.Conv2d(8, 16, 3, groups=4).parameters())
    assert params_under(grouped, "b") == sum(p.numel() for p in torch.nn.Conv2d(32, 32, 3, groups=32).parameters())


def test_transformer_block_is_12_d_squared(tmp_path: Path) -> None:
    d = 768
    text = (f"model m(B, T) {{\n  input x: f32[B, T, {d}]\n  h = x + attention(x, heads=12)\n"
            f"  output y = h + ffn(h, hidden=4*{d}, bias=false)\n}}\n")
    assert count_params(compile_text(tmp_path, text))[0] == 12 * d * d


def test_swiglu_golden_width_and_params() -> None:
    g = _golden_graph("swiglu")
    assert node(g, "a").attrs["hidden"] == 11_008
    assert params_under(g, "a") == 3 * 4096 * 11_008


def test_norm_and_embedding_params_like_torch() -> None:
    g = _golden_graph("norms")
    assert params_under(g, "a") == sum(p.numel() for p in torch.nn.LayerNorm(64).parameters())
    assert params_under(g, "b") == 0
    assert params_under(g, "d") == sum(p.numel() for p in torch.nn.RMSNorm(64).parameters())
    assert params_under(g, "f") == sum(p.numel() for p in torch.nn.BatchNorm2d(16).parameters())
    _, buffers = weight_table(g)
    assert buffers["f.running_mean"] == buffers["f.running_var"] == (16,)
    emb = _golden_graph("embedding")
    assert params_under(emb, "emb") == sum(p.numel() for p in torch.nn.Embedding(500, 32).parameters())
