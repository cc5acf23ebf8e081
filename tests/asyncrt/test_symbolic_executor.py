"""One executor for every input shape: a plan per shape signature, built off
the event loop once however many callers bring it, kept in a bounded LRU."""

from __future__ import annotations

import gc
import threading
from typing import Any

import anyio
import numpy as np
import pytest

from asyncrt import graph_executor
from asyncrt.errors import InputError, UnsupportedOperationError
from asyncrt.graph import SymbolicGraph

from .frontend.symbolic_models import TINY, bert_encoder, bert_feed, cnn_symbolic_batch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from asyncrt import debug_executor  # noqa: E402
from asyncrt.frontend import from_onnx  # noqa: E402

SHAPES = [(1, 1), (2, 7), (3, 16), (2, 64), (1, 5), (4, 3)]


def _bert() -> tuple[SymbolicGraph, dict[str, np.ndarray], Any]:
    model = bert_encoder(TINY)
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return graph, params, session


def _close(got: list[Any], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        value = g.numpy() if hasattr(g, "numpy") else g
        np.testing.assert_allclose(value, w, rtol=1e-4, atol=1e-4)


@pytest.mark.anyio
async def test_one_executor_serves_every_shape_like_onnxruntime() -> None:
    graph, params, session = _bert()
    async with graph_executor.create(graph, params=params) as ex:
        for batch, seq in SHAPES:
            feed = bert_feed(batch, seq)
            _close(await ex.run(**feed) or [], session.run(None, feed))
        # a second pass: every signature is cached, nothing is built again
        for batch, seq in SHAPES:
            feed = bert_feed(batch, seq)
            _close(await ex.run(**feed) or [], session.run(None, feed))
        stats = ex.plan_cache_stats()
    assert stats is not None
    assert (stats.misses, stats.builds, stats.hits) == (6, 6, 6)
    assert stats.size == 6 and stats.evictions == 0
    assert stats.last_build_seconds != 0.0  # build times are recorded (0: none)


@pytest.mark.anyio
async def test_concurrent_callers_of_a_new_signature_wait_for_one_build() -> None:
    graph, params, session = _bert()
    feeds = [bert_feed(2, 9, seed=s) for s in range(12)]
    results: list[list[Any]] = [[] for _ in feeds]
    async with graph_executor.create(graph, params=params, max_contexts=3) as ex:

        async def one(i: int) -> None:
            results[i] = await ex.run(**feeds[i]) or []

        async with anyio.create_task_group() as tg:
            for i in range(len(feeds)):
                tg.start_soon(one, i)
        stats = ex.plan_cache_stats()
    assert stats is not None
    assert stats.builds == 1 and stats.misses == 1
    assert stats.joined + stats.hits == len(feeds) - 1
    for feed, got in zip(feeds, results, strict=True):
        _close(got, session.run(None, feed))


@pytest.mark.anyio
async def test_the_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    graph, params, session = _bert()
    async with graph_executor.create(graph, params=params, max_plans=2) as ex:
        for seq in range(1, 31):  # thirty distinct signatures in a row
            feed = bert_feed(1, seq)
            out = await ex.run(**feed)
            if seq % 10 == 0:
                _close(out or [], session.run(None, feed))
        stats = ex.plan_cache_stats()
        assert stats is not None
        assert stats.size == 2 and stats.evictions == 28 and stats.builds == 30
        await ex.run(**bert_feed(1, 30))  # the most recent: a hit
        await ex.run(**bert_feed(1, 1))  # evicted long ago: built again
        stats = ex.plan_cache_stats()
        assert stats is not None and stats.hits == 1 and stats.builds == 31
    gc.collect()


@pytest.mark.anyio
async def test_a_bad_shape_is_refused_before_anything_is_built() -> None:
    graph, params, _ = _bert()
    async with graph_executor.create(graph, params=params) as ex:
        feed = bert_feed(2, 8)
        feed["attention_mask"] = feed["attention_mask"][:1]  # batch 1, not 2
        with pytest.raises(InputError, match="batch") as info:
            await ex.run(**feed)
        assert "attention_mask" in str(info.value) or "input_ids" in str(info.value)
        with pytest.raises(InputError, match=r"rank|dimension"):
            await ex.run(
                input_ids=np.zeros((2, 3, 4), np.int64),
                attention_mask=np.ones((2, 3), np.int64),
            )
        with pytest.raises(InputError, match="no input 'tokens'"):
            await ex.run(tokens=np.zeros((1, 2), np.int64))
        stats = ex.plan_cache_stats()
        assert stats is not None and stats.builds == 0 and stats.failures == 0
        # and the executor serves the next good request
        good = bert_feed(1, 4)
        assert await ex.run(**good)


@pytest.mark.anyio
async def test_a_build_that_fails_is_not_cached_and_raises_for_every_waiter() -> None:
    graph, params, _ = _bert()
    calls = 0
    release = threading.Event()
    real = graph.specialize

    def failing(shapes: Any, values: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            release.wait(10)  # until every request has joined this build
            raise InputError("the first build fails on purpose")
        return real(shapes, values)

    graph.specialize = failing  # type: ignore[method-assign]
    async with graph_executor.create(graph, params=params) as ex:
        errors: list[BaseException] = []

        async def one() -> None:
            try:
                await ex.run(**bert_feed(1, 6))
            except InputError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one)
            with anyio.fail_after(10):
                while (stats := ex.plan_cache_stats()) is None or stats.joined < 3:
                    await anyio.sleep(0.001)
            release.set()
        assert len(errors) == 4 and calls == 1
        assert await ex.run(**bert_feed(1, 6))  # tried again, and built
        stats = ex.plan_cache_stats()
        assert stats is not None and (stats.failures, stats.builds) == (1, 1)


@pytest.mark.anyio
async def test_builds_happen_off_the_event_loop() -> None:
    graph, params, _ = _bert()
    loop_thread = threading.get_ident()
    threads: list[int] = []
    real = graph.specialize

    def watched(shapes: Any, values: Any) -> Any:
        threads.append(threading.get_ident())
        return real(shapes, values)

    graph.specialize = watched  # type: ignore[method-assign]
    async with graph_executor.create(graph, params=params) as ex:
        await ex.run(**bert_feed(2, 5))
        await ex.run(**bert_feed(2, 6))
    assert len(threads) == 2 and loop_thread not in threads


@pytest.mark.anyio
async def test_a_cancelled_request_leaves_its_build_for_the_next() -> None:
    graph, params, session = _bert()
    started = threading.Event()
    release = threading.Event()
    real = graph.specialize

    def slow(shapes: Any, values: Any) -> Any:
        started.set()
        release.wait(10)
        return real(shapes, values)

    graph.specialize = slow  # type: ignore[method-assign]
    async with graph_executor.create(graph, params=params) as ex:
        feed = bert_feed(1, 11)
        with anyio.move_on_after(30) as scope:
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    await ex.run(**feed)

                tg.start_soon(waiter)
                while not started.is_set():
                    await anyio.sleep(0.001)
                tg.cancel_scope.cancel()  # the caller gives up mid-build
        assert not scope.cancelled_caught
        release.set()
        _close(await ex.run(**feed) or [], session.run(None, feed))
        stats = ex.plan_cache_stats()
        assert stats is not None and stats.builds == 1


def test_run_sync_and_the_stateful_api_on_symbolic_shapes() -> None:
    graph, params, session = _bert()
    with graph_executor.create(graph, params=params) as ex:
        feed = bert_feed(2, 5)
        _close(ex.run_sync(**feed) or [], session.run(None, feed))
        other = bert_feed(3, 4)
        ex.set_input(**other)
        ex.run_sync()
        want = session.run(None, other)
        for index, value in enumerate(want):
            np.testing.assert_allclose(
                ex.get_output(index).numpy(), value, rtol=1e-4, atol=1e-4
            )
        shapes, dtypes = ex.get_input_info()
        assert shapes["input_ids"] == ("batch", "sequence")
        assert dtypes["input_ids"] == "int64"
        assert ex.get_num_outputs() == len(want)


def test_a_symbolic_cnn_runs_at_several_batches_on_cpu_and_sims() -> None:
    model = cnn_symbolic_batch()
    graph, params = from_onnx(model)
    assert isinstance(graph, SymbolicGraph)
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    name = next(iter(graph.inputs))
    rng = np.random.default_rng(0)
    with graph_executor.create(
        graph, None, ["cpu", "sim:0", "sim:1"], params=params, policy="heft"
    ) as ex:
        for batch in (1, 3, 8, 2, 5):
            x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
            _close(ex.run_sync(**{name: x}) or [], session.run(None, {name: x}))


def test_the_debug_executor_needs_static_shapes() -> None:
    graph, params, _ = _bert()
    with pytest.raises(UnsupportedOperationError, match="shape_dict"):
        debug_executor.create(graph, params=params)


@pytest.mark.anyio
async def test_many_signatures_in_a_row_hold_at_most_max_plans() -> None:
    """Memory stays bounded: three hundred distinct signatures through a
    cache of four leave at most four built cores alive (the evicted ones
    released: their contexts, streams and arenas)."""
    from onnx import TensorProto, helper

    from asyncrt.runtime._core import ExecutorCore

    from .frontend.models import model_of

    node = helper.make_node("Relu", ["x"], ["y"])
    graph_proto = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    graph, params = from_onnx(model_of(graph_proto, 17))
    assert isinstance(graph, SymbolicGraph)

    def cores() -> int:
        # type(), not isinstance(): the heap may hold weak proxies whose
        # referents are gone (isinstance would dereference them)
        return sum(issubclass(type(o), ExecutorCore) for o in gc.get_objects())

    before = cores()
    async with graph_executor.create(graph, params=params, max_plans=4) as ex:
        for n in range(1, 301):
            x = np.linspace(-1, 1, n, dtype=np.float32)
            (y,) = await ex.run(x=x)
            np.testing.assert_array_equal(y.numpy(), np.maximum(x, 0))
        gc.collect()
        alive = cores() - before
        stats = ex.plan_cache_stats()
    assert stats is not None and stats.builds == 300 and stats.evictions == 296
    assert alive <= 4


@pytest.mark.anyio
async def test_symbolic_shapes_in_worker_processes() -> None:
    """processes=True: each signature's plan runs in worker processes, which
    get the weights that plan reads (not every weight of the model)."""
    graph, params, session = _bert()
    async with graph_executor.create(
        graph, params=params, processes=True, max_contexts=1, worker_blas="default"
    ) as ex:
        for batch, seq in [(1, 4), (2, 7), (1, 4)]:
            feed = bert_feed(batch, seq)
            _close(await ex.run(**feed), session.run(None, feed))
        stats = ex.plan_cache_stats()
    assert stats is not None and (stats.builds, stats.hits) == (2, 1)


@pytest.mark.anyio
async def test_the_profile_report_carries_the_plan_cache() -> None:
    graph, params, _ = _bert()
    async with graph_executor.create(graph, params=params) as ex:
        for batch, seq in [(1, 4), (2, 4), (1, 4)]:
            await ex.run(**bert_feed(batch, seq))
        stats = ex.plan_cache_stats()
    assert stats is not None
    static, static_params = from_onnx(
        bert_encoder(TINY), {k: v.shape for k, v in bert_feed(1, 4).items()}
    )
    with debug_executor.create(static, params=static_params) as debug:
        report = (await debug.aprofile(runs=1, **bert_feed(1, 4))).with_plan_cache(
            stats
        )
    assert report.plan_cache == stats
    text = str(report)
    assert "Plan cache" in text and "1 hits, 2 misses" in text
    assert "builds 2 (" in text
    data = report.to_dict()["plan_cache"]
    assert (data["hits"], data["misses"], data["builds"]) == (1, 2, 2)
    # the figures survive sorting and cutting, as the batching figures do
    assert report.sort("name").head(1).plan_cache == stats
