"""The ``cuda`` backend: NVIDIA GPUs through CuPy.

Memory comes from CuPy's memory pool; each asyncrt stream owns a CuPy
non-blocking stream and a host worker thread that issues work onto it in
order (so launching never blocks the caller, as on every backend). Kernels
receive cupy arrays and run asynchronously on that stream.

Events are CUDA events. A record also enqueues a host callback
(``cudaLaunchHostFunc``) after the event, which completes the host-side
:class:`~devices._event.Completion`: that is how completion reaches the event
loop — no polling. A cuda stream waiting on an event of another cuda stream
on the same device waits device-side (``cudaStreamWaitEvent``); waiting on
any other backend's event holds the issuing thread instead.

This module is the only place asyncrt imports cupy; importing it without
cupy raises ImportError, which the registry reports as "not available".
"""

from __future__ import annotations

import ctypes
import threading
from functools import cache
from typing import Any

import cupy
import numpy as np

from ._api import Buffer, DeviceAPI
from ._callback_thread import Graveyard
from ._device import Device, DLDeviceType
from ._dtype import dtype_string
from ._event import Completion, Event
from ._ndarray import NDArray
from ._registry import register
from ._stream import Stream
from ._timing import CallTimer
from .errors import OutOfMemoryError

__all__ = ("CUDADeviceAPI", "CUDAEventTimer", "CUDAStream")

# Which asyncrt cuda stream, if any, runs on this thread: a copy issued from
# a stream's worker is asynchronous on that stream; one issued from anywhere
# else (a blocking copy) is synchronous. Private; never an ambient default.
_worker_state = threading.local()

# CUDA events (and streams) whose owner died on the host-callback thread,
# where destroying them is not permitted (cyclic garbage may be collected
# there: any allocation can run the collector); stream threads destroy them.
_retired_events = Graveyard()


class CUDACompletion(Completion):
    """A completion backed by a CUDA event, for device-side waits."""

    __slots__ = ("cuda_event", "device", "issue_error", "issued")

    def __init__(self, device: Device) -> None:
        super().__init__()
        self.device = device
        self.issued = threading.Event()
        self.cuda_event: Any = None
        self.issue_error: BaseException | None = None

    def __del__(self) -> None:
        if self.cuda_event is not None and _retired_events.on_callback_thread:
            _retired_events.keep(self.cuda_event)


class CUDAStream(Stream):
    """A cuda stream: a CuPy stream fed by a host issuing thread."""

    def __init__(self, device: Device) -> None:
        with cupy.cuda.Device(device.index):
            self.cupy_stream = cupy.cuda.Stream(non_blocking=True)
        super().__init__(device)

    def __del__(self) -> None:
        # Collected on the callback thread (in a cycle: the collector runs
        # wherever an allocation triggers it), the cupy stream would be
        # destroyed there: cudaErrorNotPermitted. Keep it for a stream thread.
        if _retired_events.on_callback_thread:
            _retired_events.keep(self.cupy_stream)

    def _on_thread_start(self) -> None:
        cupy.cuda.Device(self.device.index).use()
        self.cupy_stream.use()
        _worker_state.stream = self.cupy_stream

    def _new_completion(self) -> Completion:
        return CUDACompletion(self.device)

    def _complete(self, completion: Completion, error: BaseException | None) -> None:
        if not isinstance(completion, CUDACompletion):
            completion.set(error)
            return
        _retired_events.drain()
        completion.issue_error = error
        completion.cuda_event = self.cupy_stream.record()
        completion.issued.set()
        # The host learns of completion from the device itself.
        self.cupy_stream.launch_host_func(_set_completion, (completion, error))

    def _wait(self, completion: Completion, event: Event) -> None:
        if isinstance(completion, CUDACompletion) and completion.device == self.device:
            completion.issued.wait()
            if completion.issue_error is not None:
                self._fail_from(completion.issue_error, event)
                return
            self.cupy_stream.wait_event(completion.cuda_event)
            return
        super()._wait(completion, event)

    def close(self) -> None:
        super().close()
        self.cupy_stream.synchronize()
        _retired_events.drain()


def _set_completion(arg: tuple[Completion, BaseException | None]) -> None:
    _retired_events.mark_callback_thread()
    completion, error = arg
    completion.set(error)
    # CuPy drops its reference to ``arg`` on this thread when we return; if it
    # were the last, the completion and its CUDA event would die here.
    _retired_events.keep(arg)


class CUDAEventTimer(CallTimer):
    """Times a call by CUDA events recorded around it on the stream that
    the worker thread has made current: the device's own clock."""

    marks = True

    def mark(self) -> Any:
        event = cupy.cuda.Event()
        event.record()
        return event

    def elapsed(self, before: Any, after: Any) -> float:
        after.synchronize()
        return float(cupy.cuda.get_elapsed_time(before, after)) / 1e3


class CUDADeviceAPI(DeviceAPI):
    """NVIDIA GPUs, through CuPy."""

    kind = "cuda"
    dlpack_device_type = DLDeviceType.CUDA
    array_namespace = "cupy"

    def device_count(self) -> int:
        return _device_count()

    def _attributes(self, device: Device) -> dict[str, Any]:
        props = cupy.cuda.runtime.getDeviceProperties(device.index)
        with cupy.cuda.Device(device.index):
            free, total = cupy.cuda.runtime.memGetInfo()
        name = props["name"]
        sms = int(props["multiProcessorCount"])
        clock_hz = float(props["clockRate"]) * 1e3
        return {
            "device_name": name.decode() if isinstance(name, bytes) else str(name),
            "max_threads_per_block": int(props["maxThreadsPerBlock"]),
            "warp_size": int(props["warpSize"]),
            "compute_version": f"{props['major']}.{props['minor']}",
            "multi_processor_count": sms,
            "max_clock_rate": int(props["clockRate"]),
            "total_global_memory": int(total),
            "available_global_memory": int(free),
            "api_version": cupy.cuda.runtime.runtimeGetVersion(),
            "driver_version": cupy.cuda.runtime.driverGetVersion(),
            # 128 float32 FMA lanes per SM is the Volta-to-Hopper figure.
            "flops": 2.0 * 128 * sms * clock_hz,
            "host_bandwidth": 20e9,
            "host_latency": 10e-6,
        }

    def _call_timer(self, device: Device) -> CallTimer:
        return CUDAEventTimer()

    def _free_bytes(self, device: Device) -> int | None:
        with cupy.cuda.Device(device.index):
            free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free)

    def _alloc(self, device: Device, nbytes: int) -> Any:
        try:
            with cupy.cuda.Device(device.index):
                return cupy.empty(nbytes, dtype=cupy.uint8)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise OutOfMemoryError(
                str(device), nbytes, self._free_bytes(device)
            ) from exc

    def _create_stream(self, device: Device) -> Stream:
        return CUDAStream(device)

    def _copy_within(
        self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int
    ) -> None:
        if nbytes == 0:
            return
        stream = _issuing_stream()
        dst_ptr = dst.raw[dst_offset : dst_offset + nbytes].data
        src_ptr = src.raw[src_offset : src_offset + nbytes].data
        with cupy.cuda.Device(dst.device.index):
            # Peer copies between two GPUs go device to device.
            dst_ptr.copy_from_device_async(src_ptr, nbytes, stream)
        _finish(stream)

    def _copy_to_host(
        self, src: Buffer, src_offset: int, dst: np.ndarray[Any, Any]
    ) -> None:
        if dst.nbytes == 0:
            return
        stream = _issuing_stream()
        with cupy.cuda.Device(src.device.index):
            src.raw[src_offset : src_offset + dst.nbytes].data.copy_to_host_async(
                ctypes.c_void_p(dst.ctypes.data), dst.nbytes, stream
            )
            # The host bytes must be there when this returns (staged copies
            # read them at once), so this one always waits.
            stream.synchronize()

    def _copy_from_host(
        self, src: np.ndarray[Any, Any], dst: Buffer, dst_offset: int
    ) -> None:
        if src.nbytes == 0:
            return
        stream = _issuing_stream()
        with cupy.cuda.Device(dst.device.index):
            # From pageable memory this returns once the source was staged,
            # so the host array may be reused at once.
            dst.raw[dst_offset : dst_offset + src.nbytes].data.copy_from_host_async(
                ctypes.c_void_p(src.ctypes.data), src.nbytes, stream
            )
        _finish(stream)

    def from_dlpack(self, tensor: Any, device_id: int) -> NDArray:
        """Wrap a CUDA DLPack tensor (zero-copy when C-contiguous)."""
        with cupy.cuda.Device(device_id):
            array = cupy.ascontiguousarray(cupy.from_dlpack(tensor))
        raw = array.reshape(-1).view(cupy.uint8)
        buffer = Buffer(self, Device("cuda", device_id), raw.nbytes, raw)
        return NDArray(buffer, array.shape, dtype_string(array.dtype))


def _issuing_stream() -> Any:
    stream = getattr(_worker_state, "stream", None)
    return stream if stream is not None else cupy.cuda.Stream.null


def _finish(stream: Any) -> None:
    """Blocking copies (outside a stream's worker) complete before returning."""
    if getattr(_worker_state, "stream", None) is None:
        stream.synchronize()


@cache
def _device_count() -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError:
        return 0


register("cuda", CUDADeviceAPI)
