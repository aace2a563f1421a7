"""``irc lint --measure``: the lints that state a claim about gradients at initialisation cite the figure
``irc analyze --gradients`` measures for it (irc/analysis/gradients.py), next to the formula.

One measurement per model, shared by every warning that reads it: ``measure_gradients`` on the graph the
lints saw (sizes bound the same way), with the seed and batch count ``analyze --gradients`` takes and its
defaults when they are not given. ``READERS`` says which figure each rule cites, keyed by rule code; a
rule not in it gets no measurement (and costs none). What is printed is what is measured, and nothing
else: the numbers go through ``gradient_report``'s own formatting, so the note and
``analyze --gradients`` print the same digits, and the JSON fields are its JSON objects.

The attention-scale rule (W102) is the one that needs a second run: the same model with the flagged
layers at the default 1/√d_k (same seed, so the same weights and batches), compared on ‖∂L/∂W_q‖ and
‖∂L/∂W_k‖, the gradient that reaches the score projections only through the softmax. The softmax's
probabilities themselves are inside the fused attention op, not values the analysis can probe, so no
saturation fraction is claimed.

A model too large for the float64 NumPy reference to run in seconds is not run: its warnings get a
"not measured" note naming the limit it exceeds (irc/analysis/gradient_limits.py: ``LINT``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from irc.analysis.gradient_limits import LINT, refusal
from irc.analysis.gradient_report import depth_json, depth_summary, fmt_g, jnum, rectifier_json, time_json
from irc.analysis.gradients import DepthProfile, GradientReport, measure_gradients
from irc.diagnostics import IrcError, UsageError
from irc.graph import Graph, Node
from irc.lint.context import LintContext
from irc.lint.warning import LintWarning, Measured


@dataclass(frozen=True)
class MeasureOptions:
    """``--seed`` and ``--batches`` as given; None takes ``measure_gradients``' defaults (analyze's)."""

    seed: int | None = None
    batches: int | None = None

    def __post_init__(self) -> None:
        if self.batches is not None and self.batches < 1:
            raise UsageError(f"--batches must be at least 1, got {self.batches}")

    def kwargs(self) -> dict[str, int]:
        return {k: v for k, v in (("seed", self.seed), ("batches", self.batches)) if v is not None}


class Measurement:
    """The lazily run, shared measurement of one model, and what the readers ask of it."""

    def __init__(self, ctx: LintContext, options: MeasureOptions, default_scale: list[Node]):
        self.ctx = ctx
        self.options = options
        self.default_scale = default_scale  # W102's layers, re-measured at 1/√d_k

    @cached_property
    def refusal(self) -> str | None:
        """Why the model is not measured, or None."""
        analysis = self.ctx.analysis
        if analysis is None:
            return "not measured: the model's sizes are not all bound (bind them with -D)"
        why = refusal(analysis.totals, LINT)
        return None if why is None else f"not measured: {why}"

    def _run(self, graph: Graph) -> GradientReport | str:
        try:
            return measure_gradients(graph, **self.options.kwargs())
        except IrcError as e:  # the model has no gradient to measure (a training step, no float output…)
            return f"not measured: {e.message}"

    @cached_property
    def report(self) -> GradientReport | str:
        return self.refusal or self._run(self.ctx.graph)

    @cached_property
    def report_default_scale(self) -> GradientReport | str:
        graph = self.ctx.graph.copy()
        at = {id(n) for n in self.default_scale}
        for node, copy in zip(self.ctx.graph.nodes, graph.nodes):
            if id(node) in at:
                copy.attrs["scale"] = None  # the record's default, 1/√d_k
        return self.refusal or self._run(graph)

    def header(self, r: GradientReport) -> str:
        return f"measured at init (seed {r.seed}, {r.batches} batch{'es' if r.batches != 1 else ''}, {r.loss} loss)"

    def fields(self, r: GradientReport, **found: Any) -> dict[str, Any]:
        return {"status": "measured", "seed": r.seed, "batches": r.batches, "loss": r.loss, **found}

    def profile_near(self, node: Node) -> DepthProfile | None:
        """The depth profile on ``node``'s path: one with a block output that feeds ``node`` or is fed by
        it; the one with the most blocks when several are."""
        assert isinstance(self.report, GradientReport)
        out = node.outputs[0]
        ctx = self.ctx

        def related(v: str | None) -> bool:
            return v is not None and (v == out or ctx.feeds(v, out) or ctx.feeds(out, v))

        found = [d for d in self.report.depth if any(related(b.value) for b in d.blocks)]
        return max(found, key=lambda d: len(d.blocks)) if found else None


Reader = Callable[[Measurement, Node, GradientReport], Measured]


def _missing(what: str) -> Measured:
    return Measured(f"not measured: the gradient analysis has no {what} here", {"status": "not measured",
                                                                               "reason": f"no {what}"})


def read_time(m: Measurement, node: Node, r: GradientReport) -> Measured:
    """‖∂L_T/∂x_1‖/‖∂L_T/∂x_T‖ of the recurrent layer's input sequence (W107, W108)."""
    t = next((t for t in r.time if t.layer == node.outputs[0]), None)
    if t is None:
        return _missing("time profile of this layer (its input is not a float [B, T, D] sequence)")
    loss = "the loss at the last step only" if t.loss_at == "last step" else "the loss as written"
    verdict = f": {t.verdict()}" if t.verdict() else ""
    return Measured(f"{m.header(r)}: ‖∂L_T/∂x_1‖/‖∂L_T/∂x_T‖ = {fmt_g(t.first_to_last())} over {len(t.grad_norms)} "
                    f"steps (×{fmt_g(t.factor())} per step; {loss}){verdict}", m.fields(r, time=time_json(t)))


def read_depth(m: Measurement, node: Node, r: GradientReport) -> Measured:
    """First-to-last ‖∂L/∂h‖ and ‖∂L/∂W‖ over the blocks on the warning's path (W104, W109), and the dead
    rectifier units in those blocks."""
    d = m.profile_near(node)
    if d is None:
        return _missing("repeated blocks or weight-owning layers on this path to compare first with last")
    verdict = f": {d.verdict()}" if d.verdict() else ""
    text = (f"{m.header(r)}: over the {len(d.blocks)} {'layers' if d.stack == 'layers' else 'blocks'} of "
            f"{d.stack}, {depth_summary(d).strip()}{verdict}")
    names = {b.block for b in d.blocks}
    dead = [u for u in r.rectifiers if d.stack == "layers" or any(u.block == b or u.block.startswith(b + ".")
                                                                   for b in names)]
    found: dict[str, Any] = {"depth": depth_json(d)}
    if dead:
        units, gone = sum(u.units for u in dead), sum(u.dead for u in dead)
        samples = "/".join(str(s) for s in sorted({u.samples for u in dead}))
        ops = ", ".join(sorted({u.op for u in dead}))
        text += (f"; dead {ops} units (pre-activation ≤ 0 on all {samples} samples): {gone:,} of {units:,} "
                 f"({100 * gone / units:.1f}%) in {len(dead)} layer{'s' if len(dead) != 1 else ''}")
        found["rectifiers"] = [rectifier_json(u) for u in dead]
        found["dead_units"] = gone
        found["rectifier_units"] = units
    return Measured(text, m.fields(r, **found))


def read_stream_variance(m: Measurement, node: Node, r: GradientReport) -> Measured:
    """var(h) of the residual stream after the first and the last block, forward (W103)."""
    d = m.profile_near(node)
    if d is None or d.blocks[0].activation_var is None or d.blocks[-1].activation_var is None:
        return _missing("block outputs on the residual stream")
    first, last = d.blocks[0], d.blocks[-1]
    growth = last.activation_var / first.activation_var if first.activation_var else None
    text = (f"{m.header(r)}: the residual stream leaves {last.block} (the last of {len(d.blocks)} blocks) with "
            f"var(h) = {fmt_g(last.activation_var)} (sd {fmt_g(last.activation_var ** 0.5)}); after {first.block} it "
            f"was {fmt_g(first.activation_var)}" + (f" (×{fmt_g(growth)})" if growth is not None else ""))
    return Measured(text, m.fields(r, depth=depth_json(d), first_block_var=jnum(first.activation_var),
                                   last_block_var=jnum(last.activation_var), growth=jnum(growth)))


def read_attention_scale(m: Measurement, node: Node, r: GradientReport) -> Measured:
    """‖∂L/∂W_q‖ and ‖∂L/∂W_k‖ at the layer's scale= and at the default 1/√d_k, same weights (W102)."""
    from irc.ops.attention import head_dim, score_scale
    from irc.runtime.weights import node_weight_keys

    base = m.report_default_scale
    if isinstance(base, str):
        return Measured(base, {"status": "not measured", "reason": base.removeprefix("not measured: ")})
    keys = node_weight_keys(node, m.ctx.types)
    given = {w.key: w.grad_norm for w in r.weights}
    default = {w.key: w.grad_norm for w in base.weights}
    parts, found = [], {}
    for name in ("wq", "wk"):
        key = keys.get(name)
        if key is None or given.get(key) is None or default.get(key) is None:
            continue
        a, b = given[key], default[key]
        ratio = a / b if b else None
        parts.append(f"‖∂L/∂{key}‖ = {fmt_g(a)} at scale={node.attrs['scale']:g}, {fmt_g(b)} at 1/√d_k"
                     + (f" (×{fmt_g(ratio)})" if ratio is not None else ""))
        found[name] = {"key": key, "grad_norm": jnum(a), "grad_norm_default_scale": jnum(b), "ratio": jnum(ratio)}
    if not parts:
        return _missing("gradient of this layer's W_q or W_k")
    # scores = scale·q·kᵀ, so the scale's own factor in ∂L/∂q between the two runs is scale·√d_k; the rest of
    # the ratio is what the softmax's Jacobian did at each scale
    own = node.attrs["scale"] / score_scale({}, head_dim(node.attrs, m.ctx.types[node.inputs[0]].shape[-1]))
    text = (f"{m.header(r)}: {'; '.join(parts)}; scores = scale·q·kᵀ, so ×{fmt_g(own)} of that is the scale's own "
            "factor and the rest the softmax's Jacobian, the only path to W_q and W_k (re-measured with this layer "
            "at the default scale: same weights, same batches)")
    return Measured(text, m.fields(r, attention={"scale": node.attrs["scale"], "scale_factor": jnum(own), **found}))


# rule code -> the figure its warning cites (the rules' own modules stay formula-only)
READERS: dict[str, Reader] = {
    "IRC-W102": read_attention_scale,  # attention-scale
    "IRC-W103": read_stream_variance,  # prenorm-no-final-norm: the stream's variance growth
    "IRC-W104": read_depth,  # postnorm-deep
    "IRC-W107": read_time,  # rnn-long-sequence
    "IRC-W108": read_time,  # lstm-forget-bias
    "IRC-W109": read_depth,  # deep-plain-stack (with dead rectifier units)
}


def attach_measurements(graph: Graph, warnings: list[LintWarning], options: MeasureOptions,
                        context: int | None = None) -> list[LintWarning]:
    """``warnings`` with ``measured`` set on each whose rule is in ``READERS``; the model runs only if one is."""
    wanted = [w for w in warnings if w.code in READERS]
    if not wanted:
        return warnings
    ctx = LintContext(graph, context)  # the graph the rules saw: the same bound sizes, the same node order
    nodes = ctx.graph.nodes

    def anchor(w: LintWarning) -> Node | None:
        return nodes[w.order] if 0 <= w.order < len(nodes) else None

    scaled = [n for w in wanted if w.code == "IRC-W102" and (n := anchor(w)) is not None]
    m = Measurement(ctx, options, scaled)
    out = []
    for w in warnings:
        node = anchor(w) if w.code in READERS else None
        if node is not None:
            r = m.report
            measured = (Measured(r, {"status": "not measured", "reason": r.removeprefix("not measured: ")})
                        if isinstance(r, str) else READERS[w.code](m, node, r))
            w = replace(w, measured=measured)
        out.append(w)
    return out
