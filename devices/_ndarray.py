"""``NDArray``: a typed, C-contiguous view of device memory.

An NDArray is a :class:`~devices.Buffer`, a byte offset, a shape and a dtype.
Several NDArrays may view one buffer (an arena holds many tensors); views
share memory, copies never do. Moving data between devices always goes
through :meth:`NDArray.copyto` / :meth:`NDArray.copyfrom` (or a stream), so a
simulated device's memory is never touched by the host without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._api import MAX_ALLOCATION, Buffer, DeviceAPI
from ._device import Device, DLDeviceType
from ._dlpack import export_narrow, import_narrow
from ._dtype import dtype_string, is_extension, numpy_dtype
from ._registry import get_api
from ._stream import Stream
from .errors import (
    AllocationError,
    CopyError,
    UnsupportedOperationError,
)

__all__ = ("NDArray", "array", "empty", "from_dlpack")

ShapeLike = Sequence[int] | int


def _check_shape(shape: ShapeLike) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise AllocationError(f"shape {dims} has a non-integer dim {dim!r}")
        if dim < 0:
            raise AllocationError(f"shape {dims} has a negative dim {dim}")
    checked = tuple(int(d) for d in dims)
    if math.prod(checked) > MAX_ALLOCATION:
        raise AllocationError(f"shape {checked} is absurdly large")
    return checked


class NDArray:
    """A typed view of device memory: shape, dtype, device.

    Make one with :func:`empty`, :func:`array` or :func:`from_dlpack`.
    """

    __slots__ = ("_api", "_np_dtype", "buffer", "byte_offset", "dtype", "shape")

    def __init__(
        self,
        buffer: Buffer,
        shape: ShapeLike,
        dtype: str,
        byte_offset: int = 0,
    ) -> None:
        self.buffer = buffer
        self._api: DeviceAPI = buffer._api
        self.shape = _check_shape(shape)
        self._np_dtype = numpy_dtype(dtype)
        self.dtype = dtype_string(self._np_dtype)
        self.byte_offset = int(byte_offset)
        if self.byte_offset < 0 or self.byte_offset + self.nbytes > buffer.nbytes:
            raise AllocationError(
                f"view of {self.nbytes} bytes at offset {self.byte_offset} does not "
                f"fit in {buffer!r}"
            )

    # -- facts -----------------------------------------------------------

    @property
    def device(self) -> Device:
        """The device holding the data."""
        return self.buffer.device

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of data."""
        return self.size * self._np_dtype.itemsize

    def __repr__(self) -> str:
        return f"<NDArray {self.shape} {self.dtype} on {self.device}>"

    # -- data movement -----------------------------------------------------

    def numpy(self) -> np.ndarray[Any, Any]:
        """A new host numpy array with a copy of the data (blocking)."""
        out = np.empty(self.shape, dtype=self._np_dtype)
        host = out.reshape(-1).view(np.uint8)
        if self.nbytes:
            if self._api.is_host:
                host[...] = self.buffer.raw[
                    self.byte_offset : self.byte_offset + self.nbytes
                ]
            else:
                self._api._copy_to_host(self.buffer, self.byte_offset, host)
        return out

    def __array__(
        self, dtype: Any = None, copy: bool | None = None
    ) -> np.ndarray[Any, Any]:
        if copy is False and not self._api.is_host:
            raise ValueError(f"{self!r} cannot be viewed by numpy without a copy")
        data = self.numpy() if copy or not self._api.is_host else self.backend_array()
        return data if dtype is None else data.astype(dtype, copy=False)

    def copyfrom(
        self, source: NDArray | np.ndarray[Any, Any] | Any, stream: Stream | None = None
    ) -> NDArray:
        """Copy data into this array (TVM's ``copyfrom``).

        :param source: an NDArray, or anything numpy can turn into an array
            of the same shape (its dtype is cast to this array's if needed
            for host data; NDArrays must match exactly).
        :param stream: queue the copy on this stream instead of copying now.
        :return: ``self``.
        :raises CopyError: if shapes or dtypes disagree.
        """
        if isinstance(source, NDArray):
            self._check_same_layout(source)
            self._api.copy_data_from_to(
                source.buffer,
                source.byte_offset,
                self.buffer,
                self.byte_offset,
                self.nbytes,
                stream,
            )
            return self
        host = np.asarray(source)
        if host.shape != self.shape:
            raise CopyError(f"cannot copy shape {host.shape} into {self!r}")
        host = np.ascontiguousarray(host, dtype=self._np_dtype)
        staged = _host_buffer(host)
        self._api.copy_data_from_to(
            staged, 0, self.buffer, self.byte_offset, self.nbytes, stream
        )
        return self

    def copyto(self, target: Device | NDArray, stream: Stream | None = None) -> NDArray:
        """Copy to another device (a new array) or into another array.

        :param target: a device, or an NDArray of the same shape and dtype.
        :param stream: queue the copy on this stream (of either device)
            instead of copying now; the caller then orders later work after it.
        :return: the destination array.
        :raises CopyError: if ``target`` is an array of another shape/dtype.
        """
        if isinstance(target, NDArray):
            return target.copyfrom(self, stream)
        return empty(self.shape, self.dtype, target).copyfrom(self, stream)

    def view(
        self, shape: ShapeLike, dtype: str | None = None, byte_offset: int = 0
    ) -> NDArray:
        """A new array viewing this one's memory (no copy).

        :param shape: the view's shape.
        :param dtype: the view's dtype (default: this array's).
        :param byte_offset: offset from the start of this array.
        :raises AllocationError: if the view does not fit inside this array.
        """
        result = NDArray(
            self.buffer, shape, dtype or self.dtype, self.byte_offset + byte_offset
        )
        if byte_offset < 0 or byte_offset + result.nbytes > self.nbytes:
            raise AllocationError(
                f"view of {result.nbytes} bytes at offset {byte_offset} does not "
                f"fit in {self!r}"
            )
        return result

    def backend_array(self) -> Any:
        """The array a kernel on this device receives: a numpy array on cpu
        and sim, a cupy array on cuda, viewing this memory (no copy).

        On ``sim`` only code running on one of that device's streams may
        touch it: that is the simulated device's memory.
        """
        return self._api.view(self.buffer, self.byte_offset, self.shape, self._np_dtype)

    # -- DLPack ------------------------------------------------------------

    def __dlpack_device__(self) -> tuple[int, int]:
        code = self._api.dlpack_device_type
        if code is None:
            raise UnsupportedOperationError(
                f"{self.device} memory cannot be exported with DLPack; copy it to "
                f"cpu first"
            )
        return (code, self.device.index)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        self.__dlpack_device__()
        if is_extension(self.dtype):  # numpy exports none of them
            return export_narrow(self.backend_array(), *args, **kwargs)
        return self.backend_array().__dlpack__(*args, **kwargs)

    def _check_same_layout(self, other: NDArray) -> None:
        if other.shape != self.shape or other.dtype != self.dtype:
            raise CopyError(
                f"cannot copy {other.shape} {other.dtype} into "
                f"{self.shape} {self.dtype}"
            )


def empty(
    shape: ShapeLike, dtype: str = "float32", device: Device | str = "cpu"
) -> NDArray:
    """An uninitialised array (TVM's ``nd.empty``).

    :raises AllocationError: for negative or absurd shapes.
    :raises DTypeError: for an unknown dtype.
    :raises DeviceNotFoundError: for an unknown device.
    """
    dev = device if isinstance(device, Device) else Device.parse(device)
    dims = _check_shape(shape)
    np_dtype = numpy_dtype(dtype)
    buffer = get_api(dev.kind).alloc(dev, math.prod(dims) * np_dtype.itemsize)
    return NDArray(buffer, dims, dtype_string(np_dtype))


def array(data: Any, device: Device | str = "cpu") -> NDArray:
    """A new array on ``device`` holding a copy of ``data`` (TVM's
    ``nd.array``). ``data`` may be a numpy array, anything numpy accepts, an
    NDArray, or a DLPack tensor."""
    if isinstance(data, NDArray):
        return data.copyto(
            device if isinstance(device, Device) else Device.parse(device)
        )
    host = data if isinstance(data, np.ndarray) else np.asarray(data)
    result = empty(host.shape, dtype_string(host.dtype), device)
    return result.copyfrom(host)


def from_dlpack(tensor: Any) -> NDArray:
    """Wrap a DLPack tensor (numpy, cupy, torch, ...) without copying where
    its memory allows (C-contiguous); otherwise copy. Host tensors of
    DLPack's bfloat16 and float8 codes arrive as their ``ml_dtypes`` dtypes.

    :raises UnsupportedOperationError: for devices asyncrt has no backend
        for, and dtypes it does not store.
    """
    if isinstance(tensor, NDArray):
        return tensor
    try:
        device_type, device_id = tensor.__dlpack_device__()
    except AttributeError as exc:
        raise UnsupportedOperationError(
            f"{type(tensor).__name__} is not a DLPack tensor"
        ) from exc
    if device_type == DLDeviceType.CPU:
        try:
            host = np.from_dlpack(tensor)
        except (BufferError, RuntimeError) as exc:
            # bfloat16, float8: DLPack codes numpy lacks
            host = import_narrow(tensor, exc)
        return _wrap_host(host)
    if device_type == DLDeviceType.CUDA:
        api = get_api("cuda")
        return api.from_dlpack(tensor, device_id)  # type: ignore[attr-defined,no-any-return]
    raise UnsupportedOperationError(
        f"no asyncrt backend for DLPack device type {device_type}"
    )


def wrap_fresh_host(host: np.ndarray[Any, Any], dtype: str) -> NDArray:
    """An NDArray over ``host`` without :func:`from_dlpack`'s checks, for a
    caller that just made ``host`` itself: a C-contiguous, native-order
    array whose TVM dtype string is ``dtype`` (the executor's output copies,
    a few microseconds cheaper each)."""
    result = NDArray.__new__(NDArray)
    result.buffer = _host_buffer(host)
    result._api = get_api("cpu")
    result.shape = host.shape
    result._np_dtype = host.dtype
    result.dtype = dtype
    result.byte_offset = 0
    return result


_CPU = Device("cpu")


def _wrap_host(host: np.ndarray[Any, Any]) -> NDArray:
    if not host.flags.c_contiguous or host.dtype.byteorder == ">":
        host = np.ascontiguousarray(host, dtype=host.dtype.newbyteorder("="))
    return NDArray(_host_buffer(host), host.shape, dtype_string(host.dtype))


def _host_buffer(host: np.ndarray[Any, Any]) -> Buffer:
    """A cpu Buffer over a C-contiguous host array's memory (no copy; not
    counted in the cpu's used bytes, since asyncrt did not allocate it)."""
    raw = host.reshape(-1).view(np.uint8)
    return Buffer(get_api("cpu"), _CPU, raw.nbytes, raw)
