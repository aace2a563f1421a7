"""``irc analyze --gradients`` as text and as the JSON ``gradients`` object (docs/analysis-json.md).

Numbers print to 3 significant digits in the table and 6 in JSON, so the output is the same on every
run on one machine (the measurement itself is deterministic for a seed)."""

from __future__ import annotations

from math import isfinite
from typing import Any

from irc.analysis.dead_units import RectifierUnits
from irc.analysis.gradients import VANISHING, DepthProfile, GradientReport, TimeProfile

_MAX_STEPS = 12  # rows of a time profile in the table (the JSON has every step)


def fmt_g(x: float | None) -> str:
    """A measured figure as the table and ``irc lint --measure`` print it: 3 significant digits, — if absent."""
    return "—" if x is None or not isfinite(x) else f"{x:.3g}"


def jnum(x: float | None) -> float | None:
    """A measured figure as JSON carries it: 6 significant digits, null if absent or not finite."""
    return None if x is None or not isfinite(x) else float(f"{x:.6g}")


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    return [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _steps(count: int) -> list[int]:
    """The (0-based) steps a time profile's table shows: the first, evenly spaced ones, the last."""
    if count <= _MAX_STEPS:
        return list(range(count))
    stride = (count - 1) / (_MAX_STEPS - 1)
    return sorted({round(i * stride) for i in range(_MAX_STEPS)})


def depth_summary(d: DepthProfile) -> str:
    parts = []
    if d.activation_first_to_last() is not None:
        parts.append(f"‖∂L/∂h‖ {fmt_g(d.activation_first_to_last())} (×{fmt_g(d.activation_factor())} per block)")
    if d.weight_first_to_last() is not None:
        parts.append(f"‖∂L/∂W‖ {fmt_g(d.weight_first_to_last())} (×{fmt_g(d.weight_factor())} per block)")
    return "  first/last: " + ("; ".join(parts) if parts else "—")


def verdict_line(r: GradientReport) -> str:
    """One line: which profiles vanish or explode (first-to-last ratio below 1e-3 or above 1e3)."""
    found = []
    for d in r.depth:
        v = d.verdict()
        if v:
            what = "‖∂L/∂h‖" if d.measure == "activation" else "‖∂L/∂W‖"
            found.append(f"{v} through {d.stack}: {what} of {d.blocks[0].block} is {fmt_g(d.first_to_last())} × "
                         f"{d.blocks[-1].block}'s (×{fmt_g(d.factor())} per block)")
    for t in r.time:
        v = t.verdict()
        if v:
            found.append(f"{v} through time in {t.layer}: ‖∂L/∂x_1‖ is {fmt_g(t.first_to_last())} × ‖∂L/∂x_T‖ "
                         f"(×{fmt_g(t.factor())} per step over {len(t.grad_norms)})")
    if found:
        return "verdict: " + "; ".join(found)
    if not r.depth and not r.time:
        return "verdict: no repeated blocks, layers or recurrent inputs to compare first with last"
    return (f"verdict: no vanishing or exploding gradient (every first-to-last ratio within {VANISHING:g} … "
            f"{1 / VANISHING:g})")


def to_text(r: GradientReport) -> str:
    out = ["gradients at initialisation (NumPy reference, float64)",
           f"  loss {r.loss} ({r.loss_source}); seed {r.seed}, {r.batches} batch{'es' if r.batches != 1 else ''}: "
           f"mean loss {fmt_g(r.loss_value)}",
           "  weights by the records' init rules; inputs as irc run --seed draws them (seed + batch); "
           "norms are Frobenius norms averaged over the batches", ""]
    rows = [[w.key, _shape(w.shape), fmt_g(w.weight_norm), fmt_g(w.grad_norm), fmt_g(w.ratio)] for w in r.weights]
    out += _table(["weight", "shape", "‖W‖", "‖∂L/∂W‖", "‖∂L/∂W‖/‖W‖"], rows, {2, 3, 4})
    if r.inputs:
        out += ["", *_table(["input", "‖∂L/∂x‖"], [[k, fmt_g(v)] for k, v in r.inputs.items()], {1})]
    for d in r.depth:
        what = "blocks" if d.stack != "layers" else "layers in order"
        out += ["", f"depth: {d.stack} ({len(d.blocks)} {what}; h = the block's output)"]
        rows = [[b.block, fmt_g(b.grad_norm), fmt_g(b.activation_grad_norm), fmt_g(b.activation_var), b.value or "—"]
                for b in d.blocks]
        out += _table(["block", "‖∂L/∂W‖", "‖∂L/∂h‖", "var(h)", "h"], rows, {1, 2, 3})
        out.append(depth_summary(d))
    for t in r.time:
        out += ["", f"time: {t.layer} ({t.op}, {len(t.grad_norms)} steps, input {t.value}, loss {t.loss_at})"]
        out += _table(["step", "‖∂L/∂x_t‖"], [[str(i + 1), fmt_g(t.grad_norms[i])] for i in _steps(len(t.grad_norms))],
                      {0, 1})
        out.append(f"  first/last: {fmt_g(t.first_to_last())} (×{fmt_g(t.factor())} per step)")
    if r.rectifiers:
        out += ["", *_rectifier_table(r.rectifiers)]
    for v, (g, var) in r.probes.items():
        out.append(f"probe {v}: ‖∂L/∂v‖ {fmt_g(g)}, var(v) {fmt_g(var)}")
    out += ["", verdict_line(r)]
    return "\n".join(out) + "\n"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _rectifier_table(rows: list[RectifierUnits]) -> list[str]:
    samples = sorted({r.samples for r in rows})
    head = (f"rectifiers: dead units (pre-activation ≤ 0 for all {'/'.join(str(s) for s in samples)} samples; "
            "a unit is one element of a sample)")
    cells = [[r.layer, r.op, r.value, str(r.units), str(r.dead), _pct(r.dead_fraction), _pct(r.nonpositive_fraction)]
             for r in rows]
    return [head, *_table(["layer", "op", "pre-activation", "units", "dead", "dead %", "≤ 0 %"], cells, {3, 4, 5, 6})]


def rectifier_json(r: RectifierUnits) -> dict[str, Any]:
    return {"layer": r.layer, "op": r.op, "block": r.block, "value": r.value, "units": r.units,
            "samples": r.samples, "dead": r.dead, "dead_fraction": jnum(r.dead_fraction),
            "nonpositive_fraction": jnum(r.nonpositive_fraction)}


def depth_json(d: DepthProfile) -> dict[str, Any]:
    return {
        "stack": d.stack,
        "measure": d.measure,
        "first_to_last": jnum(d.first_to_last()),
        "factor_per_block": jnum(d.factor()),
        "activation_first_to_last": jnum(d.activation_first_to_last()),
        "weight_first_to_last": jnum(d.weight_first_to_last()),
        "verdict": d.verdict(),
        "blocks": [{"block": b.block, "weight_norm": jnum(b.weight_norm), "grad_norm": jnum(b.grad_norm),
                    "value": b.value, "activation_grad_norm": jnum(b.activation_grad_norm),
                    "activation_var": jnum(b.activation_var)} for b in d.blocks],
    }


def time_json(t: TimeProfile) -> dict[str, Any]:
    return {"layer": t.layer, "op": t.op, "value": t.value, "loss_at": t.loss_at, "steps": len(t.grad_norms),
            "first_to_last": jnum(t.first_to_last()), "factor_per_step": jnum(t.factor()), "verdict": t.verdict(),
            "grad_norms": [jnum(x) for x in t.grad_norms]}


def to_json(r: GradientReport) -> dict[str, Any]:
    verdicts = [v for v in [*(d.verdict() for d in r.depth), *(t.verdict() for t in r.time)] if v]
    return {
        "loss": r.loss,
        "loss_source": r.loss_source,
        "seed": r.seed,
        "batches": r.batches,
        "dtype": "f64",
        "loss_value": jnum(r.loss_value),
        "weights": [{"key": w.key, "shape": list(w.shape), "block": w.block, "weight_norm": jnum(w.weight_norm),
                     "grad_norm": jnum(w.grad_norm), "ratio": jnum(w.ratio)} for w in r.weights],
        "inputs": [{"name": k, "grad_norm": jnum(v)} for k, v in r.inputs.items()],
        "depth": [depth_json(d) for d in r.depth],
        "time": [time_json(t) for t in r.time],
        "rectifiers": [rectifier_json(x) for x in r.rectifiers],
        "verdict": _overall(verdicts),
        "verdict_line": verdict_line(r).removeprefix("verdict: "),
    }


def _overall(found: list[str]) -> str | None:
    """"vanishing", "exploding", "vanishing and exploding" (different profiles), or None."""
    kinds = sorted(set(found), reverse=True)
    return " and ".join(kinds) if kinds else None
