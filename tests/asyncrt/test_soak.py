"""Soak: 5,000 concurrent runs (some cancelled) on one executor keep the
thread count constant (and the worker processes, for a process-backed one)
and memory flat, and every answer right.

It runs in the default suite (a few seconds per event loop); the ``slow``
marker only lets a quick local run skip it with ``-m "not slow"``.
"""

from __future__ import annotations

import gc
import os
import threading

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from asyncrt.graph_executor import GraphModule

from .test_executor import C, N, W, make, reference
from .test_processes import worker_pids

# 5,000 (it was 10,000): the four soaks took a minute of a CI run that must
# stay near five minutes on a slow 2-core host. The thread, worker and pool
# checks hold whatever the count; the 5% RSS bound (of a process of about
# 200 MB) now catches a leak of about 2 KiB a run, where 10,000 caught 1.
RUNS = 5_000
WARM_UP = 1_000
WORKERS = 8
CANCEL_EVERY = 97  # every so often a run is cancelled part-way


def rss_bytes() -> int:
    """Resident set size now (not the peak), from /proc."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


async def soak(ex: GraphModule, runs: int, seed: int) -> int:
    """``runs`` runs over WORKERS tasks, each answer checked; return how many
    were cancelled."""
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((64, N)).astype(np.float32)
    wants = [reference(x, C, W) for x in xs]
    cancelled = 0

    async def worker(first: int) -> None:
        nonlocal cancelled
        out = [np.empty(N, np.float32), np.empty(N, np.float32)]
        for i in range(first, runs, WORKERS):
            k = i % len(xs)
            if i % CANCEL_EVERY == 0:
                with anyio.CancelScope() as scope:
                    tg.start_soon(cancel_soon, scope)
                    await ex.run(x=xs[k])
                cancelled += scope.cancelled_caught
                continue
            if i % 2:
                got = await ex.run(out=out, x=xs[k])
            else:
                outs = await ex.run(x=xs[k])
                assert outs is not None
                got = [o.numpy() for o in outs]
            np.testing.assert_allclose(got[0], wants[k][0], rtol=1e-6)
            np.testing.assert_allclose(got[1], wants[k][1], rtol=1e-6)

    async def cancel_soon(scope: anyio.CancelScope) -> None:
        await anyio.lowlevel.checkpoint()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        for first in range(WORKERS):
            tg.start_soon(worker, first)
    return cancelled


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.anyio
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
async def test_soak_threads_constant_memory_flat(processes: bool) -> None:
    async with make("cpu", max_contexts=4, processes=processes) as ex:
        await soak(ex, WARM_UP, seed=1)
        gc.collect()
        threads, rss = set(threading.enumerate()), rss_bytes()
        workers = worker_pids()
        cancelled = await soak(ex, RUNS, seed=2)
        gc.collect()
        # No thread was added (threads of earlier tests may still wind down).
        assert set(threading.enumerate()) <= threads
        growth = (rss_bytes() - rss) / rss
        assert growth < 0.05, f"RSS grew {growth:.1%} over {RUNS} runs"
        assert cancelled > 0  # the soak did exercise cancellation
        assert ex.pool.size <= 4 and ex.pool.idle == ex.pool.size
        assert worker_pids() == workers  # no worker process died or was added
