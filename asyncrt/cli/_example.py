"""The built-in example: a small MLP whose hidden layer fans out into
independent branches, so a plan over several devices has real choices.

    x -> dense + bias + relu -> BRANCHES x (matmul, tanh) -> sum
      -> dense -> softmax -> y
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import Graph, GraphBuilder

__all__ = ("BATCH", "CLASSES", "example_graph", "example_inputs", "example_reference")

BATCH, WIDTH, BRANCHES, CLASSES = 32, 256, 3, 10
_F32 = "float32"


def example_graph() -> tuple[Graph, dict[str, np.ndarray[Any, Any]]]:
    """The example graph and its parameters (fixed by a seed)."""
    b = GraphBuilder()
    x = b.input("x", shape=(BATCH, WIDTH), dtype=_F32)
    w1 = b.param("w1", shape=(WIDTH, WIDTH), dtype=_F32)
    b1 = b.param("b1", shape=(WIDTH,), dtype=_F32)
    h = b.op("dense", x, w1, shape=(BATCH, WIDTH), dtype=_F32, name="dense1")
    h = b.op("bias_add", h, b1, shape=(BATCH, WIDTH), dtype=_F32, name="bias1")
    h = b.op("relu", h, shape=(BATCH, WIDTH), dtype=_F32, name="relu1")
    ends = []
    for i in range(BRANCHES):
        w = b.param(f"wb{i}", shape=(WIDTH, WIDTH), dtype=_F32)
        y = b.op("matmul", h, w, shape=(BATCH, WIDTH), dtype=_F32, name=f"branch{i}")
        ends.append(b.op("tanh", y, shape=(BATCH, WIDTH), dtype=_F32, name=f"tanh{i}"))
    joined = b.op("sum", *ends, shape=(BATCH, WIDTH), dtype=_F32, name="join")
    w2 = b.param("w2", shape=(CLASSES, WIDTH), dtype=_F32)
    logits = b.op(
        "dense", joined, w2, shape=(BATCH, CLASSES), dtype=_F32, name="dense2"
    )
    b.output(b.op("softmax", logits, shape=(BATCH, CLASSES), dtype=_F32, name="probs"))
    rng = np.random.default_rng(7)
    scale = 1.0 / np.sqrt(WIDTH)

    def weights(*shape: int) -> np.ndarray[Any, Any]:
        values: np.ndarray[Any, Any] = rng.standard_normal(shape) * scale
        return values.astype(np.float32)

    params = {"w1": weights(WIDTH, WIDTH), "b1": weights(WIDTH)}
    params.update({f"wb{i}": weights(WIDTH, WIDTH) for i in range(BRANCHES)})
    params["w2"] = weights(CLASSES, WIDTH)
    return b.build(), params


def example_inputs() -> dict[str, np.ndarray[Any, Any]]:
    """The example's input (fixed by a seed)."""
    rng = np.random.default_rng(11)
    return {"x": rng.standard_normal((BATCH, WIDTH)).astype(np.float32)}


def example_reference(
    inputs: dict[str, np.ndarray[Any, Any]], params: dict[str, np.ndarray[Any, Any]]
) -> np.ndarray[Any, Any]:
    """What the example computes, in plain numpy."""
    h = np.maximum(inputs["x"] @ params["w1"].T + params["b1"], 0)
    joined = sum(np.tanh(h @ params[f"wb{i}"]) for i in range(BRANCHES))
    logits = np.asarray(joined) @ params["w2"].T
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    result: np.ndarray[Any, Any] = e / e.sum(axis=-1, keepdims=True)
    return result
