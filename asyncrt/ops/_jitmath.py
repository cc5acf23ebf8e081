"""Scalar float32 functions for compiled fused kernels, as source text.

:mod:`asyncrt.ops._jitfuse` pastes :data:`SOURCE` into every module it
generates, so a fused kernel calls these as inlined numba functions. Each
is written so that LLVM vectorises the loop that calls it (no libm call,
no branch that is not a select), without fast-math:

* ``relu_``, ``max_``, ``min_``: numpy's ``maximum``/``minimum`` (NaN in,
  NaN out; ``maximum(-0., 0)`` is -0.), bit for bit.
* ``sqrth_``: the library's ``power_half`` (``pow(x, 0.5)``: ``sqrt``, but
  +0 at -0 and +inf at -inf), bit for bit (both round the square root
  correctly).
* ``hswish_``, ``hsig_``: the library's ``hard_swish`` (``x * clip(x / 6
  + 0.5, 0, 1)`` in float32) and ``hard_sigmoid``, bit for bit.
* ``gelu_erf_``, ``gelu_tanh_``: the library's ``gelu`` (exact and tanh
  forms), the same operations in the same order over ``erf_``/``tanh_``,
  bit for bit (the library's float32 GELU is this loop where numba is
  installed).
* ``erf_``: Eigen's float32 ``erf``, the rational approximation of
  :func:`asyncrt.ops._builtin.bind_erf_float32` with the same operations in
  the same order, so bit for bit the library's ``erf`` of float32 arrays
  (with numba, every size is this loop; without it, arrays of up to
  ``SCIPY_SMALL_FLOAT32`` elements take scipy's, within 4.5e-7 of it).
* ``tanh_``: Cephes' ``tanhf``: an odd degree-11 polynomial below 0.625;
  above, ``(1 - e) / (1 + e)`` with ``e = e^-2|x|`` from ``exp_``'s
  reduction and polynomial (``exp_parts_``), its power of two one factor
  (past 10, computed at 10: float32 tanh is +-1 from 9.01 on). Within 2
  ulps of the exact tanh (1.5 in a sample of 2^26 floats: numpy's SIMD
  tanh is within 1.4), odd, NaN in, NaN out, zeros keep their sign: 0.49
  ns an element on the AVX-512 VM against numpy's 0.38 (Eigen's rational
  approximation, used before, took 0.33 but was 4.5-7 ulps off near 6).
  The library's float32 ``tanh`` is this loop (split over the threads
  where large), so fused chains over it stay bit for bit.
* ``exp_``: Cephes' float32 ``expf`` (a two-part ln 2 range reduction and
  a degree-5 polynomial), 2^n made from exponent bits in two factors so
  that results reach the subnormals: within 1 ulp of the exact exp (numpy's
  SIMD exp is within 2), +inf past 88.72, 0 below -103.97, NaN in, NaN out.
  Its multiply-adds are ``muladd_`` (LLVM's ``fmuladd``: fused where the CPU
  has FMA, one rounding instead of two, so results differ in the last bit
  from a CPU without it, 1.5% of them, still within 1 ulp): 0.35 ns an
  element on the AVX-512 VM, against 0.47 unfused and numpy's 0.47. The
  other functions keep separate products and sums, as the numpy passes
  they equal bit for bit.
* ``expm1_``: ``e^x - 1``: Taylor's polynomial to ``x^8 / 8!`` where
  ``|x| < 1/2`` (where ``exp_(x) - 1`` cancels), ``exp_(x) - 1`` elsewhere:
  within 3 ulps of the exact result, -1 at -inf, zeros keep their sign.
  The ELUs are one loop over it (0.5 ns an element against 0.9 for a
  compiled pass, numpy's ``expm1`` and another pass).
* ``softplus_``: ``max(x, 0) + log1p(exp_(-|x|))``, the library's passes'
  formula, with ``log1p`` on ``[0, 1]`` as ``2 atanh(y / (2 + y))`` (a
  series in ``s^2 <= 1/9``: no ``1 + y`` that drops a tiny ``y``'s bits):
  within 3 ulps of the exact result, as the numpy passes are.
* ``sigmoid_``, ``mish_``: the library's float32 ``sigmoid`` and ``mish``
  (their numpy passes' operations in order over ``exp_``; where numba is
  installed these loops are those kernels): sigmoid within 2 ulps of the
  exact result wherever it is normal (below, both flush to 0, as the
  float32 formula does). A Cephes ``logf`` written the same way ran at 0.75
  ns an element against numpy's 0.47: the library keeps numpy's ``log``
  and ``log1p`` (softplus needs only ``log1p`` on ``[0, 1]``, above).

numba calls libm one element at a time for ``exp`` and the rest (10-60x
slower than these), so the library's float32 ``exp`` and ``tanh`` are
``exp_`` and ``tanh_`` loops (:mod:`asyncrt.ops._builtin`), and ``log``
and the trigonometric ops keep numpy's SIMD ufuncs (a chain with one of
them keeps the numpy engine).
"""

from __future__ import annotations

__all__ = ("FUNCTIONS", "KERNEL", "SOURCE", "head")

#: The helpers' names.
FUNCTIONS = (
    "relu_",
    "sqrth_",
    "max_",
    "min_",
    "hswish_",
    "hsig_",
    "erf_",
    "tanh_",
    "gelu_erf_",
    "gelu_tanh_",
    "exp_parts_",
    "exp_",
    "exp_nonpositive_",
    "exp_bounded_",
    "sigmoid_",
    "mish_",
    "expm1_",
    "softplus_",
)

SOURCE = """
from llvmlite import ir as _ir
from numba import types as _types
from numba.extending import intrinsic as _intrinsic

_F = np.float32
_ZERO = _F(0.0)
_INF = _F(np.inf)
_ONE = _F(1.0)
_SIXTH = _F(1 / 6)
_HALF = _F(0.5)
_FOUR = _F(4.0)
_P = (
    _F(-2.72614225801306e-10),
    _F(2.77068142495902e-08),
    _F(-2.10102402082508e-06),
    _F(-5.69250639462346e-05),
    _F(-7.34990630326855e-04),
    _F(-2.95459980854025e-03),
    _F(-1.60960333262415e-02),
)
_Q = (
    _F(-1.45660718464996e-05),
    _F(-2.13374055278905e-04),
    _F(-1.68282697438203e-03),
    _F(-7.37332916720468e-03),
    _F(-1.42647390514189e-02),
)
_RSQRT2 = _F(0.7071067811865476)
_GELU_CUBIC = _F(0.044715)
_GELU_SCALE = _F(0.7978845608028654)
# float32 tanh is +-1 from 9.01 on: past this, compute at it
_TANH_CLAMP = _F(10.0)
# below this, Cephes' odd polynomial; above, the formula over e^-2|x|
_TANH_SMALL = _F(0.625)
_TANH_P = (
    _F(-5.70498872745e-3),
    _F(2.06390887954e-2),
    _F(-5.37397155531e-2),
    _F(1.33314422036e-1),
    _F(-3.33332819422e-1),
)
_I = np.int32
_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
# past these exp is +inf, 0
_EXP_HI = _F(88.72283935546875)
_EXP_LO = _F(-103.97208404541015625)
# below this e^x is subnormal in float32 (exp_nonpositive_ makes it 0)
_EXP_FLUSH = _F(-87.0)
_EXP_P = (
    _F(1.9875691500e-4),
    _F(1.3981999507e-3),
    _F(8.3334519073e-3),
    _F(4.1665795894e-2),
    _F(1.6666665459e-1),
    _F(5.0000001201e-1),
)
_TWO = _F(2.0)
_MISH_CLAMP = _F(20.0)
# e^x - 1 = x + x^2 (1/2 + x (1/6 + ...)): Taylor's terms to x^8 / 8!
_EXPM1_T = tuple(_F(1 / f) for f in (40320, 5040, 720, 120, 24, 6, 2))
# log(1 + y) = 2 atanh(s), s = y / (2 + y): 2 s (1 + s^2 / 3 + s^4 / 5 ...)
_ATANH_T = tuple(_F(1 / f) for f in (13, 11, 9, 7, 5, 3))


@numba.njit(inline="always", error_model="numpy")
def relu_(x):
    return _ZERO if x < _ZERO else x


@numba.njit(inline="always", error_model="numpy")
def sqrth_(x):
    # pow(x, 0.5): the square root, but +0 at -0 and +inf at -inf
    return _INF if x == -_INF else np.sqrt(x) + _ZERO


@numba.njit(inline="always", error_model="numpy")
def max_(a, b):
    return a if (a >= b or a != a) else b


@numba.njit(inline="always", error_model="numpy")
def min_(a, b):
    return a if (a <= b or a != a) else b


@numba.njit(inline="always", error_model="numpy")
def hswish_(x):
    t = x * _SIXTH + _HALF
    t = _ZERO if t < _ZERO else t
    t = _ONE if t > _ONE else t
    return x * t


@_intrinsic
def muladd_(typingctx, a, b, c):
    # a * b + c, fused where the CPU has FMA (LLVM's fmuladd: one rounding),
    # else a product and a sum
    if not a == b == c == _types.float32:
        return None

    def codegen(context, builder, signature, args):
        f32 = args[0].type
        kind = _ir.FunctionType(f32, [f32, f32, f32])
        fused = builder.module.declare_intrinsic("llvm.fmuladd", [f32], kind)
        return builder.call(fused, args)

    return _types.float32(a, b, c), codegen


@numba.njit(inline="always", error_model="numpy")
def erf_(a):
    x = _FOUR if a > _FOUR else a
    x = -_FOUR if x < -_FOUR else x
    x2 = x * x
    den = x2 * _Q[0] + _Q[1]
    den = den * x2 + _Q[2]
    den = den * x2 + _Q[3]
    den = den * x2 + _Q[4]
    num = x2 * _P[0] + _P[1]
    num = num * x2 + _P[2]
    num = num * x2 + _P[3]
    num = num * x2 + _P[4]
    num = num * x2 + _P[5]
    num = num * x2 + _P[6]
    return num * x / den


@numba.njit(inline="always", error_model="numpy")
def hsig_(x, alpha, beta):
    t = x * alpha + beta
    t = _ZERO if t < _ZERO else t
    return _ONE if t > _ONE else t


@numba.njit(inline="always", error_model="numpy")
def gelu_erf_(x):
    return ((erf_(x * _RSQRT2) + _ONE) * _HALF) * x


@numba.njit(inline="always", error_model="numpy")
def exp_parts_(x):
    # Cephes' expf: e^x = 2^n e^r, |r| <= ln2 / 2, r by a two-part ln 2;
    # (e^r, n), products and sums fused where the CPU can (muladd_)
    n = np.floor(muladd_(x, _LOG2E, _HALF))
    r = muladd_(-n, _LN2_HI, x)
    r = muladd_(-n, _LN2_LO, r)
    p = muladd_(_EXP_P[0], r, _EXP_P[1])
    p = muladd_(p, r, _EXP_P[2])
    p = muladd_(p, r, _EXP_P[3])
    p = muladd_(p, r, _EXP_P[4])
    p = muladd_(p, r, _EXP_P[5])
    return muladd_(p, r * r, r) + _ONE, n


@numba.njit(inline="always", error_model="numpy")
def exp_(v):
    # below _EXP_LO the result is 0: compute with 0 instead, as clamping
    # there would make subnormal products, 100-cycle microcode assists on
    # every masked attention score
    x = _EXP_HI if v > _EXP_HI else v
    x = _ZERO if x < _EXP_LO else x
    y, n = exp_parts_(x)
    # 2^n as two factors built from exponent bits: n reaches -150 (the
    # subnormal results) and 128, past one float's exponent range
    k = _I(n)
    half = k >> 1
    y = y * _I((half + 127) << 23).view(_F) * _I((k - half + 127) << 23).view(_F)
    y = _INF if v > _EXP_HI else y
    y = _ZERO if v < _EXP_LO else y
    return v if v != v else y


@numba.njit(inline="always", error_model="numpy")
def exp_nonpositive_(v):
    # exp_ for v <= 0 or NaN (a softmax's value less its row's maximum):
    # below _EXP_FLUSH 0 (a subnormal's products are microcode assists, and
    # beside the row's e^0 it is nothing), so 2^n is one normal factor and
    # nothing overflows; exp_'s bits everywhere else
    flushed = v < _EXP_FLUSH
    y, n = exp_parts_(_ZERO if flushed else v)
    y = _ZERO if flushed else y * _I((_I(n) + 127) << 23).view(_F)
    return v if v != v else y


@numba.njit(inline="always", error_model="numpy")
def exp_bounded_(v):
    # exp_ for |v| <= 64 (a softmax's unshifted values): 2^n is one normal
    # factor and no clamp applies; exp_'s bits
    y, n = exp_parts_(v)
    return y * _I((_I(n) + 127) << 23).view(_F)


@numba.njit(inline="always", error_model="numpy")
def tanh_(v):
    # Cephes' tanhf: an odd polynomial below 0.625; above, tanh |v| =
    # (1 - e) / (1 + e), e = e^-2|v| (no cancellation: e <= 0.29, and
    # 2^n is one factor, n >= -29); both computed, one selected
    a = abs(v)
    a = _TANH_CLAMP if a > _TANH_CLAMP else a
    z = v * v
    p = muladd_(z, _TANH_P[0], _TANH_P[1])
    p = muladd_(z, p, _TANH_P[2])
    p = muladd_(z, p, _TANH_P[3])
    p = muladd_(z, p, _TANH_P[4])
    small = muladd_(p * z, v, v)
    e, n = exp_parts_(-(a + a))
    e = e * _I((_I(n) + 127) << 23).view(_F)
    big = (_ONE - e) / (_ONE + e)
    big = big if v >= _ZERO else -big
    r = small if a < _TANH_SMALL else big
    # zeros keep their sign (NaN goes through both branches as NaN)
    return v if v == _ZERO else r


@numba.njit(inline="always", error_model="numpy")
def gelu_tanh_(x):
    t = (((x * x) * _GELU_CUBIC + _ONE) * x) * _GELU_SCALE
    return ((tanh_(t) + _ONE) * _HALF) * x


@numba.njit(inline="always", error_model="numpy")
def sigmoid_(x):
    return _ONE / (_ONE + exp_(-x))


@numba.njit(inline="always", error_model="numpy")
def expm1_(x):
    # Below |x| = 1/2, where e^x - 1 cancels, Taylor's polynomial (the next
    # term is 0.3 ulp); exp_ minus one elsewhere. Zeros keep their sign.
    p = x * _EXPM1_T[0] + _EXPM1_T[1]
    p = p * x + _EXPM1_T[2]
    p = p * x + _EXPM1_T[3]
    p = p * x + _EXPM1_T[4]
    p = p * x + _EXPM1_T[5]
    p = p * x + _EXPM1_T[6]
    small = (p * x) * x + x
    y = small if abs(x) < _HALF else exp_(x) - _ONE
    return x if x == _ZERO else y


@numba.njit(inline="always", error_model="numpy")
def log1p_unit_(y):
    # log(1 + y) for y in [0, 1]: s = y / (2 + y) is at most 1/3 and exact
    # to rounding for tiny y (no 1 + y that drops y's bits); the series'
    # next term is 0.24 ulp
    s = y / (y + _TWO)
    z = s * s
    p = z * _ATANH_T[0] + _ATANH_T[1]
    p = p * z + _ATANH_T[2]
    p = p * z + _ATANH_T[3]
    p = p * z + _ATANH_T[4]
    p = p * z + _ATANH_T[5]
    return (s + s) * (p * z) + (s + s)


@numba.njit(inline="always", error_model="numpy")
def softplus_(x):
    # log(1 + e^x) = max(x, 0) + log(1 + e^-|x|), as the library's passes
    return max_(x, _ZERO) + log1p_unit_(exp_(-abs(x)))


@numba.njit(inline="always", error_model="numpy")
def mish_(x):
    # x tanh(log(1 + e^x)) = x n / (n + 2), n = e^x (e^x + 2), e^x clamped
    # where the ratio is 1 anyway (the library's numpy passes, in order)
    e = exp_(min_(x, _MISH_CLAMP))
    n = (e + _TWO) * e
    return x * (n / (n + _TWO))
"""


#: The decorator of a generated kernel: cached on disk, without the GIL,
#: IEEE results (no ZeroDivisionError), no bounds checks.
KERNEL = "@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)"


def head(helpers: str = SOURCE) -> list[str]:
    """The first lines of a generated kernel module: its imports, then
    ``helpers`` (by default these scalar functions)."""
    return ["import numba", "import numpy as np", helpers, ""]
