"""conv2d_bn (the fold-bn pass's fused convolution) as plainly as the chain it replaces: the convolution,
inference BatchNorm with the running statistics, the residual add, the activation. No folding here, so the
reference checks the fold the backends do; a fused max pool runs as maxpool2d would on the result."""

from __future__ import annotations

import numpy as np

from irc.backends.numpy_ref.conv import conv, maxpool
from irc.backends.numpy_ref.norm import batchnorm
from irc.graph import Node


def conv2d_bn(node: Node, args, w):
    a = node.attrs
    x, weight, gain, bias, mean, var = args[:6]
    y = conv(x, weight, None, a["stride"], a["padding"], a["dilation"], a["groups"])
    y = batchnorm(y, mean, var, gain, bias, 1, a["eps"])
    if len(args) > 6:
        y = y + args[6]
    y = np.maximum(y, 0) if a["act"] == "relu" else y
    if a["pool"] is None:
        return y
    return maxpool(y, {"kernel": a["pool"], "stride": a["pool_stride"], "padding": a["pool_padding"] or 0,
                       "dilation": 1})


OPS = {"conv2d_bn": conv2d_bn}
