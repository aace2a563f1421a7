"""Frontends: languages that build an irc graph (installed as ``irc.frontends``)."""
