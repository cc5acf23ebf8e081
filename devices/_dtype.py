"""TVM dtype strings (``"float32"``, ``"int8"``, ``"bool"``) and numpy.

Besides numpy's own dtypes (:data:`DTYPES`), host arrays hold the narrow
formats of machine learning through ``ml_dtypes``, the library made for
these numpy dtype extensions (:data:`EXTENSION_DTYPES`): ``bfloat16``, the
float8 variants, ``float4_e2m1fn`` and the 4- and 2-bit integers. Their
names are TVM's (and ``ml_dtypes``'s); each element takes one byte or two
(a 4-bit value sits in the low bits of its own byte, as ``ml_dtypes`` stores
it), so ``dtype_nbytes`` is their itemsize as for every other dtype.
``ml_dtypes`` is imported on first use of one of them.
"""

from __future__ import annotations

import importlib
import re
from functools import cache

import numpy as np

from .errors import DTypeError

__all__ = (
    "DTYPES",
    "EXTENSION_DTYPES",
    "dtype_nbytes",
    "dtype_string",
    "is_extension",
    "numpy_dtype",
)

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

#: The narrow dtypes host (numpy) arrays store through ``ml_dtypes``, by
#: their TVM names (``ml_dtypes``'s type names too), and their bits.
_EXTENSIONS: dict[str, int] = {
    "bfloat16": 16,
    "float8_e4m3fn": 8,
    "float8_e4m3fnuz": 8,
    "float8_e5m2": 8,
    "float8_e5m2fnuz": 8,
    "float8_e8m0fnu": 8,
    "float4_e2m1fn": 4,
    "int4": 4,
    "uint4": 4,
    "int2": 2,
    "uint2": 2,
}
EXTENSION_DTYPES: tuple[str, ...] = tuple(_EXTENSIONS)
_ALL = (*DTYPES, *EXTENSION_DTYPES)
_NUMPY = frozenset(DTYPES)

_TVM_RE = re.compile(r"^(int|uint|float|bool)(\d+)?(?:x(\d+))?$")
_EXTENSION_RE = re.compile(r"^([a-z0-9_]+?)(?:x(\d+))?$")


@cache
def _parse(dtype: str) -> tuple[str, int, int]:
    if isinstance(dtype, str):
        extension = _EXTENSION_RE.match(dtype)
        if extension is not None and extension.group(1) in _EXTENSIONS:
            name, lanes_text = extension.groups()
            lanes = int(lanes_text) if lanes_text else 1
            if lanes >= 1:
                return name, _EXTENSIONS[name], lanes
    match = _TVM_RE.match(dtype) if isinstance(dtype, str) else None
    if match is None:
        raise DTypeError(f"unknown dtype {dtype!r}; expected one of {_ALL}")
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
        raise DTypeError(f"unknown dtype {dtype!r}; expected one of {_ALL}")
    return code, bits, lanes


def dtype_nbytes(dtype: str) -> int:
    """Bytes per element as TVM computes them: ``(bits * lanes + 7) // 8``
    (one byte for a 4-bit element: asyncrt does not pack them).

    :raises DTypeError: if the dtype string is not a TVM dtype.
    """
    _, bits, lanes = _parse(dtype)
    return (bits * lanes + 7) // 8


def is_extension(dtype: str) -> bool:
    """Whether ``dtype`` is one of :data:`EXTENSION_DTYPES` (stored by host
    arrays through ``ml_dtypes``, not by every backend)."""
    return dtype in _EXTENSIONS


@cache
def numpy_dtype(dtype: str | np.dtype[np.generic]) -> np.dtype[np.generic]:
    """The numpy dtype for a TVM dtype string (or a numpy dtype, checked).

    :raises DTypeError: for dtypes numpy cannot hold (vector lanes, sub-byte
        integers other than bool and those of ``ml_dtypes``).
    """
    if isinstance(dtype, np.dtype):
        return numpy_dtype(dtype_string(dtype))
    code, bits, lanes = _parse(dtype)
    if lanes != 1:
        raise DTypeError(f"vector dtype {dtype!r} has no numpy equivalent")
    if code in _EXTENSIONS:
        scalar_type: type[np.generic] = getattr(
            importlib.import_module("ml_dtypes"), code
        )
        return np.dtype(scalar_type)
    if code == "bool" or (code == "uint" and bits == 1):
        return np.dtype(np.bool_)
    return np.dtype(f"{code}{bits}")


def dtype_string(dtype: object) -> str:
    """The TVM dtype string for a numpy dtype (or anything numpy accepts).

    :raises DTypeError: for dtypes asyncrt does not store.
    """
    if isinstance(dtype, str) and dtype in _EXTENSIONS:
        return dtype  # numpy knows these names only once ml_dtypes is imported
    try:
        np_dtype = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise DTypeError(f"unknown dtype {dtype!r}") from exc
    name = "bool" if np_dtype == np.bool_ else np_dtype.name
    if name in _NUMPY or (
        name in _EXTENSIONS and np_dtype.type.__module__ == "ml_dtypes"
    ):
        return name
    raise DTypeError(f"dtype {np_dtype} is not supported; expected one of {_ALL}")
