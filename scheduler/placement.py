"""Placement policies: which device runs each node, and when it is predicted
to run.

A policy is a function ``policy(dag, devices, cost) -> Placement``: the DAG
(:mod:`scheduler.dag`), the devices with the host-facing one first, and a
:class:`~scheduler.cost.CostModel`. It returns a frozen :class:`Placement`:
the device of every node, the predicted start and finish of every node, the
order of the nodes on each device (a later pass builds streams from it) and
the predicted makespan.

The machine model (every policy here predicts with the same one, so their
makespans compare):

* each device runs one node at a time; a node runs ``compute_time`` seconds;
* an edge ``u -> v`` between two devices delays ``v`` by
  ``transfer_time(edge_nbytes(u, v), dev(u), dev(v))`` after ``u`` finishes
  (:func:`scheduler.cost.edge_nbytes`: the outputs of ``u`` that ``v``
  reads). Copies do not occupy the devices and links have no contention (the
  HEFT paper's model). One copy per (tensor, consumer device) is what copy
  insertion should make; as a copy starts when its producer finishes and
  links are contention-free, sharing it between two consumers on the same
  device changes no predicted time, so the estimate is the same either way;
* the graph's heads must reach the host-facing device ``devices[0]``: the
  makespan includes copying them back, and the policies below add that copy
  when they choose a device for a head's producer;
* null nodes (graph inputs and parameters) run nothing and live on the host
  device, so an edge from an input to a node elsewhere costs a copy; one
  from a parameter costs nothing (parameters are copied to the devices that
  read them once, when they are loaded).

Pins, resolved by :func:`resolve_pins` before any policy choice:

* ``NodeSpec.device``: the node runs there (:class:`PlanError` if that device
  is not in the list);
* ``NodeSpec.device_type`` (a DLPack code, TVM's ``device_index``): the first
  listed device of that type, as its backend reports it
  (:attr:`devices.DeviceAPI.dlpack_device_type`: ``cpu`` 1, ``cuda`` 2,
  ...). A code that no
  listed device has is *ignored*: the node is free. ``sim`` devices have no
  DLPack code, and TVM files pin every node to ``1`` (cpu) even when the
  compiler had one target, so this is what lets a TVM graph built for the
  cpu spread over ``[sim:0, sim:1]``; with a cpu in the list those nodes stay
  on it, as TVM's heterogeneous executor would do;
* null nodes without a pin: the host-facing device;
* TVM's ``__nop`` (its output aliases input 0): the device of its input 0,
  unless pinned itself.

The policies:

``single_device(d)``
    everything on ``d`` (pins still hold), ordered by upward rank.

``heft`` (Topcuoglu, Hariri and Wu, IEEE TPDS 2002)
    ``rank_u(n) = mean_w(n) + max over successors s of (mean_c(n, s) +
    rank_u(s))``, where ``mean_w`` is the mean compute time over the devices
    that can run ``n`` and ``mean_c`` the mean transfer time of the edge over
    ordered pairs of *different* such devices (the paper's average
    communication cost). Nodes are taken by decreasing ``rank_u`` (ties: the
    lower topological position) and each goes to the device giving the
    earliest finish time, inserted into the earliest idle gap that fits
    ("insertion-based"); ties go to the earlier listed device.

``peft`` (Arabnejad and Barbosa, IEEE TPDS 2014)
    an Optimistic Cost Table ``OCT(n, p) = max over successors s of min over
    devices q of (OCT(s, q) + w(s, q) + c(n, s, p, q))``, 0 for exit nodes:
    how long the rest of the graph needs at least once ``n`` finished on
    ``p``, each successor on its best device. Here ``c`` is the cost model's
    real transfer time from ``p`` to ``q`` (0 when ``p == q``) rather than the
    paper's average, which it equals on the paper's uniform links. Ready
    nodes are taken by decreasing ``rank_oct(n)`` (the mean of ``OCT(n, .)``)
    and each goes to the device minimising ``EFT + OCT``.

``lookahead`` (after Bittencourt, Sakellariou and Madeira, PDP 2010)
    HEFT's order, but each node goes to the device after which its children
    can finish soonest (each child's earliest finish over its devices, given
    the node's tentative slot and the inputs placed so far), not the device
    where the node itself finishes soonest. On random graphs from the HEFT
    paper's generator it beats both HEFT and PEFT (``bench/bench_placement.py``).

``best_of(*policies)``
    the plan with the smallest predicted makespan (ties: the first given).

``guarded(policy)``
    ``policy``'s plan unless everything on one device is predicted faster:
    for each device that can run every free node, :func:`single_device`; the
    best of those replaces the policy's plan if that is strictly worse. So a
    guarded plan is never predicted slower than the single fastest device.

:func:`get_policy` resolves names: ``"single"`` (everything on the
host-facing device), ``"fastest"`` (the single fastest device), ``"heft"``,
``"peft"``, ``"lookahead"`` (guarded unless ``guard=False``) and ``"auto"``
(the guarded best of HEFT, PEFT and lookahead). A callable is used as given.
:func:`place` resolves, runs and checks a policy's result.

Everything is deterministic: nodes tie-break by topological position (the
lowest node id first among ready ones), devices by their order in the list.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import networkx as nx

from devices import Device, get_api
from devices.errors import DeviceNotFoundError

from .cost import CostModel, edge_nbytes
from .dag import graph_spec, node_spec
from .errors import PlanError

__all__ = (
    "POLICY_NAMES",
    "Placement",
    "Policy",
    "best_of",
    "dlpack_code",
    "evaluate",
    "fastest_single",
    "get_policy",
    "guarded",
    "heft",
    "lookahead",
    "optimistic_cost_table",
    "peft",
    "place",
    "resolve_pins",
    "single_device",
    "upward_ranks",
)


@dataclass(frozen=True)
class Placement:
    """Where each node runs and the policy's predicted schedule.

    :ivar device_of: the device of every node.
    :ivar start: predicted start of every node, seconds from the run's start.
    :ivar finish: predicted finish of every node.
    :ivar order: per device, its nodes by predicted start (dependencies
        respected: a producer on the same device comes first).
    :ivar makespan: predicted time until every head is on the host device.
    :ivar policy: which policy made it, such as ``"heft"`` or
        ``"single(sim:0)"``.
    """

    device_of: Mapping[int, Device]
    start: Mapping[int, float]
    finish: Mapping[int, float]
    order: Mapping[Device, tuple[int, ...]]
    makespan: float
    policy: str


#: A placement policy.
Policy = Callable[[nx.DiGraph, Sequence[Device], CostModel], Placement]

#: The names :func:`get_policy` knows.
POLICY_NAMES = ("auto", "fastest", "heft", "lookahead", "peft", "single")


def dlpack_code(device: Device) -> int | None:
    """The DLPack device-type code of ``device``'s kind
    (:attr:`devices.DeviceAPI.dlpack_device_type`), or ``None`` (the
    simulated accelerator has none, nor a kind no backend provides here).

    :param device: the device.
    :return: the code or ``None``.
    """
    try:
        return get_api(device).dlpack_device_type
    except DeviceNotFoundError:
        return None


def resolve_pins(dag: nx.DiGraph, devices: Sequence[Device]) -> dict[int, Device]:
    """The nodes whose device is fixed before any policy choice.

    See the module docstring: ``device`` pins, ``device_type`` pins matched
    to the first listed device of that type (ignored if none has it), and
    null nodes on ``devices[0]``.

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :return: node id to device, for the pinned nodes only.
    :raises PlanError: if ``devices`` is empty or a node is pinned to a device
        not in it.
    """
    if not devices:
        raise PlanError("no device to place onto")
    by_code: dict[int, Device] = {}
    for dev in devices:
        code = dlpack_code(dev)
        if code is not None:
            by_code.setdefault(code, dev)
    pins: dict[int, Device] = {}
    for nid in dag.nodes:
        spec = node_spec(dag, nid)
        if spec.device is not None:
            if spec.device not in devices:
                listed = ", ".join(str(d) for d in devices)
                raise PlanError(
                    f"node {spec.name!r} (id {nid}) is pinned to {spec.device}, "
                    f"which is not among the devices given ({listed})"
                )
            pins[nid] = spec.device
        elif spec.device_type is not None and spec.device_type in by_code:
            pins[nid] = by_code[spec.device_type]
        elif spec.is_null:
            pins[nid] = devices[0]
    return pins


class _Problem:
    """Everything the policies share about one (dag, devices, cost)."""

    def __init__(
        self, dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> None:
        if len(set(devices)) != len(devices):
            raise PlanError(f"devices listed twice: {[str(d) for d in devices]}")
        self.dag = dag
        self.devices = tuple(devices)
        self.cost = cost
        self.host = self.devices[0] if self.devices else None
        self.pins = resolve_pins(dag, devices)
        self.topo: tuple[int, ...] = tuple(nx.lexicographical_topological_sort(dag))
        self.pos = {nid: i for i, nid in enumerate(self.topo)}
        self.preds = {n: tuple(sorted(dag.predecessors(n))) for n in self.topo}
        self.succs = {n: tuple(sorted(dag.successors(n))) for n in self.topo}
        self.nbytes = {(u, v): edge_nbytes(dag, u, v) for u, v in dag.edges}
        # Parameters are copied to the devices that read them once, before
        # any run (scheduler.lowering): reading one elsewhere costs no time.
        self.params = frozenset(graph_spec(dag).params)
        # A __nop runs where its input 0 is (its output aliases that storage).
        self.follows: dict[int, int] = {}
        for nid in self.topo:
            spec = node_spec(dag, nid)
            if spec.is_nop and nid not in self.pins and spec.inputs:
                self.follows[nid] = spec.inputs[0].nid
        head_bytes: dict[int, int] = {}
        for entry in graph_spec(dag).heads:
            outputs = node_spec(dag, entry.nid).outputs
            head_bytes[entry.nid] = (
                head_bytes.get(entry.nid, 0) + outputs[entry.index].nbytes
            )
        self.head_bytes = head_bytes
        self.time = {
            (n, d): cost.compute_time(n, d) for n in self.topo for d in self.devices
        }
        self.feasible: dict[int, tuple[Device, ...]] = {}
        for nid in self.topo:
            self.feasible[nid] = self._feasible(nid)

    def _feasible(self, nid: int) -> tuple[Device, ...]:
        name = node_spec(self.dag, nid).name
        if nid in self.pins:
            pin = self.pins[nid]
            if math.isinf(self.time[nid, pin]):
                raise PlanError(
                    f"node {name!r} (id {nid}) is pinned to {pin}, "
                    "which cannot run it (no kernel there)"
                )
            return (pin,)
        if nid in self.follows:
            return self.devices
        able = tuple(d for d in self.devices if not math.isinf(self.time[nid, d]))
        if not able:
            listed = ", ".join(str(d) for d in self.devices)
            raise PlanError(
                f"node {name!r} (id {nid}) cannot run on any device given ({listed})"
            )
        return able

    def edge_time(self, u: int, v: int, src: Device, dst: Device) -> float:
        if src == dst or u in self.params:
            return 0.0
        return self.cost.transfer_time(self.nbytes[u, v], src, dst)

    def head_time(self, nid: int, device: Device) -> float:
        """Seconds to bring ``nid``'s head outputs to the host from ``device``."""
        nbytes = self.head_bytes.get(nid)
        if nbytes is None or self.host is None or device == self.host:
            return 0.0
        return self.cost.transfer_time(nbytes, device, self.host)

    def mean_time(self, nid: int) -> float:
        able = self.feasible[nid]
        return sum(self.time[nid, d] for d in able) / len(able)

    def mean_edge_time(self, u: int, v: int) -> float:
        """The edge's mean transfer time over pairs of different devices."""
        if self.follows.get(v) == u:
            return 0.0
        total, count = 0.0, 0
        for p in self.feasible[u]:
            for q in self.feasible[v]:
                if p != q:
                    total += self.edge_time(u, v, p, q)
                    count += 1
        return total / count if count else 0.0

    def can_run_all(self, device: Device) -> bool:
        """Whether every free node can run on ``device``."""
        return all(
            device in self.feasible[n]
            for n in self.topo
            if n not in self.pins and n not in self.follows
        )


class _Timeline:
    """The busy intervals of one device, sorted and disjoint."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.finishes: list[float] = []

    def earliest(self, ready: float, duration: float) -> float:
        """The earliest start ``>= ready`` of an idle gap ``duration`` long
        (for ``duration`` 0: the earliest idle instant, never inside a busy
        interval)."""
        t = ready
        for j in range(bisect_right(self.finishes, ready), len(self.starts)):
            if t + duration <= self.starts[j]:
                return t
            t = max(t, self.finishes[j])
        return t

    def add(self, start: float, finish: float) -> None:
        if finish > start:
            insort(self.starts, start)
            insort(self.finishes, finish)


@dataclass
class _Partial:
    """A list schedule in the making: where and when the nodes placed so
    far run, and each device's busy intervals."""

    device_of: dict[int, Device]
    finish: dict[int, float]
    lines: dict[Device, _Timeline]


#: ``choose(nid, candidates, partial) -> device``: given each candidate
#: device's (start, finish) and the schedule so far, pick one.
_Chooser = Callable[[int, Mapping[Device, tuple[float, float]], _Partial], Device]


def _list_schedule(
    problem: _Problem,
    priority: Mapping[int, float],
    choose: _Chooser,
    name: str,
    assigned: Mapping[int, Device] | None = None,
) -> Placement:
    """Take ready nodes by decreasing ``priority`` and place each.

    Candidates are the node's pin, the device its ``__nop`` follows, the
    device ``assigned`` gives, or else every device that can run it.
    """
    device_of: dict[int, Device] = {}
    start: dict[int, float] = {}
    finish: dict[int, float] = {}
    lines = {d: _Timeline() for d in problem.devices}
    partial = _Partial(device_of, finish, lines)
    waiting = {n: len(problem.preds[n]) for n in problem.topo}
    ready = [(-priority[n], problem.pos[n], n) for n in problem.topo if not waiting[n]]
    heapq.heapify(ready)
    while ready:
        _, _, nid = heapq.heappop(ready)
        if nid in problem.follows:
            candidates: Sequence[Device] = (device_of[problem.follows[nid]],)
        elif assigned is not None and nid not in problem.pins:
            candidates = (assigned[nid],)
        else:
            candidates = problem.feasible[nid]
        options: dict[Device, tuple[float, float]] = {}
        for dev in candidates:
            arrive = max(
                (
                    finish[u] + problem.edge_time(u, nid, device_of[u], dev)
                    for u in problem.preds[nid]
                ),
                default=0.0,
            )
            duration = problem.time[nid, dev]
            begin = lines[dev].earliest(arrive, duration)
            options[dev] = (begin, begin + duration)
        dev = candidates[0] if len(candidates) == 1 else choose(nid, options, partial)
        device_of[nid] = dev
        start[nid], finish[nid] = options[dev]
        lines[dev].add(start[nid], finish[nid])
        for s in problem.succs[nid]:
            waiting[s] -= 1
            if not waiting[s]:
                heapq.heappush(ready, (-priority[s], problem.pos[s], s))
    return _assemble(problem, device_of, start, finish, name)


def _assemble(
    problem: _Problem,
    device_of: dict[int, Device],
    start: dict[int, float],
    finish: dict[int, float],
    name: str,
) -> Placement:
    per_device: dict[Device, list[int]] = {d: [] for d in problem.devices}
    for nid in problem.topo:
        per_device[device_of[nid]].append(nid)
    order = {
        d: tuple(sorted(nids, key=lambda n: (start[n], finish[n], problem.pos[n])))
        for d, nids in per_device.items()
    }
    makespan = max(
        (finish[n] + problem.head_time(n, device_of[n]) for n in problem.topo),
        default=0.0,
    )
    return Placement(
        device_of=MappingProxyType(device_of),
        start=MappingProxyType(start),
        finish=MappingProxyType(finish),
        order=MappingProxyType(order),
        makespan=makespan,
        policy=name,
    )


def _upward(
    problem: _Problem,
    weight: Callable[[int], float],
    comm: Callable[[int, int], float],
) -> dict[int, float]:
    rank: dict[int, float] = {}
    for nid in reversed(problem.topo):
        rank[nid] = weight(nid) + max(
            (comm(nid, s) + rank[s] for s in problem.succs[nid]), default=0.0
        )
    return rank


def upward_ranks(
    dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
) -> dict[int, float]:
    """HEFT's upward rank of every node (mean compute, mean communication).

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :return: node id to ``rank_u``.
    :raises PlanError: if a node cannot run anywhere or a pin is invalid.
    """
    problem = _Problem(dag, devices, cost)
    return _upward(problem, problem.mean_time, problem.mean_edge_time)


def _by_finish(problem: _Problem) -> _Chooser:
    def choose(
        nid: int, options: Mapping[Device, tuple[float, float]], _: _Partial
    ) -> Device:
        return min(
            options,
            key=lambda d: (options[d][1] + problem.head_time(nid, d),),
        )

    return choose


def heft(dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel) -> Placement:
    """HEFT: upward rank, insertion-based earliest finish time.

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :return: the placement.
    :raises PlanError: if a node cannot run anywhere or a pin is invalid.
    """
    return _in_upward_rank_order(dag, devices, cost, _by_finish, "heft")


def _in_upward_rank_order(
    dag: nx.DiGraph,
    devices: Sequence[Device],
    cost: CostModel,
    chooser: Callable[[_Problem], _Chooser],
    name: str,
) -> Placement:
    """A list schedule in HEFT's order (upward rank on mean costs), each
    node's device picked by ``chooser``."""
    problem = _Problem(dag, devices, cost)
    rank = _upward(problem, problem.mean_time, problem.mean_edge_time)
    return _list_schedule(problem, rank, chooser(problem), name)


def _oct(problem: _Problem) -> dict[int, dict[Device, float]]:
    table: dict[int, dict[Device, float]] = {}
    for nid in reversed(problem.topo):
        row: dict[Device, float] = {}
        for p in problem.devices:
            need = problem.head_time(nid, p)
            for s in problem.succs[nid]:
                if problem.follows.get(s) == nid:
                    best = table[s][p]
                else:
                    best = min(
                        table[s][q]
                        + problem.time[s, q]
                        + problem.edge_time(nid, s, p, q)
                        for q in problem.feasible[s]
                    )
                need = max(need, best)
            row[p] = need
        table[nid] = row
    return table


def optimistic_cost_table(
    dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
) -> dict[int, dict[Device, float]]:
    """PEFT's Optimistic Cost Table ``OCT(n, p)`` (see the module docstring).

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :return: node id to device to seconds.
    :raises PlanError: if a node cannot run anywhere or a pin is invalid.
    """
    return _oct(_Problem(dag, devices, cost))


def peft(dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel) -> Placement:
    """PEFT: Optimistic Cost Table lookahead, minimum ``EFT + OCT``.

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :return: the placement.
    :raises PlanError: if a node cannot run anywhere or a pin is invalid.
    """
    problem = _Problem(dag, devices, cost)
    table = _oct(problem)
    rank = {
        n: sum(table[n][d] for d in problem.feasible[n]) / len(problem.feasible[n])
        for n in problem.topo
    }

    def choose(
        nid: int, options: Mapping[Device, tuple[float, float]], _: _Partial
    ) -> Device:
        return min(options, key=lambda d: options[d][1] + table[nid][d])

    return _list_schedule(problem, rank, choose, "peft")


def _by_lookahead(problem: _Problem) -> _Chooser:
    """Choose the device after which the node's children can finish
    soonest: each child's earliest finish over its devices, given this
    node's tentative slot and its other inputs placed so far (those not
    placed yet are taken as ready), worst child first; the node's own finish
    breaks ties. A node without children scores its own finish plus the
    copy of its outputs to the host."""

    def child_finish(
        nid: int,
        dev: Device,
        end: float,
        line: _Timeline,
        child: int,
        partial: _Partial,
    ) -> float:
        best = math.inf
        for q in problem.feasible[child]:
            arrive = end + problem.edge_time(nid, child, dev, q)
            for u in problem.preds[child]:
                if u != nid and u in partial.finish:
                    arrive = max(
                        arrive,
                        partial.finish[u]
                        + problem.edge_time(u, child, partial.device_of[u], q),
                    )
            duration = problem.time[child, q]
            busy = line if q == dev else partial.lines[q]
            best = min(best, busy.earliest(arrive, duration) + duration)
        return best

    def choose(
        nid: int, options: Mapping[Device, tuple[float, float]], partial: _Partial
    ) -> Device:
        def score(dev: Device) -> tuple[float, float]:
            begin, end = options[dev]
            children = problem.succs[nid]
            if not children:
                return (end + problem.head_time(nid, dev), end)
            line = _Timeline()  # the device's intervals with this node's slot
            line.starts = list(partial.lines[dev].starts)
            line.finishes = list(partial.lines[dev].finishes)
            line.add(begin, end)
            worst = max(child_finish(nid, dev, end, line, c, partial) for c in children)
            return (worst, end)

        return min(options, key=score)

    return choose


def lookahead(dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel) -> Placement:
    """HEFT's order with a one-level lookahead (after Bittencourt, Sakellariou
    and Madeira, "DAG Scheduling Using a Lookahead Variant of the
    Heterogeneous Earliest Finish Time Algorithm", PDP 2010): each node goes
    to the device that lets its children finish soonest, not the one where
    it finishes soonest itself.

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :return: the placement.
    :raises PlanError: if a node cannot run anywhere or a pin is invalid.
    """
    return _in_upward_rank_order(dag, devices, cost, _by_lookahead, "lookahead")


def _fixed(problem: _Problem, device_of: Mapping[int, Device], name: str) -> Placement:
    """Schedule a given assignment: ready nodes by upward rank on its costs."""

    def weight(nid: int) -> float:
        return problem.time[nid, _device(nid)]

    def _device(nid: int) -> Device:
        if nid in problem.pins:
            return problem.pins[nid]
        if nid in problem.follows:
            return _device(problem.follows[nid])
        return device_of[nid]

    def comm(u: int, v: int) -> float:
        return problem.edge_time(u, v, _device(u), _device(v))

    for nid in problem.topo:
        if math.isinf(weight(nid)):
            spec = node_spec(problem.dag, nid)
            raise PlanError(
                f"node {spec.name!r} (id {nid}) cannot run on {_device(nid)}"
            )
    rank = _upward(problem, weight, comm)
    assigned = {n: _device(n) for n in problem.topo}
    return _list_schedule(problem, rank, _by_finish(problem), name, assigned)


def evaluate(
    dag: nx.DiGraph,
    devices: Sequence[Device],
    cost: CostModel,
    device_of: Mapping[int, Device],
    name: str = "given",
) -> Placement:
    """Predict the schedule of a given assignment (pins and ``__nop`` still
    hold over it).

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :param device_of: the device of every free node.
    :param name: the :attr:`Placement.policy` of the result.
    :return: the placement, ordered by upward rank on the given devices.
    :raises PlanError: if a free node has no device in ``device_of``, or one
        that is not listed or cannot run it, or a pin is invalid.
    """
    problem = _Problem(dag, devices, cost)
    for nid in problem.topo:
        if nid in problem.pins or nid in problem.follows:
            continue
        if device_of.get(nid) not in problem.devices:
            spec = node_spec(dag, nid)
            raise PlanError(
                f"node {spec.name!r} (id {nid}) is given no listed device "
                f"(got {device_of.get(nid)})"
            )
    return _fixed(problem, device_of, name)


def single_device(device: Device) -> Policy:
    """A policy that runs every free node on ``device``.

    :param device: the device.
    :return: the policy; it raises :class:`PlanError` if ``device`` is not
        listed or cannot run a free node.
    """

    def policy(
        dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> Placement:
        if device not in devices:
            raise PlanError(f"{device} is not among the devices given")
        problem = _Problem(dag, devices, cost)
        return _fixed(problem, dict.fromkeys(problem.topo, device), f"single({device})")

    return policy


def fastest_single(
    dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
) -> Placement:
    """Everything on the one device predicted fastest (pins still hold).

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :return: the best :func:`single_device` placement (ties: the earlier
        listed device).
    :raises PlanError: if no device can run every free node.
    """
    problem = _Problem(dag, devices, cost)
    best = _fastest(problem)
    if best is None:
        raise PlanError("no single device can run every node")
    return best


def _fastest(problem: _Problem) -> Placement | None:
    best: Placement | None = None
    for dev in problem.devices:
        if problem.can_run_all(dev):
            plan = _fixed(problem, dict.fromkeys(problem.topo, dev), f"single({dev})")
            if best is None or plan.makespan < best.makespan:
                best = plan
    return best


def best_of(*policies: Policy) -> Policy:
    """A policy that runs each of ``policies`` and keeps the shortest plan.

    :param policies: at least one policy.
    :return: the combined policy (ties: the first given).
    :raises PlanError: if no policy is given.
    """
    if not policies:
        raise PlanError("best_of needs at least one policy")

    def policy(
        dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> Placement:
        best = policies[0](dag, devices, cost)
        for candidate in policies[1:]:
            plan = candidate(dag, devices, cost)
            if plan.makespan < best.makespan:
                best = plan
        return best

    return policy


def guarded(policy: Policy) -> Policy:
    """``policy``, unless everything on one device is predicted faster.

    :param policy: the policy to guard.
    :return: a policy whose plan is never predicted slower than the fastest
        :func:`single_device` plan among the devices that can run every free
        node.
    """

    def guarded_policy(
        dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> Placement:
        plan = policy(dag, devices, cost)
        single = _fastest(_Problem(dag, devices, cost))
        if single is not None and single.makespan < plan.makespan:
            return single
        return plan

    return guarded_policy


def _host_single(
    dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
) -> Placement:
    if not devices:
        raise PlanError("no device to place onto")
    return single_device(devices[0])(dag, devices, cost)


def get_policy(name_or_callable: str | Policy, *, guard: bool = True) -> Policy:
    """Resolve a policy by name, or take a callable as it is.

    :param name_or_callable: ``"single"`` (the host-facing device),
        ``"fastest"``, ``"heft"``, ``"peft"``, ``"lookahead"``, ``"auto"``
        (best of HEFT, PEFT and lookahead), or a :data:`Policy`.
    :param guard: wrap ``"heft"``, ``"peft"`` and ``"lookahead"`` in
        :func:`guarded`
        (``"auto"`` always is; a callable never is).
    :return: the policy.
    :raises PlanError: if the name is unknown or the argument is neither a
        string nor callable.
    """
    if isinstance(name_or_callable, str):
        name = name_or_callable.strip().lower()
        if name == "single":
            return _host_single
        if name == "fastest":
            return fastest_single
        if name == "heft":
            return guarded(heft) if guard else heft
        if name == "peft":
            return guarded(peft) if guard else peft
        if name == "lookahead":
            return guarded(lookahead) if guard else lookahead
        if name == "auto":
            return guarded(best_of(heft, peft, lookahead))
        raise PlanError(
            f"unknown placement policy {name_or_callable!r}; "
            f"expected one of {', '.join(POLICY_NAMES)} or a callable"
        )
    if callable(name_or_callable):
        return name_or_callable
    raise PlanError(
        f"a placement policy is a name or a callable, got {name_or_callable!r}"
    )


def place(
    dag: nx.DiGraph,
    devices: Sequence[Device],
    cost: CostModel,
    policy: str | Policy = "auto",
) -> Placement:
    """Resolve ``policy``, run it and check its result.

    :param dag: the graph.
    :param devices: the devices, host-facing first.
    :param cost: the cost model.
    :param policy: a name (see :func:`get_policy`) or a callable.
    :return: the placement.
    :raises PlanError: if the policy is unknown, a node cannot run anywhere,
        a pin is invalid, or the policy left a node unplaced, put it on a
        device not listed, or moved a pinned node.
    """
    chosen = get_policy(policy)
    pins = resolve_pins(dag, devices)
    plan = chosen(dag, devices, cost)
    for nid in dag.nodes:
        spec = node_spec(dag, nid)
        dev = plan.device_of.get(nid)
        if dev is None or dev not in devices:
            raise PlanError(
                f"policy {plan.policy!r} put node {spec.name!r} (id {nid}) on "
                f"{dev}, which is not among the devices given"
            )
        if nid in pins and dev != pins[nid]:
            raise PlanError(
                f"policy {plan.policy!r} moved node {spec.name!r} (id {nid}) to "
                f"{dev}; it is pinned to {pins[nid]}"
            )
    return plan
