"""The ``--train`` and ``--hardware`` sections of the text report: what each row means and its formula."""

from __future__ import annotations

from typing import Any

from irc.analysis.units import binary_bytes, commas, decimal_bytes, seconds, si


def _bytes(n: int) -> str:
    return f"{binary_bytes(n)} ({decimal_bytes(n)})" if n else "0"


def training_lines(t: dict[str, Any]) -> list[str]:
    p = t["plan"]
    plan = (f"tp {p['tp']}{' + sp' if p['sp'] else ''}, pp {p['pp']}, dp {p['dp']} ({p['devices']} devices), "
            f"ZeRO {p['zero']}, micro-batch {p['micro_batch']} × {p['micro_batches']} per replica = global batch "
            f"{commas(p['global_batch'])}")
    out = [f"  {t['optimizer']}, {t['precision']}, recompute {t['recompute']}"
           + (", attention dropout" if t["attention_dropout"] else "") + f"; {plan}"]
    stage = f" (pipeline stage {t['device_stage']}, the fullest)" if p["pp"] > 1 else ""
    out.append(f"  parameters per device  {commas(t['params_per_device'])}{stage}")
    width = max(len(r["name"]) for r in t["rows"])
    for r in t["rows"]:
        out.append(f"  {r['name'].ljust(width)}  {_bytes(r['bytes']).rjust(24)}  {r['formula']}")
    out.append(f"  {'total'.ljust(width)}  {_bytes(t['total_bytes_per_device']).rjust(24)}"
               + ("" if t["fits_device_memory"] is None
                  else ("  fits the device" if t["fits_device_memory"] else "  does NOT fit the device")))
    acts = t["activations"]
    if acts["first_layer"]:
        out.append(f"  activations of one layer ({acts['first_layer']}, one micro-batch): "
                   f"{_bytes(acts['first_layer_bytes'])}")
    if t["pipeline_bubble"]:
        b = t["pipeline_bubble"]
        out.append(f"  pipeline bubble  (pp − 1)/m = {b['of_ideal']:.4g} of the ideal time, "
                   f"{100 * b['of_step']:.1f}% of the step")
    if t["communication"]:
        out.append("  communication per step (per device)")
        for c in t["communication"]:
            out.append(f"    {c['kind']:<15} {c['group']}  {c['what']:<32} {binary_bytes(c['bytes']):>11} "
                       f"× {commas(c['calls'])}  = {binary_bytes(c['step_bytes'])}")
        line = f"    sent with ring algorithms: {binary_bytes(t['communication_sent_bytes'])}"
        if t["communication_time_s"] is not None:
            line += f", {seconds(t['communication_time_s'])} over the interconnect"
        out.append(line)
    out.append("  formulas and their sources: docs/analysis.md (each row's source is in --format json)")
    return out


def performance_lines(p: dict[str, Any]) -> list[str]:
    hw = p["hardware"]
    out = [f"  {hw['name']}: {si(hw['matmul_peak_flops'], 'FLOP/s')} matrix peak, "
           f"{si(hw['vector_peak_flops'], 'FLOP/s')} vector, {si(hw['memory_bandwidth'], 'B/s')} memory "
           f"({hw['source']})",
           f"  efficiency: compute {hw['compute_efficiency']:g}, bandwidth {hw['bandwidth_efficiency']:g} "
           "(--compute-efficiency, --bandwidth-efficiency); each op takes max(FLOPs / peak, bytes / bandwidth)"]
    pre = p["prefill"]
    rate = f"{commas(round(pre['tokens_per_s']))} tokens/s" if pre["tokens_per_s"] else "no time at all"
    out.append(f"  prefill  {seconds(pre['time_s'])} for {commas(pre['tokens'])} tokens at batch {pre['batch']} "
               f"({rate}); {pre['bound']}-bound "
               f"({seconds(pre['compute_bound_time_s'])} in compute-bound ops, "
               f"{seconds(pre['memory_bound_time_s'])} in memory-bound ops)")
    d = p["decode"]
    if d is None:
        out.append(f"  decode   not estimated: {p['decode_unavailable']}")
    else:
        rate = f"{commas(round(d['tokens_per_s'], 1))} tokens/s" if d["tokens_per_s"] else "no time at all"
        out.append(f"  decode   {seconds(d['time_s'])} per step at batch {d['batch']}, context "
                   f"{commas(d['context'])}: {rate}; {d['bound']}-bound "
                   f"(weights {binary_bytes(d['weight_bytes'])} / bandwidth = {seconds(d['weight_bound_time_s'])}, "
                   f"KV cache {binary_bytes(d['kv_cache_bytes'])})")
    return out
