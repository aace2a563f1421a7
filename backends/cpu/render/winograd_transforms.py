"""F(2×2, 3×3)'s input and output transforms as loops that vectorise, for winograd.py's kernel.

Written tile by tile, each transform read or wrote 16 values one stride apart per tile, in scalar code:
at B = 8 they took half of ResNet-18's 64-channel convolution (1.2 and 1.1 ms of 4.9). Here each of the 16
values (and each sum of the output transform) is one loop over consecutive tiles, with one store stream
and at most four load streams, which the compiler turns into AVX-512 code.

The input is held as its four 2×2 phase planes (conv_phases with stride 2): tile (ty, tx) reads input
(2ty + i − ph, 2tx + j − pw), which is phase plane (i mod 2, j mod 2) at (ty + i // 2, tx + j // 2). Over a
grid of wp = tiles-per-row + 1 positions per row (ty·wp + tx, the last of each row not a tile), every patch
element of consecutive positions is then a run of consecutive elements of one plane: element (i, j) of
position g is plane[g + (i // 2)·wp + j // 2]. The products' columns are these grid positions, image after
image; the output transform skips each row's extra one.
"""

from __future__ import annotations

BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))  # Bᵀ of F(2×2, 3×3): V = Bᵀ·d·B


def _terms(coefficients: list[tuple[int, str]]) -> str:
    """``± a ± b …`` as Python source, the first term without a leading plus."""
    out = ""
    for sign, term in coefficients:
        out += (" - " if sign < 0 else " + ") + term if out else ("-" if sign < 0 else "") + term
    return out


def _input_loops() -> str:
    lines = []
    for e in range(16):
        a, b = divmod(e, 4)
        terms = []
        for i in range(4):
            for j in range(4):
                sign = BT[a][i] * BT[b][j]
                if sign:
                    shift = " + ".join(s for s in (("wp" if i // 2 else ""), ("1" if j // 2 else "")) if s)
                    base = f"p{(i % 2) * 2 + j % 2}"
                    terms.append((sign, f"pf[U({base} + {shift + ' + ' if shift else ''}q)]"))
        lines.append(f"            for q in range(q0, q1):  # element {e}: row {a} of Bᵀ·d, column {b} of ·B\n"
                     f"                vf[U(o + {e} * em + q)] = {_terms(terms)}\n")
    return "".join(lines)


def input_source(prefix: str, elements: int, operand: str, setup: str, bases: str, loops: str) -> str:
    """The input transform of a variant as source (``{jit}`` left to fill): over channels [c0, c1), one
    image's run of grid positions at a time, ``bases`` (source lines) locating the image's ``operand`` (a
    phrase for the docstring), then the variant's element ``loops``; ``setup``: its lines before them."""
    return f"""\
{{jit}}
def {prefix}_input(planes, vf, em, ld, c0, c1, t0, t1, g, wp):
    \"\"\"V = Bᵀ·d·B of channels [c0, c1) for grid positions [t0, t1) of the batch (g per image) into vf:
    element e as [in, t1 − t0] at vf[e·em:], rows ld apart (the columns from t1 − t0 to ld are zeros);
    d from {operand}.\"\"\"
    m = t1 - t0
    U = np.uint64
{setup}\
    for c in range(c0, c1):
        t = t0
        while t < t1:  # one image's run of positions
            n = t // g
            q0 = t - n * g
            q1 = min(g, q0 + t1 - t)
            o = c * ld + t - t0 - q0  # position q of this image is column o + q of each element's row c
{bases}\
{loops}\
            t += q1 - q0
        for e in range({elements} if ld > m else 0):
            vf[e * em + c * ld + m:e * em + (c + 1) * ld] = np.float32(0.0)
"""


INPUT = input_source("winograd", 16, "the 2×2 phase planes (conv_phases)", """\
    ci = planes.shape[2]
    plane = planes.shape[3]
    pf = planes.reshape(-1)
""", """\
            p0 = (n * 4 * ci + c) * plane  # the planes of phases (0, 0), (0, 1), (1, 0), (1, 1)
            p1 = p0 + ci * plane
            p2 = p1 + ci * plane
            p3 = p2 + ci * plane
""", _input_loops())

# Aᵀ·M: s[a, j] = Σ_i Aᵀ[a, i]·M[i, j], then Y[a, b] = Σ_j s[a, j]·A[j, b], Aᵀ = ((1, 1, 1, 0), (0, 1, −1, −1))
OUTPUT = """\
{jit}
def winograd_output(mf, em, ldm, r, m, sbuf, ybuf):
    \"\"\"Y = Aᵀ·M·A of product row r (one output channel) over its m columns into ybuf: Y[a, b] at
    ybuf[(2a + b)·ldm:], through the row sums s[a, j] at sbuf[(4a + j)·ldm:].\"\"\"
    U = np.uint64
    for j in range(4):
        i0 = j * em + r * ldm  # element (0, j) of the product row; (i, j) is i·4·em further
        e4 = i0 + 4 * em
        e8 = i0 + 8 * em
        e12 = i0 + 12 * em
        s0 = j * ldm
        s1 = (4 + j) * ldm
        for q in range(m):
            sbuf[U(s0 + q)] = mf[U(i0 + q)] + mf[U(e4 + q)] + mf[U(e8 + q)]
        for q in range(m):
            sbuf[U(s1 + q)] = mf[U(e4 + q)] - mf[U(e8 + q)] - mf[U(e12 + q)]
    for a in range(2):
        s = 4 * a * ldm
        y0 = 2 * a * ldm
        y1 = y0 + ldm
        for q in range(m):
            ybuf[U(y0 + q)] = sbuf[U(s + q)] + sbuf[U(s + ldm + q)] + sbuf[U(s + 2 * ldm + q)]
        for q in range(m):
            ybuf[U(y1 + q)] = sbuf[U(s + ldm + q)] - sbuf[U(s + 2 * ldm + q)] - sbuf[U(s + 3 * ldm + q)]
"""

def store_source(m: int, prefix: str) -> str:
    """The epilogue of F(m×m, 3×3) as source (``{jit}``, ``{act}`` and ``{expr}`` left to fill): each tile's
    m×m outputs (the last row and column of tiles may be cut), plus the bias, the residual and the
    activation, written m output columns per tile."""
    def columns(res: str) -> str:
        return "".join(f"                    v = ybuf[U(y0 + {b} * ldm + tx)] + bo{res.format(b=b)}\n"
                       f"                    dst[U(d + {m} * tx + {b})] = {{expr}}\n" for b in range(m))

    return f"""\
{{jit}}
def {prefix}_store_{{act}}(ybuf, ldm, t0, t1, g, wp, tx_n, bo, src, dst, has_res, wo, ho):
    \"\"\"dst[{m}ty + a, {m}tx + b] = act(Y[a, b] of the tile + bo (+ src[…])) for the grid positions [t0, t1) of
    one image (g of them), Y[a, b] at ybuf[({m}a + b)·ldm:] ({prefix}_output), dst and src one output
    channel's [ho·wo].\"\"\"
    U = np.uint64
    t = t0
    while t < t1:  # one row of tiles at a time
        ty = t // wp
        a0 = t - ty * wp
        a1 = min(wp, a0 + t1 - t)
        e = min(a1, tx_n)  # past the last tile of the row in the run (position tx_n is none)
        full = min(e, wo // {m})  # tiles whose {m} columns are all outputs
        col = t - t0 - a0  # ybuf column of tile (ty, 0)
        for a in range(min({m}, ho - {m} * ty)):
            d = ({m} * ty + a) * wo
            y0 = {m} * a * ldm + col
            if has_res:
                for tx in range(a0, full):
{columns(f" + src[U(d + {m} * tx + {{b}})]")}\
            else:
                for tx in range(a0, full):
{columns("")}\
            for tx in range(max(a0, full), e):  # a cut tile: its columns inside the map
                for b in range(min({m}, wo - {m} * tx)):
                    v = ybuf[U(y0 + b * ldm + tx)] + bo
                    if has_res:
                        v += src[U(d + {m} * tx + b)]
                    dst[U(d + {m} * tx + b)] = {{expr}}
        t += a1 - a0
"""


STORE = store_source(2, "winograd")
