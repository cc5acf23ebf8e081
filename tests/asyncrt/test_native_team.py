"""Compiled kernels on a native team (GNU OpenMP's threads entered through
ctypes): every part taken exactly once, by one thread or several; launches
from many Python threads at once; the calling thread alone where there is
no team."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _jit
from asyncrt.ops._vector_ir import CLAIMS, compile_vectors
from asyncrt.runtime import _native_team, _threads

pytestmark = pytest.mark.skipif(not _jit.available(), reason="numba not installed")

# data's slots: next part, parts, the address of a float32 array of one
# cell a part; each part adds its index plus one to its cell
_SOURCE = """
{claims}


@team_kernel
def mark(data):
    d = numba.carray(slots_(data), 3)
    cells = numba.carray(floats_(d[2]), d[1])
    while True:
        i = claim_(data)
        if i >= d[1]:
            return
        cells[i] += i + 1
"""


def _run() -> Any:
    kernel: Any = compile_vectors("test_native_team", _SOURCE, "mark", claims=CLAIMS)
    return _native_team.launcher(int(kernel.address))


def _job(parts: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    cells = np.zeros(parts, np.float32)
    data = np.array([0, parts, cells.ctypes.data], np.int64)
    return cells, data


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("parts", [0, 1, 2, 7, 64])
def test_every_part_is_taken_once(threads: int, parts: int) -> None:
    run = _run()
    cells, data = _job(parts)
    run(data.ctypes.data, threads)
    np.testing.assert_array_equal(cells, np.arange(1, parts + 1))
    assert data[0] >= parts  # (each thread's last claim finds none left)


@pytest.mark.parametrize("threads", [2, 3])
def test_crowded_calls_go_to_the_part_pool(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """While other processes keep the cores busy, the threads are the part
    pool's (its caller never waits for one that has not started), not a
    team's: every part still taken once."""
    run = _run()
    pooled: list[int] = []
    pool_run = _native_team._part_pool.run

    def spy(parts: Any, count: int) -> None:
        pooled.append(count)
        pool_run(parts, count)

    monkeypatch.setattr(_native_team._part_pool, "run", spy)
    monkeypatch.setattr(
        _native_team, "_gomp_parallel", lambda: pytest.fail("a team launched")
    )
    cells, data = _job(40)
    run(data.ctypes.data, threads, crowded=True)
    np.testing.assert_array_equal(cells, np.arange(1, 41))
    assert pooled == [threads]


def test_how_a_call_shares_its_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small work stays on the caller; large work a part a kernel thread,
    or while crowded several parts a thread on the part pool."""
    monkeypatch.setattr(_threads.limits, "threads", 2)
    monkeypatch.setattr(_threads.limits, "gemm_parts", 1)
    assert _native_team.share(False) == (1, 1, False)
    assert _native_team.share(True) == (2, 2, False)
    monkeypatch.setattr(_threads.limits, "threads", 1)
    monkeypatch.setattr(_threads.limits, "gemm_parts", 2)
    parts = 2 * _native_team.CROWDED_PARTS_PER_THREAD
    assert _native_team.share(True) == (2, parts, True)
    assert _native_team.share(False) == (1, 1, False)
    # crowded, small work stays on the calling thread (a pool thread would
    # wake when the caller is nearly done); large work goes to the pool
    small = _native_team.CROWDED_MIN_WORK - 1
    assert _native_team.share(True, small) == (1, 1, False)
    assert _native_team.share(True, _native_team.CROWDED_MIN_WORK) == (2, parts, True)


def test_launches_from_many_threads_at_once() -> None:
    run = _run()
    jobs = [_job(50) for _ in range(8)]

    def launch(job: tuple[Any, Any]) -> None:
        data = job[1]
        for _ in range(100):
            data[0] = 0
            run(data.ctypes.data, 2)

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(launch, jobs))
    for cells, _ in jobs:
        np.testing.assert_array_equal(cells, 100 * np.arange(1, 51))


def test_without_a_team_the_caller_runs_every_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process forked after a team ran, or no libgomp: no team."""
    run = _run()
    launched: list[int] = []
    monkeypatch.setattr(
        _native_team, "_gomp_parallel", lambda: lambda *args: launched.append(1)
    )
    monkeypatch.setattr(_native_team, "_launched_in", os.getpid() + 1)
    assert not _native_team.teams_available()
    cells, data = _job(9)
    run(data.ctypes.data, 4)
    np.testing.assert_array_equal(cells, np.arange(1, 10))
    monkeypatch.setattr(_native_team, "_launched_in", None)
    monkeypatch.setattr(_native_team, "_gomp_parallel", lambda: None)
    assert not _native_team.teams_available()
    cells, data = _job(9)
    run(data.ctypes.data, 4)
    np.testing.assert_array_equal(cells, np.arange(1, 10))
    assert not launched
