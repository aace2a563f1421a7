"""Generation with a real KV cache: prefill once, then one token per step, on the numpy reference
or the CPU backend.

The decode pass (irc/passes/decode.py) gives the prefill graph (T = the longest prompt, rows
right-padded, ``valid`` = each row's length) and the step graph (T = 1). The caches are
allocated once, [B, kv_heads, slots, head_dim] per layer at the cache dtype, and updated in
place by every call; a row's position ``pos`` is how many tokens it holds, so rows of different
lengths decode side by side. On the CPU backend both graphs are fused and compiled (the prefill
graph once per prompt length; ``prepare`` does it before any timing) and the compiled module
writes the caches it is handed (float32 arrays pass into it without a copy). Sampling: greedy,
temperature, top-k, top-p, from one seeded generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from irc.diagnostics import IrcError
from irc.dims import Dim
from irc.graph import Graph
from irc.passes.bind import bind_symbols
from irc.passes.decode import SOURCE_MASK, CacheLayer, cache_layers, decode_graph, decoder_inputs
from irc.passes.shape_infer import shape_infer

CACHE_NUMPY = {"f32": np.float32, "f16": np.float16}
BACKENDS = ("numpy", "cpu")  # where a Decoder runs its graphs


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy at temperature 0, else from softmax(logits / temperature)
    restricted to the top_k most likely and to the smallest set whose probability reaches top_p."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


def pick(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """One token id from one row of logits [V]."""
    if s.temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / s.temperature
    if s.top_k is not None and s.top_k < z.size:
        kth = np.partition(z, -s.top_k)[-s.top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    if s.top_p is not None and s.top_p < 1:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]  # mass of the tokens ranked above each one
        keep = np.zeros_like(p, dtype=bool)
        keep[order[before < s.top_p]] = True  # the most likely token always stays
        p = np.where(keep, p, 0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


@dataclass
class Generation:
    tokens: list[list[int]]  # the new tokens of each row (a stop token included, as it was produced)
    prefill_tokens: int
    prefill_s: float
    decode_tokens: int
    decode_s: float
    step_logits: list[np.ndarray] = field(default_factory=list)  # [B, V] per produced token, when kept

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("inf")


def _max_len(graph: Graph) -> int | None:
    """The longest sequence a positional table covers (a learned table has no row past it)."""
    lens = [n.attrs["max_len"] for n in graph.nodes if n.op == "positional" and n.attrs.get("max_len") is not None]
    return min(lens) if lens else None


class Decoder:
    """A model's prefill and step graphs, its weights (cast once) and its caches (allocated once).

    ``model`` is the layer-level graph bound at batch ``batch`` with T left symbolic; ``backend``
    is ``numpy`` (the reference, at ``dtype``) or ``cpu`` (compiled, float32)."""

    def __init__(self, model: Graph, weights: dict[str, np.ndarray], batch: int, ctx: int,
                 cache_dtype: str = "f32", dtype: type = np.float32, backend: str = "numpy",
                 source_mask: bool = False):
        from irc.backends.numpy_ref.interpreter import OPS

        if backend not in BACKENDS:
            raise IrcError(f"irc generate runs on the {' or '.join(BACKENDS)} backend, not '{backend}'", model.loc)
        if backend == "cpu":
            if cache_dtype != "f32":
                raise IrcError("the cpu backend keeps KV caches in f32 (it stores every float as float32); "
                               f"--cache-dtype {cache_dtype} runs on --backend numpy", model.loc)
            dtype = np.float32
        self.backend = backend
        self._compiled: dict[tuple[str, int], Any] = {}  # (graph name, T) -> the compiled graph (cpu)
        limit = _max_len(model)
        if limit is not None and ctx > limit:
            raise IrcError(f"a context of {ctx} tokens (the longest prompt + --max-new, or --ctx) is longer than the "
                           f"model's positional table ({limit} positions)", model.loc)
        self.batch, self.ctx, self.dtype, self.fns = batch, ctx, np.dtype(dtype), OPS
        (self.token_input,) = sorted(decoder_inputs(model))
        # sources of different lengths (``source_mask``): the graphs take their padding mask, which only an
        # encoder of attention layers can honour; sources of one length need none, whatever the encoder
        self.prefill_graph = decode_graph(model, ctx, cache_dtype, source_mask=source_mask)
        step = decode_graph(model, ctx, cache_dtype, step=True, source_mask=source_mask)
        self.step_graph = shape_infer(bind_symbols(step, {"T": 1})) if "T" in step.symbols else step
        self.layers: list[CacheLayer] = cache_layers(self.prefill_graph)
        self.weights = {k: np.asarray(v).astype(self.dtype, copy=False) for k, v in weights.items()}
        self.caches = {name: np.zeros(_concrete(layer.type.shape), CACHE_NUMPY[layer.type.dtype])
                       for layer in self.layers for name in (layer.k_in, layer.v_in)}
        self.cross: dict[str, np.ndarray] = {}  # the encoder's keys and values, made by the prefill
        mask = next((n for n in self.prefill_graph.nodes if n.op == "input" and n.outputs[0] == SOURCE_MASK), None)
        self.source_len = _concrete(mask.types[0].shape)[-1] if mask is not None else None
        self.src_mask: dict[str, np.ndarray] = {}  # {SOURCE_MASK: [B, 1, 1, S]}, set by the prefill
        self.lengths = np.zeros(batch, np.int64)

    @property
    def cache_bytes(self) -> int:
        """Bytes the self-attention caches hold, all rows together."""
        return sum(c.nbytes for c in self.caches.values())

    @property
    def cross_bytes(self) -> int:
        """Bytes of the encoder keys and values cross-attention reads, all rows together."""
        return sum(c.nbytes for c in self.cross.values())

    def _run(self, graph: Graph, tokens: np.ndarray, valid: np.ndarray,
             encoder: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        from irc.backends.numpy_ref.decode import run_decode

        need = int(np.max(self.lengths + valid))
        if any(layer.window is None for layer in self.layers) and need > self.ctx:
            raise IrcError(f"the context is full: {need} tokens do not fit in --ctx {self.ctx}", graph.loc)
        feeds = {self.token_input: tokens.astype(np.int64), "pos": self.lengths.copy(),
                 "valid": valid.astype(np.int64), **self.caches, **self.cross, **self.src_mask}
        for name, arr in (encoder or {}).items():
            feeds[name] = arr.astype(np.int64) if arr.dtype.kind in "iu" else arr.astype(self.dtype)
        if self.backend == "cpu":
            out = self._compile(graph, tokens.shape[1]).run(self.weights, feeds)
        else:
            stored = frozenset(v for n in graph.nodes if n.op == "cross_kv" for v in n.outputs)
            out = run_decode(graph, self.weights, feeds, self.fns, self.dtype, stored)
        for name, arr in self.caches.items():  # the graph hands back the buffers it was given
            assert out[name] is arr, f"cache {name} was copied"
        self.lengths += valid
        return out

    def _compile(self, graph: Graph, t: int) -> Any:
        """``graph`` bound at T = ``t``, fused and compiled by the CPU backend (once per length). The prefill
        runs once a generation: its dense layers read the weights as given, not a packed copy of their own
        (the step graph's copy, which every token reads, is the one that pays for its memory)."""
        key = (graph.name, t)
        if key not in self._compiled:
            from irc.backends.cpu import compile_graph
            from irc.pipeline import run_passes

            bound = shape_infer(bind_symbols(graph, {"T": t})) if "T" in graph.symbols else graph
            self._compiled[key] = compile_graph(run_passes(bound, ["fuse"]), pack_weights=graph is self.step_graph)
        return self._compiled[key]

    def prepare(self, prompts: list[list[int]]) -> None:
        """Compile what a generation from ``prompts`` runs (the CPU backend's prefill and step graphs) and
        derive the weights each packs for itself, so that the prefill and decode timings hold no compile
        time and the first step no pass over the weights. Nothing to do on numpy."""
        if self.backend == "cpu":
            for graph, t in ((self.prefill_graph, max(len(p) for p in prompts)), (self.step_graph, 1)):
                self._compile(graph, t).prepare(self.weights)

    def prefill(self, prompts: list[list[int]], encoder: dict[str, np.ndarray] | None = None,
                encoder_lengths: list[int] | None = None) -> np.ndarray:
        """Run every prompt (right-padded to the longest), and the encoder on its inputs (an
        encoder-decoder; its sources right-padded, each row's real length in ``encoder_lengths``,
        default all of S); the logits [B, V] after each row's last token."""
        if self.source_len is not None:
            self.src_mask = {SOURCE_MASK: source_mask(self.batch, self.source_len, encoder_lengths)}
        elif encoder_lengths is not None and encoder is not None and \
                any(n != int(next(iter(encoder.values())).shape[1]) for n in encoder_lengths):
            raise IrcError("sources of different lengths need the padding mask: build the Decoder with "
                           "source_mask=True")
        elif encoder_lengths is not None and encoder is None:
            raise IrcError("encoder lengths are for an encoder-decoder; this model has no cross-attention")
        lens = np.array([len(p) for p in prompts], np.int64)
        tokens = np.zeros((self.batch, int(lens.max())), np.int64)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = p
        out = self._run(self.prefill_graph, tokens, lens, encoder)
        self.cross = {name: arr for name, arr in out.items() if name.startswith(("k_cross_", "v_cross_"))}
        return out["logits"][np.arange(self.batch), lens - 1]

    def step(self, tokens: list[int], active: list[bool] | None = None) -> np.ndarray:
        """One new token per row (a row not ``active`` neither writes its cache nor advances); the logits [B, V]."""
        valid = np.ones(self.batch, np.int64) if active is None else np.array(active, np.int64)
        return self._run(self.step_graph, np.array(tokens, np.int64)[:, None], valid)["logits"][:, 0]


def source_mask(batch: int, length: int, lengths: list[int] | None) -> np.ndarray:
    """The additive padding mask [B, 1, 1, S] of right-padded sources: 0 before each row's length,
    −inf after it."""
    lens = [length] * batch if lengths is None else list(lengths)
    if len(lens) != batch or any(not 0 < n <= length for n in lens):
        raise IrcError(f"encoder lengths {lens}: one per row ({batch}), each in 1..{length}")
    keys = np.arange(length)[None, :] < np.array(lens)[:, None]
    return np.where(keys, 0.0, -np.inf).astype(np.float32).reshape(batch, 1, 1, length)


def _concrete(shape: tuple[Dim, ...]) -> tuple[int, ...]:
    assert all(isinstance(d, int) for d in shape), shape
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


def generate(decoder: Decoder, prompts: list[list[int]], max_new: int, sampling: Sampling = Sampling(),
             stop: frozenset[int] = frozenset(), on_token: Callable[[int, int], None] | None = None,
             keep_logits: bool = False, encoder: dict[str, np.ndarray] | None = None,
             encoder_lengths: list[int] | None = None) -> Generation:
    """Prefill the prompts (and the encoder on ``encoder``'s inputs, right-padded rows of
    ``encoder_lengths`` real tokens), then sample up to ``max_new`` tokens per row; a row ends at a
    stop token. ``on_token(row, token)`` streams each token."""
    rng = np.random.default_rng(sampling.seed)
    decoder.prepare(prompts)
    start = time.perf_counter()
    logits = decoder.prefill(prompts, encoder, encoder_lengths)
    prefill_s = time.perf_counter() - start
    out: list[list[int]] = [[] for _ in prompts]
    done = [max_new <= 0] * len(prompts)
    kept: list[np.ndarray] = []
    decode_s, steps = 0.0, 0
    while True:
        if keep_logits:
            kept.append(logits.copy())
        nxt = []
        for b in range(len(prompts)):
            tok = pick(logits[b], sampling, rng) if not done[b] else 0
            if not done[b]:
                out[b].append(tok)
                if on_token is not None:
                    on_token(b, tok)
                done[b] = tok in stop or len(out[b]) >= max_new
            nxt.append(tok)
        if all(done):
            break
        start = time.perf_counter()
        logits = decoder.step(nxt, [not d for d in done])
        decode_s += time.perf_counter() - start
        steps += sum(not d for d in done)  # tokens the step makes for rows still generating
    return Generation(out, sum(len(p) for p in prompts), prefill_s, steps, decode_s, kept)
