"""Recurrent layers over [B, T, D] sequences: rnn, lstm, gru.

Gate order follows PyTorch (LSTM: i, f, g, o; GRU: r, z, n) so weights load directly.
The chapter's parameter count uses one bias vector per gate, which is what irc keeps;
``gru(variant=torch)`` is PyTorch/cuDNN's GRU, whose reset gate acts after the hidden
matmul and so needs a separate hidden bias (two vectors, 3·h more parameters).

``layout=torch`` is PyTorch's nn.RNN/LSTM/GRU (batch_first) as a whole: ``layers`` stacked
layers, ``bidirectional`` (a reverse-time pass per layer, the two concatenated), ``dropout``
between layers (the identity at inference), two bias vectors ``bias_ih`` and ``bias_hh`` per
layer and direction, PyTorch's parameter names (``weight_ih_l0``, ``bias_hh_l1_reverse``, …)
so a state_dict loads by renaming alone, and PyTorch's results: the sequence
[B, T, dirs·H] and the final states [layers·dirs, B, H] (row ``layer·dirs + direction``).

Training (``train=true``, set by irc.ops.grad_train.training_graph where ``dropout > 0`` and
``layers > 1``) applies that dropout as nn.LSTM does in ``train()`` mode: every layer's output
sequence but the last layer's is multiplied by its slice of a second operand, a mask
[layers − 1, B, T, dirs·H] of zeros and 1/(1 − p) that the training graph draws (dropout_mask)
per step; the backward primitive reads the very mask. The final states are the unmasked ones.
"""

from __future__ import annotations

from irc.ops.common import need_float, need_rank
from irc.ops.cost import Cost
from irc.ops.registry import Attr, OpDef, ShapeError, register, rf_reset
from irc.ops.vjps import vjp_recurrent

GATES = {"rnn": 1, "lstm": 4, "gru": 3}
# per hidden unit and step: activation evaluations, other elementwise FLOPs (bias adds apart)
STEP_FLOPS = {
    "rnn": (1, 0),
    "lstm": (5, 4),  # σ i, f, o; tanh g, tanh c · c = f·c + i·g (3) · h = o·tanh c (1)
    "gru": (3, 5),  # σ r, z; tanh n · r⊙h (1) · h = (1 − z)·h + z·n (4)
}
# intermediates per hidden unit and step that backpropagation through time keeps
SAVED_PER_UNIT = {"rnn": 1, "lstm": 6, "gru": 4}  # gates (+ c_t and tanh c_t; + r⊙h)


def torch_layout(a) -> bool:
    """PyTorch's stacked, bidirectional, two-bias layout (layout=torch)."""
    return a.get("layout") == "torch"


def num_layers(a) -> int:
    return a["layers"] if a.get("layers") is not None else 1


def directions(a) -> int:
    return 2 if a.get("bidirectional") else 1


def layer_suffix(layer: int, direction: int) -> str:
    """PyTorch's parameter suffix: ``_l0``, ``_l1_reverse``."""
    return f"_l{layer}" + ("_reverse" if direction else "")


def passes(a) -> list[tuple[int, int, str]]:
    """(layer, direction, suffix) of every single-direction pass, in PyTorch's order (h_n's rows)."""
    return [(layer, d, layer_suffix(layer, d)) for layer in range(num_layers(a)) for d in range(directions(a))]


def train_mask_shape(a, x) -> tuple | None:
    """The dropout mask training multiplies between stacked layers, [layers − 1, B, T, dirs·H]: None where
    training changes nothing (the chapter layout, dropout 0 or none, one layer). The record's
    ``extra["train_mask"]``: irc.ops.grad_train draws a mask of this shape and sets train=true."""
    if not torch_layout(a) or not a.get("dropout") or num_layers(a) < 2:
        return None
    return (num_layers(a) - 1, x.shape[0], x.shape[1], directions(a) * a["hidden"])


def _between(a, ts) -> int:
    """Elements of the sequences between stacked layers (one [B, T, dirs·H] per layer but the last)."""
    return (num_layers(a) - 1) * ts[0].shape[0] * ts[0].shape[1] * directions(a) * a["hidden"]


def layer_input(a, d, layer: int):
    """The feature width layer ``layer`` reads: the input's, then the previous layer's directions together."""
    return d if layer == 0 else directions(a) * a["hidden"]


def _cost(op):
    def cost(node, ins, outs) -> Cost:
        a = node.attrs
        b, steps, d = ins[0].shape
        h = a["hidden"]
        torch = torch_layout(a)
        runs = passes(a) if torch else [(0, 0, "")]
        c = Cost()
        for layer, _, _ in runs:  # each direction of each layer is one recurrence over every step
            c.mac("linear", steps * b * GATES[op] * h * (layer_input(a, d, layer) + h))
        act, other = STEP_FLOPS[op]
        c.add("activation", len(runs) * steps * b * h * act)
        c.add("elementwise", len(runs) * steps * b * h * other)
        if a["bias"]:
            biases = 2 if torch or (op == "gru" and a["variant"] == "torch") else 1  # b_ih and b_hh both add
            c.add("elementwise", len(runs) * steps * b * GATES[op] * h * biases)
        if a.get("train"):  # the dropout mask's multiply of every sequence between layers
            c.add("elementwise", _between(a, ins))
        return c
    return cost


def _init(op):
    def init(a) -> dict[str, str]:
        matrices = "he" if op == "rnn" and a["act"] == "relu" else "xavier"
        bias = "forget_gate" if op == "lstm" else "zeros"
        rules = {"weight_ih": matrices, "weight_hh": matrices, "bias": bias, "bias_ih": "zeros", "bias_hh": "zeros"}
        if torch_layout(a):
            # the two vectors only ever add, so the forget gate's start lives on bias_ih alone (bias_hh
            # zeros): b_ih + b_hh = forget_bias, the same gate as the one-bias layout's
            for _, _, sfx in passes(a):
                rules |= {f"weight_ih{sfx}": matrices, f"weight_hh{sfx}": matrices, f"bias_ih{sfx}": bias,
                          f"bias_hh{sfx}": "zeros"}
        return rules
    return init


def _internal(op):
    def internal(a, ts) -> int:
        """The gates every pass keeps for backpropagation, and the sequences between stacked layers."""
        b, t = ts[0].shape[0], ts[0].shape[1]
        gates = b * t * a["hidden"] * SAVED_PER_UNIT[op]
        if not torch_layout(a):
            return gates
        # in training the next layer reads the masked sequence, and each layer's own backward the unmasked one
        return len(passes(a)) * gates + _between(a, ts) * (2 if a.get("train") else 1)
    return internal


def _facts(op) -> dict:
    """What the three recurrent layers declare alike."""
    return dict(
        cost=_cost(op), init=_init(op), receptive=rf_reset("a recurrence over time"),
        classes=frozenset({"recurrent", "learned", "position"}), depth=1, internal=_internal(op),
        extra={"train_mask": train_mask_shape},
    )


def _check_layout(op: str, a) -> None:
    if torch_layout(a):
        if op == "gru" and a["variant"] != "torch":
            raise ShapeError("layout=torch is PyTorch's nn.GRU, whose reset gate acts after the hidden matmul: "
                             "it needs variant=torch")
        if a["dropout"] is not None and not 0 <= a["dropout"] < 1:
            raise ShapeError(f"dropout={a['dropout']} must be at least 0 and below 1")
        return
    given = [k for k in ("layers", "bidirectional", "dropout", "train") if a.get(k) is not None]
    if given:
        raise ShapeError(f"{', '.join(given)}= {'needs' if len(given) == 1 else 'need'} layout=torch (PyTorch's "
                         "stacked layers, two biases per layer, weight_ih_l0 names and [layers·dirs, B, H] states)")


def _check_mask(a, x, mask) -> None:
    """train=true and the mask operand come together, where dropout acts between stacked layers."""
    want = train_mask_shape(a, x)
    if a.get("train"):
        if want is None:
            raise ShapeError("train=true applies dropout between stacked layers: it needs layers > 1 and "
                             "dropout > 0 (irc.ops.grad_train sets it only then)")
        if mask is None:
            raise ShapeError(f"train=true needs the dropout mask [{', '.join(map(str, want))}] as the second operand "
                             "(irc.ops.grad_train draws it with dropout_mask)")
        need_float(mask, "dropout mask")
        if mask.rank != 4 or any(p != q for p, q in zip(mask.shape, want)):
            raise ShapeError(f"the dropout mask {mask} must be [layers − 1, B, T, dirs·H] = "
                             f"[{', '.join(map(str, want))}]")
    elif mask is not None:
        raise ShapeError("a dropout mask operand needs train=true (a training step's forward: irc.ops.grad_train "
                         "adds both)")


def _infer(op):
    def infer(a, ts):
        x = ts[0]
        need_rank(x, (3,), "a sequence [B, T, D]")
        need_float(x)
        _check_layout(op, a)
        _check_mask(a, x, ts[1] if len(ts) > 1 else None)
        b, _, _ = x.shape
        h = a["hidden"]
        if torch_layout(a):
            seq = x.with_shape((b, x.shape[1], directions(a) * h))
            state = x.with_shape((num_layers(a) * directions(a), b, h))
        else:
            seq = x.with_shape((b, x.shape[1], h))
            state = x.with_shape((b, h))
        return [seq, state, state] if op == "lstm" else [seq, state]
    return infer


def _params(op):
    def params(a, ts):
        d = ts[0].shape[-1]
        h = a["hidden"]
        g = GATES[op] * h
        if torch_layout(a):  # PyTorch's state_dict order: per layer and direction, w_ih, w_hh, b_ih, b_hh
            p = {}
            for layer, _, sfx in passes(a):
                p[f"weight_ih{sfx}"] = (g, layer_input(a, d, layer))
                p[f"weight_hh{sfx}"] = (g, h)
                if a["bias"]:
                    p[f"bias_ih{sfx}"] = (g,)
                    p[f"bias_hh{sfx}"] = (g,)
            return p
        p = {"weight_ih": (g, d), "weight_hh": (g, h)}
        if a["bias"]:
            if op == "gru" and a["variant"] == "torch":
                p["bias_ih"] = (g,)
                p["bias_hh"] = (g,)
            else:
                p["bias"] = (g,)
        return p
    return params


# PyTorch's layout, after each op's own attributes (so positional attributes keep their places);
# all default to None, so a layer without them prints and runs as before
LAYOUT_ATTRS = (
    Attr("layout", "enum", None, ("chapter", "torch"),
         doc="torch: PyTorch's layers, directions, two biases, names and state shapes"),
    Attr("layers", "posint", None, doc="stacked layers (layout=torch); default 1"),
    Attr("bidirectional", "bool", None, doc="a reverse-time pass per layer, concatenated (layout=torch)"),
    Attr("dropout", "float", None, doc="between stacked layers in training; the identity at inference"),
    Attr("train", "bool", None,
         doc="training mode (irc.ops.grad_train sets it): dropout between layers by the mask operand"),
)


register(OpDef(
    "rnn", ("x", "mask?"),
    (Attr("hidden", "dim"), Attr("bias", "bool", True), Attr("act", "enum", "tanh", ("tanh", "relu")), *LAYOUT_ATTRS),
    _infer("rnn"), _params("rnn"), **_facts("rnn"), results=("seq", "h"),
    doc="h_t = act(W·h_{t−1} + U·x_t + b); results: the sequence and the final state", vjp=vjp_recurrent,
))
register(OpDef(
    "lstm", ("x", "mask?"),
    (Attr("hidden", "dim"), Attr("bias", "bool", True),
     Attr("forget_bias", "float", 1.0, doc="initial forget-gate bias b_f (the chapter: 1.0-2.0)"), *LAYOUT_ATTRS),
    _infer("lstm"), _params("lstm"), **_facts("lstm"), results=("seq", "h", "c"),
    doc="LSTM with gates i, f, g, o; results: the sequence, final h and final c", vjp=vjp_recurrent,
))
register(OpDef(
    "gru", ("x", "mask?"),
    (Attr("hidden", "dim"), Attr("bias", "bool", True),
     Attr("variant", "enum", "chapter", ("chapter", "torch")), *LAYOUT_ATTRS),
    _infer("gru"), _params("gru"), **_facts("gru"), results=("seq", "h"),
    doc="GRU; variant=chapter applies r before the hidden matmul, variant=torch after it", vjp=vjp_recurrent,
))
