"""RNN, LSTM and GRU as the ONNX RNN/LSTM/GRU ops, their weights reordered by Split/Concat nodes
over the initializers (which keep irc's keys and PyTorch's gate order; ORT folds the reordering).

irc's gates are PyTorch's (LSTM i, f, g, o; GRU r, z, n); ONNX's are LSTM i, o, f, c and GRU z, r, h.
The chapter's GRU (r applied to h before the hidden matmul) is ONNX's linear_before_reset=0, but
writes h = (1 − z)·h + z·n where ONNX writes (1 − z)·n + z·h: its z is ONNX's 1 − z = sigmoid(−·),
so the z rows of the weights and the bias are negated.
"""

from __future__ import annotations

import numpy as np

from irc.backends.onnx.context import Context
from irc.graph import Node
from irc.ops.recurrent import directions, layer_suffix, num_layers, torch_layout


def _gates(ctx: Context, w: str, n: int, order: list[int], negate: int | None = None) -> str:
    """Split a [n·H, ...] tensor into its n gate blocks and concatenate them in ``order``."""
    blocks = ctx.op("Split", [w], n, axis=0)
    if negate is not None:
        blocks[negate] = ctx.op1("Neg", [blocks[negate]])
    return ctx.op1("Concat", [blocks[i] for i in order], axis=0)


def _pass(ctx: Context, node: Node, x_tbd: str, op_type: str, n: int, order: list[int], sfx: str,
          biases: tuple[str | None, str | None], negate: int | None = None, **attrs) -> list[str]:
    """One ONNX RNN/LSTM/GRU over a [T, B, D] sequence: [T, B, H] and the final states [1, B, H]."""
    hidden = int(node.attrs["hidden"])
    unsq = ctx.ints([0])
    w = ctx.op1("Unsqueeze", [_gates(ctx, ctx.weight(node, "weight_ih" + sfx), n, order, negate), unsq])
    r = ctx.op1("Unsqueeze", [_gates(ctx, ctx.weight(node, "weight_hh" + sfx), n, order, negate), unsq])
    ins = [x_tbd, w, r]
    if any(biases):
        zero = ctx.const(np.zeros(n * hidden, np.float32))
        b_in, b_h = (_gates(ctx, ctx.weight(node, b), n, order, negate) if b else zero for b in biases)
        ins.append(ctx.op1("Unsqueeze", [ctx.op1("Concat", [b_in, b_h], axis=0), unsq]))
    outs = ctx.op(op_type, ins, 3 if op_type == "LSTM" else 2, hidden_size=hidden, **attrs)
    return [ctx.op1("Squeeze", [outs[0], ctx.ints([1])]), *outs[1:]]


def _run(ctx: Context, node: Node, xs: list[str], op_type: str, n: int, order: list[int],
         biases: tuple[str | None, str | None], negate: int | None = None, **attrs) -> list[str]:
    x = ctx.op1("Transpose", [xs[0]], perm=[1, 0, 2])
    seq, *states = _pass(ctx, node, x, op_type, n, order, "", biases, negate, **attrs)
    unsq = ctx.ints([0])
    return [ctx.op1("Transpose", [seq], perm=[1, 0, 2])] + [ctx.op1("Squeeze", [o, unsq]) for o in states]


def _stacked(ctx: Context, node: Node, xs: list[str], op_type: str, n: int, order: list[int], **attrs) -> list[str]:
    """PyTorch's layout: layers of one or two directions (the reverse one is ONNX's direction=reverse,
    whose outputs stay in time order), directions concatenated on features, final states stacked
    [layers·dirs, B, H] in PyTorch's row order; dropout between layers is the identity at inference."""
    a = node.attrs
    seq = ctx.op1("Transpose", [xs[0]], perm=[1, 0, 2])
    finals: list[list[str]] = []
    for layer in range(num_layers(a)):
        outs = []
        for d in range(directions(a)):
            sfx = layer_suffix(layer, d)
            biases = tuple(f"{b}{sfx}" if ctx.has_weight(node, f"{b}{sfx}") else None for b in ("bias_ih", "bias_hh"))
            y, *states = _pass(ctx, node, seq, op_type, n, order, sfx, biases,
                               direction="reverse" if d else "forward", **attrs)
            outs.append(y)
            finals.append(states)
        seq = ctx.op1("Concat", outs, axis=-1) if len(outs) > 1 else outs[0]
    stacked = [ctx.op1("Concat", [f[i] for f in finals], axis=0) if len(finals) > 1 else finals[0][i]
               for i in range(len(finals[0]))]
    return [ctx.op1("Transpose", [seq], perm=[1, 0, 2]), *stacked]


def _bias_name(ctx: Context, node: Node, short: str) -> str | None:
    return short if ctx.has_weight(node, short) else None


def _rnn(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    act = "Tanh" if node.attrs.get("act", "tanh") == "tanh" else "Relu"
    if torch_layout(node.attrs):
        return _stacked(ctx, node, xs, "RNN", 1, [0], activations=[act])
    return _run(ctx, node, xs, "RNN", 1, [0], (_bias_name(ctx, node, "bias"), None), activations=[act])


def _lstm(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    if torch_layout(node.attrs):
        return _stacked(ctx, node, xs, "LSTM", 4, [0, 3, 1, 2])
    return _run(ctx, node, xs, "LSTM", 4, [0, 3, 1, 2], (_bias_name(ctx, node, "bias"), None))


def _gru(ctx: Context, node: Node, xs: list[str]) -> list[str]:
    if torch_layout(node.attrs):
        return _stacked(ctx, node, xs, "GRU", 3, [1, 0, 2], linear_before_reset=1)
    if node.attrs.get("variant") == "torch":
        return _run(ctx, node, xs, "GRU", 3, [1, 0, 2],
                    (_bias_name(ctx, node, "bias_ih"), _bias_name(ctx, node, "bias_hh")), linear_before_reset=1)
    return _run(ctx, node, xs, "GRU", 3, [1, 0, 2], (_bias_name(ctx, node, "bias"), None), negate=1,
                linear_before_reset=0)


OPS = {"rnn": _rnn, "lstm": _lstm, "gru": _gru}
