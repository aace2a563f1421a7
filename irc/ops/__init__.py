"""Every op irc knows, registered on import."""

from irc.ops import attention, conv, dense, elementwise, embedding, norm, recurrent, shape_ops  # noqa: F401
from irc.ops.registry import OPS, Attr, AttrError, OpDef, ShapeError, canonical_name, get_op, normalize_attrs

__all__ = ["OPS", "Attr", "AttrError", "OpDef", "ShapeError", "canonical_name", "get_op", "normalize_attrs"]
