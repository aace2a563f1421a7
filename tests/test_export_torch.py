"""irc compile --emit torch: a dependency-free nn.Module whose state_dict keys are irc's weight keys and
whose forward matches irc's NumPy reference (float64) to 1e-5, for every zoo model and every op; it
traces under torch.compile and torch.export, exports through torch.onnx to the same numbers in ONNX
Runtime, and weights it trains load back with ``irc run --weights``.

The cases (and their bindings) are tests/test_export_onnx.py's; PyTorch and ONNX Runtime are the oracles.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_export_onnx import CASES, MODEL_FILES, assert_close, case, ort_outputs

from irc.ops import OPS


def load_module(source: str, directory: Path, name: str) -> Any:
    """Import an emitted file as a module of its own."""
    path = directory / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"irc_emitted_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile and dataclasses look modules up by name
    spec.loader.exec_module(module)
    return module


@functools.cache
def _scratch() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="irc-emit-torch-"))


def built(name: str, passes: tuple[str, ...] = ()) -> tuple[torch.nn.Module, Any]:
    """The emitted Model of a case with the case's weights loaded (strict: the keys must be exactly irc's)."""
    from irc.backends.torch import emit_source

    graph, weights, _, _ = case(name, passes)
    module = load_module(emit_source(graph), _scratch(), name + "_".join(passes))
    model = module.Model()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    return model.eval(), module


def torch_outputs(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(*[torch.from_numpy(inputs[n]) for n in model.INPUTS])
    out = out if isinstance(out, tuple) else (out,)
    return {label: o.numpy() for label, o in zip(model.OUTPUTS, out)}


@pytest.mark.parametrize("name", CASES)
def test_module_matches_the_reference(name: str) -> None:
    model, _ = built(name)
    graph, weights, inputs, ref = case(name)
    assert set(model.state_dict()) == set(weights)  # no key more, none less
    assert_close(torch_outputs(model, inputs), ref, name)


@pytest.mark.parametrize("name, passes", [("gpt2_small", ("fuse",)), ("llama2_7b", ("fuse",)),
                                          ("mistral_7b", ("decompose",)), ("recurrent", ("decompose",)),
                                          ("attention_options", ("fuse",)), ("norms_dense", ("decompose",))])
def test_lowered_and_fused_graphs_emit(name: str, passes: tuple[str, ...]) -> None:
    model, _ = built(name, passes)
    _, _, inputs, ref = case(name, passes)
    assert_close(torch_outputs(model, inputs), ref, f"{name} after {passes}")


def test_every_op_emits_or_says_why_not() -> None:
    """A new op in irc/ops/ fails here until it has a renderer (backends/torch/ops_*.py) or a reason."""
    from irc.backends.torch import NO_EMIT, RENDERERS

    missing = sorted(op for op in OPS if op not in RENDERERS and op not in NO_EMIT)
    assert not missing, f"ops with neither a torch renderer nor a NO_EMIT reason: {missing}"


def test_every_activation_choice_emits() -> None:
    from irc.backends.torch.ops_basic import ACTS

    choices = {c for op in OPS.values() for a in op.attrs if a.name == "act" for c in a.choices}
    assert choices and choices <= set(ACTS)


def test_source_is_deterministic_and_needs_only_torch() -> None:
    from irc.backends.torch import emit_source

    graph = case("t5_small")[0]
    text = emit_source(graph)
    assert text == emit_source(graph)
    imports = {line.split()[1] for line in text.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "math", "torch", "torch.nn.functional"}


def test_torch_compile_and_torch_export() -> None:
    """Dynamo traces the whole forward in one graph (fullgraph; the aot_eager backend runs dynamo and AOT
    autograd without a C++ toolchain), and torch.export exports it."""
    for name in ("gpt2_small", "resnet18"):
        model, _ = built(name)
        _, _, inputs, ref = case(name)
        args = tuple(torch.from_numpy(inputs[n]) for n in model.INPUTS)
        if name == "gpt2_small":
            compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
            with torch.no_grad():
                out = compiled(*args)
            assert_close({"logits": out.numpy()}, ref, f"{name} compiled")
        exported = torch.export.export(model, args)
        out = exported.module()(*args)
        out = out if isinstance(out, tuple) else (out,)
        assert_close({k: o.detach().numpy() for k, o in zip(model.OUTPUTS, out)}, ref, f"{name} exported")


@pytest.mark.parametrize("name", ["gpt2_small", "resnet18", "lstm_lm"])
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # shape checks the trace fixes, on purpose
def test_round_trip_through_torch_onnx_export(name: str, tmp_path: Path) -> None:
    """irc -> torch module -> torch.onnx.export -> ONNX Runtime agrees with irc's reference."""
    import onnx

    model, _ = built(name)
    _, _, inputs, ref = case(name)
    args = tuple(torch.from_numpy(inputs[n]) for n in model.INPUTS)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, args, str(path), input_names=list(model.INPUTS), output_names=list(model.OUTPUTS),
                      dynamo=False, opset_version=17)
    assert_close(ort_outputs(onnx.load(str(path)), inputs), ref, f"{name} via torch.onnx")


def test_trained_weights_load_back_into_irc_run(tmp_path: Path, irc_cli) -> None:
    """A training step in PyTorch, its state_dict saved as .npz, and `irc run --weights` computes what torch does."""
    model, _ = built("lstm_lm")
    _, _, inputs, _ = case("lstm_lm")
    model.train()
    tokens = torch.from_numpy(inputs["tokens"])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(tokens).square().mean()
    loss.backward()
    opt.step()
    model.eval()
    np.savez(tmp_path / "w.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    np.save(tmp_path / "tokens.npy", inputs["tokens"])
    defines = [f"-D{k}={v}" for k, v in {"B": 2, "T": 5, "vocab": 300, "hidden": 32}.items()]
    result = irc_cli(["run", str(MODEL_FILES["lstm_lm"]), *defines, "--weights", str(tmp_path / "w.npz"),
                      "--input", f"tokens={tmp_path / 'tokens.npy'}", "-o", str(tmp_path / "out.npz")])
    assert result.rc == 0, result.err
    with torch.no_grad():
        want = model(tokens).numpy()
    from irc.runtime.compare import rel_error

    got = np.load(tmp_path / "out.npz")["logits"]
    assert rel_error(got, want) < 1e-5


def test_cli_writes_the_module(tmp_path: Path, irc_cli) -> None:
    out = tmp_path / "model.py"
    result = irc_cli(["compile", str(MODEL_FILES["mlp"]), "--emit", "torch", "-o", str(out)])
    assert result.rc == 0, result.err
    module = load_module(out.read_text(encoding="utf-8"), tmp_path, "mlp_cli")
    keys = set(module.Model().state_dict())
    from irc.pipeline import load_graph
    from irc.runtime.weights import expected_weights

    assert keys == set(expected_weights(load_graph(MODEL_FILES["mlp"], {"B": 1})))
