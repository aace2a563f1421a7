"""The NumPy reference interpreter: runs any typed graph op by op. It is the oracle.

Each op family lives in its own file as a table ``op name -> fn(node, args, weights)``,
where ``args`` are the operand arrays and ``weights`` maps the node's short parameter
names (``weight``, ``bias``, ``wq``...) to arrays. ``run_graph`` is the only entry point.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from irc.graph import Graph


def run_graph(graph: Graph, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
              dtype: Any = np.float32, profile: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Execute ``graph``; return ``{output label: array}``.

    ``dtype`` is the float type of every computation (float32, or float64 on request);
    ``profile``, when given, accumulates seconds per op name.
    """
    from irc.backends.numpy_ref.interpreter import interpret

    return interpret(graph, weights, inputs, dtype, profile)
