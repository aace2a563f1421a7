"""The emitted modules' helpers for a mixture of experts and multi-head latent attention (see helpers.py).

``moe`` runs every expert on every token and weighs them with a [N, E] gate matrix that is zero but for
each token's top k: exact, traceable by ``torch.export`` (no data-dependent shapes), and E/k times the routed
FLOPs; a serving engine swaps in its own grouped-expert kernel. ``mla`` follows DeepSeek-V2's equations.
"""

from __future__ import annotations

from irc.backends.torch.helpers import _helper

_helper("moe", '''
def moe(x: torch.Tensor, router: torch.Tensor, experts: tuple[torch.Tensor, ...], top_k: int, norm_topk: bool,
        scale: float, act: str, shared: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Softmax over every expert, the top_k per token (renormalised over them when norm_topk, times scale),
    their weighted sum, plus the shared experts. experts: (gate, up, down) stacked [E, h, d], [E, h, d],
    [E, d, h], or (w1, w2); shared: the same matrices unstacked."""
    f = {"silu": F.silu, "relu": F.relu, "gelu": F.gelu,
         "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[act]
    xs = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(F.linear(xs, router), dim=-1)
    top, chosen = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        top = top / top.sum(dim=-1, keepdim=True)
    gates = torch.zeros_like(probs).scatter(1, chosen, top * scale)  # [N, E]
    hidden = f(torch.einsum("nd,ehd->enh", xs, experts[0]))
    if len(experts) == 3:
        hidden = hidden * torch.einsum("nd,ehd->enh", xs, experts[1])
    out = torch.einsum("enh,edh,ne->nd", hidden, experts[-1], gates)
    if shared is not None:
        h = f(F.linear(xs, shared[0]))
        if len(shared) == 3:
            h = h * F.linear(xs, shared[1])
        out = out + F.linear(h, shared[-1])
    return out.reshape(x.shape)
''')

_helper("rope_pairs", '''
def rope_pairs(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate [..., T, r] by position, adjacent pairs (x[2i], x[2i+1]) at angle p·theta^(-2i/r): DeepSeek's RoPE."""
    t, r = x.shape[-2], x.shape[-1]
    freq = theta ** (-torch.arange(0, r, 2, dtype=torch.float64, device=x.device) / r)
    angle = torch.arange(t, dtype=torch.float64, device=x.device)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
''')

_helper("mla", '''
def mla(x: torch.Tensor, wkv_a: torch.Tensor, kv_gain: torch.Tensor, wkv_b: torch.Tensor, wo: torch.Tensor,
        heads: int, kv_lora: int, rope_dim: int, nope_dim: int, v_dim: int, scale: float, theta: float, eps: float,
        causal: bool, window: int | None = None, wq: torch.Tensor | None = None, wq_a: torch.Tensor | None = None,
        q_gain: torch.Tensor | None = None, wq_b: torch.Tensor | None = None) -> torch.Tensor:
    """DeepSeek-V2's multi-head latent attention: keys and values from the latent rmsnorm(x·W_kv_a[:kv_lora]),
    one shared RoPE key from x·W_kv_a[kv_lora:], queries from x (or their own latent)."""
    b, t, _ = x.shape
    q = F.linear(x, wq) if wq is not None else F.linear(rmsnorm(F.linear(x, wq_a), q_gain, eps), wq_b)
    q = q.view(b, t, heads, nope_dim + rope_dim).transpose(1, 2)
    latent = F.linear(x, wkv_a)
    ckv = rmsnorm(latent[..., :kv_lora], kv_gain, eps)
    k_rope = rope_pairs(latent[..., kv_lora:][:, None], theta).expand(b, heads, t, rope_dim)
    kv = F.linear(ckv, wkv_b).view(b, t, heads, nope_dim + v_dim).transpose(1, 2)
    q = torch.cat([q[..., :nope_dim], rope_pairs(q[..., nope_dim:], theta)], dim=-1)
    k = torch.cat([kv[..., :nope_dim], k_rope], dim=-1)
    out = sdpa(q, k, kv[..., nope_dim:], scale, causal, window)
    return F.linear(out.transpose(1, 2).reshape(b, t, heads * v_dim), wo)
''', ("rmsnorm", "rope_pairs", "sdpa"))
