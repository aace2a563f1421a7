"""Generated *valid* models: random programs that use every op correctly, so they must compile.

The generator keeps its own model of each tensor's shape, written from PyTorch's shape
formulas (docs/semantics.md), not from irc's shape inference: a dim is an int, the name of
a model symbol ('B', 'T', 'H'), or None for a symbolic expression it does not track. When
every dim of an output is known, the case also records the type irc must print for it.

Besides the ops it covers the language: constants with exact arithmetic and the built-ins,
blocks with defaults (also from the shipped ``transformer.arch``), ``repeat``, layer
instances with shared and tied weights, multi-result ops, keyword and positional
attributes, aliases, ';' separators, trailing commas and comments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from fuzz.case import Case

Dim = int | str | None


@dataclass(frozen=True)
class T:
    name: str
    shape: tuple[Dim, ...]
    dtype: str = "f32"
    layout: str = "seq"  # seq ([B, T, D] or [B, D]), chan ([B, C, L] / [B, C, H, W]) or ids

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def last(self) -> Dim:
        return self.shape[-1]


@dataclass
class Program:
    draw: object
    symbols: list[str]
    lines: list[str] = field(default_factory=list)
    top: list[str] = field(default_factory=list)  # blocks and consts outside the model
    live: list[T] = field(default_factory=list)
    consts: dict[str, int] = field(default_factory=dict)
    uses_lib: bool = False
    n: int = 0

    def fresh(self, base: str = "v") -> str:
        self.n += 1
        return f"{base}{self.n}"

    def size(self, value: int) -> str:
        """``value`` as a literal or as exact constant arithmetic that evaluates to it."""
        draw = self.draw
        how = draw(st.integers(0, 9))
        if how < 5:
            return str(value)
        if how == 5 and value % 2 == 0:
            return f"2*{value // 2}"
        if how == 6:
            return f"round_up({max(value - 1, 1)}, {value})" if value > 1 else "1"
        if how == 7:
            return f"max({value}, 1)"
        if how == 8:
            return f"{value * 3}/3"  # exact rational: 3v/3 is the integer v
        name = self.fresh("c")
        self.lines.append(f"const {name} = {value}")
        self.consts[name] = value
        return name

    def emit(self, expr: str, shape: tuple[Dim, ...], dtype: str = "f32", layout: str = "seq",
             name: str | None = None) -> T:
        name = name or self.fresh()
        self.lines.append(f"{name} = {expr}")
        t = T(name, shape, dtype, layout)
        self.live.append(t)
        return t


def _choice(draw, options):
    return draw(st.sampled_from(options))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# -- op templates: each returns the new tensor, or None when it does not apply ---------------


def act(p: Program, x: T) -> T | None:
    if x.dtype not in ("f32", "f16", "bf16", "f64"):
        return None
    d = p.draw
    expr = _choice(d, ["relu({})", "gelu({})", "gelu({}, approx=tanh)", "silu({})", "swish({})", "tanh({})",
                       "sigmoid({})", "abs({})", "identity({})", "leaky_relu({}, slope=0.2)", "leaky_relu({}, 0.01)",
                       "dropout({}, 0.1)", "dropout({}, p=0)", "{} * 2.5", "{} + 1", "1 - {}", "{} / 4", "-{}",
                       "layernorm({})", "layernorm({}, eps=1e-6, bias=false)", "rmsnorm({})",
                       "rmsnorm({}, affine=false)"])
    return p.emit(expr.format(x.name), x.shape, x.dtype, x.layout)


def softmax(p: Program, x: T) -> T | None:
    axis = p.draw(st.integers(-x.rank, x.rank - 1))
    return p.emit(f"softmax({x.name}, axis={axis})", x.shape, x.dtype, x.layout)


def linear(p: Program, x: T) -> T | None:
    n = p.draw(st.integers(1, 48))
    op = _choice(p.draw, ["linear({}, {})", "dense({}, {})", "linear({}, out={}, bias=false)", "linear({}, {},)"])
    return p.emit(op.format(x.name, p.size(n)), x.shape[:-1] + (n,), x.dtype, x.layout)


def ffn(p: Program, x: T) -> T | None:
    if not isinstance(x.last, int):
        return None
    h = p.draw(st.integers(1, 64))
    act_name = _choice(p.draw, ["relu", "gelu", "gelu_tanh", "silu", "tanh"])
    kind = p.draw(st.integers(0, 3))
    if kind == 0:
        return p.emit(f"ffn({x.name}, hidden={p.size(h)}, act={act_name})", x.shape, x.dtype, x.layout)
    if kind == 1:
        out = p.draw(st.integers(1, 32))
        return p.emit(f"mlp({x.name}, {p.size(h)}, {act_name}, false, {out})", x.shape[:-1] + (out,), x.dtype,
                      x.layout)
    if kind == 2:
        return p.emit(f"swiglu({x.name}, hidden={p.size(h)})", x.shape, x.dtype, x.layout)
    return p.emit(f"{x.name} + ffn(layernorm({x.name}), hidden=round_up(8*{x.last}/3, 8))", x.shape, x.dtype,
                  x.layout)


def reshape(p: Program, x: T) -> T | None:
    if x.rank != 2 or not isinstance(x.last, int) or x.last < 2:
        return None
    a = _choice(p.draw, _divisors(x.last))
    b = x.last // a
    if p.draw(st.booleans()):
        return p.emit(f"reshape({x.name}, [{x.shape[0]}, {a}, {b}])", (x.shape[0], a, b), x.dtype, "seq")
    return p.emit(f"reshape({x.name}, [{x.shape[0]}, {a}, -1])", (x.shape[0], a, b), x.dtype, "seq")


def flatten(p: Program, x: T) -> T | None:
    if x.rank < 3:
        return None
    rest = x.shape[1:]
    size: Dim = None
    if all(isinstance(s, int) for s in rest):
        size = 1
        for s in rest:
            size *= s  # type: ignore[operator]
    return p.emit(f"flatten({x.name})", (x.shape[0], size), x.dtype, "seq")


def concat_split(p: Program, x: T) -> T | None:
    if not isinstance(x.last, int):
        return None
    m = p.draw(st.integers(1, 16))
    y = p.emit(f"linear({x.name}, {m})", x.shape[:-1] + (m,), x.dtype, x.layout)
    op = _choice(p.draw, ["concat", "cat"])
    z = p.emit(f"{op}({x.name}, {y.name}, axis=-1)", x.shape[:-1] + (x.last + m,), x.dtype, x.layout)
    total = x.last + m
    if p.draw(st.booleans()):
        a, b = p.fresh(), p.fresh()
        p.lines.append(f"{a}, {b} = split({z.name}, [{x.last}, {m}])")
        p.live += [T(a, x.shape[:-1] + (x.last,), x.dtype, x.layout), T(b, x.shape[:-1] + (m,), x.dtype, x.layout)]
        return p.live[-2]
    if total % 2 == 0:
        a, b = p.fresh(), p.fresh()
        p.lines.append(f"{a}, {b} = split({z.name}, 2, axis={x.rank - 1})")
        half = x.shape[:-1] + (total // 2,)
        p.live += [T(a, half, x.dtype, x.layout), T(b, half, x.dtype, x.layout)]
        return p.emit(f"{a} * {b}", half, x.dtype, x.layout)
    return z


def select_slice(p: Program, x: T) -> T | None:
    if not isinstance(x.last, int) or x.rank < 2:
        return None
    n = x.last
    if p.draw(st.booleans()) and n >= 2:
        s = p.draw(st.integers(0, n - 2))
        e = p.draw(st.integers(s + 1, n))
        return p.emit(f"slice({x.name}, axis=-1, start={s}, end={e})", x.shape[:-1] + (e - s,), x.dtype, x.layout)
    i = p.draw(st.integers(-n, n - 1))
    if x.rank < 3:
        return None
    return p.emit(f"select({x.name}, axis={x.rank - 1}, index={i})", x.shape[:-1], x.dtype, x.layout)


def manual_attention(p: Program, x: T) -> T | None:
    if x.rank != 3 or x.layout != "seq":
        return None
    expr = f"softmax({x.name} @ transpose({x.name}, [0, 2, 1])) @ {x.name}"
    return p.emit(expr, x.shape, x.dtype, x.layout)


def attention(p: Program, x: T) -> T | None:
    if x.rank != 3 or not isinstance(x.last, int) or x.layout != "seq":
        return None
    d = p.draw
    heads = _choice(d, _divisors(x.last))
    kv = _choice(d, _divisors(heads))
    hd = x.last // heads
    opts = [f"heads={p.size(heads)}"]
    if d(st.booleans()):
        opts.append(f"kv_heads={kv}")
    if d(st.booleans()):
        causal = _choice(d, ['true', 'false'])
        opts.append(f"causal={causal}")
        if causal == "true" and d(st.booleans()):
            opts.append(f"window={d(st.integers(1, 9))}")  # Mistral's sliding window
    if d(st.booleans()):
        opts.append("bias=true")
    if hd % 2 == 0 and d(st.booleans()):
        opts.append("rope=true, rope_theta=500000")
    if d(st.booleans()):
        opts.append("scale=1")
    if d(st.integers(0, 3)) == 0:
        opts.append("rel_buckets=32, rel_max_distance=128")
    mem = [m for m in p.live if m.rank == 3 and m.layout == "seq" and m.shape[0] == x.shape[0] and m.name != x.name
           and isinstance(m.last, int) and m.dtype == x.dtype]
    args = [x.name]
    if mem and d(st.booleans()):
        args.append(_choice(d, [m.name for m in mem]))
    if d(st.integers(0, 3)) == 0:  # an additive score bias: T5's shared relative-position bias
        bias = p.fresh("pos")
        p.lines.append(f"{bias} = rel_position_bias({', '.join(args)}, heads={heads}, buckets=8, max_distance=16)")
        opts.append(f"attn_bias={bias}")
    op = _choice(d, ["attention", "mha", "multihead_attention"])
    return p.emit(f"{op}({', '.join(args + opts)})", x.shape, x.dtype, x.layout)


def library_block(p: Program, x: T) -> T | None:
    """A block from the shipped transformer.arch, pulled in with ``use``."""
    if x.rank != 3 or not isinstance(x.last, int) or x.layout != "seq":
        return None
    d = p.draw
    heads = _choice(d, _divisors(x.last))
    ff = d(st.integers(1, 64))
    p.uses_lib = True
    if (x.last // heads) % 2 == 0 and d(st.booleans()):
        kv = _choice(d, _divisors(heads))
        return p.emit(f"llama_decoder({x.name}, heads={heads}, ff={ff}, kv_heads={kv})", x.shape, x.dtype, x.layout)
    name = _choice(d, ["pre_ln_encoder", "pre_ln_decoder", "post_ln_encoder", "post_ln_decoder", "t5_encoder"])
    args = [x.name]
    if name == "t5_encoder":  # one relative-position bias per stack, passed to every layer
        bias = p.fresh("pos")
        p.lines.append(f"{bias} = rel_position_bias({x.name}, heads={heads})")
        args.append(bias)
    call = f"{name}({', '.join(args)}, heads={heads}, ff={ff})"
    if d(st.booleans()):
        return p.emit(f"repeat({d(st.integers(1, 3))}) {call}", x.shape, x.dtype, x.layout)
    return p.emit(call, x.shape, x.dtype, x.layout)


def positional(p: Program, x: T) -> T | None:
    if x.rank != 3 or x.layout != "seq":
        return None
    if isinstance(x.last, int) and x.last % 2 == 0 and p.draw(st.booleans()):
        return p.emit(f"positional({x.name})", x.shape, x.dtype, x.layout)
    if isinstance(x.shape[1], int):
        return p.emit(f"position({x.name}, learned, max_len={x.shape[1] + 3})", x.shape, x.dtype, x.layout)
    return p.emit(f"positional({x.name}, kind=learned, max_len=1024)", x.shape, x.dtype, x.layout)


def recurrent(p: Program, x: T) -> T | None:
    if x.rank != 3 or x.layout != "seq":
        return None
    d = p.draw
    h = d(st.integers(1, 32))
    op = _choice(d, ["rnn({}, {})", "rnn({}, {}, act=relu)", "lstm({}, {})", "gru({}, {})",
                     "gru({}, {}, variant=torch)", "lstm({}, hidden={}, bias=false)"])
    expr = op.format(x.name, p.size(h))
    seq = (x.shape[0], x.shape[1], h)
    if d(st.booleans()):
        return p.emit(expr, seq, x.dtype, x.layout)  # one name takes the sequence
    names = [p.fresh() for _ in range(3 if op.startswith("lstm") else 2)]
    p.lines.append(f"{', '.join(names)} = {expr}")
    p.live += [T(names[0], seq, x.dtype, "seq")] + [T(n, (x.shape[0], h), x.dtype, "seq") for n in names[1:]]
    return p.live[-len(names)]


def conv(p: Program, x: T) -> T | None:
    if x.layout != "chan" or x.rank not in (3, 4) or not isinstance(x.shape[1], int):
        return None
    d = p.draw
    nd = x.rank - 2
    c = x.shape[1]
    k = d(st.integers(1, 5))
    s = d(st.integers(1, 3))
    dil = d(st.integers(1, 2))
    g = _choice(d, _divisors(c))
    out = g * d(st.integers(1, 6))
    pad_kind = d(st.integers(0, 2))
    spatial = x.shape[2:]
    span = dil * (k - 1) + 1
    if pad_kind == 0 and s == 1:
        pad_txt, total = "same", dil * (k - 1)
    elif pad_kind == 1:
        pad_txt, total = "valid", 0
    else:
        pad = d(st.integers(0, 3))
        pad_txt, total = str(pad), 2 * pad
    if any(isinstance(v, int) and v + total < span for v in spatial):
        return None
    new = tuple((v + total - span) // s + 1 if isinstance(v, int) else None for v in spatial)
    opts = [f"padding={pad_txt}"]
    if s != 1 or d(st.booleans()):
        opts.append(f"stride={s}")
    if dil != 1:
        opts.append(f"dilation={dil}")
    if g != 1:
        opts.append(f"groups={g}")
    if d(st.booleans()):
        opts.append("bias=false")
    kernel = str(k) if nd == 1 or d(st.booleans()) else f"[{k}, {k}]"
    if nd == 2 and pad_kind == 2 and d(st.booleans()):
        opts[0] = f"padding=[{pad_txt}, {pad_txt}]"
    if nd == 2 and s != 1 and d(st.booleans()):
        opts[1] = f"stride=[{s}, {s}]"
    return p.emit(f"conv{nd}d({x.name}, {p.size(out)}, {kernel}, {', '.join(opts)})", (x.shape[0], out) + new,
                  x.dtype, "chan")


def pool(p: Program, x: T) -> T | None:
    if x.layout != "chan" or x.rank not in (3, 4):
        return None
    d = p.draw
    nd = x.rank - 2
    if nd == 2 and d(st.integers(0, 3)) == 0:
        if d(st.booleans()):
            return p.emit(f"global_avgpool({x.name})", x.shape[:2], x.dtype, "seq")
        size = d(st.integers(1, 7))
        return p.emit(f"adaptive_avgpool2d({x.name}, {size})", x.shape[:2] + (size, size), x.dtype, "chan")
    k = d(st.integers(1, 4))
    s = d(st.integers(1, 3))
    pad = d(st.integers(0, k // 2))
    if any(isinstance(v, int) and v + 2 * pad < k for v in x.shape[2:]):
        return None
    new = tuple((v + 2 * pad - k) // s + 1 if isinstance(v, int) else None for v in x.shape[2:])
    kind = _choice(d, ["maxpool", "avgpool"])
    extra = ", count_include_pad=false" if kind == "avgpool" and d(st.booleans()) else ""
    return p.emit(f"{kind}{nd}d({x.name}, {k}, stride={s}, padding={pad}{extra})", x.shape[:2] + new, x.dtype, "chan")


def transpose(p: Program, x: T) -> T | None:
    """A permutation of the axes after the batch, and back: the shape returns, the graph gains two nodes."""
    if x.rank < 2:
        return None
    rest = list(range(1, x.rank))
    perm = [0] + p.draw(st.permutations(rest))
    inverse = [perm.index(i) for i in range(x.rank)]
    op = _choice(p.draw, ["transpose", "permute"])
    y = p.emit(f"{op}({x.name}, {perm})", tuple(x.shape[i] for i in perm), x.dtype, "other")
    return p.emit(f"transpose({y.name}, perm={inverse})", x.shape, x.dtype, x.layout)


def batchnorm(p: Program, x: T) -> T | None:
    if x.layout != "chan":
        return None
    return p.emit(f"batchnorm({x.name})", x.shape, x.dtype, "chan")


def residual(p: Program, x: T) -> T | None:
    same = [t for t in p.live if t.shape == x.shape and t.dtype == x.dtype and None not in t.shape]
    y = _choice(p.draw, [t.name for t in same]) if same else x.name
    op = _choice(p.draw, ["+", "-", "*", "/"])
    return p.emit(f"{x.name} {op} {y}", x.shape, x.dtype, x.layout)


def shared_instance(p: Program, x: T) -> T | None:
    """``lin = linear(n)`` once, called twice: one set of weights."""
    if not isinstance(x.last, int):
        return None
    inst = p.fresh("lin")
    p.lines.append(f"{inst} = linear({x.last})")
    y = p.emit(f"{inst}({x.name})", x.shape, x.dtype, x.layout)
    return p.emit(f"{inst}({y.name})", x.shape, x.dtype, x.layout)


TEMPLATES = (act, linear, ffn, residual, softmax, reshape, flatten, concat_split, select_slice, manual_attention,
             attention, library_block, positional, recurrent, conv, pool, batchnorm, shared_instance, transpose)
SHAPE_KEEPING = (act, softmax, residual, manual_attention, attention, positional, batchnorm)


def _step(p: Program, x: T, templates) -> T:
    for _ in range(6):
        y = p.draw(st.sampled_from(templates))(p, x)
        if y is not None:
            return y
    return act(p, x) or x


def _block(p: Program, x: T) -> T:
    """A block that keeps the shape, defined in the model (or at top level) and called or repeated."""
    d = p.draw
    name = p.fresh("blk")
    inner = Program(d, p.symbols, n=p.n)
    arg = T("x", x.shape, x.dtype, x.layout)
    inner.live = [arg]
    y = arg
    for _ in range(d(st.integers(1, 3))):
        y = _step(inner, y, SHAPE_KEEPING)
    p.n = inner.n
    p.uses_lib |= inner.uses_lib
    extra = ", scale=1.0" if d(st.booleans()) else ""
    ret = f"{y.name} * scale" if extra else y.name
    body = "\n".join(f"    {line}" for line in inner.lines)
    text = f"  block {name}(x{extra}) {{\n{body}\n    return {ret}\n  }}"
    if any(line.startswith("const ") for line in inner.lines) or d(st.booleans()):
        p.lines.append(text.strip())  # in the model: closes over the model's constants
    else:
        p.top.append(text.replace("\n  ", "\n").strip())
    count = d(st.integers(0, 3))
    call = f"repeat({count}) {name}({x.name})" if count else f"{name}({x.name})"
    return p.emit(call, x.shape, x.dtype, x.layout)


def _start(p: Program) -> T:
    d = p.draw
    kind = d(st.integers(0, 4))
    if kind == 0:
        dim = d(st.integers(1, 64))
        p.lines.append(f"input x: f32[B, {p.size(dim)}]")
        return T("x", ("B", dim))
    if kind == 1:
        dim, dtype = _choice(d, [8, 12, 16, 24, 32, 64]), _choice(d, ["f32", "f16", "bf16", "f64"])
        p.lines.append(f"input x: {dtype}[B, T, {dim}]")
        return T("x", ("B", "T", dim), dtype)
    if kind == 2:
        vocab, dim = d(st.integers(2, 1000)), _choice(d, [8, 16, 32])
        p.lines.append(f"input tokens: {_choice(d, ['i32', 'i64'])}[B, T]")
        p.lines.append(f"emb = embedding({p.size(vocab)}, {dim})")
        p.consts["@vocab"] = vocab
        return p.emit("emb(tokens)", ("B", "T", dim))
    if kind == 3:
        c = d(st.integers(1, 8))
        h = _choice(d, ["H", 32, 17])
        p.lines.append(f"input img: f32[B, {c}, {h}, {h if isinstance(h, int) else 'W'}]")
        return T("img", ("B", c, h, h if isinstance(h, int) else "W"), layout="chan")
    c = d(st.integers(1, 8))
    p.lines.append(f"input sig: f32[B, {c}, 64]")
    return T("sig", ("B", c, 64), layout="chan")


def _type_text(t: T) -> str | None:
    if None in t.shape:
        return None
    return f"{t.dtype}[{','.join(str(s) for s in t.shape)}]"


@st.composite
def valid_models(draw) -> Case:
    p = Program(draw, ["B", "T", "H", "W"])
    x = _start(p)
    for _ in range(draw(st.integers(1, 7))):
        x = _block(p, x) if draw(st.integers(0, 5)) == 0 else _step(p, x, TEMPLATES)
    outs = [x]
    if "@vocab" in p.consts and x.rank == 3 and x.last == p.live[0].last and draw(st.booleans()):
        outs = [p.emit(f"unembed({x.name}, tied=emb)", x.shape[:-1] + (p.consts["@vocab"],))]
    elif draw(st.booleans()) and len(p.live) > 1:
        outs.append(draw(st.sampled_from(p.live[:-1])))
    body = list(p.lines)
    expected = []
    for i, t in enumerate(outs):
        label = f"out{i}"
        body.append(f"output {label} = {t.name}" if draw(st.booleans()) else f"{label} = {t.name}\noutput {label}")
        expected.append((label, _type_text(t)))
    used = [s for s in p.symbols if any(s in line for line in body)] or ["B"]
    sep = draw(st.sampled_from(["\n  ", "\n  ", "; ", "\n\n  # a comment\n  "]))
    lines = sep.join(body)
    header = '# generated by tests/fuzz/valid_models.py\n' + ('use "transformer.arch"\n' if p.uses_lib else "")
    text = header + "\n".join(p.top) + f"\nmodel gen({', '.join(used)}) {{\n  {lines}\n}}\n"
    expect = tuple((label, ty) for label, ty in expected if ty is not None)
    flags: tuple[str, ...] = ()
    if draw(st.integers(0, 3)) == 0:  # -D B=..., T=...: shapes become concrete, and so must the types
        values = {"B": draw(st.integers(1, 8)), "T": draw(st.integers(1, 16))}
        flags = tuple(f"{k}={v}" for k, v in values.items() if k in used)
        expect = tuple((label, _bind(ty, values)) for label, ty in expect)
    return Case((("main.arch", text),), "main.arch", flags, None, "arch", True, "valid", expect)


def _bind(type_text: str, values: dict[str, int]) -> str:
    dtype, _, dims = type_text.partition("[")
    out = [str(values.get(d, d)) for d in dims.rstrip("]").split(",")] if dims != "]" else []
    return f"{dtype}[{','.join(out)}]"
