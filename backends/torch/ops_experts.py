"""moe and mla as calls of their helpers (backends/torch/helpers_experts.py)."""

from __future__ import annotations

import irc.backends.torch.helpers_experts  # noqa: F401  (registers the helpers)
from irc.backends.torch.render import Renderer, literal
from irc.graph import Node
from irc.ops.mla import mla_scale, mla_theta


def _moe(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    r.need("moe")
    names = ("w_gate", "w_up", "w_down") if a["gated"] else ("w1", "w2")
    shared = ("shared_gate", "shared_up", "shared_down") if a["gated"] else ("shared_w1", "shared_w2")
    experts = f"({', '.join(r.w(node, n) for n in names)})"
    kw = [f"top_k={int(a['top_k'])}", f"norm_topk={bool(a['norm_topk'])}", f"scale={literal(float(a['scale']))}",
          f"act={literal(a['act'])}"]
    if r.has(node, shared[-1]):
        kw.append(f"shared=({', '.join(r.w(node, n) for n in shared)})")
    return f"moe({xs[0]}, {r.w(node, 'router')}, {experts}, {', '.join(kw)})"


def _mla(r: Renderer, node: Node, xs: list[str]) -> str:
    a = node.attrs
    r.need("mla")
    args = [xs[0]] + [r.w(node, k) for k in ("wkv_a", "kv_norm.gain", "wkv_b", "wo")]
    kw = [f"{k}={int(a[k])}" for k in ("heads", "kv_lora", "rope_dim", "nope_dim", "v_dim")]
    kw += [f"scale={literal(float(mla_scale(a)))}", f"theta={literal(float(mla_theta(a)))}",
           f"eps={literal(float(a['eps']))}", f"causal={bool(a['causal'])}"]
    if a.get("window") is not None:
        kw.append(f"window={int(a['window'])}")
    if a["q_lora"] is None:
        kw.append(f"wq={r.w(node, 'wq')}")
    else:
        kw += [f"wq_a={r.w(node, 'wq_a')}", f"q_gain={r.w(node, 'q_norm.gain')}", f"wq_b={r.w(node, 'wq_b')}"]
    return f"mla({', '.join(args + kw)})"


OPS = {"moe": _moe, "mla": _mla}
