"""Whole models from ONNX against ONNX Runtime: on cpu, split across cpu
and sim devices by the scheduler, and through an exported artifact."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import asyncrt
import devices.cpu
from asyncrt import graph_executor
from asyncrt.errors import GraphError
from asyncrt.frontend import from_onnx
from devices import sim
from devices.sim import SimConfig

from .models import encoder_block, model_of, small_cnn
from .placements import round_robin

ort = pytest.importorskip("onnxruntime")

MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], tuple[int, ...]]] = {
    "cnn": (small_cnn, (2, 3, 16, 16)),
    "encoder": (encoder_block, (2, 8, 32)),
}
SPLIT = ["cpu:0", "sim:0", "sim:1"]


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    result: np.ndarray = session.run(None, {"x": x})[0]
    return result


def _case(name: str) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    make, shape = MODELS[name]
    model = make()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return model, x, _reference(model, x)


@pytest.mark.parametrize("name", MODELS)
def test_matches_onnxruntime_on_cpu(name: str) -> None:
    model, x, expected = _case(name)
    graph, params = from_onnx(model)
    with asyncrt.build(graph, params).create("cpu") as executor:
        (y,) = executor.run_sync(x=x) or []
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("policy", ["heft", "round_robin"])
async def test_matches_onnxruntime_split_across_devices(
    name: str, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fast simulated devices and a slow host, so that HEFT moves work off the
    # host whatever this machine's measured matmul speed (the cpu's "flops").
    sim.configure(2, SimConfig(flops=1e12, bandwidth=1e11, latency=1e-6))
    monkeypatch.setattr(devices.cpu, "_measured_flops", lambda: 1e8)
    model, x, expected = _case(name)
    graph, params = from_onnx(model)
    chosen = round_robin if policy == "round_robin" else policy
    with graph_executor.create(graph, None, SPLIT, policy=chosen, params=params) as ex:
        used = {
            ex.plan.placement[n]
            for n, node in enumerate(graph.nodes)
            if not node.is_null
        }
        assert any(d.kind == "sim" for d in used)
        if policy == "round_robin":
            assert len(used) == 3
        (y,) = await ex.run(x=x) or []
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "attrs",
    [
        {"group": 2},
        {"group": 4, "strides": [2, 2], "pads": [1, 0, 1, 2]},
        {"dilations": [2, 2], "pads": [2, 1, 2, 1]},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        {"group": 8, "auto_pad": "SAME_LOWER", "strides": [2, 1]},
    ],
    ids=["grouped", "grouped-strided", "dilated", "same-upper", "depthwise-same-lower"],
)
def test_conv_variants_match_onnxruntime(attrs: dict[str, object]) -> None:
    rng = np.random.default_rng(3)
    group = int(attrs.get("group", 1))  # type: ignore[call-overload]
    weight = rng.standard_normal((8, 8 // group, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    node = onnx.helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    graph = onnx.helper.make_graph(
        [node],
        "conv",
        [
            onnx.helper.make_tensor_value_info(
                "x", onnx.TensorProto.FLOAT, [2, 8, 9, 11]
            )
        ],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list("nchw"))],
        [
            onnx.numpy_helper.from_array(weight, "w"),
            onnx.numpy_helper.from_array(bias, "b"),
        ],
    )
    model = model_of(graph, 17)
    x = rng.standard_normal((2, 8, 9, 11)).astype(np.float32)
    graph_, params = from_onnx(model)
    with asyncrt.build(graph_, params).create() as executor:
        (y,) = executor.run_sync(x=x) or []
    np.testing.assert_allclose(y.numpy(), _reference(model, x), rtol=1e-4, atol=1e-5)


def test_exported_artifact_runs_from_data(tmp_path: Path) -> None:
    model, x, expected = _case("cnn")
    graph, params = from_onnx(model)
    path = tmp_path / "cnn.asyncrt"
    asyncrt.build(graph, params, devices=SPLIT, policy="heft").export_library(path)
    factory = asyncrt.load_module(path)
    with factory.create(SPLIT, policy="heft") as executor:
        (y,) = executor.run_sync(x=x) or []
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-5)
    # The artifact names each library kernel by its op and attributes, as data.
    conv = next(n for n in factory.graph.nodes if n.attrs.get("onnx_op") == "Conv")
    assert conv.attrs["op_name"] == "conv"
    assert json.loads(conv.attrs["op_attrs"])["pads"] == [1, 1, 1, 1]


def test_tampered_op_attrs_are_refused() -> None:
    graph, _ = from_onnx(small_cnn())
    document = json.loads(graph.to_json())
    node = next(
        n for n in document["nodes"] if n.get("attrs", {}).get("op_name") == "conv"
    )
    attrs = json.loads(node["attrs"]["op_attrs"])
    attrs["group"] = 2  # a different kernel behind the same func_name
    node["attrs"]["op_attrs"] = json.dumps(attrs, sort_keys=True, separators=(",", ":"))
    with pytest.raises(GraphError, match="does not match"):
        asyncrt.build(json.dumps(document))
