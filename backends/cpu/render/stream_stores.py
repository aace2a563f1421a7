"""Non-temporal (streaming) stores for outputs far larger than the caches, as Numba intrinsics.

An ordinary store first reads its cache line from memory (read for ownership), so a kernel that
reads x and writes y moves three lines per line of y; a streaming store writes the line without
reading it, so two. On a 256 MiB LayerNorm (65,536 × 1,024, 2 threads, this machine) that was 24.1
GB/s against 26.1 with a fence after every row and 27.6 with a fence per thread, against 28.0 for
a plain copy. The line bypasses the caches, so a reader soon after fetches it from memory: kernels
take this path only for outputs of at least ``STREAM_BYTES`` (:func:`streams`), which would have
left the caches before their reader came anyway.

Streaming stores are weakly ordered: every thread ends its share with ``stream_fence`` (x86's
sfence) before the parallel loop joins. Elsewhere than x86 both are ordinary stores and no fence.
"""

from __future__ import annotations

from irc.backends.common.kernel import ModuleParts

STREAM_BYTES = 32 << 20  # outputs at least this large stream: 16x a core's L2 here, beyond any L3 share

STREAM_AFFINE = '''\
def _stream_affine(typingctx, x, xo, g, b, out, oo, d, shift, scale):
    """out[oo + j] = (x[xo + j] − shift)·scale·g[j] + b[j] for j < d: the lines of out wholly written
    by streaming stores (64-byte aligned vectors of 16), the few values before and after by plain ones."""
    def codegen(context, builder, sig, args):
        from numba.core import cgutils
        import llvmlite.binding

        i64, i32 = llvm_ir.IntType(64), llvm_ir.IntType(32)
        vec = llvm_ir.VectorType(llvm_ir.FloatType(), 16)
        xp, gp, bp, op = (vec_ptr(context, builder, sig.args[a], args[a]) for a in (0, 2, 3, 4))
        xo_, oo_, d_, shift_, scale_ = (args[a] for a in (1, 5, 6, 7, 8))
        streaming = "x86" in llvmlite.binding.get_default_triple()

        def value(load, j, shift, scale):
            v = builder.fmul(builder.fsub(load(xp, builder.add(xo_, j)), shift), scale)
            return builder.fadd(builder.fmul(v, load(gp, j)), load(bp, j))

        def scalar_at(p, j):
            return builder.load(builder.gep(p, [j]))

        def vector_at(p, j):
            return builder.load(builder.bitcast(builder.gep(p, [j]), vec.as_pointer()), align=4)

        def splat(s):
            one = builder.insert_element(llvm_ir.Constant(vec, llvm_ir.Undefined), s, llvm_ir.Constant(i32, 0))
            return builder.shuffle_vector(one, llvm_ir.Constant(vec, llvm_ir.Undefined),
                                          llvm_ir.Constant(llvm_ir.VectorType(i32, 16), [0] * 16))

        # floats before out[oo + j] is 64-byte aligned (out is 4-byte aligned), at most d
        address = builder.ptrtoint(builder.gep(op, [oo_]), i64)
        lead = builder.lshr(builder.and_(builder.sub(llvm_ir.Constant(i64, 0), address), llvm_ir.Constant(i64, 63)),
                            llvm_ir.Constant(i64, 2))
        lead = builder.select(builder.icmp_signed("<", lead, d_), lead, d_)
        with cgutils.for_range(builder, lead) as loop:
            builder.store(value(scalar_at, loop.index, shift_, scale_), builder.gep(op, [builder.add(oo_, loop.index)]))
        lines = builder.sdiv(builder.sub(d_, lead), llvm_ir.Constant(i64, 16))
        shift, scale = splat(shift_), splat(scale_)
        hint = builder.module.add_metadata([llvm_ir.Constant(i32, 1)])
        with cgutils.for_range(builder, lines) as loop:
            j = builder.add(lead, builder.mul(loop.index, llvm_ir.Constant(i64, 16)))
            to = builder.bitcast(builder.gep(op, [builder.add(oo_, j)]), vec.as_pointer())
            store = builder.store(value(vector_at, j, shift, scale), to, align=64)
            if streaming:
                store.set_metadata("nontemporal", hint)
        done = builder.add(lead, builder.mul(lines, llvm_ir.Constant(i64, 16)))
        with cgutils.for_range(builder, builder.sub(d_, done)) as loop:
            j = builder.add(done, loop.index)
            builder.store(value(scalar_at, j, shift_, scale_), builder.gep(op, [builder.add(oo_, j)]))
        return context.get_dummy_value()
    n = numba_types.intp
    return numba_types.void(x, n, g, b, out, n, n, numba_types.float32, numba_types.float32), codegen


stream_affine = intrinsic(_stream_affine)
'''

STREAM_FENCE = '''\
def _stream_fence(typingctx):
    """Order this thread's streaming stores before whatever it does next (sfence; nothing off x86)."""
    def codegen(context, builder, sig, args):
        import llvmlite.binding

        if "x86" in llvmlite.binding.get_default_triple():
            name = "llvm.x86.sse.sfence"
            fn = builder.module.globals.get(name)
            if fn is None:
                fn = llvm_ir.Function(builder.module, llvm_ir.FunctionType(llvm_ir.VoidType(), []), name)
            builder.call(fn, [])
        return context.get_dummy_value()
    return numba_types.void(), codegen


stream_fence = intrinsic(_stream_fence)
'''


def streams(nbytes: int) -> bool:
    """Whether an output of ``nbytes`` is written by streaming stores."""
    return nbytes >= STREAM_BYTES


def use(parts: ModuleParts) -> tuple[str, str]:
    """Register stream_affine and stream_fence (and the pointer helper they use); their names."""
    from irc.backends.cpu.render import sdpa_simd

    parts.device("vec_ptr", sdpa_simd.SOURCES["vec_ptr"])
    return parts.device("stream_affine", STREAM_AFFINE), parts.device("stream_fence", STREAM_FENCE)
