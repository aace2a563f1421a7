"""A mixture-of-experts FFN: a router sends each token to ``top_k`` of ``experts`` FFNs, plus shared experts.

Mixtral (Jiang et al. 2024): 8 SwiGLU experts, the top 2 per token, their router probabilities
renormalised over the two; DeepSeekMoE / DeepSeek-V2 (Dai et al. 2024): many fine-grained experts, a few
shared experts every token passes through, top-k probabilities used as they are (times a routed scaling
factor). The layer's parameters are all the experts'; a token uses only the router, the shared experts
and k of the routed ones, so the record declares the parameters a token leaves unused (``inactive``)
and the analysis reports total and active counts. FLOPs count what a token computes: the router, k
experts and the shared ones.

Weights are stacked per expert: ``router [E, d]``, ``w_gate``/``w_up [E, h, d]`` and ``w_down [E, d, h]``
(``w1 [E, h, d]``/``w2 [E, d, h]`` for ungated experts), and the shared experts as one FFN of hidden
``shared_hidden`` (DeepSeek's n_shared · h): ``shared_gate``, ``shared_up [hs, d]``, ``shared_down [d, hs]``.
"""

from __future__ import annotations

from irc.ops.common import need_float, need_rank
from irc.ops.cost import SOFTMAX_PER_ELEMENT, Cost, rows
from irc.ops.registry import RF_LAST_AXIS, Attr, OpDef, ShapeError, register

MOE_ACTS = ("silu", "gelu", "gelu_tanh", "relu")


def shared_hidden(a) -> int:
    """The shared experts' combined hidden width: shared_hidden= when given, else shared · hidden."""
    if a.get("shared_hidden") is not None:
        return a["shared_hidden"] if a["shared"] else 0
    return a["shared"] * a["hidden"]


def _matrices(a) -> int:
    """Weight matrices per expert: gate, up and down (SwiGLU-style) or in and out."""
    return 3 if a["gated"] else 2


def _infer(a, ts):
    (x,) = ts
    need_rank(x, 1, "an input")
    need_float(x)
    if a["top_k"] > a["experts"]:
        raise ShapeError(f"top_k={a['top_k']} exceeds the {a['experts']} experts a token can be routed to")
    if a.get("shared_hidden") is not None and not a["shared"]:
        raise ShapeError("shared_hidden is given but shared=0: there are no shared experts to size")
    return [x]


def _params(a, ts):
    d, e, h = ts[0].shape[-1], a["experts"], a["hidden"]
    p = {"router": (e, d)}
    if a["gated"]:
        p.update({"w_gate": (e, h, d), "w_up": (e, h, d), "w_down": (e, d, h)})
    else:
        p.update({"w1": (e, h, d), "w2": (e, d, h)})
    hs = shared_hidden(a)
    if hs:
        if a["gated"]:
            p.update({"shared_gate": (hs, d), "shared_up": (hs, d), "shared_down": (d, hs)})
        else:
            p.update({"shared_w1": (hs, d), "shared_w2": (d, hs)})
    return p


def _inactive(a, ts, tokens: int = 1) -> float:
    """The experts ``tokens`` tokens are not routed to, each _matrices · h · d numbers: E − k of them for one
    token; for N tokens routed uniformly at random, E·(1 − k/E)^N expected (each expert is missed by a token
    with probability 1 − k/E), so a batch of decode steps reads more experts than one, and a prefill all."""
    e, k = a["experts"], a["top_k"]
    unused = e - k if tokens == 1 else e * (1 - k / e) ** tokens
    return unused * _matrices(a) * a["hidden"] * ts[0].shape[-1]


def _cost(node, ins, outs) -> Cost:
    a = node.attrs
    x = ins[0]
    n, d = rows(x), x.shape[-1]
    e, k, h, hs, m = a["experts"], a["top_k"], a["hidden"], shared_hidden(a), _matrices(a)
    c = Cost().mac("linear", n * e * d)  # router logits
    c.add("softmax", SOFTMAX_PER_ELEMENT * n * e)
    c.add("elementwise", n * e)  # choosing the top k: one comparison per score (a k-slot heap)
    if a["norm_topk"]:
        c.add("elementwise", 2 * n * k)  # the sum of the k probabilities and the k divisions
    if a["scale"] != 1.0:
        c.add("elementwise", n * k)
    c.mac("linear", n * (k * h + hs) * m * d)  # the k routed experts and the shared ones
    c.add("activation", n * (k * h + hs))
    if a["gated"]:
        c.add("elementwise", n * (k * h + hs))  # act(gate) ⊙ up
    c.add("elementwise", n * k * d)  # each expert's output times its weight
    return c.add("elementwise", n * (k - 1 + (1 if hs else 0)) * d)  # summing the outputs


def _internal(a, ts) -> int:
    """Router scores, and per token the hidden layers of its k experts and the shared ones (gate, up and
    their product when gated; before and after the activation when not)."""
    n = ts[0].numel() // ts[0].shape[-1]
    return n * a["experts"] + n * (a["top_k"] * a["hidden"] + shared_hidden(a)) * (3 if a["gated"] else 2)


def _init(a) -> dict[str, str]:
    """normal(0, 0.02) for the router and every expert matrix, as Mixtral and DeepSeek initialise them."""
    names = ("router", "w_gate", "w_up", "w_down", "w1", "w2", "shared_gate", "shared_up", "shared_down",
             "shared_w1", "shared_w2")
    return dict.fromkeys(names, "normal")


def _vjp(b, n, dys):
    """Its vector-Jacobian product lives with its backward primitive (irc/ops/grad_moe.py derives moe_grad from
    this record, so it is imported when the grad pass first calls it)."""
    from irc.ops.grad_moe import vjp_moe

    return vjp_moe(b, n, dys)


register(OpDef(
    "moe", ("x",),
    (
        Attr("experts", "posint", doc="routed experts E"),
        Attr("top_k", "posint", doc="experts each token is routed to"),
        Attr("hidden", "dim", doc="each expert's hidden width"),
        Attr("shared", "nonneg", 0, doc="shared experts every token passes through (DeepSeekMoE)"),
        Attr("shared_hidden", "dim", None, doc="their combined hidden width; default shared · hidden"),
        Attr("act", "enum", "silu", MOE_ACTS),
        Attr("gated", "bool", True, doc="SwiGLU-style experts (gate, up, down); false: two matrices"),
        Attr("norm_topk", "bool", True, doc="renormalise the k probabilities to sum to 1 (Mixtral); "
                                            "false: use them as they are (DeepSeek-V2)"),
        Attr("scale", "float", 1.0, doc="routed scaling factor on the k weights (DeepSeek's)"),
    ),
    _infer, _params, aliases=("mixture_of_experts",),
    doc="p = softmax(x·routerᵀ); the k largest p_e pick experts; y = Σ_e w_e·FFN_e(x) + shared FFN(x), "
        "w = p over the chosen (renormalised when norm_topk) times scale",
    cost=_cost, init=_init, internal=_internal, receptive=RF_LAST_AXIS,
    classes=frozenset({"linear", "learned", "ffn", "moe"}), depth=2, inactive=_inactive, vjp=_vjp,
    na={"cuda": "the CUDA backend has no kernel that groups tokens by expert yet"},
))

