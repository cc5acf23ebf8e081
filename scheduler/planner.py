"""The planner: from a DAG and the available devices to a :class:`Plan`.

Passes, each a small function over the DAG or the plan being built:

1. **placement** — which device runs each node. With one device, every node
   runs there (TVM's graph executor does the same when it is given a single
   device, whatever ``device_index`` says). With several, a node pinned by
   the graph (``NodeSpec.device``, or ``device_type`` matched to the first
   device of that DLPack type) stays there; the policy places the rest.
2. **ordering** — a launch order per stream (topological, lowest node id
   first among ready nodes: for TVM files that is file order).
3. **storage** — per device, lifetimes under the streams' order
   (:mod:`scheduler.liveness`) and offsets in one arena
   (:mod:`scheduler.storage`); graph inputs and parameters are external;
   ``__nop`` outputs alias their input.

With several streams per device, lowering may also cut a large
elementwise node into row blocks, one part per stream, where the cost
model says the device's other streams would otherwise idle (``split``,
:mod:`scheduler.split`: a *row split*, within one device). Row splits are
kept only if they save more than their extra steps and streams cost to
start; what they save comes off the predicted makespan.

The predicted makespan of a plan run on streams includes their start
(:func:`scheduler.cost.start_latency`: the host issues every step, then a
stream's thread wakes up, at the cost model's figures); one the dispatcher
runs on the calling thread (one stream of the host) starts at once. A split
over devices pays only if it beats that: with a policy that guards against
the single fastest device (every name but ``"single"``), a plan over
several devices is replaced by everything on the host-facing device, when
that is the host itself (:attr:`devices.DeviceAPI.is_host`) and is
predicted no slower, start included.

Planning is pure: it reads the DAG, the devices' capabilities and the cost
model, and nothing else (it never times anything), so the same graph and
the same cost figures always give the same plan, which keeps the figures it
was made from (:attr:`~scheduler.plan.Plan.speeds`).

With one device and one stream the order is the whole story, and storage
comes from exact interval liveness. Otherwise the placement policy
(:mod:`scheduler.placement`) decides devices, :mod:`scheduler.lowering` adds
copies, streams and events, and storage is planned per device from the
happens-before order those streams and events really guarantee
(:mod:`scheduler.happens_before`): two tensors share bytes only if every
access of one surely precedes the write of the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import networkx as nx

from devices import Device, DeviceSpeed, get_api

from .cost import AnalyticCostModel, CostModel, runs_inline, start_latency
from .dag import Entry, TensorSpec, graph_spec, node_spec
from .errors import PlanError
from .happens_before import HappensBefore, LaunchRef
from .liveness import compute_liveness, default_order
from .lowering import Lowered, lower, node_launch
from .placement import Placement, Policy, place
from .plan import Arena, Launch, Plan, StreamPlan, TensorPlacement
from .split import RowSplit, choose_splits
from .storage import Conflicts, StorageRequest, plan_offsets

__all__ = ("plan_graph",)


def plan_graph(
    dag: nx.DiGraph,
    devices: Sequence[Device],
    *,
    policy: str | Policy = "auto",
    max_streams: int = 1,
    supported: Callable[[int, Device], bool] | None = None,
    cost: CostModel | None = None,
    split: RowSplit | None = None,
) -> Plan:
    """Plan a DAG onto devices; the first device faces the host.

    :param dag: the graph (:func:`scheduler.dag.make_dag`).
    :param devices: the devices, host-facing first.
    :param policy: the placement policy, by name or as a callable (see
        :func:`scheduler.placement.get_policy`).
    :param max_streams: compute streams per device.
    :param supported: whether node ``nid`` can run on a device (kernels
        available only on some kinds); default: everywhere.
    :param cost: the cost model; default: analytic, from the devices'
        attributes.
    :param split: which elementwise nodes may run as one part per stream,
        where that pays (:mod:`scheduler.split`); ``None``: none. Only with
        ``max_streams`` of 2 or more.
    :return: the plan.
    :raises PlanError: if no device is given, a node is pinned to a device
        not given, or a node can run nowhere.
    """
    if not devices:
        raise PlanError("no device to plan onto")
    if max_streams < 1:
        raise PlanError(f"max_streams must be >= 1, got {max_streams}")
    if len(devices) > 1 or max_streams > 1:
        model = cost or AnalyticCostModel.from_devices(dag, devices, supported)
        plan = _started(
            _plan_streams(dag, tuple(devices), policy, max_streams, model, split),
            model,
        )
        if _guards(policy) and get_api(devices[0]).is_host and not runs_inline(plan):
            try:
                host = _started(
                    _plan_streams(
                        dag, tuple(devices), "single", max_streams, model, split
                    ),
                    model,
                )
            except PlanError:  # a node the host cannot run, or pinned elsewhere
                return plan
            if host.makespan <= plan.makespan:
                return host
        return plan
    device = devices[0]
    placement = {nid: device for nid in dag.nodes}
    for nid in dag.nodes:
        spec = node_spec(dag, nid)
        if spec.device is not None and spec.device != device:
            raise PlanError(
                f"node {spec.name!r} is pinned to {spec.device}, which is not "
                f"among the devices given ({device})"
            )
    order = default_order(dag)
    liveness = compute_liveness(dag, order)
    arena_plan = liveness.plan()

    tensors: dict[Entry, TensorSpec] = {}
    storage: dict[Entry, TensorPlacement] = {}
    launches: list[Launch] = []
    for nid in order:
        spec = node_spec(dag, nid)
        outputs = [Entry(nid, i) for i in range(len(spec.outputs))]
        for entry, tensor in zip(outputs, spec.outputs, strict=True):
            tensors[entry] = tensor
            if spec.is_null:
                storage[entry] = TensorPlacement(device, "external")
            elif entry in liveness.aliases:
                storage[entry] = TensorPlacement(
                    device, "alias", alias_of=liveness.aliases[entry]
                )
            else:
                storage[entry] = TensorPlacement(
                    device, "arena", offset=arena_plan.offsets[entry]
                )
        if spec.is_null or spec.is_nop:
            continue
        launches.append(node_launch(spec, nid, spec.inputs))
    stream = StreamPlan(device, tuple(launches))
    graph = graph_spec(dag)
    model = cost or AnalyticCostModel.from_devices(dag, devices, supported)
    return Plan(
        host=device,
        devices=(device,),
        placement=placement,
        streams=(stream,),
        order=tuple((0, i) for i in range(len(launches))),
        num_events=0,
        tensors=tensors,
        storage=storage,
        arenas={device: Arena(arena_plan.size, arena_plan.lower_bound)},
        inputs=tuple(n for n in order if node_spec(dag, n).is_null),
        heads=graph.heads,
        # One stream: the launches one after another.
        makespan=sum(model.compute_time(launch.nid, device) for launch in launches),
        speeds=_speeds(model),
    )


def _speeds(cost: CostModel) -> Mapping[Device, DeviceSpeed]:
    """The figures a cost model plans from, if it has any."""
    return dict(cost.speeds) if isinstance(cost, AnalyticCostModel) else {}


def _started(plan: Plan, cost: CostModel) -> Plan:
    """``plan`` with its streams' start added to the predicted makespan."""
    return dataclasses.replace(plan, makespan=plan.makespan + start_latency(cost, plan))


def _guards(policy: str | Policy) -> bool:
    """Whether ``policy`` promises never to be worse than a single device."""
    return isinstance(policy, str) and policy.strip().lower() != "single"


def _plan_streams(
    dag: nx.DiGraph,
    devices: tuple[Device, ...],
    policy: str | Policy,
    max_streams: int,
    cost: CostModel,
    split: RowSplit | None,
) -> Plan:
    """Several devices or streams: place, lower (splitting where it pays),
    then plan storage."""
    placement = place(dag, devices, cost, policy)
    start: Mapping[int, float] = placement.start
    if len(devices) == 1:
        # One device, several streams: issue in the graph's own topological
        # order (lowest id first: depth-first along branches), so each
        # stream runs whole chains and their buffers are reused while hot.
        # (List schedulers would interleave equal-rank branches breadth-first,
        # which predicts the same time but keeps every branch's tensors live.)
        start = {
            nid: float(i)
            for i, nid in enumerate(nx.lexicographical_topological_sort(dag))
        }

    def lower_with(splits: Mapping[int, int]) -> Lowered:
        return lower(dag, devices, placement.device_of, start, max_streams, splits)

    inputs = tuple(
        n for n in nx.lexicographical_topological_sort(dag) if node_spec(dag, n).is_null
    )
    lowered = lower_with({})
    saved = 0.0
    if split is not None and max_streams > 1:
        parted, saved = choose_splits(dag, lowered, lower_with, cost, split)
        if parted is not lowered:
            # Kept only if they save more than their extra steps cost the
            # host to issue.
            more = start_latency(cost, _skeleton(parted, devices, placement, inputs))
            less = start_latency(cost, _skeleton(lowered, devices, placement, inputs))
            if saved > more - less:
                lowered = parted
            else:
                saved = 0.0
    storage: dict[Entry, TensorPlacement] = {}
    for entry, device in lowered.location.items():
        if entry.nid in inputs or entry in lowered.constant_copies:
            storage[entry] = TensorPlacement(device, "external")
    for entry, owner in lowered.aliases.items():
        storage[entry] = TensorPlacement(
            lowered.location[owner], "alias", alias_of=owner
        )
    skeleton = _skeleton(lowered, devices, placement, inputs)
    order = HappensBefore(skeleton)
    arenas: dict[Device, Arena] = {}
    for device in devices:
        offsets, arena = _plan_device_storage(
            device,
            lowered.location,
            lowered.aliases,
            lowered.heads,
            lowered.tensors,
            order,
            storage,
        )
        for entry, offset in offsets.items():
            storage[entry] = TensorPlacement(device, "arena", offset=offset)
        if offsets:  # zero-byte tensors still need an arena to view
            arenas[device] = arena
    return dataclasses.replace(
        skeleton,
        storage=storage,
        arenas=arenas,
        makespan=max(0.0, placement.makespan - saved),
        policy=placement.policy,
        constant_copies=lowered.constant_copies,
        speeds=_speeds(cost),
    )


def _skeleton(
    lowered: Lowered,
    devices: tuple[Device, ...],
    placement: Placement,
    inputs: tuple[int, ...],
) -> Plan:
    """A lowered plan as a :class:`Plan` without storage: enough for its
    happens-before order and its start."""
    return Plan(
        host=devices[0],
        devices=devices,
        placement=placement.device_of,
        streams=lowered.streams,
        order=lowered.order,
        num_events=lowered.num_events,
        tensors=lowered.tensors,
        storage={},
        arenas={},
        inputs=inputs,
        heads=lowered.heads,
    )


def _plan_device_storage(
    device: Device,
    location: Mapping[Entry, Device],
    aliases: Mapping[Entry, Entry],
    heads: tuple[Entry, ...],
    tensors: Mapping[Entry, TensorSpec],
    order: HappensBefore,
    fixed: Mapping[Entry, TensorPlacement],
) -> tuple[dict[Entry, int], Arena]:
    """Offsets for one device's tensors: two tensors conflict unless every
    access of one happens before the other is written (by every part, for
    a tensor written by a split node's parts)."""
    writers: dict[Entry, list[LaunchRef]] = {}
    # Per tensor, the last launch touching it on each stream: the earlier
    # ones on that stream come before it, so it alone needs asking.
    last_touch: dict[Entry, dict[int, LaunchRef]] = {}
    for ref, launch in order.launch_at.items():
        for position, entry in enumerate(launch.args):
            owner = aliases.get(entry, entry)
            on_stream = last_touch.setdefault(owner, {})
            if ref.stream not in on_stream or on_stream[ref.stream] < ref:
                on_stream[ref.stream] = ref
            if position >= launch.num_inputs:
                writers.setdefault(owner, []).append(ref)
    live_forever = {aliases.get(h, h) for h in heads}
    # Outputs of aliased tensors keep the larger size of the two views.
    size: dict[Entry, int] = {}
    for entry, owner in [*((e, e) for e in tensors), *aliases.items()]:
        if owner in fixed and fixed[owner].where == "external":
            continue
        if location.get(owner) == device and owner in writers:
            size[owner] = max(size.get(owner, 0), tensors[entry].nbytes)
    entries = sorted(size, key=lambda e: (e.nid, e.index))

    # What every writer of a tensor is guaranteed to come after.
    seen = {entry: order.seen_by_all(writers[entry]) for entry in entries}

    def done_before(first: Entry, second: Entry) -> bool:
        if first in live_forever:
            return False
        bound = seen[second]
        return all(t.position < bound[t.stream] for t in last_touch[first].values())

    pairs = [
        (a, b)
        for i, a in enumerate(entries)
        for b in entries[i + 1 :]
        if not (done_before(a, b) or done_before(b, a))
    ]
    requests = [StorageRequest(e, size[e]) for e in entries]
    arena_plan = plan_offsets(requests, Conflicts.from_pairs(pairs))
    return dict(arena_plan.offsets), Arena(arena_plan.size, arena_plan.lower_bound)
