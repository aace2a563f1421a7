"""The spatial ops real vision models need (issue 12, item 5): transposed convolution (U-Net and
DCGAN decoders), upsampling, pixel (un)shuffle (super-resolution), expand (ViT's class token).

Every expectation comes from PyTorch: torch.nn.ConvTranspose{1,2}d's output shapes and parameter
counts, torch.utils.flop_counter.FlopCounterMode's FLOPs, torch.nn.init's fans, and the outputs of
torch.nn.functional on the same weights and inputs (float64), which the NumPy reference, the Numba
cpu backend and the cuda backend (in the simulator) must match.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch.utils.flop_counter
from test_cpu_backend_helpers import cpu_cache
from test_cuda_helpers import cuda_cache, rel_error

from irc.analysis.flops import node_cost
from irc.analysis.params import count_params, weight_table
from irc.analysis.receptive import receptive_fields
from irc.backends.numpy_ref import run_graph
from irc.diagnostics import IrcError
from irc.ops import get_op
from irc.runtime.graphs import graph_from_source
from irc.runtime.init import init_weights

_ = (cpu_cache, cuda_cache)  # fixtures, used by name below

ORACLE_OPS = frozenset({"conv_transpose1d", "conv_transpose2d", "upsample", "pixel_shuffle", "pixel_unshuffle",
                        "expand"})

TOLERANCE = 1e-5  # ‖out − torch‖ / ‖torch‖, float32 kernels against float64 torch

# (label, input shape, irc call on %x, torch module): every geometry attribute, groups, no bias, 1-D and 2-D
CONV_TRANSPOSE = [
    ("dcgan", (2, 8, 4, 4), "conv_transpose2d(x, 4, 4, stride=2, padding=1)",
     lambda: torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)),
    ("unet", (2, 8, 5, 3), "conv_transpose2d(x, 6, 2, stride=2, bias=false)",
     lambda: torch.nn.ConvTranspose2d(8, 6, 2, stride=2, bias=False)),
    ("everything", (2, 4, 5, 6),
     "conv_transpose2d(x, 6, [3, 2], stride=[2, 3], padding=[1, 0], output_padding=[1, 2], dilation=[1, 2], groups=2)",
     lambda: torch.nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
                                      dilation=(1, 2), groups=2)),
    ("dilated_op", (1, 4, 4, 4), "conv_transpose2d(x, 4, 3, stride=1, padding=1, output_padding=1, dilation=2)",
     lambda: torch.nn.ConvTranspose2d(4, 4, 3, stride=1, padding=1, output_padding=1, dilation=2)),
    ("depthwise", (2, 4, 3, 3), "conv_transpose2d(x, 4, 3, stride=2, groups=4)",
     lambda: torch.nn.ConvTranspose2d(4, 4, 3, stride=2, groups=4)),
    ("seq", (2, 4, 7), "conv_transpose1d(x, 6, 4, stride=3, padding=2, output_padding=2, groups=2)",
     lambda: torch.nn.ConvTranspose1d(4, 6, 4, stride=3, padding=2, output_padding=2, groups=2)),
    ("seq_dilated", (2, 3, 5), "conv_transpose1d(x, 5, 3, dilation=2, bias=false)",
     lambda: torch.nn.ConvTranspose1d(3, 5, 3, dilation=2, bias=False)),
]


def _graph(shape: tuple[int, ...], call: str):
    dims = ", ".join(str(d) for d in shape)
    return graph_from_source(f"model m() {{\n  input x: f32[{dims}]\n  output y = {call}\n}}\n", None)


def _node(graph, op_prefix: str):
    return next(n for n in graph.nodes if n.op.startswith(op_prefix))


@pytest.mark.parametrize("label, shape, call, module", CONV_TRANSPOSE, ids=[c[0] for c in CONV_TRANSPOSE])
def test_conv_transpose_shape_params_and_flops_match_torch(label, shape, call, module) -> None:
    torch.manual_seed(0)
    m = module().double()
    graph = _graph(shape, call)
    node = _node(graph, "conv_transpose")
    x = torch.randn(shape, dtype=torch.float64)
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        want = m(x)
    assert tuple(node.type.shape) == tuple(want.shape)
    params, _ = weight_table(graph)
    assert params["y.weight"] == tuple(m.weight.shape)  # [in, out/groups, k...]
    assert count_params(graph)[0] == sum(p.numel() for p in m.parameters())
    cost = node_cost(node, [graph.value_types()["x"]])
    # the flop counter counts the products (2 per multiply-add) and leaves the bias add out
    assert 2 * cost.macs == cost.flops["linear"] == counter.get_total_flops()
    assert cost.flops.get("elementwise", 0) == (want.numel() if m.bias is not None else 0)


def _torch_weights(graph, modules: dict[str, torch.nn.Module]) -> dict[str, np.ndarray]:
    out = {}
    for scope, m in modules.items():
        for name, p in m.named_parameters():
            out[f"{scope}.{name}"] = p.detach().numpy().astype(np.float32)
    assert sorted(out) == sorted(weight_table(graph)[0])
    return out


# one graph for every op (one compile per backend): label -> (irc call, torch on (inputs, modules))
SPATIAL = """
model spatial(B) {
  input img: f32[B, 4, 3, 4]
  input seq: f32[B, 4, 5]
  input tok: f32[B, 3, 4]
  input cls: f32[1, 1, 4]
  t1 = conv_transpose2d(img, 2, 3, stride=2, padding=1, output_padding=1)
  t2 = conv_transpose2d(img, 2, [3, 2], stride=[2, 3], padding=[1, 0], output_padding=[1, 2], dilation=[1, 2],
                        groups=2, bias=false)
  t3 = conv_transpose1d(seq, 6, 4, stride=3, padding=2, output_padding=2, groups=2)
  output y_t1 = t1
  output y_t2 = t2
  output y_t3 = t3
  output y_near = upsample(img, 2)
  output y_near_pair = upsample(img, [3, 2])
  output y_near_1d = upsample(seq, 3)
  output y_bilinear = upsample(img, [2, 3], mode=bilinear)
  output y_bilinear_3 = upsample(img, 3, mode=bilinear)
  output y_bilinear_corners = upsample(img, 2, mode=bilinear, align_corners=true)
  output y_shuffle = pixel_shuffle(img, 2)
  output y_unshuffle = pixel_unshuffle(upsample(img, 2), 2)
  output y_unshuffle_3 = pixel_unshuffle(reshape(seq, [B, 1, 4, 5]), 1)
  output y_expand = expand(reshape(tok, [B, 3, 1, 4]), [2, B, 3, 2, -1])
  output y_cls = concat(broadcast_to(cls, [B, 1, 4]), tok, axis=1)
}
"""


def _torch_spatial(x: dict[str, torch.Tensor], m: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    img, seq, tok, cls = x["img"], x["seq"], x["tok"], x["cls"]
    b = img.shape[0]
    return {
        "y_t1": m["t1"](img), "y_t2": m["t2"](img), "y_t3": m["t3"](seq),
        "y_near": F.interpolate(img, scale_factor=2, mode="nearest"),
        "y_near_pair": F.interpolate(img, scale_factor=(3, 2), mode="nearest"),
        "y_near_1d": F.interpolate(seq, scale_factor=3, mode="nearest"),
        "y_bilinear": F.interpolate(img, scale_factor=(2, 3), mode="bilinear", align_corners=False),
        "y_bilinear_3": F.interpolate(img, scale_factor=3, mode="bilinear", align_corners=False),
        "y_bilinear_corners": F.interpolate(img, scale_factor=2, mode="bilinear", align_corners=True),
        "y_shuffle": F.pixel_shuffle(img, 2),
        "y_unshuffle": F.pixel_unshuffle(F.interpolate(img, scale_factor=2, mode="nearest"), 2),
        "y_unshuffle_3": F.pixel_unshuffle(seq.reshape(b, 1, 4, 5), 1),
        "y_expand": tok.reshape(b, 3, 1, 4).expand(2, b, 3, 2, -1),
        "y_cls": torch.cat([cls.expand(b, 1, 4), tok], dim=1),
    }


@pytest.fixture(scope="module")
def spatial():
    graph = graph_from_source(SPATIAL, {"B": 2})
    torch.manual_seed(1)
    modules = {
        "t1": torch.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
        "t2": torch.nn.ConvTranspose2d(4, 2, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
                                       dilation=(1, 2), groups=2, bias=False),
        "t3": torch.nn.ConvTranspose1d(4, 6, 4, stride=3, padding=2, output_padding=2, groups=2),
    }
    weights = _torch_weights(graph, modules)
    rng = np.random.default_rng(2)
    types = graph.value_types()
    inputs = {n.outputs[0]: rng.standard_normal(tuple(types[n.outputs[0]].shape)).astype(np.float32)
              for n in graph.inputs()}
    with torch.no_grad():
        doubled = {k: m.double() for k, m in modules.items()}
        want = {k: v.numpy() for k, v in
                _torch_spatial({k: torch.tensor(v, dtype=torch.float64) for k, v in inputs.items()}, doubled).items()}
    return graph, weights, inputs, want


def _check(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float) -> None:
    assert sorted(got) == sorted(want)
    errors = {k: rel_error(np.asarray(got[k]), want[k]) for k in want}
    bad = {k: f"{e:.2e}" for k, e in errors.items() if not e <= tol}
    assert not bad, f"outputs off torch: {bad}"


def test_numpy_reference_is_torch_in_float64(spatial) -> None:
    graph, weights, inputs, want = spatial
    got = run_graph(graph, {k: v.astype(np.float64) for k, v in weights.items()},
                    {k: v.astype(np.float64) for k, v in inputs.items()}, np.float64)
    _check(got, want, 1e-12)
    for k, v in want.items():
        assert got[k].shape == v.shape, k


def test_cpu_backend_matches_torch(spatial, cpu_cache) -> None:
    from irc.backends.cpu import compile_graph

    graph, weights, inputs, want = spatial
    compiled = compile_graph(graph, cache_dir=cpu_cache)
    got = compiled.run(weights, inputs)
    _check(got, want, TOLERANCE)
    assert all(v.dtype == np.float32 for v in got.values())


def test_cuda_backend_matches_torch_in_the_simulator(spatial, cuda_cache) -> None:
    from irc.backends.cuda import compile_graph

    graph, weights, inputs, want = spatial
    compiled = compile_graph(graph, cache_dir=cuda_cache)
    assert compiled.simulator
    _check(compiled.run(weights, inputs), want, TOLERANCE)


# -- init: PyTorch's fans for the transposed layout ---------------------------------------------


@pytest.mark.parametrize("act", ["", "relu"])
def test_conv_transpose_init_uses_torchs_fans(act: str) -> None:
    """fan_in = (out/groups)·taps, fan_out = in·taps: what torch.nn.init reads from [in, out/g, k, k]."""
    call = "conv_transpose2d(x, 64, 4, stride=2, padding=1, groups=2)"
    graph = _graph((1, 96, 4, 4), f"relu({call})" if act else call)
    w = init_weights(graph, seed=3)[f"{_node(graph, 'conv_transpose').weights}.weight"]
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(w.shape))
    assert (fan_in, fan_out) == (32 * 16, 96 * 16)
    if act:  # He normal
        assert np.std(w) == pytest.approx(np.sqrt(2.0 / fan_in), rel=0.03)
    else:  # Xavier uniform
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        assert np.abs(w).max() <= bound * (1 + 1e-6)
        assert np.std(w) == pytest.approx(bound / np.sqrt(3.0), rel=0.03)
    assert get_op("conv_transpose2d").init_rules({}) == {"weight": "fan", "bias": "zeros"}


# -- costs, classes, receptive field -------------------------------------------------------------


def test_resampling_costs() -> None:
    """Nearest upsampling, pixel (un)shuffle and expand only move data: no FLOPs. Bilinear upsampling
    counts 4 per output element (one weighted tap per corner; fvcore's count), as ``pool`` work."""
    graph = graph_from_source("""
model m() {
  input img: f32[2, 3, 4, 5]
  output a = upsample(img, 2)
  output b = upsample(img, [2, 3], mode=bilinear)
  output c = pixel_shuffle(pixel_unshuffle(upsample(img, 2), 2), 2)
  output d = expand(img, [3, 2, 3, 4, 5])
}
""", None)
    types = graph.value_types()
    costs = {n.outputs[0]: node_cost(n, [types[v] for v in n.inputs]) for n in graph.nodes if n.op != "input"}
    by_op = {n.op: costs[n.outputs[0]] for n in graph.nodes if n.op != "input" and n.attrs.get("mode") != "bilinear"}
    assert all(c.total == 0 for c in by_op.values())
    bilinear = next(costs[n.outputs[0]] for n in graph.nodes if n.attrs.get("mode") == "bilinear")
    assert bilinear.flops == {"pool": 4 * 2 * 3 * 8 * 15}
    for op in ("upsample", "pixel_shuffle", "pixel_unshuffle", "expand"):
        assert get_op(op).has("data_movement") and get_op(op).depth == 0
    assert get_op("broadcast_to") is get_op("expand")
    assert get_op("conv_transpose2d").has("conv") and get_op("conv_transpose2d").depth == 1


def test_receptive_field_divides_the_jump_through_upsampling() -> None:
    """A transposed conv, upsample and pixel_shuffle divide the jump by their factor; pixel_unshuffle is an
    r×r window of stride r; expand is pointwise, so a broadcast field stays (tests/
    test_analysis_receptive_layouts.py checks a whole stack against autograd)."""
    graph = graph_from_source("""
model m() {
  input img: f32[1, 3, 17, 17]
  a = conv2d(img, 4, 3, stride=2)
  output t = conv_transpose2d(a, 4, 2, stride=2)
  output t3 = conv_transpose2d(a, 4, 3, stride=2)
  output u = upsample(a, 2)
  output b = upsample(a, 2, mode=bilinear)
  output s = pixel_shuffle(a, 2)
  output p = pixel_unshuffle(a, 2)
  output e = expand(a, [2, 4, 8, 8])
}
""", None)
    fields = receptive_fields(graph)
    assert fields["a"] == ((3, 3), (2, 2))
    assert fields["t"] == ((3, 3), (1, 1))  # k 2, s 2: each output reads one input
    assert fields["t3"] == ((5, 5), (1, 1))  # k 3, s 2: up to ceil(3/2) = 2 inputs, 2 pixels apart
    assert fields["u"] == ((3, 3), (1, 1)) and fields["b"] == ((5, 5), (1, 1))
    assert fields["s"] == ((3, 3), (1, 1)) and fields["p"] == ((5, 5), (4, 4))
    assert fields["e"] == fields["a"]


# -- type rules: symbolic sizes, PyTorch's refusals ----------------------------------------------


def test_symbolic_sizes() -> None:
    graph = graph_from_source("""
model m(B, H, W) {
  input x: f32[B, 16, H, W]
  input cls: f32[1, 1, 64]
  output a = conv_transpose2d(x, 8, 4, stride=2, padding=1)
  output b = pixel_unshuffle(upsample(x, 2), 2)
  output c = expand(cls, [B, 1, -1])
}
""", None)
    types = {k: str(v) for k, v in graph.value_types().items()}
    assert types["a"] == "f32[B,8,2*H,2*W]"
    assert types["b"] == "f32[B,64,H,W]"
    assert types["c"] == "f32[B,1,64]"


@pytest.mark.parametrize("call, torch_call", [
    ("conv_transpose2d(x, 4, 3, stride=2, output_padding=2)",
     lambda x: torch.nn.ConvTranspose2d(8, 4, 3, stride=2, output_padding=2)(x)),
    ("conv_transpose2d(x, 4, 3, dilation=3, output_padding=2)",  # smaller than the dilation: allowed
     lambda x: torch.nn.ConvTranspose2d(8, 4, 3, dilation=3, output_padding=2)(x)),
    ("conv_transpose2d(x, 4, 3, padding=4)", lambda x: torch.nn.ConvTranspose2d(8, 4, 3, padding=4)(x)),
    ("conv_transpose2d(x, 4, 3, groups=3)", lambda x: torch.nn.ConvTranspose2d(8, 4, 3, groups=3)(x)),
    ("pixel_shuffle(x, 3)", lambda x: F.pixel_shuffle(x, 3)),
    ("pixel_unshuffle(x, 3)", lambda x: F.pixel_unshuffle(x, 3)),
    ("expand(x, [2, 8, 3, 3])", lambda x: x.expand(2, 8, 3, 3)),
    ("expand(x, [1, 8, 1, 3, 1])", lambda x: x.expand(1, 8, 1, 3, 1)),
    ("expand(x, [1, -1, 3, 3])", lambda x: x.expand(1, -1, 3, 3)),
    ("expand(x, [-1, 1, 8, 3, 3])", lambda x: x.expand(-1, 1, 8, 3, 3)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_refusals_and_acceptances_agree_with_torch(call: str, torch_call) -> None:
    """irc refuses (a ShapeError, exit 1) exactly what torch refuses, and agrees on the shape otherwise."""
    x = torch.zeros(1, 8, 3, 3)
    try:
        want = tuple(torch_call(x).shape)
    except (RuntimeError, ValueError):
        want = None
    if want is None:
        with pytest.raises(IrcError):
            _graph((1, 8, 3, 3), call)
    else:
        assert tuple(_graph((1, 8, 3, 3), call).value_types()["y"].shape) == want


def test_upsample_nearest_on_a_sequence_only() -> None:
    with pytest.raises(IrcError, match="mode=bilinear needs an input"):
        _graph((1, 2, 5), "upsample(x, 2, mode=bilinear)")
    with pytest.raises(IrcError, match=r"a pair of scales \[h, w\] needs an input \[B, C, H, W\]"):
        _graph((1, 2, 5), "upsample(x, [2, 2])")
    with pytest.raises(IrcError, match="fewer than the input's 3"):
        _graph((1, 2, 5), "expand(x, [2, 5])")


# -- ViT: a learned class token before the patch sequence ------------------------------------------

VIT = """
model vit_tiny(B) {
  const d = 16, patch = 4
  input image: f32[B, 3, 8, 8]
  patches = conv2d(image, d, patch, stride=patch)
  tokens = transpose(flatten(patches, start=2), [0, 2, 1])
  cls = param(name=cls_token, shape=[1, 1, d], init=zeros)
  x = concat(expand(cls, [B, 1, d]), tokens, axis=1)
  output h = positional(x, learned, max_len=5)
}
"""


def test_vit_class_token_against_torch(cpu_cache) -> None:
    """timm's VisionTransformer stem: patch conv, flatten, cls_token.expand(B, -1, -1), cat, + pos_embed."""
    from irc.backends.cpu import compile_graph

    graph = graph_from_source(VIT, {"B": 2})
    params, _ = weight_table(graph)
    assert params["cls.cls_token"] == (1, 1, 16)
    assert count_params(graph)[0] == 16 * 3 * 4 * 4 + 16 + 16 + 5 * 16  # conv, cls token, position table
    init = init_weights(graph, seed=0)
    assert not init["cls.cls_token"].any()  # init=zeros, as timm's cls_token before its trunc_normal_
    rng = np.random.default_rng(5)
    weights = {k: rng.standard_normal(tuple(s)).astype(np.float32) for k, s in sorted(params.items())}
    image = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
    pos_key = next(k for k in weights if k.startswith("h."))
    with torch.no_grad():
        p = F.conv2d(torch.tensor(image, dtype=torch.float64), t["patches.weight"], t["patches.bias"], stride=4)
        tokens = p.flatten(2).transpose(1, 2)
        want = (torch.cat([t["cls.cls_token"].expand(2, -1, -1), tokens], dim=1) + t[pos_key]).numpy()
    ref = run_graph(graph, weights, {"image": image}, np.float64)["h"]
    assert rel_error(ref, want) < 1e-10  # the same float32 values in float64 on both sides
    got = compile_graph(graph, cache_dir=cpu_cache).run(weights, {"image": image})["h"]
    assert rel_error(got, want) < TOLERANCE


def test_param_name_may_be_a_bare_word_or_a_string() -> None:
    bare = graph_from_source("model m() {\n  output w = param(name=cls_token, shape=[1, 1, 8], init=zeros)\n}\n", None)
    quoted = graph_from_source('model m() {\n  output w = param(name="cls_token", shape=[1, 1, 8], init=zeros)\n}\n',
                               None)
    assert weight_table(bare) == weight_table(quoted) == ({"w.cls_token": (1, 1, 8)}, {})
    with pytest.raises(IrcError, match="undefined name 'wte'"):  # a reference to an instance stays checked
        graph_from_source("model m() {\n  input t: i32[1, 4]\n  output y = unembed(t, tied=wte)\n}\n", None)


# -- whole decoders: DCGAN's generator and ESPCN's sub-pixel super-resolution ------------------------

DCGAN = """
model dcgan_generator(B) {{
  const nz = 100, ngf = {ngf}, nc = 3
  input z: f32[B, nz, 1, 1]
  c1 = conv_transpose2d(z, ngf * 8, 4, bias=false)
  h1 = relu(batchnorm(c1))
  c2 = conv_transpose2d(h1, ngf * 4, 4, stride=2, padding=1, bias=false)
  h2 = relu(batchnorm(c2))
  c3 = conv_transpose2d(h2, ngf * 2, 4, stride=2, padding=1, bias=false)
  h3 = relu(batchnorm(c3))
  c4 = conv_transpose2d(h3, ngf, 4, stride=2, padding=1, bias=false)
  h4 = relu(batchnorm(c4))
  output image = tanh(conv_transpose2d(h4, nc, 4, stride=2, padding=1, bias=false))
}}
"""


def _dcgan_torch(ngf: int) -> torch.nn.Sequential:
    """The generator of the PyTorch DCGAN tutorial (nz = 100, nc = 3)."""
    layers: list[torch.nn.Module] = []
    widths = [100, ngf * 8, ngf * 4, ngf * 2, ngf]
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [torch.nn.ConvTranspose2d(a, b, 4, 1 if i == 0 else 2, 0 if i == 0 else 1, bias=False),
                   torch.nn.BatchNorm2d(b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), torch.nn.Tanh())


def _bn_weights(graph, module: torch.nn.Sequential, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The torch module's weights under irc's keys (in graph order), with random running statistics."""
    convs = [m for m in module if isinstance(m, (torch.nn.ConvTranspose2d, torch.nn.Conv2d))]
    norms = [m for m in module if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in norms:
        bn.running_mean.copy_(torch.tensor(rng.standard_normal(bn.num_features) * 0.1))
        bn.running_var.copy_(torch.tensor(rng.uniform(0.5, 1.5, bn.num_features)))
    out: dict[str, np.ndarray] = {}
    nodes = [n for n in graph.nodes if n.op in ("conv_transpose2d", "conv2d", "batchnorm")]
    conv_nodes = [n for n in nodes if n.op != "batchnorm"]
    bn_nodes = [n for n in nodes if n.op == "batchnorm"]
    for node, m in zip(conv_nodes, convs, strict=True):
        out[f"{node.weights}.weight"] = m.weight.detach().numpy().copy()
        if m.bias is not None:
            out[f"{node.weights}.bias"] = m.bias.detach().numpy().copy()
    for node, m in zip(bn_nodes, norms, strict=True):
        for key, value in (("gain", m.weight), ("bias", m.bias), ("running_mean", m.running_mean),
                           ("running_var", m.running_var)):
            out[f"{node.weights}.{key}"] = value.detach().numpy().copy()
    return out


def test_dcgan_generator_size_and_flops() -> None:
    """3,576,704 parameters (the tutorial's generator); FLOPs as torch's flop counter counts them."""
    graph = graph_from_source(DCGAN.format(ngf=64), {"B": 1})
    assert tuple(graph.value_types()["image"].shape) == (1, 3, 64, 64)
    module = _dcgan_torch(64).eval()
    params = sum(p.numel() for p in module.parameters())
    assert count_params(graph)[0] == params == 3_576_704
    types = graph.value_types()
    convs = [node_cost(n, [types[v] for v in n.inputs]) for n in graph.nodes if n.op == "conv_transpose2d"]
    with torch.no_grad(), torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        module(torch.zeros(1, 100, 1, 1))
    assert sum(c.flops["linear"] for c in convs) == counter.get_total_flops()


@pytest.fixture(scope="module")
def dcgan_small():
    graph = graph_from_source(DCGAN.format(ngf=4), {"B": 2})
    torch.manual_seed(7)
    module = _dcgan_torch(4).double().eval()
    rng = np.random.default_rng(8)
    with torch.no_grad():
        weights = _bn_weights(graph, module, rng)
        z = rng.standard_normal((2, 100, 1, 1))
        want = module(torch.tensor(z)).numpy()
    return graph, {k: v.astype(np.float32) for k, v in weights.items()}, {"z": z.astype(np.float32)}, want


def test_dcgan_generator_runs_as_torch(dcgan_small, cpu_cache) -> None:
    from irc.backends.cpu import compile_graph

    graph, weights, inputs, want = dcgan_small
    ref = run_graph(graph, weights, inputs, np.float64)["image"]
    assert rel_error(ref, want) < 1e-6  # float32 weights against float64 torch ones: rounding only
    got = compile_graph(graph, cache_dir=cpu_cache).run(weights, inputs)["image"]
    assert rel_error(got, want) < TOLERANCE


ESPCN = """
model espcn(B, H, W) {
  const r = 3, c = 1
  input lowres: f32[B, c, H, W]
  f1 = tanh(conv2d(lowres, 64, 5, padding=2))
  f2 = tanh(conv2d(f1, 32, 3, padding=1))
  output highres = pixel_shuffle(conv2d(f2, c * r * r, 3, padding=1), r)
}
"""


def test_espcn_super_resolution_against_torch(cpu_cache) -> None:
    """Shi et al. 2016: two convolutions, one to r²·C channels, a pixel shuffle to r× the size."""
    from irc.backends.cpu import compile_graph

    graph = graph_from_source(ESPCN, {"B": 2, "H": 6, "W": 5})
    torch.manual_seed(9)
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 64, 5, padding=2), torch.nn.Tanh(),
                                 torch.nn.Conv2d(64, 32, 3, padding=1), torch.nn.Tanh(),
                                 torch.nn.Conv2d(32, 9, 3, padding=1), torch.nn.PixelShuffle(3)).double()
    assert count_params(graph)[0] == sum(p.numel() for p in module.parameters()) == 22_729
    weights = _bn_weights(graph, module, np.random.default_rng(0))
    x = np.random.default_rng(10).standard_normal((2, 1, 6, 5))
    with torch.no_grad():
        want = module(torch.tensor(x)).numpy()
    assert want.shape == tuple(graph.value_types()["highres"].shape) == (2, 1, 18, 15)
    w32, x32 = {k: v.astype(np.float32) for k, v in weights.items()}, {"lowres": x.astype(np.float32)}
    assert rel_error(run_graph(graph, w32, x32, np.float64)["highres"], want) < 1e-6
    assert rel_error(compile_graph(graph, cache_dir=cpu_cache).run(w32, x32)["highres"], want) < TOLERANCE



def _random_case(rng: np.random.Generator):
    """A random geometry for one of the ops: (irc call on x, input shape, torch function of x, module or None).
    The function raises where torch refuses the geometry (a module torch cannot build is such a function)."""
    pick = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    kind = pick(0, 3)
    if kind == 0:  # transposed convolution, 1-D or 2-D, every attribute
        nd = pick(1, 2)
        cin, out, g = pick(1, 6), pick(1, 6), pick(1, 3)
        shape = (2, cin) + tuple(pick(1, 5) for _ in range(nd))
        geo = {k: tuple(pick(lo, hi) for _ in range(nd)) for k, lo, hi in
               (("kernel", 1, 4), ("stride", 1, 3), ("padding", 0, 2), ("output_padding", 0, 2), ("dilation", 1, 3))}
        bias = bool(pick(0, 1))
        spell = lambda v: str(v[0]) if nd == 1 else f"[{v[0]}, {v[1]}]"  # noqa: E731
        call = (f"conv_transpose{nd}d(x, {out}, {spell(geo['kernel'])}, "
                + ", ".join(f"{k}={spell(v)}" for k, v in geo.items() if k != "kernel")
                + f", groups={g}, bias={'true' if bias else 'false'})")
        cls = torch.nn.ConvTranspose1d if nd == 1 else torch.nn.ConvTranspose2d
        try:
            module = cls(cin, out, geo["kernel"], geo["stride"], geo["padding"], geo["output_padding"], g, bias,
                         geo["dilation"]).double()
        except ValueError as e:  # channels that do not divide into the groups
            def refuse(x, e=e):
                raise e
            return call, shape, refuse, None
        return call, shape, module, module
    if kind == 1:
        shape = tuple(pick(1, 8) for _ in range(pick(3, 5)))
        r = pick(1, 3)
        if pick(0, 1):
            return f"pixel_shuffle(x, {r})", shape, lambda x: F.pixel_shuffle(x, r), None
        return f"pixel_unshuffle(x, {r})", shape, lambda x: F.pixel_unshuffle(x, r), None
    if kind == 2:
        shape = tuple(pick(1, 3) for _ in range(pick(1, 3)))
        target = [int(rng.choice([1, 2, 3, -1])) for _ in range(len(shape) + pick(0, 2))]
        return f"expand(x, {target})", shape, lambda x: x.expand(*target), None
    shape = (2, 2) + tuple(pick(1, 4) for _ in range(pick(1, 2)))
    scale = pick(1, 3)
    mode = "bilinear" if len(shape) == 4 and pick(0, 1) else "nearest"
    corners = mode == "bilinear" and bool(pick(0, 1))
    given = corners if mode == "bilinear" else None  # torch takes align_corners for interpolating modes only
    return (f"upsample(x, {scale}, mode={mode}, align_corners={'true' if corners else 'false'})", shape,
            lambda x: F.interpolate(x, scale_factor=scale, mode=mode, align_corners=given), None)


def test_random_geometries_agree_with_torch() -> None:
    """300 random calls: irc refuses (IrcError) exactly the ones torch refuses; for the others the shape,
    the parameter count and the NumPy reference's values are torch's."""
    rng = np.random.default_rng(12)
    accepted = refused = 0
    for _ in range(300):
        torch.manual_seed(0)
        call, shape, fn, module = _random_case(rng)
        x = torch.randn(shape, dtype=torch.float64)
        try:
            with torch.no_grad():
                want = fn(x)
        except (RuntimeError, ValueError):
            with pytest.raises(IrcError):
                _graph(shape, call)
            refused += 1
            continue
        graph = _graph(shape, call)
        weights = {}
        if module is not None:
            assert count_params(graph)[0] == sum(p.numel() for p in module.parameters()), call
            weights = {f"y.{k}": v.detach().numpy() for k, v in module.named_parameters()}
        got = run_graph(graph, weights, {"x": x.numpy()}, np.float64)["y"]
        assert got.shape == tuple(want.shape), call
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10, err_msg=call)
        accepted += 1
    assert accepted > 100 and refused > 30  # both sides of every rule are exercised
