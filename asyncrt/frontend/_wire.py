"""An ONNX file split into its structure and its weights, each read once.

Parsing a model file with protobuf holds the weights twice (the file's bytes
while parsing, then the message), and converting them to arrays holds them
again. ONNX's encoding is protobuf's wire format, which is simple to walk:
:func:`scan` reads the message's structure and notes where each
initializer's ``raw_data`` lies in the file without reading it; the
structure (every field but the initializers) parses as a small
``ModelProto``, and :meth:`Scanned.read_weights` reads each tensor's bytes
straight into its array. A model's weights are then held once, from the
first byte read.

Only the fields needed to find the initializers are decoded (``ModelProto
.graph``, ``GraphProto.initializer``, and a tensor's ``name``,
``data_type``, ``dims``, ``raw_data`` and ``data_location``); a tensor
stored another way (typed fields, external data) is decoded with protobuf
on its own. Nothing is executed; malformed input is a
:class:`~asyncrt.errors.GraphError` naming the byte offset.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from ..errors import GraphError
from ._values import tvm_dtype

__all__ = ("Scanned", "scan")

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME = 1, 2, 8
_TENSOR_RAW, _TENSOR_LOCATION = 9, 14
#: Tensor fields that hold data other than raw_data (or point elsewhere).
_OTHER_DATA = frozenset({3, 4, 5, 6, 7, 10, 11, 13})


@dataclass(frozen=True)
class _Raw:
    """An initializer whose data is raw bytes at ``offset`` in the source."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    offset: int
    length: int


@dataclass(frozen=True)
class Scanned:
    """A model's structure, and where its initializers are.

    :ivar model: the model without initializers.
    :ivar names: the initializers' names, in order.
    """

    model: onnx.ModelProto
    names: tuple[str, ...]
    _source: str | bytes
    _raw: tuple[_Raw, ...]
    _other: tuple[onnx.TensorProto, ...]

    def read_weights(
        self, base_dir: str | os.PathLike[str] | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Every initializer as an array, each read once.

        :param base_dir: where external-data files are.
        :raises GraphError: for an unsupported dtype or data of the wrong size.
        """
        from ._weights import tensor_array

        arrays: dict[str, np.ndarray[Any, Any]] = {}
        if isinstance(self._source, str):
            with open(self._source, "rb") as file:
                for raw in self._raw:
                    arrays[raw.name] = self._read(raw, file)
        else:
            for raw in self._raw:
                arrays[raw.name] = self._read(raw, None)
        for tensor in self._other:
            arrays[tensor.name] = tensor_array(tensor, base_dir)
        return {name: arrays[name] for name in self.names}

    def placeholders(self) -> list[onnx.TensorProto]:
        """An empty stand-in per initializer (name and dtype), for ONNX's
        checker to see every name defined without the weights."""
        types = {raw.name: raw.data_type for raw in self._raw}
        types.update((tensor.name, tensor.data_type) for tensor in self._other)
        return [
            onnx.TensorProto(name=name, data_type=types[name], dims=[0])
            for name in self.names
        ]

    def _read(self, raw: _Raw, file: Any) -> np.ndarray[Any, Any]:
        if tvm_dtype(raw.data_type) is None:
            type_name = onnx.TensorProto.DataType.Name(raw.data_type)
            raise GraphError(
                f"initializer has unsupported dtype {type_name}", node=raw.name
            )
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(raw.data_type))
        count = int(np.prod(raw.dims, dtype=np.int64))
        if count * dtype.itemsize != raw.length:
            raise GraphError(
                f"raw data of {raw.length} bytes for {count} elements of {dtype}",
                node=raw.name,
            )
        array = np.empty(raw.dims, dtype.newbyteorder("<"))
        target = array.reshape(-1).view(np.uint8)
        if isinstance(self._source, bytes):
            end = raw.offset + raw.length
            target[:] = np.frombuffer(self._source[raw.offset : end], np.uint8)
        else:
            file.seek(raw.offset)
            if file.readinto(target.data) != raw.length:
                raise GraphError("the file ends inside its raw data", node=raw.name)
        return array.astype(dtype, copy=False)


def scan(source: str | os.PathLike[str] | bytes) -> Scanned:
    """Find the structure and the initializers of a model file or bytes.

    :raises GraphError: if the bytes are not a well-formed model.
    """
    where = os.fspath(source) if not isinstance(source, bytes) else None
    if where is not None:
        try:
            with open(where, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                view: Any = (
                    mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
                    if size
                    else b""
                )
        except OSError as exc:
            raise GraphError(
                f"cannot read the ONNX model: {exc}", source=where
            ) from exc
    else:
        view = source
    try:
        return _scan(view, where if where is not None else bytes(view))
    except (IndexError, ValueError, DecodeError) as exc:
        raise GraphError(f"not an ONNX model: {exc}", source=where) from exc
    finally:
        if isinstance(view, mmap.mmap):
            view.close()


def _scan(view: Any, source: str | bytes) -> Scanned:
    skeleton = bytearray()
    raws: list[_Raw] = []
    others: list[onnx.TensorProto] = []
    names: list[str] = []
    graphs = 0
    with memoryview(view) as data:
        for number, kind, start, value, end in _fields(data, 0, len(data)):
            if number != _MODEL_GRAPH or kind != _LEN:
                skeleton += data[start:end]
                continue
            graphs += 1
            if graphs > 1:  # protobuf would merge them: not worth modelling
                raise ValueError("the model has two graph fields")
            graph = bytearray()
            for g_number, g_kind, g_start, g_value, g_end in _fields(data, *value):
                if g_number != _GRAPH_INITIALIZER or g_kind != _LEN:
                    graph += data[g_start:g_end]
                    continue
                tensor = _tensor(data, *g_value)
                names.append(tensor.name)
                if isinstance(tensor, _Raw):
                    raws.append(tensor)
                else:
                    others.append(tensor)
            skeleton += _tag(_MODEL_GRAPH, _LEN) + _varint(len(graph)) + graph
    model = onnx.ModelProto.FromString(bytes(skeleton))
    return Scanned(model, tuple(names), source, tuple(raws), tuple(others))


def _tensor(data: memoryview, start: int, end: int) -> _Raw | onnx.TensorProto:
    """A raw-data tensor's description, or the tensor decoded (any other
    storage)."""
    name, data_type, dims = "", 0, []
    raw: tuple[int, int] | None = None
    other = False
    for number, kind, _, (value_start, value_end), _ in _fields(data, start, end):
        if number == _TENSOR_NAME and kind == _LEN:
            name = bytes(data[value_start:value_end]).decode("utf-8")
        elif number == _TENSOR_TYPE and kind == _VARINT:
            data_type = value_start
        elif number == _TENSOR_DIMS and kind == _VARINT:
            dims.append(_signed(value_start))
        elif number == _TENSOR_DIMS and kind == _LEN:
            at = value_start
            while at < value_end:
                dim, at = _read_varint(data, at)
                dims.append(_signed(dim))
        elif number == _TENSOR_RAW and kind == _LEN:
            raw = (value_start, value_end - value_start)
        elif number in _OTHER_DATA or (
            number == _TENSOR_LOCATION and kind == _VARINT and value_start != 0
        ):
            other = True  # typed fields, or data in an external file
    if raw is None or other:
        decoded: onnx.TensorProto = onnx.TensorProto.FromString(bytes(data[start:end]))
        return decoded
    return _Raw(name, data_type, tuple(dims), raw[0], raw[1])


def _fields(
    data: memoryview, start: int, end: int
) -> list[tuple[int, int, int, tuple[int, int], int]]:
    """The fields of the message in ``data[start:end]``: ``(number, wire
    type, field start, value, field end)``, where value is ``(value, 0)``
    for a varint and ``(start, end)`` of the payload otherwise."""
    fields = []
    at = start
    while at < end:
        field_start = at
        tag, at = _read_varint(data, at)
        number, kind = tag >> 3, tag & 7
        if kind == _VARINT:
            value, at = _read_varint(data, at)
            fields.append((number, kind, field_start, (value, 0), at))
            continue
        if kind == _LEN:
            length, at = _read_varint(data, at)
            value_end = at + length
            if value_end > end:
                raise ValueError(f"byte offset {at}: a field runs past its message")
            fields.append((number, kind, field_start, (at, value_end), value_end))
            at = value_end
            continue
        if kind in (_FIXED64, _FIXED32):
            width = 8 if kind == _FIXED64 else 4
            fields.append((number, kind, field_start, (at, at + width), at + width))
            at += width
            continue
        raise ValueError(f"byte offset {field_start}: wire type {kind} is not allowed")
    if at != end:
        raise ValueError(f"byte offset {at}: a field runs past its message")
    return fields


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError(f"byte offset {at}: a varint longer than 10 bytes")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, kind: int) -> bytes:
    return _varint(number << 3 | kind)
