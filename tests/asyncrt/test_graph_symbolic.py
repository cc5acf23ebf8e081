"""SymbolicGraph: signatures, the checks that run on every request, and its
bytes (with a stub format: the ONNX one is tested in the frontend tests)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from asyncrt.errors import GraphError, InputError
from asyncrt.graph import (
    GraphBuilder,
    Specialized,
    SymbolicGraph,
    SymbolicInput,
    register_symbolic_format,
)


class _Stub:
    """Specializes to ``ids -> add(ids, ids)`` and records its calls."""

    format = "stub-test"

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, tuple[int, ...]], dict[str, int]]] = []

    def specialize(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        values: Mapping[str, np.ndarray[Any, Any]],
        dims: Mapping[str, int],
    ) -> Specialized:
        self.calls.append((dict(shapes), dict(dims)))
        b = GraphBuilder()
        x = b.input("ids", shape=shapes["ids"], dtype="int64")
        b.output(b.op("add", x, x, shape=shapes["ids"], dtype="int64"))
        return Specialized(b.build(), {}, ("ids",), ())

    def payload(self) -> bytes:
        return b"stub"


register_symbolic_format("stub-test", lambda payload, inputs, params: _Stub())

INPUTS = (
    SymbolicInput("ids", "int64", ("batch", "seq")),
    SymbolicInput("mask", "int64", ("batch", "seq")),
    SymbolicInput("image", "float32", ("batch", 3, 8)),
    SymbolicInput("shape", "int64", (2,), shape_valued=True),
)


def _graph() -> tuple[SymbolicGraph, _Stub]:
    stub = _Stub()
    params = {"w": ((4,), "float32")}
    return SymbolicGraph(INPUTS, ["y"], stub, params), stub


def _shapes(batch: int = 2, seq: int = 5) -> dict[str, tuple[int, ...]]:
    return {
        "ids": (batch, seq),
        "mask": (batch, seq),
        "image": (batch, 3, 8),
        "shape": (2,),
    }


VALUES = {"shape": np.array([4, 5], np.int64)}


def test_signature_keys_shapes_and_shape_values() -> None:
    graph, _ = _graph()
    key = graph.signature(_shapes(), VALUES)
    assert key == graph.signature(_shapes(), {"shape": np.array([4, 5])})
    assert key != graph.signature(_shapes(seq=6), VALUES)
    assert key != graph.signature(_shapes(), {"shape": np.array([5, 4])})
    hash(key)
    numpy_dims = {k: tuple(np.int64(d) for d in v) for k, v in _shapes().items()}
    assert graph.signature(numpy_dims, VALUES) == key
    assert graph.symbols == ("batch", "seq")
    assert graph.shape_valued == ("shape",)
    assert graph.dims(_shapes(3, 7)) == {"batch": 3, "seq": 7}
    assert list(graph.inputs) == ["ids", "mask", "image", "shape"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"mask": (3, 5)}, "'mask': dimension 0 ('batch') is 3, but input 'ids'"),
        ({"ids": (2, 5, 1)}, "'ids': shape (2, 5, 1) has rank 3, the model expects"),
        ({"image": (2, 4, 8)}, "'image': dimension 1 is 4, the model fixes it at 3"),
        ({"ids": (2, -1), "mask": (2, -1)}, "dimension 1 ('seq') is -1"),
        ({"ids": (2.0, 5)}, "'ids': shape (2.0, 5) must hold integers"),
        ({"ids": (True, 5)}, "must hold integers"),
        ({"ids": 5}, "must be a sequence"),
        ({"extra": (1,)}, "unknown input 'extra'"),
    ],
)
def test_bad_shapes_name_the_input_and_dimension(
    change: dict[str, Any], expected: str
) -> None:
    graph, stub = _graph()
    with pytest.raises(
        InputError, match=expected.replace("(", r"\(").replace(")", r"\)")
    ):
        graph.signature({**_shapes(), **change}, VALUES)
    with pytest.raises(InputError):
        graph.specialize({**_shapes(), **change}, VALUES)
    assert stub.calls == []


def test_missing_input_and_shape_values_are_refused() -> None:
    graph, _ = _graph()
    shapes = _shapes()
    del shapes["mask"]
    with pytest.raises(InputError, match="missing input 'mask'"):
        graph.signature(shapes, VALUES)
    with pytest.raises(InputError, match="'shape' decides shapes: give its value"):
        graph.signature(_shapes(), {})
    with pytest.raises(InputError, match="'shape': dtype float32, the model expects"):
        graph.signature(_shapes(), {"shape": np.zeros(2, np.float32)})
    with pytest.raises(InputError, match=r"its value has shape \(3,\)"):
        graph.signature(_shapes(), {"shape": np.zeros(3, np.int64)})
    with pytest.raises(InputError, match="expected a numpy array"):
        graph.signature(_shapes(), {"shape": [4, 5]})
    with pytest.raises(InputError, match="'image': dtype float64, the model"):
        graph.signature(_shapes(), VALUES, dtypes={"image": "float64"})


def test_specialize_passes_validated_shapes_and_symbol_sizes() -> None:
    graph, stub = _graph()
    spec = graph.specialize(_shapes(3, 4), VALUES)
    assert stub.calls == [(_shapes(3, 4), {"batch": 3, "seq": 4})]
    assert spec.graph.shape[-1] == (3, 4)
    assert spec.with_shared({"w": 1, "unused": 2}) == {}


def test_bytes_round_trip_checks_the_shared_params() -> None:
    graph, _ = _graph()
    data = graph.to_bytes()
    params = {"w": np.zeros(4, np.float32)}
    again = SymbolicGraph.from_bytes(data, params)
    assert again.inputs == graph.inputs
    assert again.outputs == ("y",)
    assert again.params == {"w": ((4,), "float32")}
    assert again.signature(_shapes(), VALUES) == graph.signature(_shapes(), VALUES)
    with pytest.raises(GraphError, match=r"'w'.*missing"):
        SymbolicGraph.from_bytes(data, {})
    with pytest.raises(GraphError, match=r"'w'.*float64\[4\], the graph expects"):
        SymbolicGraph.from_bytes(data, {"w": np.zeros(4)})
    with pytest.raises(GraphError, match="bad magic"):
        SymbolicGraph.from_bytes(b"nope" + data, params)
    with pytest.raises(GraphError, match="truncated header"):
        SymbolicGraph.from_bytes(data[:30], params)
    unknown = data.replace(b'"stub-test"', b'"something"')  # same length
    with pytest.raises(GraphError, match="unknown symbolic graph format 'something'"):
        SymbolicGraph.from_bytes(unknown, params)


def test_signature_is_cheap_enough_to_run_per_request() -> None:
    # Not a timing assertion: the check is a few comparisons per dimension,
    # so it must not call the specializer or allocate per input.
    graph, stub = _graph()
    for seq in range(1, 50):
        graph.signature(_shapes(seq=seq), VALUES)
    assert stub.calls == []
