"""Kernel thread pools, coordinated with the cpu streams.

A cpu stream is one worker thread that runs kernels one after another. Some
kernels are multithreaded themselves: BLAS (numpy's ``matmul`` on OpenBLAS
or MKL), OpenMP runtimes, numexpr, and asyncrt's fused kernels (which split a
large tensor into blocks). ``S`` streams each running ``T``-threaded kernels
put ``S * T`` busy threads on the machine; past its ``C`` cores they only
take turns, and spinning BLAS threads make that much worse.

**Policy.** While an executor with ``S >= 1`` cpu compute streams is open,
every such pool gets ``T = max(1, C // S)`` threads, ``C`` being the cores
this process may run on (``os.sched_getaffinity``). With several executors
open, the smallest ``T`` asked for wins (the most parallel configuration
decides), so none of them oversubscribes. Limits are applied when an
executor is created and restored when the last one is closed: never per
kernel call. BLAS and OpenMP pools are set through threadpoolctl, numexpr's
through ``numexpr.set_num_threads`` (if it is installed); fused kernels read
:attr:`ThreadLimits.threads` when they split their work.

**Services.** ``"auto"`` favours one run's latency: it assumes one run at a
time. An executor that serves ``R`` concurrent runs (``max_contexts=R``)
puts up to ``S * R`` streams on the cores at once, each running its own
kernels; ``kernel_threads="throughput"`` sizes the pools for that:
``T = max(1, C // (S * R))`` (as ONNX Runtime servers set
``intra_op_num_threads=1`` and run sessions side by side). On two cores and
W3 (the MLP), 2 contexts with ``"auto"`` put 4 BLAS threads on 2 cores and
serve fewer requests per second than one context does; with
``"throughput"`` they serve more.

**Override.** ``graph_executor.create(..., kernel_threads=N)`` asks for ``N``
threads instead of the policy's; ``kernel_threads="keep"`` leaves every pool
as it is (for programs that manage threadpoolctl themselves, or that set
``OPENBLAS_NUM_THREADS`` lower than the policy would: ``"auto"`` sets the
pools to its number, up or down).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import threadpoolctl

from devices import get_api
from scheduler.plan import Copy, Launch, Plan

__all__ = (
    "ThreadLease",
    "ThreadLimits",
    "available_cores",
    "cpu_streams",
    "lease_for",
    "limits",
    "policy_threads",
    "run_parts",
)


def available_cores() -> int:
    """How many cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def cpu_streams(plan: Plan) -> int:
    """The streams of ``plan`` whose kernels run on the host's cores (a host
    device's streams) and that run kernels (copies do not count)."""
    return sum(
        get_api(stream.device.kind).is_host
        and any(
            isinstance(step, Launch) and not isinstance(step, Copy)
            for step in stream.steps
        )
        for stream in plan.streams
    )


def policy_threads(streams: int, cores: int | None = None) -> int:
    """Threads per kernel pool for ``streams`` cpu streams: ``max(1, C // S)``.

    :param streams: cpu compute streams that run kernels at once (>= 1).
    :param cores: the cores to share; default :func:`available_cores`.
    :return: the threads each pool gets.
    :raises ValueError: if ``streams`` < 1.
    """
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    return max(1, (cores or available_cores()) // streams)


class ThreadLease:
    """One executor's claim on the kernel thread pools; see
    :meth:`ThreadLimits.acquire`.

    :ivar threads: the threads this lease asked for.
    """

    def __init__(self, owner: ThreadLimits, key: int, threads: int) -> None:
        self._owner = owner
        self._key = key
        self.threads = threads

    def release(self) -> None:
        """Give the claim back (idempotent); the limits are recomputed."""
        self._owner._release(self._key)


class ThreadLimits:
    """The process-wide thread limits of the kernel pools (see the module
    docstring); use the shared instance :data:`limits`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, int] = {}
        self._next = 0
        self._restore: list[Callable[[], object]] = []
        self._applied: int | None = None
        #: Threads a fused kernel may split its work over (1 when no lease).
        self.threads = 1

    def acquire(self, threads: int) -> ThreadLease:
        """Claim ``threads`` threads per pool until the lease is released.

        :param threads: the threads asked for (>= 1).
        :return: the lease.
        :raises ValueError: if ``threads`` < 1.
        """
        if threads < 1:
            raise ValueError(f"kernel threads must be >= 1, got {threads}")
        with self._lock:
            key = self._next
            self._next += 1
            self._leases[key] = threads
            self._apply()
        return ThreadLease(self, key, threads)

    def _release(self, key: int) -> None:
        with self._lock:
            if self._leases.pop(key, None) is not None:
                self._apply()

    def _apply(self) -> None:
        wanted = min(self._leases.values()) if self._leases else None
        if wanted == self._applied:
            return
        if wanted is None:
            for restore in reversed(self._restore):
                restore()
            self._restore.clear()
            self.threads = 1
        else:
            limiter = threadpoolctl.threadpool_limits(limits=wanted)
            numexpr_before = _set_numexpr_threads(wanted)
            if not self._restore:  # the first limits keep the originals
                self._restore.append(limiter.restore_original_limits)
                if numexpr_before is not None:
                    self._restore.append(
                        functools.partial(_set_numexpr_threads, numexpr_before)
                    )
            self.threads = wanted
        self._applied = wanted


def _set_numexpr_threads(threads: int) -> int | None:
    """Set numexpr's pool (if numexpr is installed).

    :return: its old size, or ``None`` without numexpr.
    """
    if importlib.util.find_spec("numexpr") is None:
        return None
    import numexpr

    return int(numexpr.set_num_threads(threads))


#: The process-wide limits.
limits = ThreadLimits()

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def run_parts(parts: Sequence[Callable[[], Any]]) -> None:
    """Run ``parts`` at once: the first on this thread, the rest on a shared
    pool (the fused kernels' block workers), and wait for all of them.

    :raises Exception: the first exception a part raised.
    """
    if len(parts) == 1:
        parts[0]()
        return
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=available_cores(), thread_name_prefix="kernel-blocks"
            )
        pool = _pool
    futures: list[Future[Any]] = [pool.submit(part) for part in parts[1:]]
    try:
        parts[0]()
    finally:
        for future in futures:
            future.exception()  # wait for every part, even after a failure
    for future in futures:
        future.result()


def threads_for(
    cpu_streams: int, kernel_threads: int | str, concurrent_runs: int
) -> int | str:
    """The threads per kernel pool for an executor's configuration (see
    :func:`lease_for`), or ``"keep"`` for none to set. A process-backed
    executor's workers each get this number.

    :raises ValueError: for any other ``kernel_threads``.
    """
    if kernel_threads == "keep" or (
        kernel_threads in ("auto", "throughput") and cpu_streams < 1
    ):
        return "keep"
    if kernel_threads in ("auto", "throughput"):
        runs = max(1, concurrent_runs) if kernel_threads == "throughput" else 1
        return policy_threads(cpu_streams * runs)
    if isinstance(kernel_threads, int) and not isinstance(kernel_threads, bool):
        return kernel_threads
    raise ValueError(
        'kernel_threads must be "auto", "throughput", "keep" or an int >= 1, '
        f"got {kernel_threads!r}"
    )


def lease_for(
    cpu_streams: int, kernel_threads: int | str, concurrent_runs: int = 1
) -> ThreadLease | None:
    """The lease an executor takes for its configuration.

    :param cpu_streams: the cpu compute streams of its plan.
    :param kernel_threads: ``"auto"`` (the latency policy:
        ``max(1, C // S)``) or ``"throughput"`` (``max(1, C // (S * R))``),
        neither of which takes a lease without cpu streams; ``"keep"`` (no
        lease: pools untouched); or a number of threads.
    :param concurrent_runs: ``R``, the runs that may be in flight at once.
    :return: the lease, or ``None``.
    :raises ValueError: for any other ``kernel_threads``.
    """
    threads = threads_for(cpu_streams, kernel_threads, concurrent_runs)
    return limits.acquire(threads) if isinstance(threads, int) else None
