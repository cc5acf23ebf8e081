"""Import-time rewrites: BatchNormalization folded into Conv, Conv -> Relu
fused; each where it is safe only, each matching ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import asyncrt
from asyncrt.frontend import from_onnx
from asyncrt.frontend._rewrite import rewrite

from .models import model_of, small_cnn

ort = pytest.importorskip("onnxruntime")


def _bn_inits(rng: np.random.Generator, channels: int) -> list[onnx.TensorProto]:
    arrays = {
        "scale": rng.uniform(0.5, 1.5, channels),
        "shift": rng.standard_normal(channels),
        "mean": rng.standard_normal(channels),
        "var": rng.uniform(0.5, 1.5, channels),
    }
    return [
        numpy_helper.from_array(a.astype(np.float32), name)
        for name, a in arrays.items()
    ]


def _conv_model(
    tail: list[onnx.NodeProto],
    outputs: list[str],
    *,
    bias: bool = True,
    strides: tuple[int, int] = (1, 1),
    stats_input: bool = False,
) -> onnx.ModelProto:
    """x (2, 3, 7, 6) -> Conv (4 channels, 3x3, pad 1) named "c" -> ``tail``."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(
            rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"
        ),
        *_bn_inits(rng, 4),
    ]
    if bias:
        inits.append(
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
        )
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 6])]
    if stats_input:  # the mean is a graph input: not a constant
        inits = [i for i in inits if i.name != "mean"]
        inputs.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, [4]))
    conv = helper.make_node(
        "Conv",
        ["x", "w", "b"] if bias else ["x", "w"],
        ["c"],
        pads=[1, 1, 1, 1],
        strides=list(strides),
        name="conv",
    )
    graph = helper.make_graph(
        [conv, *tail],
        "g",
        inputs,
        [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, ["d"] * 4)
            for o in outputs
        ],
        inits,
    )
    model = model_of(graph, 17)
    onnx.checker.check_model(model)
    return model


def _bn(x: str = "c", y: str = "n") -> onnx.NodeProto:
    return helper.make_node(
        "BatchNormalization",
        [x, "scale", "shift", "mean", "var"],
        [y],
        epsilon=1e-3,
        name="bn",
    )


def _relu(x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("Relu", [x], [y], name=f"relu_{x}")


def _ops(model: onnx.ModelProto, **kw: bool) -> list[str]:
    graph, _ = from_onnx(model, **kw)
    return [str(node.attrs.get("onnx_op")) for node in graph.nodes if not node.is_null]


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """asyncrt (rewritten) against ONNX Runtime, every output."""
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    want = session.run(None, feeds)
    graph, params = from_onnx(model)
    with asyncrt.build(graph, params).create("cpu") as executor:
        got = executor.run_sync(**feeds) or []
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


def _x() -> np.ndarray:
    return np.random.default_rng(6).standard_normal((2, 3, 7, 6)).astype(np.float32)


@pytest.mark.parametrize("bias", [True, False])
def test_batch_norm_folds_into_the_conv_before_it(bias: bool) -> None:
    model = _conv_model([_bn()], ["n"], bias=bias)
    before = model.SerializeToString()
    assert _ops(model) == ["Conv"]
    assert _ops(model, optimize=False) == ["Conv", "BatchNormalization"]
    assert model.SerializeToString() == before  # the caller's model untouched
    _check(model, {"x": _x()})


def test_folded_weights_are_the_literal_products() -> None:
    model = _conv_model([_bn()], ["n"])
    done = rewrite(model)
    assert done.folded == 1 and done.activations == {}
    (conv,) = done.model.graph.node
    inits = {i.name: numpy_helper.to_array(i) for i in done.model.graph.initializer}
    w, b = inits[conv.input[1]], inits[conv.input[2]]
    scale, shift, mean, var = (
        inits[k].astype(np.float64) for k in ("scale", "shift", "mean", "var")
    )
    a = scale / np.sqrt(var + 1e-3)
    np.testing.assert_array_equal(
        w, (inits["w"] * a.reshape(4, 1, 1, 1)).astype(np.float32)
    )
    np.testing.assert_array_equal(
        b, ((inits["b"] - mean) * a + shift).astype(np.float32)
    )
    assert list(conv.output) == ["n"]


def test_conv_relu_fuses_after_a_fold() -> None:
    model = _conv_model([_bn(), _relu("n", "r")], ["r"])
    done = rewrite(model)
    assert (done.folded, done.activations) == (1, {"r": "relu"})
    graph, _ = from_onnx(model)
    (conv,) = [n for n in graph.nodes if not n.is_null]
    assert '"activation":"relu"' in str(conv.attrs["op_attrs"]).replace(" ", "")
    _check(model, {"x": _x()})


def test_conv_relu_fuses_on_the_strided_path_too() -> None:
    model = _conv_model([_relu("c", "r")], ["r"], strides=(2, 1))
    assert _ops(model) == ["Conv"]
    _check(model, {"x": _x()})


def test_nothing_is_rewritten_where_the_conv_output_is_read_elsewhere() -> None:
    # The conv output is a graph output, and another node's input.
    as_output = _conv_model([_bn(), _relu("n", "r")], ["c", "r"])
    assert _ops(as_output) == ["Conv", "BatchNormalization", "Relu"]
    _check(as_output, {"x": _x()})
    two_readers = _conv_model(
        [_bn(), _relu("c", "r")], ["n", "r"]
    )  # conv -> bn and conv -> relu
    assert sorted(_ops(two_readers)) == ["BatchNormalization", "Conv", "Relu"]
    _check(two_readers, {"x": _x()})


def test_statistics_that_are_inputs_are_not_folded() -> None:
    model = _conv_model([_bn()], ["n"], stats_input=True)
    assert _ops(model) == ["Conv", "BatchNormalization"]
    mean = np.random.default_rng(7).standard_normal(4).astype(np.float32)
    _check(model, {"x": _x(), "mean": mean})


def test_the_small_cnn_loses_its_batch_norms_and_relus() -> None:
    ops = _ops(small_cnn())
    assert "BatchNormalization" not in ops
    # relu1 reads a folded conv (folded into it); relu2's conv output goes
    # to bn2, then relu2 (both fused); relu3 follows conv3.
    assert "Relu" not in ops
    assert ops.count("Conv") == 3


def _projections(opset: int, product_is_output: bool = False) -> onnx.ModelProto:
    """x (2, 5, 6) -> x @ wa + ba, x @ wb + bb (and x @ wc, 6 rows too,
    unbiased; x @ wd has 4 rows and reads another input: not merged)."""
    rng = np.random.default_rng(8)
    arrays = {
        "wa": rng.standard_normal((6, 3)),
        "wb": rng.standard_normal((6, 5)),
        "wc": rng.standard_normal((6, 2)),
        "wd": rng.standard_normal((4, 2)),
        "ba": rng.standard_normal(3),
        "bb": rng.standard_normal(5),
    }
    inits = [
        numpy_helper.from_array(a.astype(np.float32), k) for k, a in arrays.items()
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "wa"], ["pa"], name="a"),
        helper.make_node("Add", ["pa", "ba"], ["ya"], name="a_bias"),
        helper.make_node("MatMul", ["x", "wb"], ["pb"], name="b"),
        helper.make_node("Add", ["bb", "pb"], ["yb"], name="b_bias"),
        helper.make_node("MatMul", ["x", "wc"], ["yc"], name="c"),
        helper.make_node("MatMul", ["z", "wd"], ["yd"], name="d"),
    ]
    outputs = ["ya", "yb", "yc", "yd"] + (["pa"] if product_is_output else [])
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 6]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4]),
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["d"]) for o in outputs],
        inits,
    )
    return model_of(graph, opset)


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(9)
    return {
        "x": rng.standard_normal((2, 5, 6)).astype(np.float32),
        "z": rng.standard_normal((3, 4)).astype(np.float32),
    }


@pytest.mark.parametrize("opset", [11, 17])
def test_matmuls_sharing_an_input_merge_into_one(opset: int) -> None:
    model = _projections(opset)
    done = rewrite(model)
    assert done.merged == 3
    ops = [n.op_type for n in done.model.graph.node]
    # a, b and c share x (6 rows); d reads z. With c unbiased, the biases
    # are not merged: the Adds stay and read the Split's outputs.
    assert ops == ["MatMul", "Split", "Add", "Add", "MatMul"]
    merged = done.model.graph.node[0]
    inits = {i.name: numpy_helper.to_array(i) for i in done.model.graph.initializer}
    np.testing.assert_array_equal(
        inits[merged.input[1]],
        np.concatenate([inits["wa"], inits["wb"], inits["wc"]], axis=1),
    )
    assert list(done.model.graph.node[1].output) == ["pa", "pb", "yc"]
    _check(model, _feeds())


def test_biases_merge_where_every_product_has_one() -> None:
    model = _projections(17)
    # drop c: a and b both have biases, so one Add serves both
    kept = [n for n in model.graph.node if n.name != "c"]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    del model.graph.output[2]
    done = rewrite(model)
    ops = [n.op_type for n in done.model.graph.node]
    # the merged bias add then joins the merged product, and the Split too:
    # the product's parts are the fused node's outputs (see _epilogue)
    assert ops == ["MatMulBias", "MatMul"]
    fused = done.model.graph.node[0]
    assert list(fused.output) == ["ya", "yb"]
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert (attrs["axis"], list(attrs["splits"])) == (-1, [3, 5])
    _check(model, {**_feeds()})


def _split_product(
    axis: int, sizes: list[int] | None, x_shape: list[int], width: int
) -> onnx.ModelProto:
    """x @ w + b, then a Split of the sum (sizes as an input, or equal)."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((x_shape[-1], width)).astype(np.float32)
    b = rng.standard_normal(width).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    count = len(sizes) if sizes else 3
    outputs = [f"y{i}" for i in range(count)]
    split_inputs = ["s"]
    if sizes:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        split_inputs.append("sizes")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="qkv"),
        helper.make_node("Add", ["p", "b"], ["s"], name="qkv_bias"),
        helper.make_node("Split", split_inputs, outputs, axis=axis, name="split"),
    ]
    if not sizes:  # opset 18 on: the parts' count, equal widths
        nodes[-1].attribute.append(helper.make_attribute("num_outputs", count))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["d"]) for o in outputs],
        inits,
    )
    return model_of(graph, 18 if not sizes else 17)


@pytest.mark.parametrize(
    ("axis", "sizes", "x_shape", "width"),
    [
        (2, [4, 4, 4], [2, 5, 6], 12),  # GPT-2's c_attn: the axis counted
        (-1, None, [5, 6], 9),  # equal parts, the count given
        (0, [1, 3], [4, 5, 6], 4),  # not the last axis, as wide as it
    ],
)
def test_a_split_of_the_product_becomes_the_fused_nodes_outputs(
    axis: int, sizes: list[int] | None, x_shape: list[int], width: int
) -> None:
    model = _split_product(axis, sizes, x_shape, width)
    ops = [n.op_type for n in rewrite(model).model.graph.node]
    assert ops == ["MatMulBias"]
    rng = np.random.default_rng(13)
    _check(model, {"x": rng.standard_normal(x_shape).astype(np.float32)})


def test_a_split_that_does_not_cut_the_product_stays() -> None:
    # sizes summing to other than the product's width: left to the Split
    model = _split_product(1, [2, 3], [2, 5, 6], 4)
    ops = [n.op_type for n in rewrite(model).model.graph.node]
    assert ops == ["MatMulBias", "Split"]
    rng = np.random.default_rng(14)
    _check(model, {"x": rng.standard_normal((2, 5, 6)).astype(np.float32)})


def test_a_product_that_is_a_graph_output_keeps_its_bias_add() -> None:
    model = _projections(17, product_is_output=True)
    ops = [n.op_type for n in rewrite(model).model.graph.node]
    assert ops == ["MatMul", "Split", "Add", "Add", "MatMul"]
    _check(model, _feeds())


def test_the_encoder_block_merges_its_q_k_v_projections() -> None:
    from .models import encoder_block

    done = rewrite(encoder_block())
    assert done.merged == 3
    # one product, its three parts the fused node's outputs: no Split left
    (qkv,) = [n for n in done.model.graph.node if len(n.output) == 3]
    assert qkv.op_type == "MatMulBias"
    assert [n.op_type for n in done.model.graph.node].count("Split") == 0


def _hard_swish(x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("HardSwish", [x], [y], name=f"hswish_{x}")


@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_conv_hard_swish_fuses_and_matches_onnx_runtime(
    strides: tuple[int, int],
) -> None:
    model = _conv_model([_bn(), _hard_swish("n", "h")], ["h"], strides=strides)
    done = rewrite(model)
    assert (done.folded, done.activations) == (1, {"h": "hard_swish"})
    graph, _ = from_onnx(model)
    (conv,) = [n for n in graph.nodes if not n.is_null]
    assert '"activation":"hard_swish"' in str(conv.attrs["op_attrs"]).replace(" ", "")
    _check(model, {"x": _x()})


def test_hard_swish_stays_a_node_where_the_conv_is_not_float32() -> None:
    model = _conv_model([_hard_swish("c", "h")], ["h"])
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init).astype(np.float64)
        init.CopyFrom(numpy_helper.from_array(array, init.name))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.elem_type = TensorProto.DOUBLE
    assert rewrite(model).activations == {}
    assert _ops(model) == ["Conv", "HardSwish"]


def test_hard_swish_is_not_fused_where_the_conv_output_is_read_elsewhere() -> None:
    model = _conv_model([_hard_swish("c", "h")], ["c", "h"])
    assert _ops(model) == ["Conv", "HardSwish"]
    _check(model, {"x": _x()})
