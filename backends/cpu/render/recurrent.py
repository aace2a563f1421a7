"""RNN, LSTM and both GRUs: one BLAS matmul for every input step, one per time step for h.
The LSTM splits both over the threads: the input product by rows, each step's [4h, h] product by
blocks of units, each thread finishing its units' gates, cell and h while its product is in cache.

Gate rows follow PyTorch (LSTM i, f, g, o; GRU r, z, n). The chapter's GRU applies the
reset gate to h before the hidden matmul; the torch variant applies it after.
"""

from __future__ import annotations

from irc.backends.common.kernel import A1, A2, A3, I64, Kernel
from irc.backends.cpu.jit import jit
from irc.backends.cpu.render import gemm_panels, gemm_stream
from irc.backends.cpu.render.activations import act, sigmoid, tanh
from irc.backends.cpu.render.context import NodeCtx
from irc.backends.cpu.render.gemm import SMALL_M, THREADS, use_dot_nt
from irc.ops.recurrent import directions, layer_suffix, num_layers, torch_layout

JIT = jit()
SERIAL = jit(parallel=False)  # step loops whose matmuls are whole (BLAS single-threaded meanwhile)

# shared by the kernels below: the final state copied out (ending inside the loop, so the
# LSTM adds its cell's line), and (but for the LSTM) every step's input product as one
# matmul before the recurrence
H_LAST = """\
    for n in range(nb):  # explicit loops: a slice assignment costs seconds of compile time
        for j in range(nh):
            h_last[n, j] = h[n, j]
"""


def _steps(whh: str, gates: int) -> str:
    """x @ wih.T for every step (``gates`` blocks of nh per step), nh from ``whh``, and h = 0."""
    per_step = f"{gates} * nh" if gates > 1 else "nh"
    return f"""\
    nb, nt, nd = x.shape
    nh = {whh}.shape[1]
    xw = np.dot(x.reshape(nb * nt, nd), wih.T).reshape(nb, nt, {per_step})
    h = np.zeros((nb, nh), np.float32)
"""


RNN = """\
{jit}
def {name}(x, wih, whh, b, seq, h_last):
{steps}\
    for t in range(nt):
        hw = np.dot(h, whh.T)
        for n in range(nb):
            for j in range(nh):
                v = xw[n, t, j] + hw[n, j] + b[j]
                h[n, j] = {expr}
                seq[n, t, j] = h[n, j]
{h_last}\
"""

# The LSTM's gate rows are regrouped once per weights dict (``gates_blocked``) into blocks of UNITS
# units: block b holds, for units [16b, 16b + w), the w rows of gate i, then f, g, o. A thread owning
# whole blocks then owns one contiguous run of rows (its share of W_hh, read once per step), and each
# gate of a block is a contiguous run of w values, so the gate loop vectorises.
#
# A step on the threads is one parallel loop, which waits for its slowest thread: on a machine other
# programs keep busy that wait is a scheduler's time slice (milliseconds, for a step of ~0.1 ms), and for
# small products the hand-off alone costs more than the split saves. So the kernel times its steps (the
# CPU's cycle counter), keeps a moving average of each way's cost, runs each step the cheaper way and
# every 16th step the other way. Both ways give the same bits (each unit's product is one block's).
UNITS = 16
UNITS_ONE_ROW = 32  # at a batch of one a block's panel product has 8 accumulators, not 4 (see _units)
LSTM = """\
{jit}
def {name}(x, wih, whh, b, seq, h_last, c_last, width, parts):
    # every step's input product as one matmul (split by rows; the bias is added with the gates), then
    # the recurrence: per step, each thread takes its blocks of units one by one, multiplying the
    # block's rows of W_hh by h and finishing its units (gates, cell, h) while the product is in L1
    nb, nt, nd = x.shape
    nh = whh.shape[1]
    rows = nb * nt
    xw = np.empty((rows, 4 * nh), np.float32)
    x2 = x.reshape(rows, nd)
    for c in prange(parts):
        r0 = c * rows // parts
        r1 = (c + 1) * rows // parts
        if r1 > r0:
            np.dot(x2[r0:r1], wih.T, xw[r0:r1])
    nblk = (nh + width - 1) // width
    parts = max(1, min(parts, nblk))
    hs = np.zeros((2, nb, nh), np.float32)  # h of the previous step and of this one, by turns
{state}    cell = np.zeros((nb, nh), np.float32)
    scratch = np.empty((parts, nb * 4 * width), np.float32)  # one block's product per thread
    # recent cost of a step on the threads and on one thread (cycles, moving averages): each step runs the
    # cheaper way, and now and then the other way, so a change in either (a busy machine) is seen: every
    # 16th step while the two are within 1.5x, else every 128th (a 650-unit layer at B = 1 on two idle
    # cores: a step on one thread costs 2.2x, and trying it every 16th step cost 7 % of the layer).
    # Step 0 warms the caches (W_hh comes from memory after the input product) and is no sample of
    # either way; steps 1 and 2 take the first samples. A trial of the other way replaces that way's
    # estimate rather than moving it by a quarter: seeded from a cold step 0, the threads' estimate
    # stayed above one thread's for a whole 256-step layer, which then ran on one thread (101 against 65 us
    # a step).
    cost_par = np.float64(0.0)
    cost_one = np.float64(0.0)
    for t in range(nt):
        hp = hs[t % 2]
        hn = hs[(t + 1) % 2]
        close = max(cost_par, cost_one) < 1.5 * min(cost_par, cost_one)
        other = t > 2 and t % (16 if close else 128) == 0
        threads = parts > 1 and (t == 0 or t == 2 or (t > 2 and (cost_par <= cost_one) != other))
        start = cycles()
        if threads:
            for c in prange(parts):
                {units}(xw, whh, b, {h_args}, cell, seq, scratch[c], t, c * nblk // parts, (c + 1) * nblk // parts,
                        width)
        else:
            {units}(xw, whh, b, {h_args}, cell, seq, scratch[0], t, 0, nblk, width)
        took = np.float64(cycles() - start)
        if t == 0:
            pass
        elif threads:
            cost_par = took if t == 2 or other else 0.75 * cost_par + 0.25 * took
        else:
            cost_one = took if t == 1 or other else 0.75 * cost_one + 0.25 * took
    h = hs[nt % 2]
{h_last}\
            c_last[n, j] = cell[n, j]
"""

# A thread's share of W_hh (3.4 MB of the 6.8 MB of a 650-unit layer on two threads) is more than its
# L2 (2 MB): read in the same order every step, each step would find none of it there (the least recently
# used lines go first). Odd steps walk the blocks backwards, so a step starts on the blocks the previous
# one ended on, still in L2 (a 650-unit layer at B = 1: 1.3x the forward-only layer; B = 8: within noise).
LSTM_UNITS = """\
{jit}
def lstm_units(xw, whh, b, hp, hn, cell, seq, buf, t, b0, b1, width):
    \"\"\"One step of blocks [b0, b1) of units: per block its rows of W_hh times h, then gates, cell and h.\"\"\"
    nb, nh = hp.shape
    for i in range(b1 - b0):
        ub = (b1 - 1 - i if t % 2 else b0 + i) * width  # odd steps backwards: L2 still holds those rows
        w = min(width, nh - ub)
        hw = buf[:nb * 4 * w].reshape(nb, 4 * w)
        dot_nt_into(hp, whh, 4 * ub, 4 * (ub + w), hw)  # its rows of W_hh read once for every row of h
        lstm_gates(xw, b, hw, cell, hn, seq, t, ub, w)
"""

# At a batch of 1 to SMALL_M rows (``streams``) the step's product runs as one register block per block
# of units (simd_pv, as gemm_stream.py's): W_hh's blocked rows are laid out once as panels [h, 64] of their
# transpose (a block's 4 gates × 16 units), h is kept transposed as well ([h, batch]: one broadcast per row and
# step of K); no horizontal sums, one sequential pass over the panel, prefetched ahead. 16 units a block even
# where batch × 4 vectors overflow the registers (2 passes over the panel at 8 rows): 12-unit blocks, which
# would fit, leave the gate loop too short to vectorise (a 650-unit layer at B = 8, T = 256: 94.7 ms against
# 75.5). Against dot_nt's step: 1.2x at B = 8. At B = 1 the blocks are of 32 units (``units``: 8 accumulators
# in one pass) and the panel is not prefetched (it sits in L3): half a 650-unit W_hh on one thread 35.7 us
# against dot_nt's 49.
# A block's gates read one run of xw per row of the batch, rows T·4h floats apart, which the hardware does
# not fetch ahead: each block prefetches the next one's (B = 8: 271 against 282 us a step; B = 3: equal).
LSTM_UNITS_STREAM = """\
{jit}
def {name}(xw, whp, b, hpt, hn, hnt, cell, seq, buf, t, b0, b1, width):
    \"\"\"One step of blocks [b0, b1) of units on W_hh's panels: per block h (transposed: hpt) times its panel, then
    gates, cell and h, and h transposed into hnt for the next step.\"\"\"
    nb, nh = hn.shape
    cols = 4 * width
    nt = seq.shape[1]
    xwf = xw.reshape(-1)
    for i in range(b1 - b0):
        blk = b1 - 1 - i if t % 2 else b0 + i  # odd steps backwards, as lstm_units
        ub = blk * width
        w = min(width, nh - ub)
        if i + 1 < b1 - b0:  # the next block's gate inputs: a run of xw per row of the batch, rows far apart
            nxt = (b1 - 2 - i if t % 2 else b0 + i + 1) * cols
            for n in range(nb):
                prefetch_l2(xwf, (n * nt + t) * 4 * nh + nxt, min(cols, 4 * nh - nxt))
        {block}(hpt, 0, nb, whp, blk * nh * cols, cols, buf, 0, cols, nh)
        lstm_gates(xw, b, buf[:nb * cols].reshape(nb, cols), cell, hn, seq, t, ub, w)
        for j in range(ub, ub + w):
            for n in range(nb):
                hnt[j * nb + n] = hn[n, j]
"""

# The gates of one block. Every index is unsigned: numba then adds no negative-index wraparound (a select
# per index, which makes LLVM see gathers instead of consecutive loads), and the loop vectorises (about 3x
# the signed loop; views instead of indices cost two reference counts each, in atomics, per row and block).
LSTM_GATES = """\
{jit}
def lstm_gates(xw, b, hw, cell, hn, seq, t, ub, w):
    \"\"\"Gates, cell and h of units [ub, ub + w) (one block, its product in hw) for every row of the batch.\"\"\"
    nb = np.uint64(cell.shape[0])
    nt = np.uint64(seq.shape[1])
    tu = np.uint64(t)
    u = np.uint64(ub)
    wu = np.uint64(w)
    g0 = np.uint64(4) * u  # the block's first column of xw and b; its gates start w apart
    g1 = g0 + wu
    g2 = g1 + wu
    g3 = g2 + wu
    for n in range(nb):
        p = n * nt + tu  # the row of xw for (n, t)
        for j in range(wu):
            gi = xw[p, g0 + j] + b[g0 + j] + hw[n, j]
            gf = xw[p, g1 + j] + b[g1 + j] + hw[n, wu + j]
            gg = xw[p, g2 + j] + b[g2 + j] + hw[n, np.uint64(2) * wu + j]
            go = xw[p, g3 + j] + b[g3 + j] + hw[n, np.uint64(3) * wu + j]
            cv = {sig_f} * cell[n, u + j] + {sig_i} * {tanh_g}
            cell[n, u + j] = cv
            hv = {sig_o} * {tanh_c}
            hn[n, u + j] = hv
            seq[n, tu, u + j] = hv
"""

CYCLES = '''\
@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (llvm.readcyclecounter), to time a parallel step."""
    def codegen(context, builder, signature, args):
        fn = builder.module.globals.get("llvm.readcyclecounter")
        if fn is None:
            fn = llvm_ir.Function(builder.module, llvm_ir.FunctionType(llvm_ir.IntType(64), []),
                                  "llvm.readcyclecounter")
        return builder.call(fn, [])
    return numba_types.int64(), codegen
'''

# gate rows [4h, ...] (gates i, f, g, o) regrouped into blocks of ``width`` units, gate-major inside a block
GATES_BLOCKED = '''\
def gates_blocked(w, h, width):
    """Rows of the gate-stacked ``w`` [4h, ...] in k_lstm's order: block by block of ``width`` units, each
    block's rows of gate i, then f, g and o."""
    order = []
    for u0 in range(0, h, width):
        for g in range(4):
            order.extend(range(g * h + u0, g * h + min(h, u0 + width)))
    return np.ascontiguousarray(w[np.array(order)])
'''

GRU_CHAPTER = """\
{jit}
def k_gru_chapter(x, wih, whh_rz, whh_n, b, seq, h_last):
{steps}\
    z = np.empty((nb, nh), np.float32)
    rh = np.empty((nb, nh), np.float32)
    for t in range(nt):
        hu = np.dot(h, whh_rz.T)
        for n in range(nb):
            for j in range(nh):
                r = {sig_r}
                z[n, j] = {sig_z}
                rh[n, j] = r * h[n, j]  # the reset gate acts before the hidden matmul
        hn = np.dot(rh, whh_n.T)
        for n in range(nb):
            for j in range(nh):
                g = ftanh(xw[n, t, 2 * nh + j] + hn[n, j] + b[2 * nh + j])
                h[n, j] = (np.float32(1.0) - z[n, j]) * h[n, j] + z[n, j] * g
                seq[n, t, j] = h[n, j]
{h_last}\
"""

GRU_TORCH = """\
{jit}
def k_gru_torch(x, wih, whh, bih, bhh, seq, h_last):
{steps}\
    for t in range(nt):
        hw = np.dot(h, whh.T)
        for n in range(nb):
            for j in range(nh):
                r = {sig_r}
                z = {sig_z}
                g = ftanh(xw[n, t, 2 * nh + j] + bih[2 * nh + j] + r * (hw[n, 2 * nh + j] + bhh[2 * nh + j]))
                h[n, j] = (np.float32(1.0) - z) * g + z * h[n, j]  # z is the keep fraction
                seq[n, t, j] = h[n, j]
{h_last}\
"""


def _rnn_kernel(ctx: NodeCtx) -> str:
    act_name = ctx.attr("act", "tanh")
    name = f"k_rnn_{act_name}"
    src = RNN.format(jit=SERIAL, name=name, expr=act(ctx.parts, act_name), steps=_steps("whh", 1), h_last=H_LAST)
    return ctx.kernel(Kernel(name, src, (A3, A2, A2, A1, A3, A2)))


def render_rnn(ctx: NodeCtx) -> None:
    if torch_layout(ctx.node.attrs):
        return render_stacked(ctx)
    k = _rnn_kernel(ctx)
    seq, h = ctx.alloc(0), ctx.alloc(1)
    g = ctx.weight_shape("weight_hh")[0]
    ctx.emit(f"{k}({ctx.args[0]}, {ctx.weight('weight_ih')}, {ctx.weight('weight_hh')}, "
             f"{ctx.weight_or_zeros('bias', g)}, {seq}, {h})")


def streams(batch: int) -> bool:
    """Whether the LSTM's step runs on W_hh's panels (a batch of 1 to SMALL_M rows) rather than dot_nt."""
    return 1 <= batch <= SMALL_M


def units(batch: int) -> int:
    """Units a block of the LSTM's step: ``UNITS``, or ``UNITS_ONE_ROW`` at a batch of one."""
    return UNITS_ONE_ROW if batch == 1 else UNITS


def _streams(ctx: NodeCtx) -> bool:
    return streams(ctx.in_shape(0)[0])


def _units(ctx: NodeCtx) -> int:
    return units(ctx.in_shape(0)[0])


def _blocked(ctx: NodeCtx, key: str, expr: str, nh: int) -> str:
    """``expr`` (gate-stacked rows of the weight ``key``) in k_lstm's order, once per weights dict."""
    ctx.helper("gates_blocked", GATES_BLOCKED)
    u = _units(ctx)
    return ctx.derive(f"~gates_blocked({key},{u})", f"gates_blocked({expr}, {nh}, {u})")


def _by_unit(ctx: NodeCtx, name: str, nh: int) -> str:
    return _blocked(ctx, ctx.weight_key(name), ctx.weight(name), nh)


def _whh(ctx: NodeCtx, name: str, nh: int) -> str:
    """W_hh as k_lstm reads it: its blocked rows, and for the streaming step those rows' panels (as [-1, h])."""
    if not _streams(ctx):
        return _by_unit(ctx, name, nh)
    ctx.helper("gates_blocked", GATES_BLOCKED)
    ctx.parts.helper("gemm_panels", gemm_panels.PANELS)
    u = _units(ctx)
    expr = f"gemm_panels(gates_blocked({ctx.weight(name)}, {nh}, {u}), {4 * u})"
    return f"{ctx.derive(f'~lstm_panels({ctx.weight_key(name)},{u})', expr)}.reshape(-1, {nh})"


def _lstm_kernel(ctx: NodeCtx) -> str:
    from irc.backends.cpu.render import sdpa_simd
    from irc.backends.cpu.render.mathfns import DEVICE_JIT

    gates = LSTM_GATES.format(jit=DEVICE_JIT, sig_i=sigmoid(ctx.parts, "gi"), sig_f=sigmoid(ctx.parts, "gf"),
                              sig_o=sigmoid(ctx.parts, "go"), tanh_g=tanh(ctx.parts, "gg"),
                              tanh_c=tanh(ctx.parts, "cv"))
    ctx.parts.device("lstm_gates", gates)
    ctx.parts.device("cycles", CYCLES)
    nb = ctx.in_shape(0)[0]
    if not _streams(ctx):
        use_dot_nt(ctx.parts)
        ctx.parts.device("lstm_units", LSTM_UNITS.format(jit=DEVICE_JIT))
        src = LSTM.format(jit=JIT, name="k_lstm", h_last=H_LAST, state="", units="lstm_units", h_args="hp, hn")
        return ctx.kernel(Kernel("k_lstm", src, (A3, A2, A2, A1, A3, A2, A2, I64, I64)))
    cols = 4 * _units(ctx)
    # one row reads W_hh from L3 every step (6.8 MB of a 650-unit layer): prefetching the panel ahead there
    # only adds instructions (a 1,280-row half of that W_hh on one thread: 46.5 us against 37.1 without)
    ahead = 0 if nb == 1 else gemm_stream.AHEAD_BYTES // (4 * cols)
    block = sdpa_simd.use_pv(ctx.parts, f"lstm_hv{nb}x{cols}", nb, cols, fresh=True, stream=ahead)
    units = f"lstm_units{nb}"
    ctx.parts.device("prefetch_l2", gemm_panels.PREFETCH_L2)
    ctx.parts.device(units, LSTM_UNITS_STREAM.format(jit=DEVICE_JIT, name=units, block=block))
    name = f"k_lstm{nb}"
    state = "    hts = np.zeros((2, nh * nb), np.float32)  # the same, transposed: the streaming step's h\n"
    src = LSTM.format(jit=JIT, name=name, h_last=H_LAST, state=state, units=units,
                      h_args="hts[t % 2], hn, hts[(t + 1) % 2]")
    return ctx.kernel(Kernel(name, src, (A3, A2, A2, A1, A3, A2, A2, I64, I64)))


def render_lstm(ctx: NodeCtx) -> None:
    if torch_layout(ctx.node.attrs):
        return render_stacked(ctx)
    k = _lstm_kernel(ctx)
    seq, h, c = ctx.alloc(0), ctx.alloc(1), ctx.alloc(2)
    g, nh = ctx.weight_shape("weight_hh")
    bias = _by_unit(ctx, "bias", nh) if ctx.has_weight("bias") else f"np.zeros({g}, np.float32)"
    ctx.emit(f"{k}({ctx.args[0]}, {_by_unit(ctx, 'weight_ih', nh)}, {_whh(ctx, 'weight_hh', nh)}, "
             f"{bias}, {seq}, {h}, {c}, width={_units(ctx)}, parts={THREADS})")


def _gru_torch_kernel(ctx: NodeCtx) -> str:
    ctx.device("ftanh")
    src = GRU_TORCH.format(
        jit=SERIAL, steps=_steps("whh", 3), h_last=H_LAST,
        sig_r=sigmoid(ctx.parts, "xw[n, t, j] + bih[j] + hw[n, j] + bhh[j]"),
        sig_z=sigmoid(ctx.parts, "xw[n, t, nh + j] + bih[nh + j] + hw[n, nh + j] + bhh[nh + j]"),
    )
    return ctx.kernel(Kernel("k_gru_torch", src, (A3, A2, A2, A1, A1, A3, A2)))


def render_gru(ctx: NodeCtx) -> None:
    if torch_layout(ctx.node.attrs):
        return render_stacked(ctx)
    g, nh = ctx.weight_shape("weight_hh")
    seq, h = ctx.alloc(0), ctx.alloc(1)
    wih, whh = ctx.weight("weight_ih"), ctx.weight("weight_hh")
    ctx.device("ftanh")
    if ctx.attr("variant", "chapter") == "torch":
        k = _gru_torch_kernel(ctx)
        ctx.emit(f"{k}({ctx.args[0]}, {wih}, {whh}, {ctx.weight_or_zeros('bias_ih', g)}, "
                 f"{ctx.weight_or_zeros('bias_hh', g)}, {seq}, {h})")
        return
    src = GRU_CHAPTER.format(
        jit=SERIAL, steps=_steps("whh_n", 3), h_last=H_LAST,
        sig_r=sigmoid(ctx.parts, "xw[n, t, j] + hu[n, j] + b[j]"),
        sig_z=sigmoid(ctx.parts, "xw[n, t, nh + j] + hu[n, nh + j] + b[nh + j]"),
    )
    k = ctx.kernel(Kernel("k_gru_chapter", src, (A3, A2, A2, A2, A1, A3, A2)))
    # rows [0, 2h) of weight_hh are U_r, U_z; rows [2h, 3h) are U_n (C-contiguous views)
    ctx.emit(f"{k}({ctx.args[0]}, {wih}, {whh}[:{2 * nh}], {whh}[{2 * nh}:], "
             f"{ctx.weight_or_zeros('bias', g)}, {seq}, {h})")


# -- PyTorch's layout: the single-layer kernels above, once per layer and direction -------------


def _summed_bias(ctx: NodeCtx, sfx: str) -> tuple[str, str]:
    """(weight key, expression) of b_ih + b_hh for one pass: in an RNN or LSTM the two only ever add."""
    key = f"~sum({ctx.weight_key('bias_ih' + sfx)}, {ctx.weight_key('bias_hh' + sfx)})"
    return key, f"({ctx.weight('bias_ih' + sfx)} + {ctx.weight('bias_hh' + sfx)})"


def _pass_call(ctx: NodeCtx, kernel: str, sfx: str, x: str, seq: str, states: list[str]) -> str:
    """The kernel call of one direction of one layer, on the weights named with ``sfx``."""
    op = ctx.node.op
    g, nh = ctx.weight_shape("weight_hh" + sfx)
    wih, whh = ctx.weight("weight_ih" + sfx), ctx.weight("weight_hh" + sfx)
    has_bias = ctx.has_weight("bias_ih" + sfx)
    if op == "gru":
        bias = [ctx.weight_or_zeros("bias_ih" + sfx, g), ctx.weight_or_zeros("bias_hh" + sfx, g)]
        return f"{kernel}({x}, {wih}, {whh}, {', '.join(bias)}, {seq}, {states[0]})"
    if op == "rnn":
        b = ctx.derive(*_summed_bias(ctx, sfx)) if has_bias else f"np.zeros({g}, np.float32)"
        return f"{kernel}({x}, {wih}, {whh}, {b}, {seq}, {states[0]})"
    b = _blocked(ctx, *_summed_bias(ctx, sfx), nh) if has_bias else f"np.zeros({g}, np.float32)"
    return (f"{kernel}({x}, {_by_unit(ctx, 'weight_ih' + sfx, nh)}, {_whh(ctx, 'weight_hh' + sfx, nh)}, "
            f"{b}, {seq}, {states[0]}, {states[1]}, width={_units(ctx)}, parts={THREADS})")


def render_stacked(ctx: NodeCtx) -> None:
    """nn.RNN/LSTM/GRU's layers and directions: each pass runs the single-layer kernel, the reverse
    one on its input read backwards (a copy), its sequence written back turned round into its half
    of the layer's output; pass p's final state is row p of h (and c). Dropout is the identity at
    inference; in training (train=true) the next layer reads the sequence times its slice of the mask."""
    a = ctx.node.attrs
    mask = ctx.args[1] if a.get("train") else None
    op = ctx.node.op
    kernel = {"rnn": _rnn_kernel, "lstm": _lstm_kernel, "gru": _gru_torch_kernel}[op](ctx)
    outs = [ctx.alloc(i) for i in range(len(ctx.outs))]
    b, t = ctx.in_shape(0)[:2]
    nh, dirs, layers = int(a["hidden"]), directions(a), num_layers(a)
    x = ctx.args[0]
    for layer in range(layers):
        last = layer == layers - 1
        seq = outs[0] if last else ctx.parts.var()
        if not last:
            ctx.emit(f"{seq} = np.empty(({b}, {t}, {dirs * nh}), np.float32)")
        for d in range(dirs):
            row = layer * dirs + d
            states = [f"{s}[{row}]" for s in outs[1:]]
            src = x
            if d:
                src = ctx.parts.var()
                ctx.emit(f"{src} = np.ascontiguousarray({x}[:, ::-1])  # the reverse pass reads time backwards")
            if dirs == 1:
                ctx.emit(_pass_call(ctx, kernel, layer_suffix(layer, d), src, seq, states))
                continue
            part = ctx.parts.var()
            ctx.emit(f"{part} = np.empty(({b}, {t}, {nh}), np.float32)")
            ctx.emit(_pass_call(ctx, kernel, layer_suffix(layer, d), src, part, states))
            ctx.emit(f"{seq}[:, :, {d * nh}:{(d + 1) * nh}] = {part}{'[:, ::-1]' if d else ''}")
        x = seq
        if mask is not None and not last:
            x = ctx.parts.var()
            ctx.emit(f"{x} = {seq} * {mask}[{layer}]  # dropout between layers, the training step's mask")


# these renderers run train=true nodes too (dropout between stacked layers: emit_checks.renderer reads this)
for _render in (render_rnn, render_lstm, render_gru):
    _render.trains = True  # type: ignore[attr-defined]


RENDERERS = {
    "rnn": render_rnn,
    "lstm": render_lstm,
    "gru": render_gru,
}
