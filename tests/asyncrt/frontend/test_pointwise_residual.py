"""The import's fusion of a residual block's ``Add`` into the 1 x 1
convolution before it (``PointwiseResidual``, or ``GatedPointwise`` with
the residual as its last input), a ``Relu`` after the sum joining it, only
where the product is read by the Add alone: matching ONNX Runtime and the
unfused import."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from asyncrt.frontend._rewrite import rewrite

from .models import check_every_shape, check_fusions, model_of

ort = pytest.importorskip("onnxruntime")

C, H = 8, 5


def _model(
    *,
    excite: bool = False,
    relu_after: bool = True,
    relu_before: bool = False,
    residual: str = "x",
    extra_outputs: tuple[str, ...] = (),
    dims: list[Any] | None = None,
) -> onnx.ModelProto:
    """x -> [squeeze-excitation ->] Conv 1x1 [-> Relu] -> Add(residual) [->
    Relu] -> out."""
    rng = np.random.default_rng(11)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.5).astype(np.float32), name
        )

    inits = [init("w", C, C, 1, 1), init("b", C), init("bias_row", 1, C, 1, 1)]
    nodes = []
    source = "x"
    if excite:
        inits += [init("w1", 4, C, 1, 1), init("b1", 4)]
        inits += [init("w2", C, 4, 1, 1), init("b2", C)]
        nodes += [
            helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
            helper.make_node("Conv", ["pooled", "w1", "b1"], ["fc1"]),
            helper.make_node("Relu", ["fc1"], ["hidden"]),
            helper.make_node("Conv", ["hidden", "w2", "b2"], ["fc2"]),
            helper.make_node("HardSigmoid", ["fc2"], ["gate"], alpha=1 / 6),
            helper.make_node("Mul", ["x", "gate"], ["excited"]),
        ]
        source = "excited"
    nodes.append(helper.make_node("Conv", [source, "w", "b"], ["product"]))
    product = "product"
    if relu_before:
        nodes.append(helper.make_node("Relu", ["product"], ["rectified"]))
        product = "rectified"
    last = "out" if not relu_after else "sum"
    nodes.append(helper.make_node("Add", [residual, product], [last], name="add"))
    if relu_after:
        nodes.append(helper.make_node("Relu", ["sum"], ["out"]))
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or [2, C, H, H])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["a", "b", "c", "d"])
            for name in ("out", *extra_outputs)
        ],
        inits,
    )
    return model_of(graph, 17)


def _feeds() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(12)
    return {"x": rng.standard_normal((2, C, H, H)).astype(np.float32)}


@pytest.mark.parametrize("relu_after", [True, False])
def test_the_add_joins_the_convolution(relu_after: bool) -> None:
    model = _model(relu_after=relu_after)
    (fused,) = rewrite(model).model.graph.node
    assert fused.op_type == "PointwiseResidual"
    assert list(fused.input) == ["x", "w", "b", "x"]
    assert list(fused.output) == ["out"]
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert attrs["activation"] == (b"relu" if relu_after else b"none")
    check_fusions(model, _feeds(), peer_tol=1e-5)


def test_the_add_joins_a_gated_convolution() -> None:
    model = _model(excite=True)
    ops = [node.op_type for node in rewrite(model).model.graph.node]
    assert ops == ["SqueezeGates", "GatedPointwise"]
    gated = rewrite(model).model.graph.node[1]
    assert len(gated.input) == 5 and gated.input[4] == "x"
    check_fusions(model, _feeds(), peer_tol=1e-5)


def test_a_broadcast_residual_is_added_as_numpy_adds() -> None:
    model = _model(residual="bias_row")
    ops = [node.op_type for node in rewrite(model).model.graph.node]
    assert ops == ["PointwiseResidual"]
    check_fusions(model, _feeds(), peer_tol=1e-5)


@pytest.mark.parametrize(
    "changed",
    [
        {"relu_before": True},  # an activation between the product and the Add
        {"extra_outputs": ("product",)},  # the product is read elsewhere
    ],
    ids=["activation-between", "product-read"],
)
def test_anything_else_keeps_the_add(changed: dict[str, Any]) -> None:
    model = _model(**changed)
    ops = [node.op_type for node in rewrite(model).model.graph.node]
    assert "Add" in ops and "PointwiseResidual" not in ops
    check_fusions(model, _feeds(), peer_tol=1e-5)


def test_the_fused_add_runs_at_every_input_shape() -> None:
    """The gated convolution with its residual at every shape, one executor."""
    check_every_shape(
        _model(dims=["N", C, "H", "W"], excite=True),
        "x",
        ((1, C, 7, 7), (3, C, 4, 9), (2, C, 1, 1)),
        seed=13,
    )
