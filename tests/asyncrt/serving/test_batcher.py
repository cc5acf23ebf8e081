"""The batcher's policy on a static graph whose kernel the test controls:
the delay bound (on a fake clock), full batches, preferred sizes, batch
slots, cancellation, failures, rejection, closing, figures and trace."""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import numpy as np
import pytest

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import (
    ArgumentError,
    ClosedResourceError,
    InputError,
    NodeFailedError,
)
from asyncrt.serving import Batcher, BatchStats

from .helpers import (
    FEATURES,
    ROWS,
    FakeClock,
    Gate,
    expected,
    request,
    settle,
    static_graph,
)

MS = 1e-3


def make(kernel: Any = None, **options: Any) -> graph_executor.GraphModule:
    graph, lib = static_graph() if kernel is None else static_graph(kernel)
    return graph_executor.create(graph, lib, "cpu", **options)


def check(outputs: list[asyncrt.NDArray], x: np.ndarray) -> None:
    assert len(outputs) == 2
    for got, want in zip(outputs, expected(x), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


class Results:
    """Outputs and errors of requests run as tasks, by name."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher
        self.outputs: dict[str, list[asyncrt.NDArray]] = {}
        self.errors: dict[str, BaseException] = {}

    async def run(self, name: str, inputs: dict[str, Any]) -> None:
        try:
            self.outputs[name] = await self.batcher.run(**inputs)
        except Exception as exc:
            self.errors[name] = exc


@pytest.mark.anyio
async def test_a_request_waits_at_most_the_delay_for_company() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, max_delay_ms=2, clock=clock)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            tg.start_soon(results.run, "a", request(1.0))
            await settle()
            assert clock.deadline == pytest.approx(2 * MS)
            clock.advance(1.5 * MS)
            await settle()
            assert batcher.stats().batches == 0 and batcher.stats().queued == 1
            tg.start_soon(results.run, "b", request(2.0))
            await settle()
            assert batcher.stats().queued == 2
            clock.advance(0.5 * MS)  # a's deadline: a and b go together
        (record,) = batcher.records()
        assert (record.rows, record.size, record.requests) == (2, ROWS, 2)
        assert record.queue_delays == pytest.approx((2 * MS, 0.5 * MS))
        check(results.outputs["a"], request(1.0)["x"])
        check(results.outputs["b"], request(2.0)["x"])


@pytest.mark.anyio
async def test_a_full_batch_starts_at_once_and_the_rest_waits() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, max_delay_ms=5, clock=clock)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            for i in range(ROWS + 1):
                tg.start_soon(results.run, f"r{i}", request(float(i)))
            with anyio.fail_after(10):
                while len(results.outputs) < ROWS:  # no time passes
                    await anyio.sleep(0)
            await settle()
            assert batcher.stats().queued == 1 and batcher.stats().batches == 1
            clock.advance(5 * MS)
        assert [r.rows for r in batcher.records()] == [ROWS, 1]
        for i in range(ROWS + 1):
            check(results.outputs[f"r{i}"], request(float(i))["x"])


@pytest.mark.anyio
async def test_batches_are_padded_to_a_preferred_size() -> None:
    clock = FakeClock()
    graph, lib, _ = _tiny_symbolic()
    with graph_executor.create(graph, lib, "cpu") as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, max_batch=8, clock=clock)
        assert batcher.preferred_batch_sizes == (1, 2, 4, 8)
        results = Results(batcher)
        inputs = {f"r{i}": {"x": np.full((1, 3), i, np.float32)} for i in range(5)}
        async with batcher, anyio.create_task_group() as tg:
            for name, given in inputs.items():
                tg.start_soon(results.run, name, given)
            await settle()
            clock.advance(2 * MS)
        stats = batcher.stats()
        assert (stats.batches, stats.rows, stats.padded_rows) == (1, 5, 3)
        assert dict(stats.sizes) == {8: 1}
        for name, given in inputs.items():
            (got,) = results.outputs[name]
            np.testing.assert_allclose(got.numpy(), np.tanh(given["x"]), rtol=1e-6)


def _tiny_symbolic() -> tuple[Any, None, None]:
    """x ("batch", 3) -> tanh, imported from ONNX (a symbolic batch)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from asyncrt.frontend import from_onnx

    node = helper.make_node("Tanh", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "tanh",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    symbolic, _ = from_onnx(model)
    return symbolic, None, None


@pytest.mark.anyio
async def test_requests_with_several_rows() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, clock=clock)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            for name, rows, value in (
                ("two", 2, 1.0),
                ("one", 1, 3.0),
                ("three", 3, 5.0),
            ):
                tg.start_soon(results.run, name, request(value, rows))
                await settle()  # in this order
            clock.advance(2 * MS)
            await settle()
            clock.advance(2 * MS)
        assert [r.rows for r in batcher.records()] == [3, 3]
        for name, rows, value in (("two", 2, 1.0), ("one", 1, 3.0), ("three", 3, 5.0)):
            check(results.outputs[name], request(value, rows)["x"])


@pytest.mark.anyio
async def test_batches_run_concurrently_up_to_the_contexts() -> None:
    gate = Gate()
    with make(gate, max_contexts=2) as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, max_batch=1, max_delay_ms=0)
        assert batcher.max_concurrent_batches == 2
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(results.run, f"r{i}", request(float(i)))
            await gate.wait_entered(2)
            await settle()
            stats = batcher.stats()
            assert (stats.running, stats.queued) == (2, 3)
            gate.open()
        assert gate.most_inside == 2 and gate.calls == 5
        assert {r.slot for r in batcher.records()} == {0, 1}
        for i in range(5):
            check(results.outputs[f"r{i}"], request(float(i))["x"])


@pytest.mark.anyio
async def test_while_every_slot_is_busy_the_next_batch_fills_up() -> None:
    gate = Gate()
    with make(gate, max_contexts=1) as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, max_delay_ms=0)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            tg.start_soon(results.run, "first", request(1.0))
            await gate.wait_entered()
            for i in range(3):
                tg.start_soon(results.run, f"r{i}", request(float(i)))
            await settle()
            assert batcher.stats().queued == 3
            gate.open()
        assert [r.rows for r in batcher.records()] == [1, 3]


@pytest.mark.anyio
async def test_a_cancelled_request_leaves_its_batch_intact() -> None:
    gate = Gate()
    with make(gate) as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, max_delay_ms=0)
        results = Results(batcher)
        cancelled = anyio.Event()

        async def impatient() -> None:
            with anyio.CancelScope() as scope:
                scope_holder.append(scope)
                await batcher.run(**request(7.0))
            cancelled.set()

        scope_holder: list[anyio.CancelScope] = []
        async with batcher, anyio.create_task_group() as tg:
            tg.start_soon(impatient)
            tg.start_soon(results.run, "patient", request(2.0))
            await gate.wait_entered()  # both in the batch now
            scope_holder[0].cancel()
            await cancelled.wait()
            gate.open()
        (record,) = batcher.records()
        assert record.rows == 2 and record.error is None
        check(results.outputs["patient"], request(2.0)["x"])
        stats = batcher.stats()
        assert (stats.requests, stats.cancelled) == (1, 1)


@pytest.mark.anyio
async def test_a_request_cancelled_in_the_queue_never_runs() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, clock=clock)
        results = Results(batcher)
        scope = anyio.CancelScope()

        async def dropped() -> None:
            with scope:
                await batcher.run(**request(9.0))

        async with batcher, anyio.create_task_group() as tg:
            tg.start_soon(results.run, "kept", request(1.0))
            tg.start_soon(dropped)
            await settle()
            assert batcher.stats().queued == 2
            scope.cancel()
            await settle()
            assert batcher.stats().queued == 1
            clock.advance(2 * MS)
        (record,) = batcher.records()
        assert record.rows == 1
        check(results.outputs["kept"], request(1.0)["x"])
        assert batcher.stats().cancelled == 1


@pytest.mark.anyio
async def test_a_kernel_failure_fails_its_batch_and_serving_goes_on() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, clock=clock)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            tg.start_soon(results.run, "poison", request(-1.0))
            tg.start_soon(results.run, "neighbour", request(1.0))
            await settle()
            clock.advance(2 * MS)
            with anyio.fail_after(10):
                while len(results.errors) < 2:
                    await anyio.sleep(0)
            tg.start_soon(results.run, "later", request(3.0))
            await settle()
            clock.advance(2 * MS)
        for name in ("poison", "neighbour"):
            error = results.errors[name]
            assert isinstance(error, NodeFailedError)
            assert error.node == "k0" and "negative input on purpose" in str(error)
        check(results.outputs["later"], request(3.0)["x"])
        stats = batcher.stats()
        assert (stats.failed, stats.requests, stats.batches) == (2, 1, 2)
        assert batcher.records()[0].error is not None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ({}, "missing x"),
        ({"x": np.zeros((1, FEATURES)), "y": 1}, "unknown y"),
        ({"x": np.zeros((1, FEATURES), np.float64)}, "expects dtype float32"),
        ({"x": np.zeros(FEATURES, np.float32)}, "1 dimensions"),
        ({"x": np.zeros((1, FEATURES + 1), np.float32)}, "expects 3 on axis 1"),
        ({"x": np.zeros((ROWS + 1, FEATURES), np.float32)}, "has 5 rows"),
        ({"x": np.zeros((0, FEATURES), np.float32)}, "has 0 rows"),
        ({"x": [["a", "b", "c"]]}, "cannot use"),
    ],
)
async def test_a_bad_request_is_rejected_alone(
    inputs: dict[str, Any], match: str
) -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, clock=clock)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            tg.start_soon(results.run, "good", request(1.0))
            await settle()
            with pytest.raises(InputError, match=match):
                await batcher.run(**inputs)
            assert batcher.stats().queued == 1
            clock.advance(2 * MS)
        check(results.outputs["good"], request(1.0)["x"])
        assert batcher.stats().rejected == 1
        assert [r.rows for r in batcher.records()] == [1]


@pytest.mark.anyio
async def test_lists_and_ndarrays_are_accepted() -> None:
    with make() as ex:
        async with Batcher(ex, batch_axes={"x": 0}, max_delay_ms=0) as batcher:
            check(await batcher.run(x=[[1.0, 2.0, 3.0]]), np.array([[1, 2, 3.0]]))
            given = asyncrt.nd.array(np.ones((2, FEATURES), np.float32))
            check(await batcher.run(x=given), np.ones((2, FEATURES)))


@pytest.mark.anyio
async def test_outputs_belong_to_their_request() -> None:
    with make() as ex:
        async with Batcher(ex, batch_axes={"x": 0}, max_delay_ms=0) as batcher:
            first = await batcher.run(**request(1.0))
            second = await batcher.run(**request(2.0))
            first[0].numpy()  # a copy: writing to it changes nothing else
            view = np.asarray(first[0])
            view[...] = -5
            check(second, request(2.0)["x"])
            assert np.asarray(first[0]).flags.c_contiguous


@pytest.mark.anyio
async def test_closing_runs_the_queue_at_once_and_refuses_new_requests() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, max_delay_ms=1000, clock=clock)
        with pytest.raises(ClosedResourceError, match="async with"):
            await batcher.run(**request(1.0))
        results = Results(batcher)
        async with batcher:
            async with anyio.create_task_group() as tg:
                tg.start_soon(results.run, "queued", request(1.0))
                await settle()
                batcher.close()  # the clock never moves: it runs anyway
            assert batcher.closed
        check(results.outputs["queued"], request(1.0)["x"])
        with pytest.raises(ClosedResourceError, match="closed"):
            await batcher.run(**request(1.0))
        with pytest.raises(ClosedResourceError, match="one `async with`"):
            await batcher.__aenter__()


@pytest.mark.anyio
async def test_stopping_the_block_fails_what_is_waiting() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, clock=clock)
        results = Results(batcher)
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as stop:
                async with batcher:
                    tg.start_soon(results.run, "waiting", request(1.0))
                    await settle()
                    stop.cancel()
                    await anyio.sleep_forever()
        assert isinstance(results.errors.get("waiting"), ClosedResourceError)


@pytest.mark.anyio
async def test_figures_and_trace() -> None:
    clock = FakeClock()
    with make() as ex:
        batcher = Batcher(ex, batch_axes={"x": 0}, clock=clock)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            tg.start_soon(results.run, "a", request(1.0))
            tg.start_soon(results.run, "b", request(1.0, rows=2))
            await settle()
            clock.advance(3 * MS)
        stats = batcher.stats()
        assert isinstance(stats, BatchStats)
        assert (stats.requests, stats.batches, stats.rows, stats.padded_rows) == (
            2,
            1,
            3,
            1,
        )
        assert stats.queue_delay.count == 2
        assert stats.queue_delay.max == pytest.approx(3.0)
        assert stats.mean_batch == 3
        assert "batch sizes {4: 1}" in stats.summary()
        data = json.loads(json.dumps(stats.to_dict()))
        assert data["sizes"] == {"4": 1} and data["queue_delay_ms"]["count"] == 2
        trace = batcher.chrome_trace()
        events = trace["traceEvents"]
        slices = [e for e in events if e.get("ph") == "X"]
        assert len(slices) == 1 and slices[0]["args"]["rows"] == 3
        assert sum(e.get("ph") == "b" for e in events) == 2
        assert sum(e.get("ph") == "e" for e in events) == 2


def test_empty_figures() -> None:
    stats = BatchStats()
    assert math.isnan(stats.mean_batch) and math.isnan(stats.queue_delay.p99)
    assert stats.to_dict()["queue_delay_ms"]["p99"] is None
    assert Batcher.chrome_trace.__doc__


@pytest.mark.anyio
async def test_the_memory_budget_bounds_a_batch() -> None:
    clock = FakeClock()
    with make() as ex:
        row = FEATURES * 4  # bytes of one row of x
        batcher = Batcher(
            ex, batch_axes={"x": 0}, max_batch_bytes=ROWS * row, clock=clock
        )
        with pytest.raises(ArgumentError, match="max_batch_bytes"):
            Batcher(ex, batch_axes={"x": 0}, max_batch_bytes=0)
        results = Results(batcher)
        async with batcher, anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(results.run, f"r{i}", request(float(i)))
            await settle()
            clock.advance(2 * MS)
        assert len(results.outputs) == 3


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"batch_axes": {}}, "batch_axes must map"),
        ({"batch_axes": {"y": 0}}, "names no input 'y'"),
        ({"batch_axes": {"x": 2}}, r"batch_axes\['x'\] must be an axis"),
        ({"batch_axes": {"x": 0}, "max_batch": 0}, "max_batch must be >= 1"),
        ({"batch_axes": {"x": 0}, "max_batch": ROWS + 1}, "batch size is 4"),
        ({"batch_axes": {"x": 0}, "preferred_batch_sizes": (2,)}, r"\(4,\)"),
        ({"batch_axes": {"x": 0}, "max_delay_ms": -1}, "max_delay_ms"),
        ({"batch_axes": {"x": 0}, "max_delay_ms": math.inf}, "max_delay_ms"),
        ({"batch_axes": {"x": 0}, "output_axes": (0,)}, "one batch axis per output"),
        ({"batch_axes": {"x": 0}, "max_concurrent_batches": 0}, "max_concurrent"),
        ({"batch_axes": {"x": 0}, "history": 0}, "history"),
        (
            {
                "batch_axes": {"x": 0},
                "padding": asyncrt.Padding(axes={"x": 1}, values={"x": 0}),
            },
            "cannot be padded",
        ),
    ],
)
def test_settings_are_checked(options: dict[str, Any], match: str) -> None:
    with make() as ex, pytest.raises(ArgumentError, match=match):
        Batcher(ex, **options)


def test_an_executor_is_required() -> None:
    with pytest.raises(ArgumentError, match="needs an executor"):
        Batcher(object(), batch_axes={"x": 0})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"axes": {}, "values": {}}, "Padding.axes must map"),
        ({"axes": {"x": 1}, "values": {}}, "pad value for exactly"),
        ({"axes": {"x": 1}, "values": {"x": "a"}}, "must be a number"),
        ({"axes": {"x": 1.5}, "values": {"x": 0}}, "must be an int"),
        ({"axes": {"x": 1}, "values": {"x": 0}, "buckets": (8, 4)}, "ascending"),
        ({"axes": {"x": 1}, "values": {"x": 0}, "buckets": (0,)}, ">= 1"),
        ({"axes": {"x": 1}, "values": {"x": 0}, "trim": {-1: 1}}, ">= 0"),
    ],
)
def test_padding_is_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        asyncrt.Padding(**kwargs)


def test_buckets() -> None:
    padding = asyncrt.Padding(axes={"x": 1}, values={"x": 0}, buckets=(8, 16))
    assert [padding.bucket(n) for n in (1, 8, 9, 16, 17)] == [8, 8, 16, 16, 17]
    assert asyncrt.Padding(axes={"x": 1}, values={"x": 0}).bucket(5) == -1


@pytest.mark.anyio
async def test_the_profile_report_shows_the_batching() -> None:
    graph, lib = static_graph()
    with asyncrt.debug_executor.create(graph, lib, "cpu") as ex:
        async with Batcher(ex, batch_axes={"x": 0}, max_delay_ms=0) as batcher:
            for value in (1.0, 2.0):
                check(await batcher.run(**request(value)), request(value)["x"])
        report = ex.trace.report().with_batching(batcher.stats())
    assert report.batching is not None and report.batching.batches == 2
    text = str(report)
    assert "Batching" in text and "batch sizes {4: 2}" in text
    assert "queue delay p50" in text
    data = json.loads(report.to_json())
    assert data["batching"]["sizes"] == {"4": 2}
    assert report.sort("name").batching is report.batching
    assert report.head(1).batching is report.batching
    assert "batching" not in ex.trace.report().to_dict()
