#!/usr/bin/env python3
"""The CUDA backend on a GPU: every kernel checked at full size against torch, and timed
against torch on the same card in the same run. Results go to benchmarks/RESULTS-gpu.md.

Run from the repository root on a machine with an NVIDIA GPU, torch (CUDA), numba-cuda, and
lark and transformers for the zoo case (irc need not be installed; the kernel cases build their
graphs from IR text, the zoo reads .arch files and Hugging Face checkpoints):

    python3 benchmarks/gpu.py                 # everything: about 7.5 minutes on an H200
    python3 benchmarks/gpu.py --quick         # no variant sweeps, no CPU-backend run
    python3 benchmarks/gpu.py --only norm,attention
    NUMBA_ENABLE_CUDASIM=1 python3 benchmarks/gpu.py --dry-run   # tiny sizes, simulator, CPU torch

Checks: fresh random inputs for every case, outputs poisoned with NaN before every checked
run, ‖out − ref‖/‖ref‖ < 1e-4 against torch in float64 (fp16: 1e-2); the check is repeated
after the timing runs (a result that moves between runs is a race). Timing: CUDA events
around a batch of launches queued behind a spin kernel (so Python's launch overhead is not
counted as kernel time), the median of several batches. Every case fails soft: an error is
a FAIL row with its message and the run goes on. With $OUT set, RESULTS-gpu.md, gpu.json
and gpu.log are copied there as well (the device machine keeps nothing).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_suite/, beside this file

from gpu_suite.main import main  # noqa: E402  (imports this checkout's irc, numba.cuda and torch)

if __name__ == "__main__":
    sys.exit(main())
