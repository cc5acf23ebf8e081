"""The ONNX importer: folding, params, shapes, and every refusal's message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import asyncrt
from asyncrt.errors import GraphError, UnsupportedOpError
from asyncrt.frontend import SUPPORTED_OPS, from_onnx, static_inputs
from asyncrt.graph import Graph, SymbolicGraph

from .models import model_of, small_cnn


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    inits: tuple[onnx.TensorProto, ...] | list[onnx.TensorProto] = (),
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", inputs, [_output(o) for o in outputs], list(inits)
    )
    return model_of(graph, opset)


def _output(name: str) -> onnx.ValueInfoProto:
    # Output shapes are the importer's to infer; ONNX's checker wants a rank.
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["d"])


def _input(
    name: str, shape: list[Any], dtype: int = TensorProto.FLOAT
) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _run(model: onnx.ModelProto, **inputs: np.ndarray) -> np.ndarray:
    graph, params = from_onnx(model)
    with asyncrt.build(graph, params).create() as executor:
        (out,) = executor.run_sync(**inputs) or []
    return out.numpy()


def test_shape_chains_fold_and_initializers_become_params() -> None:
    graph, params = from_onnx(small_cnn(), optimize=False)
    kernels = [node.func_name.split(".")[0] for node in graph.nodes if not node.is_null]
    # Shape -> Gather -> Concat was computed at import; only the reshape is left.
    assert "gather" not in kernels and "concat" not in kernels
    assert kernels.count("__nop") == 1
    assert {"w1", "b1", "fc_w", "bn1_scale"} <= params.keys()
    assert "axis0" not in params  # folded away: no kernel reads it
    ops = {node.attrs.get("onnx_op") for node in graph.nodes if not node.is_null}
    assert {"Conv", "BatchNormalization", "Gemm", "Reshape"} <= ops


def test_unsupported_operator_names_op_node_and_opset() -> None:
    node = helper.make_node("Det", ["x"], ["y"], name="det")
    model = _model([node], [_input("x", [3, 3])], ["y"])
    with pytest.raises(UnsupportedOpError) as info:
        from_onnx(model)
    assert (info.value.op_type, info.value.node, info.value.opset) == (
        "Det",
        "det",
        17,
    )
    assert "Det" in str(info.value) and "'det'" in str(info.value)
    assert "Det" not in SUPPORTED_OPS


def test_unsupported_attribute_value_is_named() -> None:
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="circular", name="pad")
    pads = numpy_helper.from_array(np.array([1, 1], np.int64), "pads")
    model = _model([node], [_input("x", [3])], ["y"], [pads], opset=19)
    with pytest.raises(UnsupportedOpError, match="mode='circular'") as info:
        from_onnx(model)
    assert info.value.attribute == "mode"


def test_training_mode_is_refused_not_ignored() -> None:
    names = ["x", "s", "b", "m", "v"]
    node = helper.make_node("BatchNormalization", names, ["y"], training_mode=1)
    inits = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in names[1:]]
    model = _model([node], [_input("x", [1, 2, 3])], ["y"], inits, opset=15)
    with pytest.raises(UnsupportedOpError, match="training_mode"):
        from_onnx(model)


def test_other_domains_are_refused() -> None:
    node = helper.make_node("FusedGemm", ["x"], ["y"], domain="com.microsoft", name="f")
    graph = helper.make_graph([node], "g", [_input("x", [2])], [_output("y")])
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("com.microsoft", 1),
        ],
    )
    with pytest.raises(UnsupportedOpError, match=r"com\.microsoft"):
        from_onnx(model)


def test_symbolic_dimensions_import_symbolic_unless_shape_dict_fixes_them() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    model = _model([node], [_input("x", ["batch", 4])], ["y"])
    symbolic, _ = from_onnx(model)
    assert isinstance(symbolic, SymbolicGraph)
    assert symbolic.inputs["x"].shape == ("batch", 4)
    graph, _ = from_onnx(model, {"x": (3, 4)})
    assert isinstance(graph, Graph) and graph.shape[0] == (3, 4)
    with pytest.raises(GraphError, match="not an input"):
        from_onnx(model, {"nope": (1,)})


def test_shape_dict_fixes_symbols_but_never_overrides_fixed_dimensions() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    model = _model([node], [_input("x", ["batch", 3, 32, 32])], ["y"])
    with pytest.raises(GraphError, match=r"dimension 2 as 224.*fixes it at 32") as info:
        from_onnx(model, {"x": (1, 3, 224, 224)})
    assert info.value.node == "x" and "'x'" in str(info.value)
    with pytest.raises(GraphError, match=r"gives 3 dimension\(s\).*declares 4"):
        from_onnx(model, {"x": (1, 3, 32)})
    graph, _ = from_onnx(model, {"x": (5, 3, 32, 32)})  # the symbol, fixed
    assert graph.shape[0] == (5, 3, 32, 32)


def test_shape_deciding_inputs_are_shape_valued_unless_bound() -> None:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")
    shape_input = _input("shape", [2], TensorProto.INT64)
    model = _model([node], [_input("x", [2, 6]), shape_input], ["y"])
    symbolic, _ = from_onnx(model)
    assert isinstance(symbolic, SymbolicGraph)
    assert symbolic.shape_valued == ("shape",)
    assert static_inputs(model) == ("shape",)
    graph, params = from_onnx(model, bind={"shape": [3, 4]})
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    with asyncrt.build(graph, params).create() as executor:
        (y,) = executor.run_sync(x=x) or []
    np.testing.assert_array_equal(y.numpy(), x.reshape(3, 4))


def test_static_inputs_look_through_computations_but_not_shape() -> None:
    nodes = [
        helper.make_node("Add", ["n", "one"], ["n1"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Concat", ["n1", "s"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    model = _model(
        nodes, [_input("x", [4]), _input("n", [1], TensorProto.INT64)], ["y"], [one]
    )
    assert static_inputs(model) == ("n",)


def test_unsupported_input_dtype_is_named() -> None:
    node = helper.make_node("Identity", ["x"], ["y"])
    model = _model([node], [_input("x", [2], TensorProto.COMPLEX64)], ["y"])
    with pytest.raises(GraphError, match="COMPLEX64") as info:
        from_onnx(model)
    assert info.value.node == "x"


def test_invalid_model_is_a_graph_error(tmp_path: Path) -> None:
    node = helper.make_node("Relu", ["missing"], ["y"])
    model = _model([node], [_input("x", [2])], ["y"])
    with pytest.raises(GraphError, match="invalid ONNX model"):
        from_onnx(model)
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"not a protobuf")
    with pytest.raises(GraphError) as info:
        from_onnx(path)
    assert info.value.source == str(path)


def test_loads_from_path_and_bytes(tmp_path: Path) -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], axis=0)
    model = _model([node], [_input("x", [3])], ["y"])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    expected = np.exp(x) / np.exp(x).sum()
    for source in (path, str(path), model.SerializeToString()):
        graph, params = from_onnx(source)
        with asyncrt.build(graph, params).create() as executor:
            (y,) = executor.run_sync(x=x) or []
        np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)


def test_elementwise_ops_use_the_builtin_kernel_names() -> None:
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["a"]),
        helper.make_node("Tanh", ["a"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["c"]),
        helper.make_node("Sub", ["c", "x"], ["y"]),
    ]
    graph, _ = from_onnx(_model(nodes, [_input("x", [4])], ["y"]))
    names = [node.func_name for node in graph.nodes if not node.is_null]
    assert names == ["multiply", "tanh", "sigmoid", "subtract"]


def test_constant_outputs_and_input_passthrough() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT),
    ]
    graph_ = helper.make_graph(
        nodes,
        "g",
        [_input("x", [2, 5])],
        [_output("y"), helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
    )
    model = model_of(graph_, 17)
    graph, params = from_onnx(model)
    x = np.ones((2, 5), np.float32)
    with asyncrt.build(graph, params).create() as executor:
        y, x_out = executor.run_sync(x=x) or []
    np.testing.assert_array_equal(y.numpy(), [2.0, 5.0])
    np.testing.assert_array_equal(x_out.numpy(), x)
