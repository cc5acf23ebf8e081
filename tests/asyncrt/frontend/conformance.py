"""ONNX's backend node tests, run through asyncrt: the shared harness.

ONNX builds its node test cases in memory (``onnx.backend.test.case.node``);
some draw random inputs, so numpy's global RNG is seeded first. A case runs
here when every operator in its model is one asyncrt claims to support
(expanded function tests included); it is attributed to the operator under
test, and compared with ONNX's own tolerances and comparison
(``Runner.assert_similar_outputs``).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.test.case.test_case import TestCase
from onnx.backend.test.runner import Runner

from asyncrt import graph_executor
from asyncrt.frontend import SUPPORTED_OPS, from_onnx, static_inputs

__all__ = (
    "EXPECTED_FAILURES",
    "applicable_cases",
    "expected_failure",
    "host_only",
    "node_cases",
    "primary_op",
    "run_case",
)

#: Cases refused on purpose, by name prefix, with the reason. Beyond these,
#: a case fails on purpose only for a dtype asyncrt does not store
#: (:func:`expected_failure`).
EXPECTED_FAILURES: dict[str, str] = {
    "test_training_dropout": "training mode: Dropout draws a random mask",
    "test_batchnorm_epsilon_training_mode": "training mode: batch statistics",
    "test_batchnorm_example_training_mode": "training mode: batch statistics",
    "test_identity_opt": "optional values are not tensors",
    "test_identity_sequence": "sequences are not tensors",
}
_STORED = {
    onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
}
#: Stored through ml_dtypes, by host (numpy) arrays only.
_NARROW = {
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.FLOAT8E4M3FN,
    onnx.TensorProto.FLOAT8E4M3FNUZ,
    onnx.TensorProto.FLOAT8E5M2,
    onnx.TensorProto.FLOAT8E5M2FNUZ,
    onnx.TensorProto.FLOAT8E8M0,
    onnx.TensorProto.FLOAT4E2M1,
    onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
    onnx.TensorProto.INT2,
    onnx.TensorProto.UINT2,
}
_STORED |= _NARROW


@functools.cache
def node_cases() -> tuple[TestCase, ...]:
    """Every ONNX node test case, built once per process."""
    from onnx.backend.test.loader import load_model_tests

    np.random.seed(0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # Their generators overflow casts and divide by zero on purpose.
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return tuple(cases)


def _op_types(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


@functools.cache
def _op_by_prefix() -> dict[str, str]:
    names = {schema.name for schema in onnx.defs.get_all_schemas()}
    return {re.sub(r"[^a-z0-9]", "", name.lower()): name for name in names}


def primary_op(case: TestCase) -> str:
    """The operator a case tests: its only operator, or for composite
    (expanded) models the operator its name starts with."""
    assert case.model is not None
    ops = _op_types(case.model)
    if len(ops) == 1:
        return next(iter(ops))
    squashed = re.sub(r"[^a-z0-9]", "", case.name.removeprefix("test_").lower())
    best = ""
    for prefix, name in _op_by_prefix().items():
        if squashed.startswith(prefix) and len(prefix) > len(_squash(best)):
            best = name
    return best or case.name.removeprefix("test_").split("_")[0]


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def applicable_cases() -> list[TestCase]:
    """The cases whose operators are all supported, sorted by name."""
    supported = set(SUPPORTED_OPS)
    found = [
        case
        for case in node_cases()
        if case.model is not None
        and case.model.graph.node
        and _op_types(case.model) <= supported
        and all(d.domain in ("", "ai.onnx") for d in case.model.opset_import)
    ]
    return sorted(found, key=lambda case: case.name)


def expected_failure(case: TestCase) -> str | None:
    """Why asyncrt refuses ``case`` on purpose, or ``None`` if it must pass."""
    for prefix, reason in EXPECTED_FAILURES.items():
        if case.name.startswith(prefix):
            return reason
    unstored = sorted(_case_dtypes(case) - _stored_names())
    if unstored:
        return f"dtype {', '.join(unstored)} is not stored by asyncrt"
    return None


def host_only(case: TestCase) -> bool:
    """Whether ``case`` uses a dtype only host (numpy) arrays store: the
    narrow formats of ``ml_dtypes``, which cupy has no dtypes for."""
    return bool(_case_dtypes(case) & _narrow_names())


def _case_dtypes(case: TestCase) -> set[str]:
    """The ONNX element types of a case's inputs, outputs, initializers and
    Cast targets."""
    assert case.model is not None
    graph = case.model.graph
    infos = [*graph.input, *graph.output]
    types = [
        i.type.tensor_type.elem_type for i in infos if i.type.HasField("tensor_type")
    ]
    types += [init.data_type for init in graph.initializer]
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.name == "to" and node.op_type == "Cast":
                types.append(attribute.i)
    return {onnx.TensorProto.DataType.Name(t) for t in types}


@functools.cache
def _stored_names() -> frozenset[str]:
    return frozenset(onnx.TensorProto.DataType.Name(t) for t in _STORED)


@functools.cache
def _narrow_names() -> frozenset[str]:
    return frozenset(onnx.TensorProto.DataType.Name(t) for t in _NARROW)


def run_case(case: TestCase, device: str = "cpu") -> None:
    """Import, run on ``device`` and compare one case.

    :raises AssertionError: if the outputs differ beyond ONNX's tolerances.
    :raises AsyncrtError: if asyncrt refuses the model.
    """
    model = case.model
    assert model is not None and case.data_sets is not None
    inputs, expected = case.data_sets[0]
    initializers = {init.name for init in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    feeds: dict[str, Any] = {n: _array(v) for n, v in zip(names, inputs, strict=True)}
    bound = set(static_inputs(model))
    graph, params = from_onnx(model, bind={n: feeds[n] for n in bound})
    runtime = {n: v for n, v in feeds.items() if n not in bound}
    with graph_executor.create(graph, None, device) as executor:
        executor.load_params(params)
        executor.set_input(**runtime)
        executor.run_sync()
        count = executor.get_num_outputs()
        actual = [executor.get_output(i).numpy() for i in range(count)]
    assert_outputs(case, expected, actual)


def assert_outputs(
    case: TestCase, expected: Sequence[Any], actual: Sequence[Any]
) -> None:
    """ONNX's own comparison of a case's ``expected`` and ``actual`` outputs
    (``Runner.assert_similar_outputs``, the case's tolerances).

    :raises AssertionError: if they differ.
    """
    Runner.assert_similar_outputs(
        [_array(e) for e in expected],
        list(actual),
        rtol=case.rtol,
        atol=case.atol,
        model_dir=case.name,
    )


def _array(value: Any) -> Any:
    """Case data as numpy: some cases give TensorProtos (float16, ...)."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return np.asarray(value)
