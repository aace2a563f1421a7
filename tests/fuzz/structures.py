"""Hostile structures written on purpose: recursion, ``use`` cycles, deep nesting, huge sizes.

Mutating a model rarely builds a cycle of three blocks or a chain of files that use each
other, so these shapes are generated directly, at sizes from tame to absurd.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.case import Case

MODEL = "model m(B, T) {{\n  input x: f32[B, T, 8]\n{body}\n  output y = {out}\n}}\n"


def _model(body: str, out: str = "h") -> str:
    return MODEL.format(body=body, out=out)


@st.composite
def block_recursion(draw) -> Case:
    """A cycle of k blocks (k = 1 is a block calling itself), reached directly, by repeat or by a default."""
    k = draw(st.integers(1, 8))
    how = draw(st.sampled_from(["call", "repeat", "default", "nested", "across-files", "instance"]))
    names = _names(draw, k)
    if len(set(names)) < k:
        names = [f"b{i}" for i in range(k)]
    blocks = []
    for i in range(k):
        callee = names[(i + 1) % k]
        if how == "default":
            blocks.append(f"block {names[i]}(x, y={callee}(x)) {{ return x + y }}")
        elif how == "repeat":
            blocks.append(f"block {names[i]}(x) {{ return repeat({draw(st.integers(1, 3))}) {callee}(x) }}")
        elif how == "nested":
            blocks.append(f"block {names[i]}(x) {{\n  block inner(z) {{ return {callee}(z) }}\n  return inner(x)\n}}")
        elif how == "instance":
            blocks.append(f"block {names[i]}(x) {{ lin = linear(8)\n  return lin({callee}(x)) }}")
        else:
            blocks.append(f"block {names[i]}(x) {{ return relu({callee}(x)) }}")
    call = f"  h = {names[0]}(x)"
    if how == "across-files":
        files = [(f"f{i}.arch", f'use "f{(i + 1) % k}.arch"\n{b}\n') for i, b in enumerate(blocks)]
        main = 'use "f0.arch"\n' + _model(call)
        return Case((("main.arch", main), *files), origin="structure:recursion")
    inside = draw(st.booleans())
    defs = "\n".join(blocks)
    if inside:
        text = _model("\n".join("  " + line for line in defs.splitlines()) + "\n" + call)
    else:
        text = defs + "\n" + _model(call)
    return Case.single(text, "structure:recursion")


@st.composite
def use_cycles(draw) -> Case:
    """Files that use each other in a ring, use themselves, or form a diamond (which is fine)."""
    k = draw(st.integers(1, 12))
    shape = draw(st.sampled_from(["ring", "self", "diamond", "missing", "dir", "dotted"]))
    model = _model("  h = relu(x)")
    if shape == "self":
        return Case.single('use "main.arch"\n' + model, "structure:use-cycle")
    if shape == "missing":
        return Case.single(f'use "lib{k}.arch"\n' + model, "structure:use-cycle")
    if shape == "dir":
        name = draw(st.sampled_from(["", ".", "..", "/", "sub", "sub/", "/dev/null", "/proc/self/status", "/dev/zero",
                                     "/dev/stdin", "a\x00b.arch", "x" * 300, "/".join(["abcdefgh"] * 600),
                                     "../" * 40 + "etc/hostname"]))
        return Case((("main.arch", f'use "{name}"\n' + model), ("sub/x.arch", "const q = 1\n")),
                    origin="structure:use-cycle")
    if shape == "dotted":  # the same file under two spellings: ./a.arch and sub/../a.arch
        spell = draw(st.sampled_from(["./r0.arch", "sub/../r0.arch", "r0.arch", ".//r0.arch"]))
        files = [("r0.arch", f'use "{spell}"\nconst c = 1\n'), ("sub/keep.arch", "const k = 1\n")]
        return Case((("main.arch", f'use "{spell}"\n' + model), *files), origin="structure:use-cycle")
    if shape == "diamond":
        files = [("top.arch", 'use "left.arch"\nuse "right.arch"\n'), ("left.arch", 'use "base.arch"\nconst l = 1\n'),
                 ("right.arch", 'use "base.arch"\nconst r = 2\n'), ("base.arch", "const base = 3\n")]
        return Case((("main.arch", 'use "top.arch"\n' + model), *files), origin="structure:use-cycle")
    ring = [(f"r{i}.arch", f'use "r{(i + 1) % k}.arch"\nconst c{i} = {i}\n') for i in range(k)]
    entry = draw(st.sampled_from(['use "r0.arch"\n', 'use "main.arch"\nuse "r0.arch"\n']))
    return Case((("main.arch", entry + model), *ring), origin="structure:use-cycle")


DEPTHS = (10, 63, 64, 65, 200, 1000, 5000)


def depths() -> st.SearchStrategy[int]:
    """The depths around the builder's limits, and any other up to 6,000."""
    return st.one_of(st.sampled_from(DEPTHS), st.integers(2, 6000))


def _names(draw, k: int) -> list[str]:
    """k distinct block names (some of them op names, which blocks may shadow)."""
    pool = st.sampled_from(["b", "blk", "layer", "f", "relu", "linear", "attention", "x", "_", "B"])
    base = draw(pool)
    return [f"{base}{i}" if draw(st.booleans()) or i else base for i in range(k)]


@st.composite
def deep_nesting(draw) -> Case:
    """Deep parentheses, calls, operators, lists, nested block definitions and block call chains."""
    n = draw(depths())
    kind = draw(st.sampled_from(["parens", "calls", "negation", "sum", "lists", "power", "const-parens",
                                 "block-defs", "block-chain", "dims", "args", "blocks-in-args"]))
    if kind == "parens":
        body = f"  h = {'(' * n}x{')' * n}"
    elif kind == "calls":
        body = f"  h = {'relu(' * n}x{')' * n}"
    elif kind == "negation":
        body = f"  h = {'-' * n}x"
    elif kind == "sum":
        body = "  h = x" + " + x" * n
    elif kind == "lists":
        body = f"  h = linear(x, {'[' * n}1{']' * n})"
    elif kind == "power":
        body = "  const c = 1" + " ** 1" * n + "\n  h = x * c"
    elif kind == "const-parens":
        body = f"  const c = {'(' * n}2{')' * n}\n  h = linear(x, c)"
    elif kind == "dims":
        body = f"  input z: f32[{'(' * n}B{')' * n}, {'max(' * n}1{', 1)' * n}]\n  h = x"
    elif kind == "args":
        body = "  h = linear(x, " + "1, " * n + "1)"
    elif kind == "blocks-in-args":
        n = min(n, 1000)
        body = "  block f(z) { return relu(z) }\n  h = " + "f(" * n + "x" + ")" * n
    elif kind == "block-defs":
        n = min(n, 1000)
        opens = "".join(f"{'  ' * (i + 1)}block b{i}(x) {{\n" for i in range(n))
        closes = "".join(f"{'  ' * (i + 1)}  return b{i + 1}(x)\n{'  ' * (i + 1)}}}\n" for i in reversed(range(n - 1)))
        innermost = f"{'  ' * n}  return relu(x)\n{'  ' * n}}}\n"
        body = opens + innermost + closes + "  h = b0(x)"
        body = body.replace(f"return b{n}(x)", "return relu(x)")
    else:  # block-chain: b0 calls b1 calls ... b(n-1)
        n = min(n, 1000)
        chain = "\n".join(f"block b{i}(x) {{ return b{i + 1}(x) }}" for i in range(n - 1))
        text = chain + f"\nblock b{n - 1}(x) {{ return relu(x) }}\n" + _model("  h = b0(x)")
        return Case.single(text, "structure:deep")
    return Case.single(_model(body), "structure:deep")


@st.composite
def huge_sizes(draw) -> Case:
    """Sizes and counts at and past every limit: int64, MAX_REPEAT, nested repeats, giant widths."""
    big = draw(st.one_of(st.sampled_from(["2**31", "2**62", "2**63", "2**64", "10**30", "10**4000", "1e5000",
                                          "2**61", "-1", "0", "-(2**63)", "100000", "100001"]),
                         st.integers(-(2**70), 2**70).map(str)))
    kind = draw(st.sampled_from(["width", "input", "repeat", "nested-repeat", "heads", "conv", "vocab", "define"]))
    defines: tuple[str, ...] = ()
    if kind == "width":
        body = f"  h = linear(x, {big})"
    elif kind == "input":
        body = f"  input z: f32[B, {big}, {big}]\n  h = x"
    elif kind == "repeat":
        body = f"  block f(z) {{ return relu(z) }}\n  h = repeat({big}) f(x)"
    elif kind == "nested-repeat":
        a, b = draw(st.one_of(st.sampled_from([(100, 100), (1000, 1000), (100000, 100000), (300, 3000)]),
                              st.tuples(st.integers(1, 200), st.integers(1, 200))))
        body = (f"  block f(z) {{ return relu(z) }}\n  block g(z) {{ return repeat({b}) f(z) }}\n"
                f"  h = repeat({a}) g(x)")
    elif kind == "heads":
        body = f"  h = attention(x, heads={big})"
    elif kind == "conv":
        body = f"  input img: f32[B, 3, {big}, 8]\n  c = conv2d(img, {big}, 3)\n  h = x"
    elif kind == "vocab":
        body = f"  input ids: i32[B, T]\n  emb = embedding({big}, 8)\n  h = x + emb(ids)"
    else:
        body = "  h = linear(x, T)"
        sizes = st.one_of(st.sampled_from(["4611686018427387903", "3037000499", "2147483648", "99", "1"]),
                          st.integers(-5, 2**63).map(str))
        defines = (f"T={draw(sizes)}", f"B={draw(sizes)}")
    return Case((("main.arch", _model(body)),), defines=defines, origin="structure:huge")


def structures() -> st.SearchStrategy[Case]:
    return st.one_of(block_recursion(), use_cycles(), deep_nesting(), huge_sizes())
