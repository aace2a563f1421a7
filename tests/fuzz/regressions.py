"""The minimal input of every finding of the fuzzer, by its id: the open ones and the fixed ones."""

from __future__ import annotations

from fuzz.case import Case


def _model(body: str) -> str:
    return f"model m(B, T) {{\n  input x: f32[B, T, 8]\n{body}\n}}\n"


def _arch(text: str, origin: str) -> Case:
    return Case.single(text, f"regression:{origin}")


def _ir(text: str, origin: str) -> Case:
    return Case.single(text, f"regression:{origin}", kind="ir")


# Open findings: each has an entry in fuzz/known.py; test_open_findings_still_fail checks it reproduces.
REGRESSIONS: dict[str, Case] = {
}

# Findings the fuzzer made that irc now handles: plain tests keep them handled.
FIXED: dict[str, Case] = {
    "ir-dim-floordiv-zero": _ir("graph @m(B) {\n  %x = input : f32[B,B//0]\n  output y = %x\n}\n",
                                "ir-dim-floordiv-zero"),
    "rope-odd-width-run": _arch("model m() {\n  input x: f32[1, 2, 4, 5]\n  output y = rope(x)\n}\n",
                                "rope-odd-width-run"),
    "attention-rel-buckets-too-few": Case.single(_model("  output y = attention(x, heads=1, rel_buckets=1)"),
                                                 "regression:attention-rel-buckets-too-few", defines=("T=3",)),
    "reshape-minus-one-inexact": _arch("model m(B) {\n  input x: f32[B, 2]\n  output y = reshape(x, [B, 65, -1])\n}\n",
                                       "reshape-minus-one-inexact"),
    "lower-param-over-2-62": _arch("model m(B) {\n  input x: f32[B, 4611686018427387903, 4]\n"
                                   "  output y = linear(flatten(x), 3)\n}\n", "lower-param-over-2-62"),
    "ir-param-shape-minus-one": _ir("graph @m(B) {\n  %w = param {name=weight, shape=[4, -1]}\n  output y = %w\n}\n",
                                    "ir-param-shape-minus-one"),
    "use-path-with-nul": _arch('use "a\x00b.arch"\n' + _model("  output y = x"), "use-path-with-nul"),
    "use-path-too-long": _arch(f'use "{"x" * 300}.arch"\n' + _model("  output y = x"), "use-path-too-long"),
    "use-device-file": _arch('use "/dev/zero"\n' + _model("  output y = x"), "use-device-file"),
    "ir-input-without-type": _ir("graph @m(B) {\n  %x = input\n  output y = %x\n}\n", "ir-input-without-type"),
    "ir-input-nonpositive-size": _ir("graph @m(B) {\n  %x = input : f32[0,4]\n  output y = %x\n}\n",
                                     "ir-input-nonpositive-size"),
    "lowered-value-names": _ir("graph @m(B) {\n  %x = input : f32[B,4]\n  %y = linear %x {out=3} : f32[B,3]\n"
                               "  output y = %y\n}\n", "lowered-value-names"),
    "ir-string-attr-unescaped": _ir('graph @m(B) {\n  %x = input : f32[B,4]\n'
                                    '  %y = unembed %x {vocab=10, tied="a\\"b"} : f32[B,10]\n  output y = %y\n}\n',
                                    "ir-string-attr-unescaped"),
    "render-quotes-wrong-line": _arch(_model("  # a form feed \x0c in a comment\n  output y = linear(x, 0)"),
                                      "render-quotes-wrong-line"),
    "ir-line-after-form-feed": _ir("graph @m(B) {\n  %x = input : f32[B,4]\x0c\n  %y = bogus %x\n  output y = %x\n}\n",
                                   "ir-line-after-form-feed"),
    "concat-no-operands": _arch(_model("  output y = concat()"), "concat-no-operands"),
    "deep-expression-recursion": _arch(_model("  output y = x" + " + x" * 3000), "deep-expression-recursion"),
    "block-default-recursion": _arch(_model("  block f(x, y=f(x)) { return x }\n  output y = f(x)"),
                                     "block-default-recursion"),
    "repeat-expansion-time": _arch(_model("  block f(z) { return relu(z) }\n  block g(z) { return repeat(1000) f(z) }\n"
                                          "  output y = repeat(1000) g(x)"), "repeat-expansion-time"),
    "ir-dim-recursion": _ir("graph @m(B) {\n  %x = input : f32[" + "(" * 1000 + "B" + ")" * 1000 + ",4]\n"
                            "  output y = %x\n}\n", "ir-dim-recursion"),
    "negative-size": _arch(_model("  output y = slice(x, 0, 5, 2)"), "negative-size"),
    "negative-symbolic-width": _arch(_model("  output y = linear(x, -B)"), "negative-symbolic-width"),
    "huge-exponent-literal": _arch(_model("  const a = 1e999999999\n  output y = x"), "huge-exponent-literal"),
    "huge-power": _arch(_model("  const a = 2 ** 999999999\n  output y = x"), "huge-power"),
    "sqrt-negative": _arch(_model("  const a = sqrt(-1)\n  output y = x"), "sqrt-negative"),
    "sqrt-overflow": _arch(_model("  const a = sqrt(10 ** 400)\n  output y = x"), "sqrt-overflow"),
    "scalar-float-overflow": _arch(_model("  output y = x * 1e400"), "scalar-float-overflow"),
    "int-over-4300-digits": _arch(_model("  output y = linear(x, 1e5000)"), "int-over-4300-digits"),
    "reshape-minus-one-symbolic": _arch("model m(B) {\n  input x: f32[B, 20]\n  output y = reshape(x, [B, 4, -1])\n}\n",
                                        "reshape-minus-one-symbolic"),
    "negation-recursion": _arch(_model("  output y = " + "-" * 3000 + "x"), "negation-recursion"),
    "call-recursion": _arch(_model("  output y = " + "relu(" * 1000 + "x" + ")" * 1000), "call-recursion"),
    "power-recursion": _arch(_model("  const c = 1" + " ** 1" * 1000 + "\n  output y = x"), "power-recursion"),
    "ir-loc-not-an-integer": _ir('graph @m(B) {\n  %x = input : f32[B,4] loc("m.arch":1e5:1)\n  output y = %x\n}\n',
                                 "ir-loc-not-an-integer"),
    "ir-bind-not-an-integer": _ir("graph @m(B) bind(B=1e3) {\n  %x = input : f32[B,4]\n  output y = %x\n}\n",
                                  "ir-bind-not-an-integer"),
    # irc run: nodes sharing a weight key with two shapes read one array (NumPy ValueError, or an output of
    # another width); weight_table now rejects the second node at its location
    "ir-param-same-key": _ir("graph @m(B) {\n  %x = input : f32[B,4]\n"
                             "  %w1 = param {name=weight, shape=[8, 4]} : f32[8,4]\n"
                             "  %h = gemm %x, %w1 {act=none} : f32[B,8]\n"
                             "  %w2 = param {name=weight, shape=[3, 8]} : f32[3,8]\n"
                             "  %y = gemm %h, %w2 {act=none} : f32[B,3]\n  output y = %y\n}\n", "ir-param-same-key"),
    "ir-layers-same-key": _ir("graph @m(B) {\n  %x = input : f32[B,32]\n  %y = linear %x {out=96} : f32[B,96]\n"
                              "  %z = linear %x {out=4} : f32[B,4]\n  output y = %y\n  output z = %z\n}\n",
                              "ir-layers-same-key"),
    "shared-layer-two-widths": _arch("model m(B) {\n  input x: f32[B, 16]\n  input z: f32[B, 32]\n  l = linear(8)\n"
                                     "  output a = l(x)\n  output b = l(z)\n}\n", "shared-layer-two-widths"),
    # IRC-W102 (lint, and the lints analyze prints): at scale=15 and d_k=8, p rounds to 1 and p(1−p) to 0
    "lint-scale-gradient-underflow": _arch(_model("  output y = mha(x, heads=1, scale=15)"),
                                           "lint-scale-gradient-underflow"),
    "ir-sym-recursion": _ir('graph @m(B) {\n  %x = input : f32[B,4]\n  %y = linear %x {out=sym("' + "(" * 1000
                            + '")} : f32[B,4]\n  output y = %y\n}\n', "ir-sym-recursion"),
    # the 100,000-case run of 2026-11-30 (seed 2026)
    "ir-add-norm-scalar": _ir("graph @m(B, T) {\n  %x = input : f32[]\n  %r = input : f32[]\n"
                              "  %s, %n = add_norm %x, %r\n  output y = %n\n}\n", "ir-add-norm-scalar"),
    "attention-symbolic-width-lowering": _arch("model m(B, T) {\n  input x: f32[B, T, B]\n"
                                               "  output y = attention(x, heads=4, causal=true)\n}\n",
                                               "attention-symbolic-width-lowering"),
    "mlp-regions-huge-input": _arch("model m(B) {\n  input image: f32[B, 60129542144]\n"
                                    "  h = relu(linear(image, 300))\n  h = relu(linear(h, 100))\n"
                                    "  output logits = linear(h, 10)\n}\n", "mlp-regions-huge-input"),
    # the second 100,000-case run (seed 1130): nested pools folded into H//10^54, which the IR parser refuses
    "nested-floordiv-past-2-62": _arch("model m(B, H, W) {\n  input image: f32[B, 3, H, W]\n"
                                       "  x = maxpool2d(image, 1e18)\n  x = maxpool2d(x, 1e18)\n"
                                       "  output y = maxpool2d(x, 1e18)\n}\n", "nested-floordiv-past-2-62"),
}
