"""Training memory per device: model states by the ZeRO paper's accounting, activations by the graph.

Model states (Rajbhandari et al. 2019, "ZeRO", §3.1 and Figure 1). Mixed-precision Adam keeps,
per parameter, 2 bytes of fp16/bf16 weights, 2 of gradients and K = 12 of optimizer states
(an fp32 master copy 4, momentum 4, variance 4): 16 bytes, 16Ψ for Ψ parameters. ZeRO splits
them over the N_d data-parallel replicas: stage 1 (P_os) the K bytes, stage 2 (P_os+g) also the
gradients, stage 3 (P_os+g+p) also the weights:
    baseline (2 + 2 + K)Ψ    P_os 4Ψ + KΨ/N_d    P_os+g 2Ψ + (2 + K)Ψ/N_d    P_os+g+p (2 + 2 + K)Ψ/N_d
Other optimizers and precisions follow the same accounting with their own bytes (``PRECISIONS``,
``OPTIMIZERS``): SGD keeps no state, momentum one buffer, Adam and AdamW two.

Activations saved for backward (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", §4): backward keeps what each op's gradient needs, read off the graph:
- an op with arithmetic keeps its operands (a product needs its input for the weight gradient, a
  norm its input, an activation its input); a residual add keeps nothing; views keep nothing;
- a composite op keeps its intermediates (attention: Q, K, V, the softmax output and the context;
  an FFN its hidden layer before and after the activation; gates of a recurrence);
- a dropout with p > 0 keeps a 1-byte mask per element; ``attention_dropout`` adds a mask and the
  dropped-out probabilities (the 5as²b of Megatron's formula instead of 2as²b);
- a stacked recurrent layer whose dropout training applies (its record's ``extra["train_mask"]``) keeps
  the 1-byte mask between its layers and the masked sequences the next layers read;
- the model's outputs are kept for the loss.
For a GPT layer with two dropouts and attention dropout this is exactly the paper's
sbh(34 + 5as/h) bytes in 16-bit activations. Recompute policies: ``selective`` drops the attention
scores, softmax and dropout over them (recomputed from Q and K: 34sbh); ``full`` keeps only each
repeated block's input (2sbh) and recomputes the block in backward. Tensor parallelism splits the
intermediates of split layers by tp; the values on the residual stream (norm inputs and outputs,
dropout masks) are split too only with sequence parallelism: sbh(10 + 24/t + 5as/(ht)) without SP,
sbh(34 + 5as/h)/t with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from irc.analysis.bytes_moved import is_view
from irc.analysis.flops import node_cost
from irc.analysis.memory import internal_elements, value_bytes
from irc.analysis.parallel import Plan, Stages, device_params, tp_sharded_node
from irc.graph import Graph
from irc.ops import get_op

OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}  # fp32 state buffers per parameter
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Precision:
    weights: int  # bytes per parameter
    grads: int
    master: int  # an fp32 master copy (mixed precision)
    state: int  # bytes per optimizer state buffer
    act_dtype: str


PRECISIONS = {
    "fp32": Precision(4, 4, 0, 4, "f32"),
    "bf16-mixed": Precision(2, 2, 4, 4, "bf16"),  # Micikevicius et al. 2018, with bf16 in place of fp16
    "fp16-mixed": Precision(2, 2, 4, 4, "f16"),  # Micikevicius et al. 2018; ZeRO's K = 12 with Adam
    "bf16": Precision(2, 2, 0, 2, "bf16"),  # pure 16-bit: weights, gradients and states all bf16
    "fp16": Precision(2, 2, 0, 2, "f16"),
}


@dataclass(frozen=True)
class StateRow:
    name: str
    bytes_per_param: int
    params: int  # parameters whose copy of this state one device holds
    bytes: int
    formula: str


def model_states(params: int, optimizer: str, precision: str, zero: int, dp: int) -> list[StateRow]:
    """Weights, gradients, optimizer states and master weights one device holds (ZeRO §3.1)."""
    p = PRECISIONS[precision]
    state = OPTIMIZERS[optimizer] * p.state

    def part(stage: int) -> int:
        return -(-params // dp) if zero >= stage else params  # ZeRO gives each replica ⌈Ψ / N_d⌉

    rows = [
        StateRow("weights", p.weights, part(3), p.weights * part(3), f"{p.weights}Ψ" + ("/N_d" if zero >= 3 else "")),
        StateRow("gradients", p.grads, part(2), p.grads * part(2), f"{p.grads}Ψ" + ("/N_d" if zero >= 2 else "")),
        StateRow("optimizer states", state, part(1), state * part(1),
                 f"{OPTIMIZERS[optimizer]}×{p.state}Ψ" + ("/N_d" if zero >= 1 else "")),
        StateRow("fp32 master weights", p.master, part(1), p.master * part(1),
                 f"{p.master}Ψ" + ("/N_d" if zero >= 1 else "")),
    ]
    return rows


@dataclass(frozen=True)
class Saved:
    node: int  # the node whose backward keeps it
    bytes: int
    kind: str  # stream (residual-stream values), sharded (split layers' intermediates), scores, mask


def saved_for_backward(graph: Graph, act_dtype: str, attention_dropout: bool = False) -> list[Saved]:
    """What backward keeps, one entry per buffer (views resolved to the buffer they view)."""
    from irc.analysis.bytes_moved import weight_values

    types = graph.value_types()
    lowered = weight_values(graph)
    root: dict[str, str] = {}
    kept: set[str] = set()
    out: list[Saved] = []
    elem = value_bytes_per(act_dtype)
    for i, node in enumerate(graph.nodes):
        if node.op == "input":
            for v in node.outputs:
                root[v] = v
            continue
        opdef = get_op(node.op)
        classes = getattr(opdef, "classes", frozenset())
        ins = [types[v] for v in node.inputs]
        if is_view(node.op):
            if not node.inputs:  # a lowered weight (param): counted with the weights, never saved
                for v in node.outputs:
                    root[v] = v
                    kept.add(v)
                continue
            for v in node.outputs:
                root[v] = root[node.inputs[0]]
            p = node.attrs.get("p")
            if isinstance(p, (int, float)) and p > 0:  # training-time dropout keeps its mask
                out.append(Saved(i, int(node.types[0].numel()), "mask"))
            continue
        for v in node.outputs:
            root[v] = v
        split = tp_sharded_node(node, types, lowered)
        cost = node_cost(node, ins)
        keeps_operands = "residual" not in classes and (cost.total > 0 or opdef.params is not None)
        if keeps_operands:
            for v in node.inputs:
                r = root[v]
                if r not in kept:
                    kept.add(r)
                    out.append(Saved(i, value_bytes(types[r], act_dtype), "stream"))
        internal = internal_elements(node, ins)
        if internal:
            scores = _score_elements(node, ins)
            if scores:
                out.append(Saved(i, scores * elem * (2 if attention_dropout else 1)
                                 + (scores if attention_dropout else 0), "scores"))
            out.append(Saved(i, (internal - scores) * elem, "sharded" if split else "stream"))
        mask_rule = opdef.extra.get("train_mask") if opdef.extra else None
        mask = mask_rule(node.attrs, ins[0]) if mask_rule and not node.attrs.get("train") else None
        if mask is not None:  # a layer training adds dropout to (stacked recurrent): its 1-byte mask, and the
            out.append(Saved(i, math.prod(mask), "mask"))  # masked copies the next layers read
            out.append(Saved(i, math.prod(mask) * elem, "stream"))
    producers = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    for _, v in graph.outputs:
        r = root[v]
        if r not in kept:
            kept.add(r)
            i = producers[r]
            split = tp_sharded_node(graph.nodes[i], types, lowered)
            out.append(Saved(i, value_bytes(types[r], act_dtype), "sharded" if split else "stream"))
    return out


def value_bytes_per(act_dtype: str) -> int:
    from irc.types import DTYPE_BYTES

    return int(DTYPE_BYTES[act_dtype])


def _score_elements(node, ins) -> int:
    """The attention probabilities an unfused kernel holds: B · heads · T · S."""
    if "heads" not in node.attrs or node.op != "attention":
        return 0
    x, kv = ins[0], ins[1] if len(ins) > 1 else ins[0]
    return int(x.shape[0] * node.attrs["heads"] * x.shape[1] * kv.shape[1])


def layer_inputs(graph: Graph, stages: Stages, act_dtype: str) -> dict[str, tuple[int, int]]:
    """Each repeated block's inputs from outside it (what full recomputation keeps): (first node, bytes)."""
    types = graph.value_types()
    producer_layer = {v: stages.layer_of[i] for i, n in enumerate(graph.nodes) for v in n.outputs}
    out: dict[str, tuple[int, int]] = {}
    seen: set[tuple[str, str]] = set()
    for i, node in enumerate(graph.nodes):
        layer = stages.layer_of[i]
        if not layer:
            continue
        for v in node.inputs:
            if producer_layer.get(v) != layer and (layer, v) not in seen and types[v].is_float:
                seen.add((layer, v))
                first, b = out.get(layer, (i, 0))
                out[layer] = (first, b + value_bytes(types[v], act_dtype))
    return out


def _share(kind: str, plan: Plan) -> int:
    """The divisor tensor (and sequence) parallelism applies to a saved buffer of this kind."""
    if kind in ("sharded", "scores"):
        return plan.tp
    return plan.tp if plan.sp else 1


@dataclass
class ActivationPlan:
    per_layer_bytes: dict[str, int]  # saved bytes of each repeated block, one micro-batch, one device
    per_stage_bytes: list[int]  # one micro-batch's saved bytes on each stage
    in_flight: list[int]  # micro-batches whose activations each stage holds at once (1F1B)
    temporary: list[dict[str, int]]  # per stage: recomputed block, largest activation gradient, ZeRO-3 gather

    def stage_bytes(self, stage: int) -> int:
        """Saved activations and temporaries one device of ``stage`` holds at the worst moment."""
        return self.per_stage_bytes[stage] * self.in_flight[stage] + sum(self.temporary[stage].values())


def plan_activations(graph: Graph, stages: Stages, plan: Plan, act_dtype: str, recompute: str,
                     micro_batches: int, weight_bytes: int, attention_dropout: bool = False) -> ActivationPlan:
    saved = saved_for_backward(graph, act_dtype, attention_dropout)
    pp = plan.pp
    per_layer_none: dict[str, int] = {}
    per_layer_scores: dict[str, int] = {}
    largest = [0] * pp  # the largest saved buffer per stage: its gradient is the biggest one in flight
    kept: list[tuple[int, int]] = []  # (node, bytes per device)
    for s in saved:
        b = -(-s.bytes // _share(s.kind, plan))
        layer = stages.layer_of[s.node]
        if s.kind != "mask":
            largest[stages.stage_of[s.node]] = max(largest[stages.stage_of[s.node]], b)
        if layer:
            per_layer_none[layer] = per_layer_none.get(layer, 0) + b
            if s.kind == "scores":
                per_layer_scores[layer] = per_layer_scores.get(layer, 0) + b
        if recompute == "selective" and s.kind == "scores":
            continue
        if recompute == "full" and layer:
            continue
        kept.append((s.node, b))
    if recompute == "full":
        for first, b in layer_inputs(graph, stages, act_dtype).values():
            kept.append((first, -(-b // (plan.tp if plan.sp else 1))))
    per_layer: dict[str, int] = {}
    per_stage = [0] * pp
    for node, b in kept:
        per_stage[stages.stage_of[node]] += b
        layer = stages.layer_of[node]
        if layer:
            per_layer[layer] = per_layer.get(layer, 0) + b
    in_flight = [min(pp - s, micro_batches) for s in range(pp)]
    stage_of_layer = {x: stages.stage_of[i] for i, x in enumerate(stages.layer_of) if x}
    temporary: list[dict[str, int]] = []
    for stage in range(pp):
        parts: dict[str, int] = {}
        redo = per_layer_none if recompute == "full" else per_layer_scores if recompute == "selective" else {}
        here = [b for layer, b in redo.items() if stage_of_layer[layer] == stage]
        if here:
            parts["recomputed block" if recompute == "full" else "recomputed attention scores"] = max(here)
        parts["largest activation gradient"] = largest[stage]
        if plan.zero >= 3 and plan.dp > 1:
            parts["gathered ZeRO-3 weights"] = weight_bytes
        temporary.append(parts)
    return ActivationPlan(per_layer, per_stage, in_flight, temporary)




SOURCES = {
    "weights": "ZeRO (Rajbhandari et al. 2019) §3.1: 2Ψ in 16 bits, 4Ψ in fp32; /N_d at stage 3",
    "gradients": "ZeRO §3.1: same width as the weights; /N_d from stage 2",
    "optimizer states": "ZeRO §3.1: Adam's momentum and variance in fp32 (8Ψ), momentum 4Ψ, SGD none; "
                        "/N_d from stage 1",
    "fp32 master weights": "ZeRO §3.1 / Micikevicius et al. 2018: mixed precision keeps an fp32 copy (4Ψ); /N_d "
                           "from stage 1",
    "activations": "saved for backward, read off the graph (Korthikanti et al. 2022 §4 for a GPT layer: "
                   "sbh(34 + 5as/h); selective 34sbh; full 2sbh; /t with TP+SP)",
    "temporary peak": "held during backward: a recomputed block, the largest activation gradient, ZeRO-3's "
                      "gathered weights",
}


def training_report(graph: Graph, groups: list[str], plan: Plan, optimizer: str, precision: str, recompute: str,
                    attention_dropout: bool, interconnect: float | None = None,
                    device_memory: float | None = None) -> dict:
    """Memory per device, pipeline bubble and communication for one training step under ``plan``."""
    from irc.analysis.parallel import assign_stages, bubble, check_tensor_parallel, communication, micro_batches

    check_tensor_parallel(graph, plan.tp)
    stages = assign_stages(graph, groups, plan.pp)
    batch = next((n.types[0].shape[0] for n in graph.inputs() if n.types[0].rank >= 1), 1)
    m = micro_batches(plan, int(batch))
    p = PRECISIONS[precision]
    stage_params = device_params(graph, stages, plan.tp)
    layer_params = _largest_layer_params(graph, stages, plan.tp)
    acts = plan_activations(graph, stages, plan, p.act_dtype, recompute, m, layer_params * p.weights,
                            attention_dropout)
    stage_totals = []
    for s, params in enumerate(stage_params):
        states = sum(r.bytes for r in model_states(params, optimizer, precision, plan.zero, plan.dp))
        stage_totals.append(states + acts.stage_bytes(s))
    worst = max(range(len(stage_totals)), key=lambda s: (stage_totals[s], -s))
    params = stage_params[worst]
    states = model_states(params, optimizer, precision, plan.zero, plan.dp)
    activation_bytes = acts.per_stage_bytes[worst] * acts.in_flight[worst]
    rows = [{"name": r.name, "bytes": r.bytes, "bytes_per_param": r.bytes_per_param, "params": r.params,
             "formula": r.formula, "source": SOURCES[r.name]} for r in states]
    flight = acts.in_flight[worst]
    rows.append({"name": "activations", "bytes": activation_bytes, "bytes_per_param": None, "params": None,
                 "formula": f"recompute {recompute}, {flight} micro-batch{'es' if flight != 1 else ''} in flight",
                 "source": SOURCES["activations"]})
    temporary = acts.temporary[worst]
    rows.append({"name": "temporary peak", "bytes": sum(temporary.values()), "bytes_per_param": None, "params": None,
                 "formula": " + ".join(temporary), "source": SOURCES["temporary peak"]})
    total = sum(r["bytes"] for r in rows)
    comm = communication(graph, stages, plan, worst, params, p.weights, p.grads, p.act_dtype, m, recompute)
    by_kind: dict[str, int] = {}
    for c in comm:
        by_kind[c.kind] = by_kind.get(c.kind, 0) + c.step_bytes
    sent = sum(c.sent_bytes for c in comm)
    of_ideal, of_step = bubble(plan.pp, m)
    first_layer = stages.layers[0] if stages.layers else None
    return {
        "optimizer": optimizer,
        "precision": precision,
        "recompute": recompute,
        "attention_dropout": attention_dropout,
        "plan": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "sp": plan.sp, "zero": plan.zero,
                 "devices": plan.devices, "micro_batch": int(batch), "micro_batches": m,
                 "global_batch": int(batch) * plan.dp * m},
        "device_stage": worst,
        "params_per_device": params,
        "params_per_stage": stage_params,
        "rows": rows,
        "total_bytes_per_device": total,
        "fits_device_memory": None if device_memory is None else total <= device_memory,
        "activations": {
            "layers": len(stages.layers),
            "first_layer": first_layer,
            "first_layer_bytes": acts.per_layer_bytes.get(first_layer, 0) if first_layer else None,
            "per_stage_bytes": acts.per_stage_bytes,
            "in_flight": acts.in_flight,
        },
        "temporary": temporary,
        "pipeline_bubble": None if plan.pp == 1 else {"of_ideal": round(of_ideal, 6), "of_step": round(of_step, 6)},
        "communication": [{"kind": c.kind, "group": c.group, "what": c.what, "bytes": c.bytes, "calls": c.calls,
                           "ranks": c.ranks, "step_bytes": c.step_bytes, "sent_bytes": c.sent_bytes} for c in comm],
        "communication_bytes_per_step": by_kind,
        "communication_sent_bytes": sent,
        "communication_time_s": None if interconnect is None else sent / interconnect,
    }


def _largest_layer_params(graph: Graph, stages: Stages, tp: int) -> int:
    """Parameters of the largest repeated block per tensor-parallel device (what ZeRO-3 gathers at once)."""
    from irc.analysis.parallel import sharded
    from irc.analysis.params import node_params

    types = graph.value_types()
    per: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        layer = stages.layer_of[i] or node.outputs[0]
        params, _ = node_params(node, types)
        for shape in params.values():
            n = 1
            for d in shape:
                n *= int(d)
            per[layer] = per.get(layer, 0) + (-(-n // tp) if sharded(shape) else n)
    return max(per.values(), default=0)
