"""One benchmark peer in its own process: ``python -m benchmarks.peer OUT.json CASE PEER [...]``.

Numba's and PyTorch's thread pools slow each other down inside one process, so the runner
starts every peer here, alone, and reads its rows back from ``OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer")
    p.add_argument("out", type=Path)
    p.add_argument("case", choices=["norms", "attention", "models", "compile", "gemms"])
    p.add_argument("peer")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model")
    p.add_argument("--out-dir", type=Path)
    p.add_argument("--cache-dir", type=Path)
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")  # keep the runner's table readable
    if a.case == "norms":
        from benchmarks import suite_norms

        n, d = (8192, 1024) if a.quick else (65536, 1024)
        rows = suite_norms.PEERS[a.peer](n, d, a.repeats)
    elif a.case == "attention":
        from benchmarks import suite_attention

        rows = suite_attention.PEERS[a.peer](a.quick, a.repeats)
    elif a.case == "gemms":
        from benchmarks import suite_gemms

        rows = suite_gemms.PEERS[a.peer](a.quick, a.repeats)
    elif a.case == "models":
        from benchmarks import suite_models

        fn = {"irc": suite_models.peer_irc, "torch": suite_models.peer_torch, "ort": suite_models.peer_ort}[a.peer]
        rows = fn(a.model, a.quick, a.repeats, a.out_dir)
    else:
        from benchmarks import suite_models

        rows = suite_models.peer_compile(a.model, a.quick, a.cache_dir, a.peer)
    a.out.write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
