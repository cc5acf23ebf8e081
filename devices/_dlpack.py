"""DLPack for the narrow dtypes numpy cannot exchange (bfloat16, float8).

numpy's DLPack exports and imports integers, floats and complex numbers
only, yet DLPack v1.1 gives ``bfloat16`` (``kDLBfloat``) and the float8
formats (``kDLFloat8_e4m3fn`` ...) codes of their own. An array of one of
them crosses DLPack as an unsigned integer *carrier* of the same width:

* export: numpy exports a ``uint8``/``uint16`` view of the data, and the
  capsule's ``DLDataType`` is rewritten to the real code before anyone
  consumes it (the capsule is ours until it is handed over);
* import: a producer's capsule of such a code is rewritten to the carrier,
  numpy imports that (zero copy), and the result is viewed as the
  ``ml_dtypes`` dtype.

The capsules are read through their C layout (``DLManagedTensor`` or
``DLManagedTensorVersioned``, named ``"dltensor"`` and
``"dltensor_versioned"``). Sub-byte dtypes (``int4``, ``float4_e2m1fn``,
...) are refused: DLPack packs them, asyncrt stores one per byte.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ._dtype import numpy_dtype
from .errors import UnsupportedOperationError

__all__ = ("CODES", "export_narrow", "import_narrow")

#: The narrow dtypes DLPack has codes for: name -> (code, bits).
CODES: dict[str, tuple[int, int]] = {
    "bfloat16": (4, 16),
    "float8_e4m3fn": (10, 8),
    "float8_e4m3fnuz": (11, 8),
    "float8_e5m2": (12, 8),
    "float8_e5m2fnuz": (13, 8),
    "float8_e8m0fnu": (14, 8),
}
_NAMES = {code: name for name, code in CODES.items()}
_KDLUINT = 1
_CARRIERS: dict[int, np.dtype[Any]] = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16)}


class _DLDataType(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
    )


class _DLTensorHead(ctypes.Structure):
    """The leading fields of ``DLTensor``, up to its dtype."""

    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
    )


class _VersionedHead(ctypes.Structure):
    """``DLManagedTensorVersioned`` up to its ``DLTensor``."""

    _fields_ = (
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
    )


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = (ctypes.py_object,)
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)


def _dtype_field(capsule: Any) -> _DLDataType:
    """The ``DLDataType`` of an unconsumed DLPack capsule, writable in place.

    :raises UnsupportedOperationError: if ``capsule`` is no DLPack capsule.
    """
    try:
        name = _get_name(capsule)
        address = _get_pointer(capsule, name)
    except (TypeError, ValueError) as exc:
        raise UnsupportedOperationError(f"not a DLPack capsule: {exc}") from exc
    if name == b"dltensor_versioned":
        address += ctypes.sizeof(_VersionedHead)
    elif name != b"dltensor":
        raise UnsupportedOperationError(f"not a DLPack capsule: named {name!r}")
    field: _DLDataType = _DLTensorHead.from_address(address).dtype
    return field


def export_narrow(host: np.ndarray[Any, Any], *args: Any, **kwargs: Any) -> Any:
    """A DLPack capsule of ``host``, an array of a narrow dtype, with its
    DLPack code (``array.__dlpack__``'s arguments pass through to numpy).

    :raises UnsupportedOperationError: if DLPack has no code for the dtype.
    """
    found = CODES.get(host.dtype.name)
    if found is None:
        raise UnsupportedOperationError(
            f"DLPack cannot carry {host.dtype.name} arrays: it packs sub-byte "
            f"dtypes, asyncrt stores one element per byte; cast it first"
        )
    code, bits = found
    capsule = host.view(_CARRIERS[bits]).__dlpack__(*args, **kwargs)
    _dtype_field(capsule).code = code
    return capsule


class _Carrier:
    """A capsule presented to ``numpy.from_dlpack``."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: only host tensors come here


def import_narrow(tensor: Any, refusal: Exception) -> np.ndarray[Any, Any]:
    """A host DLPack tensor of a narrow dtype (bfloat16, float8) as a numpy
    array of its ``ml_dtypes`` dtype, without a copy.

    :param tensor: the DLPack tensor numpy refused.
    :param refusal: numpy's error, reported if the dtype is not a narrow one.
    :raises UnsupportedOperationError: if the tensor is not of a narrow
        dtype (numpy's refusal stands).
    """
    try:
        capsule = tensor.__dlpack__(max_version=(1, 1))
    except TypeError:  # a producer older than DLPack 1.0's keywords
        capsule = tensor.__dlpack__()
    dtype = _dtype_field(capsule)
    name = _NAMES.get((dtype.code, dtype.bits))
    if name is None or dtype.lanes != 1:
        raise UnsupportedOperationError(
            f"cannot import the DLPack tensor (dtype code={dtype.code}, "
            f"bits={dtype.bits}, lanes={dtype.lanes}): {refusal}"
        ) from refusal
    dtype.code = _KDLUINT
    carrier: np.ndarray[Any, Any] = np.from_dlpack(_Carrier(capsule))
    return carrier.view(numpy_dtype(name))
