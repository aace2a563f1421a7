"""Graph passes, registered by name for ``--passes``."""

from irc.passes import decode, decompose, fuse, grad, shape_infer  # noqa: F401
from irc.passes.registry import DESCRIPTIONS, PASSES, get_pass, register_pass

__all__ = ["DESCRIPTIONS", "PASSES", "get_pass", "register_pass"]
