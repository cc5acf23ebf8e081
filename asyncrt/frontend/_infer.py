"""Output shapes and dtypes of one node, by ONNX's own shape inference.

Every input has a static shape by the time a node is imported, and the
constant inputs that decide shapes (``Reshape``'s target, ``Slice``'s
starts, ...) are known, so ONNX's per-node inference
(:func:`onnx.shape_inference.infer_node_outputs`, the checker of each
operator's schema) gives fully static outputs; it also rejects a node whose
inputs or attributes break its schema.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import numpy_helper, shape_inference

from scheduler.dag import TensorSpec

from ._values import Const, Value, onnx_dtype, tvm_dtype

__all__ = ("InferenceFailed", "infer_outputs")

#: Constants up to this many elements are shown to inference (shape-deciding
#: inputs are tiny; weights need not be serialised for it).
_DATA_LIMIT = 1 << 16


class InferenceFailed(Exception):
    """ONNX could not infer a static shape or a supported dtype."""


def infer_outputs(
    node: onnx.NodeProto,
    schema: onnx.defs.OpSchema,
    inputs: Sequence[Value | None],
    opset: int,
    static: Sequence[int],
) -> list[TensorSpec]:
    """The shape and dtype of each named output of ``node``.

    :param static: input positions whose data is always shown, whatever
        their size.
    :return: one spec per output, in order (``""`` outputs skipped).
    :raises InferenceFailed: if ONNX rejects the node or leaves a shape or
        dtype unknown or unsupported.
    """
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    for position, (name, value) in enumerate(zip(node.input, inputs, strict=False)):
        if not name or value is None:
            continue
        spec = value.spec
        types[name] = onnx.helper.make_tensor_type_proto(
            onnx_dtype(spec.dtype), spec.shape
        )
        if isinstance(value, Const) and (
            value.array.size <= _DATA_LIMIT or position in static
        ):
            data[name] = numpy_helper.from_array(value.array, name)
    try:
        inferred = shape_inference.infer_node_outputs(
            schema,
            node,
            types,
            data,
            opset_imports=[onnx.helper.make_opsetid("", opset)],
        )
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as exc:
        raise InferenceFailed(str(exc).strip()) from exc
    specs = []
    for name in node.output:
        if not name:
            continue
        found = inferred.get(name)
        if found is None or not found.HasField("tensor_type"):
            raise InferenceFailed(f"no type inferred for output {name!r}")
        tensor = found.tensor_type
        dtype = tvm_dtype(tensor.elem_type)
        if dtype is None:
            type_name = onnx.TensorProto.DataType.Name(tensor.elem_type)
            raise InferenceFailed(f"output {name!r} has unsupported dtype {type_name}")
        if not tensor.HasField("shape") or not all(
            d.HasField("dim_value") for d in tensor.shape.dim
        ):
            raise InferenceFailed(f"the shape of output {name!r} is not static")
        specs.append(TensorSpec(tuple(d.dim_value for d in tensor.shape.dim), dtype))
    return specs
