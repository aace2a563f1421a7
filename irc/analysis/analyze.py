"""Run every analysis over a typed graph and gather per-node rows, block subtotals and totals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from irc.analysis.bindings import Binding, default_bindings, input_layouts, symbol_roles
from irc.analysis.bytes_moved import Traffic, op_traffic, weight_tables, weight_values
from irc.analysis.flops import KINDS, Cost, node_cost, training_flops
from irc.analysis.groups import group_of
from irc.analysis.kv_cache import KVCache, analyse_kv
from irc.analysis.memory import ALIASES, Memory, analyse_memory, value_bytes
from irc.analysis.params import owned_params
from irc.analysis.receptive import RJ, receptive_fields
from irc.analysis.regions import relu_mlp_regions
from irc.analysis.transformer import transformer_figures
from irc.diagnostics import IrcError, UsageError
from irc.dims import dim_symbols
from irc.graph import Graph
from irc.ops import get_op
from irc.types import DTYPE_BYTES, TensorType


@dataclass(frozen=True)
class Options:
    dtype: str = "f32"  # weights
    kv_dtype: str = "f16"
    act_dtype: str = "f32"
    context: int | None = None


@dataclass
class Row:
    index: int
    name: str
    op: str
    scope: str
    group: str
    types: list[TensorType]
    attrs: dict[str, Any]
    params: int
    buffers: int
    shared: bool
    weights: str | None
    cost: Cost
    flops_training: int
    activation_bytes: int
    rj: RJ | None
    traffic: Traffic  # bytes read (operands, weights) and written (results), --dtype / --act-dtype


@dataclass
class Group:
    name: str
    rows: int = 0
    params: int = 0
    macs: int = 0
    flops: int = 0
    flops_training: int = 0
    activation_bytes: int = 0


@dataclass
class Analysis:
    graph: Graph
    bindings: list[Binding]
    options: Options
    rows: list[Row]
    groups: list[Group]
    totals: dict[str, Any]
    flops_by_kind: dict[str, int]
    memory: Memory
    kv: KVCache
    tokens: int | None  # B·T for a sequence model
    context: int | None  # tokens the KV cache is sized for
    final_rj: RJ | None
    transformer: dict[str, Any] | None
    relu_mlp: dict[str, Any] | None
    training: dict[str, Any] | None = None  # --train: memory per device under a parallel plan
    performance: dict[str, Any] | None = None  # --hardware: roofline times, prefill and decode
    times: list[Any] | None = None  # --hardware: the prefill pass's roofline.OpTime per row


def load_for_analysis(path: str | Path, given: dict[str, int], model: str | None,
                      context: int | None, batch: int | None = None) -> tuple[Graph, list[Binding]]:
    """The typed graph with every symbol bound: -D values first, then defaults by role
    (``batch``, from --micro-batch, binds the batch symbol)."""
    from irc.pipeline import load_graph

    return bind_for_analysis(load_graph(path, given, model), given, context, batch)


def bind_for_analysis(graph: Graph, given: dict[str, int], context: int | None,
                      batch: int | None = None) -> tuple[Graph, list[Binding]]:
    """Bind every symbol ``graph`` still has: defaults by role; ``batch`` for the batch symbol."""
    from irc.passes.bind import bind_symbols
    from irc.passes.shape_infer import shape_infer

    bindings = default_bindings(graph, given, context)
    if batch is not None:
        roles = symbol_roles(graph)
        batch_symbols = [b for b in bindings if roles.get(b.name) == "batch"]
        clash = next((b for b in batch_symbols if b.source != "batch" and b.value != batch), None)
        fixed = next((n.types[0].shape[0] for n in graph.inputs() if n.types[0].rank
                      and isinstance(n.types[0].shape[0], int)), None) if not batch_symbols else None
        if clash or not batch_symbols and fixed != batch:
            why = (f"the batch {clash.name} is already {clash.value:,} ({clash.source})" if clash
                   else f"the model's batch is already {fixed:,} (fixed in the model or by -D)" if fixed
                   else f"'{graph.name}' has no batch axis to bind")
            raise UsageError(f"--micro-batch {batch}: {why}")
        bindings = [Binding(b.name, batch, "--micro-batch") if roles.get(b.name) == "batch" and b.source == "batch"
                    else b for b in bindings]
    missing = {b.name: b.value for b in bindings if b.name in graph.symbols and b.name not in graph.bindings}
    if missing:
        graph = shape_infer(bind_symbols(graph, missing))
    return graph, bindings


def sequence_shape(graph: Graph) -> tuple[int, int] | None:
    """(B, T) of the first sequence input: token ids [B, T] or a float sequence [B, T, D]."""
    for node, kind in input_layouts(graph):
        t = node.types[0]
        if kind in ("tokens", "sequence") and t.rank >= 2:
            return t.shape[0], t.shape[1]
    return None


def per(total: int, count: int | None) -> int | float | None:
    """``total / count``: an int when exact, else a float to 3 decimals."""
    if not count:
        return None
    q, r = divmod(total, count)
    return q if r == 0 else round(total / count, 3)


def _check_concrete(graph: Graph) -> None:
    for node in graph.nodes:
        for t in node.types:
            if not isinstance(t.numel(), int):
                free = sorted({s for d in t.shape for s in dim_symbols(d)})
                raise IrcError(f"'{node.op}' result {t} still has a symbolic size; bind "
                               f"{', '.join(free) or 'its sizes'} first (-D NAME=VALUE)", node.loc)


def analyze_graph(graph: Graph, bindings: list[Binding], options: Options) -> Analysis:
    _check_concrete(graph)
    types = graph.value_types()
    owned = owned_params(graph)
    rjs = receptive_fields(graph)
    tables, lowered = weight_tables(graph), weight_values(graph)
    rows: list[Row] = []
    for i, (node, (p, b, shared)) in enumerate(zip(graph.nodes, owned)):
        cost = node_cost(node, [types[v] for v in node.inputs])
        act = 0 if node.op in ALIASES else sum(value_bytes(t, options.act_dtype) for t in node.types)
        traffic = op_traffic(node, types, options.dtype, options.act_dtype, tables, lowered)
        rows.append(Row(i, node.outputs[0], node.op, node.scope, group_of(node), node.types, node.attrs,
                        int(p), int(b), shared, node.weights, cost, training_flops(cost), act,
                        rjs.get(node.outputs[0]), traffic))
    groups = _groups(rows)
    memory = analyse_memory(graph, options.act_dtype)
    kv = analyse_kv(graph, options.kv_dtype, options.act_dtype)
    seq = sequence_shape(graph)
    batch, tokens = (seq[0], seq[0] * seq[1]) if seq else (1, None)
    context = options.context or (seq[1] if seq else None)
    by_kind = {k: sum(r.cost.flops.get(k, 0) for r in rows) for k in KINDS}
    params = sum(r.params for r in rows)
    inactive = sum(int(get_op(r.op).inactive_params(r.attrs, [types[v] for v in node.inputs]))
                   for r, node in zip(rows, graph.nodes) if r.params and get_op(r.op) is not None)
    buffers = sum(r.buffers for r in rows)
    flops = sum(by_kind.values())
    training = sum(r.flops_training for r in rows)
    totals: dict[str, Any] = {
        "params": params,
        "params_active": params - inactive,  # what one token uses: a mixture of experts' k chosen experts
        "buffers": buffers,
        "macs_forward": sum(r.cost.macs for r in rows),
        "flops_forward": flops,
        "flops_training": training,
        "tokens": tokens,
        "flops_forward_per_token": per(flops, tokens),
        "flops_training_per_token": per(training, tokens),
        "weight_bytes": params * int(DTYPE_BYTES[options.dtype]),
        "buffer_bytes": buffers * int(DTYPE_BYTES[options.dtype]),
        "activation_bytes": memory.activation_bytes,
        "peak_activation_bytes": memory.peak_live_bytes,
        "saved_activation_bytes_backward": memory.saved_for_training_bytes,
        "bytes_read": sum(r.traffic.read for r in rows),
        "bytes_written": sum(r.traffic.written for r in rows),
        "kv_cache_bytes_per_token": kv.per_token_bytes,
        "kv_cache_context_tokens": context if kv.cached_layers else None,
        "kv_cache_bytes": kv.bytes_at(context) * batch if kv.cached_layers and context else 0,
        "kv_cache_window_tokens": kv.window,
        "kv_cache_cross_bytes": kv.cross_bytes,
        "recurrent_state_bytes": kv.recurrent_state_bytes,
    }
    final = next((r.rj for r in reversed(rows) if r.rj is not None), None)
    transformer = transformer_figures(rows, totals, context) if tokens else None
    return Analysis(graph, bindings, options, rows, groups, totals, by_kind, memory, kv, tokens, context, final,
                    transformer, relu_mlp_regions(graph))


def _groups(rows: list[Row]) -> list[Group]:
    out: dict[str, Group] = {}
    for r in rows:
        if not r.group:
            continue
        g = out.setdefault(r.group, Group(r.group))
        g.rows += 1
        g.params += r.params
        g.macs += r.cost.macs
        g.flops += r.cost.total
        g.flops_training += r.flops_training
        g.activation_bytes += r.activation_bytes
    return list(out.values())
