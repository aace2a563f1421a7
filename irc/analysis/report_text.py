"""The analysis for people: one row per layer (or per folded block with ``--depth``), block subtotals,
then a summary, the training plan (``--train``) and the roofline (``--hardware``). The same rows
render as an aligned table, CSV (exact numbers) or Markdown."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from irc.analysis.analyze import Analysis, Row
from irc.analysis.groups import fold_key
from irc.analysis.receptive import RJ
from irc.analysis.report_sections import performance_lines, training_lines
from irc.analysis.units import binary_bytes, commas, count_words, seconds, si

_HEAD = ("layer", "op", "type", "params", "FLOPs", "activations", "r / j")
_PERF_HEAD = ("bytes", "FLOP/B", "time", "bound")


@dataclass
class Line:
    """One row of the table: a layer, or several folded into one."""

    name: str
    op: str
    type: str
    params: int
    shared: bool
    flops: int
    activation_bytes: int
    rj: RJ | None
    bytes: int
    time_s: float | None
    bound: str
    count: int = 1  # copies of a repeated block folded into this row
    subtotal: bool = False


def _rj(rj: RJ | None) -> str:
    if rj is None:
        return ""
    r, j = rj
    fmt = (lambda v: str(v[0]) if len(set(v)) == 1 else "×".join(map(str, v)))
    return f"r={fmt(r)} j={fmt(j)}"


def _line(a: Analysis, r: Row) -> Line:
    t = a.times[r.index] if a.times else None
    return Line(r.name, r.op, str(r.types[0]), r.params, r.shared, r.cost.total, r.activation_bytes, r.rj,
                r.traffic.total + (t.kv_read + t.kv_written if t else 0), t.time_s if t else None,
                t.bound if t else "")


def _sum(name: str, op: str, rows: list[Line], count: int, subtotal: bool) -> Line:
    times = [x.time_s for x in rows if x.time_s is not None]
    time = sum(times) if times else None
    bound = ""
    if time:
        by = {"compute": 0.0, "memory": 0.0}
        for x in rows:
            if x.bound:
                by[x.bound] += x.time_s or 0.0
        bound = max(by, key=lambda k: (by[k], k == "compute"))
    return Line(name, op, rows[-1].type if not subtotal else "", sum(x.params for x in rows), False,
                sum(x.flops for x in rows), sum(x.activation_bytes for x in rows), rows[-1].rj,
                sum(x.bytes for x in rows), time, bound, count, subtotal)


def table_lines(a: Analysis, depth: int | None) -> list[Line | None]:
    """The rows to print; None separates blocks. ``depth`` folds rows by scope (repeat copies into one)."""
    rows = [_line(a, r) for r in a.rows]
    out: list[Line | None] = []
    if depth is None:
        run: list[tuple[Row, Line]] = []

        def close() -> None:
            if run and run[0][0].group:
                out.append(_sum(f"  {run[0][0].group} subtotal", f"{len(run)} ops", [x for _, x in run], 1, True))
                out.append(None)
            run.clear()

        for r, x in zip(a.rows, rows):
            if run and r.group != run[0][0].group:
                close()
            run.append((r, x))
            out.append(x)
        close()
        return out
    # names are unique, so only the copies of one repeat(N) block share a key: fold them wherever
    # they fall (at depth 2 a block's parts interleave), in order of first appearance
    folded: dict[str, list[tuple[Row, Line]]] = {}
    for r, x in zip(a.rows, rows):
        folded.setdefault(fold_key(r.name, depth) or r.name, []).append((r, x))
    for key, members in folded.items():
        if len(members) == 1:
            out.append(members[0][1])
            continue
        copies = {tuple(p for p in m.name.split(".")[: len(key.split("."))] if p.isdigit()) for m, _ in members}
        ops = {m.op for m, _ in members}
        per_copy = len(members) // max(len(copies), 1)
        op = ops.pop() if len(ops) == 1 else f"{per_copy} ops"
        out.append(_sum(key, op, [x for _, x in members], len(copies), False))
    return out


def _cells(x: Line, perf: bool) -> tuple[str, ...]:
    params = commas(x.params) + (" (shared)" if x.shared and not x.params else "")
    name = x.name + (f" ×{x.count}" if x.count > 1 else "")
    cells = (name, x.op, x.type, params, si(x.flops, "FLOP") if x.flops else "0",
             binary_bytes(x.activation_bytes) if x.activation_bytes else "-", _rj(x.rj))
    if perf:
        intensity = f"{x.flops / x.bytes:,.1f}" if x.bytes and x.flops else "-"
        cells += (binary_bytes(x.bytes) if x.bytes else "-", intensity,
                  seconds(x.time_s) if x.time_s else "-", x.bound)
    return cells


def _table(a: Analysis, depth: int | None) -> list[str]:
    perf = a.times is not None
    lines = table_lines(a, depth)
    head = _HEAD + (_PERF_HEAD if perf else ())
    cells = [_cells(x, perf) for x in lines if x is not None]
    has_rj = any(r.rj for r in a.rows)
    columns = [i for i in range(len(head)) if has_rj or i != 6]  # r / j only where spatial
    widths = {i: max(len(c[i]) for c in [head, *cells]) for i in columns}
    right = {3, 4, 5, 7, 8, 9}

    def fmt(c: tuple[str, ...]) -> str:
        parts = [c[i].rjust(widths[i]) if i in right else c[i].ljust(widths[i]) for i in columns]
        return "  ".join(parts).rstrip()

    out = [fmt(head), "  ".join("-" * widths[i] for i in columns)]
    out += [fmt(_cells(x, perf)) if x is not None else "" for x in lines]
    while out and not out[-1]:
        out.pop()
    return out


def _also(exact: str, readable: str) -> str:
    """``exact (readable)``, or just ``exact`` when the two say the same."""
    return exact if readable.split(" ")[0] == exact.split(" ")[0] else f"{exact} ({readable})"


def _relu_mlp(m: dict) -> str:
    bound = m["linear_regions_lower_bound"]
    text = f"depth {m['depth']}, input {m['input_dim']}; "
    if bound == 0:
        narrow = min(m["hidden_widths"][:-1] or m["hidden_widths"])
        text += (f"Montúfar's lower bound on linear regions says nothing here (a hidden width of {narrow} is "
                 f"below the input's {m['input_dim']}, so a factor ⌊w/d_in⌋ is 0)")
    else:
        shown = commas(bound) if bound is not None else f"10^{m['linear_regions_lower_bound_log10']:,.1f}"
        text += f"≥ {shown} linear regions (Montúfar 2014)"
    if m["fold_regions"]:
        text += f"; the fold reaches 2^{m['depth']} = {commas(m['fold_regions'])}"
    if m["one_layer_max_regions"]:
        text += f"; one layer has at most {commas(m['one_layer_max_regions'])}"
    return text


def summary_rows(a: Analysis) -> list[tuple[str, str]]:
    t, o = a.totals, a.options
    rows: list[tuple[str, str]] = [
        ("parameters", _also(commas(t["params"]), count_words(t["params"]))
         + (f"; {_also(commas(t['params_active']), count_words(t['params_active']))} active per token"
            if t["params_active"] != t["params"] else "")
         + (f"; buffers {commas(t['buffers'])}" if t["buffers"] else "")),
        (f"weights ({o.dtype})", _also(f"{commas(t['weight_bytes'])} B", binary_bytes(t["weight_bytes"]))
         + (f"; buffers {binary_bytes(t['buffer_bytes'])}" if t["buffer_bytes"] else "")),
        ("forward", _also(f"{commas(t['flops_forward'])} FLOPs", si(t["flops_forward"], "FLOP"))
         + f"; {commas(t['macs_forward'])} multiply-adds"),
    ]
    for kind, f in a.flops_by_kind.items():
        if f:
            rows.append((f"  {kind}", f"{si(f, 'FLOP')} ({100 * f / t['flops_forward']:.1f}%)"))
    rows.append(("training FLOPs", _also(f"{commas(t['flops_training'])} FLOPs", si(t["flops_training"], "FLOP"))
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
                 f"{binary_bytes(t['peak_activation_bytes'])} (at {peak}); saved for backward "
                 f"{binary_bytes(t['saved_activation_bytes_backward'])} (activations only; --train for the rest)"))
    rows.append(("bytes moved", f"{binary_bytes(t['bytes_read'])} read, {binary_bytes(t['bytes_written'])} written "
                 "(operands and weights in, results out)"))
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
                     f"(last spatial layer{_field_end(a)})"))
    if a.relu_mlp:
        rows.append(("ReLU MLP", _relu_mlp(a.relu_mlp)))
    return rows


def _field_end(a: Analysis) -> str:
    """Where the receptive field stops being tracked, and why (the op record's receptive rule says)."""
    from irc.ops import get_op

    last = max(i for i, r in enumerate(a.rows) if r.rj is not None)
    for r in a.rows[last + 1:]:
        rule = getattr(get_op(r.op), "receptive", None)
        if rule is not None and rule.kind in ("reset", "global"):
            why = rule.reason or "reads the whole map"
            return f"; tracked up to {r.name}, a {r.op}: {why}"
    return ""


def _aligned(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"  {k.ljust(width)}  {v}" for k, v in rows]


def header_lines(a: Analysis, file: str) -> list[str]:
    bindings = ", ".join(b.describe(explicit=True) for b in a.bindings) or "none"
    o = a.options
    dtypes = f"weights {o.dtype}, activations {o.act_dtype}"
    if a.kv.cached_layers:
        dtypes += f", KV cache {o.kv_dtype}"
    return [f"model {a.graph.name} ({file})", f"bindings: {bindings}", dtypes]


def analysis_to_text(a: Analysis, file: str, depth: int | None = None) -> str:
    out = header_lines(a, file) + [""] + _table(a, depth) + ["", "summary"] + _aligned(summary_rows(a))
    if a.training:
        out += ["", "training memory per device"] + training_lines(a.training)
    if a.performance:
        out += ["", "roofline"] + performance_lines(a.performance)
    return "\n".join(out) + "\n"


def _raw_cells(x: Line) -> list[str]:
    return [x.name.strip(), x.op, x.type, str(x.count), str(x.params), str(x.flops), str(x.activation_bytes),
            str(x.bytes), "" if x.time_s is None else repr(x.time_s), x.bound]


_CSV_HEAD = ["layer", "op", "type", "copies", "params", "flops_forward", "activation_bytes", "bytes_moved", "time_s",
             "bound"]


def analysis_to_csv(a: Analysis, depth: int | None = None) -> str:
    """The table as CSV with exact numbers (no subtotal rows: sum the column)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(_CSV_HEAD)
    for x in table_lines(a, depth):
        if x is not None and not x.subtotal:
            w.writerow(_raw_cells(x))
    return buf.getvalue()


def _md(cells: list[str] | tuple[str, ...]) -> str:
    return "| " + " | ".join(c.strip().replace("|", "\\|") for c in cells) + " |"


def analysis_to_markdown(a: Analysis, file: str, depth: int | None = None) -> str:
    perf = a.times is not None
    head = _HEAD + (_PERF_HEAD if perf else ())
    out = [f"**{line}**" if i == 0 else line for i, line in enumerate(header_lines(a, file))]
    out = [out[0], "", *[f"- {x}" for x in out[1:]], "", _md(head), _md(["---"] * len(head))]
    out += [_md(_cells(x, perf)) for x in table_lines(a, depth) if x is not None]
    out += ["", "| summary | |", "| --- | --- |"] + [_md((k.strip(), v)) for k, v in summary_rows(a)]
    if a.training:
        out += ["", "```", "training memory per device", *training_lines(a.training), "```"]
    if a.performance:
        out += ["", "```", "roofline", *performance_lines(a.performance), "```"]
    return "\n".join(out) + "\n"
