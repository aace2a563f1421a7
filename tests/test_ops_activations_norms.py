"""The vision and speech models' activations and norms, end to end, against PyTorch.

relu6, hardtanh, clamp, hardswish, hardsigmoid, mish, elu, maximum, minimum, groupnorm, instancenorm and
layernorm over a chosen axis (ConvNeXt's channels-first LayerNorm). Each is checked against PyTorch
(float64, on the same float32 weights and inputs) through the numpy reference (float32 within 1e-5,
float64 within 1e-10), the Numba cpu backend and the cuda backend in the simulator (within 1e-5); its
parameter count against the torch module's; its FLOPs against the convention written out here; its
receptive field, init rules, lint classes and the add+norm fusion's refusal of a channels-first norm.
Tolerance (irc.runtime.compare.rel_error): max|ours − torch| / max|torch| over the output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from backend_cases import random_weights
from test_cpu_backend_helpers import cpu_cache
from test_cuda_helpers import cuda_cache
from torch import nn

from irc.analysis.flops import node_cost
from irc.analysis.params import weight_table
from irc.analysis.receptive import receptive_fields
from irc.backends.cpu import compile_graph as cpu_compile
from irc.backends.cuda import compile_graph as cuda_compile
from irc.ops import get_op
from irc.passes import PASSES
from irc.runtime.compare import reference_errors, rel_error
from irc.runtime.graphs import graph_from_source
from irc.runtime.init import feeds_relu, init_weights

_ = cpu_cache, cuda_cache  # fixtures, used by name below

# ops whose numpy reference (and cpu, cuda kernels) this file checks against PyTorch (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({
    "relu6", "hardtanh", "clamp", "hardswish", "hardsigmoid", "mish", "elu", "maximum", "minimum",
    "groupnorm", "instancenorm", "layernorm",
})
TOL32, TOL64 = 1e-5, 1e-10

# -- the activation family: label -> (irc call, torch of (x, y)) ----------------------------------------

ACTS = {
    "relu6": ("relu6(x)", lambda x, y: F.relu6(x)),
    "hardtanh": ("hardtanh(x)", lambda x, y: F.hardtanh(x)),
    "hardtanh_wide": ("hardtanh(x, min=-2, max=2.5)", lambda x, y: F.hardtanh(x, -2.0, 2.5)),
    "clamp_lo": ("clamp(x, min=0.25)", lambda x, y: torch.clamp(x, min=0.25)),
    "clamp_hi": ("clamp(x, max=-0.5)", lambda x, y: torch.clamp(x, max=-0.5)),
    "clamp_both": ("clamp(x, -1, 3)", lambda x, y: torch.clamp(x, -1.0, 3.0)),
    "hardswish": ("hardswish(x)", lambda x, y: F.hardswish(x)),
    "hardsigmoid": ("hardsigmoid(x)", lambda x, y: F.hardsigmoid(x)),
    "mish": ("mish(x)", lambda x, y: F.mish(x)),
    "elu": ("elu(x)", lambda x, y: F.elu(x)),
    "elu_half": ("elu(x, alpha=0.5)", lambda x, y: F.elu(x, alpha=0.5)),
    "maximum": ("maximum(x, y)", lambda x, y: torch.maximum(x, y)),
    "minimum": ("minimum(y, x)", lambda x, y: torch.minimum(y, x)),
    "maximum_same": ("maximum(x, x * 0.5)", lambda x, y: torch.maximum(x, x * 0.5)),
    "minimum_rows": ("minimum(x, z)", None),  # z: [7], a row repeated (the kernels' row form)
    # the cpu kernels' general broadcasting form with one operand already at the result's shape (it once
    # went as a read-only broadcast_to view, which the kernel's signature refused)
    "add_general": ("x + y", lambda x, y: x + y),
}
X_SHAPE, Y_SHAPE, Z_SHAPE = (2, 3, 5, 7), (2, 1, 5, 1), (7,)
ACT_SOURCE = ("model act_family() {\n  input x: f32[2, 3, 5, 7]\n  input y: f32[2, 1, 5, 1]\n  input z: f32[7]\n"
              + "".join(f"  output o_{label} = {call}\n" for label, (call, _) in ACTS.items()) + "}\n")


def _act_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(X_SHAPE) * 4).astype(np.float32)  # both sides of ±3 and 6
    x.flat[:4] = [3.0, -3.0, 6.0, 0.0]  # the kinks, exactly
    return {"x": x, "y": (rng.standard_normal(Y_SHAPE) * 4).astype(np.float32),
            "z": rng.standard_normal(Z_SHAPE).astype(np.float32)}


def _t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, np.float64))


def _act_expected(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x, y, z = (_t64(inputs[k]) for k in ("x", "y", "z"))
    out = {f"o_{label}": fn(x, y).numpy() for label, (_, fn) in ACTS.items() if fn is not None}
    out["o_minimum_rows"] = torch.minimum(x, z).numpy()
    return out


# -- the norm family: label -> (irc call, torch module or function of (x, gain, bias)) ------------------

def _affine_run(m: nn.Module, affine: bool, x, gain, bias):
    """torch's norm module ``m`` on ``x``, its affine parameters (when it has them) set to ours; and its
    parameter count."""
    if affine:
        with torch.no_grad():
            m.weight.copy_(gain)
            m.bias.copy_(bias)
    return m(x), sum(p.numel() for p in m.parameters())


def _gn(groups: int, eps: float = 1e-5, affine: bool = True):
    def run(x, gain, bias):
        return _affine_run(nn.GroupNorm(groups, x.shape[1], eps=eps, affine=affine).double(), affine, x, gain, bias)
    return run


def _in(eps: float = 1e-5, affine: bool = False):
    def run(x, gain, bias):
        cls = nn.InstanceNorm2d if x.dim() == 4 else nn.InstanceNorm1d
        m = cls(x.shape[1], eps=eps, affine=affine).double()  # track_running_stats=False: per-sample stats
        return _affine_run(m, affine, x, gain, bias)
    return run


def _ln_axis(axis: int, eps: float = 1e-5, affine: bool = True, bias: bool = True):
    """ConvNeXt's LayerNorm(data_format="channels_first"): F.layer_norm over the axis moved last."""
    def run(x, gain, b):
        moved = x.movedim(axis, -1)
        y = F.layer_norm(moved, (moved.shape[-1],), gain if affine else None, b if affine and bias else None, eps)
        count = (moved.shape[-1] * (1 + bias)) if affine else 0  # nn.LayerNorm(C, elementwise_affine, bias)
        return y.movedim(-1, axis), count
    return run


NORMS = {
    "gn": ("groupnorm(img, 4)", "img", _gn(4)),
    "gn_plain": ("groupnorm(img, groups=3, eps=1e-3, affine=false)", "img", _gn(3, 1e-3, False)),
    "gn_one": ("groupnorm(img, 1)", "img", _gn(1)),  # one group: LayerNorm over (C, H, W)
    "gn_all": ("groupnorm(img, 12)", "img", _gn(12)),  # a group per channel: InstanceNorm with affine
    "gn_seq": ("groupnorm(seq, 2)", "seq", _gn(2)),
    "inorm": ("instancenorm(img)", "img", _in()),
    "inorm_affine": ("instancenorm(img, affine=true, eps=1e-3)", "img", _in(1e-3, True)),
    "inorm_seq": ("instancenorm(seq)", "seq", _in()),
    "ln_cf": ("layernorm(img, axis=1)", "img", _ln_axis(1)),
    "ln_cf_nobias": ("layernorm(img, axis=-3, bias=false)", "img", _ln_axis(1, bias=False)),
    "ln_mid_plain": ("layernorm(seq, axis=1, affine=false)", "seq", _ln_axis(1, affine=False)),
    "ln_h": ("layernorm(img, axis=2, eps=1e-6)", "img", _ln_axis(2, eps=1e-6)),
    "ln_last": ("layernorm(img, axis=-1)", "img", _ln_axis(3)),  # the per-token path, named explicitly
}
NORM_SOURCE = ("model norm_family() {\n  input img: f32[2, 12, 5, 6]\n  input seq: f32[2, 6, 9]\n"
               + "".join(f"  output {label} = {call}\n" for label, (call, _, _) in NORMS.items()) + "}\n")


def _norm_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    img = (rng.standard_normal((2, 12, 5, 6)) * 3 + 5).astype(np.float32)  # a mean far from 0
    return {"img": img, "seq": rng.standard_normal((2, 6, 9)).astype(np.float32)}


def _norm_expected(graph, weights, inputs) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    values, counts = {}, {}
    for label, (_, operand, fn) in NORMS.items():
        gain, bias = weights.get(f"{label}.gain"), weights.get(f"{label}.bias")
        y, count = fn(_t64(inputs[operand]), None if gain is None else _t64(gain), None if bias is None else _t64(bias))
        values[label] = y.detach().numpy()
        counts[label] = count
    return values, counts


@pytest.fixture(scope="module")
def act_case():
    graph = graph_from_source(ACT_SOURCE)
    inputs = _act_inputs()
    return graph, {}, inputs, _act_expected(inputs)


@pytest.fixture(scope="module")
def norm_case():
    graph = graph_from_source(NORM_SOURCE)
    weights = random_weights(graph)
    inputs = _norm_inputs()
    values, _ = _norm_expected(graph, weights, inputs)
    return graph, weights, inputs, values


def _check_reference(graph, weights, inputs, want) -> None:
    errors = reference_errors(graph, weights, inputs, want)
    bad = {k: f"{e32:.1e}/{e64:.1e}" for k, (e32, e64) in errors.items() if not (e32 <= TOL32 and e64 <= TOL64)}
    assert not bad, f"numpy reference off PyTorch (float32/float64 errors): {bad}"


def _check_backend(got: dict[str, np.ndarray], want: dict[str, np.ndarray], backend: str) -> None:
    assert sorted(got) == sorted(want)
    errors = {k: rel_error(got[k], want[k]) for k in want}
    bad = {k: f"{e:.1e}" for k, e in errors.items() if not e <= TOL32}
    assert not bad, f"{backend} backend off PyTorch: {bad}"


def test_activations_reference_against_torch(act_case):
    _check_reference(*act_case)


def test_norms_reference_against_torch(norm_case):
    _check_reference(*norm_case)


def test_activations_cpu_against_torch(act_case, cpu_cache):
    graph, weights, inputs, want = act_case
    _check_backend(cpu_compile(graph, cache_dir=cpu_cache).run(weights, inputs), want, "cpu")


def test_norms_cpu_against_torch(norm_case, cpu_cache):
    graph, weights, inputs, want = norm_case
    _check_backend(cpu_compile(graph, cache_dir=cpu_cache).run(weights, inputs), want, "cpu")


@pytest.mark.parametrize("path", ["shared", "shuffle"])
def test_activations_and_norms_cuda_against_torch(act_case, norm_case, cuda_cache, path):
    """Both reduction paths of the row kernels (the simulator runs the shuffles through simwarp)."""
    for graph, weights, inputs, want in (act_case, norm_case):
        compiled = cuda_compile(graph, cache_dir=cuda_cache, reduction=path)
        _check_backend(compiled.run(weights, inputs), want, f"cuda ({path})")


def test_groupnorm_long_rows_cpu_and_cuda(cpu_cache, cuda_cache):
    """Rows of a (sample, group) longer than a block's registers hold (2 × 64 × 300 = 38,400 values per
    row in 2 groups): the CUDA kernel strides over them, the CPU one sums in float64. A large mean
    (1,000) must not cancel the variance away."""
    source = "model m() {\n  input x: f32[1, 4, 64, 300]\n  output y = groupnorm(x, 2, affine=false)\n}\n"
    graph = graph_from_source(source)
    x = (np.random.default_rng(3).standard_normal((1, 4, 64, 300)) * 0.5 + 1000).astype(np.float32)
    want = nn.GroupNorm(2, 4, affine=False).double()(_t64(x)).numpy()
    _check_backend(cpu_compile(graph, cache_dir=cpu_cache).run({}, {"x": x}), {"y": want}, "cpu")
    _check_backend(cuda_compile(graph, cache_dir=cuda_cache).run({}, {"x": x}), {"y": want}, "cuda")


EDGES = np.array([np.nan, np.inf, -np.inf, 3.0, -3.0, 6.0, 0.0, 100.0, -100.0, 20.0, 21.0, -1e-7], np.float32)


# the simulator runs kernels as NumPy scalar code, which warns where −inf·0 gives the NaN PyTorch gives
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_non_finite_inputs_as_torch(cpu_cache, cuda_cache):
    """NaN stays NaN (maximum and minimum propagate it from either side), ±inf as PyTorch gives them:
    hardswish(−inf) = −inf·0 = NaN, mish(−inf) = NaN, elu(−inf) = −alpha, relu6(inf) = 6."""
    n = EDGES.size
    calls = {k: v for k, v in ACTS.items() if k not in ("maximum", "minimum", "minimum_rows")}
    source = (f"model m() {{\n  input x: f32[{n}]\n  input y: f32[{n}]\n"
              + "".join(f"  output o_{label} = {call}\n" for label, (call, _) in calls.items())
              + "  output o_maximum = maximum(x, y)\n  output o_minimum = minimum(y, x)\n}\n")
    graph = graph_from_source(source)
    x, y = EDGES, EDGES[::-1].copy()
    tx, ty = _t64(x), _t64(y)
    want = {f"o_{label}": fn(tx, ty).numpy() for label, (_, fn) in calls.items()}
    want["o_maximum"], want["o_minimum"] = torch.maximum(tx, ty).numpy(), torch.minimum(ty, tx).numpy()
    from irc.backends.numpy_ref import run_graph

    runs = {"numpy": run_graph(graph, {}, {"x": x, "y": y}, np.float32),
            "cpu": cpu_compile(graph, cache_dir=cpu_cache).run({}, {"x": x, "y": y}),
            "cuda": cuda_compile(graph, cache_dir=cuda_cache).run({}, {"x": x, "y": y})}
    for backend, got in runs.items():
        for label, w in want.items():
            np.testing.assert_allclose(got[label], w, rtol=2e-6, atol=1e-30, equal_nan=True,
                                       err_msg=f"{backend}: {label}")


def test_params_like_torch(norm_case):
    """Each norm's parameters count as torch's module does (nn.GroupNorm's weight → irc's gain)."""
    graph, weights, inputs, _ = norm_case
    _, counts = _norm_expected(graph, weights, inputs)
    params, buffers = weight_table(graph)
    assert not buffers  # no running statistics: per-sample statistics at inference
    ours = {label: sum(int(np.prod(s)) for k, s in params.items() if k.startswith(f"{label}.")) for label in NORMS}
    assert ours == counts
    assert params["gn.gain"] == (12,) and params["ln_cf.bias"] == (12,) and params["ln_h.gain"] == (5,)
    act_params, act_buffers = weight_table(graph_from_source(ACT_SOURCE))
    assert not act_params and not act_buffers


def test_flops_follow_the_convention(act_case, norm_case):
    """1 activation FLOP per element for every activation; maximum/minimum 1 elementwise FLOP per result
    element; groupnorm and instancenorm LayerNorm's per-element count: 5 (mean, centre, square and
    accumulate, scale) + 2 for gain and bias; layernorm over axis 1 costs what it costs over the last."""
    graph = act_case[0]
    types = graph.value_types()
    for node in graph.nodes:
        if node.op == "input":
            continue
        cost = node_cost(node, [types[v] for v in node.inputs])
        numel = int(np.prod(node.type.shape))
        if node.op in ("maximum", "minimum", "add"):
            assert cost.flops == {"elementwise": numel}, node.op
        elif node.op != "mul":
            assert cost.flops == {"activation": numel} and cost.macs == 0, node.op
    graph = norm_case[0]
    types = graph.value_types()
    per = {"gn": 7, "gn_plain": 5, "gn_one": 7, "gn_all": 7, "gn_seq": 7, "inorm": 5, "inorm_affine": 7,
           "inorm_seq": 5, "ln_cf": 7, "ln_cf_nobias": 6, "ln_mid_plain": 5, "ln_h": 7, "ln_last": 7}
    by_out = {n.outputs[0]: n for n in graph.nodes}
    for label, want in per.items():
        node = by_out[label]
        cost = node_cost(node, [types[v] for v in node.inputs])
        assert cost.flops == {"norm": want * int(np.prod(node.type.shape))}, label


def test_torch_flop_counter_sees_no_products():
    """torch.utils.flop_counter counts only products: none of these ops has one, and irc reports none."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(2, 12, 5, 6)
    with FlopCounterMode(display=False) as counter:
        nn.GroupNorm(4, 12)(x)
        nn.InstanceNorm2d(12)(x)
        F.mish(F.hardswish(F.relu6(x)))
        torch.maximum(x, x)
    assert counter.get_total_flops() == 0
    graph = graph_from_source(NORM_SOURCE)
    types = graph.value_types()
    for node in graph.nodes:
        if node.op != "input":
            cost = node_cost(node, [types[v] for v in node.inputs])
            assert cost.macs == 0 and not {"linear", "matmul", "attention"} & set(cost.flops)


def test_receptive_field():
    """Pointwise ops pass the field on. groupnorm/instancenorm too: their per-sample statistics rescale the
    map without widening any window (see irc/ops/norm.py). layernorm over channels (axis 1) keeps it; over
    a spatial axis it ends it. Two 3×3 convolutions: r = 5."""
    source = """
model m() {
  input img: f32[1, 8, 16, 16]
  a = conv2d(img, 8, 3, padding=1)
  b = relu6(groupnorm(a, 2))
  c = conv2d(maximum(b, hardswish(b)), 8, 3, padding=1)
  output y = instancenorm(layernorm(c, axis=1))
  output z = layernorm(c, axis=-1)
}
"""
    graph = graph_from_source(source)
    fields = receptive_fields(graph)
    assert fields["b"] == ((3, 3), (1, 1))
    assert fields["c"] == ((5, 5), (1, 1))
    assert fields["y"] == ((5, 5), (1, 1))
    assert "z" not in fields  # normalised along W: every output mixes the whole row


def test_init_rules_and_classes():
    """Norm gains start at 1 and biases at 0; a convolution feeding relu6 gets He init (a rectifier),
    one feeding hardtanh or elu does not."""
    source = """
model m() {
  input img: f32[1, 8, 6, 6]
  a = conv2d(img, 8, 3)
  b = conv2d(img, 8, 3)
  c = conv2d(img, 8, 3)
  output y = groupnorm(relu6(a), 4)
  output z = instancenorm(hardtanh(b), affine=true)
  output w = layernorm(elu(c), axis=1)
}
"""
    graph = graph_from_source(source)
    weights = init_weights(graph, seed=0)
    for label in ("y", "z", "w"):
        assert np.all(weights[f"{label}.gain"] == 1) and np.all(weights[f"{label}.bias"] == 0)
    convs = {n.outputs[0]: n for n in graph.nodes if n.op == "conv2d"}
    assert feeds_relu(graph, convs["a"]) and not feeds_relu(graph, convs["b"]) and not feeds_relu(graph, convs["c"])
    assert get_op("relu6").has("rectifier") and not get_op("hardtanh").has("rectifier")
    for op in ("relu6", "hardtanh", "clamp", "hardswish", "hardsigmoid", "mish", "elu"):
        assert get_op(op).has("activation"), op
    assert get_op("groupnorm").has("norm") and get_op("instancenorm").has("norm")
    assert get_op("maximum").classes == frozenset({"elementwise"}) == get_op("minimum").classes


def test_add_norm_fuses_only_over_the_last_axis(cpu_cache, cuda_cache):
    """x + r, then a channels-first LayerNorm: the add stays apart (add_norm normalises rows); the same
    sum into a last-axis LayerNorm still fuses. Both backends agree with the reference."""
    source = """
model m() {
  input x: f32[2, 6, 4, 5]
  input r: f32[2, 6, 4, 5]
  h = x + r
  output cf = layernorm(h, axis=1)
  output last = layernorm(x - r)
}
"""
    graph = graph_from_source(source)
    fused = PASSES["fuse-add-norm"](graph)
    ops = [n.op for n in fused.nodes]
    assert ops.count("add_norm") == 0 and "layernorm" in ops
    graph2 = graph_from_source(source.replace("x - r", "h"))
    ops2 = [n.op for n in PASSES["fuse-add-norm"](graph2).nodes]
    assert ops2.count("add_norm") == 1 and ops2.count("layernorm") == 1  # the last-axis one fused
    weights = random_weights(graph2)
    rng = np.random.default_rng(5)
    inputs = {k: rng.standard_normal((2, 6, 4, 5)).astype(np.float32) for k in ("x", "r")}
    h = _t64(inputs["x"] + inputs["r"])
    want = {"cf": _ln_axis(1)(h, _t64(weights["cf.gain"]), _t64(weights["cf.bias"]))[0].numpy(),
            "last": F.layer_norm(h, (5,), _t64(weights["last.gain"]), _t64(weights["last.bias"])).numpy()}
    _check_backend(cpu_compile(graph2, cache_dir=cpu_cache).run(weights, inputs), want, "cpu")
    _check_backend(cuda_compile(graph2, cache_dir=cuda_cache).run(weights, inputs), want, "cuda")


def test_layernorm_without_axis_prints_as_before():
    """The new attribute defaults to none, which the printer omits: existing dumps are unchanged."""
    from irc.printer import print_graph

    text = print_graph(graph_from_source("model m() {\n  input x: f32[2, 4, 8]\n  output y = layernorm(x)\n}\n"))
    assert "layernorm %x {eps=1e-05, affine=true, bias=true} : f32[2,4,8]" in text
    assert "axis" not in text
