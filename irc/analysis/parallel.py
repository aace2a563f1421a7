"""Parallel plans: how tensor (TP), pipeline (PP) and data (DP) parallelism split a model.

Tensor parallelism (Shoeybi et al. 2019, Megatron-LM) splits every weight matrix — attention's
projections by head, an FFN's hidden width, embeddings and the head by vocabulary, convolutions
by output channel — across ``tp`` devices: a weight of rank ≥ 2 holds ⌈numel / tp⌉ per device
(⌈⌉ is Megatron's vocabulary padding), a rank-1 weight (norm gains, biases) is replicated. Each
split attention or FFN ends in one all-reduce of its result in the forward pass and one of its
input's gradient in the backward pass (Megatron's f and g); with sequence parallelism (``--sp``,
Korthikanti et al. 2022) each all-reduce becomes an all-gather plus a reduce-scatter of the same
buffer. A head whose result is the model's output stays vocabulary-parallel into the loss
(Megatron's parallel cross-entropy), so only its input gradient is all-reduced.

Pipeline parallelism (Huang et al. 2019, GPipe; Narayanan et al. 2021, 1F1B) gives each of ``pp``
stages L / pp consecutive repeated blocks, the nodes before the first block to stage 0 and the nodes
after the last to the final stage. Its bubble is (pp − 1) / m of the ideal time for m micro-batches
per step (Narayanan et al. 2021, §2.2), (pp − 1) / (m + pp − 1) of the step; with 1F1B stage s
holds the activations of pp − s micro-batches at once. Each stage boundary carries one activation
forward and its gradient back per micro-batch (point-to-point).

Data parallelism replicates the rest ``dp`` times; ZeRO (Rajbhandari et al. 2019) partitions the
optimizer states (stage 1), also the gradients (2), also the weights (3) across those replicas.
Gradients are all-reduced once a step (ZeRO 0); reduce-scattered and the updated weights
all-gathered (1); reduce-scattered every micro-batch (2: a replica keeps only its shard); and at
stage 3 the weights are also all-gathered for every micro-batch's forward and backward pass.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from irc.analysis.params import node_params
from irc.diagnostics import IrcError, UsageError
from irc.graph import Graph, Node
from irc.ops.attention import kv_heads

_REPEATED = re.compile(r"^(.*?)\.(\d+)$")


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    sp: bool = False
    zero: int = 0
    micro_batch: int | None = None  # None: the model's batch binding
    global_batch: int | None = None  # None: one micro-batch per data-parallel replica

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def trivial(self) -> bool:
        return self.devices == 1 and not self.sp and self.zero == 0 and self.global_batch is None


def check_plan_numbers(plan: Plan) -> None:
    """Flag values a plan cannot have, before any model is read."""
    for flag, value in (("--tp", plan.tp), ("--pp", plan.pp), ("--dp", plan.dp), ("--micro-batch", plan.micro_batch),
                        ("--global-batch", plan.global_batch)):
        if value is not None and not 0 < value < 2**31:
            raise UsageError(f"{flag} must be a positive whole number below 2**31, got {value}")
    if plan.sp and plan.tp == 1:
        raise UsageError("--sp (sequence parallelism) splits along the tensor-parallel group: give --tp N with N > 1")


def _plan_error(message: str, node: Node | None, graph: Graph, notes: list[str]) -> IrcError:
    """A plan the model cannot take, located at the node (or the model) that refuses it."""
    return IrcError(message, node.loc if node is not None else graph.loc, notes=notes)


def micro_batches(plan: Plan, micro: int) -> int:
    """Micro-batches each replica runs per step: global batch / (micro-batch × dp)."""
    if plan.global_batch is None:
        return 1
    per_step = micro * plan.dp
    if plan.global_batch % per_step:
        raise UsageError(f"--global-batch {plan.global_batch:,} is not a multiple of micro-batch × dp = "
                         f"{micro} × {plan.dp} = {per_step:,}")
    return plan.global_batch // per_step


@dataclass
class Stages:
    """Which pipeline stage each node runs on, and the repeated blocks (layers) in order."""

    stage_of: list[int]
    layers: list[str]  # repeated block scopes (``decoder.0`` …), in program order
    layer_of: list[str] = field(default_factory=list)  # each node's layer ("" outside the repeated blocks)


def _layer(node: Node, group: str) -> str:
    return group if _REPEATED.match(group) else ""


def assign_stages(graph: Graph, groups: list[str], pp: int) -> Stages:
    """Split the repeated blocks into ``pp`` equal runs of consecutive layers."""
    layer_of = [_layer(n, g) for n, g in zip(graph.nodes, groups)]
    layers = list(dict.fromkeys(x for x in layer_of if x))
    if pp > 1 and not layers:
        raise _plan_error(f"--pp {pp}: pipeline stages are made of repeated blocks (repeat(N) ...), and "
                          f"'{graph.name}' has none", None, graph, [])
    if len(layers) % pp:
        first = next(n for n, x in zip(graph.nodes, layer_of) if x)
        divisors = ", ".join(str(d) for d in range(1, len(layers) + 1) if len(layers) % d == 0)
        raise _plan_error(f"--pp {pp}: {len(layers)} repeated layers do not split into {pp} equal pipeline stages",
                          first, graph, [f"choose --pp among the divisors of {len(layers)}: {divisors}"])
    per = max(len(layers) // pp, 1)
    index = {name: i // per for i, name in enumerate(layers)}
    stage_of: list[int] = []
    seen_layer = False
    for x in layer_of:
        if x:
            seen_layer = True
            stage_of.append(index[x])
        else:
            stage_of.append(pp - 1 if seen_layer else 0)
    return Stages(stage_of, layers, layer_of)


def check_tensor_parallel(graph: Graph, tp: int) -> None:
    """Every split must be whole: attention heads, key/value heads and FFN widths divide by ``tp``."""
    if tp == 1:
        return
    types = graph.value_types()
    for node in graph.nodes:
        # what a shard splits: query and key/value heads, the hidden width of an FFN or recurrence
        sizes: list[tuple[str, int]] = []
        if isinstance(node.attrs.get("heads"), int):
            sizes.append(("heads", node.attrs["heads"]))
            if "kv_heads" in node.attrs:
                sizes.append(("kv_heads", kv_heads(node.attrs)))
        if isinstance(node.attrs.get("hidden"), int) and tp_sharded_node(node, types):
            sizes.append(("hidden", node.attrs["hidden"]))
        for what, n in sizes:
            if n % tp:
                raise _plan_error(f"--tp {tp}: '{node.op}' has {what}={n}, which does not split into {tp} "
                                  "tensor-parallel shards", node, graph,
                                  [f"Megatron-style tensor parallelism gives each device {what} / tp; choose "
                                   f"--tp among the divisors of {n}"])


def sharded(shape: tuple) -> bool:
    """A weight of rank ≥ 2 is split across the tensor-parallel group; vectors are replicated."""
    return len(shape) >= 2


def device_params(graph: Graph, stages: Stages, tp: int) -> list[int]:
    """Trainable parameters each pipeline stage holds per tensor-parallel device.

    A shared weight read on another stage than its owner's (a tied head under PP) is held there too,
    as Megatron keeps a copy of the embedding on the last stage."""
    from irc.ops import get_op

    types = graph.value_types()
    pp = max(stages.stage_of) + 1 if stages.stage_of else 1
    out = [0] * pp
    held: set[tuple[int, str]] = set()
    by_scope: dict[str, dict[str, tuple]] = {}
    for node in graph.nodes:
        if node.weights and node.weights not in by_scope:
            by_scope[node.weights] = node_params(node, types)[0]
    for i, node in enumerate(graph.nodes):
        params = {f"{node.weights}.{k}": v for k, v in node_params(node, types)[0].items()}
        opdef = get_op(node.op)
        for a in opdef.attrs if opdef is not None else ():  # weights read by reference (tied=)
            ref = node.attrs.get(a.name) if a.kind == "ref" else None
            params.update({f"{ref}.{k}": v for k, v in by_scope.get(ref, {}).items()} if ref else {})
        s = stages.stage_of[i]
        for name, shape in params.items():
            key = (s, name)
            if key in held:
                continue
            held.add(key)
            n = int(math.prod(shape))
            out[s] += math.ceil(n / tp) if sharded(shape) else n
    return out


def tp_sharded_node(node: Node, types: dict, lowered: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether tensor parallelism splits the node's weights: it owns a weight of rank ≥ 2, or (in a
    lowered graph) reads one from a ``param`` value in ``lowered``. A ``param`` itself computes nothing."""
    if not node.inputs:
        return False
    params, _ = node_params(node, types)
    return any(sharded(s) for s in params.values()) or any(v in lowered and types[v].rank >= 2 for v in node.inputs)


@dataclass
class Collective:
    kind: str  # all-reduce, all-gather, reduce-scatter, point-to-point
    group: str  # dp, tp, pp
    what: str
    bytes: int  # buffer bytes per call
    calls: int  # per step
    ranks: int  # devices in the group

    @property
    def step_bytes(self) -> int:
        return self.bytes * self.calls

    @property
    def sent_bytes(self) -> int:
        """Bytes each device sends per step with ring algorithms: an all-reduce 2(n−1)/n of the buffer,
        an all-gather or reduce-scatter (n−1)/n, a point-to-point transfer all of it."""
        n = self.ranks
        factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n,
                  "reduce-scatter": (n - 1) / n}.get(self.kind, 1.0)
        return round(self.step_bytes * factor)


def communication(graph: Graph, stages: Stages, plan: Plan, stage: int, params: int, w_bytes: int, g_bytes: int,
                  act_dtype: str, micro_batches: int, recompute: str) -> list[Collective]:
    """The collectives one device on ``stage`` takes part in per training step, from the layer shapes."""
    from irc.analysis.memory import value_bytes

    out: list[Collective] = []
    m = micro_batches
    if plan.dp > 1:
        grads, weights = params * g_bytes, params * w_bytes
        if plan.zero == 0:
            out.append(Collective("all-reduce", "dp", "gradients", grads, 1, plan.dp))
        else:
            out.append(Collective("reduce-scatter", "dp", "gradients", grads, m if plan.zero >= 2 else 1, plan.dp))
            if plan.zero >= 3:
                out.append(Collective("all-gather", "dp", "weights (forward and backward)", weights, 2 * m, plan.dp))
            else:
                out.append(Collective("all-gather", "dp", "updated weights", weights, 1, plan.dp))
    from irc.analysis.bytes_moved import weight_values

    types = graph.value_types()
    outputs = {v for _, v in graph.outputs}
    lowered = weight_values(graph)
    if plan.tp > 1:
        fwd = bwd = 0
        for i, node in enumerate(graph.nodes):
            if stages.stage_of[i] != stage or not tp_sharded_node(node, types, lowered):
                continue
            if node.outputs[0] not in outputs and node.types[0].is_float:
                fwd += value_bytes(node.types[0], act_dtype)
            x = types[node.inputs[0]]
            if x.is_float:
                bwd += value_bytes(x, act_dtype)
        fwd_calls = m * (2 if recompute == "full" else 1)  # full recomputation repeats the forward's
        if plan.sp:
            for kind in ("all-gather", "reduce-scatter"):
                if fwd:
                    out.append(Collective(kind, "tp", "layer results (forward)", fwd, fwd_calls, plan.tp))
                if bwd:
                    out.append(Collective(kind, "tp", "input gradients (backward)", bwd, m, plan.tp))
        else:
            if fwd:
                out.append(Collective("all-reduce", "tp", "layer results (forward)", fwd, fwd_calls, plan.tp))
            if bwd:
                out.append(Collective("all-reduce", "tp", "input gradients (backward)", bwd, m, plan.tp))
    if plan.pp > 1:
        boundary = _boundary_bytes(graph, stages, stage, act_dtype, plan)
        sends = (1 if stage < plan.pp - 1 else 0), (1 if stage > 0 else 0)
        if sends[0] and boundary[0]:
            out.append(Collective("point-to-point", "pp", "activations to the next stage", boundary[0], m, 2))
        if sends[1] and boundary[1]:
            out.append(Collective("point-to-point", "pp", "gradients to the previous stage", boundary[1], m, 2))
    return out


def _boundary_bytes(graph: Graph, stages: Stages, stage: int, act_dtype: str, plan: Plan) -> tuple[int, int]:
    """Bytes crossing out of ``stage``: forward to the next stage, backward to the previous one."""
    from irc.analysis.memory import value_bytes

    types = graph.value_types()
    producer_stage = {v: stages.stage_of[i] for i, n in enumerate(graph.nodes) for v in n.outputs}
    forward: set[str] = set()
    backward: set[str] = set()
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            src, dst = producer_stage[v], stages.stage_of[i]
            if src == stage and dst == stage + 1 and types[v].is_float:
                forward.add(v)
            if dst == stage and src == stage - 1 and types[v].is_float:
                backward.add(v)
    share = plan.tp if plan.sp else 1
    return (sum(-(-value_bytes(types[v], act_dtype) // share) for v in sorted(forward)),
            sum(-(-value_bytes(types[v], act_dtype) // share) for v in sorted(backward)))


def bubble(pp: int, micro_batches: int) -> tuple[float, float]:
    """(bubble / ideal time, bubble / step time) of a GPipe or 1F1B schedule (Narayanan et al. 2021)."""
    return (pp - 1) / micro_batches, (pp - 1) / (micro_batches + pp - 1)
