"""Read an ``.onnx`` file: the model (weights left unread when only analysing), its inputs' types, and the
errors that name an ONNX node.

Weights are left where they are: ``onnx.load(..., load_external_data=False)`` never opens a weight file
written beside the model, and embedded initializers are read only when a weight value is asked for (their
shapes come from ``TensorProto.dims``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from irc.diagnostics import IrcError, Loc, quote
from irc.dim_parse import DimSyntaxError, parse_dim
from irc.dims import Dim, dim_symbols, never_positive
from irc.types import TensorType

# ONNX TensorProto.DataType -> irc dtype (the ones irc has)
DTYPES = {1: "f32", 11: "f64", 10: "f16", 16: "bf16", 7: "i64", 6: "i32", 3: "i8", 9: "bool"}
ONNX_TYPE_NAMES = {0: "undefined", 1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
                   7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64",
                   14: "complex64", 15: "complex128", 16: "bfloat16"}


def need_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise IrcError("reading .onnx files needs the Python package 'onnx', which is not installed "
                       "(pip install 'irc[onnx]')") from None
    return onnx


def load_model(path: Path, with_data: bool) -> Any:
    """The ModelProto in ``path``; external weight files are opened only ``with_data``."""
    onnx = need_onnx()
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, TypeError) as e:
        raise IrcError(f"'{quote(str(path))}' is an ONNX model that cannot be read (cut short or corrupt): "
                       f"{_first_line(e)}") from None
    if not model.HasField("graph") or not model.graph.node:
        raise IrcError(f"'{quote(str(path))}' is an ONNX model with no graph nodes: nothing to import")
    if with_data:
        _check_external_files(path, model)
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(path.parent))
    return model


def _check_external_files(path: Path, model: Any) -> None:
    """Name the side file of weights that is missing, before onnx's loader reports it with a full path."""
    for t in model.graph.initializer:
        if t.data_location != 1:  # TensorProto.EXTERNAL
            continue
        where = next((e.value for e in t.external_data if e.key == "location"), "")
        if not (path.parent / where).is_file():
            raise IrcError(f"'{quote(str(path))}' keeps the weight '{quote(t.name)}' in the file '{quote(where)}' "
                           "next to it, which does not exist")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def node_loc(path: Path, index: int) -> Loc:
    """An ONNX node's place: the file, the node's position in the graph (1-based) as the line."""
    return Loc(str(path), index + 1, 1)


def input_type(path: Path, value: Any, index: int) -> TensorType:
    """The irc type of a graph input; a size with neither a value nor a name is an error."""
    where = Loc(str(path), index + 1, 1)
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise IrcError(f"graph input '{quote(value.name)}' is a {kind or 'value of no type'}, not a tensor; irc "
                       "reads tensor inputs only", where)
    tt = value.type.tensor_type
    dtype = DTYPES.get(tt.elem_type)
    if dtype is None or dtype in ("i8", "bool"):
        raise IrcError(f"graph input '{quote(value.name)}' has element type "
                       f"{ONNX_TYPE_NAMES.get(tt.elem_type, tt.elem_type)}, which irc's inputs do not take "
                       "(float, double, float16, bfloat16, int32, int64)", where)
    if not tt.HasField("shape"):
        raise IrcError(f"graph input '{quote(value.name)}' has no shape: irc needs its rank and sizes (symbolic "
                       "names are fine)", where)
    dims: list[Dim] = []
    for axis, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            if d.dim_value < 1:
                raise IrcError(f"graph input '{quote(value.name)}' has size {d.dim_value} on axis {axis}; "
                               "sizes must be positive", where)
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(_symbolic(value.name, axis, d.dim_param, where))
        else:
            raise IrcError(f"graph input '{quote(value.name)}' axis {axis} has neither a size nor a name: irc "
                           "cannot express an unnamed dynamic size; name it (a dim_param such as 'B') or fix it",
                           where)
    return TensorType(dtype, tuple(dims))


def _symbolic(name: str, axis: int, text: str, where: Loc) -> Dim:
    """A ``dim_param`` as an irc size: a name (``batch``) or a polynomial of names (``2*N``)."""
    try:
        dim = parse_dim(text)
    except DimSyntaxError:
        dim = None
    if dim is None or isinstance(dim, int) or never_positive(dim) or not dim_symbols(dim):
        raise IrcError(f"graph input '{quote(name)}' axis {axis} has the dynamic size '{quote(text)}', which irc "
                       "cannot express (a name such as 'batch', or a product or sum of names, is expected)", where)
    return dim


def tensor_dtype(elem_type: int, what: str, where: Loc | None) -> str:
    dtype = DTYPES.get(elem_type)
    if dtype is None:
        raise IrcError(f"{what} has element type {ONNX_TYPE_NAMES.get(elem_type, elem_type)}, which irc has no "
                       "dtype for", where)
    return dtype
