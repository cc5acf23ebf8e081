"""Cost models: how long a node takes on a device, and a copy between two.

Placement policies (:mod:`scheduler.placement`) never look at flops, bytes or
link speeds themselves; they ask a :class:`CostModel` two questions:

* ``compute_time(nid, device)``: seconds node ``nid`` runs on ``device``,
  ``math.inf`` where it cannot run there (no kernel for that kind);
* ``transfer_time(nbytes, src, dst)``: seconds to copy ``nbytes`` from
  ``src`` to ``dst``, ``0`` when they are the same device.

Two models ship here.

:class:`AnalyticCostModel` turns the DAG's estimates into time with one
:class:`DeviceSpeed` per device, the same formulas :class:`devices.sim.SimConfig`
uses, so for ``sim`` devices the model is exact by construction:

* a node takes ``launch_overhead + flops / speed`` (``SimConfig.compute_seconds``);
  on a device that reports a ``memory_bandwidth`` (the ``cpu``), a roofline:
  ``launch_overhead + max(flops / speed, nbytes / memory_bandwidth)``, with
  ``nbytes`` the node's inputs and outputs, so elementwise nodes (one
  operation per element, as many bytes moved) cost what moving their bytes
  costs. Sims report none and keep their exact model;
* every device has one link to the host, ``latency + nbytes / bandwidth``
  (``SimConfig.copy_seconds``); the host (``cpu``) reports an infinite
  bandwidth and no latency, so its own link costs nothing;
* a copy between two different devices costs the slower of their two links:
  ``max(link(src), link(dst))``. That is the sim's device-to-device copy
  (``SimDeviceAPI._copy_within``) exactly, and a host copy as a special case
  (the host's link is free). Between two kinds that stage through host memory
  (``cuda`` to ``sim``) it is optimistic; the links' sum would be the
  pessimistic bound;
* a stream that waits for an event of another device resumes ``sync_latency``
  seconds after the event is reached: nothing for a device-side wait (the
  sim's, CUDA's), a thread wake-up for the ``cpu``, whose streams are host
  threads (measured once per host: tens of microseconds on a quiet
  machine, and paid by every edge into the cpu from another device). So a
  cross-device edge costs its copy plus the destination's ``sync_latency``,
  and a split pays only where it saves more than its edges cost;
* devices whose copies to one another take a path of their own (two
  ``remote`` devices: worker to worker, never through the host) report it as
  ``peer_bandwidth`` and ``peer_latency``; a copy between two such devices of
  one kind costs the slower of their two *peer* links instead.

Null nodes (graph inputs and parameters) and TVM's ``__nop`` cost nothing
anywhere; they run no kernel, so the ``supported`` hook is not asked about
them. Where a kernel exists only for some device kinds, pass ``supported``
and the model answers ``inf`` for the other devices.

:class:`TableCostModel` takes the costs literally: a table of seconds per
``(nid, device)`` (a missing entry means "cannot run there") and a
:class:`Link` per pair of devices. Tests, measured profiles and textbook
examples (the HEFT paper's) use it.

:func:`edge_nbytes` is the bytes an edge carries: the sum of the sizes of the
producer's outputs the consumer reads, each output counted once even when the
consumer reads it as several arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import networkx as nx

from devices import Device

from .dag import edge_uses, node_spec
from .errors import PlanError

__all__ = (
    "AnalyticCostModel",
    "CostModel",
    "DeviceSpeed",
    "Link",
    "Supported",
    "TableCostModel",
    "edge_nbytes",
    "node_nbytes",
    "speed_from_attributes",
    "speeds_from_devices",
    "sync_latency",
)

#: ``supported(nid, device)``: whether a kernel for node ``nid`` exists on
#: ``device`` (kernels are registered per device kind).
Supported = Callable[[int, Device], bool]


class CostModel(Protocol):
    """What a placement policy asks about time."""

    def compute_time(self, nid: int, device: Device) -> float:
        """Seconds node ``nid`` runs on ``device``; ``math.inf`` if it cannot."""
        ...

    def transfer_time(self, nbytes: int, src: Device, dst: Device) -> float:
        """Seconds to copy ``nbytes`` from ``src`` to ``dst`` (0 if the same)."""
        ...


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
            raise PlanError(f"Link.latency must be >= 0, got {self.latency}")
        if not self.bandwidth > 0:
            raise PlanError(f"Link.bandwidth must be > 0, got {self.bandwidth}")

    def seconds(self, nbytes: int) -> float:
        """Duration of one copy of ``nbytes`` over this link.

        :param nbytes: bytes copied.
        :return: ``latency + nbytes / bandwidth``.
        """
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class DeviceSpeed:
    """The speed of one device, as :class:`AnalyticCostModel` uses it.

    :ivar flops: compute speed, floating-point operations per second, ``> 0``.
    :ivar bandwidth: bytes per second over the device's link to the host,
        ``> 0`` (``math.inf`` for the host itself).
    :ivar latency: seconds per copy over that link, ``>= 0``.
    :ivar launch_overhead: seconds added to every node, ``>= 0``.
    :ivar memory_bandwidth: bytes per second a node's inputs and outputs
        move at, ``> 0`` (``math.inf``: memory is never the bound).
    :ivar peer: the link to other devices of the same kind, where copies
        between them do not go through the host (``None``: they use
        :attr:`link`).
    :ivar sync_latency: seconds from an event of another device being
        reached to the device's waiting stream going on, ``>= 0`` (0 for a
        device-side wait).
    """

    flops: float
    bandwidth: float = math.inf
    latency: float = 0.0
    launch_overhead: float = 0.0
    peer: Link | None = None
    memory_bandwidth: float = math.inf
    sync_latency: float = 0.0

    def __post_init__(self) -> None:
        for name in ("flops", "bandwidth", "memory_bandwidth"):
            if not getattr(self, name) > 0:
                raise PlanError(f"DeviceSpeed.{name} must be > 0")
        for name in ("latency", "launch_overhead", "sync_latency"):
            if not getattr(self, name) >= 0:
                raise PlanError(f"DeviceSpeed.{name} must be >= 0")

    @property
    def link(self) -> Link:
        """The device's link to the host."""
        return Link(self.latency, self.bandwidth)

    def compute_seconds(self, work: float, nbytes: int = 0) -> float:
        """Duration of a node doing ``work`` FLOPs over ``nbytes`` of inputs
        and outputs (``SimConfig.compute_seconds`` when memory is no bound).

        :param work: floating-point operations.
        :param nbytes: bytes the node reads and writes.
        :return: ``launch_overhead + max(work / flops, nbytes /
            memory_bandwidth)``.
        """
        return self.launch_overhead + max(
            work / self.flops, nbytes / self.memory_bandwidth
        )

    def copy_seconds(self, nbytes: int) -> float:
        """Duration of a copy over the host link (``SimConfig.copy_seconds``).

        :param nbytes: bytes copied.
        :return: ``latency + nbytes / bandwidth``.
        """
        return self.link.seconds(nbytes)


def speed_from_attributes(device: Device, attrs: Mapping[str, Any]) -> DeviceSpeed:
    """Read a :class:`DeviceSpeed` from DeviceAPI attributes.

    Reads ``flops``, ``host_bandwidth`` (default: infinite), ``host_latency``
    (default 0) and, where a backend reports them, ``launch_overhead``
    (default 0), ``memory_bandwidth`` (default: infinite),
    ``sync_latency`` (default 0) and ``peer_bandwidth`` / ``peer_latency``
    (the peer link):
    the names ``devices.get_api(kind).attributes(dev)`` uses.

    :param device: the device the attributes describe (named in errors).
    :param attrs: the attributes.
    :return: the speed.
    :raises PlanError: if ``flops`` is missing or a value is out of range.
    """
    if "flops" not in attrs:
        raise PlanError(f"device {device} reports no 'flops' attribute")
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
        )
    except (TypeError, ValueError) as exc:
        raise PlanError(f"device {device} reports unusable speeds: {exc}") from exc


def speeds_from_devices(devices: Iterable[Device]) -> dict[Device, DeviceSpeed]:
    """Ask each device's backend for its speeds.

    :param devices: the devices.
    :return: one :class:`DeviceSpeed` per device.
    :raises PlanError: if a backend is missing or reports no ``flops``.
    """
    from devices import get_api
    from devices.errors import AsyncrtError

    speeds: dict[Device, DeviceSpeed] = {}
    for dev in devices:
        try:
            attrs = get_api(dev.kind).attributes(dev)
        except AsyncrtError as exc:
            raise PlanError(f"cannot read the speed of {dev}: {exc}") from exc
        speeds[dev] = speed_from_attributes(dev, attrs)
    return speeds


def edge_nbytes(dag: nx.DiGraph, src: int, dst: int) -> int:
    """Bytes edge ``src -> dst`` carries.

    :param dag: the graph.
    :param src: the producer.
    :param dst: the consumer.
    :return: the sum of the sizes of the distinct outputs of ``src`` that
        ``dst`` reads.
    """
    outputs = node_spec(dag, src).outputs
    indices = {use.output_index for use in edge_uses(dag, src, dst)}
    return sum(outputs[i].nbytes for i in sorted(indices))


def node_nbytes(dag: nx.DiGraph, nid: int) -> int:
    """Bytes node ``nid`` reads and writes: its inputs and outputs.

    :param dag: the graph.
    :param nid: the node.
    :return: the sizes of its input entries (each counted once) and outputs.
    """
    spec = node_spec(dag, nid)
    reads = {(e.nid, e.index) for e in spec.inputs}
    read = sum(node_spec(dag, n).outputs[i].nbytes for n, i in reads)
    return read + sum(out.nbytes for out in spec.outputs)


def sync_latency(cost: CostModel, device: Device) -> float:
    """Seconds a stream of ``device``, blocked on an event, takes to go on
    once the event is reached (a thread wake-up on the ``cpu``): its
    :attr:`DeviceSpeed.sync_latency` in an :class:`AnalyticCostModel`, 0
    in any other model (a table's costs are taken literally).

    :param cost: the cost model.
    :param device: the waiting stream's device.
    """
    if isinstance(cost, AnalyticCostModel) and device in cost.speeds:
        return cost.speeds[device].sync_latency
    return 0.0


def _always(nid: int, device: Device) -> bool:
    return True


class AnalyticCostModel:
    """Time from the DAG's ``flops`` and each device's :class:`DeviceSpeed`.

    :param dag: the graph.
    :param device_specs: the speed of every device placement may use.
    :param supported: whether node ``nid`` has a kernel on a device; nodes
        get ``inf`` where it says no. Default: everywhere.
    """

    def __init__(
        self,
        dag: nx.DiGraph,
        device_specs: Mapping[Device, DeviceSpeed],
        supported: Supported | None = None,
    ) -> None:
        self._dag = dag
        self._speeds: Mapping[Device, DeviceSpeed] = MappingProxyType(
            dict(device_specs)
        )
        self._supported = supported if supported is not None else _always

    @classmethod
    def from_devices(
        cls,
        dag: nx.DiGraph,
        devices: Iterable[Device],
        supported: Supported | None = None,
    ) -> AnalyticCostModel:
        """Build the model from the devices' own attributes.

        :param dag: the graph.
        :param devices: the devices.
        :param supported: see the class.
        :return: the model.
        :raises PlanError: if a device reports no speed.
        """
        return cls(dag, speeds_from_devices(devices), supported)

    @property
    def speeds(self) -> Mapping[Device, DeviceSpeed]:
        """The speed of each device."""
        return self._speeds

    def _speed(self, device: Device) -> DeviceSpeed:
        try:
            return self._speeds[device]
        except KeyError:
            raise PlanError(f"the cost model knows no speed for {device}") from None

    def compute_time(self, nid: int, device: Device) -> float:
        """Seconds node ``nid`` runs on ``device``.

        :param nid: the node.
        :param device: the device.
        :return: 0 for null and ``__nop`` nodes; ``inf`` where ``supported``
            says no; else :meth:`DeviceSpeed.compute_seconds` of the node's
            ``flops`` and, where the device's memory bandwidth is finite,
            the bytes of its inputs and outputs.
        :raises PlanError: if the model has no speed for ``device``.
        """
        speed = self._speed(device)
        spec = node_spec(self._dag, nid)
        if spec.is_null or spec.is_nop:
            return 0.0
        if not self._supported(nid, device):
            return math.inf
        if math.isinf(speed.memory_bandwidth):
            return speed.compute_seconds(spec.flops)
        return speed.compute_seconds(spec.flops, node_nbytes(self._dag, nid))

    def transfer_time(self, nbytes: int, src: Device, dst: Device) -> float:
        """Seconds to copy ``nbytes`` from ``src`` to ``dst``.

        :param nbytes: bytes copied.
        :param src: where they are.
        :param dst: where they go.
        :return: 0 on the same device; else the copy plus ``dst``'s
            ``sync_latency``, the copy over the slower of the two peer links
            between two devices of one kind that both have one, else over
            the slower of the two host links.
        :raises PlanError: if the model has no speed for either device.
        """
        if src == dst:
            return 0.0
        here, there = self._speed(src), self._speed(dst)
        if src.kind == dst.kind and here.peer is not None and there.peer is not None:
            copy = max(here.peer.seconds(nbytes), there.peer.seconds(nbytes))
        else:
            copy = max(here.copy_seconds(nbytes), there.copy_seconds(nbytes))
        return copy + there.sync_latency


class TableCostModel:
    """Costs given literally: seconds per ``(nid, device)`` and links per pair.

    :param compute: seconds per ``(nid, device)``; a missing entry means the
        node cannot run on that device (``inf``), except for null and
        ``__nop`` nodes when ``dag`` is given, which cost 0 everywhere.
    :param links: the link between two devices, keyed ``(src, dst)``; a
        ``(dst, src)`` entry serves both directions when ``(src, dst)`` is
        absent.
    :param default_link: the link between pairs not in ``links``.
    :param dag: the graph, to recognise null and ``__nop`` nodes (optional).
    :param supported: as for :class:`AnalyticCostModel`.
    """

    def __init__(
        self,
        compute: Mapping[tuple[int, Device], float],
        links: Mapping[tuple[Device, Device], Link] | None = None,
        default_link: Link = Link(0.0, 1.0),
        dag: nx.DiGraph | None = None,
        supported: Supported | None = None,
    ) -> None:
        for key, seconds in compute.items():
            if not seconds >= 0:
                raise PlanError(f"compute time of {key} must be >= 0, got {seconds}")
        self._compute = MappingProxyType(dict(compute))
        self._links = MappingProxyType(dict(links or {}))
        self._default_link = default_link
        self._dag = dag
        self._supported = supported if supported is not None else _always

    def compute_time(self, nid: int, device: Device) -> float:
        """Seconds node ``nid`` runs on ``device``, from the table.

        :param nid: the node.
        :param device: the device.
        :return: the table's entry; ``inf`` if absent or ``supported`` says
            no; 0 for null and ``__nop`` nodes of ``dag``.
        """
        if self._dag is not None and nid in self._dag:
            spec = node_spec(self._dag, nid)
            if spec.is_null or spec.is_nop:
                return 0.0
        if not self._supported(nid, device):
            return math.inf
        return self._compute.get((nid, device), math.inf)

    def transfer_time(self, nbytes: int, src: Device, dst: Device) -> float:
        """Seconds to copy ``nbytes`` over the link from ``src`` to ``dst``.

        :param nbytes: bytes copied.
        :param src: where they are.
        :param dst: where they go.
        :return: 0 on the same device, else the link's ``seconds(nbytes)``.
        """
        if src == dst:
            return 0.0
        link = self._links.get((src, dst)) or self._links.get((dst, src))
        return (link or self._default_link).seconds(nbytes)
