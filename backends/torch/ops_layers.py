"""Layers as torch calls: dense, convolution and pooling, norms, embeddings, attention, recurrent,
and the primitives and fused ops of irc's passes (so a lowered or fused graph emits too)."""

from __future__ import annotations

from irc.backends.torch.ops_basic import act
from irc.backends.torch.render import Renderer, literal
from irc.graph import Node
from irc.ops.attention import REL_TABLE, head_dim, kv_heads, rel_max_distance, rope_theta, score_scale
from irc.ops.common import per_axis
from irc.ops.recurrent import torch_layout


def _linear(r: Renderer, node: Node, x: str, w: str, b: str) -> str:
    return f"F.linear({x}, {r.w(node, w)}, {r.w_or_none(node, b)})"


def _ffn(r: Renderer, node: Node, xs: list[str]) -> str:
    h = act(node, node.attrs.get("act", "gelu"), _linear(r, node, xs[0], "w1", "b1"))
    return f"F.linear({h}, {r.w(node, 'w2')}, {r.w_or_none(node, 'b2')})"


def _swiglu(r: Renderer, node: Node, xs: list[str]) -> str:
    gate = f"F.silu({_linear(r, node, xs[0], 'w_gate', 'b_gate')})"
    h = f"{gate} * {_linear(r, node, xs[0], 'w_up', 'b_up')}"
    return f"F.linear({h}, {r.w(node, 'w_down')}, {r.w_or_none(node, 'b_down')})"



def _conv(nd: int):
    def render(r: Renderer, node: Node, xs: list[str]) -> str:
        a = node.attrs
        kernel, dilation = per_axis(a["kernel"], nd), per_axis(a.get("dilation", 1), nd)
        padding, x = a.get("padding", 0), xs[0]
        if padding == "valid":
            pads = [0] * nd
        elif padding == "same":
            totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
            if any(t % 2 for t in totals):  # PyTorch puts total//2 first, the rest after: pad by hand
                flat = [p for t in reversed(totals) for p in (t // 2, t - t // 2)]
                x, pads = f"F.pad({x}, {literal(flat)})", [0] * nd
            else:
                pads = [t // 2 for t in totals]
        else:
            pads = per_axis(padding, nd)
        stride = literal(per_axis(a.get("stride", 1), nd))
        args = (f"{x}, {r.w(node, 'weight')}, {r.w_or_none(node, 'bias')}, stride={stride}, "
                f"padding={literal(pads)}, dilation={literal(dilation)}, groups={int(a.get('groups', 1))}")
        return f"F.conv{nd}d({args})"
    return render


def _pool(nd: int, kind: str):
    def render(r: Renderer, node: Node, xs: list[str]) -> str:
        a = node.attrs
        kernel = per_axis(a["kernel"], nd)
        stride = per_axis(a["stride"] if a.get("stride") is not None else a["kernel"], nd)
        pads = per_axis(a.get("padding", 0), nd)
        common = f"{xs[0]}, {literal(kernel)}, {literal(stride)}, {literal(pads)}"
        if kind == "max":
            return f"F.max_pool{nd}d({common}, dilation={literal(per_axis(a.get('dilation', 1), nd))})"
        return f"F.avg_pool{nd}d({common}, count_include_pad={bool(a.get('count_include_pad', True))})"
    return render


def _global_avgpool(r: Renderer, node: Node, xs: list[str]) -> str:
    rank = r.type_of(node.inputs[0]).rank
    return f"{xs[0]}.mean(dim={literal(list(range(2, rank)))})"


def layernorm(r: Renderer, node: Node, x: str) -> str:
    eps = literal(float(node.attrs.get("eps", 1e-5)))
    axis, rank = node.attrs.get("axis"), r.type_of(node.inputs[0]).rank
    if axis is not None and axis % rank != rank - 1:
        r.need("layernorm_along")
        return f"layernorm_along({x}, {axis % rank}, {r.w_or_none(node, 'gain')}, {r.w_or_none(node, 'bias')}, {eps})"
    return f"F.layer_norm({x}, {x}.shape[-1:], {r.w_or_none(node, 'gain')}, {r.w_or_none(node, 'bias')}, {eps})"


def rmsnorm(r: Renderer, node: Node, x: str) -> str:
    r.need("rmsnorm")
    return f"rmsnorm({x}, {r.w_or_none(node, 'gain')}, {literal(float(node.attrs.get('eps', 1e-6)))})"


def _batchnorm(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    axis = int(a.get("axis", 1)) % r.type_of(node.inputs[0]).rank
    w = ", ".join(r.w(node, k) for k in ("running_mean", "running_var", "gain", "bias"))
    tail = f"self.training, {literal(float(a.get('momentum', 0.1)))}, {literal(float(a.get('eps', 1e-5)))}"
    if axis == 1:
        return f"F.batch_norm({xs[0]}, {w}, {tail})"
    r.need("batchnorm_along")
    return f"batchnorm_along({xs[0]}, {axis}, {w}, {tail})"


def _add_norm(r: Renderer, node: Node, xs: list[str]) -> str:
    # s is the first result; the norm reads it by name once the tuple is unpacked, so write both in one line
    s = f"({xs[0]} + {xs[1]})"
    norm = layernorm(r, node, s) if node.attrs["kind"] == "layernorm" else rmsnorm(r, node, s)
    return f"{s}, {norm}"


def _positional(r: Renderer, node: Node, xs: list[str]) -> str:
    t = r.dim(node.inputs[0], xs[0], 1)
    if node.attrs.get("kind") == "learned":
        return f"{xs[0]} + {r.w(node, 'weight')}[:{t}]"
    if node.attrs.get("layout") == "concat":
        r.need("sinusoidal_concat")
        return f"{xs[0]} + sinusoidal_concat({t}, {r.dim(node.inputs[0], xs[0], 2)}, {xs[0]})"
    r.need("sinusoidal")
    return f"{xs[0]} + sinusoidal({t}, {r.dim(node.inputs[0], xs[0], 2)}, {xs[0]})"


def _attention(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    r.need("attention")
    x, kv = xs[0], xs[1] if len(xs) > 1 else xs[0]
    hd = head_dim(a, r.type_of(node.inputs[0]).shape[-1])  # an int: the weights' shapes were checked first
    bias = xs[2] if len(xs) > 2 else None
    if a.get("rel_buckets") is not None:
        r.need("t5_bias")
        kv_value = node.inputs[1] if len(node.inputs) > 1 else node.inputs[0]
        table = (f"t5_bias({r.w(node, REL_TABLE)}, {r.dim(node.inputs[0], x, 1)}, {r.dim(kv_value, kv, 1)}, "
                 f"{int(a['rel_buckets'])}, {rel_max_distance(a)}, {not a.get('causal')})")
        bias = table if bias is None else f"{bias} + {table}"
    args = [x, kv] + [r.w(node, k) for k in ("wq", "wk", "wv", "wo")]
    kw = [f"heads={int(a['heads'])}", f"kv_heads={int(kv_heads(a))}", f"scale={literal(float(score_scale(a, hd)))}"]
    if a.get("causal"):
        kw.append("causal=True")
    if a.get("window") is not None:
        kw.append(f"window={int(a['window'])}")
    if bias is not None:
        kw.append(f"bias={bias}")
    if a.get("rope"):
        kw.append(f"rope_theta={literal(float(rope_theta(a)))}")
    kw += [f"{b}={r.w(node, b)}" for b in ("bq", "bk", "bv", "bo") if r.has(node, b)]
    return f"attention({', '.join(args + kw)})"


def _rel_position_bias(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    r.need("t5_bias")
    k_value, k = (node.inputs[1], xs[1]) if len(xs) > 1 else (node.inputs[0], xs[0])
    return (f"t5_bias({r.w(node, 'weight')}, {r.dim(node.inputs[0], xs[0], 1)}, {r.dim(k_value, k, 1)}, "
            f"{int(a['buckets'])}, {int(a['max_distance'])}, {bool(a['bidirectional'])})")


def _sdpa(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    r.need("sdpa")
    window = a.get("window")
    bias = xs[3] if len(xs) > 3 else "None"
    return (f"sdpa({xs[0]}, {xs[1]}, {xs[2]}, {literal(float(a['scale']))}, {bool(a['causal'])}, "
            f"{literal(window)}, {bias})")


def _causal_mask(r: Renderer, node: Node, xs: list[str]) -> str:
    r.need("hidden_keys")
    x = xs[0]
    return (f"{x}.masked_fill(hidden_keys({x}.shape[-2], {x}.shape[-1], {literal(node.attrs.get('window'))}, "
            f"{x}.device), float('-inf'))")


def _recurrent(r: Renderer, node: Node, xs: list[str]) -> str:
    if torch_layout(node.attrs):
        from irc.backends.torch.ops_more import stacked

        return stacked(r, node, xs)
    w = f"{r.w(node, 'weight_ih')}, {r.w(node, 'weight_hh')}"
    if node.op == "rnn":
        r.need("rnn")
        fn = "torch.tanh" if node.attrs.get("act", "tanh") == "tanh" else "F.relu"
        return f"rnn({xs[0]}, {w}, {r.w_or_none(node, 'bias')}, {fn})"
    if node.op == "lstm":
        r.need("lstm")
        return f"lstm({xs[0]}, {w}, {r.w_or_none(node, 'bias')})"
    if node.attrs.get("variant") == "torch":
        r.need("gru_torch")
        return f"gru_torch({xs[0]}, {w}, {r.w_or_none(node, 'bias_ih')}, {r.w_or_none(node, 'bias_hh')})"
    r.need("gru_chapter")
    return f"gru_chapter({xs[0]}, {w}, {r.w_or_none(node, 'bias')})"


def _adaptive(r: Renderer, node: Node, xs: list[str]) -> str:
    return f"F.adaptive_avg_pool2d({xs[0]}, {literal(per_axis(node.attrs['size'], 2))})"


def _rope(r: Renderer, node: Node, xs: list[str]) -> str:
    r.need("rope")
    return f"rope({xs[0]}, {literal(float(rope_theta(node.attrs, 'theta')))})"


def _gemm(r: Renderer, node: Node, xs: list[str]) -> str:
    return act(node, node.attrs["act"], f"F.linear({xs[0]}, {xs[1]}, {xs[2] if len(xs) > 2 else 'None'})")


def _gemm_glu(r: Renderer, node: Node, xs: list[str]) -> str:
    return f"{act(node, node.attrs['act'], f'F.linear({xs[0]}, {xs[1]})')} * F.linear({xs[0]}, {xs[2]})"


OPS = {
    "linear": lambda r, node, xs: _linear(r, node, xs[0], "weight", "bias"),
    "ffn": _ffn,
    "swiglu": _swiglu,
    "conv1d": _conv(1),
    "conv2d": _conv(2),
    "maxpool1d": _pool(1, "max"),
    "maxpool2d": _pool(2, "max"),
    "avgpool1d": _pool(1, "avg"),
    "avgpool2d": _pool(2, "avg"),
    "global_avgpool": _global_avgpool,
    "adaptive_avgpool2d": _adaptive,
    "layernorm": lambda r, node, xs: layernorm(r, node, xs[0]),
    "rmsnorm": lambda r, node, xs: rmsnorm(r, node, xs[0]),
    "batchnorm": _batchnorm,
    "add_norm": _add_norm,
    "embedding": lambda r, node, xs: f"F.embedding({xs[0]}, {r.w(node, 'weight')})",
    "unembed": lambda r, node, xs: _linear(r, node, xs[0], "weight", "bias"),
    "positional": _positional,
    "attention": _attention,
    "rel_position_bias": _rel_position_bias,
    "sdpa": _sdpa,
    "rope": _rope,
    "causal_mask": _causal_mask,
    "rnn": _recurrent,
    "lstm": _recurrent,
    "gru": _recurrent,
    "param": lambda r, node, xs: r.w(node, node.attrs["name"]),
    "gemm": _gemm,
    "gemm_glu": _gemm_glu,
    "gemm_multi": lambda r, node, xs: "(" + ", ".join(f"F.linear({xs[0]}, {w})" for w in xs[1:]) + ",)",
}
