"""The emitted torch module trains under DistributedDataParallel: 2 local processes (gloo over
loopback), each on half the batch, end with exactly the gradients one process gets on the whole
batch (DDP averages them; each rank's loss is the mean over its half). A tiny GPT-2-shaped model
(attention, layernorm, FFN, tied embedding), so the test takes a few seconds."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import torch
from test_export_onnx import MODEL_FILES

BINDINGS = {"B": 4, "T": 6, "layers": 2, "d": 32, "heads": 2, "vocab": 50, "ctx": 16}


def _loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1).long())


def _load(folder: Path) -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("irc_emitted_ddp", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Model()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(folder / "w.npz").items()})
    return model


def _worker(rank: int, folder: str, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        ddp = torch.nn.parallel.DistributedDataParallel(_load(Path(folder)))
        tokens = torch.from_numpy(np.load(Path(folder) / "tokens.npy"))
        half = tokens.shape[0] // 2
        _loss(ddp, tokens[rank * half:(rank + 1) * half]).backward()
        grads = {k: p.grad.numpy() for k, p in ddp.module.named_parameters()}
        np.savez(Path(folder) / f"grads{rank}.npz", **grads)
    finally:
        dist.destroy_process_group()
    # the work is saved: skip the interpreter's teardown, where a native thread pool the test modules
    # loaded (ONNX Runtime's, Numba's) can abort the child with "terminate called without an active exception"
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_gradients_equal_single_process(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from irc.backends.torch import emit_source
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights
    from irc.runtime.inputs import random_inputs

    graph = load_graph(MODEL_FILES["gpt2_small"], BINDINGS)
    (tmp_path / "model.py").write_text(emit_source(graph), encoding="utf-8")
    np.savez(tmp_path / "w.npz", **init_weights(graph, seed=1))
    np.save(tmp_path / "tokens.npy", random_inputs(graph, seed=2)["tokens"])

    model = _load(tmp_path)
    _loss(model, torch.from_numpy(np.load(tmp_path / "tokens.npy"))).backward()
    want = {k: p.grad.numpy() for k, p in model.named_parameters()}

    mp.spawn(_worker, args=(str(tmp_path), _free_port()), nprocs=2, join=True)
    for rank in range(2):
        got = np.load(tmp_path / f"grads{rank}.npz")
        assert set(got) == set(want)
        for key, g in want.items():
            assert np.abs(g).max() > 0, key  # every weight takes part in the loss
            np.testing.assert_allclose(got[key], g, rtol=1e-4, atol=1e-6, err_msg=f"rank {rank} {key}")
