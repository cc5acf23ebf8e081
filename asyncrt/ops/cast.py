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

from ._common import Array, choice, flag, quiet
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


@builtin("saturate_cast")
def _saturate_cast(xp: ModuleType) -> Kernel:
    def saturate_cast(a: Array, out: Array) -> None:
        bound = finite_max(out.dtype)
        with quiet(xp):  # clip keeps NaN; the cast then rounds in range
            out[...] = xp.clip(a, -bound, bound)

    return saturate_cast


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
