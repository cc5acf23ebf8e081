"""Row splitting: a large elementwise node runs as one part per stream.

**Why.** Streams run independent branches side by side, but a node that
joins them (W2's 8-input ``Sum``) runs alone on one stream once they are
done, while the device's other streams idle: on the cpu, whose streams are
threads on different cores, one core then does all the join's work. A
kernel that is *elementwise* computes each output element from the
same-index elements of its inputs, so its output can be cut into blocks of
rows (axis 0) and each block computed by its own launch, on its own
stream, with the same kernel:
``kernel(a[r0:r1], b[r0:r1], ..., out[r0:r1])``. Each element is computed
exactly as the whole call computes it (the same function of the same
values), so the result is bit-identical.

**What splits.** A launch of node ``n`` on device ``d`` may split when

* ``d``'s streams compute side by side
  (:attr:`devices.DeviceAPI.concurrent_streams`: the host's, each a thread
  of its own; an accelerator's kernel already fills the device), or its
  kind is one of :attr:`RowSplit.kinds` where those are given, and the
  plan already has at least 2 compute streams there (from
  independent branches). Parts only ever use those streams: a split never
  opens a stream, so a chain stays on one, and the executor's kernel pool
  sizes (BLAS threads per cpu stream, :mod:`asyncrt.runtime._threads`) stay what
  they were — a second stream opened for a chain's elementwise nodes would
  halve the BLAS threads of its matrix products;
* the caller says ``n``'s kernel is elementwise
  (:attr:`RowSplit.elementwise`: the scheduler knows nothing of kernels;
  the executor passes the fusion pass's table of elementwise ops,
  :func:`asyncrt.ops._fusion.elementwise_predicate`);
* ``n`` has one output, of at least 2 rows and :attr:`RowSplit.min_bytes`
  bytes;
* every input has the output's shape (each part reads its own rows of it)
  or broadcasts to it without spanning axis 0: fewer axes, or a first axis
  of 1 (each part reads it whole). Anything else (an input of ``n`` rows
  broadcast along other axes, say) is left alone: conservative by design.

:func:`split_launch` cuts a launch into ``count`` parts of about as many
rows each, their boundaries on 64-byte multiples where the rows allow
(no two parts write one cache line), each with its share of the work.

**Where it pays.** :func:`choose_splits` asks the cost model. It
simulates the lowered plan (:func:`simulate`): each stream runs its steps
in order, a launch takes the model's ``compute_time`` (a part its share of
it), a copy ``transfer_time``, and a wait that blocks costs the waiting
device's :func:`~scheduler.cost.sync_latency` (a thread wake-up on the
cpu) on top of the event it waits for. Candidates are taken in issue
order; one is tried only where another compute stream of its device idles
for part of the time it runs, and kept only if lowering the plan again
with it split (one part per compute stream of the device) shortens the
simulated makespan by more than one wake-up, with no more streams.
So branches already running side by side stay whole, and the join they
feed is split. Past :data:`MAX_TRIALS` candidates (each try lowers the
whole plan again), they are first tried all at once. The planner then
keeps the splits only if they save more than the extra steps and streams
cost the host to start (:func:`scheduler.dispatch.start_latency`), and
subtracts what they save from the plan's predicted makespan.

**Ordering and memory.** The parts of a node are unordered among
themselves; each waits for what the node would have waited for, and every
reader of the split tensor waits for every part
(:mod:`scheduler.lowering`). The tensor counts as written by all its parts:
storage reuse needs every part and every reader done
(:mod:`scheduler.planner`), and :func:`scheduler.happens_before.check_plan`
proves that, and that the parts' rows are disjoint and cover the tensor.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx

from devices import Device, get_api

from .cost import CostModel, sync_latency
from .dag import Entry, NodeSpec, TensorSpec, node_spec
from .fusion import broadcasts
from .plan import Copy, Launch, Part, RecordEvent, WaitEvent

if TYPE_CHECKING:
    from .lowering import Lowered

__all__ = (
    "ALIGN_BYTES",
    "MIN_BYTES",
    "RowSplit",
    "Timeline",
    "choose_splits",
    "compute_streams",
    "row_cuts",
    "simulate",
    "split_launch",
)

#: The smallest output worth splitting by default: 1 MiB. Below it, a
#: part's share of the work is worth a few tens of microseconds, about what
#: waking a second stream's thread costs.
MIN_BYTES = 1 << 20
#: Part boundaries fall on multiples of this many bytes where the rows allow:
#: a cache line, so no two parts write the same one.
ALIGN_BYTES = 64
#: A candidate is tried only where the other streams of its device idle for
#: at least this share of its predicted run.
MIN_IDLE_SHARE = 0.05
#: The most times one plan is lowered again to try splits: beyond it, the
#: candidates are first tried all at once (plans of thousands of nodes).
MAX_TRIALS = 32


@dataclass(frozen=True)
class RowSplit:
    """Which launches the planner may split, and when (see the module
    docstring).

    :ivar elementwise: whether a node's kernel is elementwise.
    :ivar min_bytes: the smallest output worth splitting.
    :ivar kinds: the device kinds whose streams may share a node;
        ``None`` (the default): those whose streams compute side by side
        (:attr:`devices.DeviceAPI.concurrent_streams`).
    """

    elementwise: Callable[[NodeSpec], bool]
    min_bytes: int = MIN_BYTES
    kinds: frozenset[str] | None = None

    def splits_on(self, device: Device) -> bool:
        """Whether launches on ``device`` may be cut across its streams.

        :param device: the device.
        """
        if self.kinds is not None:
            return device.kind in self.kinds
        return get_api(device).concurrent_streams


def row_cuts(
    output: TensorSpec, inputs: Sequence[TensorSpec]
) -> tuple[bool, ...] | None:
    """How the parts of an elementwise node read its inputs.

    :param output: the node's one output.
    :param inputs: its inputs.
    :return: per input, ``True`` if each part reads its own rows of it (the
        output's shape), ``False`` if each reads it whole (it broadcasts
        without spanning axis 0); ``None`` if some input is neither, or the
        output has fewer than 2 rows.
    """
    shape = output.shape
    if not shape or shape[0] < 2:
        return None
    cuts = []
    for tensor in inputs:
        if tensor.shape == shape:
            cuts.append(True)
        elif (len(tensor.shape) < len(shape) or tensor.shape[0] == 1) and broadcasts(
            tensor.shape, shape
        ):
            cuts.append(False)
        else:
            return None
    return tuple(cuts)


def split_launch(
    launch: Launch, tensors: Mapping[Entry, TensorSpec], count: int
) -> tuple[Launch, ...]:
    """Cut ``launch`` into ``count`` parts of about as many rows each.

    Boundaries fall on :data:`ALIGN_BYTES` multiples where every part still
    gets a row; there are fewer parts if there are fewer rows.

    :param launch: an elementwise launch with one output.
    :param tensors: the shape and dtype of every tensor.
    :param count: parts wanted, at least 1.
    :return: the parts (``(launch,)`` when it cannot or need not split).
    :raises ValueError: if the launch's tensors do not allow a split
        (:func:`row_cuts`).
    """
    outputs = launch.args[launch.num_inputs :]
    if count < 2:
        return (launch,)
    if len(outputs) != 1:
        raise ValueError(f"{launch.name!r} has {len(outputs)} outputs, not 1")
    output = tensors[outputs[0]]
    cuts = row_cuts(output, [tensors[e] for e in launch.args[: launch.num_inputs]])
    if cuts is None:
        raise ValueError(f"{launch.name!r} cannot be split into rows")
    bounds = _bounds(output, count)
    rows = output.shape[0]
    return tuple(
        dataclasses.replace(
            launch,
            work=launch.work * (stop - start) / rows,
            part=Part(index, len(bounds) - 1, start, stop, cuts),
        )
        for index, (start, stop) in enumerate(itertools.pairwise(bounds))
    )


def _bounds(output: TensorSpec, count: int) -> list[int]:
    """Row boundaries of ``count`` balanced parts: 0, ..., rows."""
    rows = output.shape[0]
    count = min(count, rows)
    row_bytes = output.nbytes // rows
    unit = ALIGN_BYTES // math.gcd(ALIGN_BYTES, row_bytes) if row_bytes else 1
    aligned = [0, *(round(rows * i / count / unit) * unit for i in range(1, count))]
    aligned.append(rows)
    if all(a < b for a, b in itertools.pairwise(aligned)):
        return aligned
    return [rows * i // count for i in range(count + 1)]


def _candidate(
    dag: nx.DiGraph,
    launch: Launch,
    device: Device,
    tensors: Mapping[Entry, TensorSpec],
    options: RowSplit,
) -> bool:
    """Whether ``launch`` may split at all (before asking what it saves)."""
    if isinstance(launch, Copy) or launch.part is not None:
        return False
    if launch.nid not in dag or not options.splits_on(device):
        return False
    outputs = launch.args[launch.num_inputs :]
    if len(outputs) != 1 or tensors[outputs[0]].nbytes < options.min_bytes:
        return False
    inputs = [tensors[e] for e in launch.args[: launch.num_inputs]]
    if row_cuts(tensors[outputs[0]], inputs) is None:
        return False
    return options.elementwise(node_spec(dag, launch.nid))


@dataclass(frozen=True)
class Timeline:
    """A plan's simulated run (:func:`simulate`).

    :ivar makespan: seconds until the last stream is done.
    :ivar spans: each launch's stream, start and finish, by
        :attr:`~scheduler.plan.Launch.key`.
    :ivar busy: per stream, its launches' starts and finishes, in order.
    """

    makespan: float
    spans: Mapping[tuple[int, int], tuple[int, float, float]]
    busy: tuple[tuple[tuple[float, float], ...], ...]


def simulate(lowered: Lowered, cost: CostModel) -> Timeline:
    """Run a lowered plan on the cost model's clock.

    Steps are taken in issue order. A stream runs its steps one after
    another; a launch takes ``compute_time`` (a part its share of it, by
    rows), a copy ``transfer_time``; a record marks its stream's time; a
    wait whose event comes later than its stream gets there resumes at the
    event plus the waiting device's :func:`~scheduler.cost.sync_latency`.

    :param lowered: the plan's streams and issue order.
    :param cost: the cost model.
    :return: the simulated run.
    """
    streams = lowered.streams
    clock = [0.0] * len(streams)
    recorded: dict[int, float] = {}
    spans: dict[tuple[int, int], tuple[int, float, float]] = {}
    busy: list[list[tuple[float, float]]] = [[] for _ in streams]
    wake = {s.device: sync_latency(cost, s.device) for s in streams}
    for s, i in lowered.order:
        step = streams[s].steps[i]
        if isinstance(step, RecordEvent):
            recorded[step.event] = clock[s]
        elif isinstance(step, WaitEvent):
            reached = recorded.get(step.event, 0.0)
            if reached > clock[s]:
                clock[s] = reached + wake[streams[s].device]
        else:
            start = clock[s]
            clock[s] = start + _duration(step, streams[s].device, lowered, cost)
            spans[step.key] = (s, start, clock[s])
            busy[s].append((start, clock[s]))
    return Timeline(max(clock, default=0.0), spans, tuple(map(tuple, busy)))


def _duration(
    launch: Launch, device: Device, lowered: Lowered, cost: CostModel
) -> float:
    if isinstance(launch, Copy):
        source = launch.src
        owner = lowered.aliases.get(source, source)
        nbytes = lowered.tensors[source].nbytes
        return cost.transfer_time(nbytes, lowered.location[owner], device)
    seconds = cost.compute_time(launch.nid, device)
    part = launch.part
    if part is None:
        return seconds
    output = lowered.tensors[launch.args[launch.num_inputs]]
    return seconds * (part.stop - part.start) / output.shape[0]


def choose_splits(
    dag: nx.DiGraph,
    lowered: Lowered,
    relower: Callable[[Mapping[int, int]], Lowered],
    cost: CostModel,
    options: RowSplit,
) -> tuple[Lowered, float]:
    """Split the launches that shorten the simulated run (see the module
    docstring).

    :param dag: the graph.
    :param lowered: the plan lowered without splits.
    :param relower: lowers the same placement again with these nodes split
        into that many parts (:func:`scheduler.lowering.lower`'s
        ``splits``).
    :param cost: the cost model.
    :param options: what may split.
    :return: the plan lowered with the chosen splits (``lowered`` itself if
        none pays), and the simulated seconds they save.
    """
    streams = compute_streams(lowered)
    candidates = [
        (launch, device)
        for s, i in lowered.order
        if isinstance(launch := lowered.streams[s].steps[i], Launch)
        and len(streams.get(device := lowered.streams[s].device, ())) >= 2
        and _candidate(dag, launch, device, lowered.tensors, options)
    ]
    if not candidates:
        return lowered, 0.0
    best, timeline = lowered, simulate(lowered, cost)
    base = timeline.makespan
    chosen: dict[int, int] = {}
    counts = {d: len(s) for d, s in streams.items()}
    beside = _Beside(best, timeline)

    def better(splits: dict[int, int], margin: float) -> bool:
        """Lower with ``splits``; keep it if it uses no more streams and
        finishes more than ``margin`` sooner."""
        nonlocal best, timeline, beside, chosen
        trial = relower(splits)
        if {d: len(s) for d, s in compute_streams(trial).items()} != counts:
            return False  # parts would open streams the plan does not have
        trial_timeline = simulate(trial, cost)
        if trial_timeline.makespan >= timeline.makespan - margin:
            return False
        chosen = splits
        best, timeline = trial, trial_timeline
        beside = _Beside(best, timeline)
        return True

    budget = MAX_TRIALS
    idle = [(launch, device) for launch, device in candidates if beside(launch, device)]
    if len(idle) > budget:
        # Too many to try one by one (each try lowers the whole plan again):
        # all at once first, the rest one by one within the budget.
        budget -= 1
        better(
            {launch.nid: counts[device] for launch, device in idle},
            max(sync_latency(cost, device) for _, device in idle),
        )
    for launch, device in candidates:
        if budget <= 0:
            break
        if launch.nid in chosen or not beside(launch, device):
            continue
        budget -= 1
        better({**chosen, launch.nid: counts[device]}, sync_latency(cost, device))
    return best, base - timeline.makespan


def compute_streams(lowered: Lowered) -> dict[Device, list[int]]:
    """The compute streams (not copy streams) of each device of a lowered
    plan, by index.

    :param lowered: the plan's streams.
    """
    compute: dict[Device, list[int]] = {}
    for s, stream in enumerate(lowered.streams):
        if any(
            isinstance(step, Launch) and not isinstance(step, Copy)
            for step in stream.steps
        ):
            compute.setdefault(stream.device, []).append(s)
    return compute


class _Beside:
    """Whether another compute stream of a launch's device idles for at
    least :data:`MIN_IDLE_SHARE` of the time the launch runs, in one
    simulated plan."""

    def __init__(self, lowered: Lowered, timeline: Timeline) -> None:
        self._timeline = timeline
        self._ends = [[b for _, b in spans] for spans in timeline.busy]
        self._compute = compute_streams(lowered)

    def __call__(self, launch: Launch, device: Device) -> bool:
        own, start, finish = self._timeline.spans[launch.key]
        if finish <= start:
            return False
        for s in self._compute.get(device, []):
            if s == own:
                continue
            busy = self._timeline.busy[s]
            covered = 0.0
            # the stream's spans are in order: skip those done by ``start``
            first = bisect.bisect_right(self._ends[s], start)
            for a, b in itertools.islice(busy, first, None):
                if a >= finish:
                    break
                covered += min(b, finish) - max(a, start)
            if finish - start - covered >= MIN_IDLE_SHARE * (finish - start):
                return True
        return False
