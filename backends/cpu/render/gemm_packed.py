"""Products against a weight packed once per weights dict, in AVX-512 register blocks.

OpenBLAS packs both operands again on every call. For ResNet's last stage at B = 1 (a [512, 4608]
weight times a [4608, 49] panel) that is a pass over 9.4 MB of weight per convolution, and the product
ran at ~170 GFLOP/s on 2 threads. Here the weight is laid out once (``gemm_pack6``, a derived weight) as
strips of 6 output rows, each [K, 6]: the strip a register block reads is one sequential stream, the
order the hardware prefetcher follows best, since at B = 1 the weight comes from L3 on every run.
The register blocks are the fused attention's value blocks (:mod:`.sdpa_simd`'s ``simd_pv``): 6 rows ×
64 columns of accumulators (24 zmm registers), one vector load per 16 columns and one broadcast per row
each step of K. Measured on ResNet-18's [512, 4608] × [4608, 49] with its weights cold (8 of them in
turn), 2 threads: 0.91 ms against 1.23–1.33 ms for OpenBLAS on the same split, though the panel is
padded from 49 to 64 columns.
"""

from __future__ import annotations

from irc.backends.common.kernel import ModuleParts
from irc.backends.cpu.render.mathfns import DEVICE_JIT

STRIP = 6  # output rows of a register block: 6 × 4 vectors of accumulators fill 24 of AVX-512's registers
PANEL_FLOATS = 262144  # 1 MiB: the share of the panel one block of K keeps in L2 (2 MiB a core here)

PACK6 = '''\
def gemm_pack6(w, co, kk):
    """``w`` as [n, co, kk] (n = 1: a plain [co, kk]), each [co, kk] in strips of 6 rows, each strip [kk, 6],
    flat; the last strip's missing rows are zeros."""
    strips = (co + 5) // 6
    w = w.reshape(-1, co, kk)
    p = np.zeros((w.shape[0], strips * 6, kk), np.float32)
    p[:, :co] = w
    return np.ascontiguousarray(p.reshape(-1, strips, 6, kk).transpose(0, 1, 3, 2)).reshape(-1)
'''

STRIPS = f'''\
{DEVICE_JIT}
def gemm_strips(ap, ao, sk, s0, s1, kn, x, xo, ldx, width, out, oo, ldo, add):
    """out[oo + (6·(s − s0) + r)·ldo + c] (+)= Σ_k<kn ap[ao + (s·sk + k)·6 + r] · x[xo + k·ldx + c] for
    strips [s0, s1) of sk rows of K each, r < 6, c < width (a multiple of 16): the sum is written, or with
    ``add`` added to out. K goes in blocks whose share of x stays in L2 ({PANEL_FLOATS} floats), then strip
    after strip, then 64 columns at a time (16 for the last ones)."""
    kc = min(kn, max(128, {PANEL_FLOATS} // width))
    for k0 in range(0, kn, kc):
        kl = min(kc, kn - k0)
        xk = xo + k0 * ldx
        fresh = k0 == 0 and not add
        for s in range(s0, s1):
            a = ao + (s * sk + k0) * 6
            o = oo + (s - s0) * 6 * ldo
            c = 0
            while c + 64 <= width:
                if fresh:
                    gemm_pv6x64_new(ap, a, 6, x, xk + c, ldx, out, o + c, ldo, kl)
                else:
                    gemm_pv6x64(ap, a, 6, x, xk + c, ldx, out, o + c, ldo, kl)
                c += 64
            while c < width:
                if fresh:
                    gemm_pv6x16_new(ap, a, 6, x, xk + c, ldx, out, o + c, ldo, kl)
                else:
                    gemm_pv6x16(ap, a, 6, x, xk + c, ldx, out, o + c, ldo, kl)
                c += 16
'''

# the first block of K writes its sums (``_new``: no pass to zero the product first), later ones add theirs
AHEAD = 32  # steps of K the weight is prefetched ahead (768 bytes of a strip)
BLOCKS = {f"gemm_pv6x{w}{new}": (w, fresh) for w in (64, 16) for new, fresh in (("", False), ("_new", True))}


def strips(co: int) -> int:
    """The strips of a packed weight of ``co`` output rows."""
    return (co + STRIP - 1) // STRIP


def padded(columns: int) -> int:
    """The panel's row stride for ``columns`` columns: a whole number of 16-float vectors."""
    return (columns + 15) // 16 * 16


def use(parts: ModuleParts) -> str:
    """Register gemm_strips with the blocks it calls (callees first) and the packing helper; its name."""
    from irc.backends.cpu.render import sdpa_simd

    for name, (width, fresh) in BLOCKS.items():
        sdpa_simd.use_pv(parts, name, 6, width, fresh=fresh, ahead=AHEAD)
    parts.helper("gemm_pack6", PACK6)
    return parts.device("gemm_strips", STRIPS)
