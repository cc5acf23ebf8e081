"""A model's weights read once, apart from its structure.

A ``ModelProto`` holds its initializers inside the message; converting them
to arrays while the message lives, and copying the message for rewrites,
holds them two or three times. :func:`take_weights` reads each initializer
once (from the message, or from its external-data file, without loading it
into the message first) and returns the model without them: the graph's
structure, a few kilobytes, and the arrays, held once. The caller drops the
original message to free it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import external_data_helper, numpy_helper

from ..errors import GraphError
from ._values import tvm_dtype

__all__ = (
    "take_weights",
    "tensor_array",
    "uses_external_data",
    "without_initializers",
)


def without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without its initializers (nothing else is
    copied twice: the weights are never serialised or duplicated)."""
    skeleton = onnx.ModelProto()
    _copy_fields(model, skeleton, skip="graph")
    _copy_fields(model.graph, skeleton.graph, skip="initializer")
    return skeleton


def uses_external_data(model: onnx.ModelProto) -> bool:
    """Whether an initializer of ``model`` is stored in an external file."""
    return any(
        external_data_helper.uses_external_data(init)
        for init in model.graph.initializer
    )


def take_weights(
    model: onnx.ModelProto, base_dir: str | os.PathLike[str] | None = None
) -> tuple[onnx.ModelProto, dict[str, np.ndarray[Any, Any]]]:
    """The model's initializers as arrays, and the model without them.

    :param base_dir: where the external-data files of tensors stored outside
        the model are (the model file's folder).
    :return: the skeleton and the arrays by name.
    :raises GraphError: for a sparse initializer, an unsupported dtype or
        an external-data file that cannot be read.
    """
    graph = model.graph
    if len(graph.sparse_initializer):
        raise GraphError("sparse initializers are not supported")
    weights = {init.name: tensor_array(init, base_dir) for init in graph.initializer}
    return without_initializers(model), weights


def tensor_array(
    init: onnx.TensorProto, base_dir: str | os.PathLike[str] | None = None
) -> np.ndarray[Any, Any]:
    """One initializer as an array, read from its external-data file if it
    is stored there.

    :raises GraphError: for an unsupported dtype or unreadable data.
    """
    if tvm_dtype(init.data_type) is None:
        type_name = onnx.TensorProto.DataType.Name(init.data_type)
        raise GraphError(
            f"initializer has unsupported dtype {type_name}", node=init.name
        )
    if external_data_helper.uses_external_data(init):
        return _read_external(init, base_dir)
    try:
        return numpy_helper.to_array(init)
    except ValueError as exc:
        raise GraphError(f"malformed initializer: {exc}", node=init.name) from exc


def _read_external(
    init: onnx.TensorProto, base_dir: str | os.PathLike[str] | None
) -> np.ndarray[Any, Any]:
    """One tensor read straight from its external-data file."""
    info = external_data_helper.ExternalDataInfo(init)
    where = Path(base_dir or ".") / info.location
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
    shape = tuple(int(d) for d in init.dims)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if info.length and int(info.length) != nbytes:
        raise GraphError(
            f"external data holds {info.length} bytes, the tensor needs {nbytes}",
            node=init.name,
        )
    try:
        with open(where, "rb") as file:
            file.seek(int(info.offset or 0))
            array = np.fromfile(file, dtype=dtype.newbyteorder("<"), count=count)
    except OSError as exc:
        raise GraphError(
            f"cannot read its external data: {exc}", node=init.name, source=str(where)
        ) from exc
    if array.size != count:
        raise GraphError(
            f"external data ends after {array.size} of {count} elements",
            node=init.name,
            source=str(where),
        )
    return array.astype(dtype, copy=False).reshape(shape)


def _copy_fields(source: Message, target: Message, skip: str) -> None:
    for descriptor, value in source.ListFields():
        if descriptor.name == skip:
            continue
        if isinstance(value, Message):
            getattr(target, descriptor.name).CopyFrom(value)
        elif isinstance(value, (bytes, str, int, float)):
            setattr(target, descriptor.name, value)
        else:  # a repeated field
            getattr(target, descriptor.name).extend(value)
