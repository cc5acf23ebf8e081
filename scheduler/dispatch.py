"""The dispatcher: runs a :class:`~scheduler.plan.Plan`.

Binding (:class:`Program`) happens once per run context: it allocates each
device's arena, makes a view for every tensor, creates the streams and the
events, and compiles the plan's steps into *actions*: pre-bound batches of
``(kernel, arrays, work)`` calls, records and waits. Running then only walks
the actions — a tight loop with no planning, no allocation, no task per node:

* a batch goes to its stream with one ``launch_many`` (the worker thread
  calls the kernels);
* records and waits become device-side event operations, so streams order
  themselves without the host;
* a coroutine kernel is awaited on the event loop, after an event tells the
  host that its inputs are ready.

The host awaits one final event per stream. :meth:`Program.run_sync` (for
callers without an event loop) skips the streams altogether when a plan is
one cpu stream and nothing else: its calls run on the calling thread, in
order, which is what the stream's worker would have done, minus the hop to
that thread and the wake back (tens of microseconds a run on a busy host).

A :class:`~scheduler.plan.Copy` step is bound to the devices' own copy
path (:func:`devices.copy_function`) between its two tensors, never to a
kernel; :func:`copy_now` runs one on the calling thread (the parameter
copies an executor makes once, :meth:`~scheduler.plan.Plan.parameter_copies`).

A kernel that raises fails the run with
:class:`~scheduler.errors.NodeFailedError` naming the node and the kernel's
own exception; the streams skip the rest of that run's work.

**Each run has its own cancel scope**, as trio gives each unit of work its
own: the checks compiled into the batches (every :data:`CHECK_EVERY` calls)
read the scope of the run in flight, and a stream that fails stops only the
scope of the run it belongs to. So nothing left over from one run (a
stream's failure callback that runs late, a stop meant for it) can stop the
next. Cancelling the awaiting task cancels its run's scope: the streams skip
the rest at their next check, in-flight work drains, and the cancellation
is re-raised; the program is then ready for the next run.
:meth:`Program.stop` (from the event loop, e.g. when an executor closes)
stops the run in flight, and only it, the same way from outside; that run
raises :class:`~devices.errors.ClosedResourceError` once drained.

A plan's start (how late its streams get going) is the cost model's
business, not the dispatcher's (:func:`scheduler.cost.start_latency`):
planning never runs streams.

A launch that is one part of a split node (:mod:`scheduler.split`) is bound
to views of its rows: the kernel sees ``a[r0:r1], ..., out[r0:r1]``.

A :class:`Bindable` kernel is bound to its arrays once, when the program is
(TVM's ``op_execs``): the views, layouts and small scratch buffers that
depend only on them are made then, not on every call.

Tracing is opt-in (:mod:`scheduler.trace`): a program given a
:class:`~scheduler.trace.TraceRecorder` binds traced calls instead of the
plain ones; without one, nothing on the run path changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from devices import (
    BatchError,
    Call,
    Device,
    Event,
    NDArray,
    Stream,
    copy_function,
    get_api,
)
from devices._event import Completion, wait_completion
from devices.errors import ClosedResourceError, StreamError

from .cost import runs_inline
from .dag import Entry
from .errors import NodeFailedError
from .plan import Copy, Launch, Plan, RecordEvent
from .trace import ProgramTrace, TraceRecorder

__all__ = (
    "CHECK_EVERY",
    "Bindable",
    "Program",
    "copy_now",
    "runs_inline",
)

#: A batch checks for cancellation (or failure elsewhere) once per this many
#: calls, and before every call estimated at :data:`HEAVY_WORK` FLOPs or
#: more: cheap enough to vanish in the per-node cost, frequent enough that a
#: cancelled run stops promptly.
CHECK_EVERY = 64
HEAVY_WORK = 1e5

Kernel = Callable[..., Any]


class Bindable:
    """A kernel that may also be bound to arrays that never change.

    :param call: the kernel, ``call(*arrays)``.
    :param binder: ``binder(*arrays)`` -> a call without arguments doing
        what ``call(*arrays)`` does, on those same arrays every time.
    :param takes_constant: whether ``binder`` also takes ``constant=``, the
        positions of the arrays whose *values* stay as they are at binding
        for the binding's life (parameters: an executor whose parameters
        change binds its programs again), so it may pack them once (a
        convolution's transformed weights).
    """

    __slots__ = ("_binder", "_call", "_takes_constant")

    def __init__(
        self,
        call: Kernel,
        binder: Callable[..., Callable[[], None]],
        *,
        takes_constant: bool = False,
    ) -> None:
        self._call = call
        self._binder = binder
        self._takes_constant = takes_constant

    def __call__(self, *arrays: Any) -> None:
        self._call(*arrays)

    def bind(
        self, *arrays: Any, constant: frozenset[int] = frozenset()
    ) -> Callable[[], None]:
        """The kernel bound to ``arrays`` (the caller keeps them alive);
        ``constant``: positions of arrays whose values never change while
        the binding lives."""
        if self._takes_constant:
            return self._binder(*arrays, constant=constant)
        return self._binder(*arrays)


class _Stopped(Exception):
    """Raised inside a stream to skip the rest of a cancelled or failed run."""


class _RunScope:
    """One run's cancel scope: set once to stop that run, never reset (the
    next run gets a new one)."""

    __slots__ = ("halted", "stopped")

    def __init__(self) -> None:
        self.stopped = False  # the streams skip the rest of this run
        self.halted = False  # ... because stop() was called

    def cancel(self) -> None:
        """Stop the run: a kernel failed, or its caller was cancelled."""
        self.stopped = True

    def halt(self) -> None:
        """Stop the run from outside (:meth:`Program.stop`)."""
        self.halted = True
        self.stopped = True


class _InFlight:
    """The scope of a program's run in flight: what the checks compiled into
    its batches read (they are bound once, to this, and serve every run)."""

    __slots__ = ("scope",)

    def __init__(self) -> None:
        self.scope = _RunScope()

    def begin(self) -> _RunScope:
        """A new run starts: give it its own scope."""
        scope = self.scope = _RunScope()
        return scope


def _check(in_flight: _InFlight) -> None:
    if in_flight.scope.stopped:
        raise _Stopped


@dataclass(frozen=True)
class _Batch:
    stream: int
    calls: list[Call]
    launches: list[Launch | None]  # per call; None for a check


@dataclass(frozen=True)
class _Record:
    stream: int
    event: int


@dataclass(frozen=True)
class _Wait:
    stream: int
    event: int


@dataclass(frozen=True)
class _AsyncCall:
    stream: int
    kernel: Kernel
    args: tuple[Any, ...]
    launch: Launch


_Action = _Batch | _Record | _Wait | _AsyncCall


def copy_now(copy: Copy, arrays: Mapping[Entry, NDArray]) -> None:
    """Run one copy step on the calling thread, now: the copies of
    parameters an executor makes once, when it loads them
    (:meth:`~scheduler.plan.Plan.parameter_copies`). The caller orders it
    against streams (no run in flight may use either tensor).

    :param copy: the step.
    :param arrays: its tensors, by entry (the source may be larger: it is
        read from its start).
    """
    src, dst = arrays[copy.src], arrays[copy.dst]
    copy_function(
        src.buffer, src.byte_offset, dst.buffer, dst.byte_offset, dst.nbytes
    )()


class Program:
    """A plan bound to memory, kernels and streams, ready to run many times.

    One program serves one run at a time (a run context); executors keep a
    pool of them for concurrent runs.

    :param plan: the plan.
    :param kernels: the kernel of every launch, by node id (copies need
        none: :meth:`~scheduler.plan.Plan.kernel_launches` lists the
        launches that do).
    :param external: the arrays of the plan's external tensors (graph inputs
        and parameters), by entry.
    :param tracer: records every run's spans (see :meth:`set_tracer`).
    :param constant: external tensors whose values stay as they are for the
        program's life (parameters): kernels may pack them when bound
        (:class:`Bindable`).
    :raises ValueError: if an external tensor is missing or misplaced.
    """

    def __init__(
        self,
        plan: Plan,
        kernels: Mapping[int, Kernel],
        external: Mapping[Entry, NDArray],
        *,
        tracer: TraceRecorder | None = None,
        constant: Collection[Entry] = (),
    ) -> None:
        self.plan = plan
        self._constant = frozenset(constant)
        self._arenas: list[NDArray] = []
        self._streams: list[Stream] = []
        self._closed = False
        self._kernels = kernels
        self._trace: ProgramTrace | None = None
        try:
            self.arrays = self._bind_memory(external)
            for stream_plan in plan.streams:
                api = get_api(stream_plan.device.kind)
                self._streams.append(api.create_stream(stream_plan.device))
            self._events = [Event(f"e{i}") for i in range(plan.num_events)]
            self._in_flight = _InFlight()
            if tracer is not None:
                self._trace = tracer.bind(plan, self._streams, self.arrays)
            self._actions = self._compile(kernels)
        except BaseException:
            self.close()
            raise
        self._has_async = any(isinstance(a, _AsyncCall) for a in self._actions)
        self._batches = {id(a.calls): a for a in self._actions if isinstance(a, _Batch)}
        self._inline = self._inline_batch()

    def set_tracer(self, tracer: TraceRecorder | None) -> ProgramTrace | None:
        """Record every later run into ``tracer``; ``None`` stops tracing.
        Call it between runs: the calls are bound again.

        :return: the program's hooks in ``tracer`` (their ``context`` picks
            this program's runs out of the recorder), or ``None``.
        :raises ClosedResourceError: if the program was closed.
        """
        self._check_open()
        self._trace = (
            None
            if tracer is None
            else tracer.bind(self.plan, self._streams, self.arrays)
        )
        self._actions = self._compile(self._kernels)
        self._has_async = any(isinstance(a, _AsyncCall) for a in self._actions)
        self._batches = {id(a.calls): a for a in self._actions if isinstance(a, _Batch)}
        self._inline = self._inline_batch()
        return self._trace

    # -- binding -------------------------------------------------------------

    def _bind_memory(self, external: Mapping[Entry, NDArray]) -> dict[Entry, NDArray]:
        plan = self.plan
        arena_of: dict[Device, NDArray] = {}
        for device, arena in plan.arenas.items():
            buffer = get_api(device.kind).alloc(device, arena.size)
            arena_of[device] = NDArray(buffer, (arena.size,), "uint8")
            self._arenas.append(arena_of[device])
        arrays: dict[Entry, NDArray] = {}
        for entry, placement in plan.storage.items():
            spec = plan.tensors[entry]
            if placement.where == "arena":
                arena_array = arena_of[placement.device]
                arrays[entry] = NDArray(
                    arena_array.buffer, spec.shape, spec.dtype, placement.offset
                )
            elif placement.where == "external":
                given = external.get(entry)
                if given is None:
                    raise ValueError(f"no array bound for external tensor {entry}")
                if given.device != placement.device:
                    raise ValueError(
                        f"tensor {entry} must be on {placement.device}, "
                        f"got {given.device}"
                    )
                arrays[entry] = given
        for entry, placement in plan.storage.items():
            if placement.where == "alias":
                spec = plan.tensors[entry]
                owner = arrays[plan.resolve(entry)]
                arrays[entry] = NDArray(
                    owner.buffer, spec.shape, spec.dtype, owner.byte_offset
                )
        return arrays

    def _compile(self, kernels: Mapping[int, Kernel]) -> list[_Action]:
        plan, in_flight = self.plan, self._in_flight
        actions: list[_Action] = []
        pending: dict[int, _Batch] = {}
        unchecked_calls: dict[int, int] = {}

        def flush(stream: int) -> None:
            unchecked_calls.pop(stream, None)  # a new batch starts with a check
            batch = pending.pop(stream, None)
            if batch is not None and batch.calls:
                actions.append(batch)

        for stream, index in plan.order:
            step = plan.streams[stream].steps[index]
            if isinstance(step, Launch):
                fn, args = self._bind_launch(step, kernels, stream)
                is_async = inspect.iscoroutinefunction(fn)
                if self._trace is not None:
                    fn = self._trace.wrap(fn, stream, index, step)
                if is_async:
                    flush(stream)
                    actions.append(_AsyncCall(stream, fn, args, step))
                    continue
                batch = pending.setdefault(stream, _Batch(stream, [], []))
                unchecked = unchecked_calls.get(stream, CHECK_EVERY)
                if unchecked >= CHECK_EVERY or step.work >= HEAVY_WORK:
                    batch.calls.append((_check, (in_flight,), 0.0))
                    batch.launches.append(None)
                    unchecked = 0
                unchecked_calls[stream] = unchecked + 1
                batch.calls.append((fn, args, step.work))
                batch.launches.append(step)
            else:
                flush(stream)
                if isinstance(step, RecordEvent):
                    actions.append(_Record(stream, step.event))
                else:
                    actions.append(_Wait(stream, step.event))
        for stream in list(pending):
            flush(stream)
        return actions

    def _inline_batch(self) -> _Batch | None:
        """All the calls as one batch, if the plan may run on the calling
        thread: one plain cpu stream (no sim timing, no cuda), no coroutine
        kernels, no tracing (its spans are per stream)."""
        plan = self.plan
        if (
            self._trace is not None
            or not runs_inline(plan)
            or not all(isinstance(a, _Batch) for a in self._actions)
        ):
            return None
        calls: list[Call] = []
        launches: list[Launch | None] = []
        for action in self._actions:
            if isinstance(action, _Batch):
                calls += action.calls
                launches += action.launches
        return _Batch(0, calls, launches)

    def _bind_launch(
        self, step: Launch, kernels: Mapping[int, Kernel], stream: int
    ) -> tuple[Kernel, tuple[Any, ...]]:
        if isinstance(step, Copy):
            src, dst = self.arrays[step.src], self.arrays[step.dst]
            copy = copy_function(
                src.buffer, src.byte_offset, dst.buffer, dst.byte_offset, src.nbytes
            )
            return copy, ()
        kernel = kernels[step.nid]
        arrays = tuple(self.arrays[e].backend_array() for e in step.args)
        part = step.part
        if part is not None:
            # A part of a split node: its rows of the output and of every
            # input cut with it; the other inputs whole (they broadcast).
            rows = slice(part.start, part.stop)
            cut = (*part.cut, *(True for _ in step.args[step.num_inputs :]))
            arrays = tuple(
                array[rows] if sliced else array
                for array, sliced in zip(arrays, cut, strict=True)
            )
        # A kernel that binds to its arrays does its per-array work once,
        # here: this program's arrays are the same for every run.
        if isinstance(kernel, Bindable):
            constant = frozenset(
                i for i, entry in enumerate(step.args) if entry in self._constant
            )
            try:
                return kernel.bind(*arrays, constant=constant), ()
            except Exception as exc:  # as a failing call would: name the node
                raise self._node_error(step, stream, exc) from exc
        return kernel, arrays

    # -- running ---------------------------------------------------------------

    def _issue(self, actions: Sequence[_Action]) -> None:
        streams, events = self._streams, self._events
        for action in actions:
            if isinstance(action, _Batch):
                streams[action.stream].launch_many(action.calls)
            elif isinstance(action, _Record):
                streams[action.stream].record(events[action.event])
            elif isinstance(action, _Wait):
                streams[action.stream].wait_event(events[action.event])

    def _finish(self, scope: _RunScope) -> list[Completion]:
        def stop_others(completion: Completion) -> None:
            if completion.error is not None:
                scope.cancel()  # this run's other streams skip the rest

        completions = [stream.record().completion for stream in self._streams]
        for completion in completions:
            completion.add_callback(stop_others)
        if self._trace is not None:
            self._trace.end(completions)
        return completions

    @property
    def needs_event_loop(self) -> bool:
        """Whether the plan has coroutine kernels (so only :meth:`run`, not
        :meth:`run_sync`, can run it)."""
        return self._has_async

    def launch(self) -> list[Completion]:
        """Issue the whole run without waiting; return one completion per
        stream. Only for programs without coroutine kernels.

        :raises ClosedResourceError: if the program was closed.
        """
        return self._launch()[0]

    def _launch(self) -> tuple[list[Completion], _RunScope]:
        self._check_open()
        scope = self._in_flight.begin()
        if self._trace is not None:
            self._trace.begin()
        self._issue(self._actions)
        return self._finish(scope), scope

    def stop(self) -> None:
        """Stop the run in flight, and only it: the streams skip the rest of
        its work at their next check, in-flight calls finish, and
        :meth:`run` raises :class:`ClosedResourceError` once they have
        (unless a kernel failed first, or the run got through its last
        check). No effect between runs: the next run has a scope of its
        own."""
        self._in_flight.scope.halt()

    async def run(self) -> None:
        """Run once; return when every stream is done.

        :raises NodeFailedError: if a kernel raised (chained, and named in
            the message).
        :raises ClosedResourceError: if the program was closed, or the run
            was stopped with :meth:`stop`.
        """
        self._check_open()
        scope = self._in_flight.begin()
        if self._trace is not None:
            self._trace.begin()
        completions: list[Completion] = []
        try:
            if self._has_async:
                await self._run_with_coroutines(scope)
            else:
                self._issue(self._actions)
            completions = self._finish(scope)
            for completion in completions:
                await wait_completion(completion)
        except BaseException:
            # Cancelled (or failed on the host): stop the streams at their
            # next check, and let in-flight work drain before giving up the
            # memory it uses.
            scope.cancel()
            with anyio.CancelScope(shield=True):
                for completion in completions or self._finish(scope):
                    await wait_completion(completion)
            raise
        self._raise_first_error(completions, scope)

    def run_sync(self) -> None:
        """Run once, blocking the calling thread (no event loop needed).

        :raises NodeFailedError: if a kernel raised (chained, and named in
            the message).
        :raises ClosedResourceError: if the program was closed, or the run
            was stopped with :meth:`stop`.
        """
        if self._has_async:
            raise TypeError("a plan with coroutine kernels needs `await run()`")
        if self._inline is not None:
            self._run_inline(self._inline)
            return
        completions, scope = self._launch()
        for completion in completions:
            completion.wait()
        self._raise_first_error(completions, scope)

    def _run_inline(self, batch: _Batch) -> None:
        """Run ``batch`` on this thread, failing as the stream would have:
        a kernel's error becomes :class:`NodeFailedError`, a stop from
        another thread (:meth:`stop`) :class:`ClosedResourceError` at the
        next check."""
        self._check_open()
        self._in_flight.begin()
        index = 0
        try:
            for fn, args, _ in batch.calls:
                fn(*args)
                index += 1
        except _Stopped:
            stopped = "the run was stopped before it finished"
            raise ClosedResourceError(stopped) from None
        except Exception as exc:
            launch = batch.launches[index]
            if launch is None:  # a check itself cannot fail but for a stop
                raise
            raise self._node_error(launch, batch.stream, exc) from exc

    async def _run_with_coroutines(self, scope: _RunScope) -> None:
        streams = self._streams
        for action in self._actions:
            if scope.stopped:  # failed or stopped: launch nothing more
                return
            if isinstance(action, _AsyncCall):
                # The host runs this node: wait for its stream to get here.
                ready = streams[action.stream].record().completion
                await wait_completion(ready)
                if ready.error is not None:  # a kernel before it failed
                    self._raise_first_error([ready], scope)
                try:
                    await action.kernel(*action.args)
                except Exception as exc:
                    error = self._node_error(action.launch, action.stream, exc)
                    raise error from exc
            else:
                self._issue((action,))

    # -- errors ------------------------------------------------------------------

    def _raise_first_error(
        self, completions: Sequence[Completion], scope: _RunScope
    ) -> None:
        errors = [c.error for c in completions if c.error is not None]
        if not errors:
            return
        scope.cancel()
        for error in errors:
            root = _batch_error(error)
            if root is None or id(root.batch) not in self._batches:
                continue
            batch = self._batches[id(root.batch)]
            launch = batch.launches[root.index]
            if launch is not None:  # None: a check that stopped this stream
                cause = root.__cause__
                raise self._node_error(launch, batch.stream, cause) from cause
        if scope.halted:
            raise ClosedResourceError("the run was stopped before it finished")
        raise StreamError(f"run failed: {errors[0]!r}", "") from errors[0]

    def _node_error(
        self, launch: Launch, stream: int, cause: BaseException | None
    ) -> NodeFailedError:
        device = self.plan.streams[stream].device
        label = self._streams[stream].label
        return NodeFailedError(launch.name, launch.func_name, str(device), label, cause)

    # -- lifetime ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("this program was closed")

    def close(self) -> None:
        """Finish queued work, stop the streams and free the arenas."""
        self._closed = True
        for stream in self._streams:
            get_api(stream.device.kind).free_stream(stream)
        self._streams.clear()
        for arena in self._arenas:
            get_api(arena.device.kind).free(arena.buffer)
        self._arenas.clear()


def _batch_error(error: BaseException | None) -> BatchError | None:
    """The batch failure at the root of a chain of stream errors."""
    while error is not None:
        if isinstance(error, BatchError):
            return error
        error = error.__cause__
    return None
