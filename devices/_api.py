"""The DeviceAPI contract: what every backend can do.

:class:`DeviceAPI` is TVM's ``DeviceAPI`` in Python: one object per device
*kind*, its methods take the :class:`~devices.Device` they act on. The
public methods check their arguments, keep the books (bytes in use, open
streams) and turn backend failures into :mod:`devices.errors`; a backend
overrides only the private primitives (``_alloc``, ``_copy_within``, ...), as
tinygrad's allocators do.

Copies follow TVM's ``CopyDataFromTo``: any two buffers, of the same kind or
not. Same-kind copies (also ``sim:0 -> sim:1``) use the backend's own path;
a copy between a device and the host (the kind that :attr:`DeviceAPI.is_host`)
uses the device's path; any other pair is staged through host memory.

A DeviceAPI also says what its kind *can do*, so that nothing above
``devices`` ever needs a kind's name: the array library its kernels receive
(:attr:`~DeviceAPI.array_namespace`), whether it is the host itself
(:attr:`~DeviceAPI.is_host`), whether its streams compute side by side
(:attr:`~DeviceAPI.concurrent_streams`), its copy engines
(:meth:`~DeviceAPI.copy_engines`), its timing model
(:meth:`~DeviceAPI.speed`, :mod:`devices._timing`), how its clock times a
call (:meth:`~DeviceAPI.call_timer`), and the state a worker process needs
to model the same devices (:meth:`~DeviceAPI.process_state`).
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from ._device import Device
from ._stream import Stream
from ._timing import (
    CallTimer,
    CopyEngines,
    DeviceSpeed,
    speed_from_attributes,
    transfer_seconds,
)
from .errors import (
    AllocationError,
    ArgumentError,
    ClosedResourceError,
    CopyError,
    DeviceNotFoundError,
    OutOfMemoryError,
    StreamMismatchError,
    UnsupportedOperationError,
)

__all__ = (
    "MAX_ALLOCATION",
    "Buffer",
    "DeviceAPI",
    "copy_function",
    "modelled_copy_seconds",
)

#: No single allocation may exceed this (1 TiB): larger requests are bugs or
#: hostile input, and are refused before any backend is asked.
MAX_ALLOCATION = 1 << 40

#: Attributes every backend answers (TVM's DeviceAttrKind, by name).
STANDARD_ATTRIBUTES: tuple[str, ...] = (
    "exist",
    "device_name",
    "max_threads_per_block",
    "warp_size",
    "compute_version",
    "multi_processor_count",
    "max_clock_rate",
    "total_global_memory",
    "available_global_memory",
    "api_version",
    "driver_version",
    "flops",
    "host_bandwidth",
    "host_latency",
    "launch_overhead",
)


class Buffer:
    """A block of device memory: TVM's data space.

    The memory is opaque to the host: reach it through copies or
    :class:`~devices.NDArray` views. Free it with :meth:`DeviceAPI.free`
    (or let it be garbage-collected, which returns it as well).

    :ivar device: where the memory lives.
    :ivar nbytes: its size.
    """

    __slots__ = ("__weakref__", "_api", "_finalizer", "_raw", "device", "nbytes")

    def __init__(self, api: DeviceAPI, device: Device, nbytes: int, raw: Any) -> None:
        self._api = api
        self.device = device
        self.nbytes = nbytes
        self._raw = raw
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def __repr__(self) -> str:
        state = "" if self._raw is not None else " freed"
        return f"<Buffer {self.nbytes} bytes on {self.device}{state}>"

    @property
    def freed(self) -> bool:
        """Whether the buffer was freed."""
        return self._raw is None

    @property
    def raw(self) -> Any:
        """The backend's own handle (a numpy or cupy byte array).

        :raises ClosedResourceError: if the buffer was freed.
        """
        raw = self._raw
        if raw is None:
            raise ClosedResourceError(f"{self!r} is used after free")
        return raw


class DeviceAPI:
    """The operations of one device kind (TVM's ``DeviceAPI``).

    Subclasses set :attr:`kind` and override the private primitives. Find an
    instance with :func:`devices.get_api`.
    """

    kind: ClassVar[str] = ""
    #: The DLPack device-type code of this kind's memory, if it has one the
    #: host can hand to other libraries (cpu: 1, cuda: 2); ``None`` otherwise.
    dlpack_device_type: ClassVar[int | None] = None
    #: The array library whose arrays this kind's kernels receive, by module
    #: name (as CuPy's ``get_array_module`` picks one by the arrays): kernels
    #: written once against the array API are registered per namespace, and
    #: a device finds its kernels through this. ``None``: kernels do not run
    #: in this process (a remote worker runs its own, looked up by name).
    array_namespace: ClassVar[str | None] = "numpy"
    #: Whether this kind is the host itself: its memory is the process's own
    #: (a copy to or from it is the other device's to make, over that
    #: device's link; its own link is free) and its streams are host threads
    #: that run calls as they come, so a run on one stream of it may as well
    #: run on the caller's thread.
    is_host: ClassVar[bool] = False
    #: Whether several streams of one device compute at the same time (the
    #: host's are threads on separate cores), so that one node's rows may be
    #: cut across them; an accelerator's kernel already fills the device.
    concurrent_streams: ClassVar[bool] = False
    #: Whether this kind's copies to host memory run on the device's own
    #: streams, as an accelerator's copy engines move data both ways
    #: (otherwise the host's side issues them).
    outgoing_copies: ClassVar[bool] = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Buffers the garbage collector dropped, released later (_collected).
        self._dropped: collections.deque[tuple[Device, int, Any]] = collections.deque()
        self._used: dict[int, int] = {}
        self._streams: dict[int, set[Stream]] = {}
        self._workspace_free: dict[tuple[int, int], list[Buffer]] = {}

    # -- attributes --------------------------------------------------------

    def exists(self, device: Device) -> bool:
        """Whether ``device`` is present."""
        return device.kind == self.kind and 0 <= device.index < self.device_count()

    def device_count(self) -> int:
        """How many devices of this kind are present."""
        return 1

    def get_attr(self, device: Device, name: str) -> Any:
        """Query one attribute (TVM's ``GetAttr``), by name.

        Names: ``exist``, ``device_name``, ``max_threads_per_block``,
        ``warp_size``, ``compute_version``, ``multi_processor_count``,
        ``max_clock_rate``, ``total_global_memory``,
        ``available_global_memory``, ``api_version``, ``driver_version``, and
        for cost models ``flops`` (peak float32 FLOP/s), ``host_bandwidth``
        (bytes/s to and from the host) and ``host_latency`` (s).

        :raises DeviceNotFoundError: if the device is not present (except for
            ``exist``, which then answers False).
        :raises UnsupportedOperationError: if this backend cannot tell.
        """
        if name == "exist":
            return self.exists(device)
        self._check_device(device)
        attributes = self._attributes(device)
        if name not in attributes:
            known = ", ".join(sorted(attributes)) or "none"
            raise UnsupportedOperationError(
                f"{device} cannot report attribute {name!r}; it reports: {known}"
            )
        return attributes[name]

    def attributes(self, device: Device) -> dict[str, Any]:
        """Every attribute this backend can report for ``device``."""
        self._check_device(device)
        return {"exist": True, **self._attributes(device)}

    # -- capabilities --------------------------------------------------------

    def speed(self, device: Device) -> DeviceSpeed:
        """The figures of ``device``'s timing model (:mod:`devices._timing`),
        read from its attributes: what cost models plan with.

        :raises DeviceNotFoundError: if the device is not present.
        :raises UnsupportedOperationError: if the backend reports no speed.
        """
        attributes = self.attributes(device)
        source = str(attributes.get("speed_source", ""))
        try:
            return speed_from_attributes(attributes, source)
        except ArgumentError as exc:
            raise UnsupportedOperationError(
                f"{device} reports no usable speed: {exc}"
            ) from exc

    def copy_engines(self, device: Device) -> CopyEngines:
        """Which copies ``device`` makes itself, and its links
        (:class:`~devices.CopyEngines`).

        :raises DeviceNotFoundError: if the device is not present.
        :raises UnsupportedOperationError: if the backend reports no links.
        """
        speed = self.speed(device)
        return CopyEngines(speed.link, speed.peer, self.outgoing_copies)

    def call_timer(self, device: Device) -> CallTimer:
        """How ``device``'s own clock times a call on its streams
        (:class:`~devices.CallTimer`): the wall time on the stream's thread,
        a modelled duration, or marks recorded on the stream.

        :raises DeviceNotFoundError: if the device is not present.
        """
        self._check_device(device)
        return self._call_timer(device)

    def process_state(self) -> object | None:
        """What a worker process must be given so that its devices of this
        kind are the ones this process has (a simulated device's speed and
        size): picklable, JSON-able plain data, or ``None`` if nothing.
        """
        return self._process_state()

    def restore_process_state(self, state: object) -> None:
        """Make this process's devices of this kind those that
        :meth:`process_state` described in another process.

        :raises ArgumentError: if ``state`` is not such a description.
        """
        self._restore_process_state(state)

    def used_bytes(self, device: Device) -> int:
        """Bytes currently allocated on ``device`` through this API."""
        self._release_collected()
        return self._used.get(device.index, 0)

    # -- memory ------------------------------------------------------------

    def alloc(self, device: Device, nbytes: int) -> Buffer:
        """Allocate ``nbytes`` of data space on ``device`` (TVM's
        ``AllocDataSpace``). Zero bytes is allowed.

        :raises AllocationError: if ``nbytes`` is negative, not an int, or
            absurd (over 1 TiB).
        :raises OutOfMemoryError: if the device has no room.
        """
        self._check_device(device)
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise AllocationError(f"allocation size must be an int, got {nbytes!r}")
        nbytes = int(nbytes)
        if nbytes < 0:
            raise AllocationError(f"cannot allocate {nbytes} bytes on {device}")
        if nbytes > MAX_ALLOCATION:
            raise AllocationError(
                f"refusing to allocate {nbytes} bytes on {device} "
                f"(over the {MAX_ALLOCATION}-byte limit)"
            )
        self._release_collected()  # their room first
        try:
            raw = self._alloc(device, nbytes)
        except OutOfMemoryError:
            raise
        except MemoryError as exc:
            raise OutOfMemoryError(
                str(device), nbytes, self._free_bytes(device)
            ) from exc
        buffer = Buffer(self, device, nbytes, raw)
        with self._lock:
            self._used[device.index] = self._used.get(device.index, 0) + nbytes
        # A buffer dropped without free() still gives its bytes back.
        buffer._finalizer = weakref.finalize(
            buffer, self._collected, device, nbytes, raw
        )
        return buffer

    def free(self, buffer: Buffer) -> None:
        """Release a buffer (TVM's ``FreeDataSpace``). Idempotent."""
        raw = buffer._raw
        if raw is None:
            return
        buffer._raw = None
        if buffer._finalizer is not None and buffer._finalizer.detach() is not None:
            self._release(buffer.device, buffer.nbytes, raw)

    def _release(self, device: Device, nbytes: int, raw: Any) -> None:
        self._release_collected()
        with self._lock:
            self._used[device.index] -= nbytes
        self._free(device, raw)

    def _collected(self, device: Device, nbytes: int, raw: Any) -> None:
        """A buffer dropped without free(): its bytes go back at the next
        allocation or free. The garbage collector may run this on any thread
        at any allocation, also one made while that thread holds ``_lock``,
        so it takes no lock (``deque.append`` is atomic)."""
        self._dropped.append((device, nbytes, raw))

    def _release_collected(self) -> None:
        while self._dropped:
            try:
                device, nbytes, raw = self._dropped.popleft()
            except IndexError:  # another thread took the last one
                return
            with self._lock:
                self._used[device.index] -= nbytes
            self._free(device, raw)

    def alloc_workspace(self, device: Device, nbytes: int) -> Buffer:
        """Scratch memory for a kernel (TVM's ``AllocWorkspace``).

        Workspace buffers are pooled per size class (powers of two), so a
        kernel that asks for scratch on every call reuses the same memory.
        """
        size_class = max(64, 1 << max(0, int(nbytes) - 1).bit_length())
        if nbytes < 0:
            raise AllocationError(f"cannot allocate {nbytes} bytes of workspace")
        with self._lock:
            pool = self._workspace_free.get((device.index, size_class))
            if pool:
                return pool.pop()
        return self.alloc(device, size_class)

    def free_workspace(self, buffer: Buffer) -> None:
        """Return workspace from :meth:`alloc_workspace` to the pool."""
        with self._lock:
            key = (buffer.device.index, buffer.nbytes)
            self._workspace_free.setdefault(key, []).append(buffer)

    # -- copies ------------------------------------------------------------

    def copy_data_from_to(
        self,
        src: Buffer,
        src_offset: int,
        dst: Buffer,
        dst_offset: int,
        nbytes: int,
        stream: Stream | None = None,
    ) -> None:
        """Copy ``nbytes`` between two buffers (TVM's ``CopyDataFromTo``).

        With ``stream``, the copy is queued on it and this returns at once;
        the stream must belong to ``src``'s or ``dst``'s device. Without, the
        copy runs now on the calling thread (the caller orders it against
        streams, e.g. by synchronizing first).

        :raises CopyError: if offsets or sizes fall outside either buffer.
        :raises StreamMismatchError: if ``stream`` belongs to another device.
        :raises ClosedResourceError: if a buffer was freed or the stream closed.
        """
        for name, buf, offset in (
            ("source", src, src_offset),
            ("destination", dst, dst_offset),
        ):
            buf.raw  # noqa: B018 - raises if freed
            if offset < 0 or nbytes < 0 or offset + nbytes > buf.nbytes:
                raise CopyError(
                    f"copy of {nbytes} bytes at {name} offset {offset} does not fit "
                    f"the {buf.nbytes}-byte {name} buffer on {buf.device}"
                )
        copy = copy_function(src, src_offset, dst, dst_offset, nbytes)
        if stream is None:
            copy()
            return
        if stream.device not in (src.device, dst.device):
            raise StreamMismatchError(
                f"copy {src.device} -> {dst.device} cannot run on stream "
                f"{stream.label} of {stream.device}"
            )
        stream.launch(copy, (), work=0.0)

    # -- streams -----------------------------------------------------------

    def create_stream(self, device: Device) -> Stream:
        """Make a new stream on ``device`` (TVM's ``CreateStream``)."""
        self._check_device(device)
        stream = self._create_stream(device)
        with self._lock:
            self._streams.setdefault(device.index, set()).add(stream)
        return stream

    def free_stream(self, stream: Stream) -> None:
        """Finish a stream's work and release its thread (``FreeStream``)."""
        self._check_stream(stream.device, stream)
        with self._lock:
            self._streams.get(stream.device.index, set()).discard(stream)
        stream.close()

    def stream_sync(self, device: Device, stream: Stream) -> None:
        """Block until all work on ``stream`` is done (``StreamSync``).

        :raises StreamMismatchError: if the stream belongs to another device.
        """
        self._check_stream(device, stream)
        stream.synchronize()

    def sync_stream_from_to(
        self, device: Device, event_src: Stream, event_dst: Stream
    ) -> None:
        """Order ``event_dst``'s later work after ``event_src``'s work so far
        (``SyncStreamFromTo``): an event recorded on one, waited on by the
        other, device-side.

        :raises StreamMismatchError: if either stream belongs to another
            device.
        """
        self._check_stream(device, event_src)
        self._check_stream(device, event_dst)
        event_dst.wait_event(event_src.record())

    @contextmanager
    def stream(self, device: Device) -> Iterator[Stream]:
        """A stream for the duration of a ``with`` block."""
        stream = self.create_stream(device)
        try:
            yield stream
        finally:
            self.free_stream(stream)

    def close(self, device: Device) -> None:
        """Close every stream made on ``device`` and drop its workspace pool."""
        with self._lock:
            streams = self._streams.pop(device.index, set())
            pools = [key for key in self._workspace_free if key[0] == device.index]
            workspace = [b for key in pools for b in self._workspace_free.pop(key)]
        for stream in streams:
            stream.close()
        for buffer in workspace:
            self.free(buffer)

    # -- views for kernels ---------------------------------------------------

    def view(
        self, buffer: Buffer, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> Any:
        """The backend array (numpy on cpu and sim, cupy on cuda) that views
        ``buffer`` at ``offset``: what kernels receive. Sizes must be checked
        by the caller (:class:`~devices.NDArray` does)."""
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        flat = buffer.raw[offset : offset + count * dtype.itemsize]
        return flat.view(dtype).reshape(shape)

    # -- primitives a backend overrides --------------------------------------

    def _attributes(self, device: Device) -> dict[str, Any]:
        return {}

    def _call_timer(self, device: Device) -> CallTimer:
        return CallTimer()

    def _process_state(self) -> object | None:
        return None

    def _restore_process_state(self, state: object) -> None:
        if state is not None:
            raise ArgumentError(
                f"the {self.kind!r} kind keeps no process state, got {state!r}"
            )

    def _free_bytes(self, device: Device) -> int | None:
        return None

    def _alloc(self, device: Device, nbytes: int) -> Any:
        raise NotImplementedError

    def _free(self, device: Device, raw: Any) -> None:
        """Release backend memory; garbage collection does it by default."""

    def _create_stream(self, device: Device) -> Stream:
        return Stream(device)

    def _copy_within(
        self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int
    ) -> None:
        """Copy between two buffers of this kind (maybe different indices)."""
        raise NotImplementedError

    def _copy_to_host(
        self, src: Buffer, src_offset: int, dst: np.ndarray[Any, Any]
    ) -> None:
        """Copy ``dst.nbytes`` bytes from device memory into a host byte array."""
        raise NotImplementedError

    def _copy_from_host(
        self, src: np.ndarray[Any, Any], dst: Buffer, dst_offset: int
    ) -> None:
        """Copy a host byte array into device memory."""
        raise NotImplementedError

    # -- checks --------------------------------------------------------------

    def _check_device(self, device: Device) -> None:
        if device.kind != self.kind:
            raise DeviceNotFoundError(f"{device} is not a {self.kind!r} device")
        if not self.exists(device):
            raise DeviceNotFoundError(
                f"{device} does not exist ({self.device_count()} {self.kind} "
                f"device(s) present)"
            )

    def _check_stream(self, device: Device, stream: Stream) -> None:
        if stream.device != device:
            raise StreamMismatchError(
                f"stream {stream.label} belongs to {stream.device}, not {device}"
            )
        if stream.closed:
            raise ClosedResourceError(f"stream {stream.label} is closed")


def copy_function(
    src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int
) -> Callable[[], None]:
    """The call that copies ``nbytes`` between two buffers, for launching on
    a stream of either device: within a kind, to or from the host, or staged
    through a host bounce buffer. Bounds are the caller's to check."""
    src_api, dst_api = src._api, dst._api
    if src_api is dst_api:
        return lambda: src_api._copy_within(src, src_offset, dst, dst_offset, nbytes)
    if dst_api.is_host:
        return lambda: src_api._copy_to_host(
            src, src_offset, dst.raw[dst_offset : dst_offset + nbytes]
        )
    if src_api.is_host:
        return lambda: dst_api._copy_from_host(
            src.raw[src_offset : src_offset + nbytes], dst, dst_offset
        )

    def staged() -> None:
        bounce = np.empty(nbytes, dtype=np.uint8)
        src_api._copy_to_host(src, src_offset, bounce)
        dst_api._copy_from_host(bounce, dst, dst_offset)

    return staged


def modelled_copy_seconds(src: Buffer, dst: Buffer, nbytes: int) -> float | None:
    """The duration the devices' models charge a copy of ``nbytes`` from
    ``src`` to ``dst`` (:func:`devices._timing.transfer_seconds`, the host's
    link free), where every device taking part other than the host models
    its time; ``None`` where some of it is measured (the host's own copies, a
    copy staged through a device that measures).

    :param src: the source buffer.
    :param dst: the destination buffer.
    :param nbytes: bytes copied.
    """
    models: list[DeviceSpeed] = []
    for buffer in (src, dst):
        if buffer._api.is_host:
            continue  # the host's link is free
        model = buffer._api.call_timer(buffer.device).model
        if model is None:
            return None
        models.append(model)
    if not models:
        return None
    if src.device == dst.device:
        return 0.0
    if len(models) == 1:
        return models[0].copy_seconds(nbytes)
    same_kind = src.device.kind == dst.device.kind
    return transfer_seconds(models[0], models[1], nbytes, same_kind=same_kind)
