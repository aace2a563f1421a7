"""Weight maps: how a checkpoint's own names and layouts become irc's weight keys.

A map is a JSON file (``irc import`` writes ``NAME.weightmap.json`` next to ``NAME.arch``)::

    {"format": "irc-weight-map", "version": 1,
     "source": "Hugging Face transformers, model_type gpt2",
     "base_prefix": "transformer.",
     "weights": {"wte.weight": "transformer.wte.weight",
                 "pre_ln_decoder.{i}.attn.wq": {"from": "transformer.h.{i}.attn.c_attn.weight",
                                                "split": [1, 3, 0], "transpose": true},
                 "lstm.bias": {"sum": ["rnn.bias_ih_l0", "rnn.bias_hh_l0"]}},
     "tied": {"lm_head.weight": "transformer.wte.weight"},
     "ignore": ["transformer.h.{i}.attn.masked_bias"]}

Each irc key (a ``{name}`` placeholder stands for a layer number) is made from checkpoint
tensors by explicit steps, always in this order: ``from`` one tensor, or ``sum`` several
(PyTorch's ``bias_ih + bias_hh``); ``split: [axis, parts, part]`` keeps the part-th of
``parts`` equal pieces along ``axis`` (GPT-2's fused ``c_attn``); ``transpose`` swaps the two
axes of a matrix (GPT-2's Conv1D stores ``[in, out]``, irc ``[out, in]``); ``offset`` adds a
number (Gemma's RMSNorm stores ``w`` for the gain ``1 + w``). No step is ever
guessed from a shape: a square matrix loaded the wrong way round has the right shape.

``tied`` names checkpoint tensors that must equal another (a tied head saved twice) and are
then dropped; ``ignore`` names tensors that are not weights (buffers a framework saves).
``base_prefix`` is the base model's prefix (HF's ``base_model_prefix``): a checkpoint of the
bare model (``GPT2Model``) saves ``h.0...`` where one with a head saves ``transformer.h.0...``,
and both load. Every checkpoint tensor must be used, tied or ignored, and every source must exist.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from irc.diagnostics import IrcError, read_source

FORMAT = "irc-weight-map"
VERSION = 1
SUFFIX = ".weightmap.json"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")


@dataclass(frozen=True)
class Rule:
    """How one irc key is made: ``sources`` (summed when more than one), then split, then transpose."""

    sources: tuple[str, ...]
    split: tuple[int, int, int] | None = None  # (axis, parts, part)
    transpose: bool = False
    offset: float = 0.0  # added to every element: Gemma's RMSNorm stores w for a gain of (1 + w)

    def to_json(self) -> str | dict[str, Any]:
        if len(self.sources) == 1 and self.split is None and not self.transpose and not self.offset:
            return self.sources[0]
        out: dict[str, Any] = {"from": self.sources[0]} if len(self.sources) == 1 else {"sum": list(self.sources)}
        if self.split is not None:
            out["split"] = list(self.split)
        if self.transpose:
            out["transpose"] = True
        if self.offset:
            out["offset"] = self.offset
        return out

    def describe(self, sources: tuple[str, ...]) -> str:
        words = [" + ".join(f"'{s}'" for s in sources)]
        if self.split is not None:
            axis, parts, part = self.split
            words.append(f"part {part + 1} of {parts} along axis {axis}")
        if self.transpose:
            words.append("transposed")
        if self.offset:
            words.append(f"plus {self.offset:g}")
        return ", ".join(words)


@dataclass
class WeightMap:
    rules: dict[str, Rule]
    tied: dict[str, str] = field(default_factory=dict)
    ignore: tuple[str, ...] = ()
    base_prefix: str = ""
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "version": VERSION}
        if self.source:
            out["source"] = self.source
        if self.base_prefix:
            out["base_prefix"] = self.base_prefix
        out["weights"] = {k: r.to_json() for k, r in self.rules.items()}
        if self.tied:
            out["tied"] = dict(self.tied)
        if self.ignore:
            out["ignore"] = list(self.ignore)
        return out

    def dumps(self) -> str:
        """The map as JSON text with one weight per line, so a diff of two maps reads weight by weight."""
        lines = []
        for field_name, value in self.to_json().items():
            if isinstance(value, dict):
                inner = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()]
                lines.append(f" {json.dumps(field_name)}: {{\n" + ",\n".join(inner) + "\n }")
            else:
                lines.append(f" {json.dumps(field_name)}: {json.dumps(value)}")
        return "{\n" + ",\n".join(lines) + "\n}\n"


def map_path_for(model: str | Path) -> Path:
    """Where a model's weight map sits: ``gpt2.arch`` -> ``gpt2.weightmap.json``."""
    model = Path(model)
    return model.with_name(model.stem + SUFFIX)


# -- reading ---------------------------------------------------------------------------


def load_map(path: Path) -> WeightMap:
    try:
        data = json.loads(read_source(path, str(path), "a weight map"))
    except json.JSONDecodeError as e:
        raise IrcError(f"the weight map '{path}' is not valid JSON: {e.msg.lower()} at line {e.lineno}, "
                       f"column {e.colno}") from None
    return parse_map(data, str(path))


def parse_map(data: Any, where: str) -> WeightMap:
    def bad(why: str) -> IrcError:
        return IrcError(f"the weight map '{where}' is malformed: {why}")

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise bad(f"it must be a JSON object with \"format\": \"{FORMAT}\"")
    if data.get("version") != VERSION:
        raise bad(f"version {json.dumps(data.get('version'))}, but irc reads version {VERSION}")
    known = {"format", "version", "source", "base_prefix", "weights", "tied", "ignore"}
    extra = sorted(set(data) - known)
    if extra:
        raise bad(f"unknown field(s) {', '.join(extra)} (fields: {', '.join(sorted(known))})")
    weights = data.get("weights")
    if not isinstance(weights, dict) or not weights:
        raise bad("'weights' must map irc keys to their sources")
    rules = {key: _parse_rule(key, spec, bad) for key, spec in weights.items()}
    tied = data.get("tied", {})
    ignore = data.get("ignore", [])
    prefix = data.get("base_prefix", "")
    if not isinstance(tied, dict) or not all(isinstance(v, str) for v in tied.values()):
        raise bad("'tied' must map a checkpoint key to the key it must equal")
    if not isinstance(ignore, list) or not all(isinstance(v, str) for v in ignore):
        raise bad("'ignore' must be a list of checkpoint keys")
    if not isinstance(prefix, str):
        raise bad("'base_prefix' must be a string")
    return WeightMap(rules, dict(tied), tuple(ignore), prefix, str(data.get("source", "")))


def _parse_rule(key: str, spec: Any, bad) -> Rule:
    if isinstance(spec, str):
        return Rule((spec,))
    if not isinstance(spec, dict):
        raise bad(f"the entry for '{key}' must be a checkpoint key or an object")
    unknown = sorted(set(spec) - {"from", "sum", "split", "transpose", "offset"})
    if unknown:
        raise bad(f"the entry for '{key}' has unknown step(s) {', '.join(unknown)} "
                  "(steps: from|sum, split, transpose, offset)")
    if ("from" in spec) == ("sum" in spec):
        raise bad(f"the entry for '{key}' needs exactly one of 'from' (a key) and 'sum' (a list of keys)")
    sources = (spec["from"],) if "from" in spec else spec["sum"]
    if isinstance(sources, str) or not sources or not all(isinstance(s, str) for s in sources):
        raise bad(f"the entry for '{key}': 'sum' must be a list of checkpoint keys")
    split = spec.get("split")
    if split is not None:
        ok = isinstance(split, list) and len(split) == 3 and all(type(v) is int for v in split)
        if not ok or split[0] < 0 or split[1] < 1 or not 0 <= split[2] < split[1]:
            raise bad(f"the entry for '{key}': 'split' must be [axis, parts, part] with 0 <= part < parts")
        split = tuple(split)
    transpose = spec.get("transpose", False)
    if not isinstance(transpose, bool):
        raise bad(f"the entry for '{key}': 'transpose' must be true or false")
    offset = spec.get("offset", 0.0)
    if isinstance(offset, bool) or not isinstance(offset, (int, float)):
        raise bad(f"the entry for '{key}': 'offset' must be a number")
    return Rule(tuple(sources), split, transpose, float(offset))


# -- applying --------------------------------------------------------------------------


def _pattern(key: str) -> re.Pattern[str]:
    """``{name}`` matches a layer number; in ``ignore`` patterns, ``*`` matches anything."""
    parts, at = [], 0
    for m in _PLACEHOLDER.finditer(key):
        parts.append(_literal(key[at:m.start()]) + f"(?P<{m.group(1)}>\\d+)")
        at = m.end()
    return re.compile("".join(parts) + _literal(key[at:]) + r"\Z")


def _literal(text: str) -> str:
    return ".*".join(re.escape(piece) for piece in text.split("*"))


def _expand(template: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


class _Keys:
    """Checkpoint keys, found with or without the base model's prefix."""

    def __init__(self, tensors: dict[str, np.ndarray], prefix: str):
        self.tensors, self.prefix = tensors, prefix

    def find(self, name: str) -> str | None:
        if name in self.tensors:
            return name
        p = self.prefix
        if p and name.startswith(p) and name[len(p):] in self.tensors:
            return name[len(p):]
        if p and p + name in self.tensors:
            return p + name
        return None


def _rule_for(wmap: WeightMap, key: str, compiled: list[tuple[re.Pattern[str], str]]) -> tuple[Rule, dict] | None:
    if key in wmap.rules:
        return wmap.rules[key], {}
    for pattern, template in compiled:
        m = pattern.match(key)
        if m:
            return wmap.rules[template], m.groupdict()
    return None


def apply_map(wmap: WeightMap, tensors: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]],
              source: str, map_name: str) -> dict[str, np.ndarray]:
    """irc's ``{key: array}`` for every expected key, made from the checkpoint's ``tensors``."""
    compiled = [(_pattern(t), t) for t in wmap.rules if _PLACEHOLDER.search(t)]
    keys = _Keys(tensors, wmap.base_prefix)
    out: dict[str, np.ndarray] = {}
    used: set[str] = set()
    unmapped: list[str] = []
    missing: list[str] = []
    for key, shape in expected.items():
        found = _rule_for(wmap, key, compiled)
        if found is None:
            unmapped.append(key)
            continue
        rule, values = found
        names = tuple(_expand(s, values) for s in rule.sources)
        real = [keys.find(n) for n in names]
        if any(r is None for r in real):
            missing += [f"'{n}' (for {key})" for n, r in zip(names, real) if r is None]
            continue
        used.update(real)  # type: ignore[arg-type]
        out[key] = _make(rule, [tensors[r] for r in real], key, tuple(real), shape, source)  # type: ignore[index]
    if unmapped:
        raise IrcError(f"the weight map '{map_name}' has no entry for {len(unmapped)} weight(s) of the model: "
                       + ", ".join(f"'{k}'" for k in unmapped))
    if missing:
        raise IrcError(f"{source}: missing {len(missing)} weight(s) the weight map reads: " + ", ".join(missing))
    _check_tied(wmap, tensors, keys, used, source)
    ignored = [_pattern(p) for p in wmap.ignore]
    extra = [k for k in tensors if k not in used and not any(p.match(k) or p.match(wmap.base_prefix + k)
                                                             for p in ignored)]
    if extra:
        raise IrcError(f"{source}: {len(extra)} weight(s) that the weight map '{map_name}' does not read "
                       "(a different model?): " + ", ".join(f"'{k}' {_fmt_shape(tensors[k].shape)}" for k in extra))
    return out


def _check_tied(wmap: WeightMap, tensors: dict[str, np.ndarray], keys: _Keys, used: set[str], source: str) -> None:
    for name, target in wmap.tied.items():
        have, want = keys.find(name), keys.find(target)
        if have is None:
            continue  # saved once, as a tied checkpoint should be
        used.add(have)
        if want is not None and (tensors[have].shape != tensors[want].shape
                                 or not np.array_equal(tensors[have], tensors[want])):
            raise IrcError(f"{source}: '{have}' differs from '{want}', but the model ties the two (it reads only "
                           f"'{want}'); the checkpoint has an untied head: set tie_word_embeddings to false in its "
                           "config.json and import it again")


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _make(rule: Rule, arrays: list[np.ndarray], key: str, names: tuple[str, ...], shape: tuple[int, ...],
          source: str) -> np.ndarray:
    how = rule.describe(names)
    first = arrays[0]
    for name, arr in zip(names[1:], arrays[1:]):
        if arr.shape != first.shape:
            raise IrcError(f"{source}: weight '{key}' sums {how}, but '{name}' has shape {_fmt_shape(arr.shape)} "
                           f"and '{names[0]}' {_fmt_shape(first.shape)}")
    value = first if len(arrays) == 1 else np.sum(np.stack([a.astype(np.float64) for a in arrays]), axis=0)
    if rule.split is not None:
        axis, parts, part = rule.split
        if axis >= value.ndim or value.shape[axis] % parts:
            raise IrcError(f"{source}: weight '{key}' takes {how}, but {_fmt_shape(value.shape)} does not split "
                           f"into {parts} equal parts along axis {axis}")
        step = value.shape[axis] // parts
        value = np.take(value, range(part * step, (part + 1) * step), axis=axis)
    if rule.transpose:
        if value.ndim != 2:
            raise IrcError(f"{source}: weight '{key}' takes {how}, but only a matrix can be transposed "
                           f"(this one is {_fmt_shape(value.shape)})")
        value = value.T
    if rule.offset:
        value = value + np.asarray(rule.offset, value.dtype)
    if tuple(value.shape) != tuple(shape):
        hint = "; transposed?" if value.ndim == 2 and tuple(value.shape[::-1]) == tuple(shape) else ""
        raise IrcError(f"{source}: weight '{key}' ({how}) has shape {_fmt_shape(value.shape)}, but the model "
                       f"expects {_fmt_shape(shape)}{hint}")
    return np.ascontiguousarray(value.astype(first.dtype, copy=False))


def describe_sources(wmap: WeightMap, keys: list[str]) -> dict[str, str]:
    """``{irc key: how the map makes it}`` for the keys the map covers (for ``irc weights``)."""
    compiled = [(_pattern(t), t) for t in wmap.rules if _PLACEHOLDER.search(t)]
    out: dict[str, str] = {}
    for key in keys:
        found = _rule_for(wmap, key, compiled)
        if found is not None:
            rule, values = found
            out[key] = rule.describe(tuple(_expand(s, values) for s in rule.sources)).replace("'", "")
    return out
