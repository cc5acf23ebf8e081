"""The Plan: everything decided before a graph runs, as plain frozen data.

A :class:`Plan` says which device runs each node, on which stream, in what
order; which events order the streams; where every tensor lives (an offset
in its device's arena, an external buffer the executor binds — graph inputs
and parameters —, or an alias of another tensor, as TVM's ``__nop``); and how
big each arena is. It is computed once by :mod:`scheduler.planner` and run
many times by :mod:`scheduler.dispatch`; running it does no planning.

A plan has two kinds of work step (and two of ordering step, records and
waits): a :class:`Launch` runs a node's kernel; a :class:`Copy` moves one
tensor to another device (or place), run by the devices' copy path, not by a
kernel — as tinygrad's ``exec_copy`` beside ``exec_kernel``. A copy is a
launch in every other respect (it reads its first argument and writes its
second, and storage and ordering treat it so), which is why it subclasses
:class:`Launch`: :meth:`Plan.kernel_launches` and :meth:`Plan.copies` tell
them apart. Copies of *parameters* are no stream's step: the executor makes
them once, when it loads the parameters (:meth:`Plan.parameter_copies`).

A plan also keeps the figures it was planned from (:attr:`Plan.speeds`), so
one can see why it is what it is, and plan again from the same figures.

A large elementwise node may run as several *parts* (:mod:`scheduler.split`):
launches of the same node, one per stream, each over its own block of rows
of the output (:class:`Part`); ``print(plan)`` shows them as ``sum[0/2]``,
``sum[1/2]``.

``print(plan)`` shows it; :meth:`Plan.to_dot` renders it for graphviz.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from devices import Device, DeviceSpeed

from .dag import COPY_FUNC, Entry, TensorSpec

__all__ = (
    "Arena",
    "Copy",
    "Launch",
    "Part",
    "Plan",
    "RecordEvent",
    "Step",
    "StreamPlan",
    "TensorPlacement",
    "WaitEvent",
)


@dataclass(frozen=True)
class TensorPlacement:
    """Where one tensor (one node output) lives.

    :ivar device: the device holding it.
    :ivar where: ``"arena"`` (at :attr:`offset` in the device's arena),
        ``"external"`` (a graph input or parameter: the executor binds a
        buffer of its own), or ``"alias"`` (the same memory as
        :attr:`alias_of`).
    :ivar offset: byte offset in the arena (``"arena"`` only).
    :ivar alias_of: the tensor it aliases (``"alias"`` only).
    """

    device: Device
    where: Literal["arena", "external", "alias"]
    offset: int = 0
    alias_of: Entry | None = None


@dataclass(frozen=True)
class Part:
    """One part of a node split into row blocks (:mod:`scheduler.split`).

    The part runs the node's kernel on rows ``start:stop`` (axis 0) of its
    output, and of every input marked in :attr:`cut`; the other inputs are
    passed whole (they broadcast along axis 0).

    :ivar index: the part's number, from 0.
    :ivar count: how many parts the node has.
    :ivar start: its first row.
    :ivar stop: one past its last row.
    :ivar cut: per input, whether the part reads only its rows of it.
    """

    index: int
    count: int
    start: int
    stop: int
    cut: tuple[bool, ...]


@dataclass(frozen=True)
class Launch:
    """Run one node's kernel on a stream.

    :ivar nid: the node id.
    :ivar name: the node's name.
    :ivar func_name: the kernel's name (:data:`~scheduler.dag.COPY_FUNC` for
        a :class:`Copy`).
    :ivar args: the tensors passed, inputs then outputs (destination passing).
    :ivar num_inputs: how many of ``args`` are inputs.
    :ivar work: estimated floating-point operations.
    :ivar part: the block of rows this launch computes, when its node is
        split over several launches (``None``: the whole node).
    """

    nid: int
    name: str
    func_name: str
    args: tuple[Entry, ...]
    num_inputs: int
    work: float = 0.0
    part: Part | None = None

    @property
    def label(self) -> str:
        """The node's name, with ``[index/count]`` for a part."""
        if self.part is None:
            return self.name
        return f"{self.name}[{self.part.index}/{self.part.count}]"

    @property
    def key(self) -> tuple[int, int]:
        """What tells launches apart: the node id and the part's index."""
        return (self.nid, 0 if self.part is None else self.part.index)


@dataclass(frozen=True)
class Copy(Launch):
    """Copy tensor :attr:`src` into tensor :attr:`dst` (``args``, in that
    order), on the stream's device: a step of its own kind, which the
    dispatcher runs with the devices' copy path, never a kernel.

    Lowering inserts one on every edge that crosses devices (and for every
    head computed away from the host); a graph's own ``__copy`` node is one
    too. Its :attr:`func_name` is :data:`~scheduler.dag.COPY_FUNC`, which
    profiles and printed plans show.

    :ivar nid: the copy's id (a tensor id of its own for an inserted copy).
    :ivar name: its name, such as ``copy_3_0_to_sim0``.
    :ivar args: the source and the destination.
    """

    func_name: str = field(default=COPY_FUNC, init=False)
    num_inputs: int = field(default=1, init=False)

    @property
    def src(self) -> Entry:
        """The tensor copied."""
        return self.args[0]

    @property
    def dst(self) -> Entry:
        """The tensor written."""
        return self.args[1]


@dataclass(frozen=True)
class RecordEvent:
    """Record event ``event`` on this stream."""

    event: int


@dataclass(frozen=True)
class WaitEvent:
    """Make this stream wait for event ``event`` (SyncStreamFromTo)."""

    event: int


#: A stream's step: a kernel launch, a copy, a record or a wait.
Step = Launch | Copy | RecordEvent | WaitEvent


@dataclass(frozen=True)
class StreamPlan:
    """One stream's work, in order.

    :ivar device: the stream's device.
    :ivar steps: launches, records and waits, in order.
    """

    device: Device
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Arena:
    """One device's activation memory for one run.

    :ivar size: bytes to allocate.
    :ivar lower_bound: the most bytes ever live at once: no plan can be
        smaller.
    """

    size: int
    lower_bound: int


@dataclass(frozen=True)
class Plan:
    """A graph, planned: placement, streams, events, storage.

    :ivar host: the host-facing device (inputs arrive, outputs leave there).
    :ivar devices: every device the plan uses, host first.
    :ivar placement: the device of every node.
    :ivar streams: the streams, each with its steps.
    :ivar order: the order in which the dispatcher issues steps, as
        ``(stream index, step index)`` pairs: every record comes before any
        wait on its event.
    :ivar num_events: how many events the streams use.
    :ivar tensors: the shape and dtype of every tensor.
    :ivar storage: where every tensor lives.
    :ivar arenas: the arena of each device that has one.
    :ivar inputs: node ids of the graph's external tensors (inputs and
        parameters), bound by the executor.
    :ivar heads: the graph's outputs.
    :ivar makespan: the predicted run time in seconds, from the cost
        model the plan was made with.
    :ivar policy: the placement policy that produced the plan.
    :ivar constant_copies: copies of parameters on the devices that read
        them, made once by the executor before any run (stored as external
        tensors): the copy and the tensor it copies (as steps:
        :meth:`parameter_copies`).
    :ivar speeds: the timing-model figures of every device the plan was
        made with (an analytic cost model's; empty for other models).
    """

    host: Device
    devices: tuple[Device, ...]
    placement: Mapping[int, Device]
    streams: tuple[StreamPlan, ...]
    order: tuple[tuple[int, int], ...]
    num_events: int
    tensors: Mapping[Entry, TensorSpec]
    storage: Mapping[Entry, TensorPlacement]
    arenas: Mapping[Device, Arena]
    inputs: tuple[int, ...]
    heads: tuple[Entry, ...]
    makespan: float = 0.0
    policy: str = "single"
    constant_copies: Mapping[Entry, Entry] = field(default_factory=dict)
    speeds: Mapping[Device, DeviceSpeed] = field(default_factory=dict)

    def launches(self) -> list[Launch]:
        """Every launch, copies included, in issue order."""
        result = []
        for stream, step in self.order:
            item = self.streams[stream].steps[step]
            if isinstance(item, Launch):
                result.append(item)
        return result

    def kernel_launches(self) -> list[Launch]:
        """The launches that run a kernel (no copies), in issue order."""
        return [launch for launch in self.launches() if not isinstance(launch, Copy)]

    def copies(self) -> list[Copy]:
        """The copies the streams run, in issue order."""
        return [launch for launch in self.launches() if isinstance(launch, Copy)]

    def parameter_copies(self) -> list[Copy]:
        """The copies of parameters made once, before any run, as steps
        (:attr:`constant_copies`), by destination."""
        return [
            Copy(copy.nid, f"param_copy_{source.nid}_{source.index}", (source, copy))
            for copy, source in sorted(self.constant_copies.items())
        ]

    def resolve(self, entry: Entry) -> Entry:
        """Follow aliases to the tensor that owns the memory."""
        placement = self.storage[entry]
        while placement.where == "alias" and placement.alias_of is not None:
            entry = placement.alias_of
            placement = self.storage[entry]
        return entry

    def __str__(self) -> str:
        lines = [f"Plan on {', '.join(map(str, self.devices))} (host {self.host})"]
        if self.makespan:
            lines.append(
                f"  policy {self.policy}: predicted makespan "
                f"{1e3 * self.makespan:.3f} ms"
            )
        for device, arena in sorted(self.arenas.items()):
            ratio = arena.size / arena.lower_bound if arena.lower_bound else 1.0
            lines.append(
                f"  arena {device}: {arena.size} bytes "
                f"(lower bound {arena.lower_bound}, {ratio:.3f}x)"
            )
        for copy, source in sorted(self.constant_copies.items()):
            lines.append(
                f"  parameter copy {copy.nid}.{copy.index} on "
                f"{self.storage[copy].device} = {source.nid}.{source.index} "
                "(made once)"
            )
        for index, stream in enumerate(self.streams):
            lines.append(f"  stream {index} on {stream.device}:")
            for step in stream.steps:
                lines.append(f"    {_describe(step, self)}")
        return "\n".join(lines)

    def to_dot(self) -> str:
        """The plan as a graphviz DOT graph: one cluster per stream, edges
        for data dependencies, dashed edges for event waits."""
        out = ["digraph plan {", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]
        producer: dict[Entry, list[str]] = {}  # several for a split node
        records: dict[int, str] = {}  # event -> the launch it follows
        waits: list[tuple[int, str]] = []  # (event, the launch it precedes)
        for s, stream in enumerate(self.streams):
            out.append(
                f'  subgraph cluster_s{s} {{ label="stream {s} ({stream.device})";'
            )
            last: str | None = None
            pending: list[int] = []
            for step in stream.steps:
                if isinstance(step, Launch):
                    node = _dot_id(step)
                    out.append(f'    {node} [label="{step.label}\\n{step.func_name}"];')
                    for entry in step.args[step.num_inputs :]:
                        producer.setdefault(entry, []).append(node)
                    waits.extend((event, node) for event in pending)
                    pending.clear()
                    last = node
                elif isinstance(step, RecordEvent):
                    if last is not None:
                        records[step.event] = last
                else:
                    pending.append(step.event)
            out.append("  }")
        for event, node in waits:
            if event in records:
                out.append(
                    f'  {records[event]} -> {node} [style=dashed, label="e{event}"];'
                )
        for stream in self.streams:
            for step in stream.steps:
                if isinstance(step, Launch):
                    for entry in step.args[: step.num_inputs]:
                        sources = producer.get(self.resolve(entry)) or producer.get(
                            entry, []
                        )
                        for source in sources:
                            out.append(f"  {source} -> {_dot_id(step)};")
        out.append("}")
        return "\n".join(out)


def _dot_id(launch: Launch) -> str:
    """A launch's graphviz node: ``n<nid>``, ``n<nid>_<part>`` for a part."""
    if launch.part is None:
        return f"n{launch.nid}"
    return f"n{launch.nid}_{launch.part.index}"


def _describe(step: Step, plan: Plan) -> str:
    if isinstance(step, RecordEvent):
        return f"record event {step.event}"
    if isinstance(step, WaitEvent):
        return f"wait event {step.event}"
    part = step.part
    ins = ", ".join(
        _where(e, plan) + ("" if part is None or not cut else _rows(part))
        for e, cut in zip(
            step.args[: step.num_inputs],
            (True,) * step.num_inputs if part is None else part.cut,
            strict=True,
        )
    )
    outs = ", ".join(
        _where(e, plan) + ("" if part is None else _rows(part))
        for e in step.args[step.num_inputs :]
    )
    return f"{step.label} = {step.func_name}({ins}) -> {outs}"


def _rows(part: Part) -> str:
    return f"[{part.start}:{part.stop}]"


def _where(entry: Entry, plan: Plan) -> str:
    placement = plan.storage[entry]
    label = f"{entry.nid}.{entry.index}"
    if placement.where == "arena":
        return f"{label}@{placement.offset}"
    if placement.where == "alias":
        return f"{label}={_where(plan.resolve(entry), plan)}"
    return f"{label}(ext)"
