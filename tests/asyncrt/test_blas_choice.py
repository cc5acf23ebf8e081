"""The OpenBLAS kernel set of a process-backed executor's workers
(:mod:`asyncrt.runtime._blas_choice`): which sets are candidates, how the timing
interleaves and decides, and that the executor starts its workers with the
chosen set, keeps the winner, and leaves no worker behind."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncrt.errors import ArgumentError, NodeFailedError
from asyncrt.runtime import _blas_choice as _blas_choice
from asyncrt.runtime._blas_choice import (
    ENV,
    Timing,
    candidates,
    faster,
    time_interleaved,
)

from .test_processes import X, check, make, no_leaked_workers, worker_pids

__all__ = ("no_leaked_workers",)  # the fixture, used by every test here

OPENBLAS_SKYLAKEX = {"internal_api": "openblas", "architecture": "SkylakeX"}


@pytest.mark.parametrize(
    ("blas", "env", "want"),
    [
        ([OPENBLAS_SKYLAKEX], {}, ("SkylakeX", "Haswell")),
        (
            [{"internal_api": "openblas", "architecture": "Cooperlake"}],
            {},
            ("Cooperlake", "Haswell"),
        ),
        ([{"internal_api": "openblas", "architecture": "Haswell"}], {}, ()),
        ([{"internal_api": "openblas", "architecture": "Zen"}], {}, ()),
        ([{"internal_api": "mkl", "architecture": "SkylakeX"}], {}, ()),
        ([], {}, ()),
        ([OPENBLAS_SKYLAKEX], {ENV: "SkylakeX"}, ()),  # the user chose
    ],
)
def test_candidates_only_where_openblas_chose_avx512(
    blas: list[dict[str, str]], env: dict[str, str], want: tuple[str, ...]
) -> None:
    assert candidates(env, blas) == want


def test_the_default_set_wins_unless_another_is_clearly_faster() -> None:
    assert faster(Timing({"SkylakeX": 1.00, "Haswell": 0.90}), "SkylakeX") == "Haswell"
    assert faster(Timing({"SkylakeX": 1.00, "Haswell": 0.98}), "SkylakeX") == "SkylakeX"
    assert faster(Timing({"SkylakeX": 1.00, "Haswell": 1.20}), "SkylakeX") == "SkylakeX"


class FakeClock:
    """A clock that each run advances by that candidate's run time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def runner(self, name: str, seconds: float) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.calls.append(name)
            self.now += seconds

        return run


@pytest.mark.anyio
async def test_runs_interleave_with_alternating_order_after_a_warm_up() -> None:
    clock = FakeClock()
    runs = {"a": clock.runner("a", 0.010), "b": clock.runner("b", 0.020)}
    timing = await time_interleaved(runs, clock=clock)
    assert timing is not None
    assert timing.medians == pytest.approx({"a": 0.010, "b": 0.020})
    warm_up, rounds = clock.calls[:2], clock.calls[2:]
    assert warm_up == ["a", "b"]
    assert len(rounds) == 2 * _blas_choice.MAX_ROUNDS  # well within the budget
    pairs = [tuple(rounds[i : i + 2]) for i in range(0, len(rounds), 2)]
    assert pairs[:3] == [("a", "b"), ("b", "a"), ("a", "b")]


@pytest.mark.anyio
async def test_timing_stops_at_the_budget_after_the_fewest_rounds() -> None:
    clock = FakeClock()
    per_run = _blas_choice.BUDGET_SECONDS / 4  # two rounds use the budget
    runs = {"a": clock.runner("a", per_run), "b": clock.runner("b", per_run)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_blas_choice, "MAX_RUN_SECONDS", per_run * 2)
        timing = await time_interleaved(runs, clock=clock)
    assert timing is not None
    assert len(clock.calls) == 2 + 2 * _blas_choice.MIN_ROUNDS


@pytest.mark.anyio
async def test_a_graph_too_slow_to_time_keeps_the_default() -> None:
    clock = FakeClock()
    slow = _blas_choice.MAX_RUN_SECONDS * 2
    runs = {"a": clock.runner("a", slow), "b": clock.runner("b", 0.001)}
    assert await time_interleaved(runs, clock=clock) is None
    assert len(clock.calls) == 4  # the warm-ups and one round: no more


def worker_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode().partition("=") for item in raw if item)
    return {key: value for key, _, value in pairs}


def fixed_timing(medians: dict[str, float]) -> Any:
    """A stand-in for :func:`time_interleaved` that runs each worker once
    (so they really start and run) and reports ``medians``."""

    async def timed(runs: dict[str, Callable[[], Awaitable[None]]]) -> Timing:
        assert set(runs) == set(medians)
        for run in runs.values():
            await run()
        return Timing(medians)

    return timed


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("medians", "chosen"),
    [
        ({"Prescott": 1.0, "Nehalem": 0.5}, "Nehalem"),
        ({"Prescott": 1.0, "Nehalem": 2.0}, "default"),
    ],
)
@pytest.mark.anyio
async def test_auto_starts_every_worker_with_the_faster_set(
    monkeypatch: pytest.MonkeyPatch, medians: dict[str, float], chosen: str
) -> None:
    # Prescott and Nehalem: sets every x86-64 OpenBLAS can run.
    monkeypatch.setattr(_blas_choice, "candidates", lambda env: tuple(medians))
    monkeypatch.setattr(_blas_choice, "time_interleaved", fixed_timing(medians))
    ex = make(worker_blas="auto", max_contexts=2)
    try:
        assert ex.worker_blas is None  # not timed yet
        check(await ex.run(x=X), X)
        assert ex.worker_blas == chosen
        assert ex.worker_blas_timing == medians
        (winner,) = worker_pids()  # the loser is gone, the winner kept
        assert ex.pool.size == 1
        # Two runs at once: the winner and one new worker, same set.
        outs = await _gather(ex, 2)
        for out in outs:
            check(out, X)
        pids = worker_pids()
        assert winner in pids and len(pids) == 2
        for pid in pids:
            assert worker_env(pid).get(ENV) == (None if chosen == "default" else chosen)
    finally:
        await ex.aclose()


async def _gather(ex: Any, n: int) -> list[Any]:
    import anyio

    outs: list[Any] = [None] * n

    async def one(i: int) -> None:
        outs[i] = await ex.run(x=X)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return outs


@pytest.mark.anyio
async def test_a_graph_that_fails_on_zeros_keeps_the_default_and_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_blas_choice, "candidates", lambda env: ("Prescott", "Nehalem"))
    ex = make("test_fail_on_zero", worker_blas="auto")
    try:
        with pytest.raises(NodeFailedError, match="k0"):
            await ex.run(x=np.zeros_like(X))
        assert ex.worker_blas == "default"
        assert ex.worker_blas_timing is None
        check(await ex.run(x=X + 2), X + 2)  # nonzero inputs run
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_a_cancelled_choice_leaves_no_worker_and_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import anyio

    monkeypatch.setattr(_blas_choice, "candidates", lambda env: ("Prescott", "Nehalem"))
    timed: list[int] = []
    scope = anyio.CancelScope()

    async def cancelled_while_timing(runs: dict[str, Any]) -> Timing:
        for run in runs.values():
            await run()  # both workers up and running
        timed.append(len(worker_pids()))
        scope.cancel()
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    monkeypatch.setattr(_blas_choice, "time_interleaved", cancelled_while_timing)
    ex = make(worker_blas="auto")
    try:
        with scope:
            await ex.run(x=X)
        assert timed == [2]
        assert worker_pids() == set()
        assert ex.worker_blas is None  # to be chosen by the next run
        medians = {"Prescott": 1.0, "Nehalem": 1.0}
        monkeypatch.setattr(_blas_choice, "time_interleaved", fixed_timing(medians))
        check(await ex.run(x=X), X)
        assert ex.worker_blas == "default"
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_a_named_set_is_used_without_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_timing(runs: object) -> None:
        raise AssertionError("a named set needs no timing")

    monkeypatch.setattr(_blas_choice, "time_interleaved", no_timing)
    ex = make(worker_blas="Nehalem", max_contexts=1)
    try:
        assert ex.worker_blas == "Nehalem"
        check(await ex.run(x=X), X)
        (pid,) = worker_pids()
        assert worker_env(pid)[ENV] == "Nehalem"
    finally:
        await ex.aclose()


@pytest.mark.anyio
async def test_a_set_named_in_worker_env_is_the_workers_set() -> None:
    ex = make(worker_env={ENV: "Nehalem"}, worker_blas="auto", max_contexts=1)
    try:
        check(await ex.run(x=X), X)
        assert ex.worker_blas == "Nehalem"
        assert ex.worker_blas_timing is None
        (pid,) = worker_pids()
        assert worker_env(pid)[ENV] == "Nehalem"
    finally:
        await ex.aclose()


def test_worker_blas_is_checked() -> None:
    with pytest.raises(ArgumentError, match="worker_blas"):
        make(worker_blas="Has well; rm")
    with pytest.raises(ArgumentError, match="give one"):
        make(worker_blas="Haswell", worker_env={ENV: "Zen"})


@pytest.mark.anyio
async def test_a_graph_with_nothing_on_the_cpu_is_not_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_blas_choice, "candidates", lambda env: ("Prescott", "Nehalem"))

    def no_timing(runs: object) -> None:
        raise AssertionError("numpy's BLAS does not run this graph's kernels")

    monkeypatch.setattr(_blas_choice, "time_interleaved", no_timing)
    ex = make(devices="sim:0", worker_blas="auto")
    try:
        check(await ex.run(x=X), X)
        assert ex.worker_blas == "default"
    finally:
        await ex.aclose()
