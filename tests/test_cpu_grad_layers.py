"""The CPU backend's backward kernels of the windowed and recurrent layers (backends/cpu/render/grad_conv.py,
grad_recurrent.py) against the NumPy reference in float64: convolutions (stride, padding incl. same,
dilation, groups; 1-D; transposed), pools, upsampling, and backpropagation through time for rnn, lstm and gru
in both layouts. Each case is one layer under a loss, every gradient within 1e-5 of its largest entry."""

from __future__ import annotations

import pytest
from test_cpu_backend_helpers import cpu_cache
from test_cpu_grad_helpers import check, one_loss, step_graph

_ = cpu_cache  # a fixture, used by name below

SPATIAL = "  input img: f32[3, 4, 9, 9]\n  input seq: f32[3, 4, 17]"
WINDOWED = {
    "conv2d_strided_dilated_grouped": ("conv2d(img, 6, 3, stride=2, padding=1, dilation=2, groups=2)", "conv2d_grad"),
    "conv2d_same": ("conv2d(img, 6, [3, 2], padding=same)", "conv2d_grad"),
    "conv2d_depthwise": ("conv2d(img, 4, 3, groups=4, bias=false)", "conv2d_grad"),
    "conv1d": ("conv1d(seq, 6, 4, stride=3, padding=2, dilation=2)", "conv1d_grad"),
    "conv_transpose2d": ("conv_transpose2d(img, 6, 3, stride=2, padding=1, output_padding=1, groups=2)",
                         "conv_transpose2d_grad"),
    "conv_transpose1d": ("conv_transpose1d(seq, 6, 3, stride=2, padding=1)", "conv_transpose1d_grad"),
    "maxpool2d": ("maxpool2d(img, 3, stride=2, padding=1, dilation=2)", "maxpool2d_grad"),
    "maxpool1d": ("maxpool1d(seq, 2, padding=1, dilation=2)", "maxpool1d_grad"),
    "avgpool2d": ("avgpool2d(img, 3, stride=2, padding=1)", "avgpool2d_grad"),
    "avgpool2d_exclude_pad": ("avgpool2d(img, [3, 2], stride=[2, 1], padding=[1, 1], count_include_pad=false)",
                              "avgpool2d_grad"),
    "avgpool1d": ("avgpool1d(seq, 3, 1, 1)", "avgpool1d_grad"),
    "adaptive_avgpool2d": ("adaptive_avgpool2d(img, [4, 3])", "adaptive_avgpool2d_grad"),
    "global_avgpool": ("global_avgpool(img)", "global_avgpool_grad"),
    "upsample_nearest": ("upsample(img, 2)", "upsample_grad"),
    "upsample_bilinear": ("upsample(img, 2, mode=bilinear)", "upsample_grad"),
    "upsample_bilinear_corners": ("upsample(img, 3, mode=bilinear, align_corners=true)", "upsample_grad"),
}


@pytest.mark.parametrize("case", list(WINDOWED))
def test_windowed_layer_gradients(cpu_cache, case: str) -> None:
    expr, op = WINDOWED[case]
    check(cpu_cache, step_graph(one_loss(SPATIAL, f"y = {expr}")), {op})


SEQUENCE = "  input x: f32[3, 5, 6]"
RECURRENT = {
    "lstm_seq": ("y, h, c = lstm(x, 7)", "lstm_grad"),
    "lstm_final_c": ("s, h, y = lstm(x, 7)", "lstm_grad"),
    "rnn": ("y, h = rnn(x, 5)", "rnn_grad"),
    "rnn_relu_no_bias": ("y, h = rnn(x, 5, act=relu, bias=false)", "rnn_grad"),
    "gru": ("y, h = gru(x, 4)", "gru_grad"),
    "gru_torch_variant": ("y, h = gru(x, 4, variant=torch)", "gru_grad"),
    "gru_final_h_no_bias": ("s, y = gru(x, 4, bias=false)", "gru_grad"),
    "lstm_torch_stacked_bidirectional": ("y, h, c = lstm(x, 7, layout=torch, layers=2, bidirectional=true)",
                                         "lstm_grad"),
    "lstm_torch_final_c": ("s, h, y = lstm(x, 7, layout=torch, layers=2, bidirectional=true)", "lstm_grad"),
    "gru_torch_bidirectional": ("y, h = gru(x, 4, layout=torch, variant=torch, bidirectional=true)", "gru_grad"),
    "rnn_torch_three_layers": ("s, y = rnn(x, 5, layout=torch, layers=3, act=relu)", "rnn_grad"),
}


@pytest.mark.parametrize("case", list(RECURRENT))
def test_recurrent_gradients(cpu_cache, case: str) -> None:
    body, op = RECURRENT[case]
    check(cpu_cache, step_graph(one_loss(SEQUENCE, body)), {op})
