"""What only the CPU backend's kernels carry: their ``@njit`` decorator line."""

from __future__ import annotations

# Reassociation lets LLVM vectorise float reductions (sums, sums of squares, softmax
# denominators); without it each row's sum is one serial chain of dependent adds. No
# ``nnan``/``ninf``: masked scores are -inf on purpose and must stay so.
FASTMATH = '{"reassoc", "contract", "nsz", "arcp"}'


def jit(parallel: bool = True, fastmath: bool = False) -> str:
    """The decorator line of a kernel.

    ``error_model="numpy"`` makes float division by zero give inf/nan instead of raising
    (and lets divisions vectorise). Kernels are ``parallel`` by default: while a graph runs,
    Numba's pool owns the cores and BLAS is single-threaded (:mod:`..threads`), so ``prange``
    loops and the per-block BLAS calls inside them never compete with another pool.
    ``fastmath`` allows reassociation for kernels whose inner loops are reductions.
    """
    flags = ["cache=True"]
    if parallel:
        flags.append("parallel=True")
    if fastmath:
        flags.append(f"fastmath={FASTMATH}")
    return f'@njit({", ".join(flags)}, error_model="numpy")'
