"""The time evaluator (TVM's semantics: warm-up, repeat x number, number
grown to min_repeat_ms, zero-time limit, cooldown), BenchmarkResult, and
GraphModule.benchmark / abenchmark."""

from __future__ import annotations

import statistics
import threading

import numpy as np
import pytest

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import ArgumentError, InputError
from asyncrt.graph import GraphBuilder
from asyncrt.profiling import BenchmarkResult
from asyncrt.tools._time_evaluator import Settings


def test_benchmark_result_statistics() -> None:
    result = BenchmarkResult.from_results([3.0, 1.0, 2.0, 6.0], number=7)
    assert result.results == (3.0, 1.0, 2.0, 6.0)
    assert result.mean == 3.0 and result.median == 2.5
    assert result.std == pytest.approx(statistics.pstdev([3, 1, 2, 6]))
    assert (result.min, result.max, result.number) == (1.0, 6.0, 7)
    assert result.to_dict()["results"] == [3.0, 1.0, 2.0, 6.0]
    text = str(result)
    assert text.startswith("Execution time summary:")
    assert "mean (ms)" in text and "3000.0000" in text
    with pytest.raises(ArgumentError):
        BenchmarkResult.from_results([])


def test_calls_are_one_warm_up_and_repeat_times_number() -> None:
    calls: list[int] = []
    timer = asyncrt.time_evaluator(lambda: calls.append(1), number=4, repeat=3)
    result = timer()
    assert len(calls) == 1 + 4 * 3
    assert len(result.results) == 3 and result.number == 4
    assert all(r >= 0 for r in result.results)


def test_number_grows_to_fill_min_repeat_ms() -> None:
    schedule = Settings(number=2, repeat=2, min_repeat_ms=10.0).schedule()
    assert not schedule.report(0.001)  # 2 calls in 1 ms: too short
    # At 0.5 ms per call, 10 ms needs 21 calls (more than 2 x golden ratio).
    assert schedule.number == 21
    assert schedule.report(0.021)
    assert schedule.results == [0.021 / 21]
    assert not schedule.done
    assert not schedule.report(0.005)  # slower now: grows again, kept after
    assert schedule.number == max(int(0.01 / (0.005 / 21)) + 1, 34)
    assert schedule.report(0.05) and schedule.done


def test_number_grows_at_least_by_the_golden_ratio() -> None:
    schedule = Settings(number=10, repeat=1, min_repeat_ms=1.0).schedule()
    assert not schedule.report(0.00099)  # just short: still grows by 1.618
    assert schedule.number == 17


def test_zero_time_measurements_stop_after_the_limit() -> None:
    schedule = Settings(
        number=1, repeat=1, min_repeat_ms=5.0, limit_zero_time_iterations=3
    ).schedule()
    assert not schedule.report(0.0)
    assert not schedule.report(0.0)
    assert schedule.report(0.0)  # the third: kept, nothing loops for ever
    assert schedule.results == [0.0] and schedule.number == 1


def test_cooldown_every_few_repeats() -> None:
    schedule = Settings(
        number=1, repeat=4, cooldown_interval_ms=5.0, repeats_to_cooldown=2
    ).schedule()
    pauses = []
    for _ in range(4):
        assert schedule.report(0.001)
        pauses.append(schedule.cooldown())
    assert pauses == [0.0, 0.005, 0.0, 0.0]  # none after the last


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"number": 0}, "number"),
        ({"repeat": True}, "repeat"),
        ({"min_repeat_ms": -1}, "min_repeat_ms"),
        ({"min_repeat_ms": float("nan")}, "min_repeat_ms"),
        ({"limit_zero_time_iterations": 0}, "limit_zero"),
        ({"cooldown_interval_ms": "1"}, "cooldown"),
    ],
)
def test_bad_settings(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        asyncrt.time_evaluator(lambda: None, **kwargs)  # type: ignore[arg-type]


def test_not_callable_and_coroutine_in_sync_call() -> None:
    with pytest.raises(ArgumentError, match="callable"):
        asyncrt.time_evaluator(42)  # type: ignore[arg-type]

    async def coro() -> None:
        pass

    with pytest.raises(ArgumentError, match="acall"):
        asyncrt.time_evaluator(coro)()


@pytest.mark.anyio
async def test_acall_awaits_coroutines_and_threads_plain_functions() -> None:
    awaited: list[int] = []

    async def coro(n: int) -> None:
        awaited.append(n)

    result = await asyncrt.time_evaluator(coro, number=2, repeat=2).acall(5)
    assert awaited == [5] * 5 and len(result.results) == 2

    threads: set[int] = set()
    await asyncrt.time_evaluator(
        lambda: threads.add(threading.get_ident()), number=1, repeat=1
    ).acall()
    assert threads and threading.get_ident() not in threads  # off the loop


def small_graph() -> GraphBuilder:
    b = GraphBuilder()
    x = b.input("x", shape=(16,), dtype="float32")
    b.output(b.op("tanh", x, shape=(16,), dtype="float32"))
    return b


def test_graph_module_benchmark() -> None:
    x = np.ones(16, np.float32)
    ticks: list[tuple[int, int]] = []
    with graph_executor.create(small_graph().build(), None, "cpu") as ex:
        with pytest.raises(InputError, match="never set"):
            ex.benchmark(repeat=3, number=2)
        result = ex.benchmark(
            repeat=3, number=2, progress=lambda *t: ticks.append(t), x=x
        )
        assert len(result.results) == 3 and result.mean > 0
        assert ticks == [(1, 3), (2, 3), (3, 3)]
        e2e = ex.benchmark("cpu:0", repeat=2, number=1, end_to_end=True, x=x)
        assert len(e2e.results) == 2
        with pytest.raises(ArgumentError, match="not one of this executor"):
            ex.benchmark("sim:0", x=x)


@pytest.mark.anyio
async def test_graph_module_abenchmark() -> None:
    x = np.ones(16, np.float32)
    with graph_executor.create(small_graph().build(), None, "cpu") as ex:
        result = await ex.abenchmark(repeat=2, number=3, x=x)
        assert len(result.results) == 2 and result.number == 3
        e2e = await ex.abenchmark(repeat=2, number=1, end_to_end=True, x=x)
        assert len(e2e.results) == 2
