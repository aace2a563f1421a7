"""Recurrent layers over [B, T, D] sequences: rnn, lstm, gru.

Gate order follows PyTorch (LSTM: i, f, g, o; GRU: r, z, n) so weights load directly.
The chapter's parameter count uses one bias vector per gate, which is what irc keeps;
``gru(variant=torch)`` is PyTorch/cuDNN's GRU, whose reset gate acts after the hidden
matmul and so needs a separate hidden bias (two vectors, 3·h more parameters).
"""

from __future__ import annotations

from irc.ops.common import need_float, need_rank
from irc.ops.registry import Attr, OpDef, register

GATES = {"rnn": 1, "lstm": 4, "gru": 3}


def _infer(op):
    def infer(a, ts):
        (x,) = ts
        need_rank(x, (3,), "a sequence [B, T, D]")
        need_float(x)
        b, _, _ = x.shape
        h = a["hidden"]
        seq = x.with_shape((x.shape[0], x.shape[1], h))
        state = x.with_shape((b, h))
        return [seq, state, state] if op == "lstm" else [seq, state]
    return infer


def _params(op):
    def params(a, ts):
        d = ts[0].shape[-1]
        h = a["hidden"]
        g = GATES[op] * h
        p = {"weight_ih": (g, d), "weight_hh": (g, h)}
        if a["bias"]:
            if op == "gru" and a["variant"] == "torch":
                p["bias_ih"] = (g,)
                p["bias_hh"] = (g,)
            else:
                p["bias"] = (g,)
        return p
    return params


register(OpDef(
    "rnn", ("x",),
    (Attr("hidden", "dim"), Attr("bias", "bool", True), Attr("act", "enum", "tanh", ("tanh", "relu"))),
    _infer("rnn"), _params("rnn"), results=("seq", "h"),
    doc="h_t = act(W·h_{t−1} + U·x_t + b); results: the sequence and the final state",
))
register(OpDef(
    "lstm", ("x",),
    (Attr("hidden", "dim"), Attr("bias", "bool", True),
     Attr("forget_bias", "float", 1.0, doc="initial forget-gate bias b_f (the chapter: 1.0-2.0)")),
    _infer("lstm"), _params("lstm"), results=("seq", "h", "c"),
    doc="LSTM with gates i, f, g, o; results: the sequence, final h and final c",
))
register(OpDef(
    "gru", ("x",),
    (Attr("hidden", "dim"), Attr("bias", "bool", True),
     Attr("variant", "enum", "chapter", ("chapter", "torch"))),
    _infer("gru"), _params("gru"), results=("seq", "h"),
    doc="GRU; variant=chapter applies r before the hidden matmul, variant=torch after it",
))
