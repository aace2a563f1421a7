"""Tables of ratios from the peers' rows, the targets of issue 5, and benchmarks/RESULTS.md."""

from __future__ import annotations

from collections.abc import Iterable

Rows = list[dict]


def _get(rows: Rows, case: str, item: str, peer: str) -> dict | None:
    return next((r for r in rows if r["case"] == case and r["item"] == item and r["peer"] == peer), None)


def _val(rows: Rows, case: str, item: str, peer: str) -> float | None:
    r = _get(rows, case, item, peer)
    return None if r is None else float(r["value"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _f(x: float | None, fmt: str = "{:.1f}", suffix: str = "") -> str:
    return "–" if x is None else fmt.format(x) + suffix


def table(header: list[str], body: Iterable[list[str]]) -> str:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def norms(rows: Rows) -> tuple[str, list[tuple[str, float | None, float, bool | None]]]:
    copy = _val(rows, "norms", "copy", "copy")
    body, targets = [], []
    for item in ("LayerNorm", "RMSNorm", "add+LayerNorm"):
        irc, torch, numpy = (_val(rows, "norms", item, p) for p in ("irc", "torch", "numpy"))
        of_copy, vs_torch = _ratio(irc, copy), _ratio(irc, torch)
        body.append([item, _f(irc), _f(of_copy and of_copy * 100, "{:.0f}", " %"), _f(torch),
                     _f(vs_torch, "{:.1f}", "×"), _f(numpy), _f(_ratio(irc, numpy), "{:.1f}", "×")])
        targets.append((f"{item}: share of copy bandwidth", of_copy, 0.90, None))
        targets.append((f"{item}: vs torch", vs_torch, 5.0, None))
    fused, pair = _val(rows, "norms", "add+LayerNorm", "irc"), _val(rows, "norms", "add+LayerNorm", "irc unfused")
    fused_ip = _val(rows, "norms", "add+LayerNorm in place", "irc")
    pair_ip = _val(rows, "norms", "add+LayerNorm in place", "irc unfused")
    graph = _val(rows, "norms", "LayerNorm", "irc graph run")
    targets.append(("add+LayerNorm: fused vs the unfused pair, in place as scheduled", _ratio(fused_ip, pair_ip), 1.3,
                    None))
    targets.append(("add+LayerNorm: fused vs the unfused pair, fresh buffers", _ratio(fused, pair), 1.3, None))
    header = ["op (65,536×1,024 fp32)", "irc GB/s", "of copy", "torch GB/s", "irc/torch", "numpy GB/s", "irc/numpy"]
    text = table(header, body)
    text += (f"\n\nCopy (2 threads, plain stores: each line read before it is written): {_f(copy)} GB/s; irc's "
             f"norms write outputs this large by streaming stores, which skip that read. Fused add+LayerNorm "
             f"{_f(fused)} GB/s vs the unfused "
             f"pair (add, then LayerNorm) {_f(pair)} GB/s into fresh buffers: "
             f"{_f(_ratio(fused, pair), '{:.2f}', '×')}; in place, as the schedule runs them in a pre-LN block, "
             f"{_f(fused_ip)} vs {_f(pair_ip)} GB/s: {_f(_ratio(fused_ip, pair_ip), '{:.2f}', '×')}. "
             f"LayerNorm through `CompiledGraph.run` (its 256 MiB output written into the last call's buffer, "
             f"which the timing loop drops: no page faults after the first call): "
             f"{_f(graph)} GB/s.")
    return text, targets


def attention(rows: Rows) -> tuple[str, list]:
    sgemm = next((float(r["value"]) for r in rows if r["case"] == "sgemm"), None)
    items = list(dict.fromkeys(r["item"] for r in rows if r["case"] == "attention"))
    body, targets = [], []
    for item in items:
        irc, torch, numpy = (_val(rows, "attention", item, p) for p in ("irc", "torch", "numpy"))
        of_sgemm, vs_torch = _ratio(irc, sgemm), _ratio(irc, torch)
        body.append([item, _f(irc), _f(of_sgemm and of_sgemm * 100, "{:.0f}", " %"), _f(torch),
                     _f(vs_torch, "{:.1f}", "×"), _f(numpy), _f(_ratio(irc, numpy), "{:.1f}", "×")])
        targets.append((f"attention {item}: vs torch SDPA", vs_torch, 2.0, None))
        if item.startswith("T=4096"):
            # issue 16's bars (issue 5 had asked for half)
            targets.append((f"attention {item}: share of sgemm", of_sgemm, 0.75 if "causal" in item else 0.85, None))
    text = table(["8 heads, d 64", "irc GFLOP/s", "of sgemm", "torch GFLOP/s", "irc/torch", "numpy GFLOP/s",
                  "irc/numpy"], body)
    text += f"\n\nsgemm (NumPy, 2,048³): {_f(sgemm)} GFLOP/s."
    mem = [r for r in rows if r["case"] == "attention-memory"]
    if mem:
        mitems = list(dict.fromkeys(r["item"] for r in mem))
        mbody = [[i] + [_f(_val(rows, "attention-memory", i, p), "{:.0f}", " MiB") for p in ("irc", "torch", "numpy")]
                 for i in mitems]
        t = int(mitems[0].split("=")[1].split()[0])
        nn = t * t * 4 / 2**20
        text += ("\n\nPeak memory a call adds to its process (resident high-water mark; the inputs are allocated "
                 f"before). One T×T fp32 score matrix is {nn:.0f} MiB per head, {8 * nn:.0f} MiB for all 8 heads; "
                 f"the output is {8 * t * 64 * 4 / 2**20:.0f} MiB.\n\n")
        text += table(["call", "irc", "torch", "numpy"], mbody)
        for r in mem:
            if r["peer"] == "irc":
                targets.append((f"attention {r['item']}: peak MiB below one T×T matrix ({nn:.0f} MiB)",
                                float(r["value"]), nn, float(r["value"]) < nn))
    return text, targets


def models(rows: Rows, agreement: dict[str, dict[str, float]]) -> tuple[str, list]:
    items = list(dict.fromkeys(r["item"] for r in rows if r["case"] == "models"))
    body, targets = [], []
    for item in items:
        irc, torch, ort = (_val(rows, "models", item, p) for p in ("irc", "torch", "ort"))
        vs_torch, vs_ort = _ratio(torch, irc), _ratio(ort, irc)
        agree = agreement.get(item, {})
        body.append([item, _f(irc), _f(torch), _f(vs_torch, "{:.2f}", "×"), _f(ort), _f(vs_ort, "{:.2f}", "×"),
                     _f(agree.get("torch"), "{:.1e}"), _f(agree.get("ort"), "{:.1e}")])
        if "T=1" not in item:
            targets.append((f"{item}: vs ONNX Runtime (speed-up)", vs_ort, 1.0, None))
            targets.append((f"{item}: vs torch eager (speed-up)", vs_torch, 1.3, None))
    text = table(["forward pass", "irc ms", "torch eager ms", "vs torch", "ONNX Runtime ms", "vs ORT",
                  "max |irc − torch| / max |torch|", "… vs ORT"], body)
    steps = list(dict.fromkeys(r["item"] for r in rows if r["case"] == "lstm-step"))
    for item in steps:
        step, bound = _val(rows, "lstm-step", item, "irc"), _val(rows, "lstm-step", item, "bound")
        note = (_get(rows, "lstm-step", item, "irc") or {}).get("note", "")
        whh = 4 * 650 * 650 * 4
        text += (f"\n\n{item}, one LSTM layer alone ({note}): {_f(step)} µs a step, its input product and gates "
                 f"included (W_hh, 6.8 MB of fp32, read at {_f(step and whh / step / 1e3)} GB/s). The step's "
                 f"product alone, h times W_hh with W_hh hot in the caches, by NumPy's 2-thread BLAS: "
                 f"{_f(bound)} µs, {_f(_ratio(bound, step), '{:.2f}')}× irc's whole step.")
    return text, targets


def gemms(rows: Rows) -> tuple[str, list]:
    items = list(dict.fromkeys(r["item"] for r in rows if r["case"] == "gemms"))
    body, shares = [], []
    for item in items:
        irc, numpy = _val(rows, "gemms", item, "irc"), _val(rows, "gemms", item, "numpy")
        share = _ratio(irc, numpy)
        note = (_get(rows, "gemms", item, "irc") or {}).get("note", "")
        body.append([item, _f(irc), _f(numpy), _f(share and share * 100, "{:.0f}", " %"), note])
        if share is not None:
            shares.append(share)
    text = table(["shape", "irc GFLOP/s", "NumPy sgemm GFLOP/s", "irc / sgemm", "uses"], body)
    worst = min(shares) if shares else None
    return text, [("GEMMs of the models: the worst shape's share of NumPy's sgemm rate", worst, 0.90, None)]


def compile_times(rows: Rows) -> tuple[str, list]:
    items = list(dict.fromkeys(r["item"] for r in rows if r["case"] == "compile"))
    body, targets = [], []
    for item in items:
        cold, warm = _get(rows, "compile", item, "cold"), _get(rows, "compile", item, "cached")
        body.append([item, _f(cold and cold["value"], "{:.2f}", " s"), cold["note"] if cold else "",
                     _f(warm and warm["value"], "{:.2f}", " s")])
        if item == "gpt2_small" and warm:
            targets.append(("gpt2_small: cached compile, seconds (below)", float(warm["value"]), 2.0,
                            float(warm["value"]) < 2.0))
    text = table(["model", "cold", "cold: kernels", "cached"], body)
    return text, targets


def targets_table(targets: list[tuple[str, float | None, float, bool | None]]) -> str:
    body = []
    for what, got, want, met in targets:
        ok = met if met is not None else (got is not None and got >= want)
        body.append([what, _f(got, "{:.2f}"), f"{want:g}", "met" if ok else "NOT met"])
    return table(["target", "measured", "target", ""], body)
