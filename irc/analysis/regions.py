"""Linear regions of a ReLU MLP (the chapter's "Why depth beats width").

For a chain input → (linear → relu) × L → linear with input dimension d_in and hidden
widths w_1..w_L, Montúfar et al. (2014) give the lower bound, in the chapter's form,
    Π_{i<L} ⌊w_i/d_in⌋^d_in · w_L^d_in      ( = (w/d_in)^(d_in·(L−1)) · w^d_in at uniform width )
— exponential in depth, polynomial in width. On a 1-D input the fold |2x − 1|, two units
per layer, witnesses 2^L pieces; one hidden layer of w units has at most w + 1.
"""

from __future__ import annotations

import math
from typing import Any

from irc.graph import Graph


def relu_mlp_chain(graph: Graph) -> tuple[int, list[int]] | None:
    """(d_in, hidden widths) when the graph is exactly a ReLU MLP, else None."""
    body = [n for n in graph.nodes if n.op != "input"]
    inputs = graph.inputs()
    if len(inputs) != 1 or len(body) < 3 or len(body) % 2 == 0:
        return None
    x = inputs[0]
    d_in = x.types[0].shape[-1]
    if not x.types[0].is_float or not isinstance(d_in, int):
        return None
    widths: list[int] = []
    previous = x.outputs[0]
    for i, node in enumerate(body):
        want = "linear" if i % 2 == 0 else "relu"
        if node.op != want or node.inputs != [previous]:
            return None
        if want == "relu":
            widths.append(node.type.shape[-1])
        previous = node.outputs[0]
    if [v for _, v in graph.outputs] != [previous] or not all(isinstance(w, int) for w in widths):
        return None
    return d_in, widths


EXACT_DIGITS = 1000  # past this the bound is given by its decimal logarithm (it can have billions of digits)


def montufar_log10(d_in: int, widths: list[int]) -> float:
    """log10 of the bound (-inf when a factor ⌊w_i/d_in⌋ is 0), without forming it."""
    factors = [w // d_in for w in widths[:-1]] + [widths[-1]]
    if min(factors) == 0:
        return -math.inf
    return d_in * sum(math.log10(f) for f in factors)


def montufar_bound(d_in: int, widths: list[int]) -> int | None:
    """The bound exactly, or None when it has more than EXACT_DIGITS digits."""
    digits = montufar_log10(d_in, widths)
    if digits == -math.inf:
        return 0
    if digits > EXACT_DIGITS:
        return None
    bound = 1
    for w in widths[:-1]:
        bound *= (w // d_in) ** d_in
    return bound * widths[-1] ** d_in


def relu_mlp_regions(graph: Graph) -> dict[str, Any] | None:
    chain = relu_mlp_chain(graph)
    if chain is None:
        return None
    d_in, widths = chain
    depth = len(widths)
    return {
        "input_dim": d_in,
        "hidden_widths": widths,
        "depth": depth,
        "linear_regions_lower_bound": montufar_bound(d_in, widths),
        "linear_regions_lower_bound_log10": round(montufar_log10(d_in, widths), 4)
        if montufar_log10(d_in, widths) > -math.inf else None,
        "fold_regions": 2**depth if d_in == 1 and min(widths) >= 2 else None,
        "one_layer_max_regions": widths[0] + 1 if d_in == 1 and depth == 1 else None,
    }
