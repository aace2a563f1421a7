"""``irc run``: bindings, random and given inputs, output statistics, --check, --profile,
the memory guard, -o, and its errors. Expected statistics are recomputed with NumPy from the
saved outputs; the outputs themselves are checked against an independent NumPy forward pass.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from irc import backends
from irc.diagnostics import IrcError
from irc.runtime import cli as run_cli
from irc.runtime.graphs import graph_from_source
from irc.runtime.init import init_weights
from irc.runtime.inputs import random_inputs
from irc.runtime.weights import save_weights

TINY = """model tiny(B, T) {
  const vocab = 7, d = 8
  input tokens: i32[B, T]
  input feats: f32[B, T, 3]
  emb = embedding(vocab, d)
  x = emb(tokens) + linear(feats, d)
  output logits = unembed(x, tied=emb)
  output pooled = relu(x)
}
"""


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "tiny.arch"
    path.write_text(TINY)
    return path


def numpy_forward(w: dict[str, np.ndarray], tokens: np.ndarray, feats: np.ndarray) -> dict[str, np.ndarray]:
    """The tiny model written out by hand in float64."""
    table = w["emb.weight"].astype(np.float64)
    x = table[tokens] + feats @ w["linear.weight"].T.astype(np.float64) + w["linear.bias"]
    return {"logits": x @ table.T, "pooled": np.maximum(x, 0)}


def test_run_prints_shapes_and_statistics(model, tmp_path, irc_cli):
    out = tmp_path / "out.npz"
    r = irc_cli(["run", str(model), "-D", "B=2", "-D", "T=5", "--seed", "3", "-o", str(out)])
    assert r.rc == 0, r.err
    saved = np.load(out)
    assert sorted(saved.files) == ["logits", "pooled"]
    for label, shape in (("logits", "f32[2,5,7]"), ("pooled", "f32[2,5,8]")):
        a = saved[label].astype(np.float64)
        line = next(ln for ln in r.out.splitlines() if ln.strip().startswith(label))
        assert shape in line
        stats = dict(re.findall(r"(mean|std|min|max)=(\S+)", line))
        for name, value in (("mean", a.mean()), ("std", a.std()), ("min", a.min()), ("max", a.max())):
            assert float(stats[name]) == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_outputs_are_the_model_on_seeded_weights_and_inputs(model, tmp_path, irc_cli):
    out = tmp_path / "out.npz"
    assert irc_cli(["run", str(model), "-D", "B=2", "-D", "T=5", "--seed", "3", "-o", str(out)]).rc == 0
    graph = graph_from_source(TINY, {"B": 2, "T": 5})
    inputs = random_inputs(graph, 3)
    want = numpy_forward(init_weights(graph, 3), inputs["tokens"], inputs["feats"])
    saved = np.load(out)
    for label in want:
        np.testing.assert_allclose(saved[label], want[label], rtol=1e-5, atol=1e-6)


def test_output_file_is_written_whole_and_leaves_no_temporary_files(model, tmp_path, irc_cli):
    out = tmp_path / "deeper" / "out.npz"
    missing = irc_cli(["run", str(model), "-D", "T=2", "-o", str(out)])  # a missing folder is refused, not made
    assert missing.rc == 2 and "does not exist" in missing.err and not out.parent.exists()
    out.parent.mkdir()
    assert irc_cli(["run", str(model), "-D", "T=2", "-o", str(out)]).rc == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.npz"]
    assert sorted(np.load(out).files) == ["logits", "pooled"]


def test_bad_output_path_is_refused_before_the_run(model, tmp_path, irc_cli):
    (tmp_path / "taken.npz").mkdir()  # a folder where the file should go
    r = irc_cli(["run", str(model), "-D", "T=2", "-o", str(tmp_path / "taken.npz")])
    assert (r.rc, r.out) == (2, "")  # nothing ran: no statistics printed
    assert r.err == f"irc: error: cannot write '{tmp_path / 'taken.npz'}': it is a folder\n"
    assert list((tmp_path / "taken.npz").iterdir()) == []


def test_same_seed_same_output(model, irc_cli):
    a = irc_cli(["run", str(model), "-D", "T=4", "--seed", "5"])
    b = irc_cli(["run", str(model), "-D", "T=4", "--seed", "5"])
    c = irc_cli(["run", str(model), "-D", "T=4", "--seed", "6"])
    strip = lambda s: [ln for ln in s.splitlines() if not ln.startswith("run:")]
    assert strip(a.out) == strip(b.out) != strip(c.out)


def test_random_token_ids_stay_in_the_vocabulary():
    graph = graph_from_source(TINY, {"B": 64, "T": 64})
    ids = random_inputs(graph, 0)["tokens"]
    assert ids.dtype == np.int32 and ids.min() == 0 and ids.max() == 6  # [0, vocab) and every id drawn


def test_given_inputs_and_weights(model, tmp_path, irc_cli):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 7, (1, 3)).astype(np.int64)
    feats = rng.standard_normal((1, 3, 3)).astype(np.float32)
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "feats.npy", feats)
    graph = graph_from_source(TINY, {"B": 1, "T": 3})
    w = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in init_weights(graph, 0).items()}
    save_weights(tmp_path / "w.safetensors", w)
    r = irc_cli(["run", str(model), "-D", "T=3", "--weights", str(tmp_path / "w.safetensors"),
                 "--input", f"tokens={tmp_path / 'tokens.npy'}", "--input", f"feats={tmp_path / 'feats.npy'}",
                 "-o", str(tmp_path / "out.npz")])
    assert r.rc == 0, r.err
    assert "random inputs" not in r.out
    saved = np.load(tmp_path / "out.npz")
    want = numpy_forward(w, tokens, feats)
    np.testing.assert_allclose(saved["logits"], want["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make,message", [
    (lambda d: np.save(d / "x.npy", np.zeros((1, 4), np.int32)),
     r"holds shape \[1, 4\], but the model expects \[1, 3\]"),
    (lambda d: np.save(d / "x.npy", np.full((1, 3), 7, np.int32)), r"token id 7 .* outside the vocabulary \[0, 7\)"),
    (lambda d: np.save(d / "x.npy", np.zeros((1, 3), np.float32)), r"expects integer ids"),
    (lambda d: np.save(d / "x.npy", np.array([None, 1], dtype=object)), r"never unpickles"),
    (lambda d: (d / "x.npy").write_text("hello"), r"not a readable \.npy"),
])
def test_bad_input_files(model, tmp_path, irc_cli, make, message):
    make(tmp_path)
    r = irc_cli(["run", str(model), "-D", "T=3", "--input", f"tokens={tmp_path / 'x.npy'}"])
    assert r.rc == 1 and "Traceback" not in r.err
    assert re.search(message, r.err), r.err


def test_unknown_input_name_and_bad_flag(model, tmp_path, irc_cli):
    np.save(tmp_path / "x.npy", np.zeros(3))
    r = irc_cli(["run", str(model), "-D", "T=3", "--input", f"words={tmp_path / 'x.npy'}"])
    assert r.rc == 1 and "has no input 'words' (inputs: tokens, feats)" in r.err
    assert irc_cli(["run", str(model), "-D", "T=3", "--input", "tokens"]).rc == 2


def test_unbound_sizes(model, tmp_path, irc_cli):
    """run binds what analyze binds: batch 1, sequence 1,024 (no position table), said in a note."""
    r = irc_cli(["run", str(model)])
    assert r.rc == 0, r.err
    assert r.err == ("irc: note: unbound sizes take their defaults: B=1 (default batch), T=1,024 (default "
                     "sequence); bind them with -D\n")
    assert "f32[1,1024,7]" in r.out
    r = irc_cli(["run", str(model), "-D", "T=2"])
    assert r.rc == 0 and "B=1 (default batch); bind it with -D" in r.err
    assert "f32[1,2,7]" in r.out
    other = tmp_path / "other.arch"  # a size that is neither batch, sequence nor image side: no default
    other.write_text("model o(B, K) {\n  input x: f32[B, 4, K]\n  output y = relu(x)\n}\n")
    r = irc_cli(["run", str(other)])
    assert r.rc == 1 and "symbol 'K'" in r.err and "bind it with -D K=VALUE" in r.err


def test_check_passes_and_fails_on_tolerance(model, irc_cli):
    r = irc_cli(["run", str(model), "-D", "T=4", "--check"])
    assert r.rc == 0, r.out + r.err
    errs = [float(e) for e in re.findall(r"(?:logits|pooled): (\S+)  ok", r.out)]
    assert len(errs) == 2 and all(0 <= e < 1e-5 for e in errs)  # float32 against float64
    r = irc_cli(["run", str(model), "-D", "T=4", "--check", "--tolerance", "1e-30"])
    assert r.rc == 1 and "FAIL" in r.out


def test_check_refuses_nan_and_inf(tmp_path, irc_cli):
    path = tmp_path / "bad.arch"
    path.write_text("model bad() {\n  input x: f32[2, 3]\n  output y = div(x, scalar=0)\n"
                    "  output z = sub(y, y)\n}\n")
    r = irc_cli(["run", str(path), "--check"])
    assert r.rc == 1
    assert re.search(r"y: output has \d+ Inf; reference has \d+ Inf  FAIL", r.out)
    assert re.search(r"z: output has 6 NaN; reference has 6 NaN  FAIL", r.out)
    assert "no finite values (6 NaN)" in r.out


def test_profile(model, irc_cli):
    r = irc_cli(["run", str(model), "-D", "T=4", "--profile"])
    assert r.rc == 0
    rows = re.findall(r"^\s+(\w+)\s+([\d.]+)\s+([\d.]+)%$", r.out, re.M)
    ops = {op for op, _, _ in rows}
    assert {"embedding", "linear", "add", "unembed", "relu", "total"} <= ops
    assert sum(float(s) for op, _, s in rows if op != "total") == pytest.approx(100, abs=0.5)


def test_memory_guard(model, irc_cli):
    r = irc_cli(["run", str(model), "-D", "T=4", "--max-memory", "100"])
    assert r.rc == 1
    assert re.search(r"needs about \d+ B \(weights 352 B \+ activations \d+ B\), more than the --max-memory "
                     r"limit \(100 B\)", r.err), r.err  # weights: 7·8 + 8·3 + 8 floats
    cpu = irc_cli(["run", str(model), "-D", "T=4", "--max-memory", "100", "--backend", "cpu", "--check"])
    assert cpu.rc == 1 and re.search(r"\+ --check's float64 reference [\d.]+ (B|KiB)\)", cpu.err), cpu.err
    huge = irc_cli(["run", str(model), "-D", "T=1000000000", "-D", "B=1000"])
    assert huge.rc == 1 and "more than the memory available" in huge.err
    assert irc_cli(["run", str(model), "-D", "T=4", "--max-memory", "lots"]).rc == 2
    assert irc_cli(["run", str(model), "-D", "T=4", "--max-memory", "1G"]).rc == 0


def test_unknown_backend(model, irc_cli):
    r = irc_cli(["run", str(model), "-D", "T=4", "--backend", "tpu"])
    assert r.rc == 2 and "--backend: unknown backend 'tpu' (known: numpy, cpu, cuda" in r.err  # bad usage


def test_backends_registry_is_lazy():
    assert backends.get_backend("cpu").name == "cpu"  # nothing imported until compile
    with pytest.raises(IrcError, match="unknown backend"):
        backends.get_backend("gpu")
    with pytest.raises(IrcError, match="cannot emit 'verilog'"):
        backends.emit_source(graph_from_source(TINY, {"B": 1, "T": 1}), "verilog")


def test_progress_line_for_a_slow_compile(model, irc_cli, monkeypatch):
    class Slow:
        def run(self, weights, inputs):
            from irc.backends.numpy_ref import run_graph
            return run_graph(self.graph, weights, inputs)

    def compile_slowly(graph, progress=None):
        time.sleep(0.1)
        for i in range(3):
            progress(i, 3, f"kernel_{i}")
            time.sleep(0.01)
        progress(3, 3, "done")
        slow = Slow()
        slow.graph = graph
        return slow

    monkeypatch.setitem(backends.BACKENDS, "slow", backends.Backend("slow", compile_slowly))
    monkeypatch.setattr(run_cli, "PROGRESS_AFTER_S", 0.02)
    monkeypatch.setattr(run_cli, "PROGRESS_EVERY_S", 0.0)
    r = irc_cli(["run", str(model), "-D", "T=2", "--backend", "slow", "--profile"])
    assert r.rc == 0, r.err
    assert "compiling 'tiny' for the slow backend" in r.err and re.search(r"compiled in [\d.]+ s", r.err)
    assert "compiled 2/3 kernels" in r.err and "now kernel_2" in r.err
    assert "the slow backend reports no per-op times" in r.out
    quick = irc_cli(["run", str(model), "-D", "T=2"])
    assert "compiling" not in quick.err
