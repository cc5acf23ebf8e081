"""Small ONNX models built with ``onnx.helper`` for the frontend tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ("check_fusions", "encoder_block", "model_of", "small_cnn")


def check_fusions(
    model: onnx.ModelProto,
    feeds: dict[str, Any],
    rtol: float = 1e-5,
    *,
    peer_tol: float = 1e-4,
) -> None:
    """The import with its rewrites against ONNX Runtime (to ``peer_tol``)
    and against the unfused import (to ``rtol``; 0: the same bits)."""
    import onnxruntime as ort

    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx

    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    want = session.run(None, feeds)
    results = []
    for optimize in (True, False):
        graph, params = from_onnx(model, optimize=optimize)
        with graph_executor.create(graph, params=params) as executor:
            results.append([o.numpy() for o in executor.run_sync(**feeds) or []])
    fused, unfused = results
    assert len(fused) == len(want)
    for f, u, w in zip(fused, unfused, want, strict=True):
        np.testing.assert_allclose(f, w, rtol=peer_tol, atol=peer_tol)
        np.testing.assert_allclose(f, u, rtol=rtol, atol=rtol)


def check_every_shape(
    model: onnx.ModelProto,
    name: str,
    shapes: tuple[tuple[int, ...], ...],
    *,
    seed: int = 7,
    tol: float = 1e-5,
) -> None:
    """``model`` (its input ``name`` symbolic) imported once: one executor
    runs every one of ``shapes``, matching ONNX Runtime's outputs."""
    import onnxruntime as ort

    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx

    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    graph, params = from_onnx(model)
    rng = np.random.default_rng(seed)
    with graph_executor.create(graph, params=params) as executor:
        for shape in shapes:
            x = rng.standard_normal(shape).astype(np.float32)
            got = [o.numpy() for o in executor.run_sync(**{name: x}) or []]
            want = session.run(None, {name: x})
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def model_of(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    """``graph`` as a model of the default domain's ``opset``, at the oldest
    IR version that opset allows. ``helper.make_model`` writes onnx's newest
    IR version, which an ONNX Runtime older than that onnx refuses (ORT 1.30
    reads IR 13 at most; onnx 1.23 writes 14)."""
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(
        graph,
        opset_imports=opsets,
        ir_version=helper.find_min_ir_version_for(opsets),
    )


def _init(
    rng: np.random.Generator, name: str, *shape: int, scale: float = 0.2
) -> onnx.TensorProto:
    return numpy_helper.from_array(
        (rng.standard_normal(shape) * scale).astype(np.float32), name
    )


def _int64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def small_cnn(batch: int = 2, opset: int = 17) -> onnx.ModelProto:
    """conv-bn-relu, a depthwise residual block, pools, a shape-computed
    flatten and a Gemm classifier: ``x (batch, 3, 16, 16) -> probs (batch, 10)``.
    """
    rng = np.random.default_rng(1)
    inits = [
        _init(rng, "w1", 8, 3, 3, 3),
        _init(rng, "b1", 8),
        _init(rng, "w_dw", 8, 1, 3, 3),
        _init(rng, "w2", 16, 8, 1, 1),
        _init(rng, "fc_w", 10, 16),
        _init(rng, "fc_b", 10),
        _int64("axis0", [0]),
        _int64("minus_one", [-1]),
    ]
    for prefix in ("bn1", "bn2"):
        inits += [
            numpy_helper.from_array(
                rng.uniform(0.5, 1.5, 8).astype(np.float32), f"{prefix}_scale"
            ),
            _init(rng, f"{prefix}_bias", 8),
            _init(rng, f"{prefix}_mean", 8),
            numpy_helper.from_array(
                rng.uniform(0.5, 1.5, 8).astype(np.float32), f"{prefix}_var"
            ),
        ]
    bn = lambda p, x, y: helper.make_node(  # noqa: E731
        "BatchNormalization",
        [x, f"{p}_scale", f"{p}_bias", f"{p}_mean", f"{p}_var"],
        [y],
        epsilon=1e-5,
        name=p,
    )
    nodes = [
        helper.make_node(
            "Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"
        ),
        bn("bn1", "c1", "n1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node(
            "Conv", ["r1", "w_dw"], ["c2"], group=8, pads=[1, 1, 1, 1], name="depthwise"
        ),
        bn("bn2", "c2", "n2"),
        helper.make_node("Relu", ["n2"], ["r2"], name="relu2"),
        helper.make_node("Add", ["r1", "r2"], ["res"], name="residual"),
        helper.make_node(
            "MaxPool",
            ["res"],
            ["p1"],
            kernel_shape=[2, 2],
            strides=[2, 2],
            name="maxpool",
        ),
        helper.make_node("Conv", ["p1", "w2"], ["c3"], name="conv3"),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node(
            "AveragePool",
            ["r3"],
            ["p2"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            name="avgpool",
        ),
        helper.make_node("GlobalAveragePool", ["p2"], ["gap"], name="gap"),
        # flatten as exporters do: Shape -> Gather -> Concat -> Reshape
        helper.make_node("Shape", ["gap"], ["gap_shape"], name="shape"),
        helper.make_node(
            "Gather", ["gap_shape", "axis0"], ["n"], axis=0, name="gather"
        ),
        helper.make_node(
            "Concat", ["n", "minus_one"], ["flat_shape"], axis=0, name="concat"
        ),
        helper.make_node("Reshape", ["gap", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node(
            "Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"
        ),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    model = model_of(graph, opset)
    onnx.checker.check_model(model)
    return model


def encoder_block(
    batch: int = 2, seq: int = 8, dim: int = 32, heads: int = 4, opset: int = 20
) -> onnx.ModelProto:
    """A pre-norm transformer encoder block: multi-head self-attention and a
    Gelu MLP, each with a residual: ``x (batch, seq, dim) -> y``."""
    rng = np.random.default_rng(2)
    head_dim = dim // heads
    inits = [
        numpy_helper.from_array(np.ones(dim, np.float32), "ln1_scale"),
        numpy_helper.from_array(np.zeros(dim, np.float32), "ln1_bias"),
        numpy_helper.from_array(
            rng.uniform(0.5, 1.5, dim).astype(np.float32), "ln2_scale"
        ),
        _init(rng, "ln2_bias", dim),
        _init(rng, "wo", dim, dim),
        _init(rng, "bo", dim),
        _init(rng, "w1", dim, 2 * dim),
        _init(rng, "b1", 2 * dim),
        _init(rng, "w2", 2 * dim, dim),
        _init(rng, "b2", dim),
        _int64("heads_shape", [0, 0, heads, head_dim]),
        _int64("merged_shape", [0, 0, dim]),
        numpy_helper.from_array(np.array(1 / math.sqrt(head_dim), np.float32), "scale"),
    ]
    nodes = [
        helper.make_node(
            "LayerNormalization",
            ["x", "ln1_scale", "ln1_bias"],
            ["h"],
            axis=-1,
            epsilon=1e-5,
            name="ln1",
        )
    ]
    for proj in ("q", "k", "v"):
        inits += [_init(rng, f"w{proj}", dim, dim), _init(rng, f"b{proj}", dim)]
        perm = [0, 2, 3, 1] if proj == "k" else [0, 2, 1, 3]  # K arrives transposed
        nodes += [
            helper.make_node(
                "MatMul", ["h", f"w{proj}"], [f"{proj}_mm"], name=f"{proj}_proj"
            ),
            helper.make_node(
                "Add", [f"{proj}_mm", f"b{proj}"], [f"{proj}_b"], name=f"{proj}_bias"
            ),
            helper.make_node(
                "Reshape",
                [f"{proj}_b", "heads_shape"],
                [f"{proj}_split"],
                name=f"{proj}_heads",
            ),
            helper.make_node(
                "Transpose",
                [f"{proj}_split"],
                [f"{proj}_t"],
                perm=perm,
                name=f"{proj}_transpose",
            ),
        ]
    nodes += [
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["attn"], axis=-1, name="attn_softmax"),
        helper.make_node("MatMul", ["attn", "v_t"], ["ctx"], name="attn_v"),
        helper.make_node(
            "Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3], name="ctx_transpose"
        ),
        helper.make_node(
            "Reshape", ["ctx_t", "merged_shape"], ["merged"], name="merge_heads"
        ),
        helper.make_node("MatMul", ["merged", "wo"], ["o_mm"], name="out_proj"),
        helper.make_node("Add", ["o_mm", "bo"], ["o"], name="out_bias"),
        helper.make_node("Add", ["x", "o"], ["res1"], name="residual1"),
        helper.make_node(
            "LayerNormalization",
            ["res1", "ln2_scale", "ln2_bias"],
            ["h2"],
            axis=-1,
            epsilon=1e-5,
            name="ln2",
        ),
        helper.make_node("MatMul", ["h2", "w1"], ["f1"], name="fc1"),
        helper.make_node("Add", ["f1", "b1"], ["f1b"], name="fc1_bias"),
        helper.make_node("Gelu", ["f1b"], ["g"], name="gelu"),
        helper.make_node("MatMul", ["g", "w2"], ["f2"], name="fc2"),
        helper.make_node("Add", ["f2", "b2"], ["f2b"], name="fc2_bias"),
        helper.make_node("Add", ["res1", "f2b"], ["y"], name="residual2"),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, dim])],
        inits,
    )
    model = model_of(graph, opset)
    onnx.checker.check_model(model)
    return model
