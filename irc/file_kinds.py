"""What a file given as a model is, from its first bytes, and what to do when it is not an .arch model.

``irc compile config.json`` used to answer with a parser error ("unexpected '{'"), and a
binary ``model.onnx`` with 200 bytes of it echoed. :func:`file_kind` recognises the files
people reach for by their content (the suffix only breaks ties), and :func:`not_a_model`
says in one sentence what the file is and which command reads it. A reader for one of these
kinds (the ONNX frontend) adds its branch in ``irc.pipeline.load_graph`` before the
``not_a_model`` check.
"""

from __future__ import annotations

import json
from pathlib import Path

SNIFF_BYTES = 4096  # enough for a Hugging Face config's first keys, and any binary magic

# kinds, from their content
ARCH = "arch"  # text: the .arch language (or anything the parser should judge)
IR = "ir"  # an irc IR dump (by suffix)
HF_CONFIG = "hf-config"
JSON = "json"
ONNX = "onnx"
SAFETENSORS = "safetensors"
TORCH = "torch"
PICKLE = "pickle"
NUMPY = "numpy"
ZIP = "zip"
BINARY = "binary"


def file_kind(path: Path) -> str:
    """The kind of the file at ``path`` (which exists and is a regular file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return ARCH  # the reader reports the error in its own words
    return kind_of(head, path.suffix.lower())


def kind_of(head: bytes, suffix: str = "") -> str:
    """The kind of a file that starts with ``head`` and has the (lower-case) ``suffix``."""
    if suffix == ".ir":
        return IR
    if head.startswith(b"\x93NUMPY"):
        return NUMPY
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return TORCH if b"data.pkl" in head or b"/version" in head else ZIP
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return PICKLE
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        return SAFETENSORS
    if _looks_like_onnx(head, suffix):
        return ONNX
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"{") and _hf_config(text):
        return HF_CONFIG
    if suffix == ".arch":  # what else it holds, the parser judges, at its line and column
        return ARCH
    if text.startswith(b"{"):
        return JSON
    if b"\x00" in head or not _mostly_text(head):
        return BINARY
    return ARCH


def _looks_like_onnx(head: bytes, suffix: str) -> bool:
    """An ONNX ModelProto starts with field 1, ``ir_version`` (tag 0x08, a small varint), followed by
    another field of the message (producer_name 0x12, opset_import 0x42, graph 0x3a, ...)."""
    if suffix == ".onnx" and head and not _mostly_text(head):
        return True
    return len(head) >= 3 and head[0] == 0x08 and 1 <= head[1] <= 20 and head[2] in (0x12, 0x1A, 0x22, 0x2A,
                                                                                    0x32, 0x3A, 0x42, 0x72)


def _hf_config(text: bytes) -> bool:
    """A Hugging Face ``config.json``: a JSON object with ``model_type`` or ``architectures``."""
    try:
        data = json.loads(text.decode("utf-8", "replace"))
    except (ValueError, RecursionError):  # cut at SNIFF_BYTES: look for the keys in the text instead
        return b'"model_type"' in text or b'"architectures"' in text
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)


def _mostly_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # not just a character cut at the end of the sniffed bytes
            return False
        text = head[:e.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n\f" for c in text)


def not_a_model(path: Path, kind: str) -> str | None:
    """Why ``path``, of ``kind``, is not a model irc reads, and what to do; None for .arch and .ir files."""
    name = f"'{path}'"
    return {
        HF_CONFIG: f"{name} is a Hugging Face config, not an .arch model: turn it into one with "
                   f"'irc import {path} -o model.arch'",
        JSON: f"{name} is a JSON file, not an .arch model (a Hugging Face config.json has \"model_type\"; "
              "irc import reads those)",
        ONNX: f"{name} is an ONNX model: irc reads .arch models and .ir dumps; the ONNX frontend "
              "(irc.frontends.onnx) is what reads .onnx files",
        SAFETENSORS: f"{name} is a .safetensors weights file, not a model: give it to 'irc run MODEL.arch "
                     "--weights' instead",
        TORCH: f"{name} is a PyTorch checkpoint (torch.save), not a model; irc never loads pickles: write the "
               "architecture as an .arch file (or 'irc import config.json') and convert the weights with "
               "safetensors",
        PICKLE: f"{name} is a Python pickle, which irc never loads (unpickling can run any code)",
        NUMPY: f"{name} is a NumPy array, not a model: give it to 'irc run MODEL.arch --input NAME=FILE.npy'",
        ZIP: f"{name} is a zip archive (an .npz of weights?), not a model: give weights to 'irc run MODEL.arch "
             "--weights'",
        BINARY: f"{name} is a binary file, not an .arch model (irc reads .arch text and .ir dumps)",
    }.get(kind)
