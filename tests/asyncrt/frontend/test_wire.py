"""Reading a model file's structure and weights apart, each once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from asyncrt.errors import GraphError
from asyncrt.frontend import from_onnx
from asyncrt.frontend._weights import without_initializers
from asyncrt.frontend._wire import scan
from asyncrt.graph import SymbolicGraph

from .models import model_of
from .symbolic_models import TINY, bert_encoder, bert_feed


def _mixed_model() -> onnx.ModelProto:
    """Initializers stored every way: raw data of several dtypes, typed
    fields, a scalar, an empty tensor."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "f32"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float16), "f16"),
        numpy_helper.from_array(np.array([-3, 1 << 40], np.int64), "i64"),
        numpy_helper.from_array(np.array([True, False, True]), "flags"),
        numpy_helper.from_array(np.array(2.5, np.float64), "scalar"),
        numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"),
        helper.make_tensor("typed", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0]),
        helper.make_tensor("typed_ints", TensorProto.INT32, [3], [7, -8, 9]),
    ]
    nodes = [helper.make_node("Add", ["x", "f32"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        inits,
    )
    return model_of(graph, 17)


def test_scan_reads_the_structure_and_every_weight_once(tmp_path: Path) -> None:
    model = _mixed_model()
    path = tmp_path / "mixed.onnx"
    onnx.save_model(model, str(path))
    for source in (path, model.SerializeToString()):
        scanned = scan(source)
        assert scanned.model == without_initializers(model)
        weights = scanned.read_weights()
        assert list(weights) == [init.name for init in model.graph.initializer]
        for init in model.graph.initializer:
            expected = numpy_helper.to_array(init)
            assert weights[init.name].dtype == expected.dtype
            assert weights[init.name].shape == expected.shape
            np.testing.assert_array_equal(weights[init.name], expected)
            assert weights[init.name].flags.writeable
        placeholders = scanned.placeholders()
        assert [(p.name, p.data_type) for p in placeholders] == [
            (init.name, init.data_type) for init in model.graph.initializer
        ]


def test_a_symbolic_model_imports_the_same_from_a_file_bytes_or_a_message(
    tmp_path: Path,
) -> None:
    model = bert_encoder(TINY)
    path = tmp_path / "bert.onnx"
    onnx.save_model(model, str(path))
    feed = bert_feed(2, 5)
    shapes = {k: v.shape for k, v in feed.items()}
    graphs = []
    for source in (model, path, model.SerializeToString()):
        graph, params = from_onnx(source)
        assert isinstance(graph, SymbolicGraph)
        graphs.append((graph.specialize(shapes, {}).graph.to_json(), params))
    (json0, params0), *others = graphs
    for json_other, params_other in others:
        assert json_other == json0
        assert params_other.keys() == params0.keys()
        for name, array in params0.items():
            np.testing.assert_array_equal(params_other[name], array)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated inside a weight
        lambda data: b"\xff" * 12,  # a varint that never ends
        lambda data: b"\x0b\x00",  # a group: no wire type ONNX uses
    ],
    ids=["truncated", "endless-varint", "group"],
)
def test_malformed_bytes_are_graph_errors(damage: object, tmp_path: Path) -> None:
    data = _mixed_model().SerializeToString()
    broken = damage(data)  # type: ignore[operator]
    with pytest.raises(GraphError, match="not an ONNX model"):
        scan(broken)
    path = tmp_path / "broken.onnx"
    path.write_bytes(broken)
    with pytest.raises(GraphError, match="not an ONNX model"):
        from_onnx(path)


def test_a_raw_size_that_does_not_match_the_dims_is_refused() -> None:
    model = _mixed_model()
    model.graph.initializer[0].raw_data = b"\x00" * 8
    with pytest.raises(GraphError, match=r"'f32'.*8 bytes for 12 elements"):
        scan(model.SerializeToString()).read_weights()


def test_a_missing_file_is_a_graph_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="cannot read the ONNX model") as info:
        from_onnx(tmp_path / "nope.onnx")
    assert info.value.source == str(tmp_path / "nope.onnx")
