"""The ``cpu`` backend: numpy memory; each stream is a worker thread.

The cpu is the host itself (:attr:`~devices.DeviceAPI.is_host`): its memory
is the process's, and its streams are host threads on separate cores, so
they compute side by side (:attr:`~devices.DeviceAPI.concurrent_streams`).

Its speed, for the scheduler's cost model, is measured on this machine and
reported as attributes:

* ``flops``: float32 matmul throughput with the BLAS pool at its *current*
  size (an executor created with ``kernel_threads=1`` plans with the speed
  of one core when the pool is already at one thread, and with both cores'
  when it is at two): one core's throughput, times the pool's threads;
* ``memory_bandwidth``: bytes per second elementwise numpy calls read and
  write (inputs plus outputs): elementwise kernels are bound by it, not by
  their one operation per element;
* ``launch_overhead``: the fixed cost of one small numpy call with ``out=``,
  what every kernel pays before its work;
* ``sync_latency``: how long a stream's thread, blocked on an event of
  another stream, takes to run again once the event is reached (a thread
  wake-up: what a cpu stream pays for each wait on another device, and a
  run on streams before its first work);
* ``issue_overhead``: what the host spends issuing one step of a run onto
  a stream (a batch of calls, a record or a wait): a run on streams pays it
  for each of its steps before its first work;
* ``speed_source``: where these figures come from.

Each figure is measured robustly (the median of several groups' best
rounds, :func:`devices._figures.robust`), once per machine, and kept in the
user's cache directory (:mod:`devices._figures`), so that every process
plans from the same figures; :func:`remeasure` (or ``ASYNCRT_REMEASURE=1``)
measures them afresh. Costs the host pays on its own thread (compute,
elementwise traffic, a call, issuing a step) are timed in that thread's
CPU time, not by the wall clock: a neighbour that takes the core away
mid-round then changes nothing. On this project's shared two-core machine,
matmul rounds on the wall clock read 2 to 160 GFLOP/s under load, where one
core's CPU time read 77 to 82 GFLOP/s. (A pool of two BLAS threads stalls
whenever either core is taken, which is why the matmul probe runs on one
thread, and the pool's figure is that core's times its threads.) Only the
wake-up is a wall-clock matter, and is timed so.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
import threadpoolctl

from ._api import Buffer, DeviceAPI
from ._device import Device, DLDeviceType
from ._figures import FigureCache, robust
from ._registry import register
from ._stream import BatchError, Call, Stream

__all__ = ("CPUDeviceAPI", "CPUStream", "figures_source", "remeasure")

_ALIGNMENT = 64


class CPUStream(Stream):
    """A cpu stream: calls run directly on its worker thread."""

    def _execute_many(self, calls: Sequence[Call]) -> None:
        index = 0
        try:
            for fn, args, _ in calls:
                fn(*args)
                index += 1
        except Exception as exc:
            raise BatchError(index, calls) from exc


class CPUDeviceAPI(DeviceAPI):
    """Host memory and host threads."""

    kind = "cpu"
    dlpack_device_type = DLDeviceType.CPU
    is_host = True
    concurrent_streams = True

    def _attributes(self, device: Device) -> dict[str, Any]:
        figures = _figures()
        return {
            "device_name": _cpu_name(),
            "max_threads_per_block": os.cpu_count() or 1,
            "total_global_memory": _meminfo("MemTotal"),
            "available_global_memory": _meminfo("MemAvailable"),
            "api_version": f"numpy {np.__version__}",
            "flops": _measured_flops(),
            "memory_bandwidth": figures.get("memory_bandwidth", _bandwidth),
            "launch_overhead": figures.get("launch_overhead", _overhead),
            "sync_latency": figures.get("sync_latency", _wake),
            "issue_overhead": figures.get("issue_overhead", _issue),
            "host_bandwidth": float("inf"),
            "host_latency": 0.0,
            "speed_source": figures.source,
        }

    def _free_bytes(self, device: Device) -> int | None:
        return _meminfo("MemAvailable")

    def _alloc(self, device: Device, nbytes: int) -> Any:
        # Over-allocate and slice so every buffer starts on a 64-byte line.
        block = np.empty(nbytes + _ALIGNMENT, dtype=np.uint8)
        start = -block.ctypes.data % _ALIGNMENT
        return block[start : start + nbytes]

    def _create_stream(self, device: Device) -> Stream:
        return CPUStream(device)

    def _copy_within(
        self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int
    ) -> None:
        dst.raw[dst_offset : dst_offset + nbytes] = src.raw[
            src_offset : src_offset + nbytes
        ]

    def _copy_to_host(
        self, src: Buffer, src_offset: int, dst: np.ndarray[Any, Any]
    ) -> None:
        dst[...] = src.raw[src_offset : src_offset + dst.nbytes]

    def _copy_from_host(
        self, src: np.ndarray[Any, Any], dst: Buffer, dst_offset: int
    ) -> None:
        dst.raw[dst_offset : dst_offset + src.nbytes] = src


def remeasure() -> None:
    """Measure the cpu's figures afresh when they are next read, and keep
    the new ones in this machine's cache file (the old ones are replaced)."""
    _figures().refresh()


def figures_source() -> str:
    """Where the cpu figures read so far come from: the cache file and when
    they were measured ("" before any is read)."""
    return _figures().source


@cache
def _figures() -> FigureCache:
    """The cpu's figures on this machine: keyed by what they depend on."""
    blas = sorted(
        f"{p.get('internal_api')} {p.get('version')} {p.get('architecture')}"
        for p in threadpoolctl.threadpool_info()
        if p.get("user_api") == "blas"
    )
    return FigureCache(
        "cpu",
        {
            "host": platform.node(),
            "processor": _cpu_name(),
            "cores": str(os.cpu_count()),
            "machine": platform.machine(),
            "numpy": np.__version__,
            "blas": "; ".join(blas),
        },
    )


@cache
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if field == "MemTotal" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def _measured_flops() -> float:
    """Float32 matmul throughput at the BLAS pool's current size: one
    core's, times the pool's threads."""
    return _figures().get("flops_per_core", _matmul_flops) * max(1, _blas_threads())


def _blas_threads() -> int:
    """Threads of the BLAS pool numpy uses now (0 if none is found)."""
    info = threadpoolctl.threadpool_info()
    return max(
        (int(p["num_threads"]) for p in info if p["user_api"] == "blas"), default=0
    )


def _cpu_seconds(action: Callable[[], object]) -> float:
    """Seconds of this thread's CPU time that ``action`` takes."""
    start = time.thread_time()
    action()
    return max(time.thread_time() - start, 1e-9)


def _matmul_flops() -> float:
    """One core's float32 matmul throughput: the BLAS pool held at one
    thread, timed in CPU time, measured robustly (21 rounds of ~5 ms, ~0.1 s
    in all).

    Inference multiplies a batch of rows by weights that are not in cache:
    a batch of 64 rows through two different 1024x1024 weights and one of
    128 rows through two 512x512 ones (a hot square 256x256 product
    overstates that by a quarter to a half here).
    """
    rng = np.random.default_rng(0)
    shapes = ((64, 1024), (64, 1024), (128, 512), (128, 512))
    pairs = [
        (np.ones((m, k), dtype=np.float32), rng.random((k, k), dtype=np.float32))
        for m, k in shapes
    ]
    work = sum(2 * x.shape[0] * w.shape[0] * w.shape[1] for x, w in pairs)

    def products() -> None:
        for x, w in pairs:
            x @ w

    def one_round() -> float:
        return float(work) / _cpu_seconds(products)

    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        return robust(one_round, higher_is_better=True)


def _bandwidth() -> float:
    """Bytes per second that memory-bound elementwise numpy calls read and
    write, on 4 MiB float32 arrays: ``add``, ``multiply`` and ``maximum``
    with a scalar (from about 70 GB/s for ``add`` to 15 for ``maximum``
    here), their total bytes over their total time, measured robustly
    (~15 ms). Transcendental
    functions are not among them: they are bound by their arithmetic, which
    their ``flops`` declare (timing ``tanh`` here, as this once did, made
    every add look 5x slower than it runs)."""
    a = np.ones(1 << 20, dtype=np.float32)
    b = np.ones_like(a)
    c = np.empty_like(a)
    calls: tuple[tuple[Callable[[], object], int], ...] = (
        (lambda: np.add(a, b, out=c), 3),
        (lambda: np.multiply(a, b, out=c), 3),
        (lambda: np.maximum(a, 0, out=c), 2),
    )
    moved = sum(arrays for _, arrays in calls) * a.nbytes

    def all_calls() -> None:
        for call, _ in calls:
            call()

    def one_round() -> float:
        return moved / _cpu_seconds(all_calls)

    return robust(one_round, higher_is_better=True)


def _overhead() -> float:
    """Seconds of one numpy call with ``out=`` on a tiny array, measured
    robustly, 100 calls a round (~5 ms)."""
    a = np.ones(16, dtype=np.float32)
    c = np.empty_like(a)

    def hundred() -> None:
        for _ in range(100):
            np.add(a, a, out=c)

    def one_round() -> float:
        return _cpu_seconds(hundred) / 100

    return robust(one_round, higher_is_better=False)


def _wake() -> float:
    """Seconds from a :class:`~devices.Completion` being set to a thread
    blocked on it running again: a stream worker woken after a nap long
    enough for it to block, measured robustly (21 wake-ups, ~25 ms)."""
    ready, woken = threading.Semaphore(0), threading.Semaphore(0)
    event = threading.Event()
    woke_at = [0.0]
    done = False

    def waiter() -> None:
        while True:
            ready.release()
            event.wait()
            woke_at[0] = time.perf_counter()
            event.clear()
            woken.release()
            if done:
                return

    thread = threading.Thread(target=waiter, name="asyncrt-wake-probe", daemon=True)
    thread.start()

    def one_round() -> float:
        ready.acquire()
        time.sleep(1e-3)  # the waiter blocks meanwhile
        set_at = time.perf_counter()
        event.set()
        woken.acquire()
        return woke_at[0] - set_at

    try:
        return robust(one_round, higher_is_better=False)
    finally:
        done = True
        ready.acquire()
        event.set()
        thread.join()


#: Steps each round of :func:`_issue` issues.
_ISSUE_STEPS = 64


def _issue() -> float:
    """Seconds the host spends issuing one step of a run (its CPU time):
    :data:`_ISSUE_STEPS` steps, batches of one empty call and records by
    turns, over two idle streams, as a run issues them, a round each after
    a nap long enough for the streams' threads to block; measured robustly
    (~30 ms)."""
    device = Device("cpu", 0)
    streams = [CPUStream(device) for _ in range(2)]
    calls: list[Call] = [(_nothing, (), 0.0)]

    def issue() -> None:
        for step in range(_ISSUE_STEPS):
            stream = streams[step % 2]
            if step % 4 < 2:
                stream.launch_many(calls)
            else:
                stream.record()

    def one_round() -> float:
        time.sleep(1e-3)  # the streams' threads block meanwhile
        seconds = _cpu_seconds(issue)
        for stream in streams:
            stream.synchronize()
        return seconds / _ISSUE_STEPS

    try:
        return robust(one_round, higher_is_better=False)
    finally:
        for stream in streams:
            stream.close()


def _nothing() -> None:
    pass


register("cpu", CPUDeviceAPI)
