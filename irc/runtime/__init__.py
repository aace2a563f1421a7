"""Running graphs: weights (init, load, save) and the ``irc run`` command."""
