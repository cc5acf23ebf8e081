"""TVM's params binary format (``tvm.runtime.save_param_dict``), in numpy.

The layout, as TVM writes it (``SaveParams`` in ``src/runtime/file_utils.cc``
and ``SaveDLTensor`` in ``include/tvm/runtime/ndarray.h``, all little-endian)::

    u64 list magic 0xF7E58D4F05049CB7
    u64 reserved (0)
    u64 name count, then per name: u64 byte length, UTF-8 bytes
    u64 array count (must equal the name count)
    per array:
        u64 array magic 0xDD5E40F096B4A13F
        u64 reserved (0)
        i32 device_type (always kDLCPU = 1), i32 device_id (0)
        i32 ndim
        u8 code, u8 bits, u16 lanes            (DLDataType)
        i64 shape[ndim]
        i64 data byte size = prod(shape) * ((bits + 7) // 8)
        raw element bytes, C order

The i-th name belongs to the i-th array. Bool is TVM's ``DataType::Bool()``,
``uint1`` (code 1, bits 1), one byte per element; newer DLPack's ``kDLBool``
(code 6, bits 8) is accepted on decode too.

The narrow dtypes (``ml_dtypes``'s) take the codes TVM gives them, which
are DLPack's (``dlpack.h`` v1.1 ``DLDataTypeCode``): ``bfloat16`` is
``kDLBfloat`` (4, 16); the float8 formats ``kDLFloat8_e4m3fn`` (10),
``kDLFloat8_e4m3fnuz`` (11), ``kDLFloat8_e5m2`` (12), ``kDLFloat8_e5m2fnuz``
(13) and ``kDLFloat8_e8m0fnu`` (14), 8 bits; ``float4_e2m1fn`` is
``kDLFloat4_e2m1fn`` (17, 4 bits); ``int4``/``int2`` are ``kDLInt`` and
``uint4``/``uint2`` ``kDLUInt`` with 4 or 2 bits. Sub-byte elements are
*not* packed: each takes ``(bits + 7) // 8`` = 1 byte, its value in the low
bits, as TVM's ``SaveDLTensor`` sizes data (and its loader checks); the
high bits are ignored on decode. (TVM releases before its DLPack 1.1 codes
numbered float8 6 and 7; 6 is ``kDLBool`` here, so those blobs are not
read as float8.)

Decoding trusts nothing: every declared size is checked against the bytes
that remain *before* anything is allocated, so a corrupt or hostile blob
fails fast with a :class:`~asyncrt.errors.ParamsError` naming the offset.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

import numpy as np

from devices._dtype import dtype_string, numpy_dtype

from ..errors import DTypeError, ParamsError

__all__ = ("decode_params", "encode_params")

LIST_MAGIC = 0xF7E58D4F05049CB7
ARRAY_MAGIC = 0xDD5E40F096B4A13F
#: DLPack's device type for host memory; TVM always saves params as CPU.
KDLCPU = 1
#: The most dimensions an array may declare (DLPack has no limit, numpy 32).
MAX_NDIM = 32

_INT64_MAX = 2**63 - 1
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
# device_type, device_id, ndim, dtype code, bits, lanes
_ARRAY_HEAD = struct.Struct("<iiiBBH")

# DLDataTypeCode values: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBool 6.
_KDLBOOL = 6

# TVM dtype string -> the DLDataType (code, bits, lanes) TVM writes for it.
_DLTYPE: dict[str, tuple[int, int, int]] = {
    "bool": (1, 1, 1),
    "int8": (0, 8, 1),
    "int16": (0, 16, 1),
    "int32": (0, 32, 1),
    "int64": (0, 64, 1),
    "uint8": (1, 8, 1),
    "uint16": (1, 16, 1),
    "uint32": (1, 32, 1),
    "uint64": (1, 64, 1),
    "float16": (2, 16, 1),
    "float32": (2, 32, 1),
    "float64": (2, 64, 1),
    "bfloat16": (4, 16, 1),
    "float8_e4m3fn": (10, 8, 1),
    "float8_e4m3fnuz": (11, 8, 1),
    "float8_e5m2": (12, 8, 1),
    "float8_e5m2fnuz": (13, 8, 1),
    "float8_e8m0fnu": (14, 8, 1),
    "float4_e2m1fn": (17, 4, 1),
    "int4": (0, 4, 1),
    "uint4": (1, 4, 1),
    "int2": (0, 2, 1),
    "uint2": (1, 2, 1),
}
_DTYPE_OF: dict[tuple[int, int, int], str] = {v: k for k, v in _DLTYPE.items()}
_DTYPE_OF[(_KDLBOOL, 8, 1)] = "bool"

# Smallest possible encodings, used to bound counts before looping over them.
_MIN_NAME_BYTES = _U64.size
_MIN_ARRAY_BYTES = 2 * _U64.size + _ARRAY_HEAD.size + _I64.size


def encode_params(params: Mapping[str, np.ndarray]) -> bytes:
    """Serialise named arrays exactly as ``tvm.runtime.save_param_dict`` does.

    Arrays are written in the mapping's iteration order; non-contiguous and
    big-endian arrays are converted to C-contiguous little-endian data first.

    :param params: parameter name to array (anything ``numpy.asarray`` takes).
    :return: the params blob.
    :raises ParamsError: if a name is not a string or cannot be encoded as
        UTF-8 (the offset is where the name would have been written).
    :raises DTypeError: if an array's dtype is not one asyncrt stores.
    """
    names: list[bytes] = []
    arrays: list[np.ndarray] = []
    offset = 3 * _U64.size
    for name, value in params.items():
        if not isinstance(name, str):
            raise ParamsError(f"param name {name!r} is not a str", offset=offset)
        try:
            encoded = name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ParamsError(
                f"param name {name!r} is not valid UTF-8: {exc.reason}",
                offset=offset,
            ) from exc
        offset += _U64.size + len(encoded)
        names.append(encoded)
        arrays.append(np.asarray(value))

    out = bytearray()
    out += _U64.pack(LIST_MAGIC) + _U64.pack(0) + _U64.pack(len(names))
    for encoded in names:
        out += _U64.pack(len(encoded)) + encoded
    out += _U64.pack(len(arrays))
    for array in arrays:
        _encode_array(out, array)
    return bytes(out)


def _encode_array(out: bytearray, array: np.ndarray) -> None:
    """Append one array (``SaveDLTensor``) to ``out``."""
    name = dtype_string(array.dtype)
    code, bits, lanes = _DLTYPE[name]
    # '<' is a no-op for one-byte types, a byte swap for big-endian input.
    # (np.ascontiguousarray would turn a 0-d array into shape (1,).)
    data = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    out += _U64.pack(ARRAY_MAGIC) + _U64.pack(0)
    out += _ARRAY_HEAD.pack(KDLCPU, 0, data.ndim, code, bits, lanes)
    out += struct.pack(f"<{data.ndim}q", *data.shape)
    out += _I64.pack(data.nbytes)
    out += data.tobytes(order="C")


class _Reader:
    """A cursor over the blob that refuses to read past its end."""

    def __init__(self, blob: memoryview) -> None:
        self.blob = blob
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.blob) - self.pos

    def fail(self, message: str, at: int | None = None) -> ParamsError:
        return ParamsError(message, offset=self.pos if at is None else at)

    def take(self, size: int, what: str) -> memoryview:
        if size > self.left:
            raise self.fail(
                f"truncated: expected {size} bytes of {what}, only {self.left} remain"
            )
        chunk = self.blob[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        return fmt.unpack(self.take(fmt.size, what))

    def u64(self, what: str) -> int:
        (value,) = self.unpack(_U64, what)
        return value


def decode_params(blob: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
    """Parse a blob written by ``tvm.runtime.save_param_dict`` (or
    :func:`encode_params`).

    Every returned array owns its memory: writable, aligned, C-contiguous,
    native byte order, independent of ``blob`` (each is one copy out of the
    blob, with no intermediate copy of the blob itself).

    :param blob: the params bytes.
    :return: parameter name to array.
    :raises ParamsError: if the blob is truncated, corrupt or implausible
        (wrong magic, sizes past the end, bad ndim or dtype, a data size that
        disagrees with the shape, name and array counts that differ, duplicate
        or non-UTF-8 names, trailing bytes); ``offset`` is where it failed.
    """
    view = memoryview(blob).cast("B")
    reader = _Reader(view)
    magic = reader.u64("list magic")
    if magic != LIST_MAGIC:
        raise reader.fail(
            f"expected params list magic {LIST_MAGIC:#x}, found {magic:#x}", at=0
        )
    reader.u64("reserved field")  # TVM ignores it on load; so do we

    count_at = reader.pos
    count = reader.u64("name count")
    if count * _MIN_NAME_BYTES > reader.left:
        raise reader.fail(
            f"name count {count} cannot fit in the {reader.left} bytes that remain",
            at=count_at,
        )
    names: list[str] = []
    seen: set[str] = set()
    for index in range(count):
        name_at = reader.pos
        length = reader.u64(f"name {index} length")
        raw = reader.take(length, f"name {index}")
        try:
            name = str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise reader.fail(
                f"name {index} is not valid UTF-8: {exc.reason}", at=name_at
            ) from exc
        if name in seen:
            raise reader.fail(f"duplicate param name {name!r}", at=name_at)
        seen.add(name)
        names.append(name)

    arrays_at = reader.pos
    n_arrays = reader.u64("array count")
    if n_arrays != count:
        raise reader.fail(
            f"array count {n_arrays} disagrees with name count {count}",
            at=arrays_at,
        )
    if n_arrays * _MIN_ARRAY_BYTES > reader.left:
        raise reader.fail(
            f"array count {n_arrays} cannot fit in the {reader.left} bytes that remain",
            at=arrays_at,
        )
    params = {name: _decode_array(reader, name) for name in names}
    if reader.left:
        raise reader.fail(f"{reader.left} trailing bytes after the last array")
    return params


def _decode_array(reader: _Reader, name: str) -> np.ndarray:
    """Read one array (``NDArray::Load``) at the reader's position."""
    start = reader.pos
    magic = reader.u64(f"array magic of {name!r}")
    if magic != ARRAY_MAGIC:
        raise reader.fail(
            f"expected array magic {ARRAY_MAGIC:#x} for {name!r}, found {magic:#x}",
            at=start,
        )
    reader.u64(f"reserved field of {name!r}")
    head_at = reader.pos
    device_type, _device_id, ndim, code, bits, lanes = reader.unpack(
        _ARRAY_HEAD, f"header of {name!r}"
    )
    if device_type != KDLCPU:
        # TVM's loader checks this too: params are always saved as CPU arrays.
        raise reader.fail(
            f"array {name!r} has device_type {device_type}, expected kDLCPU (1)",
            at=head_at,
        )
    ndim_at = head_at + 8
    if not 0 <= ndim <= MAX_NDIM:
        raise reader.fail(
            f"array {name!r} has ndim {ndim}, expected 0..{MAX_NDIM}", at=ndim_at
        )
    dtype_at = ndim_at + 4
    dtype = _DTYPE_OF.get((code, bits, lanes))
    if dtype is None:
        raise reader.fail(
            f"array {name!r} has unknown dtype (code={code}, bits={bits}, "
            f"lanes={lanes})",
            at=dtype_at,
        )

    shape_at = reader.pos
    shape = reader.unpack(struct.Struct(f"<{ndim}q"), f"shape of {name!r}")
    if any(dim < 0 for dim in shape):
        raise reader.fail(f"array {name!r} has a negative dim in {shape}", at=shape_at)
    elem_bytes = (bits + 7) // 8  # TVM's rule: lanes are not counted here
    size = elem_bytes
    for dim in shape:
        # Products of the nonzero dims only: a zero-size array may still
        # declare a dim big enough to overflow, and numpy would refuse it.
        size *= dim or 1
        if size > _INT64_MAX:
            raise reader.fail(
                f"array {name!r} shape {shape} overflows int64 bytes", at=shape_at
            )
    expected = elem_bytes * _prod(shape)

    size_at = reader.pos
    (nbytes,) = reader.unpack(_I64, f"data size of {name!r}")
    if nbytes != expected:
        raise reader.fail(
            f"array {name!r} declares {nbytes} data bytes, but shape {shape} of "
            f"{dtype} needs {expected}",
            at=size_at,
        )
    data = reader.take(nbytes, f"data of {name!r}")

    try:
        np_dtype = numpy_dtype(dtype)
    except DTypeError as exc:  # pragma: no cover - every _DTYPE_OF entry maps
        raise reader.fail(str(exc), at=dtype_at) from exc
    if np_dtype == np.bool_:
        # Any nonzero byte is true; never let numpy see a bool byte of 2.
        flags: np.ndarray = np.frombuffer(data, dtype=np.uint8) != 0
        return flags.reshape(shape)
    if bits < 8:
        # One sub-byte value per byte, in its low bits (ml_dtypes's layout).
        low = np.frombuffer(data, dtype=np.uint8) & ((1 << bits) - 1)
        return low.view(np_dtype).reshape(shape)
    out = np.empty(shape, dtype=np_dtype)
    out.reshape(-1)[...] = np.frombuffer(data, dtype=np_dtype.newbyteorder("<"))
    return out


def _prod(shape: tuple[int, ...]) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result
