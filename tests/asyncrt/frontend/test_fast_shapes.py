"""The specializations' Python shape rules agree with ONNX's shape inference
on every node test of onnx they accept, and give up where a case is not
plainly valid (ONNX's inference then judges it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from asyncrt.frontend._infer import InferenceFailed, infer_outputs
from asyncrt.frontend._rules import RULES, NodeContext
from asyncrt.frontend._shapes import fast_outputs
from asyncrt.frontend._values import Const, Tensor, Value, tvm_dtype
from scheduler.dag import TensorSpec

from .conformance import node_cases


def _context(
    node: onnx.NodeProto, opset: int, inputs: list[Value | None]
) -> NodeContext:
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    found = RULES.get(node.op_type)
    return NodeContext(node, "n", opset, schema, inputs, found.static if found else ())


def _case_inputs(case: Any) -> list[Value | None] | None:
    """The node's inputs: small integer arrays as constants (as a
    specialization binds shape-valued inputs), the rest as tensors."""
    model = case.model
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    data = case.data_sets[0][0] if case.data_sets else None
    values: dict[str, Value] = {n: Const(a) for n, a in inits.items()}
    for value_info in model.graph.input:
        if value_info.name in inits:
            continue
        if data is None or tvm_dtype(value_info.type.tensor_type.elem_type) is None:
            return None
        array = np.asarray(data[names.index(value_info.name)])
        if array.dtype == object:
            return None
        if array.dtype.kind in "iu" and array.size <= 16:
            values[value_info.name] = Const(array)
        else:
            spec = TensorSpec(tuple(array.shape), str(array.dtype))
            values[value_info.name] = Tensor(None, spec)  # type: ignore[arg-type]
    return [values.get(n) if n else None for n in model.graph.node[0].input]


def test_fast_shapes_agree_with_onnx_on_its_node_tests() -> None:
    checked = 0
    for case in node_cases():
        model = case.model
        if model is None or len(model.graph.node) != 1:
            continue
        node = model.graph.node[0]
        opset = next(
            (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0
        )
        inputs = _case_inputs(case)
        if not opset or inputs is None:
            continue
        try:
            context = _context(node, opset, inputs)
        except onnx.defs.SchemaError:
            continue
        fast = fast_outputs(context)
        if fast is None:
            continue
        checked += 1
        try:
            reference = infer_outputs(
                node, context.schema, inputs, opset, context.static
            )
        except InferenceFailed as exc:
            pytest.fail(f"{case.name}: fast shapes {fast}, ONNX refuses: {exc}")
        assert fast == reference, case.name
    assert checked > 300  # the rules cover most of the common operators' tests


@pytest.mark.parametrize(
    ("op", "specs"),
    [
        ("Add", [((2, 3), "float32"), ((2, 3), "int64")]),  # mixed dtypes
        ("Add", [((2, 3), "float32"), ((4, 3), "float32")]),  # no broadcast
        ("Add", [((2, 3), "bool"), ((2, 3), "bool")]),  # not a numeric type
        ("MatMul", [((2, 3), "float32"), ((4, 5), "float32")]),  # inner dims
        ("Exp", [((2, 3), "int64")]),  # not a float
        ("Concat", [((2, 3), "float32"), ((2,), "float32")]),  # ranks
    ],
)
def test_fast_shapes_give_up_on_invalid_nodes(
    op: str, specs: list[tuple[tuple[int, ...], str]]
) -> None:
    names = [f"in{i}" for i in range(len(specs))]
    attrs = {"axis": 0} if op == "Concat" else {}
    node = helper.make_node(op, names, ["out"], **attrs)
    inputs: list[Value | None] = [
        Tensor(None, TensorSpec(shape, dtype))  # type: ignore[arg-type]
        for shape, dtype in specs
    ]
    assert fast_outputs(_context(node, 17, inputs)) is None
