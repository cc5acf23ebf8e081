"""One-node ONNX models, run through asyncrt and through the references
(ONNX's reference evaluator, ONNX Runtime) for the kernel tests."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx

__all__ = ("node_model", "run_asyncrt", "run_ort", "run_reference")


def node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray[Any, Any] | None],
    *,
    constants: tuple[str, ...] = (),
    opset: int = 19,
    outputs: int = 1,
    **attrs: Any,
) -> onnx.ModelProto:
    """A model of one ``op_type`` node over ``inputs`` in order (``None``:
    an omitted optional input), those named in ``constants`` initializers
    and the others graph inputs; output types are inferred."""
    names, graph_inputs, initializers = [], [], []
    for name, value in inputs.items():
        if value is None:
            names.append("")
            continue
        names.append(name)
        if name in constants:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
    while names and not names[-1]:
        names.pop()
    results = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, results, **attrs)
    infos = []
    for name in results:
        info = onnx.ValueInfoProto()
        info.name = name
        infos.append(info)
    graph = helper.make_graph([node], op_type, graph_inputs, infos, initializers)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(
        graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets)
    )
    return onnx.shape_inference.infer_shapes(model)


def _feeds(
    model: onnx.ModelProto, inputs: Mapping[str, Any]
) -> dict[str, np.ndarray[Any, Any]]:
    wanted = {i.name for i in model.graph.input}
    return {k: v for k, v in inputs.items() if k in wanted}


def run_asyncrt(
    model: onnx.ModelProto, inputs: Mapping[str, Any], device: str = "cpu"
) -> list[np.ndarray[Any, Any]]:
    """The model's outputs computed by asyncrt on ``device``."""
    graph, params = from_onnx(model)
    with graph_executor.create(graph, None, device, params=params) as executor:
        outputs = executor.run_sync(**_feeds(model, inputs)) or []
    return [o.numpy() for o in outputs]


def run_reference(
    model: onnx.ModelProto, inputs: Mapping[str, Any]
) -> list[np.ndarray[Any, Any]]:
    """The model's outputs by ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        results = ReferenceEvaluator(model).run(None, _feeds(model, inputs))
    return [np.asarray(r) for r in results]


def run_ort(
    model: onnx.ModelProto, inputs: Mapping[str, Any]
) -> list[np.ndarray[Any, Any]]:
    """The model's outputs by ONNX Runtime (skips the test without it)."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return list(session.run(None, _feeds(model, inputs)))
