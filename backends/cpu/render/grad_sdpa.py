"""``sdpa_grad``: the flash-style backward of the fused attention core (irc/ops/grad_attention.py).

Each task owns one (key/value batch, key/value head): it zeroes that head's dk and dv, then walks its query
heads (the GQA group) and their 64-row query tiles. Per query tile, a first sweep over the key tiles
recomputes each row's softmax statistics (running maximum and denominator, as the forward's online
softmax: L = max + log Σ exp), and ``D = Σ dy·o`` per row; a second sweep recomputes each 128-key score
tile, ``P = exp(s − L)``, and makes four single-threaded BLAS calls on contiguous tiles — ``dv += Pᵀ·dy``,
``dP = dy·vᵀ``, then with ``dS = scale·P·(dP − D)``, ``dq += dS·k`` and ``dk += dSᵀ·q`` — so nothing larger
than a tile (32 KiB) is ever held: no T×S buffer. Causal attention stops each query tile at its last
visible key (and a sliding window starts at its first), masking element-wise only the tiles that cross
an edge. A key/value head serves its whole group (and every query batch when there is one key/value
batch), so no two tasks write the same gradient.
"""

from __future__ import annotations

from irc.backends.common.kernel import A4, F32, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import THREADS
from irc.backends.literals import f32_literal

JIT = jit(fastmath=True)
TILE_Q = 64
TILE_K = 128

SDPA_GRAD = """\
{jit}
def k_sdpa_grad(q, k, v, o, dy, dq, dk, dv, scale, causal, window, parts):
    nb, nh, nt, hd = q.shape
    nkb, ng, ns = k.shape[0], k.shape[1], k.shape[2]
    hv = v.shape[3]
    group = nh // ng
    nqt = (nt + {bq} - 1) // {bq}
    for task in prange(nkb * ng):
        kn = task // ng
        g = task % ng
        for j in range(ns):
            for d in range(hd):
                dk[kn, g, j, d] = np.float32(0.0)
            for d in range(hv):
                dv[kn, g, j, d] = np.float32(0.0)
        sbuf = np.empty({bq} * {bk}, np.float32)
        dpbuf = np.empty({bq} * {bk}, np.float32)
        tbuf = np.empty({bk} * max(hd, hv), np.float32)
        dqacc = np.empty(({bq}, hd), np.float32)
        lrow = np.empty({bq}, np.float32)
        drow = np.empty({bq}, np.float32)
        n0 = kn if nkb == nb else 0
        n1 = kn + 1 if nkb == nb else nb
        for n in range(n0, n1):
            for h in range(g * group, (g + 1) * group):
                for qt in range(nqt):
                    i0 = qt * {bq}
                    i1 = min(i0 + {bq}, nt)
                    m = i1 - i0
                    qm = q[n, h, i0:i1]
                    dom = dy[n, h, i0:i1]
                    jend = min(ns, i1) if causal else ns  # keys past the tile's last query are all hidden
                    jstart = max(i0 - window + 1, 0) if causal and window > 0 else 0
                    for r in range(m):
                        t = np.float32(0.0)
                        for d in range(hv):
                            t += dy[n, h, i0 + r, d] * o[n, h, i0 + r, d]
                        drow[r] = t
                        lrow[r] = np.float32(-np.inf)
                        for d in range(hd):
                            dqacc[r, d] = np.float32(0.0)
                    # the row statistics again: running maximum (in lrow) and denominator (in ll)
                    ll = np.zeros({bq}, np.float32)
                    for j0 in range(jstart, jend, {bk}):
                        j1 = min(j0 + {bk}, jend)
                        kb = j1 - j0
                        s = sbuf[:m * kb].reshape(m, kb)
                        np.dot(qm, k[kn, g, j0:j1].T, s)
                        sdpa_grad_mask(s, scale, i0, j0, causal, window)
                        for r in range(m):
                            top = lrow[r]
                            for j in range(kb):
                                top = s[r, j] if s[r, j] > top else top
                            if top == np.float32(-np.inf):
                                continue
                            total = np.float32(0.0)
                            for j in range(kb):
                                total += fexp(s[r, j] - top)
                            ll[r] = ll[r] * fexp(lrow[r] - top) + total
                            lrow[r] = top
                    for r in range(m):
                        lrow[r] = lrow[r] + np.float32(np.log(ll[r])) if ll[r] > np.float32(0.0) else \\
                            np.float32(np.inf)  # a row with every key hidden: P = 0
                    for j0 in range(jstart, jend, {bk}):
                        j1 = min(j0 + {bk}, jend)
                        kb = j1 - j0
                        s = sbuf[:m * kb].reshape(m, kb)
                        np.dot(qm, k[kn, g, j0:j1].T, s)
                        sdpa_grad_mask(s, scale, i0, j0, causal, window)
                        for r in range(m):
                            for j in range(kb):
                                s[r, j] = fexp(s[r, j] - lrow[r])  # P (exp(-inf) = 0 where hidden)
                        t = tbuf[:kb * hv].reshape(kb, hv)
                        np.dot(s.T, dom, t)
                        dvt = dv[kn, g, j0:j1]
                        for j in range(kb):
                            for d in range(hv):
                                dvt[j, d] += t[j, d]
                        dp = dpbuf[:m * kb].reshape(m, kb)
                        np.dot(dom, v[kn, g, j0:j1].T, dp)
                        for r in range(m):
                            for j in range(kb):
                                s[r, j] = s[r, j] * (dp[r, j] - drow[r]) * scale  # dS, the scale folded in
                        dqacc[:m] += np.dot(s, k[kn, g, j0:j1])
                        t = tbuf[:kb * hd].reshape(kb, hd)
                        np.dot(s.T, qm, t)
                        dkt = dk[kn, g, j0:j1]
                        for j in range(kb):
                            for d in range(hd):
                                dkt[j, d] += t[j, d]
                    for r in range(m):
                        for d in range(hd):
                            dq[n, h, i0 + r, d] = dqacc[r, d]
"""

MASK = """\
{jit}
def sdpa_grad_mask(s, scale, i0, j0, causal, window):
    # scale a score tile, hiding key j > query i (and j <= i - window) as -inf where the tile crosses an edge
    m, kb = s.shape
    for r in range(m):
        i = i0 + r
        for j in range(kb):
            key = j0 + j
            if causal and (key > i or (window > 0 and key <= i - window)):
                s[r, j] = np.float32(-np.inf)
            else:
                s[r, j] = s[r, j] * scale
"""


def render_sdpa_grad(ctx: NodeCtx) -> None:
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    ctx.device("fexp")
    ctx.parts.device("sdpa_grad_mask", MASK.format(jit=DEVICE_JIT))
    k = ctx.kernel(Kernel("k_sdpa_grad", SDPA_GRAD.format(jit=JIT, bq=TILE_Q, bk=TILE_K),
                          (A4,) * 8 + (F32, I64, I64, I64)))
    dq, dk, dv = ctx.alloc(0), ctx.alloc(1), ctx.alloc(2)
    causal = bool(ctx.attr("causal", False))
    window = ctx.attr("window")
    ctx.emit(f"{k}({', '.join(ctx.args)}, {dq}, {dk}, {dv}, {f32_literal(ctx.attr('scale'))}, {int(causal)}, "
             f"{int(window) if causal and window is not None else 0}, {THREADS})")


RENDERERS = {"sdpa_grad": render_sdpa_grad}
