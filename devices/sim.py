"""The ``sim`` backend: a simulated accelerator.

It exists so that every heterogeneous code path runs, and is tested, on a
machine without a GPU. Each ``sim:N`` has

* its own address space: a buffer is a :class:`SimAllocation` (an address and
  a size), not a host array; the host reaches its bytes only by copying, and
  kernels see them only while they run on one of the device's streams;
* a memory capacity, enforced (``OutOfMemoryError`` when exceeded);
* its own streams (worker threads);
* a timing model that really takes time: every call on a stream lasts at
  least ``launch_overhead + work / flops`` seconds, where ``work`` is the
  floating-point operations it says it does (0 if it does not say), and a
  copy lasts at least ``latency + nbytes / bandwidth``. A device given a
  finite ``memory_bandwidth`` is a roofline instead: a call lasts
  ``launch_overhead + max(work / flops, nbytes / memory_bandwidth)``,
  ``nbytes`` being the distinct arrays it is passed (its inputs and
  outputs), so elementwise kernels are bound by the bytes they move. Work
  runs on the host, then the stream sleeps away the rest of the modelled
  time, so a simulated device that is "busy" costs no host CPU and several
  of them overlap like separate chips. A device has one compute engine:
  timed calls from its streams take turns on it (as large kernels from
  several CUDA streams share one GPU), while copies, like a GPU's copy
  engines, overlap with them (and copies to the host run on the device's
  own streams: :attr:`~devices.DeviceAPI.outgoing_copies`). The formulas are
  :mod:`devices._timing`'s, the ones the scheduler's cost model plans with,
  so the model is exact by construction, the reference for that cost model;
  a trace reads a sim call's time from its :class:`~devices.CallTimer`.

The device keeps its own clock, as a discrete-event simulation does. A
call's modelled start is the latest of: when it was launched, when its
stream's previous work ended by the model, when the events it waits on were
reached by the model (a device-side wait, as CUDA's, costs nothing), and,
for a timed call, when the compute engine frees up; it ends its duration
after that. A record is stamped with its stream's modelled time, and a sim
stream waiting on it goes on from there. The host's part is only a floor:
the stream's thread does the call's real work when it gets to it, and
completes nothing (no record, so no waiting cpu stream or host) before
both that work is done and the modelled end has passed. So host artefacts
of the simulation (a stream thread that wakes late because another sim's
thread computes on the same core) do not stretch the device's timeline
while the real work catches up within it; when it does not, the host sees
the results late, never early.

Configure the devices before use with :func:`configure`; a configuration
that would strand memory in use (a device removed, or made smaller than
what it holds) is refused. A worker process gets the same devices from
:func:`devices.process_state` and :func:`devices.restore_process_state`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._api import Buffer, DeviceAPI
from ._device import Device
from ._event import Completion, Event
from ._registry import get_api, register
from ._stream import Stream
from ._timing import CallTimer, DeviceSpeed, ModelTimer, transfer_seconds
from .errors import ArgumentError, OutOfMemoryError

__all__ = ("SimAllocation", "SimConfig", "SimDeviceAPI", "configure")


@dataclass(frozen=True)
class SimConfig:
    """The speed and size of one simulated device.

    :ivar flops: compute speed in floating-point operations per second.
    :ivar bandwidth: link bandwidth to the host and to other sim devices,
        bytes per second.
    :ivar latency: fixed cost of each copy, seconds.
    :ivar launch_overhead: fixed cost of each call, seconds.
    :ivar memory: capacity in bytes.
    :ivar memory_bandwidth: bytes per second a call's arrays move at
        (``math.inf``, the default: calls are timed by their work alone).
    """

    flops: float = 50e9
    bandwidth: float = 8e9
    latency: float = 20e-6
    launch_overhead: float = 0.0
    memory: int = 4 << 30
    memory_bandwidth: float = math.inf

    def __post_init__(self) -> None:
        for name in ("flops", "bandwidth", "memory_bandwidth"):
            if not getattr(self, name) > 0:
                raise ArgumentError(
                    f"SimConfig.{name} must be > 0, got {getattr(self, name)}"
                )
        for name in ("latency", "launch_overhead"):
            if not getattr(self, name) >= 0:
                raise ArgumentError(
                    f"SimConfig.{name} must be >= 0, got {getattr(self, name)}"
                )
        if self.memory < 0:
            raise ArgumentError(f"SimConfig.memory must be >= 0, got {self.memory}")

    @functools.cached_property
    def speed(self) -> DeviceSpeed:
        """The device's timing model (:mod:`devices._timing`): its streams
        wait device-side, so it has no ``sync_latency``."""
        return DeviceSpeed(
            flops=self.flops,
            bandwidth=self.bandwidth,
            latency=self.latency,
            launch_overhead=self.launch_overhead,
            memory_bandwidth=self.memory_bandwidth,
            source="sim configuration",
        )

    def compute_seconds(self, work: float, nbytes: int = 0) -> float:
        """Modelled duration of a call doing ``work`` FLOPs over ``nbytes``
        of arrays (:meth:`DeviceSpeed.compute_seconds`)."""
        return self.speed.compute_seconds(work, nbytes)

    def copy_seconds(self, nbytes: int) -> float:
        """Modelled duration of a copy of ``nbytes`` over this device's link
        (:meth:`DeviceSpeed.copy_seconds`)."""
        return self.speed.copy_seconds(nbytes)


_DEFAULT = SimConfig()


class SimAllocation:
    """Memory in a sim device's address space (opaque to the host)."""

    __slots__ = ("_data", "address", "nbytes")

    def __init__(self, address: int, data: np.ndarray[Any, Any]) -> None:
        self.address = address
        self.nbytes = data.nbytes
        self._data = data

    def __repr__(self) -> str:
        return f"<SimAllocation 0x{self.address:x} ({self.nbytes} bytes)>"


class _Engine:
    """A device's compute engine: one timed call at a time, and when (by the
    device's clock) the last one ended.

    Turns go to the waiting call that was ready first by the model (ties in
    arrival order), as a discrete-event simulation orders them, not to
    whichever thread takes a lock first: a plain lock lets the stream that
    just ended a call take the engine again for its next one, ahead of a
    call of another stream that had been ready for the whole of it, and
    the device's timeline then depends on the host's thread scheduling
    (branchy on two sims measured 1.18x its plan on one host, 1.00x on
    another).
    """

    __slots__ = ("_busy", "_changed", "_tickets", "_waiting", "free_at")

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._busy = False
        self._waiting: list[tuple[float, int]] = []  # a heap of (ready, ticket)
        self._tickets = itertools.count()
        self.free_at = 0.0

    @contextlib.contextmanager
    def turn(self, ready: float) -> Iterator[None]:
        """Hold the engine for one call that is ready at ``ready`` (model
        seconds), after every waiting call that was ready earlier."""
        with self._changed:
            mine = (ready, next(self._tickets))
            heapq.heappush(self._waiting, mine)
            while self._busy or self._waiting[0] != mine:
                self._changed.wait()
            heapq.heappop(self._waiting)
            self._busy = True
        try:
            yield
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()


class _Call:
    """The modelled start of the call a sim stream is running, and, once an
    untimed call (a copy) says so, its modelled end."""

    __slots__ = ("end", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.end = start


#: The call in progress on this sim stream's thread (None elsewhere): how a
#: copy run on the stream learns its modelled start.
_current_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "asyncrt_sim_call", default=None
)


class SimStream(Stream):
    """A sim stream: each call lasts its modelled duration on the device's
    clock (see the module docstring), timed calls on the device's one
    compute engine (shared by the device's streams)."""

    def __init__(self, device: Device, config: SimConfig, engine: _Engine) -> None:
        self._speed = config.speed
        self._engine = engine
        self._clock = 0.0  # when, by the model, this stream's work so far ended
        super().__init__(device)

    def _execute(
        self, fn: Callable[..., Any], args: tuple[Any, ...], work: float
    ) -> None:
        speed = self._speed
        if math.isinf(speed.memory_bandwidth):  # the arrays need no counting
            seconds = speed.compute_seconds(work)
        else:
            seconds = speed.compute_seconds(work, _arrays_nbytes(args))
        ready = max(self._clock, self._queued_at)
        if seconds <= 0:  # untimed (copies time themselves): no engine turn
            call = _Call(ready)
            token = _current_call.set(call)
            try:
                fn(*args)
            finally:
                _current_call.reset(token)
            self._clock = call.end
            return
        engine = self._engine
        with engine.turn(ready):
            start = max(ready, engine.free_at)
            fn(*args)
            engine.free_at = self._clock = start + seconds
            _sleep_until(start + seconds)

    def _wait(self, completion: Completion, event: Event) -> None:
        super()._wait(completion, event)
        # A device-side wait: the stream goes on from when the event was
        # reached, not from when this thread woke up.
        self._clock = max(self._clock, completion.time)

    def _complete(self, completion: Completion, error: BaseException | None) -> None:
        completion.set(error, at=max(self._clock, self._queued_at))


def _arrays_nbytes(args: tuple[Any, ...]) -> int:
    """Bytes of the distinct arrays among ``args`` (one buffer passed twice
    counts once)."""
    seen: dict[tuple[int, int], int] = {}
    for arg in args:
        if isinstance(arg, np.ndarray):
            seen[arg.__array_interface__["data"][0], arg.nbytes] = arg.nbytes
    return sum(seen.values())


class SimDeviceAPI(DeviceAPI):
    """Simulated accelerators ``sim:0`` .. ``sim:N-1``."""

    kind = "sim"
    outgoing_copies = True

    def __init__(self) -> None:
        super().__init__()
        self._configs: list[SimConfig] = [SimConfig(), SimConfig()]
        self._addresses = itertools.count(0x1000_0000, 0x100)
        self._config_lock = threading.Lock()
        self._engines: dict[int, _Engine] = {}

    def configure(
        self, count: int, configs: Sequence[SimConfig] | SimConfig = _DEFAULT
    ) -> None:
        """Set how many sim devices exist and their configurations.

        :param count: number of devices.
        :param configs: one config for all, or one per device.
        :raises ArgumentError: if ``count`` or ``configs`` is unusable, or
            the change would strand memory in use (a device holding some
            removed, or given less memory than it holds).
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ArgumentError(f"count must be an int >= 0, got {count!r}")
        if isinstance(configs, SimConfig):
            chosen = [configs] * count
        else:
            chosen = list(configs)
            if len(chosen) != count:
                raise ArgumentError(f"need {count} configs, got {len(chosen)}")
            for config in chosen:
                if not isinstance(config, SimConfig):
                    raise ArgumentError(f"expected SimConfig, got {config!r}")
        with self._config_lock, self._lock:
            # Memory in use stays where it is: a device that holds some must
            # remain, with room for it (else its free bytes go negative).
            for index, used in sorted(self._used.items()):
                if not used:
                    continue
                if index >= count:
                    raise ArgumentError(
                        f"cannot configure {count} sim device(s): sim:{index} "
                        f"holds {used} bytes in use; free them first"
                    )
                if chosen[index].memory < used:
                    raise ArgumentError(
                        f"cannot give sim:{index} {chosen[index].memory} bytes of "
                        f"memory: {used} bytes are in use; free them first"
                    )
            self._configs = chosen

    def config(self, device: Device) -> SimConfig:
        """The configuration of ``device``."""
        self._check_device(device)
        return self._configs[device.index]

    def device_count(self) -> int:
        return len(self._configs)

    def _attributes(self, device: Device) -> dict[str, Any]:
        config = self._configs[device.index]
        return {
            "device_name": "asyncrt simulated accelerator",
            "max_threads_per_block": 1024,
            "warp_size": 32,
            "compute_version": "sim-1",
            "total_global_memory": config.memory,
            "available_global_memory": config.memory - self.used_bytes(device),
            "flops": config.flops,
            "host_bandwidth": config.bandwidth,
            "host_latency": config.latency,
            "launch_overhead": config.launch_overhead,
            "memory_bandwidth": config.memory_bandwidth,
            "speed_source": config.speed.source,
        }

    def _free_bytes(self, device: Device) -> int | None:
        return self._configs[device.index].memory - self.used_bytes(device)

    def _call_timer(self, device: Device) -> CallTimer:
        return ModelTimer(self._configs[device.index].speed)

    def _process_state(self) -> object | None:
        return [dataclasses.asdict(config) for config in self._configs]

    def _restore_process_state(self, state: object) -> None:
        if not isinstance(state, list) or not all(isinstance(c, dict) for c in state):
            raise ArgumentError(
                f"sim process state must be a list of SimConfig fields, got {state!r}"
            )
        try:
            configs = [SimConfig(**fields) for fields in state]
        except TypeError as exc:
            raise ArgumentError(f"unusable sim process state: {exc}") from exc
        self.configure(len(configs), configs)

    def _alloc(self, device: Device, nbytes: int) -> Any:
        config = self._configs[device.index]
        free = config.memory - self.used_bytes(device)
        if nbytes > free:  # also when larger than the whole device, as CUDA
            raise OutOfMemoryError(str(device), nbytes, free)
        address = next(self._addresses)
        return SimAllocation(address, np.empty(nbytes, dtype=np.uint8))

    def _create_stream(self, device: Device) -> Stream:
        with self._config_lock:
            engine = self._engines.setdefault(device.index, _Engine())
        return SimStream(device, self._configs[device.index], engine)

    def view(
        self, buffer: Buffer, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> Any:
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        data = buffer.raw._data[offset : offset + count * dtype.itemsize]
        return data.view(dtype).reshape(shape)

    def _copy_within(
        self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int
    ) -> None:
        start = _copy_start()
        dst.raw._data[dst_offset : dst_offset + nbytes] = src.raw._data[
            src_offset : src_offset + nbytes
        ]
        if src.device != dst.device:  # over the link between two devices
            seconds = transfer_seconds(
                self._configs[src.device.index].speed,
                self._configs[dst.device.index].speed,
                nbytes,
                same_kind=True,
            )
            _copy_done(start + seconds)

    def _copy_to_host(
        self, src: Buffer, src_offset: int, dst: np.ndarray[Any, Any]
    ) -> None:
        start = _copy_start()
        dst[...] = src.raw._data[src_offset : src_offset + dst.nbytes]
        _copy_done(start + self._configs[src.device.index].copy_seconds(dst.nbytes))

    def _copy_from_host(
        self, src: np.ndarray[Any, Any], dst: Buffer, dst_offset: int
    ) -> None:
        start = _copy_start()
        dst.raw._data[dst_offset : dst_offset + src.nbytes] = src
        _copy_done(start + self._configs[dst.device.index].copy_seconds(src.nbytes))


def _copy_start() -> float:
    """A copy's modelled start: the stream's clock when a sim stream runs it,
    else now."""
    call = _current_call.get()
    return time.perf_counter() if call is None else call.start


def _copy_done(deadline: float) -> None:
    """End a copy at ``deadline``, its modelled end: tell the sim stream
    running it, and sleep till then (if its real work is not later)."""
    call = _current_call.get()
    if call is not None:
        call.end = deadline
    _sleep_until(deadline)


#: time.sleep overshoots by tens of microseconds; sleep to this much before
#: the deadline, then yield until it passes, so short modelled durations are
#: kept exactly without burning a core for long.
_SPIN = 150e-6


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > _SPIN:
        time.sleep(remaining - _SPIN)
    while time.perf_counter() < deadline:
        time.sleep(0)  # lets other threads run


def configure(count: int, configs: Sequence[SimConfig] | SimConfig = _DEFAULT) -> None:
    """Set the number and configurations of the ``sim`` devices.

    Streams already made keep their old configuration.

    :param count: number of sim devices (``sim:0`` .. ``sim:count-1``).
    :param configs: one :class:`SimConfig` for all, or one per device.
    :raises ArgumentError: if ``count`` or ``configs`` is unusable, or the
        change would strand memory in use (a device holding some removed, or
        given less memory than it holds): free it first.
    """
    api = get_api("sim")
    if not isinstance(api, SimDeviceAPI):
        raise TypeError(f"the 'sim' kind is registered to {type(api).__name__}")
    api.configure(count, configs)


register("sim", SimDeviceAPI)
