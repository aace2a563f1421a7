"""The ``.arch`` model language."""

from irc.frontends.arch.builder import build_file, build_source

__all__ = ["build_file", "build_source"]
