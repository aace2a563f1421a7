"""The numpy reference against PyTorch, layer by layer: dense, conv, pooling, norms, activations.

Same weights (float32 values), same inputs. PyTorch runs in float64, so its result is the
exact answer for those float32 values up to ~1e-16. Tolerance definition
(irc.runtime.compare.rel_error): max|ours − torch| / max|torch| over the output.
- the reference in float32 must be within 1e-5 of it (what users run);
- the reference in float64 within 1e-10 (the semantics, with rounding taken out).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from irc.runtime.compare import reference_errors
from irc.runtime.graphs import graph_from_source
from irc.runtime.weights import check_weights, expected_weights

# ops whose numpy reference this file checks against PyTorch (read by tests/op_coverage.py)
ORACLE_OPS = frozenset({
    "linear", "conv1d", "conv2d", "maxpool1d", "maxpool2d", "avgpool1d", "avgpool2d", "adaptive_avgpool2d",
    "global_avgpool", "embedding", "layernorm", "rmsnorm", "batchnorm", "gelu", "silu", "leaky_relu", "relu",
    "sigmoid", "tanh", "softmax", "ffn", "swiglu", "flatten", "reshape", "transpose", "concat", "select", "slice",
    "add", "sub", "mul", "div", "abs", "split", "matmul",
})
TOL32, TOL64 = 1e-5, 1e-10
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


def fp32_state(module: nn.Module) -> dict[str, np.ndarray]:
    """Round the module's parameters and buffers to float32 values, keep it in float64, return them."""
    module.double()
    out = {}
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if t.dtype.is_floating_point:
                t.copy_(t.float().double())
                out[name] = t.float().numpy().copy()
    return out


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, np.float64))


def check_op(call: str, x: np.ndarray, params: dict[str, np.ndarray], expected: torch.Tensor | np.ndarray,
             in_dtype: str = "f32") -> None:
    """Build `output y = CALL` over one input x, bind its weights by short name, compare."""
    shape = ", ".join(str(d) for d in x.shape)
    graph = graph_from_source(f"model m() {{\n  input x: {in_dtype}[{shape}]\n  output y = {call}\n}}\n")
    weights = {key: params[key.rsplit(".", 1)[1]] for key in expected_weights(graph)}
    check_weights(graph, weights)  # the same keys, shapes and dtypes a file would need
    want = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    (err32, err64), = reference_errors(graph, weights, {"x": x}, {"y": want}).values()
    assert err32 <= TOL32, f"{call}: float32 reference off by {err32:.2e}"
    assert err64 <= TOL64, f"{call}: float64 reference off by {err64:.2e}"


@pytest.fixture
def rng() -> np.random.Generator:
    torch.manual_seed(0)
    return np.random.default_rng(0)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(rng, bias):
    m = nn.Linear(5, 7, bias=bias)
    p = fp32_state(m)
    x = rand(rng, 2, 3, 5)
    check_op(f"linear(x, 7, bias={str(bias).lower()})", x, p, m(t64(x)))


CONV1D = [  # (irc attributes, torch keyword arguments)
    ("6, 3, stride=2, padding=1", dict(out_channels=6, kernel_size=3, stride=2, padding=1)),
    ("4, 3, padding=2, dilation=2, groups=2", dict(out_channels=4, kernel_size=3, padding=2, dilation=2, groups=2)),
    ("6, 4, padding=same", dict(out_channels=6, kernel_size=4, padding="same")),
    ("6, 3, padding=same, dilation=3", dict(out_channels=6, kernel_size=3, padding="same", dilation=3)),
    ("8, 5, padding=valid, groups=4, bias=false", dict(out_channels=8, kernel_size=5, groups=4, bias=False)),
]


@pytest.mark.parametrize("attrs,kw", CONV1D, ids=[c[0] for c in CONV1D])
def test_conv1d(rng, attrs, kw):
    m = nn.Conv1d(4, **kw)
    p = fp32_state(m)
    x = rand(rng, 2, 4, 17)
    check_op(f"conv1d(x, {attrs})", x, p, m(t64(x)))


CONV2D = [
    ("8, 3, stride=2, padding=1", dict(out_channels=8, kernel_size=3, stride=2, padding=1)),
    ("6, [3, 5], stride=[2, 1], padding=[1, 2], dilation=[1, 2]",
     dict(out_channels=6, kernel_size=(3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2))),
    ("8, [2, 4], padding=same, dilation=[2, 1]", dict(out_channels=8, kernel_size=(2, 4), padding="same",
                                                      dilation=(2, 1))),
    ("6, 3, groups=2, bias=false", dict(out_channels=6, kernel_size=3, groups=2, bias=False)),
    ("4, 3, padding=1, groups=4", dict(out_channels=4, kernel_size=3, padding=1, groups=4)),  # depthwise
    ("5, 1", dict(out_channels=5, kernel_size=1)),
]


@pytest.mark.parametrize("attrs,kw", CONV2D, ids=[c[0] for c in CONV2D])
def test_conv2d(rng, attrs, kw):
    m = nn.Conv2d(4, **kw)
    p = fp32_state(m)
    x = rand(rng, 2, 4, 11, 9)
    check_op(f"conv2d(x, {attrs})", x, p, m(t64(x)))


POOL2D = [
    ("maxpool2d(x, 3, stride=2, padding=1)", lambda t: F.max_pool2d(t, 3, 2, 1)),
    ("maxpool2d(x, 2)", lambda t: F.max_pool2d(t, 2)),
    ("maxpool2d(x, [3, 2], stride=[1, 2], dilation=[2, 1])",
     lambda t: F.max_pool2d(t, (3, 2), (1, 2), dilation=(2, 1))),
    ("avgpool2d(x, 3, stride=2, padding=1)", lambda t: F.avg_pool2d(t, 3, 2, 1)),
    ("avgpool2d(x, 3, stride=2, padding=1, count_include_pad=false)",
     lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False)),
    ("avgpool2d(x, [2, 3], stride=[2, 1], padding=[1, 0])", lambda t: F.avg_pool2d(t, (2, 3), (2, 1), (1, 0))),
    ("adaptive_avgpool2d(x, [3, 4])", lambda t: F.adaptive_avg_pool2d(t, (3, 4))),
    ("adaptive_avgpool2d(x, 1)", lambda t: F.adaptive_avg_pool2d(t, 1)),
    ("adaptive_avgpool2d(x, [7, 9])", lambda t: F.adaptive_avg_pool2d(t, (7, 9))),
    ("global_avgpool(x)", lambda t: t.mean(dim=(2, 3))),
]


@pytest.mark.parametrize("call,fn", POOL2D, ids=[c[0] for c in POOL2D])
def test_pool2d(rng, call, fn):
    x = rand(rng, 2, 3, 7, 10)
    check_op(call, x, {}, fn(t64(x)))


POOL1D = [
    ("maxpool1d(x, 3, stride=2, padding=1)", lambda t: F.max_pool1d(t, 3, 2, 1)),
    ("maxpool1d(x, 2, dilation=3)", lambda t: F.max_pool1d(t, 2, dilation=3)),
    ("avgpool1d(x, 4, stride=3, padding=2)", lambda t: F.avg_pool1d(t, 4, 3, 2)),
    ("avgpool1d(x, 4, stride=3, padding=2, count_include_pad=false)",
     lambda t: F.avg_pool1d(t, 4, 3, 2, count_include_pad=False)),
]


@pytest.mark.parametrize("call,fn", POOL1D, ids=[c[0] for c in POOL1D])
def test_pool1d(rng, call, fn):
    x = rand(rng, 2, 3, 13)
    check_op(call, x, {}, fn(t64(x)))


def test_embedding(rng):
    m = nn.Embedding(11, 6)
    p = fp32_state(m)
    ids = rng.integers(0, 11, (3, 5)).astype(np.int32)
    check_op("embedding(x, 11, 6)", ids, p, m(torch.from_numpy(ids.astype(np.int64))), in_dtype="i32")


def test_layernorm(rng):
    m = nn.LayerNorm(8, eps=1e-5)
    with torch.no_grad():  # non-trivial affine parameters
        m.weight.normal_()
        m.bias.normal_()
    p = fp32_state(m)
    p = {"gain": p["weight"], "bias": p["bias"]}
    x = rand(rng, 2, 5, 8) * 3 + 1
    check_op("layernorm(x)", x, p, m(t64(x)))


def test_rmsnorm(rng):
    m = nn.RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        m.weight.normal_()
    p = {"gain": fp32_state(m)["weight"]}
    x = rand(rng, 2, 5, 8) * 3 + 1
    check_op("rmsnorm(x, eps=0.000001)", x, p, m(t64(x)))


def test_batchnorm2d_eval(rng):
    m = nn.BatchNorm2d(6, eps=1e-5)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
        m.running_mean.normal_()
        m.running_var.uniform_(0.5, 2.0)
    m.eval()
    p = fp32_state(m)
    p = {"gain": p["weight"], "bias": p["bias"], "running_mean": p["running_mean"], "running_var": p["running_var"]}
    x = rand(rng, 2, 6, 5, 4)
    check_op("batchnorm(x)", x, p, m(t64(x)))


ACTS = [
    ("gelu(x)", lambda t: F.gelu(t)),
    ("gelu(x, approx=tanh)", lambda t: F.gelu(t, approximate="tanh")),
    ("silu(x)", F.silu),
    ("leaky_relu(x)", F.leaky_relu),
    ("leaky_relu(x, slope=0.2)", lambda t: F.leaky_relu(t, 0.2)),
    ("relu(x)", F.relu),
    ("sigmoid(x)", torch.sigmoid),
    ("tanh(x)", torch.tanh),
    ("softmax(x, axis=1)", lambda t: torch.softmax(t, 1)),
]


@pytest.mark.parametrize("call,fn", ACTS, ids=[c[0] for c in ACTS])
def test_activation(rng, call, fn):
    x = rand(rng, 3, 4, 50) * 4  # reaches well into both tails
    check_op(call, x, {}, fn(t64(x)))


@pytest.mark.parametrize("act,fn", [("relu", F.relu), ("gelu", F.gelu),
                                    ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))])
def test_ffn(rng, act, fn):
    l1, l2 = nn.Linear(6, 12), nn.Linear(12, 6)
    a, b = fp32_state(l1), fp32_state(l2)
    p = {"w1": a["weight"], "b1": a["bias"], "w2": b["weight"], "b2": b["bias"]}
    x = rand(rng, 2, 3, 6)
    check_op(f"ffn(x, hidden=12, act={act})", x, p, l2(fn(l1(t64(x)))))


def test_swiglu(rng):
    gate, up, down = nn.Linear(6, 16, bias=False), nn.Linear(6, 16, bias=False), nn.Linear(16, 6, bias=False)
    p = {"w_gate": fp32_state(gate)["weight"], "w_up": fp32_state(up)["weight"], "w_down": fp32_state(down)["weight"]}
    x = rand(rng, 2, 3, 6)
    t = t64(x)
    check_op("swiglu(x, hidden=16)", x, p, down(F.silu(gate(t)) * up(t)))


SHAPE_AND_ARITHMETIC = [
    ("flatten(x)", lambda t: torch.flatten(t, 1)),
    ("flatten(x, start=0, end=1)", lambda t: torch.flatten(t, 0, 1)),
    ("reshape(x, [4, -1, 5])", lambda t: t.reshape(4, -1, 5)),
    ("transpose(x, [0, 2, 3, 1])", lambda t: t.permute(0, 2, 3, 1)),
    ("concat(x, x * 2, axis=2)", lambda t: torch.cat([t, t * 2], 2)),
    ("select(x, axis=1, index=-1)", lambda t: t[:, -1]),
    ("slice(x, axis=3, start=1, end=-1)", lambda t: t[:, :, :, 1:-1]),
    ("1 - x", lambda t: 1 - t),
    ("2 / (x * x + 1)", lambda t: 2 / (t * t + 1)),
    ("(x - 3) / 4", lambda t: (t - 3) / 4),
    ("abs(x) + x", lambda t: t.abs() + t),
]


@pytest.mark.parametrize("call,fn", SHAPE_AND_ARITHMETIC, ids=[c[0] for c in SHAPE_AND_ARITHMETIC])
def test_shape_and_arithmetic(rng, call, fn):
    x = rand(rng, 2, 3, 4, 5)
    check_op(call, x, {}, fn(t64(x)))


def test_split_and_matmul(rng):
    graph = graph_from_source("model m() { input x: f32[2, 3, 10]; input y: f32[2, 10, 4]\n"
                              " a, b = split(x, [4, 6])\n output a\n output b\n output p = x @ y }")
    x, y = rand(rng, 2, 3, 10), rand(rng, 2, 10, 4)
    tx = t64(x)
    want = {"a": tx[..., :4].numpy(), "b": tx[..., 4:].numpy(), "p": (tx @ t64(y)).numpy()}
    for label, (err32, err64) in reference_errors(graph, {}, {"x": x, "y": y}, want).items():
        assert err32 <= TOL32 and err64 <= TOL64, label
