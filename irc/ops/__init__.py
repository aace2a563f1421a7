"""Every op irc knows, registered on import."""

from irc.ops import (  # noqa: F401
    attention,
    conv,
    decode,
    dense,
    elementwise,
    embedding,
    fused_conv,
    grad_layers,
    grad_moe,
    grad_ops,
    losses,
    mla,
    moe,
    norm,
    primitives,
    recurrent,
    resample,
    shape_ops,
)
from irc.ops.registry import OPS, Attr, AttrError, OpDef, ShapeError, canonical_name, get_op, normalize_attrs

__all__ = ["OPS", "Attr", "AttrError", "OpDef", "ShapeError", "canonical_name", "get_op", "normalize_attrs"]
