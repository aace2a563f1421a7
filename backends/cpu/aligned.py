"""float32 buffers that start on a 64-byte boundary: a cache line, and one AVX-512 vector.

The register blocks (:mod:`.render.sdpa_simd`) load and store whole vectors at element offsets the
kernels choose. When an array's first element is not on a cache-line boundary, every one of those
vectors straddles two lines and costs two accesses. NumPy and Numba do not promise more than 16 or
32 bytes: a large ``np.empty`` is a fresh mapping whose data start 16 bytes into a page, and the
alignment Numba's allocator gives moved from run to run. Measured here: the score block's 2**x pass at
8.2 cycles a vector against 6.8 on a 64-byte boundary, and whole attention calls 1.05× apart depending
on where the allocator put their scratch.

So the buffers such blocks stream through are allocated 16 floats long and viewed from the first
element on a boundary:
- ``empty64`` (driver helper): the driver's float32 intermediates and the convolution work buffer;
- ``empty64_device`` (Numba device function): a kernel's own scratch (attention's score and
  accumulator tiles, a panel product's block);
- ``aligned64``: a derived weight (packed panels, strips) moved onto a boundary when it is not on one.
"""

from __future__ import annotations

import math

import numpy as np

ALIGN = 64  # bytes: one cache line, one 16-float vector
SLACK = ALIGN // 4  # float32 elements allocated beyond the request, to slide the view by

# driver helper: the generated module's own copy (the module imports nothing from irc at run time)
EMPTY64 = '''\
def empty64(shape):
    """A float32 np.empty(shape) whose first element is on a 64-byte boundary (backends/cpu/aligned.py)."""
    n = math.prod(shape)
    raw = np.empty(n + 16, np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + n].reshape(shape)
'''

EMPTY64_DEVICE = '''\
@njit(cache=True, error_model="numpy")
def empty64_device(n):
    """A float32 np.empty(n) whose first element is on a 64-byte boundary (backends/cpu/aligned.py)."""
    raw = np.empty(n + 16, np.float32)
    skip = (64 - raw.ctypes.data % 64) % 64 // 4
    return raw[skip:skip + n]
'''


def aligned64(a: np.ndarray) -> np.ndarray:
    """``a`` itself when its data start on a 64-byte boundary (or it is not float32), else a copy that does."""
    if a.dtype != np.float32 or a.ctypes.data % ALIGN == 0:
        return a
    n = math.prod(a.shape)
    raw = np.empty(n + SLACK, np.float32)
    skip = (-raw.ctypes.data % ALIGN) // 4
    out = raw[skip:skip + n].reshape(a.shape)
    out[...] = a
    return out
