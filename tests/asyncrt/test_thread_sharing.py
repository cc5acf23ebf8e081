"""The kernel thread budget shared among the runs in flight (``"auto"``):
a run alone gets every core, concurrent runs share them."""

from __future__ import annotations

import os
import threading
from typing import Any, cast

import anyio
import numpy as np
import pytest
import threadpoolctl

import asyncrt
from asyncrt import graph_executor
from asyncrt.graph import Graph, GraphBuilder
from asyncrt.runtime import _threads as _threads
from asyncrt.runtime._neighbours import (
    WINDOW_SECONDS,
    BusyNeighbours,
    machine_busy_seconds,
)


def blas_threads() -> int:
    info = threadpoolctl.threadpool_info()
    return min(lib["num_threads"] for lib in info) if info else 0


class Clock:
    """A clock the test moves (past the grow-back delay)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def later(self) -> None:
        self.now += _threads.GROW_BACK_SECONDS + 0.1


def test_shared_claims_shrink_while_runs_are_in_flight() -> None:
    clock = Clock()
    limits = _threads.ThreadLimits(cores=8, clock=clock)
    lease = limits.acquire(8, streams=1, shared=True)
    try:
        assert limits.threads == 8
        with lease.running():
            assert limits.threads == 8  # a run alone keeps every core
            with lease.running():
                assert limits.threads == 4
                with lease.running(), lease.running():
                    assert limits.threads == 2
            assert limits.wanted() == 8
            assert limits.threads == 2  # runs overlapped just now
        clock.later()
        with lease.running():
            assert limits.threads == 8  # alone, long after the overlap
        assert limits.threads == 8
    finally:
        lease.release()
    assert limits.threads == 1


def test_shared_pools_grow_back_only_after_a_quiet_spell() -> None:
    clock = Clock()
    limits = _threads.ThreadLimits(cores=4, clock=clock)
    lease = limits.acquire(4, streams=1, shared=True)
    try:
        for _ in range(3):  # a busy service: a run alone between overlaps
            with lease.running(), lease.running():
                assert limits.threads == 2
            with lease.running():
                assert limits.threads == 2
            clock.now += _threads.GROW_BACK_SECONDS / 4
        clock.later()
        with lease.running():
            assert limits.threads == 4
    finally:
        lease.release()


def test_runs_of_every_executor_count_and_fixed_claims_stay() -> None:
    clock = Clock()
    limits = _threads.ThreadLimits(cores=8, clock=clock)
    two_streams = limits.acquire(4, streams=2, shared=True)
    other = limits.acquire(8, streams=1, shared=True)
    fixed = limits.acquire(6, streams=1, shared=False)
    try:
        assert limits.threads == 4  # the smallest claim alone
        with two_streams.running(), other.running():
            assert limits.threads == 2  # 3 busy streams on 8 cores
        clock.later()
        fixed.release()
        with other.running(), other.running(), other.running():
            assert limits.threads == 2  # 8 // 3
        clock.later()
        with fixed.running():  # released: its runs no longer count
            assert limits.threads == 2
        with other.running():
            assert limits.threads == 4
    finally:
        two_streams.release()
        other.release()


def test_a_run_that_outlives_its_lease_is_harmless() -> None:
    limits = _threads.ThreadLimits(cores=4)
    lease = limits.acquire(4, streams=1, shared=True)
    with lease.running():
        lease.release()
        assert limits.threads == 1
    assert limits.threads == 1
    assert limits.wanted() is None


def test_limits_apply_from_any_thread() -> None:
    """threadpoolctl >= 3.8 lets one Python thread set OpenBLAS's pool; a
    lease taken on another thread (a plan built off the event loop) must
    not leave the later changes without effect."""
    before = blas_threads()
    if before < 2:
        pytest.skip("needs a BLAS pool of at least 2 threads")
    clock = Clock()
    limits = _threads.ThreadLimits(cores=before, clock=clock)
    taken = threading.Event()
    done = threading.Event()
    leases: list[_threads.ThreadLease] = []

    def hold() -> None:  # stays alive while the main thread changes limits
        leases.append(limits.acquire(before, streams=1, shared=True))
        taken.set()
        done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(10)
        with leases[0].running(), leases[0].running():
            assert blas_threads() == max(1, before // 2)
        clock.later()
        with leases[0].running():
            assert blas_threads() == before
    finally:
        leases[0].release()
        done.set()
        thread.join()
    assert blas_threads() == before


def _gated_graph() -> tuple[Graph, asyncrt.Module, threading.Barrier, list[int]]:
    """One node whose kernel records the fused kernels' thread share once
    two runs are inside it."""
    barrier = threading.Barrier(2, timeout=10)
    seen: list[int] = []

    def gated(x: np.ndarray, out: np.ndarray) -> None:
        barrier.wait()
        seen.append(_threads.limits.threads)
        barrier.wait()
        np.copyto(out, x)

    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    b.output(b.op("gated", x, shape=(4,), dtype="float32", name="g"))
    return b.build(), asyncrt.Module({"gated": gated}), barrier, seen


@pytest.mark.anyio
async def test_concurrent_runs_share_the_cores() -> None:
    graph, lib, _, seen = _gated_graph()
    cores = _threads.available_cores()
    async with graph_executor.create(graph, lib, "cpu", max_contexts=2) as ex:
        lease = ex.core.thread_lease
        assert lease is not None and lease.shared
        assert _threads.limits.threads == cores
        async with anyio.create_task_group() as tg:
            for value in (1.0, 2.0):
                tg.start_soon(lambda v=value: ex.run(x=np.full(4, v, np.float32)))
        assert seen == [max(1, cores // 2)] * 2
        assert _threads.limits.wanted() == cores  # both runs ended


@pytest.mark.anyio
async def test_throughput_and_counts_do_not_share() -> None:
    graph, lib, _, seen = _gated_graph()
    async with graph_executor.create(
        graph, lib, "cpu", max_contexts=2, kernel_threads=3
    ) as ex:
        lease = ex.core.thread_lease
        assert lease is not None and not lease.shared
        async with anyio.create_task_group() as tg:
            for value in (1.0, 2.0):
                tg.start_soon(lambda v=value: ex.run(x=np.full(4, v, np.float32)))
        assert seen == [3, 3]


def test_compiled_kernels_split_only_where_no_native_pool_spins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    native = bool(threadpoolctl.threadpool_info())
    limits = _threads.ThreadLimits(cores=4)
    for threads, split in ((2, 1 if native else 2), (3, 3), (4, 4)):
        lease = limits.acquire(threads, blas=True)
        try:
            assert limits.threads == threads
            # two parts beside a spinning BLAS helper: no faster than one
            assert limits.compiled_threads == split
            # another executor's claim without BLAS changes nothing
            other = limits.acquire(threads)
            assert limits.compiled_threads == split
            other.release()
        finally:
            lease.release()
        assert limits.compiled_threads == 1
    # without BLAS kernels, no helper spins: the parts split
    lease = limits.acquire(2)
    try:
        assert limits.compiled_threads == 2
        with_blas = limits.acquire(2, blas=True)
        assert limits.compiled_threads == (1 if native else 2)
        with_blas.release()
        assert limits.compiled_threads == 2
    finally:
        lease.release()

    class NoLibraries:
        lib_controllers: tuple[object, ...] = ()

    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", NoLibraries)
    bare = _threads.ThreadLimits(cores=4)
    lease = bare.acquire(4)
    try:
        assert (bare.threads, bare.compiled_threads) == (4, 4)
        monkeypatch.setattr(_threads, "limits", bare)
        assert _threads.shares(8, 100) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    finally:
        lease.release()


def test_an_executor_knows_whether_its_host_kernels_call_blas() -> None:
    from asyncrt.frontend import from_onnx
    from asyncrt.ops._library import calls_blas

    from .frontend.models import encoder_block
    from .test_fusion import CHAIN_PARAMS, chain_graph

    assert calls_blas("matmul") and not calls_blas("add")
    assert calls_blas("conv.0123abcd") and not calls_blas("max_pool.0123abcd")
    graph, params = from_onnx(encoder_block())
    with graph_executor.create(graph, None, "cpu", params=params) as ex:
        assert ex.core.compiled.host_blas
    with graph_executor.create(chain_graph(), None, "cpu", params=CHAIN_PARAMS) as ex:
        assert not ex.core.compiled.host_blas
    with graph_executor.create(graph, None, "sim", params=params) as ex:
        assert not ex.core.compiled.host_blas  # (off the host's cores)


class Neighbours:
    """Other processes' busy cores, as the test sets them."""

    def __init__(self) -> None:
        self.cores = 0.0

    def update(self) -> float:
        return self.cores


def test_shared_pools_leave_the_cores_other_processes_keep_busy() -> None:
    """Two BLAS threads on cores other processes keep busy wait for each
    other (MobileNetV3 beside two CPU-bound processes: 252 ms a run against
    3.3 with one thread): shared pools take only the free cores, at least
    one; a claim that asked for a number keeps it."""
    clock, neighbours = Clock(), Neighbours()
    probe = cast(BusyNeighbours, neighbours)
    limits = _threads.ThreadLimits(cores=2, clock=clock, neighbours=probe)
    lease = limits.acquire(2, streams=1, shared=True)
    try:
        with lease.running():
            assert limits.threads == 2
            assert limits.gemm_parts == 1  # BLAS's own threads split GEMMs
        neighbours.cores = 1.4  # one core left, nearly: one thread
        with lease.running():
            assert limits.threads == 1
            assert limits.gemm_parts == 2  # large GEMMs over the part pool
            with lease.running():  # two runs share the cores: no split
                assert limits.gemm_parts == 1
        neighbours.cores = 2.5  # none left: still one
        with lease.running():
            assert limits.threads == 1
        neighbours.cores = 0.1
        with lease.running():
            assert limits.threads == 1  # not at once: the pools grow back later
        clock.later()
        with lease.running():
            assert limits.threads == 2
    finally:
        lease.release()
    fixed = limits.acquire(2, streams=1)
    try:
        neighbours.cores = 2.0
        with fixed.running():
            assert limits.threads == 2
    finally:
        fixed.release()


def test_busy_neighbours_are_the_machines_cpu_time_less_this_process() -> None:
    values = {"machine": 100.0, "own": 10.0, "now": 0.0}
    probe = BusyNeighbours(
        machine=lambda: values["machine"],
        own=lambda: values["own"],
        clock=lambda: values["now"],
    )
    assert probe.update() == 0.0  # a window opens
    values.update(machine=101.5, own=10.5, now=WINDOW_SECONDS / 2)
    assert probe.update() == 0.0  # too soon: no estimate yet
    values.update(machine=102.0, own=10.6, now=1.0)
    assert probe.update() == pytest.approx((2.0 - 0.6) / 1.0)
    values.update(machine=102.2, own=10.9, now=2.0)  # this process was busier
    assert probe.update() == 0.0  # (never below zero)
    unknown = BusyNeighbours(machine=lambda: None, clock=lambda: values["now"])
    values["now"] = 10.0
    assert unknown.update() == 0.0 and unknown.update() == 0.0
    busy = machine_busy_seconds()
    if busy is not None:  # Linux: the cores' busy seconds since boot
        assert busy > 0


def test_busy_time_counts_only_the_cores_this_process_may_use(tmp_path: Any) -> None:
    """A container's cpuset or ``taskset``: the other cores' load takes
    nothing from this process."""
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 100 500 50 0 0 0 0 0\n"
        "cpu0 800 0 50 100 10 0 0 0 0 0\n"  # busy 850 ticks (idle, iowait out)
        "cpu1 100 0 50 400 40 0 0 10 0 0\n"  # busy 160 (steal counts)
        "intr 12345 0 0\n"
    )
    tick = os.sysconf("SC_CLK_TCK")
    assert machine_busy_seconds(str(stat), {1}) == pytest.approx(160 / tick)
    assert machine_busy_seconds(str(stat), {0, 1}) == pytest.approx(1010 / tick)
    assert machine_busy_seconds(str(stat), {7}) is None  # no such core listed
    assert machine_busy_seconds(str(tmp_path / "missing"), {0}) is None
