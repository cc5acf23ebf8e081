"""The import's squeeze-excitation fusion: ``GlobalAveragePool -> Conv ->
Relu -> Conv -> HardSigmoid (or Sigmoid) -> Mul(x)`` as one
``SqueezeExcite`` node, only where it is exactly that block, matching ONNX
Runtime and the unfused import."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from asyncrt.frontend._epilogue import fuse_epilogues
from asyncrt.frontend._rewrite import rewrite

from .models import check_every_shape, check_fusions, model_of

ort = pytest.importorskip("onnxruntime")

C, R, H = 8, 4, 5


def _block(
    *,
    gate: str = "HardSigmoid",
    scaled: str = "x",
    fc1_attrs: dict[str, Any] | None = None,
    extra_outputs: tuple[str, ...] = (),
    dims: list[Any] | None = None,
    projection: dict[str, Any] | None = None,
) -> onnx.ModelProto:
    """x (2, C, H, H) -> Relu -> the squeeze-excitation block -> out; the
    Mul scales ``scaled``; with ``projection`` (the attributes of a Conv),
    a convolution C -> 6 channels of the block's output gives out."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(
            rng.standard_normal((R, C, 1, 1)).astype(np.float32), "w1"
        ),
        numpy_helper.from_array(rng.standard_normal(R).astype(np.float32), "b1"),
        numpy_helper.from_array(
            rng.standard_normal((C, R, 1, 1)).astype(np.float32), "w2"
        ),
        numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b2"),
    ]
    gate_attrs = {"alpha": 1 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}
    nodes = [
        helper.make_node("Relu", ["x_in"], ["x"], name="act"),
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="pool"),
        helper.make_node(
            "Conv", ["pooled", "w1", "b1"], ["fc1"], name="fc1", **(fc1_attrs or {})
        ),
        helper.make_node("Relu", ["fc1"], ["hidden"], name="relu"),
        helper.make_node("Conv", ["hidden", "w2", "b2"], ["fc2"], name="fc2"),
        helper.make_node(gate, ["fc2"], ["gate"], name="gate", **gate_attrs),
        helper.make_node("Mul", [scaled, "gate"], ["out"], name="scale"),
    ]
    if projection is not None:
        shape = (6, C, *projection.pop("kernel", (1, 1)))
        inits += [
            numpy_helper.from_array(
                rng.standard_normal(shape).astype(np.float32), "w3"
            ),
            numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b3"),
        ]
        nodes[-1].output[0] = "excited"
        nodes.append(
            helper.make_node("Conv", ["excited", "w3", "b3"], ["out"], **projection)
        )
    graph = helper.make_graph(
        nodes,
        "se",
        [
            helper.make_tensor_value_info(
                "x_in", TensorProto.FLOAT, dims or [2, C, H, H]
            )
        ],
        [
            helper.make_tensor_value_info(
                name, TensorProto.FLOAT, ["d0", "d1", "d2", "d3"]
            )
            for name in ("out", *extra_outputs)
        ],
        inits,
    )
    return model_of(graph, 17)


def _feeds() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(6)
    return {"x_in": rng.standard_normal((2, C, H, H)).astype(np.float32)}


def _check(model: onnx.ModelProto) -> None:
    check_fusions(model, _feeds(), peer_tol=1e-5)


@pytest.mark.parametrize("gate", ["HardSigmoid", "Sigmoid"])
def test_the_block_is_one_node_and_gives_onnx_runtimes_result(gate: str) -> None:
    model = _block(gate=gate)
    ops = [node.op_type for node in rewrite(model).model.graph.node]
    # the Relu before the block folds into nothing here (no Conv before it)
    assert ops == ["Relu", "SqueezeExcite"]
    fused = rewrite(model).model.graph.node[1]
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert attrs["gate"] == (b"hard_sigmoid" if gate == "HardSigmoid" else b"sigmoid")
    assert list(fused.input) == ["x", "w1", "b1", "w2", "b2"]
    _check(model)


def test_a_relu_not_folded_into_the_first_conv_is_absorbed_too() -> None:
    """Called without the folded activations (the Relu still a node of its
    own), the fusion takes the Relu with it."""
    model = _block()
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    assert fuse_epilogues(graph, values.get, 17) == 5  # six nodes, one left
    assert [node.op_type for node in graph.node] == ["Relu", "SqueezeExcite"]


@pytest.mark.parametrize(
    "changed",
    [
        {"scaled": "x_in"},  # the Mul scales another tensor
        {"fc1_attrs": {"strides": [2, 2]}},  # not a plain 1 x 1 convolution
        {"gate": "Tanh"},  # not a gate the kernel computes
        {"extra_outputs": ("gate",)},  # the gate is read elsewhere
    ],
    ids=["other-tensor", "strided", "tanh", "gate-read"],
)
def test_anything_but_the_exact_block_is_left_alone(changed: dict[str, Any]) -> None:
    model = _block(**changed)
    ops = [node.op_type for node in rewrite(model).model.graph.node]
    assert "SqueezeExcite" not in ops and "GlobalAveragePool" in ops
    if changed.get("gate") != "Tanh":
        _check(model)


def test_the_fused_block_runs_at_every_input_shape() -> None:
    """Imported with a symbolic batch and plane, one executor runs every
    shape, fused, as ONNX Runtime does."""
    check_every_shape(
        _block(dims=["N", C, "H", "W"]),
        "x_in",
        ((1, C, 7, 7), (3, C, 4, 9), (2, C, 1, 1)),
        seed=7,
    )


def test_a_pointwise_convolution_after_it_scales_its_rows_by_the_gates() -> None:
    model = _block(projection={})
    graph = rewrite(model).model.graph
    assert [node.op_type for node in graph.node] == [
        "Relu",
        "SqueezeGates",
        "GatedPointwise",
    ]
    gates, gated = graph.node[1], graph.node[2]
    assert list(gated.input) == ["x", gates.output[0], "w3", "b3"]
    assert list(gated.output) == ["out"]
    _check(model)


@pytest.mark.parametrize(
    "changed",
    [
        {"projection": {"strides": [2, 2]}},  # not a plain 1 x 1 convolution
        {"projection": {"kernel": (3, 3), "pads": [1, 1, 1, 1]}},
        {"projection": {}, "extra_outputs": ("excited",)},  # read elsewhere
    ],
    ids=["strided", "3x3", "excited-read"],
)
def test_other_convolutions_after_it_keep_the_excitation(
    changed: dict[str, Any],
) -> None:
    model = _block(**changed)
    ops = [node.op_type for node in rewrite(model).model.graph.node]
    assert ops == ["Relu", "SqueezeExcite", "Conv"]
    _check(model)


def test_the_gated_convolution_runs_at_every_input_shape() -> None:
    """The gates and the gated convolution at every shape, one executor."""
    check_every_shape(
        _block(dims=["N", C, "H", "W"], projection={}),
        "x_in",
        ((1, C, 7, 7), (3, C, 4, 9), (2, C, 1, 1)),
        seed=8,
    )
