"""Lowering a placement: copies, streams and events.

Given where every node runs (:mod:`scheduler.placement`), this pass decides
the launches and how the streams order them:

1. **Copies.** A tensor read on a device other than its own gets one
   :class:`~scheduler.plan.Copy` step per consumer *device* (not per
   consumer); every consumer on that device reads the copy. Graph outputs
   computed away from the host are copied back to it. A *parameter* read
   elsewhere gets a constant copy instead: no step, made once by the
   executor when the parameters are loaded (``Lowered.constant_copies``).
   A graph's own ``__copy`` node is a copy step too, on a compute stream.
2. **Issue order.** Launches are taken in the order the placement predicted
   them to start (ties by topological position): a topological order, so a
   producer always comes before its consumers.
3. **Streams.** Each device gets up to ``max_streams`` compute streams and
   a copy stream, so transfers overlap compute. A copy runs on its
   destination's copy stream, but one to the host from a device whose copy
   engines move data both ways (:attr:`devices.DeviceAPI.outgoing_copies`:
   the simulated accelerator) on a second copy stream of that device's:
   the copy keeps the device's clock, and the host's cores and threads are
   left to the host's own work. A node continues the
   stream of a same-device producer whose stream it would directly follow
   (a chain stays on one stream); otherwise it opens a new stream or takes
   the one that frees up first (independent branches spread out).
   A node that :mod:`scheduler.split` chose to split (``splits``) becomes
   one launch per part, each over its own rows: the first part takes the
   stream the node would have taken, the others one each of the device's
   other compute streams, those freeing up first (a new one while the
   device has fewer than ``max_streams``).
4. **Events.** A dependency between two streams becomes a record after the
   producer and a wait before the consumer (SyncStreamFromTo) — unless the
   consumer's stream already waits for a later point of the producer's
   stream, directly or through other waits. Vector clocks track what every
   stream is already guaranteed to have seen, so no redundant wait is
   emitted. A tensor written by a split node's parts has one producer per
   part: its readers wait for each (on their own stream, none is needed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from devices import Device, get_api

from .dag import Entry, NodeSpec, TensorSpec, graph_spec, node_spec
from .plan import Copy, Launch, RecordEvent, Step, StreamPlan, WaitEvent
from .split import split_launch

__all__ = ("Lowered", "lower", "node_launch")


@dataclass(frozen=True)
class Lowered:
    """The launches of a placed graph, on streams, with events.

    :ivar streams: every stream's steps.
    :ivar order: the issue order, ``(stream, step index)`` pairs.
    :ivar num_events: events used.
    :ivar location: the device of every tensor (copies included).
    :ivar tensors: shape and dtype of every tensor (copies included).
    :ivar aliases: ``__nop`` outputs and the tensor whose storage they use.
    :ivar heads: the graph's outputs, as tensors on the host.
    :ivar constant_copies: copies of parameters made before any run: the
        copy and the tensor it copies.
    """

    streams: tuple[StreamPlan, ...]
    order: tuple[tuple[int, int], ...]
    num_events: int
    location: Mapping[Entry, Device]
    tensors: Mapping[Entry, TensorSpec]
    aliases: Mapping[Entry, Entry]
    heads: tuple[Entry, ...]
    constant_copies: Mapping[Entry, Entry]


def lower(
    dag: nx.DiGraph,
    devices: Sequence[Device],
    device_of: Mapping[int, Device],
    start: Mapping[int, float],
    max_streams: int = 2,
    splits: Mapping[int, int] | None = None,
) -> Lowered:
    """Lower a placement to streams (see the module docstring).

    :param dag: the graph.
    :param devices: the devices, host first.
    :param device_of: each node's device.
    :param start: each node's predicted start (orders the launches).
    :param max_streams: compute streams per device, at least 1.
    :param splits: nodes to run in parts, and how many (at most
        ``max_streams``; :func:`scheduler.split.split_launch` must accept
        them).
    :return: the lowered plan parts.
    """
    host = devices[0]
    topo = {n: i for i, n in enumerate(nx.lexicographical_topological_sort(dag))}
    next_id = max(dag.nodes, default=-1) + 1
    tensors: dict[Entry, TensorSpec] = {}
    location: dict[Entry, Device] = {}
    aliases: dict[Entry, Entry] = {}
    launches: list[
        tuple[float, int, Launch, Device, bool]
    ] = []  # time, topo, ..., is_copy
    copies: dict[tuple[Entry, Device], Entry] = {}
    copy_at: dict[tuple[Entry, Device], int] = {}  # index in ``launches``
    params = frozenset(graph_spec(dag).params)
    constant_copies: dict[Entry, Entry] = {}

    def root(entry: Entry) -> Entry:
        return aliases.get(entry, entry)

    def on_device(entry: Entry, device: Device, when: float, rank: int) -> Entry:
        """``entry`` as readable on ``device``: itself, or a copy made once."""
        if location[root(entry)] == device:
            return entry
        key = (entry, device)
        if key not in copies:
            nonlocal next_id
            copy = Entry(next_id, 0)
            next_id += 1
            copies[key] = copy
            tensors[copy] = tensors[entry]
            location[copy] = device
            if root(entry).nid in params:
                constant_copies[copy] = entry
                return copy
            step = Copy(
                nid=copy.nid,
                name=f"copy_{entry.nid}_{entry.index}_to_{device.kind}{device.index}",
                args=(entry, copy),
            )
            copy_at[key] = len(launches)
            launches.append((when, rank, step, device, True))
        elif key in copy_at:
            # A shared copy goes before its earliest consumer, not its first
            # in topological order: issue order must stay topological.
            at = copy_at[key]
            old_when, old_rank, shared, _, _ = launches[at]
            if (when, rank) < (old_when, old_rank):
                launches[at] = (when, rank, shared, device, True)
        return copies[key]

    for nid in sorted(dag.nodes, key=topo.__getitem__):
        spec = node_spec(dag, nid)
        outputs = [Entry(nid, i) for i in range(len(spec.outputs))]
        for entry, tensor in zip(outputs, spec.outputs, strict=True):
            tensors[entry] = tensor
        if spec.is_null:
            location[outputs[0]] = host
            for entry in outputs:
                location[entry] = host
            continue
        if spec.is_nop:
            aliases[outputs[0]] = root(spec.inputs[0])
            continue
        device = device_of[nid]
        for entry in outputs:
            location[entry] = device
        when = start.get(nid, 0.0)
        inputs = tuple(on_device(e, device, when, topo[nid]) for e in spec.inputs)
        launches.append(
            (when, topo[nid], node_launch(spec, nid, inputs), device, False)
        )
    final = len(topo)
    heads = tuple(
        on_device(h, host, float("inf"), final) for h in graph_spec(dag).heads
    )
    # Copies take their consumer's time and rank, so they sort just before it;
    # their sources are produced earlier still.
    launches.sort(key=lambda item: (item[0], item[1], not item[4]))
    lowered = _assign_streams(
        launches, devices, max_streams, tensors, location, aliases, heads, splits or {}
    )
    return dataclasses.replace(lowered, constant_copies=constant_copies)


def node_launch(spec: NodeSpec, nid: int, inputs: tuple[Entry, ...]) -> Launch:
    """The step that runs node ``nid``: a :class:`~scheduler.plan.Copy` for
    a graph's own ``__copy`` node, else a kernel :class:`Launch`.

    :param spec: the node.
    :param nid: its id.
    :param inputs: the tensors it reads (copies on its device, if any).
    """
    outputs = tuple(Entry(nid, i) for i in range(len(spec.outputs)))
    if spec.is_copy and len(inputs) == 1 and len(outputs) == 1:
        return Copy(nid=nid, name=spec.name, args=(*inputs, *outputs))
    return Launch(
        nid=nid,
        name=spec.name,
        func_name=spec.func_name,
        args=(*inputs, *outputs),
        num_inputs=len(inputs),
        work=spec.flops,
    )


_Key = tuple[int, int]  # Launch.key: node id and part index


def _assign_streams(
    launches: list[tuple[float, int, Launch, Device, bool]],
    devices: Sequence[Device],
    max_streams: int,
    tensors: dict[Entry, TensorSpec],
    location: dict[Entry, Device],
    aliases: dict[Entry, Entry],
    heads: tuple[Entry, ...],
    splits: Mapping[int, int],
) -> Lowered:
    stream_device: list[Device] = []
    compute: dict[Device, list[int]] = {d: [] for d in devices}
    copy_stream: dict[_CopyEngine, int] = {}
    last_on: list[_Key | None] = []  # per stream: its last launch
    free_at: list[float] = []
    producers: dict[Entry, list[_Key]] = {}  # owning entry -> its writers
    stream_of: dict[_Key, int] = {}
    position: dict[_Key, int] = {}
    per_stream: list[list[Launch]] = []
    issued: list[tuple[float, int, Launch, Device, bool]] = []  # parts expanded

    def new_stream(device: Device) -> int:
        stream_device.append(device)
        last_on.append(None)
        free_at.append(0.0)
        per_stream.append([])
        return len(stream_device) - 1

    def root(entry: Entry) -> Entry:
        return aliases.get(entry, entry)

    for item in launches:
        when, _, launch, device, is_copy = item
        deps = [
            p
            for e in launch.args[: launch.num_inputs]
            for p in producers.get(root(e), ())
        ]
        if is_copy:
            engine = _copy_engine(location[root(launch.args[0])], device)
            if engine not in copy_stream:
                copy_stream[engine] = new_stream(engine.device)
            stream = copy_stream[engine]
        else:
            chained = [
                stream_of[p]
                for p in deps
                if stream_of[p] in compute[device] and last_on[stream_of[p]] == p
            ]
            if chained:
                stream = chained[0]
            elif len(compute[device]) < max_streams:
                stream = new_stream(device)
                compute[device].append(stream)
            else:
                stream = min(compute[device], key=lambda s: free_at[s])
        count = 1 if is_copy else min(splits.get(launch.nid, 1), max_streams)
        parts = split_launch(launch, tensors, count) if count > 1 else (launch,)
        targets = [stream]
        while len(targets) < len(parts):
            others = [s for s in compute[device] if s not in targets]
            if not others or len(compute[device]) < max_streams:
                others = [new_stream(device)]
                compute[device].append(others[0])
            targets.append(min(others, key=lambda s: free_at[s]))
        for part, target in zip(parts, targets, strict=True):
            stream_of[part.key] = target
            position[part.key] = len(per_stream[target])
            per_stream[target].append(part)
            last_on[target] = part.key
            free_at[target] = when
            issued.append((when, item[1], part, device, is_copy))
        for entry in launch.args[launch.num_inputs :]:
            producers[root(entry)] = [part.key for part in parts]
    return _place_events(
        per_stream,
        stream_device,
        issued,
        stream_of,
        position,
        producers,
        tensors,
        location,
        aliases,
        heads,
    )


@dataclass(frozen=True)
class _CopyEngine:
    """A copy stream: of ``device``, copying into it or out of it."""

    device: Device
    outgoing: bool


def _copy_engine(src: Device, dst: Device) -> _CopyEngine:
    """The copy stream of a copy from ``src`` to ``dst``: the destination's
    incoming one, except for a copy to the host from a device whose copies
    to the host run on its own streams
    (:attr:`devices.DeviceAPI.outgoing_copies`): that device's outgoing one.
    """
    source = get_api(src)
    if get_api(dst).is_host and not source.is_host and source.outgoing_copies:
        return _CopyEngine(src, outgoing=True)
    return _CopyEngine(dst, outgoing=False)


def _place_events(
    per_stream: list[list[Launch]],
    stream_device: list[Device],
    launches: list[tuple[float, int, Launch, Device, bool]],
    stream_of: dict[_Key, int],
    position: dict[_Key, int],
    producers: dict[Entry, list[_Key]],
    tensors: dict[Entry, TensorSpec],
    location: dict[Entry, Device],
    aliases: dict[Entry, Entry],
    heads: tuple[Entry, ...],
) -> Lowered:
    count = len(per_stream)
    clock = [[0] * count for _ in range(count)]
    after: dict[_Key, list[int]] = {}  # launch -> clock of its stream after it
    waits: dict[_Key, list[_Key]] = {}  # consumer -> producers to wait for
    records: set[_Key] = set()
    for _, _, launch, _, _ in launches:
        stream = stream_of[launch.key]
        latest: dict[int, int] = {}  # per other stream, the latest producer read
        for entry in launch.args[: launch.num_inputs]:
            for source in producers.get(aliases.get(entry, entry), ()):
                other = stream_of[source]
                if other != stream:
                    latest[other] = max(position[source], latest.get(other, -1))
        needed = []
        for other, pos in sorted(latest.items()):
            if clock[stream][other] > pos:
                continue  # already ordered through earlier waits
            if any(
                after[per_stream[o][p].key][other] > pos
                for o, p in latest.items()
                if o != other
            ):
                continue  # implied by the wait for another producer
            source = per_stream[other][pos].key
            needed.append(source)
            records.add(source)
            clock[stream] = [
                max(a, b) for a, b in zip(clock[stream], after[source], strict=True)
            ]
        if needed:
            waits[launch.key] = needed
        clock[stream][stream] = position[launch.key] + 1
        after[launch.key] = list(clock[stream])

    event_of = {key: i for i, key in enumerate(sorted(records))}
    steps: list[list[Step]] = [[] for _ in range(count)]
    order: list[tuple[int, int]] = []
    for _, _, launch, _, _ in launches:
        stream = stream_of[launch.key]
        for source in waits.get(launch.key, ()):
            order.append((stream, len(steps[stream])))
            steps[stream].append(WaitEvent(event_of[source]))
        order.append((stream, len(steps[stream])))
        steps[stream].append(launch)
        if launch.key in event_of:
            order.append((stream, len(steps[stream])))
            steps[stream].append(RecordEvent(event_of[launch.key]))
    streams = tuple(StreamPlan(stream_device[s], tuple(steps[s])) for s in range(count))
    return Lowered(
        streams=streams,
        order=tuple(order),
        num_events=len(event_of),
        location=location,
        tensors=tensors,
        aliases=aliases,
        heads=heads,
        constant_copies={},
    )
