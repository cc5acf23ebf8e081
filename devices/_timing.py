"""The timing model: how long a call or a copy takes on a device, said once.

Every figure asyncrt predicts or simulates comes from here: the simulated
accelerator charges its calls and copies by these formulas, the scheduler's
cost model plans with them, and traces report a modelled device's time by
them, so the three can never disagree.

* A **call** doing ``work`` floating-point operations over ``nbytes`` of
  arrays (its inputs and outputs) lasts
  ``launch_overhead + max(work / flops, nbytes / memory_bandwidth)``: a
  roofline, which is the plain ``launch_overhead + work / flops`` where
  memory is never the bound (an infinite ``memory_bandwidth``).
* A **link** moves ``nbytes`` in ``latency + nbytes / bandwidth``. Every
  device has one to host memory; the host's own is free (no latency, an
  infinite bandwidth). Devices whose copies to one another take a path of
  their own, not through the host (two Dask workers), also have a *peer*
  link.
* A **copy** between two different devices takes the slower of their two
  links (:func:`transfer_seconds`): their peer links where both have one
  and they are of one kind, else their host links. That is a copy between
  two simulated devices exactly, and a copy to or from the host as a
  special case (the host's link is free).
* A stream that waits for an event of another device resumes
  ``sync_latency`` seconds after the event is reached: nothing for a
  device-side wait, a thread wake-up where streams are host threads.
* Before a run's first work, the host issues every step of it
  (``issue_overhead`` each, where the host-facing device says) and the first
  stream's thread wakes up (its ``sync_latency``).

A :class:`DeviceSpeed` holds one device's figures; a backend reports them as
attributes (:meth:`devices.DeviceAPI.speed` reads them). A
:class:`CallTimer` (:meth:`devices.DeviceAPI.call_timer`) says how the
device's own clock times a call: by the wall time on its stream's thread
(the default), by a model (the simulated accelerator, whose timer carries its
:class:`DeviceSpeed`), or by marks the device records around the call on its
stream (CUDA events).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ArgumentError

__all__ = (
    "CallTimer",
    "CopyEngines",
    "DeviceSpeed",
    "Link",
    "ModelTimer",
    "speed_from_attributes",
    "transfer_seconds",
)


@dataclass(frozen=True)
class Link:
    """A copy path: a fixed latency plus bytes over a bandwidth.

    :ivar latency: seconds per copy, ``>= 0``.
    :ivar bandwidth: bytes per second, ``> 0`` (``math.inf`` for free).
    """

    latency: float = 0.0
    bandwidth: float = math.inf

    def __post_init__(self) -> None:
        if not self.latency >= 0:
            raise ArgumentError(f"Link.latency must be >= 0, got {self.latency}")
        if not self.bandwidth > 0:
            raise ArgumentError(f"Link.bandwidth must be > 0, got {self.bandwidth}")

    def seconds(self, nbytes: int) -> float:
        """Duration of one copy of ``nbytes`` over this link.

        :param nbytes: bytes copied.
        :return: ``latency + nbytes / bandwidth``.
        """
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class CopyEngines:
    """Which copies a device makes itself, and over which links.

    :ivar host: its link to host memory.
    :ivar peer: its link to other devices of its kind where their copies do
        not go through the host (``None``: they are staged through it).
    :ivar outgoing: whether its copies *to* host memory run on its own
        streams, as an accelerator's copy engines move data both ways (so
        the host's streams are left to compute); otherwise the host's side
        issues them, as it does every copy into a device.
    """

    host: Link = Link()
    peer: Link | None = None
    outgoing: bool = False


@dataclass(frozen=True)
class DeviceSpeed:
    """The figures of one device's timing model (see the module docstring).

    :ivar flops: compute speed, floating-point operations per second, ``> 0``.
    :ivar bandwidth: bytes per second over the device's link to the host,
        ``> 0`` (``math.inf`` for the host itself).
    :ivar latency: seconds per copy over that link, ``>= 0``.
    :ivar launch_overhead: seconds added to every call, ``>= 0``.
    :ivar peer: the link to other devices of the same kind, where copies
        between them do not go through the host (``None``: they use
        :attr:`link`).
    :ivar memory_bandwidth: bytes per second a call's inputs and outputs
        move at, ``> 0`` (``math.inf``: memory is never the bound).
    :ivar sync_latency: seconds from an event of another device being
        reached to the device's waiting stream going on, ``>= 0`` (0 for a
        device-side wait).
    :ivar issue_overhead: seconds the host spends issuing one step of a run
        (a batch of calls, a record or a wait), when this device faces the
        host, ``>= 0``.
    :ivar source: where the figures came from (a cache file, a fresh
        measurement, a configuration), for people; not compared.
    """

    flops: float
    bandwidth: float = math.inf
    latency: float = 0.0
    launch_overhead: float = 0.0
    peer: Link | None = None
    memory_bandwidth: float = math.inf
    sync_latency: float = 0.0
    issue_overhead: float = 0.0
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("flops", "bandwidth", "memory_bandwidth"):
            if not getattr(self, name) > 0:
                raise ArgumentError(
                    f"DeviceSpeed.{name} must be > 0, got {getattr(self, name)}"
                )
        for name in ("latency", "launch_overhead", "sync_latency", "issue_overhead"):
            if not getattr(self, name) >= 0:
                raise ArgumentError(
                    f"DeviceSpeed.{name} must be >= 0, got {getattr(self, name)}"
                )

    @property
    def link(self) -> Link:
        """The device's link to the host."""
        return Link(self.latency, self.bandwidth)

    def compute_seconds(self, work: float, nbytes: int = 0) -> float:
        """Duration of a call doing ``work`` FLOPs over ``nbytes`` of inputs
        and outputs.

        :param work: floating-point operations.
        :param nbytes: bytes the call reads and writes.
        :return: ``launch_overhead + max(work / flops, nbytes /
            memory_bandwidth)``.
        """
        return self.launch_overhead + max(
            work / self.flops, nbytes / self.memory_bandwidth
        )

    def copy_seconds(self, nbytes: int) -> float:
        """Duration of a copy over the host link.

        :param nbytes: bytes copied.
        :return: ``latency + nbytes / bandwidth``.
        """
        return self.link.seconds(nbytes)

    def start_seconds(self, steps: int) -> float:
        """Seconds from a run of ``steps`` steps being issued, this device
        facing the host, to its first work: ``issue_overhead * steps +
        sync_latency``.

        :param steps: steps the host issues.
        """
        return self.issue_overhead * steps + self.sync_latency


def transfer_seconds(
    src: DeviceSpeed, dst: DeviceSpeed, nbytes: int, *, same_kind: bool
) -> float:
    """Duration of a copy of ``nbytes`` between two different devices: the
    slower of their two peer links where both have one and they are of one
    kind, else of their two host links.

    :param src: the source device's figures.
    :param dst: the destination device's figures.
    :param nbytes: bytes copied.
    :param same_kind: whether the two devices are of one kind.
    """
    if same_kind and src.peer is not None and dst.peer is not None:
        return max(src.peer.seconds(nbytes), dst.peer.seconds(nbytes))
    return max(src.copy_seconds(nbytes), dst.copy_seconds(nbytes))


def speed_from_attributes(attrs: Mapping[str, Any], source: str = "") -> DeviceSpeed:
    """Read a :class:`DeviceSpeed` from DeviceAPI attributes.

    Reads ``flops``, ``host_bandwidth`` (default: infinite), ``host_latency``
    (default 0) and, where a backend reports them, ``launch_overhead``,
    ``memory_bandwidth`` (default: infinite), ``sync_latency``,
    ``issue_overhead`` (default 0) and ``peer_bandwidth`` / ``peer_latency``
    (the peer link).

    :param attrs: the attributes.
    :param source: where they came from (:attr:`DeviceSpeed.source`).
    :raises ArgumentError: if ``flops`` is missing or a value is unusable.
    """
    if "flops" not in attrs:
        raise ArgumentError("no 'flops' attribute")
    try:
        peer = None
        if "peer_bandwidth" in attrs:
            peer = Link(
                float(attrs.get("peer_latency", 0.0)), float(attrs["peer_bandwidth"])
            )
        return DeviceSpeed(
            flops=float(attrs["flops"]),
            bandwidth=float(attrs.get("host_bandwidth", math.inf)),
            latency=float(attrs.get("host_latency", 0.0)),
            launch_overhead=float(attrs.get("launch_overhead", 0.0)),
            peer=peer,
            memory_bandwidth=float(attrs.get("memory_bandwidth", math.inf)),
            sync_latency=float(attrs.get("sync_latency", 0.0)),
            issue_overhead=float(attrs.get("issue_overhead", 0.0)),
            source=source,
        )
    except ArgumentError:
        raise
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"unusable speed attributes: {exc}") from exc


class CallTimer:
    """How a device's own clock times a call on one of its streams.

    The base times it by the wall clock of the stream's thread: what the
    ``cpu`` does. A device that models its time (:class:`ModelTimer`) or
    records marks on its stream around the call (CUDA events) says so.
    """

    #: Whether :meth:`mark` must be called on the stream's thread right
    #: before and right after the call, and :meth:`elapsed` read once the
    #: run is over, to learn the call's device time.
    marks: bool = False

    @property
    def model(self) -> DeviceSpeed | None:
        """The figures the device charges every call and copy by, exactly,
        whatever the host's load; ``None`` where time is measured."""
        return None

    def call_seconds(self, work: float, nbytes: int) -> float | None:
        """The modelled duration of a call doing ``work`` FLOPs over
        ``nbytes`` of arrays; ``None`` where time is measured.

        :param work: floating-point operations.
        :param nbytes: bytes of the call's distinct arrays.
        """
        model = self.model
        return None if model is None else model.compute_seconds(work, nbytes)

    def mark(self) -> Any:
        """Record a mark on the calling stream's device (:attr:`marks`)."""
        return None

    def elapsed(self, before: Any, after: Any) -> float:
        """Seconds between two marks, by the device's clock (waits for the
        later one)."""
        raise NotImplementedError


class ModelTimer(CallTimer):
    """A device whose time is its model's (the simulated accelerator).

    :param model: the figures it charges calls and copies by.
    """

    def __init__(self, model: DeviceSpeed) -> None:
        self._model = model

    @property
    def model(self) -> DeviceSpeed:
        """The figures the device charges by."""
        return self._model
