"""Register-blocked float32 blocks of the fused attention kernel, as Numba intrinsics.

BLAS on attention's tiles (a 64-deep score product, a 64-wide value product) spent a
quarter of its time packing its operands and zeroing its output, call after call, and
reached about 70 % of its own large-matrix rate. These blocks run straight on the tiles
as the kernel holds them, with no copy. Each intrinsic emits one register block in LLVM IR
on explicit vectors as wide as the machine Numba compiles for (``vec_shape``: 16 floats on
AVX-512, 8 on AVX, 4 elsewhere): the accumulators stay in registers over the whole
contraction (in as many passes over it as the registers need: one on AVX-512), and every
step is a vector load per vector of columns, a broadcast per row and a fused multiply-add
per pair. Operands are (array, flat element offset, row stride in elements); the loops
around the blocks are the kernel's own Numba code.

- ``sdpa_qk6x64``: scores sᵀ[j, i] = Σ_d qᵀ[d, i]·k[j, d] for 6 keys × 64 queries (24
  accumulators on AVX-512); ``sdpa_qk6x32`` for 32 queries (a block's last ones),
  ``sdpa_qk1x64`` and ``sdpa_qk1x32`` for one key (a block's last keys);
- ``sdpa_pv6x64``: acc[i, c] += Σ_j sᵀ[j, i]·v[j, c] for 6 queries × 64 value columns,
  ``sdpa_pv6x16`` for 16 columns, ``sdpa_pv2x64`` and ``sdpa_pv2x16`` for 2 queries;
- ``sdpa_exp2row``: one row of a score block replaced by 2**(s − base) and added into the
  column sums, on whole vectors (AVX-512 where the loop vectoriser would pick AVX2);
- ``sdpa_exp2``: the same exponential on one float (a row's rescale factor).
Every sum runs in a fixed order (d, or j, ascending) on one thread: results do not depend
on the thread count. Numba's fastmath pass flags only flag-less float instructions, so the
exponential's instructions carry ``nsz`` (``vec_exact``) and keep their written order.
"""

from __future__ import annotations

from irc.backends.common.kernel import ModuleParts

VEC_PTR = '''\
def vec_ptr(context, builder, ty, value):
    \"\"\"The data pointer (float*) of a Numba array argument.\"\"\"
    return context.make_array(ty)(context, builder, value).data
'''

VEC_SHAPE = '''\
def vec_shape(context):
    \"\"\"(float lanes per register, accumulators a block may keep) for the machine Numba compiles
    for: AVX-512's 32 registers of 16 take 24 accumulators, AVX's 16 of 8 and others' of 4 take 12.\"\"\"
    import llvmlite.binding

    features = getattr(context.codegen(), "_tm_features", "") or llvmlite.binding.get_host_cpu_features().flatten()
    if "+avx512f" in features:
        return 16, 24
    return (8 if "+avx" in features else 4), 12
'''

VEC_LOAD = '''\
def vec_load(builder, lanes, base, offset):
    \"\"\"``lanes`` floats from base[offset] (any alignment).\"\"\"
    ptr = builder.bitcast(builder.gep(base, [offset]), llvm_ir.VectorType(llvm_ir.FloatType(), lanes).as_pointer())
    return builder.load(ptr, align=4)
'''

VEC_STORE = '''\
def vec_store(builder, value, base, offset):
    \"\"\"A vector to base[offset] (any alignment).\"\"\"
    ptr = builder.bitcast(builder.gep(base, [offset]), value.type.as_pointer())
    builder.store(value, ptr, align=4)
'''

VEC_SPLAT = '''\
def vec_splat(builder, lanes, base, offset):
    \"\"\"base[offset] in all lanes (one broadcast load).\"\"\"
    vec = llvm_ir.VectorType(llvm_ir.FloatType(), lanes)
    lane = builder.insert_element(llvm_ir.Constant(vec, llvm_ir.Undefined), builder.load(builder.gep(base, [offset])),
                                  llvm_ir.Constant(llvm_ir.IntType(32), 0))
    zeros = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.IntType(32), lanes), [0] * lanes)
    return builder.shuffle_vector(lane, llvm_ir.Constant(vec, llvm_ir.Undefined), zeros)
'''

VEC_FMA = '''\
def vec_fma(builder, a, b, c):
    \"\"\"a·b + c, lane by lane, rounded once (llvm.fma).\"\"\"
    name = f"llvm.fma.v{a.type.count}f32"
    fn = builder.module.globals.get(name)
    if fn is None:
        fn = llvm_ir.Function(builder.module, llvm_ir.FunctionType(a.type, [a.type] * 3), name)
    return builder.call(fn, [a, b, c])
'''

VEC_PREFETCH = '''\
def vec_prefetch(builder, base, offset, locality=3):
    \"\"\"A read prefetch of base[offset] (a hint: it never faults): into all cache levels, or with
    ``locality`` 2 into L2 and beyond (x86's prefetcht1).\"\"\"
    i8p = llvm_ir.IntType(8).as_pointer()
    i32 = llvm_ir.IntType(32)
    fn = builder.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = llvm_ir.Function(builder.module, llvm_ir.FunctionType(llvm_ir.VoidType(), [i8p, i32, i32, i32]),
                              "llvm.prefetch.p0")
    ptr = builder.bitcast(builder.gep(base, [offset]), i8p)
    builder.call(fn, [ptr, llvm_ir.Constant(i32, 0), llvm_ir.Constant(i32, locality), llvm_ir.Constant(i32, 1)])
'''

VEC_EXACT = '''\
def vec_exact(instruction):
    \"\"\"The float instruction, flagged ``nsz`` only: Numba's fastmath pass flags just the
    flag-less ones, so this one keeps its written order (no reassociation, no contraction).\"\"\"
    instruction.flags.append("nsz")
    return instruction
'''

VEC_LOOP = '''\
def vec_loop(builder, count, inits, body):
    \"\"\"``for t in range(count): values = body(t, values)`` as an IR loop (count >= 1); the final values.\"\"\"
    i64 = llvm_ir.IntType(64)
    entry = builder.block
    loop = builder.append_basic_block("vec.loop")
    done = builder.append_basic_block("vec.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    t = builder.phi(i64)
    t.add_incoming(llvm_ir.Constant(i64, 0), entry)
    values = []
    for init in inits:
        phi = builder.phi(init.type)
        phi.add_incoming(init, entry)
        values.append(phi)
    new = body(t, values)
    step = builder.add(t, llvm_ir.Constant(i64, 1))
    t.add_incoming(step, builder.block)
    for phi, value in zip(values, new):
        phi.add_incoming(value, builder.block)
    builder.cbranch(builder.icmp_signed("<", step, count), loop, done)
    builder.position_at_end(done)
    return new
'''

SIMD_QK = '''\
def simd_qk(name, keys, width, exp=False):
    \"\"\"The score block s[so + j·lds + c] = Σ_d qt[qo + d·ldq + c] · k[ko + j·ldk + d] for
    j < ``keys`` keys, c < ``width`` queries, d < depth (>= 1): the queries in as many passes
    as the registers need (one on AVX-512), each over the whole depth. ``exp``: four more
    arguments (base, tot, top, co), and what is stored is 2**(s − base[co + c]), while
    tot[co + c] adds the stored values (key after key) and top[co + c] keeps the largest score.\"\"\"
    def codegen(context, builder, sig, args):
        i64 = llvm_ir.IntType(64)
        lanes, budget = vec_shape(context)
        qt_, k_, s_ = (vec_ptr(context, builder, sig.args[a], args[a]) for a in (0, 3, 6))
        qo_, ldq_, ko_, ldk_, so_, lds_, depth_ = (args[a] for a in (1, 2, 4, 5, 7, 8, 9))
        rows = [builder.add(ko_, builder.mul(llvm_ir.Constant(i64, j), ldk_)) for j in range(keys)]
        vectors = width // lanes
        per = max(1, min(vectors, budget // keys))
        for first in range(0, vectors, per):
            cols = range(first, min(first + per, vectors))

            def step(d, accs, cols=cols):
                at = builder.add(qo_, builder.mul(d, ldq_))
                qv = [vec_load(builder, lanes, qt_, builder.add(at, llvm_ir.Constant(i64, lanes * c)))
                      for c in cols]
                out = []
                for j in range(keys):
                    kv = vec_splat(builder, lanes, k_, builder.add(rows[j], d))
                    out += [vec_fma(builder, q, kv, accs[j * len(qv) + a]) for a, q in enumerate(qv)]
                return out

            zero = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.FloatType(), lanes), [0.0] * lanes)
            accs = vec_loop(builder, depth_, [zero] * (keys * len(cols)), step)
            ats = [builder.add(so_, builder.mul(llvm_ir.Constant(i64, j), lds_)) for j in range(keys)]
            for a, c in enumerate(cols):
                if exp:  # the column's base, sum and maximum, then each key's score in turn
                    base_, tot_, top_ = (vec_ptr(context, builder, sig.args[i], args[i]) for i in (10, 11, 12))
                    cat = builder.add(args[13], llvm_ir.Constant(i64, lanes * c))
                    base, tot, top = (vec_load(builder, lanes, x, cat) for x in (base_, tot_, top_))
                for j in range(keys):
                    value = accs[j * len(cols) + a]
                    if exp:
                        top = builder.select(vec_exact(builder.fcmp_ordered(">", value, top)), value, top)
                        value = vec_exp2(builder, vec_exact(builder.fsub(value, base)))
                        tot = vec_exact(builder.fadd(tot, value))
                    vec_store(builder, value, s_, builder.add(ats[j], llvm_ir.Constant(i64, lanes * c)))
                if exp:
                    vec_store(builder, tot, tot_, cat)
                    vec_store(builder, top, top_, cat)
        return context.get_dummy_value()
    n = numba_types.intp
    if exp:
        def typer(typingctx, qt, qo, ldq, k, ko, ldk, s, so, lds, depth, base, tot, top, co):
            return numba_types.void(qt, n, n, k, n, n, s, n, n, n, base, tot, top, n), codegen
    else:
        def typer(typingctx, qt, qo, ldq, k, ko, ldk, s, so, lds, depth):
            return numba_types.void(qt, n, n, k, n, n, s, n, n, n), codegen
    typer.__name__ = name
    return intrinsic(typer)
'''

SIMD_PV = '''\
def simd_pv(name, rows, width, fresh=False, ahead=0, stream=0, table=False):
    \"\"\"The value block acc[ao + r·lda + c] += Σ_j p[po + j·ldp + r] · v[vo + j·ldv + c] for
    r < ``rows`` queries, c < ``width`` columns, j < depth (>= 1) keys: the columns in as many
    passes as the registers need (one on AVX-512). ``fresh``: acc = the sum (acc is not read).
    ``ahead``: each step prefetches p that many steps on (a weight streamed from memory);
    ``stream``: each step prefetches v's vectors that many steps on (v the streamed weight).
    ``table``: ldv is an int64 array, row j of v starting at vo + ldv[j] (rows anywhere: a
    convolution's taps read from its phase planes, no im2col copy).\"\"\"
    def typer(typingctx, p, po, ldp, v, vo, ldv, acc, ao, lda, depth):
        def codegen(context, builder, sig, args):
            i64 = llvm_ir.IntType(64)
            lanes, budget = vec_shape(context)
            p_, v_, acc_ = (vec_ptr(context, builder, sig.args[a], args[a]) for a in (0, 3, 6))
            po_, ldp_, vo_, ldv_, ao_, lda_, depth_ = (args[a] for a in (1, 2, 4, 5, 7, 8, 9))
            if table:
                ldv_ = vec_ptr(context, builder, sig.args[5], ldv_)
            homes = [builder.add(ao_, builder.mul(llvm_ir.Constant(i64, r), lda_)) for r in range(rows)]
            vectors = width // lanes
            per = max(1, min(vectors, budget // rows))
            for first in range(0, vectors, per):
                cols = range(first, min(first + per, vectors))
                ats = [[builder.add(homes[r], llvm_ir.Constant(i64, lanes * c)) for c in cols] for r in range(rows)]

                def step(j, accs, cols=cols):
                    row = builder.load(builder.gep(ldv_, [j])) if table else builder.mul(j, ldv_)
                    at = builder.add(vo_, row)
                    vv = [vec_load(builder, lanes, v_, builder.add(at, llvm_ir.Constant(i64, lanes * c))) for c in cols]
                    if stream:
                        on = builder.add(at, builder.mul(llvm_ir.Constant(i64, stream), ldv_))
                        for c in cols:
                            vec_prefetch(builder, v_, builder.add(on, llvm_ir.Constant(i64, lanes * c)))
                    pj = builder.add(po_, builder.mul(j, ldp_))
                    if ahead:
                        vec_prefetch(builder, p_, builder.add(pj, builder.mul(llvm_ir.Constant(i64, ahead), ldp_)))
                    out = []
                    for r in range(rows):
                        pr = vec_splat(builder, lanes, p_, builder.add(pj, llvm_ir.Constant(i64, r)))
                        out += [vec_fma(builder, x, pr, accs[r * len(vv) + a]) for a, x in enumerate(vv)]
                    return out

                zero = llvm_ir.Constant(llvm_ir.VectorType(llvm_ir.FloatType(), lanes), [0.0] * lanes)
                inits = [zero if fresh else vec_load(builder, lanes, acc_, at) for row in ats for at in row]
                accs = vec_loop(builder, depth_, inits, step)
                for value, at in zip(accs, [at for row in ats for at in row]):
                    vec_store(builder, value, acc_, at)
            return context.get_dummy_value()
        n = numba_types.intp
        return numba_types.void(p, n, n, v, n, ldv if table else n, acc, n, n, n), codegen
    if table and stream:
        raise ValueError("a block reading v through a table of rows cannot prefetch v by its stride")
    typer.__name__ = name
    return intrinsic(typer)
'''

# 2**f on [-1/2, 1/2] (1 + f·(...), a relative minimax fit): 0.84 ulp at most in float32,
# as close as NumPy's own exp2
EXP2_POLY = (1.5353362e-4, 1.3398875e-3, 9.6184369e-3, 5.5503324e-2, 2.4022648e-1, 6.9314718e-1, 1.0)

VEC_EXP2 = '''\
def vec_exp2(builder, t):
    \"\"\"2**t lane by lane, every exponent <= 127 (below −127, and −inf: 0; NaN stays NaN): a rounding by a
    magic constant, the polynomial on the remainder, and the integer part shifted into the exponent field.\"\"\"
    vec = t.type
    lanes = vec.count
    ivec = llvm_ir.VectorType(llvm_ir.IntType(32), lanes)
    floor = llvm_ir.Constant(vec, [-127.0] * lanes)
    # 1.5·2**23 + 127: adding it rounds t to an integer k and leaves k + 127 in the low bits
    magic = llvm_ir.Constant(vec, [12583039.0] * lanes)
    t = builder.select(vec_exact(builder.fcmp_ordered("<", t, floor)), floor, t)  # NaN stays NaN
    y = vec_exact(builder.fadd(t, magic))  # t in [-127, 127]: k = rint(t), exactly
    f = vec_exact(builder.fsub(t, vec_exact(builder.fsub(y, magic))))  # t − k, in [-1/2, 1/2]
    p = llvm_ir.Constant(vec, [EXP2_POLY[0]] * lanes)
    for coefficient in EXP2_POLY[1:]:
        p = vec_fma(builder, p, f, llvm_ir.Constant(vec, [coefficient] * lanes))
    # 2**k: k + 127 shifted into the exponent field (the magic's other bits shift out); k = -127 gives 0
    bits = builder.shl(builder.bitcast(y, ivec), llvm_ir.Constant(ivec, [23] * lanes))
    return vec_exact(builder.fmul(p, builder.bitcast(bits, vec)))
'''.replace("EXP2_POLY[0]", repr(EXP2_POLY[0])).replace("EXP2_POLY[1:]", repr(EXP2_POLY[1:]))

SIMD_EXP2 = '''\
def simd_exp2(name):
    \"\"\"s[so + c] = 2**(s − base[c]) and tot[c] += that, for c < 16·groups: one row of a score
    block, every exponent <= 127 (or −inf: 0; or NaN: NaN).\"\"\"
    def typer(typingctx, s, so, base, tot, groups):
        def codegen(context, builder, sig, args):
            i64 = llvm_ir.IntType(64)
            lanes = vec_shape(context)[0]
            s_, base_, tot_ = (vec_ptr(context, builder, sig.args[a], args[a]) for a in (0, 2, 3))
            so_, groups_ = args[1], args[4]

            def step(g, _):
                for part in range(16 // lanes):
                    lane = builder.add(builder.mul(g, llvm_ir.Constant(i64, 16)), llvm_ir.Constant(i64, lanes * part))
                    at = builder.add(so_, lane)
                    t = vec_exact(builder.fsub(vec_load(builder, lanes, s_, at), vec_load(builder, lanes, base_, lane)))
                    e = vec_exp2(builder, t)
                    vec_store(builder, e, s_, at)
                    total = vec_exact(builder.fadd(vec_load(builder, lanes, tot_, lane), e))
                    vec_store(builder, total, tot_, lane)
                return []

            vec_loop(builder, groups_, [], step)
            return context.get_dummy_value()
        n = numba_types.intp
        return numba_types.void(s, n, base, tot, n), codegen
    typer.__name__ = name
    return intrinsic(typer)
'''

SDPA_EXP2 = f'''\
@njit(cache=True, error_model="numpy")
def sdpa_exp2(t):
    """2**t for one float t <= 127 or −inf (0), never NaN (a rescale factor), as sdpa_exp2row computes it."""
    t = np.float32(-127.0) if t < np.float32(-127.0) else t
    k = np.rint(t)
    f = t - k
    p = np.float32({EXP2_POLY[0]!r})
''' + "".join(f"    p = p * f + np.float32({c!r})\n" for c in EXP2_POLY[1:]) + '''\
    return p * f32_from_bits((np.int32(k) + np.int32(127)) << 23)
'''

BLOCKS = {
    **{f"sdpa_qk{j}x{w}": f'sdpa_qk{j}x{w} = simd_qk("sdpa_qk{j}x{w}", {j}, {w})  # {j} keys × {w} queries\n'
       for j in (6, 1) for w in (64, 32)},
    **{f"sdpa_qk{j}x{w}e": f'sdpa_qk{j}x{w}e = simd_qk("sdpa_qk{j}x{w}e", {j}, {w}, exp=True)  # and 2**x\n'
       for j in (6, 1) for w in (64, 32)},
    **{f"sdpa_pv{r}x{w}": f'sdpa_pv{r}x{w} = simd_pv("sdpa_pv{r}x{w}", {r}, {w})  # {r} queries × {w} columns\n'
       for r in (6, 2) for w in (64, 16)},
    "sdpa_exp2row": 'sdpa_exp2row = simd_exp2("sdpa_exp2row")  # a row of a score block\n',
}
# in the order the module needs them: a block's builder is called when the module is imported
SOURCES = {"vec_ptr": VEC_PTR, "vec_shape": VEC_SHAPE, "vec_load": VEC_LOAD, "vec_store": VEC_STORE,
           "vec_splat": VEC_SPLAT, "vec_fma": VEC_FMA, "vec_prefetch": VEC_PREFETCH, "vec_exact": VEC_EXACT,
           "vec_loop": VEC_LOOP, "vec_exp2": VEC_EXP2,
           "simd_qk": SIMD_QK, "simd_pv": SIMD_PV, "simd_exp2": SIMD_EXP2, **BLOCKS, "sdpa_exp2": SDPA_EXP2}


def use(parts: ModuleParts) -> None:
    """Put the blocks, what they are built from and ``sdpa_exp2`` into the module (each a
    device function: a kernel's shared file gets the ones it calls, callees first)."""
    from irc.backends.cpu.render import mathfns

    mathfns.use(parts, "f32_from_bits")
    for name, source in SOURCES.items():
        parts.device(name, source)


def use_pv(parts: ModuleParts, name: str, rows: int, width: int, **options: object) -> str:
    """Put one value block ``name`` (simd_pv of ``rows`` × ``width``, with ``options``) and what it is built from
    into the module; its name."""
    for part in ("vec_ptr", "vec_shape", "vec_load", "vec_store", "vec_splat", "vec_fma", "vec_prefetch", "vec_loop",
                 "simd_pv"):
        parts.device(part, SOURCES[part])
    args = "".join(f", {k}={v!r}" for k, v in options.items())
    return parts.device(name, f'{name} = simd_pv("{name}", {rows}, {width}{args})\n')
