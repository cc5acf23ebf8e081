"""The ``cpu`` backend: numpy memory; each stream is a worker thread."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

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


@cache
def _measured_flops() -> float:
    """Float32 matmul throughput of this host, measured once (~5 ms)."""
    a = np.ones((256, 256), dtype=np.float32)
    a @ a
    start = time.perf_counter()
    for _ in range(4):
        a @ a
    elapsed = max(time.perf_counter() - start, 1e-9)
    return 4 * 2 * 256**3 / elapsed


register("cpu", CPUDeviceAPI)
