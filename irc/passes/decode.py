"""Derive a decoder's incremental-decoding graph: the KV cache as explicit IR values.

From a model with causal self-attention (the layer-level graph: ``attention`` with
``causal=true``, ``kv_heads``, ``rope``, ``window``), the pass builds the graph that takes T new
tokens, each row's position ``pos`` [B] (tokens already cached) and every layer's cache, and
returns the logits and the updated caches:

- each causal self-attention layer becomes ``cached_attention`` reading ``k_cache_i`` and
  ``v_cache_i`` [B, kv_heads, slots, head_dim] and yielding ``k_next_i`` / ``v_next_i`` (the
  same buffers, updated in place by the runtimes); slots is the context, or W for a
  sliding-window layer (a rolling buffer);
- each positional encoding becomes ``positional_at`` (its table read at pos + t).

- a cross-attention layer over an encoder's output becomes ``cross_kv`` (its keys and values,
  ``k_cross_i`` / ``v_cross_i``, made once in the prefill) and ``cached_cross_attention``; the step
  graph takes them as inputs and holds no encoder node;
- T5's causal relative-position bias becomes ``rel_position_bias_at`` (one column per slot).

``valid`` [B] says how many of the T new tokens of each row are real (right-padded prompts; 0 for
a row that has finished). The prefill graph runs at T = the longest prompt, the step graph at
T = 1. Every other op on the decoder's side must act on each token alone (norms, FFNs,
embeddings, the head); a recurrence, a convolution over time or a bidirectional attention there
cannot be decoded this way and is refused by name. The encoder's side may hold anything.

With ``source_mask`` an encoder-decoder also takes ``src_mask`` [B, 1, 1, S] (0 for a real source
token, −inf for padding: right-padded sources of different lengths), added to the scores of every
encoder attention and of every cross-attention, so no query reads a padded key; the encoder's
other ops must then act on each position alone (a convolution or pooling there is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from irc.diagnostics import IrcError
from irc.dims import Dim, Sym
from irc.graph import Graph, Node
from irc.ops import get_op, normalize_attrs
from irc.ops.attention import head_dim, is_cross, kv_heads
from irc.ops.decode import _KEPT, cache_slots
from irc.passes.registry import register_pass
from irc.passes.shape_infer import shape_infer
from irc.types import TensorType

# op classes whose result at one position reads other positions of the sequence
_MIXING = ("recurrent", "conv", "pool", "window")
CONTEXT_SYMBOL = "C"  # the context the registered pass leaves symbolic
SOURCE_MASK = "src_mask"  # the input holding an encoder-decoder's padding mask


@dataclass(frozen=True)
class CacheLayer:
    """One cached layer: its value names, the layer's scope and the cache's type."""

    k_in: str
    v_in: str
    k_out: str
    v_out: str
    scope: str
    type: TensorType
    window: int | None


def _decodable(node: Node) -> bool:
    a = node.attrs
    return bool(a.get("causal")) and not is_cross(node) and a.get("rel_buckets") is None and \
        (len(node.inputs) == 1 or (len(node.inputs) == 3 and node.inputs[1] == node.inputs[0]))


def _input_deps(graph: Graph) -> dict[str, frozenset[str]]:
    """The graph inputs each value depends on."""
    deps: dict[str, frozenset[str]] = {}
    for n in graph.nodes:
        here = frozenset(n.outputs) if n.op == "input" else frozenset().union(*(deps[v] for v in n.inputs))
        for v in n.outputs:
            deps[v] = here
    return deps


def decoder_inputs(graph: Graph) -> frozenset[str]:
    """The inputs the decoder's tokens come in by: those the first causal self-attention reads.
    Every other input belongs to an encoder, run once per sequence in the prefill."""
    deps = _input_deps(graph)
    first = next((n for n in graph.nodes if n.op == "attention" and _decodable(n)), None)
    if first is None:
        raise IrcError(f"decode: '{graph.name}' has no causal self-attention layer, so it has no KV cache to "
                       "decode with", graph.loc)
    return deps[first.inputs[0]]


def _refuse(graph: Graph, node: Node, what: str) -> IrcError:
    return IrcError(f"decode: {what} reads other positions of the sequence, so '{graph.name}' cannot be decoded "
                    "with a KV cache (only causal self-attention, cross-attention and positional encodings are)",
                    node.loc)


def _source_length(graph: Graph, types, per_token) -> Dim | None:
    """The length S of the encoder memory every cross-attention reads (None: no cross-attention)."""
    lengths = {types[n.inputs[1]].shape[1] for n in graph.nodes
               if n.op == "attention" and is_cross(n) and len(n.inputs) == 2 and not per_token(n.inputs[1])}
    if len(lengths) > 1:
        raise IrcError(f"decode: the cross-attentions of '{graph.name}' read memories of different lengths "
                       f"({', '.join(map(str, lengths))}): one padding mask cannot cover them", graph.loc)
    return next(iter(lengths), None)


def _masked_encoder(graph: Graph, node: Node, types, mask: str, made: dict[str, Node], length: Dim) -> list[Node]:
    """``node`` of the encoder with the padding mask on its attention scores: the nodes to emit
    (an ``add`` of the mask to its bias, once per bias, then the attention reading it)."""
    if node.op != "attention":
        opdef = get_op(node.op)
        if opdef is not None and opdef.has(*_MIXING):
            raise IrcError(f"decode: a source padding mask covers attention only; '{node.op}' in the encoder of "
                           f"'{graph.name}' mixes positions, so padded sources would change real ones", node.loc)
        return [_clone(node)]
    x = node.inputs[0]
    kv = node.inputs[1] if len(node.inputs) > 1 else x
    if types[kv].shape[1] != length:
        raise IrcError(f"decode: this encoder attention's keys have length {types[kv].shape[1]}, not the source's "
                       f"{length}: the padding mask does not fit it", node.loc)
    out: list[Node] = []
    if len(node.inputs) > 2:
        bias = node.inputs[2]
        if bias not in made:
            made[bias] = Node("add", [bias, mask], [f"{bias}.masked"], normalize_attrs(get_op("add"), {}),
                              node.scope, None, node.loc)
            out.append(made[bias])
        scores_bias = made[bias].outputs[0]
    else:
        scores_bias = mask
    masked = _clone(node)
    masked.inputs = [x, kv, scores_bias]
    return out + [masked]


def decode_graph(graph: Graph, ctx: Dim, cache_dtype: str = "f32", step: bool = False,
                 source_mask: bool = False) -> Graph:
    """The prefill graph of a typed model graph, or with ``step`` its step graph (module docstring)."""
    types = graph.value_types()
    dec_inputs = decoder_inputs(graph)
    deps = _input_deps(graph)

    def per_token(v: str) -> bool:  # computed anew for every token (else: the encoder's, once)
        return bool(deps[v] & dec_inputs)

    batch = next(n for n in graph.nodes if n.outputs[0] in dec_inputs).types[0].shape[0]
    out = Graph(f"{graph.name}_{'step' if step else 'prefill'}", list(graph.symbols), [], list(graph.outputs),
                dict(graph.bindings), graph.loc)
    if isinstance(ctx, Sym) and CONTEXT_SYMBOL not in out.symbols:
        out.symbols.append(CONTEXT_SYMBOL)
    ids = TensorType("i32", (batch,))
    extra = [Node("input", [], ["pos"], loc=graph.loc, types=[ids]),
             Node("input", [], ["valid"], loc=graph.loc, types=[ids])]
    source = _source_length(graph, types, per_token) if source_mask else None
    if source is not None:
        extra.append(Node("input", [], [SOURCE_MASK], loc=graph.loc, types=[TensorType("f32", (batch, 1, 1, source))]))
    made: dict[str, Node] = {}  # an encoder bias -> its masked sum
    body: list[Node] = []
    cached = crossed = 0
    for node in graph.nodes:
        if node.op == "input":
            if not step or node.outputs[0] in dec_inputs:
                out.nodes.append(node)
            continue
        if not per_token(node.outputs[0]):  # the encoder: run once, in the prefill
            if not step:
                body += _masked_encoder(graph, node, types, SOURCE_MASK, made, source) if source is not None \
                    else [_clone(node)]
            continue
        opdef = get_op(node.op)
        a = node.attrs
        if node.op == "attention" and is_cross(node) and not per_token(node.inputs[1]) and len(node.inputs) == 2:
            i, x = crossed, types[node.inputs[0]]
            crossed += 1
            hd = head_dim(a, x.shape[-1])
            names = [f"k_cross_{i}", f"v_cross_{i}"]
            proj = {k: a.get(k) for k in ("heads", "kv_heads", "bias")}
            if step:
                cache = TensorType(cache_dtype, (batch, kv_heads(a), types[node.inputs[1]].shape[1], hd))
                extra += [Node("input", [], [v], loc=node.loc, types=[cache]) for v in names]
            else:
                body.append(_new("cross_kv", [node.inputs[1]], names, {**proj, "head_dim": hd, "dtype": cache_dtype},
                                 node))
                out.outputs += [(v, v) for v in names]
            mask = [SOURCE_MASK] if source is not None else []
            body.append(_new("cached_cross_attention", [node.inputs[0], *names, *mask], list(node.outputs),
                             {**proj, "scale": a.get("scale"), "head_dim": a.get("head_dim")}, node))
        elif node.op == "attention" and _decodable(node):
            i, x = cached, types[node.inputs[0]]
            cached += 1
            cache = TensorType(cache_dtype, (batch, kv_heads(a), cache_slots(a, ctx), head_dim(a, x.shape[-1])))
            k_in, v_in, k_out, v_out = f"k_cache_{i}", f"v_cache_{i}", f"k_next_{i}", f"v_next_{i}"
            extra += [Node("input", [], [k_in], loc=node.loc, types=[cache]),
                      Node("input", [], [v_in], loc=node.loc, types=[cache])]
            operands = [node.inputs[0], k_in, v_in, "pos", "valid"] + node.inputs[2:]
            body.append(_new("cached_attention", operands, [node.outputs[0], k_out, v_out],
                             {k: a.get(k) for k in _KEPT}, node))
            out.outputs += [(k_in, k_out), (v_in, v_out)]
        elif node.op == "positional":
            body.append(_new("positional_at", [node.inputs[0], "pos"], [node.outputs[0]], dict(a), node))
        elif node.op == "rel_position_bias" and not a.get("bidirectional"):
            body.append(_new("rel_position_bias_at", [node.inputs[0], "pos"], [node.outputs[0]],
                             {**{k: a[k] for k in ("heads", "buckets", "max_distance", "bidirectional")},
                              "keys": ctx}, node))
        elif node.op in ("attention", "rel_position_bias"):
            raise _refuse(graph, node, "this attention (bidirectional, or with a score bias it cannot offset)")
        elif opdef is not None and opdef.has(*_MIXING):
            raise _refuse(graph, node, f"'{node.op}'")
        else:
            body.append(_clone(node))
    encoder = [(n, v) for n in body for v in n.inputs if v in deps and not per_token(v)] if step else []
    if encoder:
        reader, value = encoder[0]
        raise IrcError(f"decode: '{reader.op}' reads the encoder's %{value} other than through cross-attention, so "
                       f"the steps of '{graph.name}' cannot run without the encoder", reader.loc)
    out.nodes += extra + body
    return shape_infer(out)


def _new(op: str, inputs: list[str], outputs: list[str], attrs: dict, like: Node) -> Node:
    """A node of ``op`` at ``like``'s scope, weights and location, its attributes in the record's order
    (so the IR prints as it parses back)."""
    opdef = get_op(op)
    assert opdef is not None, op
    return Node(op, inputs, outputs, normalize_attrs(opdef, {k: v for k, v in attrs.items() if v is not None}),
                like.scope, like.weights, like.loc)


def _clone(node: Node) -> Node:
    return Node(node.op, list(node.inputs), list(node.outputs), dict(node.attrs), node.scope, node.weights, node.loc)


def cache_layers(graph: Graph) -> list[CacheLayer]:
    """The cached layers of a decode graph, in order (read from its ``cached_attention`` nodes)."""
    return [CacheLayer(n.inputs[1], n.inputs[2], n.outputs[1], n.outputs[2], n.scope, n.types[1],
                       n.attrs.get("window")) for n in graph.nodes if n.op == "cached_attention"]


@register_pass("decode", "derive the KV-cache prefill graph: causal attention becomes cached_attention over "
                         "k_cache_i/v_cache_i [B, kv_heads, C, head_dim], positions read at pos, cross-attention "
                         "keys/values made once by cross_kv")
def decode(graph: Graph) -> Graph:
    return decode_graph(graph, Sym.var(CONTEXT_SYMBOL))


@register_pass("decode-step", "derive the KV-cache step graph (run it with T=1): as decode, with the encoder's "
                              "cross-attention keys/values as inputs k_cross_i/v_cross_i")
def decode_step(graph: Graph) -> Graph:
    return decode_graph(graph, Sym.var(CONTEXT_SYMBOL), step=True)
