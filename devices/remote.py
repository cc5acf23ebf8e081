"""The ``remote`` backend: the workers of a Dask cluster as devices.

.. code-block:: python

    from devices import remote

    with remote.connect("tls://scheduler:8786", security=sec) as conn:
        print(conn.devices)            # (Device('remote:0'), Device('remote:1'))
        ex = graph_executor.create(graph, None, ["cpu", *conn.devices])

:func:`connect` takes a scheduler address or a ``distributed.Client`` and
makes each worker one device, ``remote:0``, ``remote:1``, ... in the order
of the workers' addresses (with ``gpus=True``, each GPU a worker advertises
as its ``GPU`` resource instead). The devices follow the DeviceAPI contract
of every backend:

* **memory** lives on the worker: a buffer is the Dask future of a
  worker-local allocation, pinned there (:mod:`devices._remote_ops`);
* **streams** issue Dask tasks restricted to the device's worker, each
  depending on the stream's previous one, so the order holds on the cluster
  without a round trip per launch (:mod:`devices._remote_stream`); a batch
  of kernel calls is one task;
* **events** are those tasks' futures: a remote stream waits on another's
  event worker-side, the host awaits it without polling;
* **copies** between two remote devices go worker to worker (a task on the
  destination takes the source's bytes as argument); host to remote is a
  scatter (small copies ride inside the task that writes them), remote to
  host a gather straight from the worker; anything else is staged through
  the host;
* **kernels** run on the worker *by name*: the host sends a reference to a
  module-level function and strings (for asyncrt, the registry name), never
  a pickled closure; the worker imports asyncrt and looks the kernel up.

Connecting measures each device's speed and links (:mod:`devices._remote_link`)
and reports them as attributes — ``flops``, ``launch_overhead``,
``host_bandwidth``/``host_latency``, ``peer_bandwidth``/``peer_latency`` —
which the scheduler's cost model reads like any other device's.

**Failure.** When the scheduler removes a worker (it died, or was closed),
its devices are lost: work in flight there, and on any device waiting for
it, fails with :class:`~devices.errors.DeviceLostError` naming the device and
the worker (under the executor's ``NodeFailedError`` naming the node); later
work on a lost device fails at once; nothing waits for ever. The other
devices go on working. Lost devices stay lost (a worker that comes back is a
new worker: connect again to use it).

**Security.** ``security=`` is Dask's own ``distributed.security.Security``
(TLS certificates for the client, scheduler and workers); with a ``tls://``
address every byte between host and workers, and between workers, is
encrypted and authenticated by Dask. asyncrt adds no code path that executes
what it receives: kernels are resolved by name, tensors travel as raw bytes,
failures come back as text.

``distributed`` is imported only by :func:`connect`; until then the kind
has no devices.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from importlib import metadata
from types import MappingProxyType, TracebackType
from typing import Any

import numpy as np

from . import _remote_ops as ops
from ._api import Buffer, DeviceAPI
from ._device import Device
from ._dtype import dtype_string
from ._registry import get_api, register
from ._remote_link import LinkFigures, measure
from ._remote_link import describe as describe_link
from ._remote_session import Session, Target
from ._remote_stream import (
    RemoteAllocation,
    RemoteArray,
    RemoteCompletion,
    RemoteFunction,
    RemoteStream,
    current_stream,
)
from ._stream import Stream
from .errors import (
    DeviceError,
    DeviceNotFoundError,
    OutOfMemoryError,
    RemoteError,
)

__all__ = (
    "INLINE",
    "Connection",
    "RemoteAllocation",
    "RemoteArray",
    "RemoteCompletion",
    "RemoteDeviceAPI",
    "RemoteFunction",
    "connect",
    "connection",
    "worker_kind",
)

#: Host bytes up to this size travel to a worker inside the task that
#: writes them (one message); larger ones are scattered straight to the
#: worker first (Dask warns about large task graphs, and the scheduler would
#: relay them).
INLINE = 1 << 20


class RemoteDeviceAPI(DeviceAPI):
    """The workers of a Dask cluster, ``remote:0`` .. ``remote:N-1``."""

    kind = "remote"
    array_namespace = None

    def __init__(self) -> None:
        super().__init__()
        self._session: Session | None = None
        self._figures: dict[int, LinkFigures] = {}
        self._attach_lock = threading.Lock()

    # -- the connection ----------------------------------------------------

    def _attach(self, session: Session, figures: dict[int, LinkFigures]) -> None:
        with self._attach_lock:
            if self._session is not None and not self._session.closed:
                raise DeviceError(
                    "already connected to a Dask cluster; close that connection first"
                )
            self._session, self._figures = session, figures

    def _detach(self, session: Session) -> None:
        # The streams stay with their owners (executors close them); once
        # the session is closed they fail whatever they are given, at once.
        session.close()
        with self._attach_lock:
            if self._session is session:
                self._session, self._figures = None, {}

    @property
    def worker_kind(self) -> str:
        """The kind of the workers' own devices ("cpu", or "cuda" with GPUs):
        the kernels the workers run are that kind's."""
        session = self._session
        if session is None or not session.targets:
            return "cpu"
        return session.targets[0].local.kind

    def _connected(self) -> Session:
        session = self._session
        if session is None:
            raise DeviceNotFoundError(
                "no remote devices: call devices.remote.connect() first"
            )
        return session

    def target(self, device: Device) -> Target:
        """Where ``device`` lives.

        :raises DeviceNotFoundError: if it is not a device of the connection.
        """
        self._check_device(device)
        return self._connected().targets[device.index]

    # -- attributes ----------------------------------------------------------

    def device_count(self) -> int:
        session = self._session
        return 0 if session is None else len(session.targets)

    def exists(self, device: Device) -> bool:
        session = self._session
        if session is None or not super().exists(device):
            return False
        target = session.targets[device.index]
        return not session.closed and session.lost_reason(target.worker) is None

    def _check_device(self, device: Device) -> None:
        if device.kind == self.kind and 0 <= device.index < self.device_count():
            session = self._connected()
            target = session.targets[device.index]
            if session.closed or session.lost_reason(target.worker) is not None:
                session.check(target)  # raises, naming the cause
            return
        super()._check_device(device)

    def _attributes(self, device: Device) -> dict[str, Any]:
        target = self._connected().targets[device.index]
        figures = self._figures[device.index]
        return {
            "device_name": f"Dask worker {target.worker} ({target.local})",
            "worker": target.worker,
            "worker_name": target.name,
            "local_device": str(target.local),
            "total_global_memory": target.memory,
            "api_version": f"distributed {metadata.version('distributed')}",
            "flops": figures.flops,
            "launch_overhead": figures.launch_overhead,
            "host_bandwidth": figures.host_bandwidth,
            "host_latency": figures.host_latency,
            "peer_bandwidth": figures.peer_bandwidth,
            "peer_latency": figures.peer_latency,
            "unresolved": figures.unresolved,
        }

    # -- memory ----------------------------------------------------------------

    def _alloc(self, device: Device, nbytes: int) -> Any:
        session = self._connected()
        target = session.targets[device.index]
        future = session.submit(
            target, ops.allocate, str(target.local), nbytes, label="alloc"
        )
        try:
            session.wait(future, target, frozenset((target.worker,)))
        except RemoteError as exc:
            if exc.type_name in ("OutOfMemoryError", "MemoryError"):
                raise OutOfMemoryError(str(device), nbytes) from exc
            raise
        return RemoteAllocation(session, target, future, nbytes)

    def _free(self, device: Device, raw: Any) -> None:
        raw.release()

    def _create_stream(self, device: Device) -> Stream:
        session = self._connected()
        return RemoteStream(device, session, session.targets[device.index])

    def view(
        self, buffer: Buffer, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> Any:
        """A :class:`RemoteArray` (what remote kernels receive on the host)."""
        return RemoteArray(buffer.raw, offset, tuple(shape), dtype_string(dtype))

    # -- copies ------------------------------------------------------------------

    def _copy_within(
        self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int
    ) -> None:
        src_mem: RemoteAllocation = src.raw
        dst_mem: RemoteAllocation = dst.raw
        if nbytes == 0:
            return
        if src_mem.target.worker == dst_mem.target.worker:
            _issue(
                dst_mem,
                ops.copy,
                src_mem.future,
                src_offset,
                dst_mem.future,
                dst_offset,
                nbytes,
                label="copy",
            )
            return
        chunk = _issue(
            src_mem, ops.read, src_mem.future, src_offset, nbytes, label="send"
        )
        # The destination's task takes the bytes as argument: Dask moves
        # them worker to worker, never through the host.
        _issue(
            dst_mem,
            ops.write,
            dst_mem.future,
            dst_offset,
            chunk,
            label="receive",
            touches=frozenset((src_mem.target.worker,)),
        )

    def _copy_to_host(
        self, src: Buffer, src_offset: int, dst: np.ndarray[Any, Any]
    ) -> None:
        if dst.nbytes == 0:
            return
        src_mem: RemoteAllocation = src.raw
        chunk = _issue(
            src_mem, ops.read, src_mem.future, src_offset, dst.nbytes, label="d2h"
        )
        # Staged copies read the host bytes as soon as this returns, so it
        # always waits for them (on a stream's thread too).
        stream = current_stream()
        workers = frozenset((src_mem.target.worker,))
        if stream is not None:
            workers = stream.last_workers()
        data = src_mem.session.fetch(chunk, src_mem.target, workers)
        dst[...] = np.asarray(data, dtype=np.uint8).reshape(-1)[: dst.nbytes]

    def _copy_from_host(
        self, src: np.ndarray[Any, Any], dst: Buffer, dst_offset: int
    ) -> None:
        dst_mem: RemoteAllocation = dst.raw
        # A snapshot: the caller may change its array as soon as we return.
        data: Any = src.reshape(-1).view(np.uint8).copy()
        if data.nbytes > INLINE:
            data = dst_mem.session.scatter(dst_mem.target, data)
        _issue(dst_mem, ops.write, dst_mem.future, dst_offset, data, label="h2d")


def _issue(
    memory: RemoteAllocation,
    fn: Any,
    *args: Any,
    label: str,
    touches: frozenset[str] = frozenset(),
) -> Any:
    """Submit ``fn(prev, waits, call, *args)`` on ``memory``'s worker: in the
    order of the remote stream issuing on this thread, or, from any other
    thread, as a blocking operation (a write or copy waits, and raises its
    error).

    Blocking operations wait for the task itself only; a caller orders them
    against streams by synchronizing first, as for every backend.

    :param touches: workers holding data among ``args``, besides
        ``memory``'s.
    """
    target = memory.target
    stream = current_stream()
    if stream is not None:
        call = stream.current_call()
        return stream.chain(target, fn, call, *args, label=label, touches=touches)
    session = memory.session
    future = session.submit(target, fn, None, [], ops.NO_CALL, *args, label=label)
    if fn is ops.write or fn is ops.copy:
        session.wait(future, target, frozenset((target.worker, *touches)))
    return future


class Connection:
    """An open connection: the cluster's workers as ``remote`` devices.

    Made by :func:`connect`; close it with :meth:`close` (or ``with``).

    :ivar devices: the devices, ``remote:0`` first.
    :ivar client: the ``distributed.Client`` used.
    """

    def __init__(self, api: RemoteDeviceAPI, session: Session) -> None:
        self._api = api
        self._session = session
        self.devices: tuple[Device, ...] = tuple(t.device for t in session.targets)
        self.client: Any = session.client

    def __repr__(self) -> str:
        state = " closed" if self._session.closed else ""
        return f"<Connection {len(self.devices)} remote devices{state}>"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._session.closed

    @property
    def workers(self) -> Mapping[Device, str]:
        """The worker address behind each device."""
        return MappingProxyType({t.device: t.worker for t in self._session.targets})

    @property
    def lost(self) -> Mapping[Device, str]:
        """The lost devices, and why."""
        lost = {}
        for target in self._session.targets:
            reason = self._session.lost_reason(target.worker)
            if reason is not None:
                lost[target.device] = f"worker {target.worker} {reason}"
        return MappingProxyType(lost)

    def live_devices(self) -> tuple[Device, ...]:
        """The devices whose workers are still in the cluster."""
        lost = self.lost
        return tuple(d for d in self.devices if d not in lost)

    def describe(self) -> str:
        """One line per device: worker, local device and measured figures."""
        lines = []
        for device in self.devices:
            attrs = self._api.attributes(device) if device.exist else {}
            if not attrs:
                lines.append(f"{device}: lost ({self.lost.get(device, '')})")
                continue
            lines.append(
                f"{device}: {attrs['worker']} ({attrs['local_device']}), "
                + describe_link(attrs)
            )
        return "\n".join(lines)

    def close(self) -> None:
        """Stop using the cluster: every wait still pending fails with
        :class:`~devices.errors.DeviceLostError`, later work on the devices
        fails at once (executors using them should be closed), and the
        client is closed if the connection opened it. Idempotent."""
        self._api._detach(self._session)

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_current: Connection | None = None


def connect(
    address_or_client: Any,
    *,
    security: Any = None,
    gpus: bool = False,
    min_workers: int = 1,
    timeout: float = 30.0,
) -> Connection:
    """Make the workers of a Dask cluster the ``remote`` devices.

    Blocks while it connects and measures the devices (well under a second
    per worker on a local network).

    :param address_or_client: the scheduler's address (``"tcp://host:8786"``,
        ``"tls://..."``), or a ``distributed.Client``. A synchronous client
        is used as it is and stays open after :meth:`Connection.close`; for
        an asynchronous one, asyncrt opens its own synchronous client to the
        same scheduler (with the same security).
    :param security: Dask's ``distributed.security.Security`` (TLS), for an
        address; ``None`` for none.
    :param gpus: one device per GPU of each worker (the workers' ``GPU``
        resource; kernels then run as ``cuda`` kernels on the worker),
        instead of one cpu device per worker.
    :param min_workers: wait until this many workers have joined.
    :param timeout: seconds to wait for the scheduler and the workers.
    :return: the connection.
    :raises DeviceNotFoundError: if ``distributed`` is not installed, the
        scheduler cannot be reached, or no (GPU) worker is there.
    :raises DeviceError: if a connection is open already.
    """
    global _current
    try:
        import distributed  # noqa: F401 - only to report its absence clearly
    except ImportError as exc:
        raise DeviceNotFoundError(
            "remote devices need Dask's distributed: pip install 'asyncrt[distributed]'"
        ) from exc
    api = _api()
    if api._session is not None and not api._session.closed:
        raise DeviceError(
            "already connected to a Dask cluster; close that connection first"
        )
    session = Session.open(
        address_or_client,
        security=security,
        gpus=gpus,
        min_workers=min_workers,
        timeout=timeout,
    )
    try:
        targets = session.targets
        peers = {t.worker for t in targets}
        order = sorted(peers)
        figures = {}
        for target in targets:
            nxt = order[(order.index(target.worker) + 1) % len(order)]
            peer = next(t for t in targets if t.worker == nxt)
            figures[target.device.index] = measure(session, target, peer)
        api._attach(session, figures)
    except BaseException:
        session.close()
        raise
    _current = Connection(api, session)
    return _current


def connection() -> Connection | None:
    """The connection made by the last :func:`connect`, if still open."""
    if _current is None or _current.closed:
        return None
    return _current


def worker_kind() -> str:
    """The device kind whose kernels the workers run: "cpu", or "cuda" for a
    connection made with ``gpus=True``."""
    return _api().worker_kind


def _api() -> RemoteDeviceAPI:
    api = get_api("remote")
    if not isinstance(api, RemoteDeviceAPI):
        raise TypeError(f"the 'remote' kind is registered to {type(api).__name__}")
    return api


register("remote", RemoteDeviceAPI)
