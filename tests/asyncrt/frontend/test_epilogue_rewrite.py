"""Import-time epilogue fusions: MatMul -> Add(bias) [-> erf GELU] as one
``MatMulBias``, Add -> LayerNormalization as one ``AddLayerNormalization``;
each only where nothing else reads what it absorbs, each matching ONNX
Runtime and the unfused import."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
from asyncrt.frontend._names import PRIVATE_DOMAIN
from asyncrt.frontend._rewrite import rewrite

from .models import check_fusions, model_of
from .symbolic_models import TINY, bert_encoder, bert_feed

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(21)


def _f32(*shape: int) -> np.ndarray[Any, Any]:
    return RNG.standard_normal(shape).astype(np.float32)


def _scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _ffn(
    *,
    extra_outputs: tuple[str, ...] = (),
    half: float = 0.5,
    bias_shape: tuple[int, ...] = (6,),
) -> onnx.ModelProto:
    """x (2, 5, 4) @ w (4, 6) + b, the erf GELU as PyTorch exports it, then
    ``Add(gelu, r) -> LayerNormalization``."""
    inits = [
        numpy_helper.from_array(_f32(4, 6), "w"),
        numpy_helper.from_array(_f32(*bias_shape), "b"),
        numpy_helper.from_array(_f32(6), "gamma"),
        numpy_helper.from_array(_f32(6), "beta"),
        _scalar("sqrt2", math.sqrt(2.0)),
        _scalar("one", 1.0),
        _scalar("half", half),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
        helper.make_node("Add", ["p", "b"], ["y"], name="bias"),
        helper.make_node("Div", ["y", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="plus1"),
        helper.make_node("Mul", ["y", "e1"], ["m"], name="mul"),
        helper.make_node("Mul", ["m", "half"], ["g"], name="half"),
        helper.make_node("Add", ["g", "r"], ["s"], name="residual"),
        helper.make_node(
            "LayerNormalization",
            ["s", "gamma", "beta"],
            ["out"],
            axis=-1,
            epsilon=1e-5,
            name="ln",
        ),
    ]
    outputs = ("out", *extra_outputs)
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 4]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 5, 6]),
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["d"]) for o in outputs],
        inits,
    )
    return model_of(graph, 17)


def _feeds() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(22)
    return {
        "x": rng.standard_normal((2, 5, 4)).astype(np.float32),
        "r": rng.standard_normal((2, 5, 6)).astype(np.float32),
    }


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_matmul_bias_gelu_and_add_layer_norm_fuse() -> None:
    model = _ffn()
    done = rewrite(model)
    assert _ops(done.model) == ["MatMulBias", "AddLayerNormalization"]
    fused = done.model.graph.node
    assert all(n.domain == PRIVATE_DOMAIN for n in fused)
    assert helper.get_attribute_value(fused[0].attribute[0]) == b"gelu"
    assert list(fused[0].input) == ["x", "w", "b"]
    assert list(fused[0].output) == ["g"]
    assert list(fused[1].input) == ["g", "r", "gamma", "beta"]
    assert list(fused[1].output) == ["out"]
    assert done.fused == 7
    check_fusions(model, _feeds())


def test_a_gelu_with_other_constants_keeps_its_nodes() -> None:
    done = rewrite(_ffn(half=0.25))
    assert _ops(done.model)[:5] == ["MatMulBias", "Div", "Erf", "Add", "Mul"]
    assert helper.get_attribute_value(done.model.graph.node[0].attribute[0]) == (
        b"none"
    )
    check_fusions(_ffn(half=0.25), _feeds())


UNFUSED = ["MatMul", "Add", "Div", "Erf", "Add", "Mul", "Mul", "Add"]


@pytest.mark.parametrize(
    ("outputs", "ops"),
    [
        # the product and the residual sum are read by the caller too: the
        # sum stays an output, of the fused norm (see the pre-LN test)
        (("p", "s"), [*UNFUSED[:-1], "AddLayerNormalization"]),
        # the biased product is: the GELU stays, the bias joins the GEMM
        (("y",), ["MatMulBias", *UNFUSED[2:-1], "AddLayerNormalization"]),
    ],
)
def test_nothing_is_absorbed_whose_output_is_read_elsewhere(
    outputs: tuple[str, ...], ops: list[str]
) -> None:
    model = _ffn(extra_outputs=outputs)
    assert _ops(rewrite(model).model) == ops
    check_fusions(model, _feeds())


def test_a_bias_that_is_not_a_row_of_the_product_is_not_absorbed() -> None:
    model = _ffn(bias_shape=(5, 6))
    assert _ops(rewrite(model).model)[:2] == ["MatMul", "Add"]
    check_fusions(model, _feeds())


@pytest.mark.parametrize(("batch", "seq"), [(2, 8), (3, 5)])
def test_the_bert_encoder_fuses_every_epilogue_and_matches(
    batch: int, seq: int
) -> None:
    config = TINY
    model = bert_encoder(config)
    done = rewrite(model)
    ops = _ops(done.model)
    # Q/K/V (merged), attention output, two FFN GEMMs per layer, the pooler
    assert ops.count("MatMulBias") == 4 * config.layers + 1
    assert ops.count("AddLayerNormalization") == 2 * config.layers + 1
    assert ops.count("ScaleAddSoftmax") == config.layers
    assert "Erf" not in ops and "LayerNormalization" not in ops
    check_fusions(model, bert_feed(batch, seq, config, 0))


def _attention(opset: int, scale_op: str = "Div", axis: int = -1) -> onnx.ModelProto:
    """softmax(s / sqrt 8 + mask) (or ``s * c``) over the last axis."""
    inits = [_scalar("c", math.sqrt(8.0))]
    nodes = [
        helper.make_node(scale_op, ["s", "c"], ["scaled"], name="scale"),
        helper.make_node("Add", ["mask", "scaled"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["p"], axis=axis, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3, 4, 4]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2, 1, 1, 4]),
        ],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["d"])],
        inits,
    )
    return model_of(graph, opset)


def _attention_feeds() -> dict[str, np.ndarray[Any, Any]]:
    mask = np.zeros((2, 1, 1, 4), np.float32)
    mask[1, ..., 3] = np.finfo(np.float32).min  # a padded token
    return {"s": _f32(2, 3, 4, 4) * 4, "mask": mask}


@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_scale_mask_and_softmax_fuse(scale_op: str) -> None:
    model = _attention(17, scale_op)
    done = rewrite(model)
    assert _ops(done.model) == ["ScaleAddSoftmax"]
    assert list(done.model.graph.node[0].input) == ["s", "c", "mask"]
    check_fusions(model, _attention_feeds(), rtol=0.0)  # the unfused kernels' bits


@pytest.mark.parametrize(("opset", "axis"), [(11, -1), (17, 3), (17, 2)])
def test_a_softmax_of_another_axis_or_old_opset_keeps_its_nodes(
    opset: int, axis: int
) -> None:
    model = _attention(opset, axis=axis)
    assert _ops(rewrite(model).model) == ["Div", "Add", "Softmax"]
    check_fusions(model, _attention_feeds())


@pytest.mark.parametrize("axis", [-1, 2])
def test_scaled_scores_without_a_mask_fuse_with_their_softmax(axis: int) -> None:
    nodes = [
        helper.make_node("Mul", ["s", "c"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=axis, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["d"])],
        [_scalar("c", 1 / math.sqrt(8.0))],
    )
    model = model_of(graph, 17)
    done = rewrite(model)
    want = ["ScaleAddSoftmax"] if axis == -1 else ["Mul", "Softmax"]
    assert _ops(done.model) == want
    if axis == -1:
        assert list(done.model.graph.node[0].input) == ["s", "c"]
    check_fusions(model, {"s": _f32(2, 3, 4, 4) * 4}, rtol=0.0)  # the unfused bits


def _causal(
    keep: bool, scale_op: str = "Div", mask_input: bool = False, fill: float = -np.inf
) -> onnx.ModelProto:
    """softmax(where(mask, s / sqrt 8, fill)) as PyTorch exports a causal
    mask (or ``where(mask, fill, s / sqrt 8)`` without ``keep``)."""
    causal = np.tril(np.ones((4, 4), bool)).reshape(1, 1, 4, 4)
    inits = [_scalar("c", math.sqrt(8.0)), _scalar("fill", fill)]
    inputs = [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3, 4, 4])]
    if mask_input:
        inputs.append(
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, 4, 4])
        )
    else:
        inits.append(numpy_helper.from_array(causal if keep else ~causal, "mask"))
    branches = ["scaled", "fill"] if keep else ["fill", "scaled"]
    nodes = [
        helper.make_node(scale_op, ["s", "c"], ["scaled"], name="scale"),
        helper.make_node("Where", ["mask", *branches], ["masked"], name="where"),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["d"])],
        inits,
    )
    return model_of(graph, 17)


@pytest.mark.parametrize("mask_input", [False, True])
@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
@pytest.mark.parametrize("keep", [True, False])
def test_scale_causal_where_and_softmax_fuse(
    keep: bool, scale_op: str, mask_input: bool
) -> None:
    model = _causal(keep, scale_op, mask_input)
    done = rewrite(model)
    assert _ops(done.model) == ["ScaleWhereSoftmax"]
    (node,) = done.model.graph.node
    assert list(node.input) == ["s", "c", "mask", "fill"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"divide": int(scale_op == "Div"), "keep": int(keep)}
    feeds = {"s": _f32(2, 3, 4, 4) * 4}
    if mask_input:
        causal = np.tril(np.ones((4, 4), bool)).reshape(1, 1, 4, 4)
        feeds["mask"] = causal if keep else ~causal
    check_fusions(model, feeds, rtol=0.0)  # the unfused kernels' bits


def test_a_where_without_a_constant_scalar_fill_keeps_its_nodes() -> None:
    model = _causal(True)
    fill = model.graph.initializer[1]
    fill.CopyFrom(numpy_helper.from_array(np.full(4, -1e9, np.float32), "fill"))
    assert _ops(rewrite(model).model) == ["Div", "Where", "Softmax"]
    check_fusions(model, {"s": _f32(2, 3, 4, 4)})


def _heads(extra_output: str | None = None, vector: bool = False) -> onnx.ModelProto:
    """Attention's head split and merge: q, k (2, 5, 3, 4) as (batch, seq,
    heads, dim); ``(q^T @ (k^T)^T)^T``; with ``vector``, also ``x^T @ v``."""
    nodes = [
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["kt"], ["ktt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qt", "ktt"], ["s"], name="scores"),
        helper.make_node("MatMul", ["s", "qt2"], ["o"], name="mix"),
        helper.make_node("Transpose", ["q"], ["qt2"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3]),
    ]
    nodes.insert(4, nodes.pop(5))  # qt2 before its reader
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5, 3, 4])
        for n in ("q", "k")
    ]
    outputs = ["y", *([extra_output] if extra_output else [])]
    if vector:
        nodes += [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
            helper.make_node("MatMul", ["xt", "v"], ["xv"], name="vec"),
        ]
        inputs += [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [4]),
        ]
        outputs.append("xv")
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["d"]) for o in outputs],
    )
    return model_of(graph, 17)


def _heads_feeds(vector: bool = False) -> dict[str, np.ndarray[Any, Any]]:
    feeds = {"q": _f32(2, 5, 3, 4), "k": _f32(2, 5, 3, 4)}
    if vector:
        feeds |= {"x": _f32(4, 6), "v": _f32(4)}
    return feeds


def test_head_transposes_become_views_of_the_matmuls() -> None:
    model = _heads(vector=True)
    done = rewrite(model)
    nodes = done.model.graph.node
    assert _ops(done.model) == ["TransposedMatMul"] * 3
    perms = {n.name: {a.name: list(a.ints) for a in n.attribute} for n in nodes}
    assert perms["scores"] == {"perm_a": [0, 2, 1, 3], "perm_b": [0, 2, 3, 1]}
    assert perms["mix"] == {"perm_b": [0, 2, 1, 3], "perm_out": [0, 2, 1, 3]}
    assert perms["vec"] == {"perm_a": [1, 0]}
    assert list(nodes[0].input) == ["q", "k"]
    check_fusions(_heads(), _heads_feeds())
    # ONNX Runtime (1.32) multiplies x^T by a vector wrongly (its
    # Transpose-MatMul fusion): numpy is the reference for that output
    feeds = _heads_feeds(vector=True)
    for optimize in (True, False):
        graph, params = from_onnx(model, optimize=optimize)
        with graph_executor.create(graph, params=params) as executor:
            got = executor.run_sync(**feeds) or []
        np.testing.assert_allclose(
            got[1].numpy(), feeds["x"].T @ feeds["v"], rtol=1e-5, atol=1e-5
        )


def test_a_transpose_read_elsewhere_stays_a_copy() -> None:
    model = _heads(extra_output="kt")
    done = rewrite(model)
    ops = _ops(done.model)
    # kt is an output: not composed with ktt, which joins the matmul
    assert ops.count("Transpose") == 1
    check_fusions(model, _heads_feeds())


def test_a_scaled_mask_added_to_the_scores_fuses_too() -> None:
    # one layer: the mask's Mul by finfo.min has one reader, the mask Add
    model = _attention(17, "Mul")
    nodes = list(model.graph.node)
    nodes[0] = helper.make_node("Mul", ["mask", "c"], ["scaled"], name="scale")
    nodes[1] = helper.make_node("Add", ["s", "scaled"], ["masked"], name="mask_add")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.initializer[:]
    model.graph.initializer.append(_scalar("c", -1e4))
    assert _ops(rewrite(model).model) == ["ScaleAddSoftmax"]
    padded = np.zeros((2, 1, 1, 4), np.float32)
    padded[1, ..., 3] = 1.0  # a padded token
    check_fusions(model, {"s": _f32(2, 3, 4, 4), "mask": padded}, rtol=0.0)


def test_a_pre_ln_sum_read_elsewhere_is_a_second_output() -> None:
    # GPT-2's blocks: h = x + a; y = LN(h); the next residual reads h too
    model = _ffn()
    nodes = list(model.graph.node)
    nodes.append(helper.make_node("Add", ["s", "out"], ["next"], name="next"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.output[0].name = "next"
    done = rewrite(model)
    assert _ops(done.model) == ["MatMulBias", "AddLayerNormalization", "Add"]
    fused = done.model.graph.node[1]
    assert list(fused.output) == ["out", "s"]
    check_fusions(model, _feeds())


def test_a_pre_ln_norm_with_computed_scale_keeps_its_nodes() -> None:
    model = _ffn()
    nodes = list(model.graph.node)
    norm = nodes.pop()
    nodes += [
        helper.make_node("Identity", ["gamma"], ["gamma2"], name="computed"),
        helper.make_node(
            "LayerNormalization",
            ["s", "gamma2", "beta"],
            ["out"],
            axis=-1,
            epsilon=1e-5,
            name=norm.name,
        ),
        helper.make_node("Add", ["s", "out"], ["next"], name="next"),
    ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.output[0].name = "next"
    ops = _ops(rewrite(model).model)
    assert "LayerNormalization" in ops and "AddLayerNormalization" not in ops
    check_fusions(model, _feeds())


def _gpt_mlp(
    cube: float = 0.044715, by_products: str = "", extra_output: str | None = None
) -> onnx.ModelProto:
    """x (2, 5, 4) @ w (4, 6) + b, then GPT-2's tanh GELU as PyTorch exports
    ``GELU(approximate="tanh")``: its scalars are ``Constant`` nodes. With
    ``by_products`` ``"square first"`` or ``"square last"``, ``y**3`` is
    ``(y * y) * y`` or ``y * (y * y)``, as hand-written GELUs have it."""

    def constant(name: str, value: float) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=_scalar(name, value))

    if by_products:
        square = helper.make_node("Mul", ["y", "y"], ["y2"])
        factors = ["y2", "y"] if by_products == "square first" else ["y", "y2"]
        cubing = [square, helper.make_node("Mul", factors, ["y3"])]
    else:
        cubing = [
            constant("three", 3.0),
            helper.make_node("Pow", ["y", "three"], ["y3"]),
        ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["b", "p"], ["y"]),
        *cubing,
        constant("c", cube),
        helper.make_node("Mul", ["y3", "c"], ["cy3"]),
        helper.make_node("Add", ["y", "cy3"], ["inner"]),
        constant("root", math.sqrt(2 / math.pi)),
        helper.make_node("Mul", ["inner", "root"], ["scaled"]),
        constant("half", 0.5),
        helper.make_node("Mul", ["y", "half"], ["hy"]),
        helper.make_node("Tanh", ["scaled"], ["t"]),
        constant("one", 1.0),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["hy", "t1"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 4])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 5, 6])
            for name in ("out", *((extra_output,) if extra_output else ()))
        ],
        [
            numpy_helper.from_array(_f32(4, 6), "w"),
            numpy_helper.from_array(_f32(6), "b"),
        ],
    )
    return model_of(graph, 17)


@pytest.mark.parametrize("by_products", ["", "square first", "square last"])
def test_the_tanh_gelu_of_gpt_fuses_with_constant_nodes_for_scalars(
    by_products: str,
) -> None:
    model = _gpt_mlp(by_products=by_products)
    done = rewrite(model)
    fused = [n for n in done.model.graph.node if n.op_type != "Constant"]
    assert [n.op_type for n in fused] == ["MatMulBias"]
    assert helper.get_attribute_value(fused[0].attribute[0]) == b"gelu_tanh"
    assert list(fused[0].output) == ["out"]
    x = np.random.default_rng(3).standard_normal((2, 5, 4)).astype(np.float32) * 2
    check_fusions(model, {"x": x})


def test_a_tanh_gelu_with_another_constant_keeps_its_nodes() -> None:
    done = rewrite(_gpt_mlp(cube=0.05))
    ops = [n.op_type for n in done.model.graph.node if n.op_type != "Constant"]
    assert ops[0] == "MatMulBias" and "Tanh" in ops and "Pow" in ops


def test_a_tanh_gelu_whose_square_is_read_elsewhere_keeps_its_nodes() -> None:
    model = _gpt_mlp(by_products="square first", extra_output="y2")
    ops = [n.op_type for n in rewrite(model).model.graph.node]
    assert ops[0] == "MatMulBias" and "Tanh" in ops and ops.count("Mul") >= 4
    x = np.random.default_rng(4).standard_normal((2, 5, 4)).astype(np.float32)
    check_fusions(model, {"x": x})


def _bias_then(
    op: str,
    depth: int,
    cols: int,
    opset: int,
    read_elsewhere: bool = False,
    **attrs: Any,
) -> Any:
    """x (2, 5, depth) @ w (depth, cols) + b -> ``op`` (``attrs``); with
    ``read_elsewhere`` the sum is a graph output too."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
        helper.make_node("Add", ["p", "b"], ["y"], name="bias"),
        helper.make_node(op, ["y"], ["out"], name="activation", **attrs),
    ]
    outputs = ["out", "y"] if read_elsewhere else ["out"]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, depth])],
        [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 5, cols])
            for o in outputs
        ],
        [
            numpy_helper.from_array(_f32(depth, cols), "w"),
            numpy_helper.from_array(_f32(cols), "b"),
        ],
    )
    return model_of(graph, opset)


def _gelu_node_model(approximate: str | None, *, read_elsewhere: bool = False) -> Any:
    """x (2, 5, 4) @ w (4, 6) + b -> ONNX's own Gelu (opset 20)."""
    attrs = {} if approximate is None else {"approximate": approximate}
    return _bias_then("Gelu", 4, 6, 20, read_elsewhere, **attrs)


@pytest.mark.parametrize(
    ("approximate", "activation"),
    [(None, b"gelu"), ("none", b"gelu"), ("tanh", b"gelu_tanh")],
)
def test_onnx_gelu_nodes_join_the_matmul_bias(
    approximate: str | None, activation: bytes
) -> None:
    model = _gelu_node_model(approximate)
    done = rewrite(model)
    assert _ops(done.model) == ["MatMulBias"]
    fused = done.model.graph.node[0]
    assert helper.get_attribute_value(fused.attribute[0]) == activation
    assert list(fused.output) == ["out"]
    x = np.random.default_rng(5).standard_normal((2, 5, 4)).astype(np.float32) * 2
    check_fusions(model, {"x": x})


def test_a_gelu_node_whose_input_is_read_elsewhere_stays() -> None:
    model = _gelu_node_model("none", read_elsewhere=True)
    assert _ops(rewrite(model).model) == ["MatMulBias", "Gelu"]
    x = np.random.default_rng(6).standard_normal((2, 5, 4)).astype(np.float32)
    check_fusions(model, {"x": x})


def _relu_mlp_model(read_elsewhere: bool = False) -> onnx.ModelProto:
    """x (2, 5, 40) @ w (40, 70) + b -> Relu: an MLP's hidden layer."""
    model: onnx.ModelProto = _bias_then("Relu", 40, 70, 17, read_elsewhere)
    return model


@pytest.mark.parametrize("read_elsewhere", [False, True])
def test_a_relu_after_the_bias_joins_the_matmul_bias(read_elsewhere: bool) -> None:
    """Alone it joins (``activation="relu"``); where the sum is read
    elsewhere it stays a node of its own. Both match ONNX Runtime."""
    model = _relu_mlp_model(read_elsewhere)
    done = rewrite(model)
    if read_elsewhere:
        assert _ops(done.model) == ["MatMulBias", "Relu"]
    else:
        assert _ops(done.model) == ["MatMulBias"]
        fused = done.model.graph.node[0]
        assert helper.get_attribute_value(fused.attribute[0]) == b"relu"
        assert list(fused.output) == ["out"]
    x = np.random.default_rng(8).standard_normal((2, 5, 40)).astype(np.float32)
    check_fusions(model, {"x": x})
