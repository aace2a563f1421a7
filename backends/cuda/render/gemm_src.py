"""The text of the tiled shared-memory GEMM kernels, C[z] = act(A[z] · B[z] + bias).

A block computes a BM×BN tile of C; its threads form a (BM/TM)×(BN/TN) grid and each owns
TM×TN outputs, interleaved (rows ``ty + RY·i``, columns ``tx + CX·j``) so that shared-memory
reads spread over banks. K advances BK at a time through two shared tiles (stored k-major
and padded so the transposing stores do not conflict). The accumulators are named scalars,
written out unrolled, so they stay in registers whatever the compiler unrolls. fp32 FMA
throughout: numba.cuda has no access to tensor cores.

Operands are 3-D ``[Z, rows, cols]``; the batch index of A (B) is ``(z // div) % mod``,
which covers plain GEMMs (Z = 1), batched and broadcast matmuls, and grouped convolutions.
``layout`` is ``nt`` (B is [N, K], a weight in PyTorch layout) or ``nn`` (B is [K, N]).
"""

from __future__ import annotations

from dataclasses import dataclass

from irc.backends.common.kernel import A1, A3, I64, Kernel
from irc.backends.cuda.module import jit_bounded
from irc.backends.cuda.render.elementwise import ACT_EXPR


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    @property
    def ry(self) -> int:  # thread rows
        return self.bm // self.tm

    @property
    def cx(self) -> int:  # thread columns
        return self.bn // self.tn

    @property
    def threads(self) -> int:
        return self.ry * self.cx

    @property
    def tag(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}"


# Register budget: TM·TN accumulators (twice for the gated GEMM) plus TM + TN operands.
TILES = {"large": Tile(128, 128, 8, 8, 8), "medium": Tile(64, 64, 8, 4, 4), "small": Tile(32, 32, 8, 2, 2)}
GLU_TILES = {"large": Tile(128, 64, 8, 8, 4), "medium": Tile(64, 64, 8, 4, 4), "small": Tile(32, 32, 8, 2, 2)}
WAVE = 132  # multiprocessors of an H200: a grid with fewer blocks leaves some idle


def pick_tile(m: int, n: int, z: int, glu: bool = False) -> Tile:
    """The largest tile that still gives the GPU enough blocks (a wave per size step)."""
    table = GLU_TILES if glu else TILES
    for name, want in (("large", 2 * WAVE), ("medium", WAVE)):
        t = table[name]
        if -(-m // t.bm) * -(-n // t.bn) * z >= want:
            return t
    return table["small"]


def _pad(rows: int, bk: int) -> int:
    """Row padding of a k-major tile so the stores of one warp hit 32 different banks."""
    return (32 // bk - rows) % 32


def _acc(prefix: str, i: int, j: int) -> str:
    return f"{prefix}{i}_{j}"


@dataclass(frozen=True)
class GemmSpec:
    tile: Tile
    layout: str = "nt"  # "nt": B is [N, K]; "nn": B is [K, N]
    bias: str = "none"  # "none", "col" (bias[col]) or "row" (bias[(z % bias_mod) * M + row])
    act: str = "none"
    glu: bool = False  # act(A·B) * (A·B2): the gated half of SwiGLU
    outputs: int = 1  # >1: columns split over several results (merged projections)
    min_blocks: int = 0  # >0: launch bounds asking for that many resident blocks per multiprocessor
    prefetch: bool = False  # load the next K tile into registers while multiplying this one

    @property
    def name(self) -> str:
        parts = ["k_gemm", self.layout, self.tile.tag]
        if self.glu:
            parts.append("glu")
        if self.outputs > 1:
            parts.append(f"split{self.outputs}")
        if self.bias != "none":
            parts.append(f"bias{self.bias}")
        if self.act != "none":
            parts.append(self.act)
        if self.min_blocks > 0:
            parts.append(f"lb{self.min_blocks}")
        if self.prefetch:
            parts.append("pf")
        return "_".join(parts)


def _b_operands(spec: GemmSpec) -> list[tuple[str, str, str]]:
    """(register prefix, global array, shared tile) of B (and of B2, gated)."""
    return [("gb", "b", "Bs")] + ([("gd", "b2", "Bs2")] if spec.glu else [])


def _global_loads(spec: GemmSpec, k: str) -> list[str]:
    """This thread's share of the A and B tiles at depth ``k`` into registers (zero outside)."""
    t = spec.tile
    lines = []
    for l_ in range(t.bm * t.bk // t.threads):
        lines += [f"e = tid + {l_ * t.threads}", f"gr = row0 + e // {t.bk}", f"gq = {k} + e % {t.bk}",
                  f"ga{l_} = a[za, gr, gq] if (gr < m) & (gq < kk) else np.float32(0.0)"]
    for l_ in range(t.bn * t.bk // t.threads):
        if spec.layout == "nt":
            lines += [f"e = tid + {l_ * t.threads}", f"gc = col0 + e // {t.bk}", f"gq = {k} + e % {t.bk}"]
            index = "zb, gc, gq"
        else:
            lines += [f"e = tid + {l_ * t.threads}", f"gq = {k} + e // {t.bn}", f"gc = col0 + e % {t.bn}"]
            index = "zb, gq, gc"
        for reg, src, _ in _b_operands(spec):
            lines.append(f"{reg}{l_} = {src}[{index}] if (gc < n) & (gq < kk) else np.float32(0.0)")
    return lines


def _shared_stores(spec: GemmSpec) -> list[str]:
    """The registers of :func:`_global_loads` into the k-major shared tiles."""
    t = spec.tile
    lines = []
    for l_ in range(t.bm * t.bk // t.threads):
        lines += [f"e = tid + {l_ * t.threads}", f"As[e % {t.bk}, e // {t.bk}] = ga{l_}"]
    for l_ in range(t.bn * t.bk // t.threads):
        lines.append(f"e = tid + {l_ * t.threads}")
        where = f"e % {t.bk}, e // {t.bk}" if spec.layout == "nt" else f"e // {t.bn}, e % {t.bn}"
        for reg, _, tile in _b_operands(spec):
            lines.append(f"{tile}[{where}] = {reg}{l_}")
    return lines


def _inner(spec: GemmSpec) -> list[str]:
    t = spec.tile
    lines = [f"for q in range({t.bk}):"]
    lines += [f"    fa{i} = As[q, ty + {t.ry * i}]" for i in range(t.tm)]
    lines += [f"    fb{j} = Bs[q, tx + {t.cx * j}]" for j in range(t.tn)]
    if spec.glu:
        lines += [f"    fd{j} = Bs2[q, tx + {t.cx * j}]" for j in range(t.tn)]
    for i in range(t.tm):
        for j in range(t.tn):
            lines.append(f"    {_acc('c', i, j)} += fa{i} * fb{j}")
            if spec.glu:
                lines.append(f"    {_acc('u', i, j)} += fa{i} * fd{j}")
    return lines


def _store(spec: GemmSpec, i: int, j: int) -> list[str]:
    lines = [f"v = {_acc('c', i, j)}"]
    if spec.bias == "col":
        lines.append("v += bias[col]")
    elif spec.bias == "row":
        lines.append("v += bias[(z % bias_mod) * m + r]")
    if spec.act != "none":
        lines.append(f"v = {ACT_EXPR[spec.act]}")
    if spec.glu:
        lines.append(f"v = v * {_acc('u', i, j)}")
    if spec.outputs == 1:
        return lines + ["c0[z, r, col] = v"]
    lines.append("if col < n0:")
    lines.append("    c0[z, r, col] = v")
    for o in range(1, spec.outputs):
        last = o == spec.outputs - 1
        lines.append("else:" if last else f"elif col < n{o}:")
        lines.append(f"    c{o}[z, r, col - n{o - 1}] = v")
    return lines


def gemm_kernel(spec: GemmSpec) -> Kernel:
    t = spec.tile
    outs = [f"c{o}" for o in range(spec.outputs)]
    splits = [f"n{o}" for o in range(spec.outputs - 1)]  # cumulative column ends
    args = ["a", "b"] + (["b2"] if spec.glu else []) + ["bias"] + outs
    args += ["m", "n", "kk", "a_div", "a_mod", "b_div", "b_mod", "bias_mod"] + splits
    kinds = (A3, A3) + ((A3,) if spec.glu else ()) + (A1,) + (A3,) * spec.outputs + (I64,) * (8 + len(splits))
    body = [
        f"As = cuda.shared.array(({t.bk}, {t.bm + _pad(t.bm, t.bk)}), np.float32)",
        f"Bs = cuda.shared.array(({t.bk}, {t.bn + _pad(t.bn, t.bk)}), np.float32)",
    ]
    if spec.glu:
        body.append(f"Bs2 = cuda.shared.array(({t.bk}, {t.bn + _pad(t.bn, t.bk)}), np.float32)")
    body += [
        "tid = cuda.threadIdx.x",
        f"tx = tid % {t.cx}",
        f"ty = tid // {t.cx}",
        "z = cuda.blockIdx.z",
        f"row0 = cuda.blockIdx.y * {t.bm}",
        f"col0 = cuda.blockIdx.x * {t.bn}",
        "za = (z // a_div) % a_mod",
        "zb = (z // b_div) % b_mod",
    ]
    for i in range(t.tm):
        for j in range(t.tn):
            body.append(f"{_acc('c', i, j)} = np.float32(0.0)")
            if spec.glu:
                body.append(f"{_acc('u', i, j)} = np.float32(0.0)")
    if spec.prefetch:  # the next tile's loads are in flight while this one is multiplied
        body += _global_loads(spec, "0") + _shared_stores(spec) + ["cuda.syncthreads()"]
        body.append(f"for k0 in range(0, kk, {t.bk}):")
        body += [f"    {line}" for line in _global_loads(spec, f"k0 + {t.bk}")]
        body += [f"    {line}" for line in _inner(spec)]
        body.append("    cuda.syncthreads()")
        body += [f"    {line}" for line in _shared_stores(spec)]
        body.append("    cuda.syncthreads()")
    else:
        body.append(f"for k0 in range(0, kk, {t.bk}):")
        body += [f"    {line}" for line in _global_loads(spec, "k0") + _shared_stores(spec)]
        body.append("    cuda.syncthreads()")
        body += [f"    {line}" for line in _inner(spec)]
        body.append("    cuda.syncthreads()")
    for i in range(t.tm):
        body.append(f"r = row0 + ty + {t.ry * i}")
        body.append("if r < m:")
        for j in range(t.tn):
            body.append(f"    col = col0 + tx + {t.cx * j}")
            body.append("    if col < n:")
            body += [f"        {line}" for line in _store(spec, i, j)]
    jit = jit_bounded(t.threads, spec.min_blocks)
    src = f"{jit}\ndef {spec.name}({', '.join(args)}):\n" + "".join(f"    {line}\n" for line in body)
    return Kernel(spec.name, src, kinds)
