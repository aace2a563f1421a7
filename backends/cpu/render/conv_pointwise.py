"""Strided 1×1 convolutions (ResNet's downsamples): gather the positions the stride keeps, then one BLAS product
per image straight into the NCHW output.

A 1×1 of stride s reads one input element in s × s. The input is first gathered, image by image and channel by
channel, into a dense [C, ho·wo] panel: at stride 2 a quarter of the input, where the tap sum (conv_taps.py)
copies all of its s × s phase planes to use one. An image's block of the NCHW output, [out, ho·wo], is then
exactly the product weight [out, C] × panel [C, ho·wo]: one single-threaded BLAS call writes it in place (no
product tile, no copy back), and the epilogue (bias, residual, activation) runs over that block while it is
still in cache. Tasks are (image, block of output channels): one image makes two blocks, a batch of two or
more one block an image, whatever the thread count (so the result is the same bits on any). Two tasks, not
four, for one image: on 2 threads, interleaved in one process through ``CompiledGraph.run``, four blocks of
ResNet-18's downsamples ran 1.25×, 1.04× and 1.05× slower at B = 1 (64, 128, 256 channels in) and 1.07–1.13×
at B = 2: BLAS on a 32-row block of a 64-deep panel is the weak spot. A wider machine runs one image's
strided 1×1 (12.8 MFLOP in ResNet) on two of its cores.

Measured on two threads of this project's AMD EPYC (Zen 5), interleaved in one process against the im2col panel
of conv_cols.py that served these before (its register blocks on a packed weight), whole calls through
``CompiledGraph.run``, the faster of 10 rounds each: ResNet-18's 64→128 at 56×56 0.94× at B = 1 (its one
loss: 32-channel BLAS calls on a 64-deep panel) and 1.32× at B = 8; 128→256 at 28×28 1.12× and 1.46×;
256→512 at 14×14 1.33× and 1.10×. In the whole ResNet-18 the three downsamples are too small a share to
show: paired rounds gave 1.00× at B = 1 (30 rounds) and B = 8 (20 rounds).
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, A4, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render.context import NodeCtx

JIT = jit()
TASKS = 2  # tasks the products of a batch make at least (see the module's docstring)

POINTWISE = """\
{jit}
def {name}(x, w2, b, res, out, work, sh, sw, ph, pw, has_res, parts):
    nb, ci, hi, wi = x.shape
    co, ho, wo = out.shape[1], out.shape[2], out.shape[3]
    npix = ho * wo
    if work.size < nb * ci * npix or w2.size < co * ci:
        raise ValueError("conv work buffer too small")
    xf = x.reshape(-1)
    wf = w2.reshape(-1)
    of = out.reshape(-1)
    rf = res.reshape(-1)
    U = np.uint64
    zero = np.float32(0.0)
    # the panel: plane (n, c) holds input (i·sh − ph, j·sw − pw) at row i, column j (zero in the padding)
    j0 = min(wo, (pw + sw - 1) // sw)  # the first column inside the input, and the end of those inside
    j1 = max(j0, min(wo, (wi - 1 + pw) // sw + 1))
    for t in prange(nb * ci):
        d0 = t * npix
        s0 = t * hi * wi
        for i in range(ho):
            d = d0 + i * wo
            r = i * sh - ph
            if r < 0 or r >= hi:
                for j in range(wo):
                    work[U(d + j)] = zero
                continue
            s = s0 + r * wi - pw
            for j in range(j0):
                work[U(d + j)] = zero
            if sw == 2:  # ResNet's stride, a constant: the loop vectorises (even lanes of two loads)
                for j in range(j0, j1):
                    work[U(d + j)] = xf[U(s + 2 * j)]
            else:
                for j in range(j0, j1):
                    work[U(d + j)] = xf[U(s + j * sw)]
            for j in range(j1, wo):
                work[U(d + j)] = zero
    # numba resolves its BLAS pointer on first use, taking the GIL: do it here, on the thread that holds it
    blas_sgemm(0, 0, 1, 1, 0, wf, 0, 1, wf, 0, 1, np.float32(1.0), work, 0, 1)
    # blocks of output channels an image: at least {tasks} tasks in all, blocks of at least 16 channels. The split
    # follows the shapes only, never the thread count: BLAS sums a row of the product in an order that depends
    # on where its block starts, so a split by threads would change the last bits with the thread count.
    split = max(1, min(({tasks} + nb - 1) // nb, co // 16))
    for t in prange(nb * split):
        n = t // split
        o0 = (t % split) * co // split
        o1 = (t % split + 1) * co // split
        if o1 == o0:
            continue
        blas_sgemm(0, 0, o1 - o0, npix, ci, wf, o0 * ci, ci, work, n * ci * npix, npix, zero, of,
                   (n * co + o0) * npix, npix)
        for o in range(o0, o1):
            bo = b[o]
            d = (n * co + o) * npix
            if has_res:
                for q in range(npix):
                    v = of[U(d + q)] + bo + rf[U(d + q)]
                    of[U(d + q)] = {expr}
            else:
                for q in range(npix):
                    v = of[U(d + q)] + bo
                    of[U(d + q)] = {expr}
"""


def applies(kernel: tuple[int, int], stride: tuple[int, int]) -> bool:
    """A 1×1 of a stride above one (without groups: the caller's condition)."""
    return kernel == (1, 1) and stride != (1, 1)


def work_size(x_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> str:
    """The driver's expression for the panel: every image's gathered channels."""
    return str(x_shape[0] * x_shape[1] * out_shape[2] * out_shape[3])


def conv_pointwise_kernel(ctx: NodeCtx, act_name: str) -> str:
    """``k_conv_pointwise_<act>``: the strided 1×1 with its epilogue."""
    from irc.backends.cpu.render.activations import act
    from irc.backends.cpu.render.conv_blas import sgemm

    sgemm(ctx)
    name = f"k_conv_pointwise_{act_name}"
    src = POINTWISE.format(jit=JIT, name=name, expr=act(ctx.parts, act_name), tasks=TASKS)
    return ctx.kernel(Kernel(name, src, (A4, A2, A1, A3, A4, A1) + (I64,) * 6))
