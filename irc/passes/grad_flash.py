"""The ``flash-grad`` pass: each attention core of a differentiated graph, forward and backward, becomes the
flash-style pair ``sdpa`` + ``sdpa_grad`` (irc/ops/grad_attention.py), so no T×S matrix is kept.

The grad pass differentiates attention through its decomposed ops (docs/autodiff.md): the forward
``softmax([causal_mask](mul(matmul(q, transpose(k)), scale)))·v`` keeps its probabilities ``P`` for the
backward, which reads them twice (``softmax_grad(P, dP)`` and ``Pᵀ·dctx``) and runs five more matmuls. This
pass finds that whole pattern — the forward chain, ``dP = dctx·vᵀ``, ``dv = Pᵀ·dctx``, the softmax and
mask gradients, the scale, ``dq = dS·k``, ``dk = (qᵀ·dS)ᵀ`` — and replaces it by ``o = sdpa(q, k, v)`` and
``dq, dk, dv = sdpa_grad(q, k, v, o, dctx)``, keeping every value name the rest of the graph reads.

A core the pattern does not cover stays as it is (correct, just not fused): an additive score bias (T5's
relative positions: its gradient is a T×S tensor), grouped key/value heads (decompose's 5-D views), an
operand without a gradient. ``irc train --backend cpu`` applies it to the step graph before compiling.
"""

from __future__ import annotations

from irc.graph import Graph, Node
from irc.ops import get_op, normalize_attrs
from irc.passes.registry import register_pass
from irc.passes.rewrite import eliminate_dead
from irc.passes.shape_infer import shape_infer


class _Graph:
    """Producers and readers of the graph being matched."""

    def __init__(self, graph: Graph):
        self.producer = graph.producers()
        self.users = graph.users()
        self.outputs = {v for _, v in graph.outputs}
        self.rank = {v: t.rank for v, t in graph.value_types().items()}

    def prod(self, value: str, op: str) -> Node | None:
        n = self.producer.get(value)
        return n if n is not None and n.op == op else None

    def readers(self, value: str) -> list[Node]:
        return [] if value in self.outputs else list(self.users.get(value, []))

    def only(self, value: str, op: str) -> Node | None:
        """The single reader of ``value`` when it is an ``op`` and the value is not a graph output."""
        r = self.readers(value)
        return r[0] if len(r) == 1 and r[0].op == op else None

    def swapped(self, node: Node | None) -> bool:
        """A transpose of the last two axes of a rank-4 value."""
        return node is not None and node.op == "transpose" and node.attrs["perm"] == [0, 1, 3, 2]


def _match(g: _Graph, sm: Node) -> dict | None:
    """The attention core around softmax ``sm`` and its backward, or None."""
    if sm.attrs["axis"] not in (-1, 3) or g.rank.get(sm.outputs[0]) != 4:
        return None
    probs = sm.outputs[0]
    chain = [sm]
    scores = sm.inputs[0]
    mask = g.prod(scores, "causal_mask")
    if mask is not None:
        if g.only(scores, "softmax") is not sm:
            return None
        chain.append(mask)
        scores = mask.inputs[0]
    scaled = g.prod(scores, "mul")
    if scaled is None or scaled.attrs["scalar"] is None or g.only(scores, mask.op if mask else "softmax") is None:
        return None
    qk = g.prod(scaled.inputs[0], "matmul")
    if qk is None or g.only(scaled.inputs[0], "mul") is not scaled:
        return None
    chain += [scaled, qk]
    q, kt = qk.inputs
    tr = g.producer.get(kt)
    if not g.swapped(tr) or g.rank.get(q) != 4:
        return None
    k = tr.inputs[0]
    # the three readers of P: the context matmul, softmax_grad, and Pᵀ for dv
    readers = g.readers(probs)
    ctx = [n for n in readers if n.op == "matmul" and n.inputs[0] == probs]
    sg = [n for n in readers if n.op == "softmax_grad" and n.inputs[0] == probs]
    pt = [n for n in readers if g.swapped(n)]
    if len(readers) != 3 or len(ctx) != 1 or len(sg) != 1 or len(pt) != 1:
        return None
    ctx_node, sg_node, pt_node = ctx[0], sg[0], pt[0]
    v = ctx_node.inputs[1]
    dv = g.only(pt_node.outputs[0], "matmul")
    dp = g.prod(sg_node.inputs[1], "matmul")
    if dv is None or dp is None or g.only(dp.outputs[0], "softmax_grad") is not sg_node or g.rank.get(v) != 4:
        return None
    dctx = dp.inputs[0]
    vt = g.producer.get(dp.inputs[1])
    if dv.inputs != [pt_node.outputs[0], dctx] or not g.swapped(vt) or vt.inputs[0] != v:
        return None
    grad = sg_node.outputs[0]
    back = [sg_node, dp, pt_node, dv]
    if mask is not None:
        mg = g.only(grad, "causal_mask_grad")
        if mg is None or mg.attrs.get("window") != mask.attrs.get("window"):
            return None
        back.append(mg)
        grad = mg.outputs[0]
    ds = g.only(grad, "mul")
    if ds is None or ds.attrs["scalar"] != scaled.attrs["scalar"]:
        return None
    back.append(ds)
    users = g.readers(ds.outputs[0])
    dq = [n for n in users if n.op == "matmul" and n.inputs[0] == ds.outputs[0]]
    dkt = [n for n in users if n.op == "matmul" and n.inputs[1] == ds.outputs[0]]
    if len(users) != 2 or len(dq) != 1 or len(dkt) != 1:
        return None
    ktt, qt = g.producer.get(dq[0].inputs[1]), g.producer.get(dkt[0].inputs[0])
    if not (g.swapped(ktt) and ktt.inputs[0] == kt and g.swapped(qt) and qt.inputs[0] == q):
        return None
    dk = g.only(dkt[0].outputs[0], "transpose")
    if dk is None or not g.swapped(dk):
        return None
    back += [dq[0], dkt[0], dk]
    attrs = {"scale": scaled.attrs["scalar"], "causal": mask is not None,
             "window": mask.attrs.get("window") if mask is not None else None}
    return {"q": q, "k": k, "v": v, "ctx": ctx_node, "dctx": dctx, "attrs": attrs, "forward": chain,
            "backward": back, "dq": dq[0].outputs[0], "dk": dk.outputs[0], "dv": dv.outputs[0]}


def _node(op: str, inputs: list[str], outputs: list[str], attrs: dict, like: Node) -> Node:
    opdef = get_op(op)
    assert opdef is not None, op
    clean = normalize_attrs(opdef, {k: v for k, v in attrs.items() if v is not None})
    return Node(op, inputs, outputs, clean, like.scope, None, like.loc)


@register_pass("flash-grad", "after grad: each attention core, forward and backward, as sdpa + sdpa_grad (flash-style)")
def flash_attention_grad(graph: Graph) -> Graph:
    """``graph`` with every matched attention core rewritten (see the module's docstring); the graph itself
    when none matches."""
    g = _Graph(graph)
    matches = [m for m in (_match(g, n) for n in graph.nodes if n.op == "softmax") if m is not None]
    if not matches:
        return graph
    removed: set[int] = set()
    at: dict[int, list[Node]] = {}  # id of a node -> the nodes that take its place
    for m in matches:
        ctx = m["ctx"]
        fwd = _node("sdpa", [m["q"], m["k"], m["v"]], list(ctx.outputs), m["attrs"], ctx)
        first = min((n for n in m["backward"] if n.outputs[0] in (m["dq"], m["dk"], m["dv"])),
                    key=graph.nodes.index)
        bwd = _node("sdpa_grad", [m["q"], m["k"], m["v"], ctx.outputs[0], m["dctx"]],
                    [m["dq"], m["dk"], m["dv"]], m["attrs"], first)
        at[id(ctx)] = [fwd]
        at[id(first)] = [bwd]
        removed.update(id(n) for n in m["forward"] + m["backward"] + [ctx])
    nodes: list[Node] = []
    for node in graph.nodes:
        nodes.extend(at.get(id(node), []))
        if id(node) not in removed:
            nodes.append(node)
    out = Graph(graph.name, list(graph.symbols), nodes, list(graph.outputs), dict(graph.bindings), graph.loc)
    return shape_infer(eliminate_dead(out))
