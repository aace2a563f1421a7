"""What the tap-sum convolution needs beyond np.dot: a strided single-precision GEMM and a kept work buffer.

``blas_sgemm`` is the BLAS call numba's ``np.dot`` makes (numba's ``numba_xxgemm`` helper, SciPy's
OpenBLAS), with the leading dimensions, offsets and ``beta`` that ``np.dot`` does not expose: a GEMM can
then read a window of a larger matrix in place (one tap's view of a phase plane, one tap's columns of the
weight) and add into its result, so a convolution needs no im2col copy.

``conv_work`` keeps one float32 buffer per generated module for the convolution kernels' temporaries
(phase planes, product tiles). Allocating them on every call costs more than the copies themselves: the
freed blocks go back to the system and come back as page faults on the next call. Kernels hold the GIL
(no ``nogil``), so two calls never use the buffer at once; its contents never reach a result unwritten.
"""

from __future__ import annotations

from irc.backends.cpu.aligned import EMPTY64
from irc.backends.cpu.render.context import NodeCtx

SGEMM = '''\
@intrinsic
def blas_sgemm(typingctx, ta, tb, m, n, k, a, a0, lda, b, b0, ldb, beta, c, c0, ldc):
    """Row-major c[c0:] (m × n, rows ldc apart) = beta·c + op(a[a0:]) · op(b[b0:]) on flat float32 arrays:
    op(a) is m × k (rows lda apart), or stored k × m and transposed when ta != 0; op(b) is k × n (rows ldb
    apart), or stored n × k and transposed when tb != 0."""
    from numba.core import cgutils
    from numba.np.arrayobj import make_array
    from numba.np.linalg import ensure_blas

    intp, f32 = numba_types.intp, numba_types.float32
    sig = numba_types.void(ta, tb, m, n, k, a, a0, lda, b, b0, ldb, beta, c, c0, ldc)

    def codegen(context, builder, signature, args):
        ensure_blas()
        i8 = llvm_ir.IntType(8)
        vp = i8.as_pointer()
        ll_intp = context.get_value_type(intp)
        fnty = llvm_ir.FunctionType(llvm_ir.IntType(32), [i8, i8, i8, ll_intp, ll_intp, ll_intp, vp, vp, ll_intp,
                                                          vp, ll_intp, vp, vp, ll_intp])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")

        def num(i, ty=intp):
            return context.cast(builder, args[i], signature.args[i], ty)

        def at(i, off):
            data = make_array(signature.args[i])(context, builder, args[i]).data
            return builder.bitcast(builder.gep(data, [num(off)]), vp)

        def trans(i):
            flag = builder.icmp_signed("!=", num(i), context.get_constant(intp, 0))
            return builder.select(flag, llvm_ir.Constant(i8, ord("t")), llvm_ir.Constant(i8, ord("n")))

        alpha = cgutils.alloca_once_value(builder, context.get_constant(f32, 1.0))
        beta_slot = cgutils.alloca_once_value(builder, num(11, f32))
        # row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B goes first, the sizes swap
        builder.call(fn, (llvm_ir.Constant(i8, ord("s")), trans(1), trans(0), num(3), num(2), num(4),
                          builder.bitcast(alpha, vp), at(8, 9), num(10), at(5, 6), num(7),
                          builder.bitcast(beta_slot, vp), at(12, 13), num(14)))
        return context.get_dummy_value()
    return sig, codegen
'''

WORK = '''\
def conv_work(size):
    """The convolution kernels' work buffer, at least ``size`` float32 elements, kept between runs."""
    buf = getattr(conv_work, "buf", None)
    if buf is None or buf.size < size:
        buf = conv_work.buf = empty64((max(int(size), 1),))  # on a cache line: vectors run through it
    return buf
'''


def sgemm(ctx: NodeCtx) -> str:
    """Register ``blas_sgemm`` in the module; return its name."""
    return ctx.parts.device("blas_sgemm", SGEMM)


def work(ctx: NodeCtx, size: str) -> str:
    """The driver's expression for a work buffer of ``size`` (an expression) elements."""
    ctx.helper("empty64", EMPTY64)
    ctx.helper("conv_work", WORK)
    return f"conv_work({size})"
