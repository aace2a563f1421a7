"""Tensor types: a dtype and a shape of dims (ints or symbols)."""

from __future__ import annotations

from dataclasses import dataclass

from irc.dims import Dim, dim_symbols, prod, subs

# dtype name -> bytes per element
DTYPE_BYTES: dict[str, float] = {
    "f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i8": 1, "int8": 1, "bool": 1,
}
FLOAT_DTYPES = ("f64", "f32", "f16", "bf16")
INT_DTYPES = ("i64", "i32", "i8")
INPUT_DTYPES = ("f32", "f16", "bf16", "f64", "i32", "i64")


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[Dim, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"

    @property
    def rank(self) -> int:
        return len(self.shape)

    def numel(self) -> Dim:
        return prod(self.shape)

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for d in self.shape:
            out |= dim_symbols(d)
        return out

    def with_shape(self, shape: tuple[Dim, ...] | list[Dim]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def subs(self, env: dict[str, Dim]) -> TensorType:
        return TensorType(self.dtype, tuple(subs(d, env) for d in self.shape))

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES
