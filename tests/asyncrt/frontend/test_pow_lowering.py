"""``Pow`` by a constant exponent: multiplications, ``sqrt`` or a
reciprocal instead of ``pow``, with ``pow``'s results (ONNX Runtime's where
it computes the same products)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx

from .models import model_of

ort = pytest.importorskip("onnxruntime")

_EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -2.5, 1e-30], np.float32)


def _pow_model(
    exponent: np.ndarray[Any, Any], shape: tuple[int, ...], dtype: Any = np.float32
) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])],
        "pow",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, shape)],
        [numpy_helper.from_array(exponent, "e")],
    )
    return model_of(graph, 15)


def _run(model: onnx.ModelProto, x: np.ndarray[Any, Any]) -> tuple[Any, list[str]]:
    graph, params = from_onnx(model)
    kernels = [node.func_name for node in graph.nodes if not node.is_null]
    with graph_executor.create(graph, None, "cpu", params=params) as ex:
        ex.run_sync(x=np.ones_like(x))
        (y,) = ex.run_sync(x=x) or []
    return np.asarray(y), kernels


@pytest.mark.parametrize(
    ("value", "kernel"),
    [
        (2.0, "square"),
        (3.0, "cube"),
        (0.5, "power_half"),
        (-1.0, "reciprocal"),
        (1.0, "copy"),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_constant_exponent_takes_its_own_kernel_with_pows_results(
    value: float, kernel: str, dtype: Any
) -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([_EDGES, rng.standard_normal(248).astype(np.float32) * 4])
    x = x.astype(dtype).reshape(4, 64)
    model = _pow_model(np.array(value, dtype), x.shape, dtype)
    y, kernels = _run(model, x)
    assert kernels == [kernel]
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    want = session.run(None, {"x": x})[0]  # C's pow: pow(-0, .5) = +0, (-inf) inf
    if value in (2.0, 3.0):  # the same products as ONNX Runtime's
        np.testing.assert_array_equal(y, want)
    # -1 is 1 / x rounded once (pow is within an ulp of it)
    np.testing.assert_allclose(y, want, rtol=2 * np.finfo(dtype).eps, atol=0)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(want))


@pytest.mark.parametrize(
    "exponent",
    [
        np.array(2.5, np.float32),
        np.array([2.0, 3.0], np.float32),
        np.array(3, np.int64),
    ],
)
def test_other_exponents_take_pow(exponent: np.ndarray[Any, Any]) -> None:
    x = np.abs(np.random.default_rng(1).standard_normal((3, 2))).astype(np.float32)
    y, kernels = _run(_pow_model(exponent, x.shape), x)
    if exponent.dtype == np.int64:
        # a scalar integer exponent still names its kernel by value
        assert kernels == ["cube"]
    else:
        assert kernels[0] in ("power", "power_cast")
    np.testing.assert_allclose(y, np.power(x, exponent.astype(np.float32)), rtol=1e-6)


def test_an_exponent_computed_at_run_time_takes_pow() -> None:
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])],
        "pow",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2]),
            helper.make_tensor_value_info("e", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    graph_, _ = from_onnx(model_of(graph, 15))
    assert [n.func_name for n in graph_.nodes if not n.is_null] == ["power"]


def test_cube_fuses_with_its_neighbours() -> None:
    """tanh-GELU's ``x + 0.044715 x^3`` with fusion on: one kernel."""
    graph = helper.make_graph(
        [
            helper.make_node("Pow", ["x", "three"], ["p"]),
            helper.make_node("Mul", ["p", "c"], ["m"]),
            helper.make_node("Add", ["x", "m"], ["y"]),
        ],
        "cubic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
        [
            numpy_helper.from_array(np.array(3.0, np.float32), "three"),
            numpy_helper.from_array(np.array(0.044715, np.float32), "c"),
        ],
    )
    g, params = from_onnx(model_of(graph, 15))
    x = np.random.default_rng(2).standard_normal((8, 32)).astype(np.float32)
    with graph_executor.create(g, None, "cpu", params=params, fuse=True) as ex:
        (y,) = ex.run_sync(x=x) or []
        (launch,) = ex.plan.launches()
    assert launch.name == "fused_cube_mul_add"
    np.testing.assert_allclose(
        y, x + np.float32(0.044715) * (x * x * x), rtol=1e-6, atol=1e-7
    )
