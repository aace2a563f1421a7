"""Depth lints: the vanilla RNN (W107), the LSTM forget bias (W108), deep plain stacks (W109)."""

from __future__ import annotations

from irc.lint.context import LintContext
from irc.lint.numbers import sci
from irc.lint.registry import Finding, rule
from irc.ops import get_op

RNN_S = 0.84  # the chapter's per-step factor: max|tanh'| ≈ 0.42 at healthy pre-activations, ‖W‖ = 2
RNN_MIN_STEPS = 50  # 0.84^50 = 1.6e-4: "swamped by nearer-term gradients"
LSTM_F = 0.99  # a forget gate the network holds open
FP32_TINY = 1.4e-45  # smallest positive fp32 (subnormal)


def _bound(x: float) -> str:
    return sci(x) + (" (below the smallest fp32 number, 1.4e-45)" if x < FP32_TINY else "")


def _chapter_row(steps: int) -> str:
    return "" if steps == 100 else " (0.84^100 = 2.7e-8 already at 100 steps)"


@rule("IRC-W107", "rnn-long-sequence", f"a vanilla RNN over {RNN_MIN_STEPS} or more steps")
def rnn_long(ctx: LintContext) -> list[Finding]:
    out = []
    for node in ctx.nodes("rnn"):
        steps = ctx.types[node.inputs[0]].shape[1]
        if not isinstance(steps, int) or steps < RNN_MIN_STEPS:
            continue
        relu = node.attrs["act"] == "relu"
        factor = "s = ‖W‖ (relu' is 0 or 1)" if relu else "s = max|tanh'|·‖W‖ ≈ 0.42·2 = 0.84"
        notes = [n for n in [ctx.defaulted(node.inputs[0])] if n]
        out.append(Finding(
            node,
            f"vanilla rnn over T = {steps:,} steps",
            f"backpropagation through time multiplies one Jacobian D_t·W per step, so the gradient from step T "
            f"back to step k is bounded by s^(T−k) with {factor}: across this sequence "
            f"{RNN_S}^{steps} = {_bound(RNN_S ** steps)}{_chapter_row(steps)}, numerically zero beside "
            "gradients of order 1e-2, so dependencies longer than a few dozen steps are never learnt",
            f"use lstm(x, {node.attrs['hidden']}) or gru(x, {node.attrs['hidden']}): the cell state's gradient is "
            f"a product of forget gates the network sets per channel, and f = {LSTM_F} keeps "
            f"{LSTM_F}^{steps} = {_bound(LSTM_F ** steps)}; clip gradients (norm ~1.0) for the exploding side",
            notes,
        ))
    return out


@rule("IRC-W108", "lstm-forget-bias", "an LSTM whose forget-gate bias starts at 0")
def lstm_forget_bias(ctx: LintContext) -> list[Finding]:
    # the lstm op has no forget_bias attribute yet (irc's initializer sets b_f = 1.0); this
    # rule fires once the attribute exists and says 0 (docs/lints.md)
    out = []
    for node in ctx.nodes("lstm"):
        bias = node.attrs.get("forget_bias")
        if bias is None or bias != 0 or not node.attrs.get("bias", True):
            continue
        steps = ctx.types[node.inputs[0]].shape[1]
        span = steps if isinstance(steps, int) else 100
        out.append(Finding(
            node,
            "lstm forget-gate bias starts at 0",
            f"an untrained forget gate sits at sigmoid(b_f) = sigmoid(0) = 0.50, so the cell keeps "
            f"0.50^{span} = {_bound(0.5 ** span)} of its content over {span:,} steps (memory gone in ~10) "
            "before any gradient can teach it to remember",
            "start the forget gate open: forget_bias=1.0 (sigmoid 0.73) or 2.0 (sigmoid 0.88)",
        ))
    return out


PLAIN_MAX_DEPTH = 20  # the chapter: plain 56-layer nets trained worse than 20-layer ones
JACOBIAN_NORM = 0.8


def _depth(op: str) -> int:
    """Weight matrices a gradient crosses on the shortest path through the op (its record's depth)."""
    opdef = get_op(op)
    return opdef.depth if opdef is not None else 0


@rule("IRC-W109", "deep-plain-stack", f"more than {PLAIN_MAX_DEPTH} weighted layers with no residual path")
def deep_plain(ctx: LintContext) -> list[Finding]:
    # Along the shortest path (in weighted layers) from an input to each value, the longest stretch
    # that no skip connection bypasses: a residual add x + F(x) ends a stretch (the identity carries
    # the gradient across it), so MobileNetV2's downsampling blocks between residual blocks are short
    # stretches, while a plain stack is one stretch as long as the net.
    depth: dict[str, int] = {}  # weighted layers on the shortest path
    run: dict[str, int] = {}  # ... since the last residual join on that path
    worst: dict[str, int] = {}  # the longest stretch on that path
    joins = 0
    for node in ctx.graph.nodes:
        ins = [v for v in node.inputs if v in depth]
        if ctx.residual(node) is not None:
            joins += 1
            d, r, w = min(depth[v] for v in ins), 0, max(worst[v] for v in ins)
        elif ins:
            first = min(ins, key=lambda v: depth[v])
            d, r = depth[first] + _depth(node.op), run[first] + _depth(node.op)
            w = max(worst[first], r)
        else:
            d = r = w = _depth(node.op)
        for v in node.outputs:
            depth[v], run[v], worst[v] = d, r, w
    out = []
    for value in dict.fromkeys(ctx.output_values()):
        d = worst.get(value, 0)
        if d <= PLAIN_MAX_DEPTH:
            continue
        what = (f"every path to output '{value}' crosses {d} weighted layers with no residual connection" if not joins
                else f"the path to output '{value}' crosses a stretch of {d} weighted layers that no residual "
                     "connection bypasses")
        out.append(Finding(
            ctx.producer(value),
            what,
            f"the gradient reaching the first layer is a product of {d} Jacobians: at ‖J‖ = {JACOBIAN_NORM} per "
            f"layer that is {JACOBIAN_NORM}^{d} = {sci(JACOBIAN_NORM ** d)} (the chapter: 0.8^50 = 1.4e-5), and "
            "plain 56-layer nets train worse than 20-layer ones",
            "wrap blocks in residual connections, y = x + F(x): the identity path keeps the gradient floor at 1 "
            "at any depth; add normalization inside the blocks",
        ))
    return out
