"""What the importer knows about each ONNX value: a constant or a tensor.

A value is a :class:`Const` when its contents are known at import time
(initializers, ``Constant`` nodes, anything folded from them, inputs the
caller bound) and a :class:`Tensor` when it is computed at run time (a graph
input or a node output of the asyncrt graph being built). Both have a static
shape and a dtype: asyncrt plans storage ahead of time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import onnx

from scheduler.dag import TensorSpec

from ..graph import TensorHandle

__all__ = ("Const", "Tensor", "Value", "onnx_dtype", "spec_of", "tvm_dtype")

#: ONNX element types asyncrt stores, and their TVM dtype names.
_DTYPES: dict[int, str] = {
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    # through ml_dtypes (devices._dtype.EXTENSION_DTYPES)
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8_e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    onnx.TensorProto.FLOAT8E8M0: "float8_e8m0fnu",
    onnx.TensorProto.FLOAT4E2M1: "float4_e2m1fn",
    onnx.TensorProto.INT4: "int4",
    onnx.TensorProto.UINT4: "uint4",
    onnx.TensorProto.INT2: "int2",
    onnx.TensorProto.UINT2: "uint2",
}
_ELEM_TYPES = {name: code for code, name in _DTYPES.items()}


def tvm_dtype(elem_type: int) -> str | None:
    """The TVM dtype of an ONNX element type, or ``None`` if unsupported."""
    return _DTYPES.get(elem_type)


def onnx_dtype(dtype: str) -> int:
    """The ONNX element type of a TVM dtype asyncrt stores."""
    return _ELEM_TYPES[dtype]


@dataclass(frozen=True)
class Const:
    """A value known at import time."""

    array: np.ndarray[Any, Any]

    @cached_property
    def spec(self) -> TensorSpec:
        """Its shape and dtype."""
        return spec_of(self.array)


@dataclass(frozen=True)
class Tensor:
    """A value computed at run time by the graph being built."""

    handle: TensorHandle
    spec: TensorSpec


Value = Const | Tensor


def spec_of(array: np.ndarray[Any, Any]) -> TensorSpec:
    """The :class:`TensorSpec` of a numpy array."""
    return TensorSpec(tuple(int(d) for d in array.shape), str(array.dtype))
