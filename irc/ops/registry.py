"""The op registry: every op's operands, attributes, result types and parameters.

An op is declared once, with its attribute schema and two pure functions over
types: ``infer`` (operand types -> result types) and ``params`` (operand types ->
parameter shapes).  Every pass, the frontend and the IR parser consult this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from irc.diagnostics import did_you_mean, format_number, raise_site
from irc.dims import Dim, Sym, never_positive
from irc.types import TensorType

# integer attributes stay in int64 range, like every size
MAX_INT = 2**62
FLOAT32_MAX = 3.4028234663852886e38


def _short_number(value: Any) -> str:
    """A number for a message, shortened when it has hundreds of digits (10**299)."""
    text = format_number(value) if isinstance(value, (int, Fraction)) else repr(value)
    if len(text) <= 24:
        return text
    if isinstance(value, float):
        return f"{value:.3g}"
    whole = abs(int(value))
    return f"{'-' if value < 0 else ''}about 10^{len(str(whole)) - 1}"


class ShapeError(Exception):
    """Raised by an op's ``infer``; the shape pass adds the op and source location."""

    def __init__(self, message: str):
        super().__init__(message)
        self.origin = raise_site()


class AttrError(Exception):
    """An attribute value of the wrong kind; the caller adds the location."""

    def __init__(self, message: str):
        super().__init__(message)
        self.origin = raise_site()


_REQUIRED = object()
# attribute kinds a bare word can fill (gelu, same, qvo): the frontend reads these, never a list of its own
BARE_WORD_KINDS = ("enum", "int_or_enum", "pair_or_enum", "bool_or_letters")


class Quoted(str):
    """A string the user wrote in quotes, as opposed to a bare name such as ``gelu``."""


@dataclass(frozen=True)
class Attr:
    name: str
    kind: str  # see check_attr
    default: Any = _REQUIRED
    choices: tuple[str, ...] = ()
    doc: str = ""
    most: int | None = None  # an upper bound for integer kinds (split's parts)

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


Infer = Callable[[dict[str, Any], list[TensorType]], list[TensorType]]
ParamFn = Callable[[dict[str, Any], list[TensorType]], dict[str, tuple[Dim, ...]]]
# (node, operand types, result types) -> irc.ops.cost.Cost; typed loosely to keep this module free of Node
CostFn = Callable[[Any, list[TensorType], list[TensorType]], Any]
# attrs -> {parameter or buffer name: init rule}; see INIT_RULES
InitFn = Callable[[dict[str, Any]], dict[str, str]]
# (attrs, operand types) -> elements the op materialises besides its results (held while it runs, and what
# backpropagation keeps): attention's q, k, v and probabilities, an FFN's hidden layer, recurrent gates
InternalFn = Callable[[dict[str, Any], list[TensorType]], int]
# (builder, forward node, incoming gradient per result or None) -> {operand index or parameter name: gradient
# value}: emits, through the builder (irc/passes/grad.py), the IR nodes of the op's vector-Jacobian product.
# Operands and parameters left out get no gradient (integer operands, constants). docs/autodiff.md has each formula.
VjpFn = Callable[[Any, Any, list[str | None]], dict[int | str, str]]
# (attrs, operand types, tokens) -> parameter elements that many tokens leave unused (a mixture of experts'
# unchosen experts; for tokens > 1 the expectation under uniform routing): the analysis reports the active
# parameters (total minus this at one token), and bytes moved reads only the weights a pass touches
InactiveFn = Callable[[dict[str, Any], list[TensorType], int], float]
# (node, operand types) -> what the layer keeps per token while a decoder generates, or None (irc.ops.cost.CacheUse)
KVCacheFn = Callable[[Any, list[TensorType]], Any]

# How an op's parameters start (irc/runtime/init.py implements each; the op names one per parameter):
INIT_RULES = {
    "zeros": "all zeros (biases, running means)",
    "ones": "all ones (norm gains, running variances)",
    "normal": "normal(0, 0.02), as GPT-2 and BERT initialise transformer weights",
    "fan": "He normal (Var = 2/fan_in) when the layer feeds a rectifier, else Xavier uniform",
    "he": "He normal, Var = 2/fan_in, whatever follows",
    "xavier": "Xavier uniform, Var = 2/(fan_in + fan_out)",
    "forget_gate": "zeros, with the LSTM forget gate's rows (h..2h) at the forget_bias attribute",
}

# What kind of thing an op is, for the lints, the initialiser and the analyses (a closed vocabulary:
# register() refuses a tag not listed here, so a misspelt tag cannot silently opt an op out of a rule).
CLASSES = {
    "input": "a graph input",
    "activation": "an elementwise nonlinearity of one tensor",
    "rectifier": "zero (or a small slope) for negative inputs: He init, dead units",
    "saturating": "bounded output: gradients vanish in the flat tails",
    "pass_through": "keeps a value's meaning: no weights, no mixing (the identity at inference)",
    "elementwise": "arithmetic per element of one or two tensors",
    "residual": "can join a skip connection and a branch (x + F(x))",
    "norm": "normalises each token's (or group's) features with its own statistics",
    "batch_norm": "normalises each channel with batch statistics (running averages at inference)",
    "linear": "a product with a weight matrix over the feature axis",
    "ffn": "a position-wise feed-forward block (two or three weight matrices around an activation)",
    "conv": "a learned convolution over spatial or time axes",
    "pool": "a fixed window reduction (max or mean)",
    "window": "reads a spatial window per output position (convolutions, pools)",
    "learned": "mixes features with learned weights or another activation (not a window op)",
    "attention": "attends over a sequence",
    "recurrent": "a recurrence over time steps",
    "embedding": "a table lookup of token ids",
    "position": "injects position information (learned or fixed tables, relative biases)",
    "head": "an output projection to a vocabulary",
    "data_movement": "moves or regroups elements without arithmetic",
    "view": "its result re-views its input's buffer: no bytes moved, no memory of its own",
    "primitive": "a lowered primitive the decompose pass emits",
    "fused": "a fused op the fusion passes rebuild",
    "loss": "a scalar training objective the grad pass differentiates",
    "backward": "a backward primitive the grad pass emits (a vector-Jacobian product)",
    "decode": "an op of the decode graphs: attention and positions over an explicit KV cache",
    "moe": "routes each token to some of its experts (a mixture of experts): parameters exceed what a token uses",
}

# the CUDA backend renders the fused graph, so a layer that decompose lowers needs no kernel of its own
LOWERED_FOR_CUDA = "decompose lowers it (to gemm and friends) before the CUDA backend renders"

# columns of the coverage matrix an op may declare "not applicable" for, with a reason
COLUMNS = ("type", "params", "init", "flops", "bytes", "receptive", "lint", "numpy", "cpu", "cuda", "golden_ir",
           "error_case", "torch_oracle", "semantics", "grad")


@dataclass(frozen=True)
class Receptive:
    """How the receptive-field pass treats an op (irc/analysis/receptive.py reads it).

    kind:
    - ``window``: a convolution or pool over the last ``nd`` axes (kernel, stride, dilation attributes),
      or, with ``step``, any op whose output position reads a window of ``kernel`` inputs and whose
      jump is multiplied by ``stride`` (a fraction for upsampling: a transposed convolution of stride s
      divides the jump by s);
    - ``adaptive``: adaptive pooling to ``size`` (an even split is a window; a 1×1 output is global);
    - ``pointwise``: each output position reads the same position of each operand (broadcasting allowed);
    - ``along``: mixes values along one axis (``axis(attrs, rank)``), pointwise along the others: it
      keeps the field unless that axis is a tracked spatial one;
    - ``permute``: moves axes (``transpose``): the field follows its spatial axes;
    - ``global``: reads the whole input (global pooling): the result is no longer a spatial map;
    - ``reset``: anything else: the result starts untracked (``reason`` says why).
    """

    kind: str
    nd: int = 0
    axis: Callable[[dict[str, Any], int], int] | None = None
    reason: str = ""
    # window ops other than conv/pool: attrs -> (effective kernel per axis, jump factor per axis)
    step: Callable[[dict[str, Any]], tuple[tuple[int, ...], tuple[Fraction, ...]]] | None = None


def rf_window(nd: int, step: Callable[[dict[str, Any]], tuple[tuple[int, ...], tuple[Fraction, ...]]] | None = None
              ) -> Receptive:
    return Receptive("window", nd=nd, step=step)


def rf_along(axis: Callable[[dict[str, Any], int], int]) -> Receptive:
    return Receptive("along", axis=axis)


def rf_reset(reason: str) -> Receptive:
    return Receptive("reset", reason=reason)


RF_POINTWISE = Receptive("pointwise")
RF_LAST_AXIS = Receptive("along", axis=lambda a, rank: rank - 1)
RF_PERMUTE = Receptive("permute")
RF_GLOBAL = Receptive("global")
RF_ADAPTIVE = Receptive("adaptive")


@dataclass(frozen=True)
class OpDef:
    name: str
    inputs: tuple[str, ...]  # names of tensor operands; trailing '?' marks optional, '*' variadic
    attrs: tuple[Attr, ...]
    infer: Infer
    params: ParamFn | None = None
    buffers: ParamFn | None = None
    results: Callable[[dict[str, Any]], tuple[str, ...]] | tuple[str, ...] = ("out",)
    doc: str = ""
    aliases: tuple[str, ...] = ()
    # facts few ops have, read by name: "train_mask" (attrs, x) -> the shape of the dropout mask training
    # adds to the layer, or None (stacked recurrent layers; irc.ops.grad_train and the training memory read it)
    extra: dict[str, Any] = field(default_factory=dict)
    # an optional input left out before one given by keyword takes another input's value:
    # attention(x, attn_bias=b) is attention(x, x, b), self-attention with keys and values from x
    omitted: dict[str, str] = field(default_factory=dict)
    # -- facts the passes, analyses, lints and the initialiser read (never restated elsewhere) --------
    cost: CostFn | None = None  # forward FLOPs and MACs by kind
    init: InitFn | None = None  # how each parameter and buffer starts
    receptive: Receptive | None = None  # receptive-field behaviour
    classes: frozenset[str] = frozenset()  # what kind of thing the op is (CLASSES)
    depth: int = 0  # weight matrices a gradient crosses on the shortest path through the op
    internal: InternalFn | None = None  # intermediates it materialises (memory, saved for backward)
    vjp: VjpFn | None = None  # reverse-mode autodiff: the nodes of its vector-Jacobian product (grad pass)
    inactive: InactiveFn | None = None  # parameters a token leaves unused (MoE); None: it uses them all
    kv_cache: KVCacheFn | None = None  # what it caches per token when decoding (KV cache analyses, rooflines)
    na: dict[str, str] = field(default_factory=dict)  # coverage column -> why it does not apply

    @property
    def min_inputs(self) -> int:
        return sum(1 for i in self.inputs if not i.endswith(("?", "*")))

    @property
    def max_inputs(self) -> int | None:
        if any(i.endswith("*") for i in self.inputs):
            return None
        return len(self.inputs)

    def result_names(self, attrs: dict[str, Any]) -> tuple[str, ...]:
        return self.results(attrs) if callable(self.results) else self.results

    def attr(self, name: str) -> Attr | None:
        for a in self.attrs:
            if a.name == name:
                return a
        return None

    def param_shapes(self, attrs: dict[str, Any], types: list[TensorType]) -> dict[str, tuple[Dim, ...]]:
        return self.params(attrs, types) if self.params else {}

    def buffer_shapes(self, attrs: dict[str, Any], types: list[TensorType]) -> dict[str, tuple[Dim, ...]]:
        return self.buffers(attrs, types) if self.buffers else {}

    def init_rules(self, attrs: dict[str, Any]) -> dict[str, str]:
        return self.init(attrs) if self.init else {}

    def internal_elements(self, attrs: dict[str, Any], types: list[TensorType]) -> int:
        return self.internal(attrs, types) if self.internal else 0

    def inactive_params(self, attrs: dict[str, Any], types: list[TensorType], tokens: int = 1) -> float:
        return self.inactive(attrs, types, tokens) if self.inactive else 0

    def has(self, *classes: str) -> bool:
        """Whether the op carries any of ``classes``."""
        return not self.classes.isdisjoint(classes)


OPS: dict[str, OpDef] = {}
_ALIASES: dict[str, str] = {}


def op_names() -> set[str]:
    """Every name a layer can be called by: op names and their aliases."""
    return (set(OPS) | set(_ALIASES)) - {"input"}


def register(op: OpDef) -> OpDef:
    unknown = sorted(op.classes - set(CLASSES))
    assert not unknown, f"op '{op.name}': unknown classes {unknown} (see CLASSES)"
    assert set(op.na) <= set(COLUMNS), f"op '{op.name}': unknown coverage columns {sorted(set(op.na) - set(COLUMNS))}"
    OPS[op.name] = op
    for alias in op.aliases:
        _ALIASES[alias] = op.name
    return op


def canonical_name(name: str) -> str:
    return _ALIASES.get(name, name)


def get_op(name: str) -> OpDef | None:
    return OPS.get(canonical_name(name))


# -- attribute checking -----------------------------------------------------------


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    return None


def describe_value(value: Any) -> str:
    """An attribute value as the user wrote it: ``1.5``, ``true``, ``none``, ``the string "four"``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, Fraction)):
        return format_number(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Quoted):
        return f'the string "{value}"'
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, list):
        return "[" + ", ".join(describe_value(v) for v in value) + "]"
    if isinstance(value, Sym):
        return f"the symbolic size {value}"
    return type(value).__name__


def _values_of(d: Sym) -> str:
    return "value of " + " and ".join(sorted(d.symbols()))


def _bounded(where: str, attr: Attr, iv: int) -> int:
    if abs(iv) >= MAX_INT:
        raise AttrError(f"{where} must be below 2**62, got {iv}")
    if attr.most is not None and iv > attr.most:
        raise AttrError(f"{where} must be at most {attr.most:,}, got {iv:,}")
    return iv


def check_attr(op: str, attr: Attr, value: Any) -> Any:
    """Return ``value`` converted to the attribute's kind, or raise AttrError."""
    kind = attr.kind
    where = f"attribute '{attr.name}' of '{op}'"
    if value is None and attr.default is None:
        return None
    if kind in ("int", "posint", "nonneg"):
        iv = _as_int(value)
        if iv is None:
            raise AttrError(f"{where} must be an integer, got {describe_value(value)}")
        if kind == "posint" and iv <= 0:
            raise AttrError(f"{where} must be positive, got {iv}")
        if kind == "nonneg" and iv < 0:
            raise AttrError(f"{where} must be non-negative, got {iv}")
        return _bounded(where, attr, iv)
    if kind == "dim":  # a positive size that may be symbolic
        if isinstance(value, Sym):
            if never_positive(value):
                raise AttrError(f"{where} must be a positive size, got {describe_value(value)}, "
                                f"which is below 1 for every {_values_of(value)}")
            return value
        iv = _as_int(value)
        if iv is None or iv <= 0:
            raise AttrError(f"{where} must be a positive size, got {describe_value(value)}")
        return _bounded(where, attr, iv)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
            raise AttrError(f"{where} must be a number, got {describe_value(value)}")
        # every backend computes in float32 at least: a larger value would run to inf or NaN silently
        if not abs(value) <= FLOAT32_MAX:
            raise AttrError(f"{where} must be a float32 number (at most {FLOAT32_MAX:.7g} in size), got "
                            f"{_short_number(value)}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise AttrError(f"{where} must be true or false, got {describe_value(value)}")
        return value
    if kind == "bool_or_letters":  # true (all), false (none) or a set of the letters in choices: bias=qvo
        if isinstance(value, bool):
            return value
        letters = "".join(attr.choices)
        if isinstance(value, str) and value and len(set(value)) == len(value) and set(value) <= set(letters):
            picked = "".join(c for c in letters if c in value)  # canonical order, so qv and vq print alike
            return True if picked == letters else picked  # every letter is bias=true, printed as today
        raise AttrError(f"{where} must be true, false or letters from {', '.join(attr.choices)} (each at most once); "
                        f"got {describe_value(value)}")
    if kind == "enum":
        if not isinstance(value, str) or value not in attr.choices:
            raise AttrError(f"{where} must be one of {', '.join(attr.choices)}; got {describe_value(value)}"
                            + (did_you_mean(value, attr.choices) if isinstance(value, str) else ""))
        return str(value)
    if kind in ("int_or_enum", "pair_or_enum"):
        if isinstance(value, str):
            if value not in attr.choices:
                choices = ", ".join(attr.choices)
                raise AttrError(f"{where} must be an integer or one of {choices}; got {describe_value(value)}"
                                + did_you_mean(value, attr.choices))
            return str(value)
        return check_attr(op, Attr(attr.name, "pair_nonneg" if kind == "pair_or_enum" else "nonneg"), value)
    if kind in ("pair", "pair_nonneg"):
        base = "posint" if kind == "pair" else "nonneg"
        if isinstance(value, list):
            if len(value) != 2:
                raise AttrError(f"{where} must be an integer or a pair [h, w], got a list of {len(value)}")
            return [check_attr(op, Attr(attr.name, base), v) for v in value]
        return check_attr(op, Attr(attr.name, base), value)
    if kind == "ints":
        if not isinstance(value, list):
            raise AttrError(f"{where} must be a list of integers, got {describe_value(value)}")
        out = []
        for v in value:
            iv = _as_int(v)
            if iv is None:
                raise AttrError(f"{where} must be a list of integers, but it holds {describe_value(v)}")
            out.append(_bounded(where, Attr(attr.name, "int"), iv))
        return out
    if kind == "int_or_ints":  # a list is as long as its source text: only a count needs the bound
        if isinstance(value, list):
            return check_attr(op, Attr(attr.name, "ints"), value)
        return check_attr(op, Attr(attr.name, "posint", most=attr.most), value)
    if kind == "dims":  # a shape: ints, -1 or symbols
        if not isinstance(value, list):
            raise AttrError(f"{where} must be a list of sizes, got {describe_value(value)}")
        out = []
        for v in value:
            if isinstance(v, Sym):
                if never_positive(v):
                    raise AttrError(f"{where} must hold positive sizes or -1, but it holds {describe_value(v)}, "
                                    f"which is below 1 for every {_values_of(v)}")
                out.append(v)
                continue
            iv = _as_int(v)
            if iv is None or (iv <= 0 and iv != -1):
                raise AttrError(f"{where} must hold positive sizes or -1, but it holds {describe_value(v)}")
            out.append(_bounded(where, Attr(attr.name, "int"), iv))
        return out
    if kind == "ref":  # the name of a layer instance whose weights are reused
        if not isinstance(value, str):
            raise AttrError(f"{where} must name a layer instance, got {describe_value(value)}")
        return str(value)
    raise AssertionError(f"unknown attribute kind {kind}")


def normalize_attrs(opdef: OpDef, given: dict[str, Any]) -> dict[str, Any]:
    """Check ``given`` against the schema and fill defaults, in declaration order."""
    for name in given:
        if opdef.attr(name) is None:
            names = [a.name for a in opdef.attrs if a.name != "tied_dim"]
            hint = did_you_mean(name, names) or f" (it takes: {', '.join(names) or 'none'})"
            raise AttrError(f"'{opdef.name}' has no attribute '{name}'{hint}")
    out: dict[str, Any] = {}
    for a in opdef.attrs:
        if a.name in given:
            out[a.name] = check_attr(opdef.name, a, given[a.name])
        elif a.required:
            raise AttrError(f"'{opdef.name}' needs attribute '{a.name}'")
        else:
            out[a.name] = a.default
    return out


def ops_with(*classes: str) -> frozenset[str]:
    """Names of the registered ops that carry any of ``classes`` (read at use time, after registration)."""
    import irc.ops  # noqa: F401  (every family registered)

    return frozenset(name for name, op in OPS.items() if op.has(*classes))
