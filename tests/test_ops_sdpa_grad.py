"""sdpa_grad, the flash-style backward of the fused attention core: its NumPy reference against
torch.autograd through F.scaled_dot_product_attention (causal, sliding window, GQA, one key/value batch for
every query batch, T ≠ S), in float64 and float32; and the flash-grad pass, which rewrites a differentiated
attention into sdpa + sdpa_grad, leaves every gradient of a training step as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from irc.backends.numpy_ref import run_graph
from irc.diagnostics import IrcError
from irc.ir_parser import parse_ir
from irc.passes import PASSES
from irc.passes.grad_flash import flash_attention_grad
from irc.pipeline import load_graph
from irc.runtime.init import init_weights
from irc.runtime.train import build_step

ORACLE_OPS = frozenset({"sdpa_grad"})
ROOT = Path(__file__).resolve().parents[1]

# (B, H, G, T, S, hd, hv, causal, window, key/value batch)
CASES = [
    (2, 4, 4, 6, 6, 8, 8, False, None, 2),
    (2, 4, 2, 9, 9, 8, 4, True, None, 2),
    (1, 6, 2, 12, 12, 4, 4, True, 3, 1),
    (3, 2, 1, 5, 7, 8, 8, False, None, 1),
    (2, 2, 2, 7, 4, 4, 4, True, None, 2),  # more queries than keys: top-left aligned
]


def sdpa_grad_graph(b: int, h: int, g: int, t: int, s: int, hd: int, hv: int, causal: bool, window, kb: int):
    attrs = f"scale=0.35, causal={'true' if causal else 'false'}" + (f", window={window}" if window else "")
    types = f"(f32[{b},{h},{t},{hd}], f32[{kb},{g},{s},{hd}], f32[{kb},{g},{s},{hv}])"
    ir = f"""graph @g() {{
  %q = input : f32[{b},{h},{t},{hd}]
  %k = input : f32[{kb},{g},{s},{hd}]
  %v = input : f32[{kb},{g},{s},{hv}]
  %dy = input : f32[{b},{h},{t},{hv}]
  %o = sdpa %q, %k, %v {{{attrs}}} : f32[{b},{h},{t},{hv}]
  %dq, %dk, %dv = sdpa_grad %q, %k, %v, %o, %dy {{{attrs}}} : {types}
  output dq = %dq
  output dk = %dk
  output dv = %dv
}}"""
    return PASSES["shape-infer"](parse_ir(ir))


def _torch_grads(x: dict[str, np.ndarray], case: tuple, dtype: torch.dtype) -> dict[str, np.ndarray]:
    b, h, g, t, s, hd, hv, causal, window, kb = case
    q, k, v = (torch.tensor(x[n], dtype=dtype, requires_grad=True) for n in "qkv")
    kk, vv = (z.expand(b, *z.shape[1:]).repeat_interleave(h // g, dim=1) for z in (k, v))
    mask = None
    if causal:
        i, j = torch.arange(t)[:, None], torch.arange(s)[None, :]
        mask = j <= i
        if window is not None:
            mask &= j > i - window
    out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=0.35)
    out.backward(torch.tensor(x["dy"], dtype=dtype))
    return {"dq": q.grad.numpy(), "dk": k.grad.numpy(), "dv": v.grad.numpy()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(str(v) for v in c))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sdpa_grad_equals_torch_autograd(case: tuple, dtype) -> None:
    graph = sdpa_grad_graph(*case)
    rng = np.random.default_rng(sum(case[:7]))
    x = {n.outputs[0]: rng.normal(size=tuple(n.types[0].shape)) for n in graph.inputs()}
    got = run_graph(graph, {}, x, dtype)
    want = _torch_grads(x, case, torch.float64 if dtype == np.float64 else torch.float32)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    for label in ("dq", "dk", "dv"):
        assert got[label].shape == want[label].shape
        assert np.abs(got[label] - want[label]).max() <= tol * np.abs(want[label]).max(), label


def test_sdpa_grad_checks_its_operands() -> None:
    ir = """graph @g() {
  %q = input : f32[1,2,4,8]
  %k = input : f32[1,2,4,8]
  %v = input : f32[1,2,4,8]
  %dy = input : f32[1,2,5,8]
  %dq, %dk, %dv = sdpa_grad %q, %k, %v, %dy, %dy {scale=0.5} : (f32[1,2,4,8], f32[1,2,4,8], f32[1,2,4,8])
  output dq = %dq
}"""
    with pytest.raises(IrcError, match="does not match sdpa's output"):
        PASSES["shape-infer"](parse_ir(ir))


def test_flash_grad_rewrites_a_training_step_without_changing_it() -> None:
    graph = load_graph(ROOT / "models" / "byte_lm.arch", {"B": 2, "T": 8})
    step = build_step(graph).step
    fused = flash_attention_grad(step)
    ops = [n.op for n in fused.nodes]
    # both layers' cores: no softmax, causal mask or their gradients left, no T×T value in the graph
    assert ops.count("sdpa") == 2 and ops.count("sdpa_grad") == 2
    assert not {"softmax", "softmax_grad", "causal_mask", "causal_mask_grad"} & set(ops)
    assert not any(t.shape[-2:] == (8, 8) for t in fused.value_types().values() if t.rank == 4)
    assert [label for label, _ in fused.outputs] == [label for label, _ in step.outputs]
    rng = np.random.default_rng(0)
    inputs = {"tokens": rng.integers(0, 256, (2, 8)), "targets": rng.integers(0, 256, (2, 8))}
    weights = init_weights(graph, seed=1)
    want, got = run_graph(step, weights, inputs, np.float64), run_graph(fused, weights, inputs, np.float64)
    scale = max(float(np.abs(a).max()) for a in want.values())
    for label in want:  # attn.bk's gradient is exactly 0 (softmax ignores a per-row shift): compare to the scale
        assert np.abs(got[label] - want[label]).max() <= 1e-12 * scale, label
    assert flash_attention_grad(fused) is fused  # nothing left to match


def test_flash_grad_leaves_a_biased_attention_alone(tmp_path: Path) -> None:
    path = tmp_path / "t5ish.arch"
    path.write_text("model m(B, T) {\n  input x: f32[B, T, 8]\n  input bias: f32[1, 2, T, T]\n"
                    "  input y: f32[B, T, 8]\n"
                    "  output loss = mse(attention(x, heads=2, attn_bias=bias), y)\n}\n")
    step = PASSES["grad"](load_graph(path, {"B": 2, "T": 4}))
    assert flash_attention_grad(step) is step  # the bias's gradient is a T×S tensor: not fused
