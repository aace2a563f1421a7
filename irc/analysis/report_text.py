"""The analysis as a readable table: one row per layer, block subtotals, then a summary."""

from __future__ import annotations

from irc.analysis.analyze import Analysis, Row
from irc.analysis.receptive import RJ
from irc.analysis.units import binary_bytes, commas, count_words, si

_HEAD = ("layer", "op", "type", "params", "FLOPs", "activations", "r / j")


def _rj(rj: RJ | None) -> str:
    if rj is None:
        return ""
    r, j = rj
    fmt = (lambda v: str(v[0]) if len(set(v)) == 1 else "×".join(map(str, v)))
    return f"r={fmt(r)} j={fmt(j)}"


def _cells(r: Row) -> tuple[str, ...]:
    params = commas(r.params) + (" (shared)" if r.shared and not r.params else "")
    return (r.name, r.op, str(r.types[0]), params, si(r.cost.total, "FLOP") if r.cost.total else "0",
            binary_bytes(r.activation_bytes) if r.activation_bytes else "-", _rj(r.rj))


def _table(a: Analysis) -> list[str]:
    lines: list[tuple[str, ...] | str] = []
    run: list[Row] = []

    def close_run() -> None:
        if run and run[0].group:
            params = sum(x.params for x in run)
            flops = sum(x.cost.total for x in run)
            act = sum(x.activation_bytes for x in run)
            lines.append(("  " + f"{run[0].group} subtotal", f"{len(run)} ops", "", commas(params),
                          si(flops, "FLOP") if flops else "0", binary_bytes(act) if act else "-", ""))
            lines.append("")
        run.clear()

    for r in a.rows:
        if run and r.group != run[0].group:
            close_run()
        run.append(r)
        lines.append(_cells(r))
    close_run()
    cells = [x for x in lines if isinstance(x, tuple)]
    columns = len(_HEAD) if any(r.rj for r in a.rows) else len(_HEAD) - 1  # r / j only where spatial
    widths = [max(len(c[i]) for c in [_HEAD, *cells]) for i in range(columns)]
    right = {3, 4, 5}

    def fmt(c: tuple[str, ...]) -> str:
        parts = [c[i].rjust(widths[i]) if i in right else c[i].ljust(widths[i]) for i in range(columns)]
        return "  ".join(parts).rstrip()

    out = [fmt(_HEAD), "  ".join("-" * w for w in widths)]
    out += [fmt(x) if isinstance(x, tuple) else x for x in lines]
    while out and not out[-1]:
        out.pop()
    return out


def _also(exact: str, readable: str) -> str:
    """``exact (readable)``, or just ``exact`` when the two say the same."""
    return exact if readable.split(" ")[0] == exact.split(" ")[0] else f"{exact} ({readable})"


def _summary(a: Analysis) -> list[str]:
    t, o = a.totals, a.options
    rows: list[tuple[str, str]] = [
        ("parameters", _also(commas(t["params"]), count_words(t["params"]))
         + (f"; buffers {commas(t['buffers'])}" if t["buffers"] else "")),
        (f"weights ({o.dtype})", _also(f"{commas(t['weight_bytes'])} B", binary_bytes(t["weight_bytes"]))
         + (f"; buffers {binary_bytes(t['buffer_bytes'])}" if t["buffer_bytes"] else "")),
        ("forward", _also(f"{commas(t['flops_forward'])} FLOPs", si(t["flops_forward"], "FLOP"))
         + f"; {commas(t['macs_forward'])} multiply-adds"),
    ]
    for kind, f in a.flops_by_kind.items():
        if f:
            rows.append((f"  {kind}", f"{si(f, 'FLOP')} ({100 * f / t['flops_forward']:.1f}%)"))
    rows.append(("training", _also(f"{commas(t['flops_training'])} FLOPs", si(t["flops_training"], "FLOP"))
                 + "; backward = 2× forward for products, 1× for the rest"))
    tr = a.transformer
    if t["tokens"]:
        fwd = f"forward {si(t['flops_forward_per_token'], 'FLOP')}"
        train = f"training {si(t['flops_training_per_token'], 'FLOP')}"
        if tr and tr["forward_vs_2n"] is not None:
            fwd += f" ({tr['forward_vs_2n']:.3f} × 2N)"
            train += f" ({tr['training_vs_6n']:.3f} × 6N)"
        rows.append(("per token", f"{fwd}; {train} (over {commas(t['tokens'])} tokens)"))
    peak = a.rows[a.memory.peak_node].name if a.rows else ""
    rows.append(("activations", f"{binary_bytes(t['activation_bytes'])} in all; peak live "
                 f"{binary_bytes(t['peak_activation_bytes'])} (at {peak}); saved for training "
                 f"{binary_bytes(t['saved_activation_bytes_training'])}"))
    if a.kv.cached_layers:
        kv = f"{commas(t['kv_cache_bytes_per_token'])} B/token ({binary_bytes(t['kv_cache_bytes_per_token'])}) " \
             f"at {o.kv_dtype} over {a.kv.cached_layers} layers"
        if t["kv_cache_context_tokens"]:
            kv += f"; {binary_bytes(t['kv_cache_bytes'])} at {commas(t['kv_cache_context_tokens'])} tokens"
        if t["kv_cache_window_tokens"]:
            kv += f" (sliding window: no more than {commas(t['kv_cache_window_tokens'])} tokens per layer)"
        rows.append(("KV cache", kv))
    if t["kv_cache_cross_bytes"]:
        rows.append(("cross-attention KV", binary_bytes(t["kv_cache_cross_bytes"])))
    if t["recurrent_state_bytes"]:
        rows.append(("recurrent state", f"{binary_bytes(t['recurrent_state_bytes'])}, whatever the length"))
    if tr:
        rows.append(("attention crossover", f"{commas(tr['attention_crossover_tokens'])} tokens (parameter matmuls "
                     f"{commas(tr['matmul_flops_per_token_per_layer'])} FLOPs/token/layer vs attention "
                     f"{commas(tr['attention_flops_per_token_per_layer_per_key'])} per key; d = "
                     f"{commas(tr['d_model'])})"))
    if a.final_rj:
        rows.append(("receptive field", f"{_rj(a.final_rj).replace('r=', 'r = ').replace(' j=', ', j = ')} "
                     "(last spatial layer)"))
    m = a.relu_mlp
    if m:
        bound = m["linear_regions_lower_bound"]
        shown = commas(bound) if bound is not None else f"10^{m['linear_regions_lower_bound_log10']:,.1f}"
        text = f"depth {m['depth']}, input {m['input_dim']}; ≥ {shown} linear regions (Montúfar 2014)"
        if m["fold_regions"]:
            text += f"; the fold reaches 2^{m['depth']} = {commas(m['fold_regions'])}"
        if m["one_layer_max_regions"]:
            text += f"; one layer has at most {commas(m['one_layer_max_regions'])}"
        rows.append(("ReLU MLP", text))
    width = max(len(k) for k, _ in rows)
    return [f"  {k.ljust(width)}  {v}" for k, v in rows]


def analysis_to_text(a: Analysis, file: str) -> str:
    bindings = ", ".join(b.describe() for b in a.bindings) or "none"
    head = [
        f"model {a.graph.name} ({file})",
        f"bindings: {bindings}",
        f"weights {a.options.dtype}, activations {a.options.act_dtype}, KV cache {a.options.kv_dtype}",
        "",
    ]
    return "\n".join(head + _table(a) + ["", "summary"] + _summary(a)) + "\n"
