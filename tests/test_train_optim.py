"""irc/runtime/optim.py against PyTorch: each optimizer's 20 updates against torch.optim on the same
weights and gradients, the schedules against Hugging Face's LambdaLR schedules and torch's
CosineAnnealingLR, and clipping against torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from irc.runtime.optim import OptimConfig, apply_update, clip_grad_norm, init_state, lr_factor

SHAPES = {"fc.weight": (7, 5), "fc.bias": (7,), "conv.weight": (4, 3, 3, 3)}
STEPS = 20

CASES = [
    ("sgd", {}, lambda p, lr: torch.optim.SGD(p, lr=lr)),
    ("sgd", {"weight_decay": 0.1}, lambda p, lr: torch.optim.SGD(p, lr=lr, weight_decay=0.1)),
    ("momentum", {"momentum": 0.9}, lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9)),
    ("momentum", {"momentum": 0.8, "weight_decay": 0.05},
     lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.8, weight_decay=0.05)),
    ("adam", {}, lambda p, lr: torch.optim.Adam(p, lr=lr)),
    ("adam", {"weight_decay": 0.1, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6},
     lambda p, lr: torch.optim.Adam(p, lr=lr, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", {"weight_decay": 0.01}, lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.01)),
    ("adamw", {"weight_decay": 0.3, "beta2": 0.95}, lambda p, lr: torch.optim.AdamW(p, lr=lr, betas=(0.9, 0.95),
                                                                                     weight_decay=0.3)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind, options, make", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_updates_equal_torch_optim(kind: str, options: dict, make, dtype) -> None:
    rng = np.random.default_rng(3)
    params = {k: rng.normal(0, 1, s).astype(dtype) for k, s in SHAPES.items()}
    leaves = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    lr = 0.05
    opt = make(list(leaves.values()), lr)
    cfg = OptimConfig(kind, **options)
    state = init_state(cfg, params)
    for step in range(1, STEPS + 1):
        grads = {k: rng.normal(0, 1, s).astype(dtype) * (1 + step % 3) for k, s in SHAPES.items()}
        for k, t in leaves.items():
            t.grad = torch.tensor(grads[k].copy())
        opt.step()
        apply_update(cfg, params, grads, state, lr, step)
        for k, t in leaves.items():
            want = t.detach().numpy()
            assert params[k].dtype == dtype
            assert np.abs(params[k] - want).max() <= 1e-6 * max(1.0, np.abs(want).max()), (kind, step, k)
    for k, t in leaves.items():  # the optimizer's own state too, under torch's names
        for slot, values in state.items():
            want = opt.state[t][slot].numpy()
            assert np.abs(values[k] - want).max() <= 1e-6 * max(1.0, np.abs(want).max()), (slot, k)


def test_an_update_moves_the_weights() -> None:
    """The comparison above could pass with both sides doing nothing: it does not."""
    params = {"w": np.ones(3, np.float32)}
    cfg = OptimConfig("adam")
    apply_update(cfg, params, {"w": np.array([1.0, -1.0, 0.0], np.float32)}, init_state(cfg, params), 0.1, 1)
    assert np.allclose(params["w"], [0.9, 1.1, 1.0])


def _torch_lrs(sched: torch.optim.lr_scheduler.LRScheduler, opt: torch.optim.Optimizer, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("warmup, total", [(0, 50), (10, 50), (7, 23), (1, 5)])
def test_schedules_equal_hugging_face_lambdalr(warmup: int, total: int) -> None:
    base = 0.01
    for schedule, make in (("cosine", get_cosine_schedule_with_warmup),
                           ("constant", lambda o, w, t: get_constant_schedule_with_warmup(o, w))):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
        want = _torch_lrs(make(opt, warmup, total), opt, total)
        got = [base * lr_factor(s, total, warmup, schedule) for s in range(total)]
        assert np.allclose(got, want, rtol=1e-12, atol=1e-15), schedule


def test_cosine_without_warmup_is_cosine_annealing() -> None:
    base, total = 0.1, 40
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    want = _torch_lrs(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total), opt, total)
    got = [base * lr_factor(s, total, 0, "cosine") for s in range(total)]
    assert np.allclose(got, want, rtol=1e-10, atol=1e-15)
    assert got[0] == base and got[total // 2] == pytest.approx(base / 2)


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e3])
def test_clip_equals_clip_grad_norm(max_norm: float) -> None:
    rng = np.random.default_rng(5)
    grads = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in SHAPES.items()}
    leaves = []
    for g in grads.values():
        t = torch.zeros(g.shape, requires_grad=True)
        t.grad = torch.tensor(g.copy())
        leaves.append(t)
    want_norm = float(torch.nn.utils.clip_grad_norm_(leaves, max_norm))
    norm = clip_grad_norm(grads, max_norm)
    assert math.isclose(norm, want_norm, rel_tol=1e-6)
    for g, t in zip(grads.values(), leaves):
        assert np.abs(g - t.grad.numpy()).max() <= 1e-6 * np.abs(t.grad.numpy()).max()
    total = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    assert total == pytest.approx(min(norm, max_norm), rel=1e-5)  # clipped to the norm, or left alone
