"""Activations, arithmetic and data movement as torch expressions."""

from __future__ import annotations

from irc.backends.torch.render import Renderer, literal
from irc.graph import Node

_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
# the activations ffn(act=...) and gemm(act=...) accept
ACTS = {"relu": "F.relu({})", "gelu": "F.gelu({})", "gelu_tanh": 'F.gelu({}, approximate="tanh")',
        "silu": "F.silu({})", "tanh": "torch.tanh({})", "none": "{}"}


def act(node: Node, name: str, x: str) -> str:
    """An activation ffn(act=...) and gemm(act=...) accept (a test checks ACTS covers their choices)."""
    return ACTS[name].format(x)


def _fmt(template: str):
    return lambda r, node, xs: template.format(*xs)


def _binary(op: str):
    def render(r: Renderer, node: Node, xs: list[str]) -> str:
        sign = _BINARY[op]
        if len(xs) == 2:
            return f"{xs[0]} {sign} {xs[1]}"
        s = literal(float(node.attrs["scalar"]))
        return f"{s} {sign} {xs[0]}" if node.attrs.get("reverse") else f"{xs[0]} {sign} {s}"
    return render


def _index(r: Renderer, node: Node, x: str, axis: int, item: str) -> str:
    rank = r.type_of(node.inputs[0]).rank
    axis %= rank
    return f"{x}[{', '.join([':'] * axis + [item])}]"


def _slice(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    end = a.get("end")
    start = int(a.get("start", 0))
    item = f"{start if start else ''}:{'' if end is None else int(end)}"
    return _index(r, node, xs[0], int(a["axis"]), item)


def _split(r: Renderer, node: Node, xs: list[str]) -> str:
    axis, parts = int(node.attrs.get("axis", -1)), node.attrs["parts"]
    if isinstance(parts, list):
        return f"torch.split({xs[0]}, {literal([int(p) for p in parts])}, dim={axis})"
    return f"torch.chunk({xs[0]}, {int(parts)}, dim={axis})"


def _reshape(r: Renderer, node: Node, xs: list[str]) -> str:
    out = node.types[0].shape
    if all(isinstance(d, int) for d in out):
        return f"{xs[0]}.reshape({', '.join(str(d) for d in out)})"
    return f"{xs[0]}.reshape({', '.join(r.size_expr(node, d) for d in node.attrs['shape'])})"


OPS = {
    "relu": _fmt("F.relu({})"),
    "tanh": _fmt("torch.tanh({})"),
    "sigmoid": _fmt("torch.sigmoid({})"),
    "abs": _fmt("torch.abs({})"),
    "identity": _fmt("{}"),
    "silu": _fmt("F.silu({})"),
    "gelu": lambda r, node, xs: act(node, "gelu_tanh" if node.attrs.get("approx") == "tanh" else "gelu", xs[0]),
    "leaky_relu": lambda r, node, xs: f"F.leaky_relu({xs[0]}, {literal(float(node.attrs.get('slope', 0.01)))})",
    # a row irc's reference cannot normalize (all -inf, or holding a NaN) is zeros there, NaN in torch
    "softmax": lambda r, node, xs: f"torch.softmax({xs[0]}, dim={int(node.attrs.get('axis', -1))}).nan_to_num(0.0)",
    "dropout": lambda r, node, xs: f"F.dropout({xs[0]}, {literal(float(node.attrs.get('p', 0.1)))}, self.training)",
    **{op: _binary(op) for op in _BINARY},
    "flatten": lambda r, node, xs: f"torch.flatten({xs[0]}, {node.attrs.get('start', 1)}, {node.attrs.get('end', -1)})",
    "reshape": _reshape,
    "transpose": lambda r, node, xs: f"{xs[0]}.permute({', '.join(str(int(p)) for p in node.attrs['perm'])})",
    "concat": lambda r, node, xs: f"torch.cat([{', '.join(xs)}], dim={int(node.attrs.get('axis', -1))})",
    "split": _split,
    "select": lambda r, node, xs: f"{xs[0]}.select({int(node.attrs['axis'])}, {int(node.attrs['index'])})",
    "slice": _slice,
    "matmul": _fmt("{} @ {}"),
}
