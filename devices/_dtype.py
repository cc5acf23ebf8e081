"""TVM dtype strings (``"float32"``, ``"int8"``, ``"bool"``) and numpy."""

from __future__ import annotations

import re
from functools import cache

import numpy as np

from .errors import DTypeError

__all__ = ("DTYPES", "dtype_nbytes", "dtype_string", "numpy_dtype")

#: The dtypes every backend stores, by their TVM names.
DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)

_TVM_RE = re.compile(r"^(int|uint|float|bool)(\d+)?(?:x(\d+))?$")


@cache
def _parse(dtype: str) -> tuple[str, int, int]:
    match = _TVM_RE.match(dtype) if isinstance(dtype, str) else None
    if match is None:
        raise DTypeError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    code, bits_text, lanes_text = match.groups()
    bits = int(bits_text) if bits_text else (1 if code == "bool" else 0)
    lanes = int(lanes_text) if lanes_text else 1
    valid_bits = {
        "int": (8, 16, 32, 64),
        "uint": (1, 8, 16, 32, 64),
        "float": (16, 32, 64),
        "bool": (1, 8),
    }[code]
    if bits not in valid_bits or lanes < 1:
        raise DTypeError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    return code, bits, lanes


def dtype_nbytes(dtype: str) -> int:
    """Bytes per element as TVM computes them: ``(bits * lanes + 7) // 8``.

    :raises DTypeError: if the dtype string is not a TVM dtype.
    """
    _, bits, lanes = _parse(dtype)
    return (bits * lanes + 7) // 8


@cache
def numpy_dtype(dtype: str | np.dtype[np.generic]) -> np.dtype[np.generic]:
    """The numpy dtype for a TVM dtype string (or a numpy dtype, checked).

    :raises DTypeError: for dtypes numpy cannot hold (vector lanes, bfloat16,
        sub-byte integers other than bool).
    """
    if isinstance(dtype, np.dtype):
        return numpy_dtype(dtype_string(dtype))
    code, bits, lanes = _parse(dtype)
    if lanes != 1:
        raise DTypeError(f"vector dtype {dtype!r} has no numpy equivalent")
    if code == "bool" or (code == "uint" and bits == 1):
        return np.dtype(np.bool_)
    if code == "uint" and bits == 1:
        raise DTypeError(f"dtype {dtype!r} has no numpy equivalent")
    return np.dtype(f"{code}{bits}")


def dtype_string(dtype: object) -> str:
    """The TVM dtype string for a numpy dtype (or anything numpy accepts).

    :raises DTypeError: for dtypes asyncrt does not store.
    """
    try:
        np_dtype = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise DTypeError(f"unknown dtype {dtype!r}") from exc
    name = "bool" if np_dtype == np.bool_ else np_dtype.name
    if name not in DTYPES:
        raise DTypeError(f"dtype {np_dtype} is not supported; expected one of {DTYPES}")
    return name
