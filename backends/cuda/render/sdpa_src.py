"""The text of the fused attention kernel: softmax(q·kᵀ·scale [+ bias] [causal])·v, no T×S buffer.

One block per (query tile of BM rows, batch·head). Its TY×TX threads own an RM×RN micro-tile
of the score tile (rows ``ty + TY·i``, keys ``tx + TX·j``) and RM×RD outputs (columns
``tx + TX·j`` of the value width), so one thread's rows are the same in both products and
the online-softmax statistics (running max ``m``, partial sum ``l``) stay in its registers.
Per key tile of BN keys: Q (resident in shared memory when it fits, else in chunks) and K
chunks give the scores; scale, bias and masks; the row max over the TX threads of a row
(warp shuffles, or shared memory in the simulator's path); ``p = exp(s − m)`` into shared
memory; V in chunks gives ``o += p·v``. Key tiles wholly above the diagonal are never
visited (causal), and the query tiles are issued last-first so the longest run first. A
sliding window W (query i also loses keys j <= i − W) starts the key loop at the tile of
the first key the tile's first row sees, so the work is O(T·W); W is a kernel argument.
fp32 accumulation; q, k, v and out may be float16 (loads widen, the store narrows).
Query head ``h`` reads key/value head ``h // (heads // groups)`` (GQA, MQA).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from irc.backends.common.kernel import A4, F32, I64, Kernel
from irc.backends.cuda.module import jit_bounded
from irc.backends.cuda.render.reduce import group_read, group_reduce
from irc.diagnostics import IrcError

SHARED_LIMIT = 48 * 1024  # static shared memory per block


@dataclass(frozen=True)
class AttnTile:
    ty: int
    tx: int  # a power of two ≤ 32: the threads sharing a row sit in one warp
    rm: int
    rn: int

    @property
    def bm(self) -> int:
        return self.ty * self.rm

    @property
    def bn(self) -> int:
        return self.tx * self.rn

    @property
    def threads(self) -> int:
        return self.ty * self.tx

    @property
    def tag(self) -> str:
        return f"{self.ty}x{self.tx}x{self.rm}x{self.rn}"


# narrow: 64 threads, 8×8 micro-tiles (4 FMAs per shared load; ptxas: 255 registers and a
# small spill at width 64). wide: 128 threads, 8×4 (no spill at widths 64 and 128).
# compact: 128 threads, 4×8, half the accumulators (more warps per multiprocessor).
# benchmarks/gpu.py times all three; IRC_CUDA_ATTN_TILE picks one for a whole model.
# The defaults are the H200 sweep's winners (benchmarks/RESULTS-gpu.md, 2026-12-04; causal,
# B8 H16 T1024 d64 and B4 H32 T2048 d128): compact at width 64 (2.91 ms against narrow's
# 3.55, wide's 2.99), wide at 128 (19.7 ms, compact 19.9, narrow 30.0). Launch bounds
# (min_blocks 2) moved no time by more than 0.5 %, so none are asked for.
TILES = {"narrow": AttnTile(8, 8, 8, 8), "wide": AttnTile(8, 16, 8, 4), "compact": AttnTile(16, 8, 4, 8)}
TILE_ENV = "IRC_CUDA_ATTN_TILE"


def pick_tile(hdv: int) -> AttnTile:
    forced = os.environ.get(TILE_ENV, "").strip()
    if forced:
        if forced not in TILES:
            raise IrcError(f"{TILE_ENV}={forced!r}: expected one of {', '.join(TILES)}")
        return TILES[forced]
    return TILES["compact"] if hdv <= 64 else TILES["wide"]


def _divisor(n: int, options: tuple[int, ...]) -> int:
    return next(c for c in options if n % c == 0)


@dataclass(frozen=True)
class AttnSpec:
    tile: AttnTile
    hd: int  # query/key width
    hdv: int  # value width
    causal: bool
    bias: bool
    path: str  # "shuffle" or "shared"
    min_blocks: int = 0  # >0: launch bounds asking for that many resident blocks per multiprocessor
    window: bool = False  # causal with a sliding window (its width is the kernel's last argument)

    @property
    def rd(self) -> int:
        return -(-self.hdv // self.tile.tx)

    @property
    def dc(self) -> int:  # query/key widths per chunk
        return _divisor(self.hd, (16, 8, 4, 2, 1))

    @property
    def kc(self) -> int:
        """Keys per value chunk: as many as fit beside the other tiles (Q chunked)."""
        for c in (32, 16, 8, 4, 2, 1):
            if self.tile.bn % c == 0 and 4 * self._floats(self.dc, c) <= SHARED_LIMIT:
                return c
        return 1

    def _floats(self, q_rows: int, kc: int | None = None) -> int:
        t = self.tile
        kc = self.kc if kc is None else kc
        floats = q_rows * (t.bm + 1) + self.dc * (t.bn + 1) + kc * self.rd * t.tx + t.bn * (t.bm + 1)
        return floats + (t.bm * t.tx if self.path == "shared" else 0)

    @property
    def q_resident(self) -> bool:
        """The whole query tile stays in shared memory (loaded once) when it fits."""
        return 4 * self._floats(self.hd) <= SHARED_LIMIT

    @property
    def shared_bytes(self) -> int:
        return 4 * self._floats(self.hd if self.q_resident else self.dc)

    @property
    def name(self) -> str:
        parts = ["k_sdpa", f"d{self.hd}"] + ([f"v{self.hdv}"] if self.hdv != self.hd else [])
        parts.append(self.tile.tag)
        parts += (["causal"] if self.causal else []) + (["window"] if self.window else [])
        parts += ["bias"] if self.bias else []
        parts += [f"lb{self.min_blocks}"] if self.min_blocks > 0 else []
        return "_".join(parts) + f"__{self.path}"


NEG_INF = "np.float32(-np.inf)"


def _register_product(t: AttnTile, indent: str, rows: tuple[str, str], cols: tuple[str, str], ncols: int,
                      acc: str) -> list[str]:
    """``{acc}{i}_{j} += a{i} * b{j}`` over this thread's micro-tile, the operands loaded into
    registers first: a{i} is row ``ty + TY·i`` of ``rows`` = (register name, shared array and
    its first index), b{j} is column ``tx + TX·j`` of ``cols``, j < ``ncols``."""
    (a, a_src), (b, b_src) = rows, cols
    lines = [f"{indent}{a}{i} = {a_src}, ty + {t.ty * i}]" for i in range(t.rm)]
    lines += [f"{indent}{b}{j} = {b_src}, tx + {t.tx * j}]" for j in range(ncols)]
    lines += [f"{indent}{acc}{i}_{j} += {a}{i} * {b}{j}" for i in range(t.rm) for j in range(ncols)]
    return lines


def _row_reduce(spec: AttnSpec, op: str, var: str) -> list[str]:
    """``{var}{i}`` reduced with ``op`` over the TX threads that share each of this thread's rows
    (in the shared-memory path: the tree, a barrier, then every thread reads its row's result)."""
    t = spec.tile
    lines = []
    for i in range(t.rm):
        lines += group_reduce(spec.path, op, f"{var}{i}", t.tx, "red", f"ty + {t.ty * i}", "tx", "").splitlines()
    if spec.path == "shared":
        lines.append("cuda.syncthreads()")
        for i in range(t.rm):
            lines += group_read(spec.path, op, f"{var}{i}", t.tx, "red", f"ty + {t.ty * i}", "").splitlines()
    return lines


def _scores(spec: AttnSpec) -> list[str]:
    t = spec.tile
    lines = []
    for i in range(t.rm):
        for j in range(t.rn):
            lines.append(f"s{i}_{j} = np.float32(0.0)")
    lines.append(f"for d0 in range(0, {spec.hd}, {spec.dc}):")
    if not spec.q_resident:
        lines += [f"    for e in range(tid, {t.bm * spec.dc}, {t.threads}):",
                  f"        r = e // {spec.dc}",
                  f"        dd = e % {spec.dc}",
                  "        Qs[dd, r] = q[n, h, q0 + r, d0 + dd] if q0 + r < t_len else np.float32(0.0)"]
    lines += [f"    for e in range(tid, {t.bn * spec.dc}, {t.threads}):",
              f"        c = e // {spec.dc}",
              f"        dd = e % {spec.dc}",
              "        Ks[dd, c] = k[kn, g, k0 + c, d0 + dd] if k0 + c < s_len else np.float32(0.0)",
              "    cuda.syncthreads()",
              f"    for dd in range({spec.dc}):"]
    qrow = "d0 + dd" if spec.q_resident else "dd"
    lines += _register_product(t, "        ", ("qa", f"Qs[{qrow}"), ("kb", "Ks[dd"), t.rn, "s")
    lines.append("    cuda.syncthreads()")
    return lines


def _scale_and_mask(spec: AttnSpec) -> list[str]:
    """Scale, bias, and on tiles that cross the diagonal or the end of the keys, the mask.

    The mask is branch-free: ``s = min(s, ±inf)`` with the sign from ``copysign`` of the
    distance to the limit. Few branches keep numba's compile time down (its liveness
    analysis grows with blocks × variables) and the warps converged."""
    t = spec.tile
    lines = []
    for i in range(t.rm):
        for j in range(t.rn):
            lines.append(f"s{i}_{j} = s{i}_{j} * scale")
    if spec.bias:
        lines += ["bn = min(n, nb0)", "bh = min(h, nb1)"]
        lines += [f"br{i} = min(q0 + ty + {t.ty * i}, nb2)" for i in range(t.rm)]
        lines += [f"bc{j} = min(k0 + tx + {t.tx * j}, nb3)" for j in range(t.rn)]
        for i in range(t.rm):
            for j in range(t.rn):
                lines.append(f"s{i}_{j} += bias[bn, bh, br{i}, bc{j}]")
    edge = f"k0 + {t.bn} > s_len" + (f" or k0 + {t.bn - 1} > q0" if spec.causal else "")
    edge += f" or k0 <= q0 + {t.bm - 1} - window" if spec.window else ""
    limits = "the diagonal, or the window's edge" if spec.window else "the diagonal"
    lines.append(f"if {edge}:  # some keys of this tile are past the end (or {limits})")
    # +inf where key j exists, -inf past the end
    lines += [f"    lim{j} = math.copysign(INF, np.float32(s_len - k0 - tx - {t.tx * j}) - np.float32(0.5))"
              for j in range(t.rn)]
    if spec.causal:
        lines += [f"    gap{i} = q0 + ty + {t.ty * i} - k0 - tx  # query row - key column" for i in range(t.rm)]
    for i in range(t.rm):
        for j in range(t.rn):
            limit = f"lim{j}"
            if spec.causal:
                limit = f"min(lim{j}, math.copysign(INF, np.float32(gap{i} - {t.tx * j}) + np.float32(0.5)))"
            if spec.window:  # +inf while the key is within the window (row − key < W), −inf past it
                limit = f"min({limit}, math.copysign(INF, np.float32(window - gap{i} + {t.tx * j}) - np.float32(0.5)))"
            lines.append(f"    s{i}_{j} = min(s{i}_{j}, {limit})")
    return lines


def _softmax_update(spec: AttnSpec) -> list[str]:
    """Online softmax: new row max, rescale what is accumulated, p = exp(s − max) into Ps.

    A row with nothing visible yet has max −∞; clamping the subtrahend to −3e38 keeps
    exp(−∞ − (−3e38)) = 0 instead of NaN, with no branch."""
    t = spec.tile
    lines = []
    for i in range(t.rm):
        lines.append(f"mt{i} = max({', '.join(f's{i}_{j}' for j in range(t.rn))})" if t.rn > 1 else f"mt{i} = s{i}_0")
    lines += _row_reduce(spec, "fmax", "mt")
    for i in range(t.rm):
        lines += [f"mn = max(m{i}, mt{i})",
                  "mz = max(mn, np.float32(-3.0e38))",
                  f"alpha = math.exp(m{i} - mz)",
                  f"m{i} = mn",
                  "acc = np.float32(0.0)"]
        for j in range(t.rn):
            lines += [f"p = math.exp(s{i}_{j} - mz)",  # masked scores are -inf: p = 0
                      "acc += p",
                      f"Ps[tx + {t.tx * j}, ty + {t.ty * i}] = p"]
        lines.append(f"l{i} = l{i} * alpha + acc")
        for j in range(spec.rd):
            lines.append(f"o{i}_{j} *= alpha")
    return lines


def _values(spec: AttnSpec) -> list[str]:
    t = spec.tile
    width = spec.rd * t.tx
    lines = [f"for c0 in range(0, {t.bn}, {spec.kc}):",
             "    if k0 + c0 < kend:",
             f"        for e in range(tid, {spec.kc * width}, {t.threads}):",
             f"            c = e // {width}",
             f"            dd = e % {width}",
             f"            ok = (k0 + c0 + c < s_len) & (dd < {spec.hdv})",
             "            Vs[c, dd] = v[kn, g, k0 + c0 + c, dd] if ok else np.float32(0.0)",
             "    cuda.syncthreads()",
             "    if k0 + c0 < kend:",
             f"        for cc in range({spec.kc}):"]
    lines += _register_product(t, "            ", ("pa", "Ps[c0 + cc"), ("vb", "Vs[cc"), spec.rd, "o")
    lines.append("    cuda.syncthreads()")
    return lines


def _finish(spec: AttnSpec) -> list[str]:
    t = spec.tile
    lines = _row_reduce(spec, "sum", "l")
    for i in range(t.rm):
        lines += [f"row = q0 + ty + {t.ty * i}",
                  "if row < t_len:",
                  f"    inv = np.float32(1.0) / max(l{i}, np.float32(1e-30))  # l = 0: nothing visible, o = 0"]
        for j in range(spec.rd):
            col = f"tx + {t.tx * j}"
            store = f"out[n, h, row, {col}] = o{i}_{j} * inv"
            if (j + 1) * t.tx > spec.hdv:
                lines += [f"    if {col} < {spec.hdv}:", f"        {store}"]
            else:
                lines.append(f"    {store}")
    return lines


def sdpa_kernel(spec: AttnSpec) -> Kernel:
    """``k(q, k, v, bias, out, scale, heads, groups[, window])``: q [B, H, T, hd], k [B, G, S, hd],
    v [B, G, S, hdv], out [B, H, T, hdv], bias broadcastable to [B, H, T, S] (read only
    when the kernel has one: pass any 4-D array otherwise); ``window`` only in a window spec."""
    t = spec.tile
    if spec.window and not spec.causal:
        raise AssertionError("a sliding window slides the causal mask")
    if t.tx > 32 or 32 % t.tx:
        raise AssertionError(f"TX={t.tx}: the threads of a row must share a warp")
    if spec.shared_bytes > SHARED_LIMIT:
        raise AssertionError(f"{spec.name} needs {spec.shared_bytes} bytes of shared memory")
    q_rows = spec.hd if spec.q_resident else spec.dc
    body = [
        f"Qs = cuda.shared.array(({q_rows}, {t.bm + 1}), np.float32)",
        f"Ks = cuda.shared.array(({spec.dc}, {t.bn + 1}), np.float32)",
        f"Vs = cuda.shared.array(({spec.kc}, {spec.rd * t.tx}), np.float32)",
        f"Ps = cuda.shared.array(({t.bn}, {t.bm + 1}), np.float32)",
    ]
    if spec.path == "shared":
        body.append(f"red = cuda.shared.array(({t.bm}, {t.tx}), np.float32)")
    body += [
        "tid = cuda.threadIdx.x",
        f"tx = tid % {t.tx}",
        f"ty = tid // {t.tx}",
        "t_len = q.shape[2]",
        "s_len = k.shape[2]",
        "nb0 = bias.shape[0] - 1",
        "nb1 = bias.shape[1] - 1",
        "nb2 = bias.shape[2] - 1",
        "nb3 = bias.shape[3] - 1",
        "nk0 = k.shape[0] - 1  # one key/value batch broadcasts over the queries",
        "bh = cuda.blockIdx.y",
        "n = bh // heads",
        "h = bh % heads",
        "g = h // (heads // groups)",
        "kn = min(n, nk0)",
        "q0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * " + str(t.bm) + "  # longest tiles first",
        f"kend = min(s_len, q0 + {t.bm})  # causal: no tile above the diagonal" if spec.causal else "kend = s_len",
    ]
    body.append("INF = np.float32(np.inf)")
    for i in range(t.rm):
        body += [f"m{i} = {NEG_INF}", f"l{i} = np.float32(0.0)"]
        body += [f"o{i}_{j} = np.float32(0.0)" for j in range(spec.rd)]
    if spec.q_resident:
        body += [f"for e in range(tid, {t.bm * spec.hd}, {t.threads}):",
                 f"    r = e // {spec.hd}",
                 f"    dd = e % {spec.hd}",
                 "    Qs[dd, r] = q[n, h, q0 + r, dd] if q0 + r < t_len else np.float32(0.0)",
                 "cuda.syncthreads()"]
    if spec.window:
        body.append(f"kbeg = max(q0 + 1 - window, 0) // {t.bn} * {t.bn}  # window: no tile left of every row's window")
    body.append(f"for k0 in range({'kbeg' if spec.window else 0}, kend, {t.bn}):")
    for part in (_scores(spec), _scale_and_mask(spec), _softmax_update(spec), ["cuda.syncthreads()"], _values(spec)):
        body += [f"    {line}" for line in part]
    body += _finish(spec)
    args = "q, k, v, bias, out, scale, heads, groups" + (", window" if spec.window else "")
    src = f"{jit_bounded(t.threads, spec.min_blocks)}\ndef {spec.name}({args}):\n" + "".join(f"    {x}\n" for x in body)
    return Kernel(spec.name, src, (A4, A4, A4, A4, A4, F32, I64, I64) + ((I64,) if spec.window else ()))
