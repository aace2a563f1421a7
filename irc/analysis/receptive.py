"""Receptive field r and jump j of every spatial value, per spatial axis.

The chapter's recurrence, r updated with the incoming j before j advances:
    r_l = r_{l-1} + (k_eff - 1)·j_{l-1},   j_l = j_{l-1}·s_l,   k_eff = d·(k - 1) + 1.
Tracking starts at the first convolution or pool (an untracked input has r = j = 1) and
flows through pointwise ops; where branches meet (a residual add, a channel concat) r is
the largest over the branches and the jumps must agree. Padding never enters.
"""

from __future__ import annotations

from irc.diagnostics import IrcError
from irc.graph import Graph, Node
from irc.ops.common import pair
from irc.types import TensorType

RJ = tuple[tuple[int, ...], tuple[int, ...]]  # (r per axis, j per axis)

WINDOW_OPS = {"conv1d": 1, "conv2d": 2, "maxpool1d": 1, "maxpool2d": 2, "avgpool1d": 1, "avgpool2d": 2}
POINTWISE_OPS = frozenset({
    "relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid", "abs", "identity", "dropout", "batchnorm",
    "add", "sub", "mul", "div", "concat",
})


def _per_axis(value, nd: int) -> tuple[int, ...]:
    return pair(value) if nd == 2 else (value,)


def _window(node: Node, nd: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(effective kernel, stride) per axis."""
    a = node.attrs
    ks = _per_axis(a["kernel"], nd)
    stride = a["stride"] if a["stride"] is not None else a["kernel"]
    ds = _per_axis(a.get("dilation", 1), nd)
    return tuple(d * (k - 1) + 1 for k, d in zip(ks, ds)), _per_axis(stride, nd)


def _step(rj: RJ, kernels: tuple[int, ...], strides: tuple[int, ...]) -> RJ:
    r, j = rj
    new_r = tuple(ri + (k - 1) * ji for ri, k, ji in zip(r, kernels, j))  # the incoming j, first
    return new_r, tuple(ji * s for ji, s in zip(j, strides))


def _incoming(known: RJ | None, nd: int) -> RJ:
    """(r, j) entering a window op: an untracked input is the image itself, r = j = 1."""
    return known if known is not None else ((1,) * nd, (1,) * nd)


def _merge(node: Node, ins: list[tuple[TensorType, RJ]], out: TensorType, names: list[str]) -> RJ | None:
    if not ins:
        return None
    spatial_out = out.shape[2:]
    r = tuple(max(rj[0][i] for _, rj in ins) for i in range(len(ins[0][1][0])))
    full = [(t, rj, n) for (t, rj), n in zip(ins, names) if t.shape[2:] == spatial_out]  # 1×1 maps carry no jump
    jumps = {rj[1] for _, rj, _ in full}
    if len(jumps) > 1:
        listed = "; ".join(f"'{n}' {t} has jump {_fmt(rj[1])}" for t, rj, n in full)
        raise IrcError(f"receptive field: the branches that meet at '{node.op}' have different jumps (input pixels "
                       "between neighbouring outputs), so no single receptive field describes the result",
                       node.loc, notes=[listed])
    j = next(iter(jumps)) if jumps else ins[0][1][1]
    return r, j


def _fmt(v: tuple[int, ...]) -> str:
    return str(v[0]) if len(set(v)) == 1 else "×".join(str(x) for x in v)


def _adaptive(node: Node, t: TensorType, rj: RJ | None) -> RJ | None:
    sizes = t.shape[2:]
    outs = pair(node.attrs["size"])
    if any(not isinstance(s, int) or s % o for s, o in zip(sizes, outs)):
        return None  # uneven bins: no single kernel and stride describe it
    k = tuple(s // o for s, o in zip(sizes, outs))
    return _step(_incoming(rj, 2), k, k)


def receptive_fields(graph: Graph) -> dict[str, RJ]:
    """(r, j) per spatial axis for every value downstream of a convolution or pool."""
    types = graph.value_types()
    out: dict[str, RJ] = {}
    for node in graph.nodes:
        op = node.op
        rj: RJ | None = None
        if op in WINDOW_OPS:
            nd = WINDOW_OPS[op]
            kernels, strides = _window(node, nd)
            rj = _step(_incoming(out.get(node.inputs[0]), nd), kernels, strides)
        elif op == "adaptive_avgpool2d":
            rj = _adaptive(node, types[node.inputs[0]], out.get(node.inputs[0]))
        elif op in POINTWISE_OPS:
            if op == "batchnorm" and node.attrs["axis"] not in (1, -types[node.inputs[0]].rank + 1):
                continue
            if op == "concat" and node.attrs["axis"] not in (1, -node.type.rank + 1):
                continue
            tracked = [(types[v], out[v]) for v in node.inputs if v in out]
            rj = _merge(node, tracked, node.type, [v for v in node.inputs if v in out])
        if rj is not None:
            out[node.outputs[0]] = rj
    return out


def scalar_or_list(v: tuple[int, ...]) -> int | list[int]:
    """One number when every axis agrees (the usual square kernels), else one per axis."""
    return v[0] if len(set(v)) == 1 else list(v)
