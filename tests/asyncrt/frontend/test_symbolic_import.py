"""Models with symbolic input shapes: one import, a static graph per shape
signature, outputs equal to ONNX Runtime's at many shapes."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import GraphError, InputError, UnsupportedOpError
from asyncrt.frontend import from_onnx
from asyncrt.graph import Graph, SymbolicGraph, SymbolicInput

from .models import model_of, small_cnn
from .placements import round_robin
from .symbolic_models import (
    TINY,
    BertConfig,
    bert_encoder,
    bert_feed,
    cnn_symbolic_batch,
)

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[3]


def _session(model: onnx.ModelProto) -> Any:
    return ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _run(
    graph: SymbolicGraph,
    params: Mapping[str, np.ndarray],
    feed: Mapping[str, np.ndarray],
) -> list[np.ndarray]:
    shapes = {name: array.shape for name, array in feed.items()}
    spec = graph.specialize(shapes, feed)
    with graph_executor.create(
        spec.graph, None, "cpu", params=spec.with_shared(params)
    ) as executor:
        outputs = executor.run_sync(**{name: feed[name] for name in spec.inputs})
    return [out.numpy() for out in outputs or []]


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: Mapping[str, int],
    inits: list[onnx.TensorProto] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """A model of ``nodes``; ``outputs`` gives each output's rank."""
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [
            helper.make_tensor_value_info(
                name, TensorProto.FLOAT, [f"{name}{i}" for i in range(rank)]
            )
            for name, rank in outputs.items()
        ],
        inits or [],
    )
    return model_of(graph, opset)


def test_bert_encoder_matches_onnxruntime_at_many_shapes() -> None:
    model = bert_encoder(TINY)
    session = _session(model)
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    assert graph.inputs["input_ids"] == SymbolicInput(
        "input_ids", "int64", ("batch", "sequence")
    )
    assert graph.symbols == ("batch", "sequence")
    assert graph.shape_valued == ()
    keys = set()
    for batch, seq in [(1, 1), (2, 7), (3, 16), (2, 64), (1, 5), (4, 3)]:
        feed = bert_feed(batch, seq)
        keys.add(graph.signature({k: v.shape for k, v in feed.items()}, feed))
        outputs = _run(graph, params, feed)
        for got, want in zip(outputs, session.run(None, feed), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(keys) == 6


def test_cnn_with_symbolic_batch_matches_onnxruntime() -> None:
    model = cnn_symbolic_batch()
    session = _session(model)
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    assert graph.inputs["x"].shape == ("N", 3, 16, 16)
    rng = np.random.default_rng(3)
    for batch in (1, 2, 3, 5, 8):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        (got,) = _run(graph, params, {"x": x})
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], atol=1e-5)
    with pytest.raises(InputError, match="'x': dimension 1 is 4, the model fixes it"):
        graph.signature({"x": (2, 4, 16, 16)}, {})


@pytest.mark.anyio
async def test_specializations_split_over_cpu_and_sim_devices() -> None:
    model = bert_encoder(TINY)
    session = _session(model)
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    for batch, seq in [(2, 5), (1, 11)]:
        feed = bert_feed(batch, seq)
        spec = graph.specialize({k: v.shape for k, v in feed.items()}, {})
        with graph_executor.create(
            spec.graph,
            None,
            ["cpu:0", "sim:0", "sim:1"],
            policy=round_robin,
            params=spec.with_shared(params),
        ) as executor:
            used = set(executor.plan.placement.values())
            assert {d.kind for d in used} == {"cpu", "sim"}
            outputs = await executor.run(**feed) or []
        for got, want in zip(outputs, session.run(None, feed), strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_specializations_may_be_built_on_several_threads_at_once() -> None:
    graph, _ = from_onnx(bert_encoder(TINY))
    assert isinstance(graph, SymbolicGraph)
    shapes = [
        {k: v.shape for k, v in bert_feed(batch, seq).items()}
        for batch, seq in [(1, 3), (2, 5), (3, 2), (2, 9), (1, 3), (4, 4)]
    ]
    alone = [graph.specialize(s, {}).graph.to_json() for s in shapes]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda s: graph.specialize(s, {}), shapes))
    assert [spec.graph.to_json() for spec in together] == alone


def test_bind_fixes_a_shape_valued_input_and_the_rest_stays_symbolic() -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
        helper.make_node("Add", ["y", "bias"], ["z"]),
    ]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["m"]),
        ],
        {"z": 2},
    )
    graph, params = from_onnx(model, bind={"shape": [2, -1]})
    assert isinstance(graph, SymbolicGraph)
    assert list(graph.inputs) == ["x", "bias"] and graph.shape_valued == ()
    x, bias = np.arange(6, dtype=np.float32), np.ones(3, np.float32)
    (z,) = _run(graph, params, {"x": x, "bias": bias})
    np.testing.assert_array_equal(z, x.reshape(2, 3) + 1)


def test_a_fixed_model_still_imports_the_static_graph() -> None:
    static, _ = from_onnx(small_cnn(batch=2))
    assert isinstance(static, Graph)
    # Fixing the symbol on purpose takes the static path, identically.
    fixed, params = from_onnx(cnn_symbolic_batch(), {"x": (2, 3, 16, 16)})
    assert isinstance(fixed, Graph)
    assert fixed.to_json() == static.to_json()
    assert "fc_w" in params


@pytest.mark.parametrize("name", ["bert", "cnn"])
def test_a_specialization_runs_the_kernels_of_the_static_import(name: str) -> None:
    # The same kernels (configurations included) and tensor shapes as
    # from_onnx(model, shape_dict): a cached signature runs as a static
    # build of its shape does.
    if name == "bert":
        model = bert_encoder(TINY)
        shapes = {k: v.shape for k, v in bert_feed(2, 6).items()}
    else:
        model = cnn_symbolic_batch()
        shapes = {"x": (3, 3, 16, 16)}
    graph, _ = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    spec = graph.specialize(shapes, {})
    static, _ = from_onnx(model, shapes)
    assert isinstance(static, Graph)

    def kernels(g: Graph) -> list[tuple[str, str | None]]:
        return [(n.func_name, n.attrs.get("onnx_op")) for n in g.nodes if not n.is_null]

    assert kernels(spec.graph) == kernels(static)
    assert spec.graph.shape == static.shape and spec.graph.dltype == static.dltype


def test_shape_dict_fixes_a_symbol_in_every_input_that_shares_it() -> None:
    graph, _ = from_onnx(bert_encoder(TINY), {"input_ids": (2, 7)})
    assert isinstance(graph, Graph)  # attention_mask and token_type_ids follow
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"]),
        helper.make_node("Mul", ["s", "z"], ["out"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1]),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, "m"]),
    ]
    model = _model(nodes, inputs, {"out": 2})
    partial, _ = from_onnx(model, {"y": (3, 1)})
    assert isinstance(partial, SymbolicGraph)
    assert partial.inputs["x"].shape == (3, "m")
    assert partial.inputs["z"].shape == ("z_dim0", "m")  # unknown: a new symbol
    with pytest.raises(GraphError, match="fixes it at 1"):
        from_onnx(model, {"y": (3, 2)})
    with pytest.raises(GraphError, match="symbol 'n' the sizes 4 and 3"):
        from_onnx(model, {"y": (3, 1), "x": (4, 2)})


def test_specializations_share_the_weights_and_name_their_own_constants() -> None:
    graph, params = from_onnx(bert_encoder(TINY))
    assert isinstance(graph, SymbolicGraph)
    first = graph.specialize({k: v.shape for k, v in bert_feed(2, 7).items()}, {})
    second = graph.specialize({k: v.shape for k, v in bert_feed(1, 9).items()}, {})
    for spec in (first, second):
        assert "word_embeddings" in spec.shared
        bound = spec.with_shared(params)
        assert bound["word_embeddings"] is params["word_embeddings"]  # not copied
        assert spec.params and all(n.startswith("spec:") for n in spec.params)
        assert not set(spec.params) & set(params)
        assert spec.inputs == ("input_ids", "attention_mask", "token_type_ids")
    # The position embeddings for 7 and for 9 tokens: folded per signature.
    (a,), (b,) = first.params.values(), second.params.values()
    assert a.shape == (1, 7, TINY.hidden) and b.shape == (1, 9, TINY.hidden)
    assert graph.params["word_embeddings"] == ((TINY.vocab, TINY.hidden), "float32")


def test_the_symbolic_graph_holds_only_the_constants_it_reads() -> None:
    config = BertConfig(layers=1, hidden=32, heads=4, intermediate=64, vocab=200)
    graph, params = from_onnx(bert_encoder(config))
    assert isinstance(graph, SymbolicGraph)
    words = weakref.ref(params["word_embeddings"])
    positions = weakref.ref(params["position_embeddings"])
    del params
    gc.collect()
    # Only kernels read the word embeddings: an executor that loaded them
    # holds them once. The position embeddings are gathered per signature.
    assert words() is None and positions() is not None
    feed = bert_feed(2, 3, config)
    spec = graph.specialize({k: v.shape for k, v in feed.items()}, {})
    assert "word_embeddings" in spec.shared
    # A big weight that is also an output is a parameter under its own name.
    weight = np.arange(5000, dtype=np.float32).reshape(100, 50)
    model = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Identity", ["w"], ["w_out"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 100])],
        {"y": 2, "w_out": 2},
        [numpy_helper.from_array(weight, "w")],
    )
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    x = np.ones((3, 100), np.float32)
    y, w_out = _run(graph, params, {"x": x})
    np.testing.assert_allclose(y, x @ weight, rtol=1e-6)
    np.testing.assert_array_equal(w_out, weight)


def test_bytes_round_trip_through_a_worker_process(tmp_path: Path) -> None:
    graph, params = from_onnx(bert_encoder(TINY))
    assert isinstance(graph, SymbolicGraph)
    feed = bert_feed(2, 5)
    (tmp_path / "graph.bin").write_bytes(graph.to_bytes())
    (tmp_path / "params.bin").write_bytes(asyncrt.save_param_dict(params))
    np.savez(tmp_path / "feed.npz", **feed)
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import asyncrt
        from asyncrt import graph_executor
        from asyncrt.graph import SymbolicGraph

        folder = sys.argv[1]
        params = {
            name: array.numpy()
            for name, array in asyncrt.load_param_dict(
                open(folder + "/params.bin", "rb").read()
            ).items()
        }
        graph = SymbolicGraph.from_bytes(
            open(folder + "/graph.bin", "rb").read(), params
        )
        feed = dict(np.load(folder + "/feed.npz"))
        spec = graph.specialize({k: v.shape for k, v in feed.items()}, {})
        with graph_executor.create(
            spec.graph, None, "cpu", params=spec.with_shared(params)
        ) as ex:
            outputs = ex.run_sync(**feed)
        np.savez(folder + "/out.npz", *[o.numpy() for o in outputs])
        """
    )
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        check=True,
        cwd=ROOT,
        timeout=50,
    )
    got = np.load(tmp_path / "out.npz")
    want = _run(graph, params, feed)
    for index, array in enumerate(want):
        np.testing.assert_array_equal(got[f"arr_{index}"], array)
    # In this process too, the same bytes give the same graph.
    again = SymbolicGraph.from_bytes(graph.to_bytes(), params)
    shapes = {k: v.shape for k, v in feed.items()}
    assert (
        again.specialize(shapes, {}).graph.to_json()
        == graph.specialize(shapes, {}).graph.to_json()
    )


def test_a_shape_the_model_cannot_take_is_an_input_error_naming_the_node() -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "rows"], ["y"], name="to_rows"),
        helper.make_node("Reshape", ["x", "pair"], ["z"], name="to_pair"),
    ]
    inits = [
        numpy_helper.from_array(np.array([3, -1], np.int64), "rows"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "pair"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        {"y": 2, "z": 2},
        inits,
    )
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    (y, z) = _run(graph, params, {"x": np.arange(6, dtype=np.float32)})
    assert y.shape == (3, 2) and z.shape == (2, 3)
    with pytest.raises(InputError, match=r"node 'to_rows' \(Reshape\) cannot take n=4"):
        graph.specialize({"x": (4,)}, {})
    with pytest.raises(InputError, match=r"'to_pair' \(Reshape\) cannot take n=9.*9"):
        graph.specialize({"x": (9,)}, {})


def test_an_empty_batch_runs_but_an_empty_sequence_has_no_first_token() -> None:
    model = bert_encoder(TINY)
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    feed = bert_feed(0, 4)
    outputs = _run(graph, params, feed)
    assert [o.shape for o in outputs] == [(0, 4, TINY.hidden), (0, TINY.hidden)]
    # The pooler reads token 0: with no tokens, no run could succeed.
    shapes = {k: v.shape for k, v in bert_feed(2, 0).items()}
    with pytest.raises(
        InputError,
        match=r"\(Gather\) cannot take batch=2, sequence=0: \(Gather\) index 0 is "
        "out of range for axis 1 of size 0",
    ):
        graph.specialize(shapes, {})


def test_a_static_reshape_that_changes_the_size_is_refused() -> None:
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="bad")
    init = numpy_helper.from_array(np.array([5, 3], np.int64), "s")
    model = _model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        {"y": 2},
        [init],
    )
    with pytest.raises(GraphError, match=r"'bad'.*cannot reshape \[2, 6\]"):
        from_onnx(model)


def test_unsupported_operators_are_refused_at_import_not_per_request() -> None:
    node = helper.make_node("Unique", ["x"], ["y"], name="uniq")
    model = _model(
        [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])], {"y": 1}
    )
    with pytest.raises(UnsupportedOpError, match="'uniq'"):
        from_onnx(model)


def test_weights_in_an_external_data_file_are_read_from_it(tmp_path: Path) -> None:
    model = cnn_symbolic_batch()
    path = tmp_path / "cnn.onnx"
    onnx.save_model(
        cnn_symbolic_batch(),  # (saving moves a model's weights out of it)
        str(path),
        save_as_external_data=True,
        location="cnn.weights",
        size_threshold=0,
    )
    graph, params = from_onnx(path)
    assert isinstance(graph, SymbolicGraph)
    reference, _ = from_onnx(model)
    x = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)
    (got,) = _run(graph, params, {"x": x})
    np.testing.assert_allclose(got, _session(model).run(None, {"x": x})[0], atol=1e-5)
    # The static path reads them too.
    static, static_params = from_onnx(path, {"x": (3, 3, 16, 16)})
    assert isinstance(static, Graph)
    assert "fc_w" in static_params
    assert isinstance(reference, SymbolicGraph)


def _conv_hard_swish_symbolic() -> onnx.ModelProto:
    """x (N, 3, 12, 12) -> Conv -> HardSwish -> Conv (stride 2) -> Relu."""
    rng = np.random.default_rng(12)
    inits = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (4, 8, 3, 3)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
        helper.make_node("HardSwish", ["c1"], ["h"]),
        helper.make_node("Conv", ["h", "w2"], ["c2"], pads=[1] * 4, strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_hard_swish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])],
        inits,
    )
    return model_of(graph, 17)


def test_fused_activations_survive_a_symbolic_graphs_bytes() -> None:
    from asyncrt.frontend import _specialize

    model = _conv_hard_swish_symbolic()
    session = _session(model)
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    x = np.random.default_rng(4).standard_normal((3, 3, 12, 12)).astype(np.float32)
    shapes = {"x": x.shape}
    text = graph.specialize(shapes, {}).graph.to_json()
    assert "hard_swish" in text and "relu" in text and "HardSwish" not in text
    (got,) = _run(graph, params, {"x": x})
    want = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    again = SymbolicGraph.from_bytes(graph.to_bytes(), params)
    assert again.specialize(shapes, {}).graph.to_json() == text
    # A payload written before Conv took other activations lists ReLUs only.
    payload = graph._specializer.payload()  # type: ignore[attr-defined]
    (length,) = np.frombuffer(payload[:8], "<u8")
    meta = json.loads(payload[8 : 8 + length])
    relus = [name for name, act in meta.pop("activations").items() if act == "relu"]
    old = json.dumps({**meta, "relu": relus}).encode()
    legacy = len(old).to_bytes(8, "little") + old + payload[8 + length :]
    inputs = tuple(graph.inputs.values())
    loaded = _specialize.load(legacy, inputs, dict(params))
    assert loaded.prepared.activations == {"y": "relu"}
    with pytest.raises(GraphError, match="malformed ONNX payload"):
        broken = json.dumps({**meta, "activations": [1]}).encode()
        _specialize.load(
            len(broken).to_bytes(8, "little") + broken + payload[8 + length :],
            inputs,
            dict(params),
        )
