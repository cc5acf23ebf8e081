"""The explicit-vector kernels (a stem, max and average pooling, a narrow
5 x 5 depthwise convolution) inside an executor, under concurrent runs on
several contexts: they carve their buffers from each stream thread's
scratch, so every run must still get exactly its own outputs, as run one
at a time."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
from asyncrt.ops import _dwvector, _poolvector, _stemvector

onnx = pytest.importorskip("onnx")
pytest.importorskip("numba")


def _model() -> Any:
    """128 x 128 RGB -> stem (16 channels, stride 2) -> three 3 x 3 max
    pools (to 8 x 8) -> 5 x 5 depthwise + ReLU -> 3 x 3 average pool."""
    helper, tensor = onnx.helper, onnx.TensorProto
    rng = np.random.default_rng(7)

    def init(name: str, shape: tuple[int, ...]) -> Any:
        values = rng.standard_normal(shape).astype(np.float32)
        return onnx.numpy_helper.from_array(values, name)

    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w0", "b0"],
            ["s"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        *(
            helper.make_node(
                "MaxPool",
                [src],
                [dst],
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
            )
            for src, dst in (("s", "p1"), ("p1", "p2"), ("p2", "p3"))
        ),
        helper.make_node(
            "Conv",
            ["p3", "w1", "b1"],
            ["d"],
            kernel_shape=[5, 5],
            group=16,
            pads=[2, 2, 2, 2],
        ),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node(
            "AveragePool", ["r"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "vector_kernels",
        [helper.make_tensor_value_info("x", tensor.FLOAT, [1, 3, 128, 128])],
        [helper.make_tensor_value_info("y", tensor.FLOAT, [1, 16, 8, 8])],
        [
            init("w0", (16, 3, 3, 3)),
            init("b0", (16,)),
            init("w1", (16, 1, 5, 5)),
            init("b1", (16,)),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.anyio
async def test_concurrent_runs_get_exactly_their_own_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: set[str] = set()
    for module, name in (
        (_stemvector, "stem"),
        (_poolvector, "pool"),
        (_dwvector, "dw"),
    ):
        bind = module.bind

        def spy(*args: Any, _bind: Any = bind, _name: str = name, **kw: Any) -> Any:
            taken.add(_name)
            return _bind(*args, **kw)

        monkeypatch.setattr(module, "bind", spy)
    graph, params = from_onnx(_model())
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 3, 128, 128)).astype(np.float32) for _ in range(8)]
    with graph_executor.create(graph, params=params, max_contexts=3) as ex:
        alone = []
        for x in xs:
            (y,) = await ex.run(x=x)
            alone.append(y.numpy().copy())
        together: list[Any] = [None] * len(xs)

        async def one(i: int) -> None:
            (y,) = await ex.run(x=xs[i])
            together[i] = y.numpy()

        async with anyio.create_task_group() as tg:
            for i in range(len(xs)):
                tg.start_soon(one, i)
    assert taken == {"stem", "pool", "dw"}  # every vector kernel ran
    for got, want in zip(together, alone, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(alone[0], alone[1])  # the inputs differ
