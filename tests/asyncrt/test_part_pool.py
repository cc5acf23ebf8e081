"""The kernel threads' pool (:mod:`asyncrt.runtime._part_pool`): every part
runs once, errors come back after every part has finished, and concurrent,
nested and forked callers neither hang nor lose parts."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable

import pytest

from asyncrt.runtime import _part_pool
from asyncrt.runtime._threads import run_parts


def _recording(
    count: int, log: list[int], delay: float = 0.0
) -> list[Callable[[], None]]:
    def part(index: int) -> None:
        if delay:
            time.sleep(delay * random.random())
        log.append(index)

    return [lambda i=i: part(i) for i in range(count)]


@pytest.mark.parametrize("count", [1, 2, 3, 8, 40])
def test_every_part_runs_once(count: int) -> None:
    log: list[int] = []
    run_parts(_recording(count, log, delay=0.001))
    assert sorted(log) == list(range(count))


def test_parts_run_on_several_threads_at_once() -> None:
    # Two parts that each wait for the other: only concurrent threads
    # finish them (the caller alone would wait forever; the timeout says).
    first, second = threading.Event(), threading.Event()
    seen: set[str] = set()

    def meet(mine: threading.Event, theirs: threading.Event) -> None:
        seen.add(threading.current_thread().name)
        mine.set()
        assert theirs.wait(10), "the other part never ran beside this one"

    run_parts([lambda: meet(first, second), lambda: meet(second, first)])
    assert len(seen) == 2


def test_the_first_error_is_raised_after_every_part_finished() -> None:
    log: list[int] = []
    parts = _recording(6, log, delay=0.002)

    def failing() -> None:
        raise KeyError("part 2")

    parts[2] = failing
    with pytest.raises(KeyError, match="part 2"):
        run_parts(parts)
    assert sorted(log) == [0, 1, 3, 4, 5]  # the others still ran, and ended
    log.clear()
    run_parts(_recording(4, log))  # and the pool still serves
    assert sorted(log) == [0, 1, 2, 3]


def test_concurrent_and_nested_callers() -> None:
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def caller(key: int) -> None:
        try:
            for _ in range(20):
                log: list[int] = []
                # each part splits again, as a kernel calling one
                inner = [lambda log=log: run_parts(_recording(3, log))] * 3
                run_parts(inner)
                results[key] = sorted(log)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a caller hung"
    assert not errors
    assert all(log == sorted([0, 1, 2] * 3) for log in results.values())


def _child(out: multiprocessing.SimpleQueue[list[int]]) -> None:
    log: list[int] = []
    run_parts(_recording(5, log))
    out.put(sorted(log))


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork"
)
def test_a_forked_child_runs_parts_without_the_parents_threads() -> None:
    run_parts(_recording(3, []))  # the parent's helpers exist
    context = multiprocessing.get_context("fork")
    out: multiprocessing.SimpleQueue[list[int]] = context.SimpleQueue()
    child = context.Process(target=_child, args=(out,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert out.get() == [0, 1, 2, 3, 4]


def test_helpers_start_only_as_calls_need_them() -> None:
    pool = _part_pool._Pool()
    pool.run(_recording(1, []))
    assert pool._helpers == 0  # one part: this thread alone
    pool.run(_recording(3, []))
    assert pool._helpers == 2
