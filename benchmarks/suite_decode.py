"""Decode throughput: irc generate's KV-cache runtime (the CPU backend and the numpy reference)
against Hugging Face ``generate`` on the same weights and threads, and against the bound of
reading the weights and the cache once per token.

    python -m benchmarks.suite_decode [--quick] [--threads N]   # this case alone: prints its table
    python -m benchmarks --only decode [--quick]                # the same, inside the suite (run.py)

Models: GPT-2 small (HF's GPT2Config defaults, 124M parameters) and a 2-layer Llama-style model
(d 512, 8 heads sharing 2 KV heads), random weights made with transformers, saved, imported with
``irc import`` and loaded through its weight map. Decode tokens/s at B = 1 and B = 8 (greedy, a
16-token prompt, N new tokens; prefill excluded on both sides: HF's time for N tokens minus its
time for 1). Every peer runs in a process of its own (Numba's and PyTorch's thread pools slow
each other in one) with the same thread count. The bound is DRAM read bandwidth (a 1 GiB gemv,
measured in its own process) over the bytes one decode step must read: all weights once (an
embedding only its B rows) plus every row's filled cache. A model whose weights fit in the L3
cache can beat this DRAM bound.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.machine import peer_env

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("irc-cpu", "irc-numpy", "hf")
PROMPT_LEN = 16
PEER_TIMEOUT_S = 600


def _models() -> dict:
    import transformers

    return {
        "gpt2_small": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config()),
        "llama_2layer": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=2, max_position_embeddings=2048)),
    }


def _prompts(batch: int) -> list[list[int]]:
    return [[int(t) for t in np.random.default_rng(i).integers(0, 1000, PROMPT_LEN)] for i in range(batch)]


def make_checkpoints(root: Path) -> None:
    """Each model's HF checkpoint (root/NAME) and its imported .arch (root/NAME.arch)."""
    import torch

    from irc.cli import main

    for name, make in _models().items():
        torch.manual_seed(0)
        make().eval().save_pretrained(root / name)
        assert main(["import", str(root / name), "-o", str(root / f"{name}.arch")]) == 0


def bandwidth() -> float:
    """DRAM read bandwidth in bytes/s as a decode step meets it: a BLAS matrix-vector product over a
    1 GiB float32 matrix (larger than any L3: a smaller probe, or a model whose weights fit in the
    cache, reads faster than this bound), best of three."""
    w = np.ones((16384, 16384), np.float32)
    x = np.ones(16384, np.float32)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        w @ x
        best = max(best, w.nbytes / (time.perf_counter() - t))
    return best


def _step_weight_bytes(dec) -> int:
    """Weights one step reads: every table a node multiplies by, but of an embedding only its B rows."""
    from irc.runtime.weights import node_weight_keys

    types = dec.step_graph.value_types()
    read: dict[str, int] = {}
    for node in dec.step_graph.nodes:
        for key in node_weight_keys(node, types).values():
            w = dec.weights[key]
            rows = w[0].nbytes * dec.batch if node.op == "embedding" else w.nbytes
            read[key] = max(read.get(key, 0), rows)
    return sum(read.values())


def peer_irc(root: Path, name: str, backend: str, batches: tuple[int, ...], new: int, repeats: int) -> list[dict]:
    from irc.pipeline import load_graph
    from irc.runtime.generate import Decoder, generate
    from irc.runtime.weights import load_for_model

    arch = root / f"{name}.arch"
    rows = []
    for b in batches:
        weights = load_for_model(root / name, load_graph(arch, {"B": b, "T": 1}), arch)
        best, dec = 0.0, None
        for _ in range(repeats):  # best of: the machine may be shared
            dec = Decoder(load_graph(arch, {"B": b}), weights, b, PROMPT_LEN + new, backend=backend)
            best = max(best, generate(dec, _prompts(b), new).decode_tps)  # compiling is outside the timing
        assert dec is not None
        cache = dec.cache_bytes * (PROMPT_LEN + new / 2) / dec.ctx  # the mean filled part over the steps
        rows.append({"case": "decode", "item": f"{name} B={b}", "peer": f"irc-{backend}", "value": best,
                     "step_bytes": _step_weight_bytes(dec) + cache, "batch": b})
    return rows


def _hf_seconds(hf, ids, new: int, repeats: int) -> float:
    """HF generate's best time for ``new`` greedy tokens (its prefill and new − 1 decode steps)."""
    import torch

    best = float("inf")
    with torch.no_grad():
        hf.generate(ids, do_sample=False, max_new_tokens=2, min_new_tokens=2, pad_token_id=0)  # warm up
        for _ in range(repeats):
            t = time.perf_counter()
            hf.generate(ids, do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
            best = min(best, time.perf_counter() - t)
    return best


def peer_hf(root: Path, name: str, batches: tuple[int, ...], new: int, repeats: int) -> list[dict]:
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(root / name).eval()
    rows = []
    for b in batches:
        ids = torch.tensor(_prompts(b))
        tps = b * (new - 1) / (_hf_seconds(hf, ids, new, repeats) - _hf_seconds(hf, ids, 1, repeats))
        rows.append({"case": "decode", "item": f"{name} B={b}", "peer": "hf", "value": tps, "batch": b})
    return rows


def _spawn(work: Path, threads: int, *args: str) -> list[dict]:
    """Run one peer of this case in a fresh process; its rows, or none (and a note) when it failed."""
    out = work / f"decode-{len(list(work.iterdir()))}.json"
    cmd = [sys.executable, "-m", "benchmarks.suite_decode", "--threads", str(threads), "--json", str(out), *args]
    env = peer_env(IRC_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    print(f"  decode: {' '.join(args)}", end="", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=PEER_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {PEER_TIMEOUT_S} s")
        return []
    print(f"  ({time.perf_counter() - start:.0f} s)")
    if proc.returncode != 0 or not out.exists():
        print("    failed: " + " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:]))
        return []
    return json.loads(out.read_text())


def run_case(work: Path, quick: bool, repeats: int, threads: int | None = None) -> list[dict]:
    """Every peer of the case, each in its own process, over checkpoints made once in ``work``."""
    threads = threads or os.cpu_count() or 1
    root = work / "decode-models"
    root.mkdir()
    common = ["--root", str(root), "--repeats", str(repeats)] + (["--quick"] if quick else [])
    if not _spawn(work, threads, "--peer", "make", *common):
        return []
    rows = _spawn(work, threads, "--peer", "bound", *common)
    for peer in PEERS:
        for name in _models():
            rows += _spawn(work, threads, "--peer", peer, "--model", name, *common)
    for r in rows:
        r["threads"] = threads
    return rows


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def render(rows: list[dict]) -> tuple[str, list[tuple[str, float | None, float, bool | None]]]:
    """The table (tokens/s of each peer, irc/HF, the bound) and the target: irc's CPU backend at least
    2× HF's decode throughput at B = 1."""
    from benchmarks.report import table

    def val(item: str, peer: str, key: str = "value") -> float | None:
        r = next((r for r in rows if r["item"] == item and r["peer"] == peer), None)
        return None if r is None or key not in r else float(r[key])

    bw = next((float(r["value"]) for r in rows if r["peer"] == "bound"), None)
    items = list(dict.fromkeys(r["item"] for r in rows if r["peer"] != "bound"))
    body, targets = [], []
    for item in items:
        cpu, ref, hf = val(item, "irc-cpu"), val(item, "irc-numpy"), val(item, "hf")
        step = val(item, "irc-cpu", "step_bytes") or val(item, "irc-numpy", "step_bytes")
        batch = int(item.rsplit("B=", 1)[1])
        bound = batch * bw / step if bw and step else None
        ratio = cpu / hf if cpu and hf else None
        body.append([item, _f(cpu), _f(ref), _f(hf), _f(ratio, "{:.2f}×"), _f(ref / hf if ref and hf else None,
                     "{:.2f}×"), _f(bound), _f(cpu / bound if cpu and bound else None, "{:.2f}")])
        if batch == 1:
            targets.append((f"decode {item}: irc cpu vs HF generate (tokens/s ratio)", ratio, 2.0, None))
    threads = next((r.get("threads") for r in rows), None)
    text = table(["model", "irc cpu tok/s", "irc numpy tok/s", "HF generate tok/s", "cpu/HF", "numpy/HF",
                  "bound tok/s", "cpu/bound"], body)
    text += (f"\n\nDecode only (16-token prompts; HF: its time for N tokens minus its time for 1), best of "
             f"several generations, {threads} thread(s) for every peer. Memory bandwidth (1 GiB gemv): "
             f"{_f(bw and bw / 1e9)} GB/s; the bound is B × bandwidth / (weights read per step + the mean "
             f"filled cache).")
    return text, targets


def _peer_main(a: argparse.Namespace) -> int:
    import warnings

    warnings.simplefilter("ignore")
    new, batches = (8, (1, 8)) if a.quick else (32, (1, 8))
    if a.peer == "make":
        make_checkpoints(a.root)
        rows = [{"case": "decode", "item": "checkpoints", "peer": "make", "value": 0.0}]
    elif a.peer == "bound":
        rows = [{"case": "decode", "item": "bandwidth", "peer": "bound", "value": bandwidth()}]
    elif a.peer == "hf":
        import torch

        torch.set_num_threads(a.threads)
        rows = peer_hf(a.root, a.model, batches, new, a.repeats)
    else:
        rows = peer_irc(a.root, a.model, a.peer.removeprefix("irc-"), batches, new, a.repeats)
    a.json.write_text(json.dumps(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite_decode", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 new tokens instead of 32")
    p.add_argument("--repeats", type=int, default=2, help="generations per peer and batch (the best counts)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of every peer")
    p.add_argument("--peer", choices=("make", "bound", *PEERS), help=argparse.SUPPRESS)  # one peer, in-process
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.peer is not None:
        return _peer_main(a)
    with tempfile.TemporaryDirectory(prefix="irc-decode-") as tmp:
        rows = run_case(Path(tmp), a.quick, a.repeats, a.threads)
    text, targets = render(rows)
    print("\n" + text)
    for what, got, want, _ in targets:
        print(f"{what}: {_f(got, '{:.2f}')} (target {want:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
