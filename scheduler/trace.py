"""Tracing a program's runs: what ran, on which stream, when, for how long.

Tracing is opt-in: ``Program(..., tracer=recorder)`` or
``program.set_tracer(recorder)`` with a :class:`TraceRecorder`. An untraced
program pays nothing, not even a check per launch. A traced one wraps each
pre-bound call when it is bound, so that every launch records its own span
on the thread that runs it: the stream's worker for ordinary kernels and
copies, the event loop for coroutine kernels.

Each launch gets two durations:

* its *wall* span, ``start`` and ``end`` on the host's ``perf_counter``
  clock: what really happened on the stream (the timeline shows these);
* its *device time*, what the device's own clock says it took (per-node
  profiles report these), as the device's
  :class:`~devices.CallTimer` (:meth:`devices.DeviceAPI.call_timer`) says:

  - by default (the host): the wall time of the call on the stream's thread;
  - a device that models its time (the simulated accelerator): the
    duration its model charges (:mod:`devices._timing`:
    ``launch_overhead + work / flops`` for a kernel, and for a copy where
    only modelled devices and the host take part,
    :func:`devices.modelled_copy_seconds`), exact whatever the host's load;
    the wall span of such a kernel starts when its stream's thread got to
    it and lasts at least that long (the thread sleeps the rest of the
    modelled time after the call). Such a device keeps its own clock, which
    may run ahead of its threads (:mod:`devices.sim`), so a wall span can
    start after the next device's work it enabled did: a wait ends at its
    record, or when its stream's next launch started, if that was earlier;
  - a device that records marks around the call on its stream (CUDA
    events): the time between them, read once the run is over (the wall
    span of such a launch is when the host issued it);
  - a coroutine kernel: its wall time on the event loop.

Records and waits are not timed by the streams (that would add work to every
stream); they are derived from the launches once a run is over. A record
happens when its stream finishes the step before it; a wait starts there and
ends when the record it waits for happened, or at once if that was earlier.
A stream that failed or stopped ends at its last launch.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from devices import (
    CallTimer,
    Device,
    NDArray,
    Stream,
    get_api,
    modelled_copy_seconds,
)
from devices._event import Completion

from .dag import Entry
from .plan import Copy, Launch, Plan, RecordEvent

__all__ = ("ProgramTrace", "RunTrace", "Span", "SpanKind", "TraceRecorder")

SpanKind = Literal["kernel", "copy", "record", "wait"]
Kernel = Callable[..., Any]


@dataclass(frozen=True)
class Span:
    """One step of one run on one stream.

    :ivar kind: ``"kernel"``, ``"copy"``, ``"record"`` or ``"wait"``.
    :ivar stream: the stream's index in the plan.
    :ivar label: the label of the :class:`~devices.Stream` that ran it (one
        worker thread: concurrent runs use different streams).
    :ivar device: the stream's device.
    :ivar start: when it started, host ``perf_counter`` seconds.
    :ivar end: when it ended (``start`` for a record).
    :ivar device_time: seconds by the device's clock (see the module
        docstring); ``end - start`` for waits, 0 for records.
    :ivar launch: the launch (kernels and copies).
    :ivar event: the event (records and waits).
    """

    kind: SpanKind
    stream: int
    label: str
    device: Device
    start: float
    end: float
    device_time: float
    launch: Launch | None = None
    event: int | None = None


@dataclass(frozen=True)
class RunTrace:
    """One traced run of a program.

    :ivar run: the run's number in its recorder (increasing).
    :ivar context: which bound program ran it (its number in the recorder):
        concurrent runs use different programs.
    :ivar start: when the run was issued, host ``perf_counter`` seconds.
    :ivar end: when its last stream finished its last step.
    :ivar spans: every launch, record and wait that ran, stream by stream,
        each stream's in order.
    :ivar complete: whether every launch of the plan ran (false for a run
        that failed, was stopped or was cancelled).
    :ivar outputs: with a capturing recorder, a host copy of every output
        of every launch that ran, by entry, taken right after it ran.
    """

    run: int
    context: int
    start: float
    end: float
    spans: tuple[Span, ...]
    complete: bool
    outputs: Mapping[Entry, np.ndarray[Any, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def launches(self) -> tuple[Span, ...]:
        """The kernel and copy spans."""
        return tuple(s for s in self.spans if s.launch is not None)


@dataclass(frozen=True)
class _Slot:
    """What a traced call is, fixed when it is bound."""

    stream: int
    step: int
    launch: Launch
    modelled: float | None  # the device's modelled time, if it models one
    marked: CallTimer | None  # the timer that reads its marks, if it marks


class _RunRecord:
    """What a run's calls report while it is in flight."""

    __slots__ = ("completions", "context", "outputs", "run", "spans", "start", "trace")

    def __init__(self, run: int, trace: ProgramTrace) -> None:
        self.run = run
        self.trace = trace
        self.context = trace.context
        self.start = time.perf_counter()
        # (slot, start, end, cuda events or None), appended by the threads
        # that run the calls (list.append is atomic).
        self.spans: list[tuple[int, float, float, Any]] = []
        self.outputs: dict[Entry, np.ndarray[Any, Any]] = {}
        # Set once the run is issued; it is over when all are done. (Their
        # done flag is set before their waiters wake, so a run that a caller
        # saw finish is always readable: no callback can still be pending.)
        self.completions: Sequence[Completion] | None = None

    @property
    def finished(self) -> bool:
        completions = self.completions
        return completions is not None and all(c.done for c in completions)


class TraceRecorder:
    """Collects the runs of every program traced with it.

    Thread-safe. Memory stays bounded: only the latest ``max_runs`` runs
    are kept.

    :param max_runs: how many runs to keep.
    :param capture: also keep a host copy of every output of every launch,
        made on its stream right after it ran (:attr:`RunTrace.outputs`);
        this costs a device-to-host copy per tensor.
    :raises ValueError: if ``max_runs`` < 1.
    """

    def __init__(self, max_runs: int = 1000, *, capture: bool = False) -> None:
        if max_runs < 1:
            raise ValueError("max_runs must be >= 1")
        self.capture = capture
        self._lock = threading.Lock()
        self._records: collections.deque[_RunRecord] = collections.deque(
            maxlen=max_runs
        )
        self._run_ids = itertools.count()
        self._context_ids = itertools.count()

    def bind(
        self, plan: Plan, streams: Sequence[Stream], arrays: Mapping[Entry, NDArray]
    ) -> ProgramTrace:
        """Trace one bound program (called by :class:`~scheduler.dispatch.Program`).

        :param plan: the program's plan.
        :param streams: its streams, one per plan stream.
        :param arrays: its tensors, by entry.
        :return: the hooks the program calls.
        """
        return ProgramTrace(self, next(self._context_ids), plan, streams, arrays)

    def runs(self, context: int | None = None) -> list[RunTrace]:
        """The finished runs, oldest first.

        :param context: only the runs of this bound program
            (:attr:`ProgramTrace.context`).
        """
        with self._lock:
            records = [r for r in self._records if r.finished]
        if context is not None:
            records = [r for r in records if r.context == context]
        return [record.trace.derive(record) for record in records]

    def clear(self) -> None:
        """Forget the runs recorded so far (runs in flight included)."""
        with self._lock:
            self._records.clear()

    def _start(self, trace: ProgramTrace) -> _RunRecord:
        with self._lock:
            record = _RunRecord(next(self._run_ids), trace)
            self._records.append(record)
        return record


class ProgramTrace:
    """The tracing hooks of one bound program. Made by
    :meth:`TraceRecorder.bind`; the program calls :meth:`wrap` when it
    compiles, :meth:`begin` when a run starts and :meth:`end` once the run
    is issued."""

    def __init__(
        self,
        recorder: TraceRecorder,
        context: int,
        plan: Plan,
        streams: Sequence[Stream],
        arrays: Mapping[Entry, NDArray],
    ) -> None:
        self.recorder = recorder
        self.context = context
        self.plan = plan
        self._labels = [stream.label for stream in streams]
        self._arrays = arrays
        self._slots: list[_Slot] = []
        self.current: _RunRecord | None = None

    # -- binding ---------------------------------------------------------------

    def wrap(self, fn: Kernel, stream: int, step: int, launch: Launch) -> Kernel:
        """Wrap a pre-bound call so that it records its span.

        :param fn: the call (a coroutine function stays one).
        :param stream: its stream's index in the plan.
        :param step: the launch's index in that stream's steps.
        :param launch: the launch it runs.
        :return: the traced call.
        """
        device = self.plan.streams[stream].device
        timer = get_api(device).call_timer(device)
        coroutine = inspect.iscoroutinefunction(fn)
        marks = timer if timer.marks and not coroutine else None
        slot = len(self._slots)
        modelled = self._modelled(timer, launch)
        self._slots.append(_Slot(stream, step, launch, modelled, marks))
        clock = time.perf_counter
        outputs = launch.args[launch.num_inputs :]
        if coroutine:

            async def traced_async(*args: Any) -> None:
                start = clock()
                try:
                    await fn(*args)
                finally:
                    self._append(slot, start, clock(), None)
                self._capture(outputs, launch)

            return traced_async
        if marks is not None:
            return _marked(self, fn, slot, outputs, launch, marks)

        def traced(*args: Any) -> None:
            start = clock()
            try:
                fn(*args)
            finally:
                self._append(slot, start, clock(), None)
            self._capture(outputs, launch)

        return traced

    def _append(self, slot: int, start: float, end: float, events: Any) -> None:
        record = self.current
        if record is not None:
            record.spans.append((slot, start, end, events))

    def _capture(self, entries: Sequence[Entry], launch: Launch) -> None:
        """Keep host copies of a launch's outputs (capturing recorders); a
        part of a split node copies its rows into the tensor's capture,
        which its other parts fill in."""
        record = self.current
        if record is None or not self.recorder.capture:
            return
        part = launch.part
        for entry in entries:
            value = self._arrays[entry].numpy()
            if part is None:
                record.outputs[entry] = value
                continue
            with self.recorder._lock:  # the parts run on different threads
                whole = record.outputs.setdefault(entry, np.zeros_like(value))
                whole[part.start : part.stop] = value[part.start : part.stop]

    def _modelled(self, timer: CallTimer, launch: Launch) -> float | None:
        """The device's modelled duration of ``launch``, if it models one."""
        if isinstance(launch, Copy):
            src, dst = self._arrays[launch.src], self._arrays[launch.dst]
            return modelled_copy_seconds(src.buffer, dst.buffer, src.nbytes)
        model = timer.model
        if model is None:
            return None
        nbytes = 0
        if not math.isinf(model.memory_bandwidth):  # a roofline: count bytes
            nbytes = sum(self._part_nbytes(e, launch) for e in set(launch.args))
        return model.compute_seconds(launch.work, nbytes)

    def _part_nbytes(self, entry: Entry, launch: Launch) -> int:
        """Bytes ``launch`` touches of ``entry``: its rows, for a part of a
        split node and a tensor it cuts."""
        nbytes = self._arrays[entry].nbytes
        part = launch.part
        if part is None:
            return nbytes
        position = launch.args.index(entry)
        if position < launch.num_inputs and not part.cut[position]:
            return nbytes
        rows = self.plan.tensors[entry].shape[0]
        return nbytes * (part.stop - part.start) // rows

    # -- running ---------------------------------------------------------------

    def begin(self) -> None:
        """A run starts: later spans belong to it."""
        self.current = self.recorder._start(self)

    def end(self, completions: Sequence[Completion]) -> None:
        """The run is issued: it is over when every completion is done.

        :param completions: one per stream, recorded after its last step.
        """
        record = self.current
        if record is not None and record.completions is None:
            record.completions = list(completions)

    # -- reading ---------------------------------------------------------------

    def derive(self, record: _RunRecord) -> RunTrace:
        """The run's spans: launches as measured, records and waits derived."""
        measured: dict[tuple[int, int], tuple[float, float, float]] = {}
        for slot_index, start, end, events in list(record.spans):
            slot = self._slots[slot_index]
            if slot.modelled is not None:
                device_time = slot.modelled
                # The sim sleeps the rest of a kernel's modelled time after
                # the call returns: its stream is busy until then.
                end = max(end, start + device_time)
            elif events is not None and slot.marked is not None:
                device_time = slot.marked.elapsed(*events)
            else:
                device_time = end - start
            measured[slot.stream, slot.step] = (start, end, device_time)
        _clip(self.plan, measured)
        spans, complete = _derive(self.plan, self._labels, measured, record.start)
        end = max((span.end for span in spans), default=record.start)
        return RunTrace(
            record.run,
            record.context,
            record.start,
            end,
            spans,
            complete,
            MappingProxyType(dict(record.outputs)),
        )


def _derive(
    plan: Plan,
    labels: Sequence[str],
    measured: dict[tuple[int, int], tuple[float, float, float]],
    run_start: float,
) -> tuple[tuple[Span, ...], bool]:
    """Walk every stream's steps in order, placing records and waits
    between the measured launches; see the module docstring."""
    count = len(plan.streams)
    recorder_of = {
        step.event: s
        for s, stream in enumerate(plan.streams)
        for step in stream.steps
        if isinstance(step, RecordEvent)
    }
    position = [0] * count
    cursor = [run_start] * count
    stopped = [False] * count
    recorded: dict[int, float] = {}
    per_stream: list[list[Span]] = [[] for _ in range(count)]

    def finished(s: int) -> bool:
        return stopped[s] or position[s] >= len(plan.streams[s].steps)

    progress = True
    while progress:
        progress = False
        for s, stream in enumerate(plan.streams):
            while not finished(s):
                step = stream.steps[position[s]]
                device, label = stream.device, labels[s]
                if isinstance(step, Launch):
                    times = measured.get((s, position[s]))
                    if times is None:  # never ran: the run failed or stopped
                        stopped[s] = True
                        break
                    start, end, device_time = times
                    kind: SpanKind = "copy" if isinstance(step, Copy) else "kernel"
                    per_stream[s].append(
                        Span(kind, s, label, device, start, end, device_time, step)
                    )
                    cursor[s] = end
                elif isinstance(step, RecordEvent):
                    recorded[step.event] = cursor[s]
                    per_stream[s].append(
                        Span(
                            "record",
                            s,
                            label,
                            device,
                            cursor[s],
                            cursor[s],
                            0.0,
                            event=step.event,
                        )
                    )
                else:
                    source = recorder_of.get(step.event)
                    if step.event in recorded or source is None:
                        until = recorded.get(step.event, cursor[s])
                        follower = _next_start(plan, measured, s, position[s])
                        if follower is not None:  # the stream moved on by then
                            until = min(until, follower)
                        until = max(cursor[s], until)
                    elif finished(source):  # its record never happened
                        stopped[s] = True
                        break
                    else:
                        break  # come back once the recording stream got there
                    per_stream[s].append(
                        Span(
                            "wait",
                            s,
                            label,
                            device,
                            cursor[s],
                            until,
                            until - cursor[s],
                            event=step.event,
                        )
                    )
                    cursor[s] = until
                position[s] += 1
                progress = True
    complete = all(position[s] >= len(plan.streams[s].steps) for s in range(count))
    return tuple(span for spans in per_stream for span in spans), complete


def _clip(
    plan: Plan, measured: dict[tuple[int, int], tuple[float, float, float]]
) -> None:
    """End no launch after the next one on its stream starts: a stream runs
    one thing at a time, whatever a modelled duration or a clock says."""
    for s, stream in enumerate(plan.streams):
        later: float | None = None
        for step in range(len(stream.steps) - 1, -1, -1):
            times = measured.get((s, step))
            if times is None:
                continue
            start, end, device_time = times
            if later is not None and end > later:
                measured[s, step] = (start, max(start, later), device_time)
            later = start


def _next_start(
    plan: Plan,
    measured: dict[tuple[int, int], tuple[float, float, float]],
    stream: int,
    position: int,
) -> float | None:
    """When the first launch after ``position`` on ``stream`` started."""
    for step in range(position + 1, len(plan.streams[stream].steps)):
        times = measured.get((stream, step))
        if times is not None:
            return times[0]
    return None


def _marked(
    trace: ProgramTrace,
    fn: Kernel,
    slot: int,
    outputs: Sequence[Entry],
    launch: Launch,
    timer: CallTimer,
) -> Kernel:
    """A traced call on a device that times calls by marks on its stream
    (CUDA events): one recorded right before the call, one right after, on
    the stream the worker thread has made current."""
    clock = time.perf_counter

    def traced(*args: Any) -> None:
        before = timer.mark()
        start = clock()
        try:
            fn(*args)
        finally:
            end = clock()
            trace._append(slot, start, end, (before, timer.mark()))
        trace._capture(outputs, launch)

    return traced
