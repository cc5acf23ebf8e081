"""Cost models: how long a node takes on a device, and a copy between two.

Placement policies (:mod:`scheduler.placement`) never look at flops, bytes or
link speeds themselves; they ask a :class:`CostModel` two questions:

* ``compute_time(nid, device)``: seconds node ``nid`` runs on ``device``,
  ``math.inf`` where it cannot run there (no kernel for that kind);
* ``transfer_time(nbytes, src, dst)``: seconds to copy ``nbytes`` from
  ``src`` to ``dst``, ``0`` when they are the same device.

Two models ship here.

:class:`AnalyticCostModel` turns the DAG's estimates into time with one
:class:`~devices.DeviceSpeed` per device and the timing model's formulas,
which live once, in :mod:`devices._timing`: the simulated accelerator charges
its calls and copies by the same ones, so for ``sim`` devices the model is
exact by construction.

* a node takes :meth:`DeviceSpeed.compute_seconds` of its ``flops`` and, on
  a device that reports a finite ``memory_bandwidth`` (the host), the bytes
  of its inputs and outputs: ``launch_overhead + max(flops / speed, nbytes /
  memory_bandwidth)``, so elementwise nodes (one operation per element, as
  many bytes moved) cost what moving their bytes costs;
* a copy between two different devices takes
  :func:`devices.transfer_seconds`: the slower of their two links, their
  peer links where both have one and they are of one kind (two ``remote``
  devices: worker to worker, never through the host). The host reports a
  free link, so a copy to or from it is the other device's link. Between two
  kinds that stage through host memory (``cuda`` to ``sim``) it is
  optimistic; the links' sum would be the pessimistic bound;
* a stream that waits for an event of another device resumes
  ``sync_latency`` seconds after the event is reached: nothing for a
  device-side wait (the sim's, CUDA's), a thread wake-up for the host,
  whose streams are host threads (measured once per machine: tens of
  microseconds on a quiet one, and paid by every edge into the host from
  another device). So a cross-device edge costs its copy plus the
  destination's ``sync_latency``, and a split pays only where it saves more
  than its edges cost.

Null nodes (graph inputs and parameters) and TVM's ``__nop`` cost nothing
anywhere; they run no kernel, so the ``supported`` hook is not asked about
them. Where a kernel exists only for some device kinds, pass ``supported``
and the model answers ``inf`` for the other devices.

:class:`TableCostModel` takes the costs literally: a table of seconds per
``(nid, device)`` (a missing entry means "cannot run there") and a
:class:`Link` per pair of devices. Tests, measured profiles and textbook
examples (the HEFT paper's) use it.

A plan run on streams also pays their **start** before its first work
(:func:`start_latency`): the host issues every step of the run, then the
first stream's thread wakes up. An :class:`AnalyticCostModel` takes it from
the host-facing device's figures (its ``issue_overhead`` per step and its
``sync_latency``: measured once per machine for the host), a
:class:`TableCostModel` from its literal :class:`StartCost`; a plan that
:func:`runs_inline` (one stream of the host) starts at once. The cost model
is all planning reads, so the same graph and the same figures always give
the same plan.

:func:`edge_nbytes` is the bytes an edge carries: the sum of the sizes of the
producer's outputs the consumer reads, each output counted once even when the
consumer reads it as several arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import networkx as nx

from devices import Device, DeviceSpeed, Link, get_api, transfer_seconds
from devices._timing import speed_from_attributes as _device_speed
from devices.errors import ArgumentError, AsyncrtError

from .dag import edge_uses, node_spec
from .errors import PlanError

if TYPE_CHECKING:
    from .plan import Plan

__all__ = (
    "AnalyticCostModel",
    "CostModel",
    "DeviceSpeed",
    "Link",
    "StartCost",
    "Supported",
    "TableCostModel",
    "edge_nbytes",
    "node_nbytes",
    "runs_inline",
    "speed_from_attributes",
    "speeds_from_devices",
    "start_latency",
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
class StartCost:
    """What a run on streams pays before its first work, taken literally.

    :ivar per_step: seconds the host spends issuing each step, ``>= 0``.
    :ivar wake: seconds the first stream's thread takes to wake, ``>= 0``.
    """

    per_step: float = 0.0
    wake: float = 0.0

    def __post_init__(self) -> None:
        if not (self.per_step >= 0 and self.wake >= 0):
            raise PlanError(f"StartCost figures must be >= 0, got {self}")

    def seconds(self, steps: int) -> float:
        """``per_step * steps + wake``.

        :param steps: steps the host issues.
        """
        return self.per_step * steps + self.wake


def speed_from_attributes(device: Device, attrs: Mapping[str, Any]) -> DeviceSpeed:
    """Read a :class:`~devices.DeviceSpeed` from DeviceAPI attributes (the
    names :meth:`devices.DeviceAPI.attributes` uses: ``flops``,
    ``host_bandwidth``, ``host_latency``, ``launch_overhead``,
    ``memory_bandwidth``, ``sync_latency``, ``issue_overhead``,
    ``peer_bandwidth`` and ``peer_latency``).

    :param device: the device the attributes describe (named in errors).
    :param attrs: the attributes.
    :return: the speed.
    :raises PlanError: if ``flops`` is missing or a value is out of range.
    """
    try:
        return _device_speed(attrs, str(attrs.get("speed_source", "")))
    except ArgumentError as exc:
        raise PlanError(f"device {device} reports unusable speeds: {exc}") from exc


def speeds_from_devices(devices: Iterable[Device]) -> dict[Device, DeviceSpeed]:
    """Ask each device's backend for its speeds
    (:meth:`devices.DeviceAPI.speed`).

    :param devices: the devices.
    :return: one :class:`~devices.DeviceSpeed` per device.
    :raises PlanError: if a backend is missing or reports no ``flops``.
    """
    speeds: dict[Device, DeviceSpeed] = {}
    for dev in devices:
        try:
            speeds[dev] = get_api(dev.kind).speed(dev)
        except AsyncrtError as exc:
            raise PlanError(f"cannot read the speed of {dev}: {exc}") from exc
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
    once the event is reached (a thread wake-up on the host): its
    :attr:`~devices.DeviceSpeed.sync_latency` in an
    :class:`AnalyticCostModel`, 0 in any other model (a table's costs are
    taken literally).

    :param cost: the cost model.
    :param device: the waiting stream's device.
    """
    if isinstance(cost, AnalyticCostModel) and device in cost.speeds:
        return cost.speeds[device].sync_latency
    return 0.0


def runs_inline(plan: Plan) -> bool:
    """Whether a plan runs on the calling thread: one stream, of the host
    (:attr:`devices.DeviceAPI.is_host`), whose calls the caller may as well
    make itself (:meth:`scheduler.dispatch.Program.run_sync` does, when its
    program has no coroutine kernels and no tracer).

    :param plan: the plan.
    """
    return len(plan.streams) == 1 and get_api(plan.streams[0].device).is_host


def start_latency(cost: CostModel, plan: Plan) -> float:
    """Predicted seconds from a run of ``plan`` being issued to its first
    work, beyond what a plan run inline pays (see the module docstring).

    The host issues every step of the run (a batch, a record or a wait each,
    and one final record per stream), then the first stream's thread wakes
    up: :meth:`~devices.DeviceSpeed.start_seconds` of the host-facing
    device in an :class:`AnalyticCostModel`, the table's
    :class:`StartCost` in a :class:`TableCostModel`, 0 in any other model.

    :param cost: the cost model.
    :param plan: the plan.
    :return: 0 for a plan that :func:`runs_inline`.
    """
    if runs_inline(plan):
        return 0.0
    steps = len(plan.order) + len(plan.streams)
    if isinstance(cost, AnalyticCostModel) and plan.host in cost.speeds:
        return cost.speeds[plan.host].start_seconds(steps)
    if isinstance(cost, TableCostModel):
        return cost.start.seconds(steps)
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
        same_kind = src.kind == dst.kind
        copy = transfer_seconds(here, there, nbytes, same_kind=same_kind)
        return copy + there.sync_latency


#: A table's link between pairs it does not list: one byte per second.
_UNIT_LINK = Link(0.0, 1.0)


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
    :param start: what a run on streams pays before its first work
        (:func:`start_latency`); default: nothing.
    """

    def __init__(
        self,
        compute: Mapping[tuple[int, Device], float],
        links: Mapping[tuple[Device, Device], Link] | None = None,
        default_link: Link = _UNIT_LINK,
        dag: nx.DiGraph | None = None,
        supported: Supported | None = None,
        start: StartCost = StartCost(),
    ) -> None:
        for key, seconds in compute.items():
            if not seconds >= 0:
                raise PlanError(f"compute time of {key} must be >= 0, got {seconds}")
        self._compute = MappingProxyType(dict(compute))
        self._links = MappingProxyType(dict(links or {}))
        self._default_link = default_link
        self._dag = dag
        self._supported = supported if supported is not None else _always
        self.start = start

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
