"""Casts to the narrow float formats, with ONNX's saturation and rounding.

A plain cast is the built-in ``cast`` (``out[...] = a``: numpy's, or
``ml_dtypes``'s conversion for the extension dtypes, rounding to nearest
even). Two targets need more, as ONNX's ``Cast`` defines them:

* ``saturate_cast`` (float8 targets with ``saturate=1``, ONNX's default):
  values beyond the format's largest finite value, infinities included,
  become that value (with their sign); NaN stays NaN. Without saturation a
  plain cast gives NaN (or infinity, for ``float8_e5m2``) instead.
* ``cast_e8m0`` (``float8_e8m0fnu``, a power of two ``2 ** (e - 127)``
  without sign or mantissa): rounding ``up``, ``down`` or to ``nearest``
  on the float32 value's bits, and saturation at ``2 ** 127``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import _jit
from ._common import Array, choice, flag, quiet
from ._kernels import Bindable
from ._library import Attrs, builtin, define

__all__ = ("finite_max",)

Kernel = Callable[..., None]

_E8M0_NAN = 0xFF
_E8M0_MAX = 0xFE


@functools.cache
def finite_max(dtype: np.dtype[Any]) -> float:
    """The largest finite value of the float format ``dtype``.

    ``ml_dtypes`` is imported on first use: only programs that cast to its
    formats need it.
    """
    ml_dtypes = importlib.import_module("ml_dtypes")
    return float(ml_dtypes.finfo(dtype).max)


#: The float8 formats a compiled loop casts float32 to: their exponent's
#: bias, and whether a negative zero keeps its sign (the ``fnuz`` formats
#: have none: their ``0x80`` is NaN).
_FLOAT8 = {
    "float8_e4m3fn": (7, True),
    "float8_e4m3fnuz": (8, False),
    "float8_e5m2": (15, True),
    "float8_e5m2fnuz": (16, False),
}


def _to_float8(  # pragma: no cover - compiled by numba
    x: Any,
    bits: Any,
    out: Any,
    bound: int,
    mant: int,
    bias: int,
    nan_positive: int,
    nan_negative: int,
    signed_zero: bool,
    first: int,
    last: int,
) -> None:
    """``out[i]`` the float8 code of float32 ``x[i]`` (``bits``: its bits),
    saturated at the largest finite value (float32 bits
    ``bound``), rounded to nearest even, ``mant`` mantissa bits and
    exponent bias ``bias``; NaN as ``nan_positive`` or ``nan_negative`` by
    its sign. Selects on int32 lanes, no branches: LLVM vectorises it."""
    i32 = np.int32
    shift = i32(23 - mant)
    half = i32((1 << (22 - mant)) - 1)
    rebias = i32((127 - bias) << mant)
    smallest_normal = i32((128 - bias) << 23)  # the bits of 2 ** (1 - bias)
    limit, infinity = i32(bound), i32(0x7F800000)
    magnitude, one = i32(0x7FFFFFFF), i32(1)
    zero_sign = i32(0x80) if signed_zero else i32(0)
    # a subnormal code counts units of 2 ** (1 - bias - mant)
    scale = np.float32(2.0 ** (bias - 1 + mant))
    magic = np.float32(8388608.0)  # 2 ** 23: adding it rounds to an integer
    positive, negative = i32(nan_positive), i32(nan_negative)
    # (unsigned indices: numba wraps negative signed ones, which stops LLVM
    # vectorising)
    for i in range(np.uint64(first), np.uint64(last)):
        word = i32(bits[i])
        a = word & magnitude
        clamped = a if a < limit else limit  # (NaN's code comes below)
        normal = ((clamped + half + ((clamped >> shift) & one)) >> shift) - rebias
        units = i32((abs(x[i]) * scale + magic) - magic)
        code = normal if clamped >= smallest_normal else units
        signed = word < i32(0)
        sign = (i32(0x80) if code != i32(0) else zero_sign) if signed else i32(0)
        nan = a > infinity
        out[i] = (negative if signed else positive) if nan else code | sign


def _bind_float8(a: Array, out: Array) -> Callable[[], None] | None:
    """The compiled saturating cast of float32 ``a`` into float8 ``out``,
    or ``None`` where it does not apply."""
    spec = _FLOAT8.get(out.dtype.name)
    if spec is None or not _jit.takes_pair(a, out, "float32", out.dtype.name):
        return None
    bias, signed_zero = spec
    ml_dtypes = importlib.import_module("ml_dtypes")
    mant = int(ml_dtypes.finfo(out.dtype).nmant)
    bound = np.float32(finite_max(out.dtype)).view(np.uint32)
    nan_codes = np.array([np.nan, -np.nan], np.float32).astype(out.dtype).view(np.uint8)
    flat = a.reshape(-1)
    arrays = (flat, flat.view(np.uint32), out.reshape(-1).view(np.uint8))
    trailing = (int(bound), mant, bias, *map(int, nan_codes), signed_zero)
    return _jit.bind_rows(
        _jit.compile_kernel(_to_float8),
        (*arrays, *trailing),
        a.size,
        1,
        _SPLIT_ELEMENTS,
    )


#: Elements each part-pool thread casts at least (float8).
_SPLIT_ELEMENTS = 1 << 20


@builtin("saturate_cast")
def _saturate_cast(xp: ModuleType) -> Bindable:
    def saturate_cast(a: Array, out: Array) -> None:
        bound = finite_max(out.dtype)
        with quiet(xp):  # clip keeps NaN; the cast then rounds in range
            out[...] = xp.clip(a, -bound, bound)

    def bind(a: Array, out: Array) -> Callable[[], None]:
        # float32 into the float8 formats: one compiled loop on the bits
        # (ml_dtypes' conversion after a clip: 6.3 us for 4096 floats)
        compiled = _bind_float8(a, out) if xp is np else None
        return compiled or functools.partial(saturate_cast, a, out)

    def call(a: Array, out: Array) -> None:
        bind(a, out)()

    return Bindable(call, bind)


@define("cast_e8m0")
def _cast_e8m0(xp: ModuleType, attrs: Attrs) -> Kernel:
    mode = choice(attrs, "round_mode", ("up", "down", "nearest"))
    saturate = flag(attrs, "saturate")

    def cast_e8m0(a: Array, out: Array) -> None:
        with quiet(xp):  # NaN payloads of narrower floats
            bits = xp.asarray(a, dtype=np.float32).view(np.uint32)
        exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
        special = exponent == _E8M0_NAN  # infinities and NaN
        if mode == "up":
            bump = (bits & 0x7FFFFF) != 0
        elif mode == "nearest":
            # Round half up on the mantissa; a subnormal (exponent 0) needs
            # more than its half bit to round up.
            half = (bits & 0x400000) != 0
            bump = half & (((bits & 0x3FFFFF) != 0) | (exponent > 0))
        else:
            bump = xp.zeros(bits.shape, dtype=bool)
        bump &= ~special
        if saturate:
            bump &= exponent != _E8M0_MAX
        exponent += bump
        exponent[special] = _E8M0_NAN
        out.view(np.uint8)[...] = exponent

    return cast_e8m0
