"""The import's fusion of an inverted residual block's expansion and
depthwise step: ``Conv 1x1 [-> Relu | HardSwish] -> Conv depthwise`` as one
``PointwiseDepthwise`` node, only where it is exactly that, matching ONNX
Runtime and the unfused import."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from asyncrt.frontend._rewrite import rewrite

from .models import check_every_shape, check_fusions, model_of

ort = pytest.importorskip("onnxruntime")

CIN, C, H = 6, 20, 9


def _block(
    *,
    expand_act: str | None = "Relu",
    depthwise_act: str | None = "HardSwish",
    dw_attrs: dict[str, Any] | None = None,
    dw_weights_input: bool = False,
    extra_outputs: tuple[str, ...] = (),
    dims: list[Any] | None = None,
) -> onnx.ModelProto:
    rng = np.random.default_rng(8)
    w2_shape = (C, 1, 3, 3)
    if dw_attrs and dw_attrs.get("group") == C // 2:
        w2_shape = (C, 2, 3, 3)
    inits = [
        numpy_helper.from_array(
            (rng.standard_normal((C, CIN, 1, 1)) / 2).astype(np.float32), "w1"
        ),
        numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b2"),
    ]
    w2 = rng.standard_normal(w2_shape).astype(np.float32)
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or [2, CIN, H, H])
    ]
    if dw_weights_input:
        inputs.append(
            helper.make_tensor_value_info("w2", TensorProto.FLOAT, list(w2_shape))
        )
    else:
        inits.append(numpy_helper.from_array(w2, "w2"))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["expanded"], name="expand")]
    middle = "expanded"
    if expand_act:
        nodes.append(helper.make_node(expand_act, [middle], ["activated"], name="act1"))
        middle = "activated"
    attrs = {"group": C, "pads": [1, 1, 1, 1], "strides": [2, 2], **(dw_attrs or {})}
    attrs = {key: value for key, value in attrs.items() if value is not None}
    nodes.append(
        helper.make_node("Conv", [middle, "w2", "b2"], ["dw"], name="dw", **attrs)
    )
    last = "dw"
    if depthwise_act:
        nodes.append(helper.make_node(depthwise_act, ["dw"], ["out"], name="act2"))
        last = "out"
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["d0", "d1", "d2", "d3"])
        for name in (last, *extra_outputs)
    ]
    graph = helper.make_graph(nodes, "pwdw", inputs, outputs, inits)
    return model_of(graph, 17)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(9)
    feeds = {"x": rng.standard_normal((2, CIN, H, H)).astype(np.float32)}
    if any(i.name == "w2" for i in model.graph.input):
        feeds["w2"] = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
    return feeds


@pytest.mark.parametrize(
    ("expand_act", "depthwise_act", "names"),
    [
        ("Relu", "Relu", (b"relu", b"relu")),
        ("HardSwish", "HardSwish", (b"hard_swish", b"hard_swish")),
        (None, None, (b"none", b"none")),
    ],
)
def test_the_pair_is_one_node_and_gives_onnx_runtimes_result(
    expand_act: str | None, depthwise_act: str | None, names: tuple[bytes, bytes]
) -> None:
    model = _block(expand_act=expand_act, depthwise_act=depthwise_act)
    (fused,) = rewrite(model).model.graph.node
    assert fused.op_type == "PointwiseDepthwise"
    assert list(fused.input) == ["x", "w1", "b1", "w2", "b2"]
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert (attrs["pointwise_activation"], attrs["activation"]) == names
    assert attrs["strides"] == [2, 2] and attrs["pads"] == [1, 1, 1, 1]
    check_fusions(model, _feeds(model), peer_tol=1e-5)


@pytest.mark.parametrize(
    "changed",
    [
        {"extra_outputs": ("activated",)},  # the expansion is read elsewhere
        {"dw_weights_input": True},  # the depthwise weights are an input
        {"dw_attrs": {"group": C // 2}},  # two channels a group
        {"dw_attrs": {"auto_pad": "SAME_UPPER", "pads": None}},
    ],
    ids=["expansion-read", "weights-input", "grouped", "auto-pad"],
)
def test_anything_but_the_exact_pair_is_left_alone(changed: dict[str, Any]) -> None:
    model = _block(**changed)
    ops = [node.op_type for node in rewrite(model).model.graph.node]
    assert "PointwiseDepthwise" not in ops and ops.count("Conv") == 2
    check_fusions(model, _feeds(model), peer_tol=1e-5)


def test_the_fused_pair_runs_at_every_input_shape() -> None:
    """Imported with a symbolic batch and plane, one executor runs every
    shape, fused, as ONNX Runtime does."""
    check_every_shape(
        _block(dims=["N", CIN, "H", "W"]),
        "x",
        ((1, CIN, 7, 7), (3, CIN, 4, 9), (2, CIN, 1, 1)),
        seed=10,
    )
