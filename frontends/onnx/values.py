"""What an ONNX value is while the importer walks the graph: an irc tensor, or a constant.

A constant is either a weight (an initializer, with the transposes applied to it so far, read only when
its numbers are needed) or a small array known at import time — shape arithmetic included, as a NumPy
object array whose entries are irc sizes (``B``, ``B*12``), so ``Shape → Gather → Concat → Reshape``
folds to a reshape with symbolic sizes instead of becoming ops irc cannot run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from irc.types import TensorType


@dataclass
class Act:
    """A tensor computed by an irc node: the value name and its type."""

    value: str
    type: TensorType


@dataclass
class Const:
    """A constant: ``load()`` gives its array. ``weight`` names the initializer it comes from (None for a
    folded or ``Constant``-node value); ``perm`` is the transpose applied to that initializer so far."""

    shape: tuple[int, ...]
    dtype: str
    loader: Callable[[], np.ndarray]
    weight: str | None = None
    perm: tuple[int, ...] | None = None
    _array: np.ndarray | None = None

    def load(self) -> np.ndarray:
        if self._array is None:
            self._array = np.asarray(self.loader())
        return self._array

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def symbolic(self) -> bool:
        return self.weight is None and self.load().dtype == object

    def describe(self) -> str:
        if self.weight is not None and self.dtype.startswith(("f", "bf")):
            return f"the weight '{self.weight}' [{', '.join(map(str, self.shape))}]"
        if self.weight is not None:
            return f"the initializer '{self.weight}' {self.dtype}[{','.join(map(str, self.shape))}]"
        return f"a constant {self.dtype}[{','.join(map(str, self.shape))}]"


def known(array: np.ndarray, dtype: str) -> Const:
    """A constant whose array is already computed."""
    array = np.asarray(array)
    return Const(tuple(int(d) for d in array.shape), dtype, lambda: array, _array=array)


Value = Act | Const
