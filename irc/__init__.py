"""irc: a compiler for neural-network architectures."""

__version__ = "0.1.0"
