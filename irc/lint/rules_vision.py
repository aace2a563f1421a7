"""Layer choice against the input's structure: dense on pixels (W110), flatten heads (W111),
a dense prediction's receptive field (W112), convolution with no locality (W113)."""

from __future__ import annotations

import math

from irc.graph import Node
from irc.lint.context import ACTIVATIONS, PASS_THROUGH, LintContext
from irc.lint.numbers import percent, times
from irc.lint.registry import Finding, rule
from irc.ops import get_op
from irc.ops.common import pair
from irc.ops.registry import ops_with

WINDOWED = ops_with("window")  # read a spatial window per output position
LEARNED = ops_with("learned")  # mix features with weights or another activation
IMAGE_CHANNELS = 4  # gray, RGB, RGBA: more channels than this is a feature map
CONV_OUT = 64  # the chapter's replacement: a 3×3 convolution to 64 channels


def _flattened_map(ctx: LintContext, linear: Node) -> str | None:
    """The [B, C, H, W] value a linear layer reads through flatten, if any."""
    src = ctx.back_through(linear.inputs[0])
    node = ctx.producer(src)
    if node is None or node.op not in ("flatten", "reshape"):
        return None
    t = ctx.types[node.inputs[0]]
    if t.rank != 4 or not all(isinstance(d, int) for d in t.shape[1:]) or t.shape[2] * t.shape[3] < 2:
        return None
    if ctx.types[src].rank != 2:
        return None
    return node.inputs[0]


def _is_raw_image(ctx: LintContext, value: str) -> bool:
    return not (ctx.upstream_ops(value) & (WINDOWED | LEARNED)) and ctx.types[value].shape[1] <= IMAGE_CHANNELS


@rule("IRC-W110", "dense-on-pixels", "a dense layer on a flattened image")
def dense_on_pixels(ctx: LintContext) -> list[Finding]:
    out = []
    for node in ctx.nodes("linear"):
        image = _flattened_map(ctx, node)
        if image is None or not _is_raw_image(ctx, image):
            continue
        _, c, h, w = ctx.types[image].shape
        n_out = node.attrs["out"]
        if not isinstance(n_out, int):
            continue
        n_in = c * h * w
        params = n_in * n_out + (n_out if node.attrs["bias"] else 0)
        conv = 9 * c * CONV_OUT + CONV_OUT
        out.append(Finding(
            node,
            f"dense layer on a flattened {c}×{h}×{w} image: {h}·{w}·{c} = {n_in:,} inputs, {params:,} parameters",
            "a separate weight for every pixel position bets that an input coordinate always means the same "
            "thing, which is false for images: a pattern shifted by 3 pixels lands on different weights and must "
            "be learnt again at every location",
            f"convolve first: conv2d(x, {CONV_OUT}, 3, padding=same) has 3·3·{c}·{CONV_OUT} + {CONV_OUT} = "
            f"{conv:,} parameters at any image size ({times(params / conv)} fewer); pool, and keep dense layers "
            "for the head after global_avgpool",
            [n for n in [ctx.defaulted(image)] if n],
        ))
    return out


@rule("IRC-W111", "flatten-head", "a dense head on a flattened feature map instead of global pooling")
def flatten_head(ctx: LintContext) -> list[Finding]:
    out = []
    owned = ctx.owned
    for node in ctx.nodes("linear"):
        fmap = _flattened_map(ctx, node)
        if fmap is None or _is_raw_image(ctx, fmap) or owned is None:
            continue
        _, c, h, w = ctx.types[fmap].shape
        n_out = node.attrs["out"]
        bias = n_out if node.attrs["bias"] else 0
        params = c * h * w * n_out + bias
        pooled = c * n_out + bias
        own, total = owned
        out.append(Finding(
            node,
            f"dense head on a flattened {c}×{h}×{w} feature map: {h}·{w}·{c} = {c * h * w:,} inputs, "
            f"{params:,} parameters ({percent(params, total)} of the model)",
            f"one weight per feature per position makes the head {h * w:,}× larger than the features need "
            "and ties the model to one input size",
            f"pool first: linear(global_avgpool(x), {n_out}) reads {c:,} inputs with {pooled:,} parameters "
            f"({times(params / pooled)} fewer) at any image size",
        ))
    return out


def _rf(layers: list[tuple[int, int]]) -> int:
    r, j = 1, 1
    for k, s in layers:
        r, j = r + (k - 1) * j, j * s  # r takes the incoming j
    return r


def _with_pools(layers: list[tuple[int, int]], pools: int) -> list[tuple[int, int]]:
    """A 2×2 stride-2 pool after each of the first ``pools`` convolutions."""
    out, added = [], 0
    for k, s in layers:
        out.append((k, s))
        if k > 1 and added < pools:
            out.append((2, 2))
            added += 1
    return out


def _window_chain(ctx: LintContext, value: str, axis: int) -> list[tuple[int, int]]:
    """(effective kernel, stride) along ``axis`` of the 2-D convolutions and pools upstream of ``value``
    (resampling ops, whose record gives a step of their own, only move the jump: left out)."""
    from irc.analysis.receptive import window_of

    chain = []
    for n in ctx.upstream_nodes(value):
        rule = get_op(n.op).receptive if get_op(n.op) is not None else None
        if rule is not None and rule.kind == "window" and rule.nd == 2 and rule.step is None:
            kernels, strides = window_of(n, 2)
            chain.append((kernels[axis], strides[axis]))
    return chain


@rule("IRC-W112", "receptive-field", "a dense-prediction output whose receptive field is smaller than the input")
def receptive_field(ctx: LintContext) -> list[Finding]:
    from irc.analysis.receptive import receptive_fields

    out = []
    fields = None
    for value in dict.fromkeys(ctx.output_values()):
        t = ctx.types[value]
        if t.rank != 4 or not all(isinstance(d, int) and d > 1 for d in t.shape[2:]):
            continue
        head = ctx.producer(ctx.back_through(value, ACTIVATIONS | PASS_THROUGH))
        if head is None or head.op != "conv2d" or pair(head.attrs["kernel"]) != (1, 1):
            continue  # a per-pixel classifier ends in a 1×1 convolution
        images = [n for n in ctx.upstream_nodes(value) if n.op == "input" and n.types[0].rank == 4]
        if not images:
            continue
        fields = fields if fields is not None else receptive_fields(ctx.graph)
        if value not in fields:
            continue
        (r_h, r_w), (j_h, _) = fields[value]
        side_h, side_w = ctx.types[images[0].outputs[0]].shape[2:]
        if not (isinstance(side_h, int) and isinstance(side_w, int)) or (r_h >= side_h and r_w >= side_w):
            continue
        axis, side, r = (0, side_h, r_h) if side_h - r_h >= side_w - r_w else (1, side_w, r_w)
        chain = _window_chain(ctx, value, axis)
        convs = sum(1 for k, _ in chain if k > 1)
        if not convs:
            continue  # 1×1 convolutions alone: a per-pixel layer, not a convolutional body
        pools = next((m for m in range(1, convs + 1) if _rf(_with_pools(chain, m)) >= side), None)
        dilated = math.ceil(math.log2(side + 1)) - 1  # 3×3 at dilations 1, 2, 4, …: r = 2^(n+1) − 1
        downsample = (f"a 2×2 stride-2 pool after each of the first {pools} convolutions gives r = "
                      f"{_rf(_with_pools(chain, pools))} ≥ {side} (recover resolution with U-Net skips)"
                      if pools else "this stack is too shallow even with a pool after every convolution")
        out.append(Finding(
            head,
            f"dense-prediction output '{value}' sees {r_h}×{r_w} pixels of a {side_h}×{side_w} input",
            f"each output position reads only an r = {r}-pixel window (jump {j_h}), so a dependency wider than "
            f"{r} pixels is invisible and a uniform region larger than the window (sky against sea) is labelled "
            "from local texture alone",
            f"downsample, which buys context cheaply: {downsample}; or, at full resolution, 3×3 convolutions "
            f"dilated 1, 2, 4, … reach {side} in {dilated} layers (stride-1 3×3 convolutions alone would need "
            f"{math.ceil((side - 1) / 2)})",
            [n for n in [ctx.defaulted(images[0].outputs[0])] if n],
        ))
    return out


# ops that keep a tabular row's columns as they are on the way to a convolution
_KEEPS_COLUMNS = ops_with("input", "view", "batch_norm", "elementwise", "activation", "pass_through")


@rule("IRC-W113", "conv-no-locality", "a convolution over an axis with no locality")
def conv_no_locality(ctx: LintContext) -> list[Finding]:
    out = []
    for node in ctx.nodes("conv1d", "conv2d"):
        x = ctx.types[node.inputs[0]]
        spatial = x.shape[2:]
        ks = pair(node.attrs["kernel"]) if node.op == "conv2d" else [node.attrs["kernel"]]
        taps = math.prod(ks)
        if all(d == 1 for d in spatial) and taps > 1:
            dims = "×".join("1" for _ in spatial)
            kernel = "×".join(str(k) for k in ks)
            out.append(Finding(
                node,
                f"{kernel} kernel on a {dims} map",
                f"with a single position there is no neighbourhood: {taps - 1} of the {taps} taps only ever read "
                f"padding, so this is a dense layer carrying {taps}× its weights",
                f"use linear(flatten(x), {node.attrs['out']}) or a kernel-1 convolution",
            ))
            continue
        upstream = ctx.upstream_nodes(node.inputs[0])
        tables = [n for n in upstream if n.op == "input"]
        if not tables or any(n.op not in _KEEPS_COLUMNS for n in upstream):
            continue
        if not all(t.types[0].rank == 2 and t.types[0].is_float for t in tables):
            continue
        table = tables[0]
        cols = table.types[0].shape[1]
        cols_text = f"{cols:,} columns" if isinstance(cols, int) else "columns"
        out.append(Finding(
            node,
            f"{node.op} slides a {'×'.join(str(k) for k in ks)}{'-wide' if len(ks) == 1 else ''} window over the "
            f"{cols_text} of the tabular input "
            f"'{table.outputs[0]}' {table.types[0]}",
            "a convolution bets that neighbouring positions are related and that a pattern means the same "
            "anywhere; table columns have no order or locality (column 7 'days since signup' says nothing "
            "about column 8), so this layer's prior is wrong and reordering the columns changes the model",
            "use dense layers on tabular data, linear(x, N), and compare with gradient-boosted trees, which "
            "usually win on tables",
        ))
    return out
