"""Single operators at their edges against ONNX Runtime: ceil_mode windows
that would start in the padding, near-constant layer-norm rows, GELU near
the float limit, and empty tensors."""

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


def _single(
    op: str,
    inputs: dict[str, np.ndarray[Any, Any]],
    attrs: dict[str, Any],
    opset: int,
    initializers: dict[str, np.ndarray[Any, Any]] | None = None,
) -> onnx.ModelProto:
    """A model of one ``op`` node reading ``inputs`` then
    ``initializers``, writing float32 ``y`` of the first input's rank (its sizes left to
    inference)."""
    initializers = initializers or {}
    rank = next(iter(inputs.values())).ndim  # these ops keep it
    node = helper.make_node(op, [*inputs, *initializers], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "edge",
        [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape
            )
            for name, a in inputs.items()
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * rank)],
        [numpy_helper.from_array(a, name) for name, a in initializers.items()],
    )
    return model_of(graph, opset)


def _both(
    model: onnx.ModelProto, inputs: dict[str, np.ndarray[Any, Any]]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """asyncrt's output (run twice: the second run must see new values) and
    ONNX Runtime's."""
    graph, params = from_onnx(model)
    with graph_executor.create(graph, None, "cpu", params=params) as ex:
        ex.run_sync(**{k: np.zeros_like(v) for k, v in inputs.items()})
        (ours,) = ex.run_sync(**inputs) or []
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    theirs: np.ndarray[Any, Any] = session.run(None, inputs)[0]
    return np.asarray(ours), theirs


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        # a common PyTorch export: odd input, pads 1, ceil_mode
        ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1] * 4}),
        ((1, 1, 1, 9), {"kernel_shape": [1, 2], "strides": [1, 3]}),
        (
            (2, 3, 7, 6),
            {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 1, 1]},
        ),
    ],
)
def test_ceil_mode_drops_a_window_that_would_start_in_the_padding(
    op: str, shape: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    """onnx 1.23's shape inference keeps that window (its pool is over
    padding alone: -inf or NaN); the specification and ORT drop it."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ours, theirs = _both(_single(op, {"x": x}, {**attrs, "ceil_mode": 1}, 19), {"x": x})
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value", [1000.0, 7.0, -3.5])
def test_layer_norm_of_a_constant_row_is_its_bias(value: float) -> None:
    """The row mean is a sum divided by the width, not a sum of ``x / width``
    with ``1 / width`` rounded: an ulp off in the mean of a constant row
    became 0.34 at 1000 (times ``1 / sqrt(epsilon)``)."""
    x = np.full((4, 768), value, np.float32)
    x[1] = np.random.default_rng(1).standard_normal(768) + value
    rng = np.random.default_rng(2)
    weights = {
        "scale": rng.uniform(0.5, 1.5, 768).astype(np.float32),
        "bias": rng.standard_normal(768).astype(np.float32),
    }
    model = _single(
        "LayerNormalization", {"x": x}, {"axis": -1, "epsilon": 1e-5}, 17, weights
    )
    ours, theirs = _both(model, {"x": x})
    np.testing.assert_array_equal(ours[0], weights["bias"])
    # Row 1 (unit spread around a large mean) is as exact as float32 sums
    # of its 768 values allow: a few of their ulps, as ONNX Runtime's.
    wide = x.astype(np.float64)
    centred = wide - wide.mean(axis=-1, keepdims=True)
    spread = np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5)
    exact = centred / spread * weights["scale"] + weights["bias"]
    ulps = 4 * np.spacing(np.float32(abs(value)))
    np.testing.assert_allclose(ours, exact, rtol=0, atol=ulps * 3)
    np.testing.assert_allclose(theirs, exact, rtol=0, atol=ulps * 3)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_does_not_overflow_below_the_float_limit(approximate: str) -> None:
    """GELU(x) is x for huge x; (1 + erf) x overflows past half the limit
    if it is formed before the halving (arrays past the small-array path)."""
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    x[:4] = [3e38, -3e38, 2e38, 1e38]
    ours, theirs = _both(
        _single("Gelu", {"x": x}, {"approximate": approximate}, 20), {"x": x}
    )
    np.testing.assert_array_equal(ours[:4], [x[0], 0, x[2], x[3]])
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "initializers"),
    [
        ("Softmax", {"x": np.zeros((2, 3, 0), np.float32)}, {"axis": -1}, None),
        ("Softmax", {"x": np.zeros((0, 4), np.float32)}, {"axis": 0}, None),
        (
            "Conv",
            {"x": np.zeros((0, 3, 8, 8), np.float32)},
            {"pads": [1] * 4},
            {"w": np.ones((4, 3, 3, 3), np.float32)},
        ),
    ],
)
def test_empty_tensors_give_empty_outputs(
    op: str,
    inputs: dict[str, np.ndarray[Any, Any]],
    attrs: dict[str, Any],
    initializers: dict[str, np.ndarray[Any, Any]] | None,
) -> None:
    ours, theirs = _both(_single(op, inputs, attrs, 17, initializers), inputs)
    assert ours.shape == theirs.shape
    assert ours.size == 0
