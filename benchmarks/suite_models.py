"""Whole forward passes, irc (fused, Numba CPU backend) vs PyTorch eager and ONNX Runtime, and compile times.

Both peers build the same weights (irc's deterministic initialisation, seed 0) and inputs;
the PyTorch modules (torch_models.py) mirror the .arch files and load those weights. Each
peer saves its logits so the runner can check the two agree before it reports a speed.
Compile time is measured in fresh processes: cold (an empty cache directory: generate,
write and compile every kernel) and cached (the same directory again).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from benchmarks.timing import best_of

ROOT = Path(__file__).resolve().parents[1]
# name -> (model file, bindings, the torch mirror it shares): B = 1 and B = 8 rows, and a decode-shaped
# row (8 sequences of one token: a forward pass, no KV cache)
MODELS = {
    "gpt2_small": ("models/gpt2_small.arch", {"B": 1, "T": 256}, "gpt2_small"),
    "gpt2_small B=8": ("models/gpt2_small.arch", {"B": 8, "T": 256}, "gpt2_small"),
    "gpt2_small B=8 T=1": ("models/gpt2_small.arch", {"B": 8, "T": 1}, "gpt2_small"),
    "lstm_lm": ("models/lstm_lm.arch", {"B": 1, "T": 256}, "lstm_lm"),
    "lstm_lm B=8": ("models/lstm_lm.arch", {"B": 8, "T": 256}, "lstm_lm"),
    "resnet18": ("models/resnet18.arch", {"B": 1, "H": 224, "W": 224}, "resnet18"),
    "resnet18 B=8": ("models/resnet18.arch", {"B": 8, "H": 224, "W": 224}, "resnet18"),
}
# the CPU pipeline: fuse, then the convolution fusion only the CPU backend renders (--passes fuse,fold-bn)
IRC_PASSES = ["fuse", "fold-bn"]
QUICK = {"gpt2_small": {"layers": 2, "T": 64}, "lstm_lm": {"T": 64}, "resnet18": {"H": 112, "W": 112}}
# a peer keeps calling a fast model for at least this long (best_of caps it at 4 × repeats calls): five calls of
# a 9 ms pass are too few on a host whose speed drifts
MIN_SECONDS = 1.0


def file_stem(model: str) -> str:
    """A file name for a row name ("gpt2_small B=8" -> "gpt2_small_B8")."""
    return model.replace(" ", "_").replace("=", "")


def _binds(model: str, quick: bool) -> dict[str, int]:
    _, binds, base = MODELS[model]
    quick_binds = {k: v for k, v in QUICK[base].items() if not (k == "T" and binds.get("T") == 1)}
    return {**binds, **(quick_binds if quick else {})}


def _setup(model: str, quick: bool):
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights
    from irc.runtime.inputs import random_inputs

    graph = load_graph(ROOT / MODELS[model][0], _binds(model, quick))
    return graph, init_weights(graph, 0), random_inputs(graph, 0, {})


def _row(model: str, peer: str, seconds: float, note: str) -> dict:
    return {"case": "models", "item": model, "peer": peer, "seconds": seconds, "value": seconds * 1e3, "unit": "ms",
            "note": note}


def peer_irc(model: str, quick: bool, repeats: int, out_dir: Path) -> list[dict]:
    from irc.backends.cpu import compile_graph
    from irc.pipeline import run_passes

    graph, weights, inputs = _setup(model, quick)
    compiled = compile_graph(run_passes(graph, IRC_PASSES))
    out = compiled.run(weights, inputs)["logits"]
    np.save(out_dir / f"{file_stem(model)}-irc.npy", out)
    seconds = best_of(lambda: compiled.run(weights, inputs), repeats, MIN_SECONDS)
    rows = [_row(model, "irc", seconds, "fused graph (fuse, fold-bn), Numba CPU backend")]
    if MODELS[model][2] == "lstm_lm":
        rows += lstm_step(model, quick, repeats)
    return rows


def lstm_step(model: str, quick: bool, repeats: int) -> list[dict]:
    """The LSTM's time a step against reading W_hh once: one 650-unit layer alone (input product, gates and
    all, divided by T), and NumPy's 2-thread product of the step's h by W_hh, hot in the caches (a step can do
    no less than read W_hh once; what BLAS takes to do just that)."""
    import tempfile

    from irc.backends.cpu import compile_graph
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights
    from irc.runtime.inputs import random_inputs

    binds = _binds(model, quick)
    hidden = 650
    text = (f"model lstm_step(B, T) {{\n  input x: f32[B, T, {hidden}]\n  seq, h, c = lstm(x, {hidden})\n"
            f"  output y = seq\n}}\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lstm_step.arch"
        path.write_text(text)
        graph = load_graph(path, {"B": binds["B"], "T": binds["T"]})
    weights, inputs = init_weights(graph, 0), random_inputs(graph, 0, {})
    compiled = compile_graph(graph)
    layer = best_of(lambda: compiled.run(weights, inputs), repeats)
    h = np.random.default_rng(0).standard_normal((binds["B"], hidden), dtype=np.float32)
    whh = np.random.default_rng(1).standard_normal((4 * hidden, hidden), dtype=np.float32)
    out = np.empty((binds["B"], 4 * hidden), np.float32)
    bound = best_of(lambda: np.matmul(h, whh.T, out=out), repeats, min_seconds=0.2)
    note = f"{hidden} units, B = {binds['B']}, T = {binds['T']}"
    return [{"case": "lstm-step", "item": model, "peer": peer, "seconds": sec, "value": sec * 1e6, "unit": "us",
             "note": note} for peer, sec in (("irc", layer / binds["T"]), ("bound", bound))]


def _torch_net(model: str, quick: bool):
    """The torch mirror of ``model`` on irc's weights, and its one input as a tensor."""
    import torch

    from benchmarks.torch_models import build

    _, weights, inputs = _setup(model, quick)
    binds = _binds(model, quick)
    net = build(MODELS[model][2], weights, **({"layers": binds["layers"]} if "layers" in binds else {}))
    (arr,) = inputs.values()
    arg = torch.from_numpy(np.asarray(arr))
    return net, (arg if arg.is_floating_point() else arg.long())


def peer_torch(model: str, quick: bool, repeats: int, out_dir: Path) -> list[dict]:
    import torch

    torch.set_num_threads(2)
    net, arg = _torch_net(model, quick)
    with torch.inference_mode():
        np.save(out_dir / f"{file_stem(model)}-torch.npy", net(arg).numpy())
        seconds = best_of(lambda: net(arg), repeats, MIN_SECONDS)
    return [_row(model, "torch", seconds, "eager, same weights, 2 threads")]


def export_onnx(model: str, quick: bool, path: Path) -> dict[str, np.ndarray]:
    """Write the torch mirror of ``model`` to ``path`` with ``torch.onnx.export`` (not irc's own exporter, so
    the peer does not depend on irc); returns the feed for its one input."""
    import torch

    torch.set_num_threads(2)
    net, arg = _torch_net(model, quick)
    with torch.inference_mode():
        torch.onnx.export(net, (arg,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["logits"])
    return {"x": arg.numpy()}


def ort_session(path: Path, profile_prefix: str | None = None):
    """An ONNX Runtime CPU session as the benchmark's peer runs one: full graph optimisation, 2 intra-op
    threads (with its profiler on, writing under ``profile_prefix``, when given)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def peer_ort(model: str, quick: bool, repeats: int, out_dir: Path) -> list[dict]:
    """ONNX Runtime on the torch mirror exported by ``torch.onnx.export``."""
    import onnxruntime as ort

    path = out_dir / f"{file_stem(model)}.onnx"
    if path.exists():  # exported by an earlier round
        _, arg = _torch_net(model, quick)
        feed = {"x": arg.numpy()}
    else:
        feed = export_onnx(model, quick, path)
    session = ort_session(path)
    np.save(out_dir / f"{file_stem(model)}-ort.npy", session.run(None, feed)[0])
    seconds = best_of(lambda: session.run(None, feed), repeats, MIN_SECONDS)
    return [_row(model, "ort", seconds, f"ONNX Runtime {ort.__version__}, ORT_ENABLE_ALL, 2 intra-op threads")]


def peer_compile(model: str, quick: bool, cache_dir: Path, label: str) -> list[dict]:
    """Load, fuse and compile in this process with the cache in ``cache_dir``."""
    os.environ["IRC_CACHE_DIR"] = str(cache_dir)
    start = time.perf_counter()
    from irc.backends.cpu import compile_graph
    from irc.pipeline import load_graph, run_passes

    graph = run_passes(load_graph(ROOT / MODELS[model][0], _binds(model, quick)), IRC_PASSES)
    compiled = compile_graph(graph)
    seconds = time.perf_counter() - start
    note = f"{compiled.stats.kernels} kernels, {compiled.stats.compiled} compiled"
    return [{"case": "compile", "item": model, "peer": label, "seconds": seconds, "value": seconds, "unit": "s",
             "note": note}]
