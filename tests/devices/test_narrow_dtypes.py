"""The narrow dtypes of ml_dtypes: names, NDArray storage, DLPack."""

from __future__ import annotations

import ctypes
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from asyncrt import nd
from devices import EXTENSION_DTYPES, Device, dtype_nbytes, dtype_string, numpy_dtype
from devices._dlpack import _dtype_field
from devices.errors import DTypeError, UnsupportedOperationError

CPU, SIM0 = Device("cpu"), Device("sim", 0)


def _sample(dtype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray[Any, Any]:
    values = np.arange(int(np.prod(shape)), dtype=np.float32) % 3
    if not dtype.startswith("uint") and dtype != "float8_e8m0fnu":
        values -= 1
    if dtype == "float8_e8m0fnu":
        values += 1
    return values.reshape(shape).astype(numpy_dtype(dtype))


@pytest.mark.parametrize("dtype", EXTENSION_DTYPES)
def test_names_are_tvm_and_ml_dtypes_names(dtype: str) -> None:
    np_dtype = numpy_dtype(dtype)
    assert np_dtype == np.dtype(getattr(ml_dtypes, dtype))
    assert dtype_string(np_dtype) == dtype == dtype_string(dtype)
    assert dtype_nbytes(dtype) == np_dtype.itemsize  # sub-byte: one byte each


def test_vector_lanes_and_unknown_names_are_refused() -> None:
    assert dtype_nbytes("bfloat16x4") == 8
    with pytest.raises(DTypeError, match="vector dtype 'bfloat16x4'"):
        numpy_dtype("bfloat16x4")
    with pytest.raises(DTypeError, match="'float8_e4m3'"):
        numpy_dtype("float8_e4m3")
    with pytest.raises(DTypeError, match="'int3'"):
        dtype_nbytes("int3")


@pytest.mark.parametrize("dtype", EXTENSION_DTYPES)
@pytest.mark.parametrize("device", [CPU, SIM0])
def test_ndarray_stores_them(dtype: str, device: Device) -> None:
    data = _sample(dtype)
    arr = nd.array(data, device)
    assert arr.dtype == dtype and arr.nbytes == data.nbytes
    back = arr.numpy()
    assert back.dtype == data.dtype
    assert back.tobytes() == data.tobytes()
    empty = nd.empty((4,), dtype, device)
    assert empty.numpy().dtype == data.dtype


def test_host_data_is_cast_into_a_narrow_array() -> None:
    arr = nd.empty((3,), "bfloat16", CPU)
    arr.copyfrom(np.array([1.0, 2.5, -3.0], dtype=np.float32))
    assert arr.numpy().astype(np.float32).tolist() == [1.0, 2.5, -3.0]


class _Producer:
    """A DLPack producer that is not an NDArray (as torch or jax would be)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.source.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.source.__dlpack_device__()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("dtype", "code", "bits"),
    [
        ("bfloat16", 4, 16),
        ("float8_e4m3fn", 10, 8),
        ("float8_e4m3fnuz", 11, 8),
        ("float8_e5m2", 12, 8),
        ("float8_e5m2fnuz", 13, 8),
        ("float8_e8m0fnu", 14, 8),
    ],
)
def test_dlpack_carries_bfloat16_and_float8_codes(
    dtype: str, code: int, bits: int
) -> None:
    arr = nd.array(_sample(dtype), CPU)
    for capsule in (arr.__dlpack__(), arr.__dlpack__(max_version=(1, 0))):
        field = _dtype_field(capsule)
        assert (field.code, field.bits, field.lanes) == (code, bits, 1)
    back = nd.from_dlpack(_Producer(arr))
    assert back.dtype == dtype
    assert back.numpy().tobytes() == arr.numpy().tobytes()
    # zero copy, both ways
    assert back.backend_array().ctypes.data == arr.backend_array().ctypes.data


@pytest.mark.parametrize("dtype", ["int4", "uint4", "float4_e2m1fn", "int2"])
def test_dlpack_refuses_sub_byte_dtypes(dtype: str) -> None:
    arr = nd.array(_sample(dtype), CPU)
    with pytest.raises(UnsupportedOperationError, match=f"cannot carry {dtype}"):
        arr.__dlpack__()


def test_dlpack_import_of_an_unknown_code_is_refused() -> None:
    class Opaque:
        def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
            capsule = np.zeros(3, np.uint8).__dlpack__(*args, **kwargs)
            _dtype_field(capsule).code = 3  # kDLOpaqueHandle
            return capsule

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    with pytest.raises(UnsupportedOperationError, match="code=3, bits=8"):
        nd.from_dlpack(Opaque())


def test_a_non_capsule_is_refused() -> None:
    with pytest.raises(UnsupportedOperationError, match="not a DLPack capsule"):
        _dtype_field(ctypes.c_int(3))
