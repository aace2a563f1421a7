"""What a weights file holds, from its headers alone: checked against the model before any data is read.

``irc run --weights`` compares these specs (key, dtype, shape, size) with the model first, so a
file with a weight the model lacks, a wrong shape, or an entry that claims gigabytes is refused
at the cost of reading its headers; only then is the data of the model's weights read.
"""

from __future__ import annotations

from pathlib import Path

from irc.diagnostics import IrcError, os_error_words
from irc.runtime.array_files import ArraySpec, check_file, read_npz_header
from irc.runtime.safetensors_files import read_header as read_safetensors_header


def read_weights_header(path: str | Path) -> dict[str, ArraySpec]:
    """``{key: ArraySpec}`` of an ``.npz`` or ``.safetensors`` file, from its headers."""
    from irc.runtime.weights import _kind  # the suffix rule, with its hints, lives with load_weights

    path = Path(path)
    check_file(path, "weights file")
    kind = _kind(path)
    try:
        return read_npz_header(path) if kind == "npz" else read_safetensors_header(path)
    except OSError as e:  # permissions, I/O errors
        raise IrcError(f"cannot read '{path}': {os_error_words(e)}") from None
