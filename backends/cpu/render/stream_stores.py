"""Non-temporal (streaming) stores for outputs far larger than the caches, as Numba intrinsics.

An ordinary store first reads its cache line from memory (read for ownership), so a kernel that
reads x and writes y moves three lines per line of y; a streaming store writes the line without
reading it, so two. On a 256 MiB LayerNorm (65,536 × 1,024, 2 threads, this machine) that was 24.1
GB/s against 26.1 with a fence after every row and 27.6 with a fence per thread, against 28.0 for
a plain copy; the fused add + LayerNorm, whose sum streams too, 23.3 → 35.6 GB/s. The line bypasses
the caches, so a reader soon after fetches it from memory: kernels take this path only for outputs
of at least ``STREAM_BYTES`` (:func:`streams`), which would have left the caches before their reader
came anyway, and not over their own input (``same_data``), whose lines are in cache already.

While a row streams out, each of its lines prefetches the same line of the next row (and of the next
residual row), which the caller's first sweep reads next: otherwise a row's reads all wait for its
writes, and the two directions of the memory bus take turns. On the Zen 5 host (2 threads, 65,536 ×
1,024), against a plain prange copy in the same process, alternating processes: LayerNorm 0.84–1.10
of the copy without, 1.13–1.30 with; add + LayerNorm 0.90–1.08 without, 1.40–1.44 with.

Streaming stores are weakly ordered: every thread ends its share with ``stream_fence`` (x86's
sfence) before the parallel loop joins. Elsewhere than x86 both are ordinary stores and no fence.
"""

from __future__ import annotations

from irc.backends.common.kernel import ModuleParts

STREAM_BYTES = 32 << 20  # outputs at least this large stream: 16x a core's L2 here, beyond any L3 share

STREAM_ROWS = '''\
def stream_rows(name, added):
    \"\"\"An intrinsic writing out[oo + j] = (v[j] − shift)·scale·g[j] + b[j] for j < d, where v[j] = x[xo + j], or
    with ``added`` v[j] = x[xo + j] + res[xo + j], also written to total[oo + j]. The lines of out wholly written
    go by streaming stores (64-byte aligned vectors of 16), and total's too when it is aligned as out is; the
    few values before and after by plain stores.\"\"\"
    def typer(typingctx, arrays):
        def codegen(context, builder, sig, args):
            from numba.core import cgutils
            import llvmlite.binding

            i64, i32 = llvm_ir.IntType(64), llvm_ir.IntType(32)
            vec = llvm_ir.VectorType(llvm_ir.FloatType(), 16)
            if added:
                xp, rp, gp, bp, tp, op = (vec_ptr(context, builder, sig.args[a], args[a]) for a in (0, 1, 3, 4, 5, 6))
                xo_, oo_, d_, shift_, scale_ = (args[a] for a in (2, 7, 8, 9, 10))
            else:
                xp, gp, bp, op = (vec_ptr(context, builder, sig.args[a], args[a]) for a in (0, 2, 3, 4))
                rp = tp = None
                xo_, oo_, d_, shift_, scale_ = (args[a] for a in (1, 5, 6, 7, 8))
            streaming = "x86" in llvmlite.binding.get_default_triple()
            hint = builder.module.add_metadata([llvm_ir.Constant(i32, 1)])

            def scalar_at(p, j):
                return builder.load(builder.gep(p, [j]))

            def vector_at(p, j):
                return builder.load(builder.bitcast(builder.gep(p, [j]), vec.as_pointer()), align=4)

            def put(value, p, j, wide, stream):
                to = builder.gep(p, [builder.add(oo_, j)])
                store = builder.store(value, builder.bitcast(to, vec.as_pointer()) if wide else to,
                                      align=64 if stream else 4)  # only a streamed store is known to be aligned
                if stream and streaming:
                    store.set_metadata("nontemporal", hint)

            def row(j, load, shift, scale, wide, stream_total):
                v = load(xp, builder.add(xo_, j))
                if added:
                    v = builder.fadd(v, load(rp, builder.add(xo_, j)))
                    put(v, tp, j, wide, stream_total)
                v = builder.fmul(builder.fsub(v, shift), scale)
                put(builder.fadd(builder.fmul(v, load(gp, j)), load(bp, j)), op, j, wide, wide)

            def splat(s):
                one = builder.insert_element(llvm_ir.Constant(vec, llvm_ir.Undefined), s, llvm_ir.Constant(i32, 0))
                return builder.shuffle_vector(one, llvm_ir.Constant(vec, llvm_ir.Undefined),
                                              llvm_ir.Constant(llvm_ir.VectorType(i32, 16), [0] * 16))

            # floats before out[oo + j] is 64-byte aligned (out is 4-byte aligned), at most d
            address = builder.ptrtoint(builder.gep(op, [oo_]), i64)
            lead = builder.lshr(builder.and_(builder.sub(llvm_ir.Constant(i64, 0), address),
                                             llvm_ir.Constant(i64, 63)), llvm_ir.Constant(i64, 2))
            lead = builder.select(builder.icmp_signed("<", lead, d_), lead, d_)
            with cgutils.for_range(builder, lead) as loop:
                row(loop.index, scalar_at, shift_, scale_, False, False)
            lines = builder.sdiv(builder.sub(d_, lead), llvm_ir.Constant(i64, 16))
            shift, scale = splat(shift_), splat(scale_)

            def whole_lines(stream_total):
                with cgutils.for_range(builder, lines) as loop:
                    j = builder.add(lead, builder.mul(loop.index, llvm_ir.Constant(i64, 16)))
                    # the same line of the next row, which the caller's first sweep reads next: its loads then
                    # overlap these stores instead of following them (a prefetch past the array never faults)
                    ahead = builder.add(builder.add(xo_, d_), j)
                    vec_prefetch(builder, xp, ahead)
                    if added:
                        vec_prefetch(builder, rp, ahead)
                    row(j, vector_at, shift, scale, True, stream_total)
            if added:  # total streams too when it sits as out does against 64-byte lines
                apart = builder.sub(builder.ptrtoint(builder.gep(tp, [oo_]), i64), address)
                same = builder.icmp_signed("==", builder.and_(apart, llvm_ir.Constant(i64, 63)),
                                           llvm_ir.Constant(i64, 0))
                with builder.if_else(same) as (aligned, unaligned):
                    with aligned:
                        whole_lines(True)
                    with unaligned:
                        whole_lines(False)
            else:
                whole_lines(False)
            done = builder.add(lead, builder.mul(lines, llvm_ir.Constant(i64, 16)))
            with cgutils.for_range(builder, builder.sub(d_, done)) as loop:
                row(builder.add(done, loop.index), scalar_at, shift_, scale_, False, False)
            return context.get_dummy_value()
        n, f = numba_types.intp, numba_types.float32
        if added:  # (x, res, xo, g, b, total, out, oo, d, shift, scale)
            return numba_types.void(*arrays[:2], n, *arrays[2:], n, n, f, f), codegen
        return numba_types.void(arrays[0], n, *arrays[1:], n, n, f, f), codegen  # (x, xo, g, b, out, oo, d, ...)

    if added:
        def typed(typingctx, x, res, xo, g, b, total, out, oo, d, shift, scale):
            return typer(typingctx, (x, res, g, b, total, out))
    else:
        def typed(typingctx, x, xo, g, b, out, oo, d, shift, scale):
            return typer(typingctx, (x, g, b, out))
    typed.__name__ = name
    return intrinsic(typed)
'''

STREAM_BLOCKS = {
    "stream_affine": 'stream_affine = stream_rows("stream_affine", False)  # (x, xo, g, b, out, oo, d, shift, scale)\n',
    "stream_add_affine": 'stream_add_affine = stream_rows("stream_add_affine", True)'
                         '  # (x, res, xo, g, b, total, out, oo, d, shift, scale)\n',
}

SAME_DATA = '''\
def _same_data(typingctx, a, b):
    """Whether arrays a and b start at the same address (an output placed over its input)."""
    def codegen(context, builder, sig, args):
        i64 = llvm_ir.IntType(64)
        pa, pb = (builder.ptrtoint(vec_ptr(context, builder, sig.args[i], args[i]), i64) for i in (0, 1))
        return builder.icmp_unsigned("==", pa, pb)
    return numba_types.boolean(a, b), codegen


same_data = intrinsic(_same_data)
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


def use(parts: ModuleParts) -> None:
    """Register stream_affine, stream_add_affine, stream_fence and same_data (and what they are made with)."""
    from irc.backends.cpu.render import sdpa_simd

    parts.device("vec_ptr", sdpa_simd.SOURCES["vec_ptr"])
    parts.device("vec_prefetch", sdpa_simd.SOURCES["vec_prefetch"])
    parts.device("stream_rows", STREAM_ROWS)
    for name, source in STREAM_BLOCKS.items():
        parts.device(name, source)
    parts.device("stream_fence", STREAM_FENCE)
    parts.device("same_data", SAME_DATA)
