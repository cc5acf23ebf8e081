"""The ``cpu`` backend: numpy memory; each stream is a worker thread.

Its speed, for the scheduler's cost model, is measured on this host once
per setting and reported as attributes:

* ``flops``: float32 matmul throughput with the BLAS pool at its *current*
  size (an executor created with ``kernel_threads=1`` plans with the speed
  of one core when the pool is already at one thread, and with both cores'
  when it is at two), measured once per pool size;
* ``memory_bandwidth``: bytes per second elementwise numpy calls read and
  write (inputs plus outputs): elementwise kernels are bound by it, not by
  their one operation per element;
* ``launch_overhead``: the fixed cost of one small numpy call with ``out=``,
  what every kernel pays before its work;
* ``sync_latency``: how long a stream's thread, blocked on an event of
  another stream, takes to run again once the event is reached (a thread
  wake-up: what a cpu stream pays for each wait on another device).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
import threadpoolctl

from ._api import Buffer, DeviceAPI
from ._device import Device, DLDeviceType
from ._registry import register
from ._stream import BatchError, Call, Stream

__all__ = ("CPUDeviceAPI", "CPUStream")

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

    def _attributes(self, device: Device) -> dict[str, Any]:
        return {
            "device_name": _cpu_name(),
            "max_threads_per_block": os.cpu_count() or 1,
            "total_global_memory": _meminfo("MemTotal"),
            "available_global_memory": _meminfo("MemAvailable"),
            "api_version": f"numpy {np.__version__}",
            "flops": _measured_flops(),
            "memory_bandwidth": _measured_bandwidth(),
            "launch_overhead": _measured_overhead(),
            "sync_latency": _measured_wake(),
            "host_bandwidth": float("inf"),
            "host_latency": 0.0,
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
    """Float32 matmul throughput at the BLAS pool's current size."""
    return _flops_at(_blas_threads())


def _blas_threads() -> int:
    """Threads of the BLAS pool numpy uses now (0 if none is found)."""
    info = threadpoolctl.threadpool_info()
    return max(
        (int(p["num_threads"]) for p in info if p["user_api"] == "blas"), default=0
    )


@cache
def _flops_at(threads: int) -> float:
    """Float32 matmul throughput, measured once per pool size (~15-50 ms).

    Inference multiplies a batch of rows by weights that are not in cache:
    a batch of 64 rows through two different 1024x1024 weights and one of
    128 rows through two 512x512 ones (a hot square 256x256 product
    overstates that by a quarter to a half here). The best of three rounds:
    one timing is at the mercy of whatever else this host runs then.
    """
    rng = np.random.default_rng(0)
    shapes = ((64, 1024), (64, 1024), (128, 512), (128, 512))
    pairs = [
        (np.ones((m, k), dtype=np.float32), rng.random((k, k), dtype=np.float32))
        for m, k in shapes
    ]
    work = sum(2 * x.shape[0] * w.shape[0] * w.shape[1] for x, w in pairs)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        for x, w in pairs:
            x @ w
        best = min(best, time.perf_counter() - start)
    return float(work) / max(best, 1e-9)


@cache
def _measured_bandwidth() -> float:
    """Bytes per second that memory-bound elementwise numpy calls read and
    write, on 4 MiB float32 arrays: ``add``, ``multiply`` and ``maximum``
    with a scalar (from about 70 GB/s for ``add`` to 15 for ``maximum``
    here), their total bytes over their total time, best of five rounds
    (~5 ms). Transcendental functions are not among them: they are bound
    by their arithmetic, which their ``flops`` declare (timing ``tanh``
    here, as this once did, made every add look 5x slower than it runs)."""
    a = np.ones(1 << 20, dtype=np.float32)
    b = np.ones_like(a)
    c = np.empty_like(a)
    calls: tuple[tuple[Callable[[], object], int], ...] = (
        (lambda: np.add(a, b, out=c), 3),
        (lambda: np.multiply(a, b, out=c), 3),
        (lambda: np.maximum(a, 0, out=c), 2),
    )
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for call, _ in calls:
            call()
        best = min(best, time.perf_counter() - start)
    return sum(arrays for _, arrays in calls) * a.nbytes / max(best, 1e-9)


@cache
def _measured_overhead() -> float:
    """Seconds of one numpy call with ``out=`` on a tiny array (~1 ms)."""
    a = np.ones(16, dtype=np.float32)
    c = np.empty_like(a)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(100):
            np.add(a, a, out=c)
        best = min(best, time.perf_counter() - start)
    return best / 100


@cache
def _measured_wake() -> float:
    """Seconds from a :class:`~devices.Completion` being set to a thread
    blocked on it running again: the median of 15 wake-ups of a stream
    worker, each after a nap long enough for it to block (~15 ms). The
    median, not the best: every cross-device wait pays it, good luck or
    not."""
    rounds = 15
    events = [threading.Event() for _ in range(rounds)]
    set_at = [0.0] * rounds
    woke_at = [0.0] * rounds

    def waiter() -> None:
        for i, event in enumerate(events):
            event.wait()
            woke_at[i] = time.perf_counter()

    thread = threading.Thread(target=waiter, name="asyncrt-wake-probe", daemon=True)
    thread.start()
    for i, event in enumerate(events):
        time.sleep(1e-3)  # the waiter blocks meanwhile
        set_at[i] = time.perf_counter()
        event.set()
    thread.join()
    return statistics.median(w - s for w, s in zip(woke_at, set_at, strict=True))


register("cpu", CPUDeviceAPI)
