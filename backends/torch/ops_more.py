"""Bounded activations, elementwise max/min, expand, GroupNorm/InstanceNorm, transposed convolution,
upsampling, pixel (un)shuffle, and PyTorch's stacked recurrent layout."""

from __future__ import annotations

from irc.backends.torch.render import Renderer, literal
from irc.graph import Node
from irc.ops.common import per_axis
from irc.ops.recurrent import directions, layer_suffix, num_layers
from irc.ops.resample import scales


def _clamp(r: Renderer, node: Node, xs: list[str]) -> str:
    lo, hi = node.attrs["min"], node.attrs["max"]
    return (f"torch.clamp({xs[0]}, {literal(None if lo is None else float(lo))}, "
            f"{literal(None if hi is None else float(hi))})")


def _groupnorm(r: Renderer, node: Node, xs: list[str]) -> str:
    groups = str(int(node.attrs["groups"])) if node.op == "groupnorm" else f"{xs[0]}.shape[1]"
    return (f"F.group_norm({xs[0]}, {groups}, {r.w_or_none(node, 'gain')}, {r.w_or_none(node, 'bias')}, "
            f"{literal(float(node.attrs['eps']))})")


def _conv_transpose(nd: int):
    def render(r: Renderer, node: Node, xs: list[str]) -> str:
        a = node.attrs
        return (f"F.conv_transpose{nd}d({xs[0]}, {r.w(node, 'weight')}, {r.w_or_none(node, 'bias')}, "
                f"stride={literal(per_axis(a['stride'], nd))}, padding={literal(per_axis(a['padding'], nd))}, "
                f"output_padding={literal(per_axis(a['output_padding'], nd))}, groups={int(a['groups'])}, "
                f"dilation={literal(per_axis(a['dilation'], nd))})")
    return render


def _upsample(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    rank = r.type_of(node.inputs[0]).rank
    factors = literal([float(s) for s in scales(a, rank)])
    if a["mode"] == "nearest":
        return f'F.interpolate({xs[0]}, scale_factor={factors}, mode="nearest")'
    mode = "bilinear" if rank == 4 else "linear"
    return f'F.interpolate({xs[0]}, scale_factor={factors}, mode="{mode}", align_corners={bool(a["align_corners"])})'


def _expand(r: Renderer, node: Node, xs: list[str]) -> str:
    return f"{xs[0]}.expand({', '.join(r.size_expr(node, d) for d in node.types[0].shape)})"


def stacked(r: Renderer, node: Node, xs: list[str]) -> str:
    """``layout=torch``: layers and directions with two biases each, keys ``weight_ih_l0_reverse``..."""
    a = node.attrs
    r.need("stacked_recurrent")
    passes = []
    for layer in range(num_layers(a)):
        for d in range(directions(a)):
            sfx = layer_suffix(layer, d)
            passes.append("(" + ", ".join(r.w_or_none(node, k + sfx) for k in ("weight_ih", "weight_hh", "bias_ih",
                                                                                  "bias_hh")) + ")")
    act = "F.relu" if node.op == "rnn" and a.get("act", "tanh") == "relu" else "torch.tanh"
    p = literal(float(a.get("dropout") or 0.0))
    return (f"stacked_recurrent({xs[0]}, [{', '.join(passes)}], {node.op!r}, {num_layers(a)}, "
            f"{directions(a)}, {act}, {p}, self.training)")


OPS = {
    "relu6": lambda r, node, xs: f"torch.clamp({xs[0]}, 0.0, 6.0)",
    "hardtanh": _clamp,
    "clamp": _clamp,
    "hardsigmoid": lambda r, node, xs: f"F.hardsigmoid({xs[0]})",
    "hardswish": lambda r, node, xs: f"F.hardswish({xs[0]})",
    "mish": lambda r, node, xs: f"F.mish({xs[0]})",
    "elu": lambda r, node, xs: f"F.elu({xs[0]}, {literal(float(node.attrs['alpha']))})",
    "maximum": lambda r, node, xs: f"torch.maximum({xs[0]}, {xs[1]})",
    "minimum": lambda r, node, xs: f"torch.minimum({xs[0]}, {xs[1]})",
    "expand": _expand,
    "groupnorm": _groupnorm,
    "instancenorm": _groupnorm,
    "conv_transpose1d": _conv_transpose(1),
    "conv_transpose2d": _conv_transpose(2),
    "upsample": _upsample,
    "pixel_shuffle": lambda r, node, xs: f"F.pixel_shuffle({xs[0]}, {int(node.attrs['factor'])})",
    "pixel_unshuffle": lambda r, node, xs: f"F.pixel_unshuffle({xs[0]}, {int(node.attrs['factor'])})",
}
