"""``irc generate``: decode a causal language model with a KV cache (irc/runtime/generate.py).

stdout carries the generated tokens, streamed as they come (ids, or text with --tokenizer);
stderr carries notes and the prefill / decode throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from irc.diagnostics import IrcError, UsageError


def add_generate_parser(sub, common) -> None:
    """Register the subcommand (irc/cli.py calls this with its own ``_common`` arguments)."""
    p = sub.add_parser("generate", help="generate tokens from a decoder with a real KV cache",
                       description="Prefill the prompts, then decode one token per step with the KV cache kept in "
                                   "place (docs/generate.md).")
    common(p)
    p.add_argument("--weights", help="a weights file or checkpoint folder (as irc run --weights); "
                                     "default: random weights from --seed")
    p.add_argument("--prompt-tokens", action="append", default=[], metavar="ID,ID,...",
                   help="a prompt as token ids; repeat for a batch of prompts")
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="a prompt as text (needs --tokenizer); repeat for a batch")
    p.add_argument("--encoder-tokens", action="append", default=[], metavar="ID,ID,...",
                   help="an encoder-decoder's source as token ids, one per prompt (of any lengths: right-padded, "
                        "with a padding mask); the prompt is then the decoder's start (T5: --prompt-tokens 0)")
    p.add_argument("--encoder-prompt", action="append", default=[], metavar="TEXT",
                   help="the source as text (needs --tokenizer)")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (needs the 'tokenizers' package)")
    p.add_argument("--max-new", type=int, default=32, help="tokens to generate per prompt (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="sample among the smallest set of tokens with this probability")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler and of random weights")
    p.add_argument("--stop", default="", metavar="ID,ID,...", help="token ids that end a row")
    p.add_argument("--ctx", type=int, help="cache context in tokens (default: the longest prompt + --max-new)")
    p.add_argument("--cache-dtype", choices=("f32", "f16"), default="f32", help="KV cache storage (default f32)")
    p.add_argument("--backend", default="numpy", metavar="NAME",
                   help="numpy (the reference, default) or cpu (Numba kernels: the prefill and step graphs fused and "
                        "compiled; f32 caches)")
    p.set_defaults(func=cmd_generate)


def _ids(text: str, flag: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated token ids such as 1,2,3") from None
    if any(i < 0 for i in ids):
        raise UsageError(f"{flag} {text!r}: token ids are non-negative")
    return ids


def _tokenizer(path: str | None):
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--tokenizer needs the 'tokenizers' package: pip install tokenizers") from None
    if not Path(path).is_file():
        raise UsageError(f"--tokenizer {path}: no such file")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library's own parse errors
        raise IrcError(f"cannot read tokenizer '{path}': {str(e).splitlines()[0]}") from None


def _check(args: argparse.Namespace) -> None:
    from irc.runtime.generate import BACKENDS

    if bool(args.prompt) == bool(args.prompt_tokens):
        raise UsageError("give the prompts as --prompt-tokens ID,... or as --prompt TEXT with --tokenizer (one kind)")
    if args.prompt and args.tokenizer is None:
        raise UsageError("--prompt TEXT needs --tokenizer tokenizer.json")
    if args.max_new < 0:
        raise UsageError(f"--max-new must be at least 0, got {args.max_new}")
    if args.temperature < 0 or (args.top_k is not None and args.top_k < 1) or \
            (args.top_p is not None and not 0 < args.top_p <= 1):
        raise UsageError("--temperature must be >= 0, --top-k >= 1 and --top-p in (0, 1]")
    if args.ctx is not None and args.ctx < 1:
        raise UsageError(f"--ctx must be positive, got {args.ctx}")
    if args.backend not in BACKENDS:
        raise UsageError(f"--backend: irc generate runs on {' or '.join(BACKENDS)}, not {args.backend!r}")
    if args.backend == "cpu" and args.cache_dtype != "f32":
        raise UsageError(f"--cache-dtype {args.cache_dtype} needs --backend numpy: the cpu backend stores every float "
                         "as float32, caches included")


def cmd_generate(args: argparse.Namespace) -> int:
    from irc.pipeline import load_graph, parse_defines
    from irc.runtime.generate import Decoder, Sampling, generate

    _check(args)
    tok = _tokenizer(args.tokenizer)
    prompts = [_ids(p, "--prompt-tokens") for p in args.prompt_tokens] if args.prompt_tokens else \
        [tok.encode(p).ids for p in args.prompt]
    if any(not p for p in prompts):
        raise UsageError("every prompt needs at least one token")
    defines = parse_defines(args.defines)
    if "B" in defines or "T" in defines:
        raise UsageError("-D B and -D T are set by irc generate (the number of prompts, their lengths)")
    batch = len(prompts)
    graph = load_graph(args.file, {**defines, "B": batch}, args.model)
    encoder, sizes, lengths = _encoder_inputs(args, graph, tok, batch)
    if sizes:
        defines = {**defines, **sizes}
        graph = load_graph(args.file, {**defines, "B": batch}, args.model)
    ctx = args.ctx if args.ctx is not None else max(len(p) for p in prompts) + args.max_new
    weights = _weights(args, defines, batch)
    vocab = graph.value_types()[dict(graph.outputs)["logits"]].shape[-1] if "logits" in dict(graph.outputs) else None
    if vocab is None:
        raise IrcError(f"'{graph.name}' has no output named 'logits' to sample from", graph.loc)
    bad = [i for p in prompts for i in p if i >= vocab]
    if bad:
        raise UsageError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
    padded = next(iter(encoder.values())).shape[1] if encoder else 0
    masked = lengths is not None and any(n != padded for n in lengths)  # right-padded sources: mask the padding
    decoder = Decoder(graph, weights, batch, ctx, args.cache_dtype, backend=args.backend, source_mask=masked)
    if args.backend == "cpu":
        start = time.perf_counter()
        decoder.prepare(prompts)
        print(f"irc: compiled the prefill and step graphs for the cpu backend in {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
    stream = batch == 1
    shown: list[int] = []  # the streamed row's tokens so far

    def on_token(row: int, token: int) -> None:
        if stream:
            sys.stdout.write(_piece(tok, shown, token) if tok is not None else f"{token} ")
            sys.stdout.flush()

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    result = generate(decoder, prompts, args.max_new, sampling, frozenset(_ids(args.stop, "--stop")), on_token,
                      encoder=encoder, encoder_lengths=lengths)
    if stream:
        sys.stdout.write("\n")
    else:
        for b, row in enumerate(result.tokens):
            text = tok.decode(row) if tok is not None else " ".join(str(t) for t in row)
            print(f"[{b}] {text}")
    print(f"irc: prefill {result.prefill_tokens} tokens in {result.prefill_s * 1e3:.1f} ms "
          f"({result.prefill_tps:,.0f} tokens/s); decode {result.decode_tokens} tokens in "
          f"{result.decode_s * 1e3:.1f} ms ({result.decode_tps:,.0f} tokens/s); KV cache "
          f"{decoder.cache_bytes:,} bytes ({args.cache_dtype}, {ctx} positions, batch {batch})"
          + (f" + {decoder.cross_bytes:,} bytes of encoder keys/values" if decoder.cross else ""), file=sys.stderr)
    return 0


def _encoder_inputs(args: argparse.Namespace, graph, tok,
                    batch: int) -> tuple[dict[str, np.ndarray] | None, dict, list[int] | None]:
    """An encoder-decoder's source tokens as the encoder input (right-padded with 0 to the longest),
    the size its length binds (S), and each row's real length."""
    from irc.dims import Sym
    from irc.passes.decode import decoder_inputs

    others = [n for n in graph.inputs() if n.outputs[0] not in decoder_inputs(graph)]
    given = [_ids(t, "--encoder-tokens") for t in args.encoder_tokens] or \
        ([tok.encode(t).ids for t in args.encoder_prompt] if tok is not None else [])
    if args.encoder_prompt and tok is None:
        raise UsageError("--encoder-prompt TEXT needs --tokenizer tokenizer.json")
    if not others:
        if given:
            raise UsageError(f"'{graph.name}' has no encoder: --encoder-tokens and --encoder-prompt are for "
                             "encoder-decoder models")
        return None, {}, None
    names = ", ".join(n.outputs[0] for n in others)
    if len(others) > 1 or others[0].types[0].rank != 2 or others[0].types[0].dtype not in ("i32", "i64"):
        raise UsageError(f"irc generate feeds an encoder one input of token ids [B, S]; '{graph.name}' has {names}")
    if len(given) != batch or not all(given):
        raise UsageError(f"'{graph.name}' is an encoder-decoder: give one non-empty --encoder-tokens (or "
                         f"--encoder-prompt) per prompt ({len(given)} given for {batch} prompts)")
    longest = max(len(g) for g in given)
    length = others[0].types[0].shape[1]
    if not isinstance(length, Sym) and length < longest:
        raise UsageError(f"'{graph.name}' reads sources of at most {length} tokens; the longest given has {longest}")
    sizes = {str(length): longest} if isinstance(length, Sym) else {}
    padded = np.zeros((batch, longest if isinstance(length, Sym) else int(length)), np.int64)
    for b, g in enumerate(given):
        padded[b, : len(g)] = g
    return {others[0].outputs[0]: padded}, sizes, [len(g) for g in given]


def _piece(tok, shown: list[int], token: int) -> str:
    """The text ``token`` adds: decoding the row so far and printing the new suffix keeps the spaces and
    multi-token characters that decoding tokens one at a time would lose (as HF's TextStreamer does)."""
    before = tok.decode(shown)
    shown.append(token)
    after = tok.decode(shown)
    return after[len(before):] if after.startswith(before) else " " + tok.decode([token])


def _weights(args: argparse.Namespace, defines: dict, batch: int) -> dict[str, np.ndarray]:
    from irc.pipeline import load_graph
    from irc.runtime.init import init_weights
    from irc.runtime.weights import load_for_model

    model = load_graph(args.file, {**defines, "B": batch, "T": 1}, args.model)  # weights do not depend on T
    if args.weights:
        return load_for_model(args.weights, model, args.file, lambda m: print(f"irc: note: {m}", file=sys.stderr))
    return init_weights(model, args.seed)
