"""F(4×4, 3×3)'s transforms, for winograd.py's kernel: 36 products for each 4×4 block of outputs, against
F(2×2, 3×3)'s 16 for a 2×2 block (2.25 multiplies an output, not 4), and 36/16 values of V and of the
product an output, not 16/4.

The points are 0, 1, −1, 1/2, −2 and ∞. The usual 0, ±1, ±2 leave errors about 2.5× larger in float32
(3.5e-6 against 1.4e-6 of the largest output on 256 channels, where the direct convolution's is 3e-7):
halves and doubles balance the transforms' magnitudes (Barabasz et al. 2020). BT, G and AT below are exact.

The kernel first computes d·B of every position, once an (image, channel): the input, zero-padded, goes
into row phases (input row 4u + pr − ph at row pr·hp + u, 4·wp columns), where the six columns of position
k = u·wp + tx of a patch row are p[4k:4k + 6], so each column of d·B is one loop over k with loads of stride 4
(which LLVM turns into shuffles). Element i of the patch's rows is then row phase i mod 4 at u = ty + i // 4:
over consecutive positions every (d·B)[i, b] is a run of consecutive floats, and each element of
V = Bᵀ·(d·B) is one loop with one store stream, as in F(2×2, 3×3). The output transform keeps the six sums
of a row of Aᵀ·M in registers, and its epilogue writes four columns a tile.
"""

from __future__ import annotations

from fractions import Fraction as F

from irc.backends.cpu.render.winograd_transforms import input_source, store_source

TILE = 4  # outputs a tile side
ALPHA = 6  # the patch's side: TILE + 3 − 1
ELEMENTS = ALPHA * ALPHA

BT = ((1, F(-3, 2), -2, F(3, 2), 1, 0),
      (0, -1, F(1, 2), F(5, 2), 1, 0),
      (0, 1, F(-5, 2), F(1, 2), 1, 0),
      (0, -2, -1, 2, 1, 0),
      (0, F(1, 2), -1, F(-1, 2), 1, 0),
      (0, 1, F(-3, 2), -2, F(3, 2), 1))
G = ((1, 0, 0),
     (F(1, 3), F(1, 3), F(1, 3)),
     (F(-1, 3), F(1, 3), F(-1, 3)),
     (F(-16, 15), F(-8, 15), F(-4, 15)),
     (F(1, 15), F(-2, 15), F(4, 15)),
     (0, 0, 1))
AT = ((1, 1, 1, 1, 1, 0),
      (0, 1, -1, F(1, 2), -2, 0),
      (0, 1, 1, F(1, 4), 4, 0),
      (0, 1, -1, F(1, 8), -8, 1))


def _const(c: F) -> str:
    """A coefficient's name in the generated code (a float32 local set once), by its value."""
    return "k" + str(abs(c)).replace("/", "_")


def _sum(terms: list[tuple[F | int, str]]) -> str:
    """Σ cᵢ·xᵢ as source: ±1 as a plain add or subtract, other coefficients by their float32 local."""
    out = ""
    for c, x in terms:
        c = F(c)
        if c == 0:
            continue
        term = x if abs(c) == 1 else f"{_const(c)} * {x}"
        out += ((" - " if c < 0 else " + ") + term) if out else (("-" if c < 0 else "") + term)
    return out


def _constants(*matrices: tuple[tuple[F | int, ...], ...]) -> str:
    """The float32 locals of every coefficient other than 0 and ±1 of the matrices (exact in float32)."""
    values = sorted({abs(F(c)) for m in matrices for row in m for c in row} - {0, 1})
    return "".join(f"    {_const(c)} = np.float32({float(c)!r})\n" for c in values)


def _row_loops() -> str:
    """(d·B) of every row-phase position k: r[b, k] = Σ_j B[j, b]·P[4k + j], one loop a column b."""
    out = []
    for b in range(ALPHA):
        terms = [(BT[b][j], f"p[U(4 * k + {j})]") for j in range(ALPHA)]
        out.append(f"    for k in range(kk):  # column {b} of d·B\n"
                   f"        r[U({b} * kk + k)] = {_sum(terms)}\n")
    return "".join(out)


def _input_loops() -> str:
    """V[a, b] = Σ_i Bᵀ[a, i]·(d·B)[i, b], one loop an element (one store stream: more kept LLVM from
    vectorising, through its run-time alias checks)."""
    out = []
    for a in range(ALPHA):
        for b in range(ALPHA):
            terms = [(BT[a][i], f"rf[U(r0 + {b} * kk + {(i % TILE)} * hw + {'wp + ' if i // TILE else ''}q)]")
                     for i in range(ALPHA)]
            out.append(f"            for q in range(q0, q1):  # V[{a}, {b}]\n"
                       f"                vf[U(o + {ALPHA * a + b} * em + q)] = {_sum(terms)}\n")
    return "".join(out)


def _output_loops() -> str:
    """For each row a of Aᵀ: s_j = (Aᵀ·M)[a, j] for the six columns, then Y[a, b] = Σ_j s_j·A[j, b]."""
    out = []
    for a in range(TILE):
        lines = [f"    for q in range(m):  # row {a} of Aᵀ·M, then row {a} of Y\n"]
        for j in range(ALPHA):
            terms = [(AT[a][i], f"mf[U(r0 + {ALPHA * i + j} * em + q)]") for i in range(ALPHA)]
            lines.append(f"        s{j} = {_sum(terms)}\n")
        for b in range(TILE):
            y = _sum([(AT[b][j], f"s{j}") for j in range(ALPHA)])
            lines.append(f"        ybuf[U({TILE * a + b} * ldm + q)] = {y}\n")
        out.append("".join(lines))
    return "".join(out)


# The kernel's preparation, one (image, channel) a task: the zero-padded input in row phases, then d·B
PLANES = """\
    planes = np.empty((nb, ci, 24 * hp * wp), np.float32)  # (d·B)[i, b] of each position (winograd_f43.py)
    for t in prange(nb * ci):
        winograd_f43_rows(x, planes, t, ph, pw, hp, wp)
"""

ROWS = """\
{jit}
def winograd_f43_rows(x, planes, t, ph, pw, hp, wp):
    \"\"\"d·B of image t // ci, channel t % ci, for every grid position of every row phase: (d·B)[i, b] of
    position q = ty·wp + tx at planes[n, c, b·kk + (i mod 4)·hw + (i // 4)·wp + q] (hw = hp·wp, kk = 4·hw).
    The input goes first into p, zero-padded and in row phases (row 4u + pr − ph of the input is row
    pr·hp + u, of 4·wp columns): each patch row's six columns of position k are then p[4k:4k + 6].\"\"\"
    nb, ci, hi, wi = x.shape
    n = t // ci
    c = t % ci
    wq = 4 * wp
    hw = hp * wp
    kk = 4 * hw
    p = np.empty(4 * hp * wq + 8, np.float32)  # 8 more: position kk − 1 (none) reads past the last row
    p[4 * hp * wq:] = np.float32(0.0)
    for pr in range(4):
        for u in range(hp):
            y = 4 * u + pr - ph
            row = (pr * hp + u) * wq
            if y < 0 or y >= hi:
                p[row:row + wq] = np.float32(0.0)
                continue
            src = x[n, c, y]
            lo = min(pw, wq)
            top = min(wq, wi + pw)
            p[row:row + lo] = np.float32(0.0)
            for v in range(lo, top):
                p[np.uint64(row + v)] = src[np.uint64(v - pw)]
            p[row + top:row + wq] = np.float32(0.0)
    r = planes[n, c]
    U = np.uint64
""" + _constants(BT) + _row_loops()

INPUT = input_source("winograd_f43", 36, "winograd_f43_rows' d·B", """\
    ci = planes.shape[1]
    kk = planes.shape[2] // 6
    hw = kk // 4
    rf = planes.reshape(-1)
""" + _constants(BT), """\
            r0 = (n * ci + c) * 6 * kk
""", _input_loops())

DEVICE = {"winograd_f43_rows": ROWS}  # device functions beyond the three every variant has

OUTPUT = """\
{jit}
def winograd_f43_output(mf, em, ldm, r, m, sbuf, ybuf):
    \"\"\"Y = Aᵀ·M·A of product row r (one output channel) over its m columns into ybuf: Y[a, b] at
    ybuf[(4a + b)·ldm:] (sbuf, F(2×2, 3×3)'s scratch, is not needed).\"\"\"
    U = np.uint64
    r0 = r * ldm
""" + _constants(AT) + _output_loops()

STORE = store_source(TILE, "winograd_f43")

# U = G·g·Gᵀ for every (out, in) pair, in float64, as [36, out, in] (element 6ξ + ν)
FILTER = f'''\
def winograd_f43_filter(w, co, ci):
    """F(4×4, 3×3)'s transformed filter of a 3×3 weight (any shape holding [out, in, 3, 3]) as [36, out, in]."""
    g = np.array({[[float(c) for c in row] for row in G]!r})
    k = w.reshape(co, ci, 3, 3).astype(np.float64)
    u = np.einsum("xa,oiab,yb->xyoi", g, k, g)
    return np.ascontiguousarray(u.reshape(36, co, ci).astype(np.float32))
'''
