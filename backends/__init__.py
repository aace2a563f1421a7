"""Backends: executors and code generators for irc graphs (installed as ``irc.backends``)."""
