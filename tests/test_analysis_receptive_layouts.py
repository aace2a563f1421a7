"""The receptive field through channel-last blocks and squeeze-excitation, and W109 on networks
whose residual blocks alternate with downsampling blocks.

Oracles: the chapter's recurrence r_l = r_{l-1} + (k_l - 1)·j_{l-1}, j_l = j_{l-1}·s_l applied by
hand (here, in plain Python) to each network's published list of spatial layers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

CONVNEXT = """
block convnext_block(x, c) {
  dw = conv2d(x, c, 7, padding=3, groups=c)
  t = transpose(dw, [0, 2, 3, 1])            # channel-last, as the official implementation
  h = linear(gelu(linear(layernorm(t, eps=1e-6), 4 * c)), c)
  return x + transpose(h, [0, 3, 1, 2])
}
block down(x, c) {
  n = transpose(layernorm(transpose(x, [0, 2, 3, 1]), eps=1e-6), [0, 3, 1, 2])
  return conv2d(n, c, 2, stride=2)
}
model convnext_t(B, H, W) {
  input image: f32[B, 3, H, W]
  stem = conv2d(image, 96, 4, stride=4)
  s = transpose(layernorm(transpose(stem, [0, 2, 3, 1]), eps=1e-6), [0, 3, 1, 2])
  s1 = repeat(3) convnext_block(s, 96)
  s2 = repeat(3) convnext_block(down(s1, 192), 192)
  s3 = repeat(9) convnext_block(down(s2, 384), 384)
  s4 = repeat(3) convnext_block(down(s3, 768), 768)
  output features = s4
  output logits = linear(layernorm(global_avgpool(s4), eps=1e-6), 1000)
}
"""


def chapter_rf(layers: list[tuple[int, int]]) -> tuple[int, int]:
    r, j = 1, 1
    for k, s in layers:
        r, j = r + (k - 1) * j, j * s
    return r, j


def _analyze(irc_cli: Callable, tmp_path: Path, name: str, text: str) -> dict:
    path = tmp_path / f"{name}.arch"
    path.write_text(text)
    result = irc_cli(["analyze", str(path), "--json"])
    assert result.rc == 0, result.err
    return json.loads(result.out)


def _row(report: dict, name: str) -> dict:
    return next(r for r in report["layers"] if r["name"] == name)


def test_convnext_field_flows_through_its_channel_last_blocks(irc_cli: Callable, tmp_path: Path) -> None:
    layers = [(4, 4)] + [(7, 1)] * 3 + [(2, 2)] + [(7, 1)] * 3 + [(2, 2)] + [(7, 1)] * 9 + [(2, 2)] + [(7, 1)] * 3
    r, j = chapter_rf(layers)
    assert (r, j) == (1688, 32)  # the published network's layer list, by the recurrence
    report = _analyze(irc_cli, tmp_path, "convnext", CONVNEXT)
    features = [row for row in report["layers"] if row["receptive_field"] is not None][-1]
    assert (features["receptive_field"], features["jump"]) == (r, j)
    # the channel-last layer norm and MLP keep the field (they mix channels, not positions)
    mlp = [row for row in report["layers"] if row["op"] == "linear" and row["receptive_field"] is not None]
    assert mlp and max(row["receptive_field"] for row in mlp) == r


SE_NET = """
block se(x, c, squeeze) {
  s = sigmoid(conv2d(silu(conv2d(adaptive_avgpool2d(x, 1), squeeze, 1)), c, 1))
  return x * s
}
model se_net(B) {
  input image: f32[B, 3, 224, 224]
  a = silu(conv2d(image, 32, 3, stride=2, padding=1))
  b = se(conv2d(a, 32, 3, padding=1, groups=32), 32, 8)
  c = se(conv2d(b, 64, 5, stride=2, padding=2), 64, 8)
  output y = conv2d(c, 64, 3, padding=1)
}
"""


def test_a_squeeze_excitation_pool_is_not_a_window(irc_cli: Callable, tmp_path: Path) -> None:
    r, j = chapter_rf([(3, 2), (3, 1), (5, 2), (3, 1)])  # the SE branch's global pool adds nothing
    report = _analyze(irc_cli, tmp_path, "se_net", SE_NET)
    y = _row(report, "y")
    assert (y["receptive_field"], y["jump"]) == (r, j)
    assert r < 224


MOBILE = """
block inverted(x, c, expand) {
  h = relu(batchnorm(conv2d(x, c * expand, 1, bias=false)))
  d = relu(batchnorm(conv2d(h, c * expand, 3, padding=1, groups=c * expand, bias=false)))
  return x + batchnorm(conv2d(d, c, 1, bias=false))
}
block inverted_down(x, c_in, c, expand) {
  h = relu(batchnorm(conv2d(x, c_in * expand, 1, bias=false)))
  d = relu(batchnorm(conv2d(h, c_in * expand, 3, stride=2, padding=1, groups=c_in * expand, bias=false)))
  return batchnorm(conv2d(d, c, 1, bias=false))
}
model mobile(B) {
  input image: f32[B, 3, 64, 64]
  x = relu(batchnorm(conv2d(image, 16, 3, stride=2, padding=1, bias=false)))
  x1 = repeat(3) inverted(inverted_down(x, 16, 24, 6), 24, 6)
  x2 = repeat(3) inverted(inverted_down(x1, 24, 32, 6), 32, 6)
  x3 = repeat(3) inverted(inverted_down(x2, 32, 64, 6), 64, 6)
  x4 = repeat(3) inverted(inverted_down(x3, 64, 96, 6), 96, 6)
  output logits = linear(global_avgpool(conv2d(x4, 320, 1)), 10)
}
"""

PLAIN_BLOCKS = """
block layer(x) {
  return relu(linear(x, 64))
}
model plain(B) {
  input x: f32[B, 64]
  output y = repeat(24) layer(x)
}
"""


def test_w109_sees_identity_shortcuts_between_downsampling_blocks(irc_cli: Callable, tmp_path: Path) -> None:
    # the shortest path crosses 1 + 4·3 + 1 + 1 = 15 layers of downsampling blocks and 4·3·3 bypassed ones:
    # every stretch no skip bypasses is short, as in MobileNetV2 and EfficientNet
    path = tmp_path / "mobile.arch"
    path.write_text(MOBILE)
    result = irc_cli(["lint", str(path)])
    assert "IRC-W109" not in result.out + result.err
    plain = tmp_path / "plain.arch"
    plain.write_text(PLAIN_BLOCKS)
    result = irc_cli(["lint", str(plain)])
    assert "IRC-W109" in result.out + result.err
    assert "24 weighted layers with no residual connection" in result.out + result.err


UPSAMPLING = """
model up(B) {
  input x: f32[B, 1, 64, 64]
  a = conv2d(x, 1, 3, padding=1)
  p = avgpool2d(a, 2)
  b = conv2d(p, 1, 5, padding=2)
  t = conv_transpose2d(b, 1, 3, stride=2, padding=1, output_padding=1)
  c = conv2d(t, 1, 3, padding=1)
  u = upsample(c, 2, mode=bilinear)
  s = pixel_shuffle(conv2d(u, 4, 3, padding=1), 2)
  output y = conv2d(s, 1, 3, padding=1)
}
"""


def _measured_field(positions: list[int]) -> int:
    """The widest span of input rows that reach one output pixel, by autograd through the same network
    in torch with positive weights (nothing cancels): the receptive field measured, not computed."""
    import torch
    import torch.nn.functional as F

    x = torch.zeros(1, 1, 64, 64, dtype=torch.float64, requires_grad=True)
    one = lambda o, i, k: torch.ones(o, i, k, k, dtype=torch.float64)  # noqa: E731
    a = F.conv2d(x, one(1, 1, 3), padding=1)
    b = F.conv2d(F.avg_pool2d(a, 2), one(1, 1, 5), padding=2)
    t = F.conv_transpose2d(b, one(1, 1, 3), stride=2, padding=1, output_padding=1)
    c = F.conv2d(t, one(1, 1, 3), padding=1)
    u = F.interpolate(c, scale_factor=2, mode="bilinear", align_corners=False)
    s = F.pixel_shuffle(F.conv2d(u, one(4, 1, 3), padding=1), 2)
    y = F.conv2d(s, one(1, 1, 3), padding=1)
    widest = 0
    for i in positions:
        (g,) = torch.autograd.grad(y[0, 0, i, y.shape[3] // 2], x, retain_graph=True)
        rows = torch.nonzero(g[0, 0].abs().sum(1)).flatten()
        widest = max(widest, int(rows.max() - rows.min()) + 1)
    return widest


def test_upsampling_divides_the_jump_and_the_field_matches_autograd(irc_cli: Callable, tmp_path: Path) -> None:
    report = _analyze(irc_cli, tmp_path, "up", UPSAMPLING)
    y = _row(report, "y")
    # 64 → pool 32 → transposed ×2 64 → bilinear ×2 128 → shuffle ×2 256: a quarter-pixel jump
    assert y["jump"] == 0.25
    measured = _measured_field(list(range(120, 136)))  # central outputs, every phase of the upsampling
    assert y["receptive_field"] >= measured  # the recurrence's span bounds every output's
    assert y["receptive_field"] - measured <= 2  # and is tight up to the rounding of fractional steps
