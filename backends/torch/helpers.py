"""Source of the functions an emitted module may need, each written once; a module gets only those it calls.

They are plain PyTorch (``torch`` and ``torch.nn.functional`` as ``F``), shaped for
``torch.compile`` and ``torch.export``: no data-dependent control flow, loops only over
sequence lengths known when tracing. ``NEEDS`` lists the helpers each one calls.
"""

from __future__ import annotations

HELPERS: dict[str, str] = {}
NEEDS: dict[str, tuple[str, ...]] = {}


def _helper(name: str, source: str, needs: tuple[str, ...] = ()) -> None:
    HELPERS[name] = source.strip("\n") + "\n"
    NEEDS[name] = needs


_helper("hidden_keys", '''
def hidden_keys(t: int, s: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[T, S] True where the causal mask hides key j from query i: j > i, or j <= i - window."""
    i = torch.arange(t, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    hidden = j > i
    if window is not None:
        hidden = hidden | (j <= i - window)
    return hidden
''')

_helper("sdpa", '''
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = False,
         window: int | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ·scale + bias [+ causal mask])·v on [B, H, T, hd] / [B, G, S, hd]: query head h reads
    key/value head h // (H/G). The mask is top-left aligned (key j > query i hidden) and a sliding
    window also hides j <= i - window; a query whose every key is hidden gets zeros."""
    heads, groups = q.shape[1], k.shape[1]
    if groups != heads:
        k = k.repeat_interleave(heads // groups, dim=1)
        v = v.repeat_interleave(heads // groups, dim=1)
    t, s = q.shape[2], k.shape[2]
    if causal and bias is None and window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    mask = bias
    hidden = None
    if causal:
        hidden = hidden_keys(t, s, window, q.device)
        blocked = torch.zeros(t, s, dtype=q.dtype, device=q.device).masked_fill(hidden, float("-inf"))
        mask = blocked if mask is None else mask + blocked
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if hidden is not None and window is not None:  # only a sliding window can hide a whole row
        out = out.masked_fill(hidden.all(dim=-1)[:, None], 0.0)
    return out
''', ("hidden_keys",))

_helper("rope", '''
def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate [B, H, T, hd] by position: pairs (x[..., i], x[..., i + hd/2]) at angle p·theta^(-2i/hd)."""
    t, hd = x.shape[-2], x.shape[-1]
    freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd)
    angle = torch.arange(t, dtype=torch.float64, device=x.device)[:, None] * freq[None, :]
    cos = torch.cat([angle.cos()] * 2, dim=-1).to(x.dtype)
    sin = torch.cat([angle.sin()] * 2, dim=-1).to(x.dtype)
    half = hd // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
''')

_helper("t5_bias", '''
def t5_bias(table: torch.Tensor, t: int, s: int, buckets: int, max_distance: int, bidirectional: bool) -> torch.Tensor:
    """[1, H, T, S]: T5's table row for the bucket of the relative position j - i (T5's own bucketing)."""
    rel = torch.arange(s, device=table.device)[None, :] - torch.arange(t, device=table.device)[:, None]
    out = torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out = out + (rel > 0).long() * buckets
        n = rel.abs()
    else:
        n = -torch.clamp(rel, max=0)
    exact = buckets // 2
    safe = torch.clamp(n, min=1).to(torch.float64)
    large = exact + (torch.log(safe / exact) / math.log(max_distance / exact) * (buckets - exact)).long()
    large = torch.clamp(large, max=buckets - 1)
    bucket = out + torch.where(n < exact, n, large)
    return table[bucket].permute(2, 0, 1)[None]
''')

_helper("attention", '''
def attention(x: torch.Tensor, kv: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
              wo: torch.Tensor, heads: int, kv_heads: int, scale: float, causal: bool = False,
              window: int | None = None, bias: torch.Tensor | None = None, rope_theta: float | None = None,
              bq: torch.Tensor | None = None, bk: torch.Tensor | None = None, bv: torch.Tensor | None = None,
              bo: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention over [B, T, D] queries and [B, S, D] keys/values (GQA when kv_heads < heads)."""
    b, t, s = x.shape[0], x.shape[1], kv.shape[1]
    q = F.linear(x, wq, bq).reshape(b, t, heads, -1).transpose(1, 2)
    k = F.linear(kv, wk, bk).reshape(kv.shape[0], s, kv_heads, -1).transpose(1, 2)
    v = F.linear(kv, wv, bv).reshape(kv.shape[0], s, kv_heads, -1).transpose(1, 2)
    if rope_theta is not None:
        q, k = rope(q, rope_theta), rope(k, rope_theta)
    if k.shape[0] != b:  # keys and values of batch 1 are shared by every query sequence
        k, v = k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)
    out = sdpa(q, k, v, scale, causal, window, bias)
    return F.linear(out.transpose(1, 2).reshape(b, t, -1), wo, bo)
''', ("rope", "sdpa"))

_helper("sinusoidal", '''
def sinusoidal(length: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """P[p, 2i] = sin(p / 10000^(2i/D)), P[p, 2i+1] = cos(p / 10000^(2i/D)), in float64, then cast."""
    pos = torch.arange(length, dtype=torch.float64, device=like.device)[:, None]
    i2 = torch.arange(0, width, 2, dtype=torch.float64, device=like.device)[None, :]
    angle = pos / 10000.0 ** (i2 / width)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(length, width).to(like.dtype)
''')

_helper("rmsnorm", '''
def rmsnorm(x: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return y if gain is None else y * gain
''')

_helper("rnn", '''
def rnn(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, bias: torch.Tensor | None,
        act=torch.tanh) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = act(x_t·W_ihᵀ + h_{t-1}·W_hhᵀ + b) from h_0 = 0; returns (sequence [B, T, H], final h)."""
    px = F.linear(x, w_ih, bias)
    h = x.new_zeros(x.shape[0], w_hh.shape[1])
    seq = []
    for t in range(x.shape[1]):
        h = act(px[:, t] + h @ w_hh.T)
        seq.append(h)
    return torch.stack(seq, dim=1), h
''')

_helper("lstm", '''
def lstm(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
         bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gates i, f, g, o (PyTorch's order); one bias (PyTorch's bias_ih + bias_hh); zero initial state."""
    px = F.linear(x, w_ih, bias)
    h = x.new_zeros(x.shape[0], w_hh.shape[1])
    c = torch.zeros_like(h)
    seq = []
    for t in range(x.shape[1]):
        i, f, g, o = (px[:, t] + h @ w_hh.T).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        seq.append(h)
    return torch.stack(seq, dim=1), h, c
''')

_helper("gru_chapter", '''
def gru_chapter(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
                bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chapter's GRU: r acts on h before the hidden matmul; h = (1 - z)·h + z·n."""
    px = F.linear(x, w_ih, bias)
    u_r, u_z, u_n = w_hh.chunk(3, dim=0)
    h = x.new_zeros(x.shape[0], w_hh.shape[1])
    seq = []
    for t in range(x.shape[1]):
        x_r, x_z, x_n = px[:, t].chunk(3, dim=-1)
        r = torch.sigmoid(x_r + h @ u_r.T)
        z = torch.sigmoid(x_z + h @ u_z.T)
        n = torch.tanh(x_n + (r * h) @ u_n.T)
        h = (1 - z) * h + z * n
        seq.append(h)
    return torch.stack(seq, dim=1), h
''')

_helper("gru_torch", '''
def gru_torch(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor | None,
              b_hh: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's GRU: n = tanh(x·W_nᵀ + b_in + r·(h·U_nᵀ + b_hn)); h = (1 - z)·n + z·h."""
    px = F.linear(x, w_ih, b_ih)
    h = x.new_zeros(x.shape[0], w_hh.shape[1])
    seq = []
    for t in range(x.shape[1]):
        x_r, x_z, x_n = px[:, t].chunk(3, dim=-1)
        h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, dim=-1)
        r = torch.sigmoid(x_r + h_r)
        z = torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        h = (1 - z) * n + z * h
        seq.append(h)
    return torch.stack(seq, dim=1), h
''')

_helper("batchnorm_along", '''
def batchnorm_along(x: torch.Tensor, axis: int, mean: torch.Tensor, var: torch.Tensor, gain: torch.Tensor,
                    bias: torch.Tensor, training: bool, momentum: float, eps: float) -> torch.Tensor:
    """BatchNorm over channel axis ``axis``: moved to axis 1 for F.batch_norm and back."""
    y = F.batch_norm(x.movedim(axis, 1), mean, var, gain, bias, training, momentum, eps)
    return y.movedim(1, axis)
''')


_helper("sinusoidal_concat", '''
def sinusoidal_concat(length: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """Whisper's [sin | cos]: P[p, i] = sin(p·e^(-i·log(10000)/(D/2 - 1))), P[p, D/2 + i] = cos(the same)."""
    half = width // 2
    inv = torch.exp(-math.log(10000.0) / (half - 1) * torch.arange(half, dtype=torch.float64, device=like.device))
    angle = torch.arange(length, dtype=torch.float64, device=like.device)[:, None] * inv[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=1).to(like.dtype)
''')

_helper("layernorm_along", '''
def layernorm_along(x: torch.Tensor, axis: int, gain: torch.Tensor | None, bias: torch.Tensor | None,
                    eps: float) -> torch.Tensor:
    """LayerNorm over one axis that is not the last (ConvNeXt's channels-first), gain and bias along it."""
    y = x.movedim(axis, -1)
    return F.layer_norm(y, y.shape[-1:], gain, bias, eps).movedim(-1, axis)
''')

_helper("stacked_recurrent", '''
def stacked_recurrent(x: torch.Tensor, passes: list[tuple], kind: str, layers: int, directions: int,
                      act=torch.tanh, dropout: float = 0.0, training: bool = False) -> tuple[torch.Tensor, ...]:
    """PyTorch's nn.RNN/LSTM/GRU (batch_first): ``passes`` holds (w_ih, w_hh, b_ih, b_hh) per layer and
    direction in PyTorch's order; the reverse direction reads the sequence backwards and its outputs
    are turned back; directions are concatenated on features; dropout acts between layers while
    training (nn.LSTM's rule) and is the identity at inference. Returns the last layer's sequence and
    the final states [layers·dirs, B, H]."""
    seq, finals = x, []
    for layer in range(layers):
        if layer and dropout:
            seq = F.dropout(seq, dropout, training)
        outs = []
        for d in range(directions):
            w_ih, w_hh, b_ih, b_hh = passes[layer * directions + d]
            inp = seq.flip(1) if d else seq
            if kind == "gru":
                res = gru_torch(inp, w_ih, w_hh, b_ih, b_hh)
            else:
                bias = None if b_ih is None else b_ih + b_hh
                res = lstm(inp, w_ih, w_hh, bias) if kind == "lstm" else rnn(inp, w_ih, w_hh, bias, act)
            outs.append(res[0].flip(1) if d else res[0])
            finals.append(res[1:])
        seq = torch.cat(outs, dim=-1)
    return (seq, *[torch.stack([f[i] for f in finals]) for i in range(len(finals[0]))])
''', ("gru_torch", "lstm", "rnn"))


def closure(names: set[str]) -> list[str]:
    """The helpers ``names`` use, with those they call, dependencies first, in a fixed order."""
    out: list[str] = []

    def visit(name: str) -> None:
        if name in out:
            return
        for dep in NEEDS[name]:
            visit(dep)
        out.append(name)

    for name in sorted(names):
        visit(name)
    return out
