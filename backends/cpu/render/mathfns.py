"""Scalar float32 functions that vectorise: exp, tanh, erf as polynomials and rationals.

Numba calls libm for ``np.exp``/``np.tanh``/``math.erf``: one scalar call per element,
which LLVM cannot vectorise (2–17 ns an element here). These are plain arithmetic and
selects, so loops over them vectorise (≈0.4 ns an element):
- ``fexp``: Cody–Waite reduction to r ∈ [−ln2/2, ln2/2], a degree-6 polynomial, and 2^k
  put into the exponent bits (Cephes' ``expf`` coefficients; relative error < 1e-7);
  below −87 it returns exactly 0 (masked scores), NaN stays NaN;
- ``ftanh`` and ``ferf``: Eigen's rational approximations (``generic_fast_tanh_float``,
  ``generic_fast_erf_float``), absolute error < 5e-7.
Each is emitted into the generated module when a kernel uses it.
"""

from __future__ import annotations

from irc.backends.common.kernel import ModuleParts

DEVICE_JIT = '@njit(cache=True, error_model="numpy")'

F32_FROM_BITS = '''\
@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose IEEE-754 bits are the int32 ``bits`` (2^k for exp, without a table)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())
    return numba_types.float32(numba_types.int32), codegen
'''

FEXP = '''\
{jit}
def fexp(v):
    """exp(v) in float32 arithmetic that vectorises."""
    w = v if v > np.float32(-87.0) else np.float32(-87.0)
    w = w if w < np.float32(88.0) else np.float32(88.0)
    k = np.floor(w * np.float32(1.4426950408889634) + np.float32(0.5))
    r = w - k * np.float32(0.693359375) + k * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    e = p * f32_from_bits((np.int32(k) + np.int32(127)) << 23)
    if v > np.float32(-87.0):
        return e
    return np.float32(0.0) if v <= np.float32(-87.0) else v  # -87 and below: 0; NaN: NaN
'''

FTANH = '''\
{jit}
def ftanh(v):
    """tanh(v): Eigen's 13/6 rational approximation, clamped where tanh is ±1 in float32."""
    x = v if v > np.float32(-7.90531110763549805) else np.float32(-7.90531110763549805)
    x = x if x < np.float32(7.90531110763549805) else np.float32(7.90531110763549805)
    x2 = x * x
    p = np.float32(-2.76076847742355e-16)
    p = p * x2 + np.float32(2.00018790482477e-13)
    p = p * x2 + np.float32(-8.60467152213735e-11)
    p = p * x2 + np.float32(5.12229709037114e-08)
    p = p * x2 + np.float32(1.48572235717979e-05)
    p = p * x2 + np.float32(6.37261928875436e-04)
    p = p * x2 + np.float32(4.89352455891786e-03)
    q = np.float32(1.19825839466702e-06)
    q = q * x2 + np.float32(1.18534705686654e-04)
    q = q * x2 + np.float32(2.26843463243900e-03)
    q = q * x2 + np.float32(4.89352518554385e-03)
    return p * x / q if v == v else v  # NaN stays NaN (the clamps would turn it into -1)
'''

FERF = '''\
{jit}
def ferf(v):
    """erf(v): Eigen's rational approximation, clamped at ±4 (where erf is ±1 in float32)."""
    x = v if v > np.float32(-4.0) else np.float32(-4.0)
    x = x if x < np.float32(4.0) else np.float32(4.0)
    x2 = x * x
    p = np.float32(-2.72614225801306e-10)
    p = p * x2 + np.float32(2.77068142495902e-08)
    p = p * x2 + np.float32(-2.10102402082508e-06)
    p = p * x2 + np.float32(-5.69250639462346e-05)
    p = p * x2 + np.float32(-7.34990630326855e-04)
    p = p * x2 + np.float32(-2.95459980854025e-03)
    p = p * x2 + np.float32(-1.60960333262415e-02)
    q = np.float32(-1.45660718464996e-05)
    q = q * x2 + np.float32(-2.13374055278905e-04)
    q = q * x2 + np.float32(-1.68282697438203e-03)
    q = q * x2 + np.float32(-7.37332916720468e-03)
    q = q * x2 + np.float32(-1.42647390514189e-02)
    return p * x / q if v == v else v  # NaN stays NaN
'''

SOURCES = {
    "f32_from_bits": F32_FROM_BITS,
    "fexp": FEXP.format(jit=DEVICE_JIT),
    "ftanh": FTANH.format(jit=DEVICE_JIT),
    "ferf": FERF.format(jit=DEVICE_JIT),
}
NEEDS = {"fexp": ("f32_from_bits",)}


def use(parts: ModuleParts, name: str) -> str:
    """Register device function ``name`` (and what it calls) in the module; return its name."""
    for dep in NEEDS.get(name, ()):
        use(parts, dep)
    return parts.device(name, SOURCES[name])


def uses_in(expr: str) -> list[str]:
    """The device functions an expression calls."""
    return [name for name in ("fexp", "ftanh", "ferf") if f"{name}(" in expr]
