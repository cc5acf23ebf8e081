"""Remote streams: in-order queues of tasks on one Dask worker.

A :class:`RemoteStream` is a :class:`~devices.Stream` whose worker thread
*issues* rather than runs, as a cuda stream's does: launching only queues
(the caller never waits), and the stream's thread turns each item into Dask
tasks on the device's worker.

* **Calls.** Consecutive kernel calls of a batch (:class:`RemoteFunction`)
  become *one* task that runs them in order on the worker; any other call (a
  copy, a check) runs on the stream's thread, where the backend's copy
  primitives see the stream (:func:`current_stream`) and add their tasks to
  it.
* **Order.** Every task takes the stream's previous task and the tasks of
  the events waited on since as arguments, so Dask runs it after them: the
  order is kept on the cluster, with no host round trip per launch.
* **Events.** A record makes a :class:`RemoteCompletion`: the stream's last
  task. Another remote stream waits on it device-side (its next task depends
  on that task, worker to worker); the host and other backends wait through
  the completion, which the session completes when the task is done.
* **Failures.** A task that raises fails every task that depends on it
  (see :mod:`devices._remote_ops`), so the rest of the stream's segment and
  the streams waiting on it fail with it; the record that ends the segment
  completes with a :class:`~devices.BatchError` naming the call that failed,
  its cause a :class:`~devices.errors.RemoteError`, or a
  :class:`~devices.errors.DeviceLostError` when a worker died. The next
  segment starts clean: it no longer depends on a task that failed.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import _remote_ops as ops
from ._device import Device
from ._event import Completion, Event
from ._remote_session import Session, Target, exception_of
from ._stream import BatchError, Call, Stream
from .errors import ClosedResourceError, StreamMismatchError, UnsupportedOperationError

__all__ = (
    "RemoteAllocation",
    "RemoteArray",
    "RemoteCompletion",
    "RemoteFunction",
    "RemoteStream",
    "current_stream",
)

# The remote stream whose thread this is, if any: a copy issued there joins
# that stream's order; anywhere else it is a blocking copy. Private, as
# cuda's; never an ambient default.
_issuing = threading.local()

_call_ids = itertools.count(1)


def current_stream() -> RemoteStream | None:
    """The remote stream issuing on this thread, if any."""
    stream: RemoteStream | None = getattr(_issuing, "stream", None)
    return stream


class RemoteAllocation:
    """A remote buffer's handle: the future of its :class:`WorkerBuffer`.

    :ivar session: the connection it was made through.
    :ivar target: where it lives.
    :ivar nbytes: its size.
    """

    __slots__ = ("_future", "nbytes", "session", "target")

    def __init__(
        self, session: Session, target: Target, future: Any, nbytes: int
    ) -> None:
        self.session = session
        self.target = target
        self.nbytes = nbytes
        self._future = future

    def __repr__(self) -> str:
        return f"<RemoteAllocation {self.nbytes} bytes on {self.target.device}>"

    @property
    def future(self) -> Any:
        """The Dask future holding the memory.

        :raises ClosedResourceError: if the buffer was freed.
        """
        future = self._future
        if future is None:
            raise ClosedResourceError(f"{self!r} is used after free")
        return future

    def release(self) -> None:
        """Let the worker free the memory once no task needs it."""
        future, self._future = self._future, None
        if future is not None:
            # Also called by a garbage-collected buffer's finalizer, maybe
            # after the client closed: nothing to release then.
            with contextlib.suppress(Exception):
                future.release()


@dataclass(frozen=True)
class RemoteArray:
    """What a kernel on a remote device receives on the host: a description
    of a tensor in a remote buffer. The worker turns it into a real array.

    :ivar allocation: the buffer.
    :ivar offset: byte offset in the buffer.
    :ivar shape: the shape.
    :ivar dtype: the dtype, as a string ("float32").
    """

    allocation: RemoteAllocation
    offset: int
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class RemoteFunction:
    """A kernel that runs on the worker, sent by reference.

    The worker calls ``function(kind, *args, *arrays)``: ``kind`` is the
    worker-local device kind ("cpu", "cuda"), ``arrays`` that device's
    arrays. ``function`` must be a module-level function the workers can
    import (Dask sends its module and name); ``args`` are plain strings —
    for asyncrt's kernels, the kernel's registry name and module.

    :ivar function: the worker-side function.
    :ivar args: its leading arguments.
    :ivar label: a short name for task keys and errors.
    """

    function: Callable[..., None]
    args: tuple[str, ...]
    label: str

    def __call__(self, *arrays: Any) -> None:
        stream = current_stream()
        if stream is None:
            raise UnsupportedOperationError(
                f"kernel {self.label!r} runs on a remote worker; launch it on a "
                f"remote stream"
            )
        stream.submit_kernels([(stream.current_call(), self, arrays)])


class RemoteCompletion(Completion):
    """A record on a remote stream: done when the stream's last task is.

    :ivar issued: set when the stream's thread reached the record.
    :ivar issue_error: a failure found while issuing (before the record).
    :ivar future: the stream's last task at the record, if any.
    :ivar workers: the workers that task depends on.
    """

    __slots__ = ("future", "issue_error", "issued", "workers")

    def __init__(self) -> None:
        super().__init__()
        self.issued = threading.Event()
        self.issue_error: BaseException | None = None
        self.future: Any = None
        self.workers: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _CallRef:
    """Which launched call a call id stands for."""

    calls: Sequence[Call]
    index: int
    single: bool


class _Registry:
    """Call ids -> calls, for naming the call that failed on a worker.

    Entries live while their segment is in flight; failures are kept a
    while longer, for the streams that inherit them.
    """

    _KEEP_FAILED = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, _CallRef] = {}
        self._failed: dict[int, _CallRef] = {}

    def add(self, ref: _CallRef) -> int:
        call_id = next(_call_ids)
        self._live[call_id] = ref
        return call_id

    def get(self, call_id: int) -> _CallRef | None:
        return self._live.get(call_id) or self._failed.get(call_id)

    def settle(self, call_ids: Sequence[int], failed: int | None) -> None:
        with self._lock:
            for call_id in call_ids:
                ref = self._live.pop(call_id, None)
                if call_id == failed and ref is not None:
                    self._failed[call_id] = ref
            while len(self._failed) > self._KEEP_FAILED:
                del self._failed[next(iter(self._failed))]


_registry = _Registry()


@dataclass(frozen=True)
class _Task:
    """One task of a segment.

    :ivar future: its future.
    :ivar target: where it runs.
    :ivar calls: the ids of the calls it serves.
    :ivar workers: the workers it depends on: its own, those of the data it
        touches, and those of the tasks it follows (if any of them is lost,
        Dask would keep this task waiting for ever).
    """

    future: Any
    target: Target
    calls: tuple[int, ...]
    workers: frozenset[str]


class RemoteStream(Stream):
    """A stream of a ``remote`` device; see the module docstring.

    :param device: the device.
    :param session: the connection.
    :param target: where the device lives.
    """

    def __init__(self, device: Device, session: Session, target: Target) -> None:
        self._session = session
        self._target = target
        self._tail: _Task | None = None  # the last task issued
        self._waits: list[RemoteCompletion] = []  # waited on since
        self._segment: list[_Task] = []  # tasks since the last record
        self._call: _CallRef | None = None  # the host-side call running now
        self._call_id = ops.NO_CALL  # its id, once it has issued a task
        self._unissued: set[int] = set()  # ids no task carries (yet)
        super().__init__(device)
        # "remote:1/stream7@10.0.0.5:40123": the device, and the worker.
        self.label = f"{self.label}@{target.worker.split('://', 1)[-1]}"

    # -- what the stream's thread does -------------------------------------

    def _on_thread_start(self) -> None:
        _issuing.stream = self

    def _execute(
        self, fn: Callable[..., Any], args: tuple[Any, ...], work: float
    ) -> None:
        ref = _CallRef(((fn, args, work),), 0, True)
        try:
            if isinstance(fn, RemoteFunction):
                self.submit_kernels([(self._new_id(ref), fn, args)])
            else:
                self._run_on_host(ref, fn, args)
        finally:
            self._forget_unissued()

    def _execute_many(self, calls: Sequence[Call]) -> None:
        group: list[tuple[int, RemoteFunction, tuple[Any, ...]]] = []
        first = index = 0
        try:
            for index, (fn, args, _) in enumerate(calls):
                if isinstance(fn, RemoteFunction):
                    if not group:
                        first = index
                    ref = _CallRef(calls, index, False)
                    group.append((self._new_id(ref), fn, args))
                    continue
                if group:
                    self.submit_kernels(group)
                    group = []
                self._run_on_host(_CallRef(calls, index, False), fn, args)
            if group:
                self.submit_kernels(group)
        except Exception as exc:
            raise BatchError(first if group else index, calls) from exc
        finally:
            self._forget_unissued()

    def _new_id(self, ref: _CallRef) -> int:
        call_id = _registry.add(ref)
        self._unissued.add(call_id)
        return call_id

    def _forget_unissued(self) -> None:
        """Drop the ids of calls that issued no task (they failed first, or
        ran on the host only): no failure on a worker will name them."""
        if self._unissued:
            _registry.settle(list(self._unissued), None)
            self._unissued.clear()

    def _run_on_host(
        self, ref: _CallRef, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        """Run a host-side call (a copy, a check): the tasks it issues on
        this stream are its tasks."""
        self._call, self._call_id = ref, ops.NO_CALL
        try:
            fn(*args)
        finally:
            self._call, self._call_id = None, ops.NO_CALL

    def last_workers(self) -> frozenset[str]:
        """The workers the stream's last task depends on."""
        tail = self._tail
        return tail.workers if tail is not None else frozenset()

    def current_call(self) -> int:
        """The id of the host-side call running on this thread now (its
        tasks carry it, so a failure names the call)."""
        if self._call_id == ops.NO_CALL and self._call is not None:
            self._call_id = self._new_id(self._call)
        return self._call_id

    def submit_kernels(
        self, group: Sequence[tuple[int, RemoteFunction, tuple[Any, ...]]]
    ) -> None:
        """Issue kernel calls as one task on this stream's worker.

        :raises StreamMismatchError: if an array lives on another device.
        :raises UnsupportedOperationError: if an argument is no remote array.
        """
        buffers: list[Any] = []
        slots: dict[int, int] = {}
        wire: list[ops.WireCall] = []
        for call_id, fn, args in group:
            refs: list[ops.WireArray] = []
            for arg in args:
                if not isinstance(arg, RemoteArray):
                    raise UnsupportedOperationError(
                        f"kernel {fn.label!r} on {self.device} got {arg!r}; kernels "
                        "on remote devices take that device's arrays"
                    )
                allocation = arg.allocation
                if allocation.target != self._target:
                    raise StreamMismatchError(
                        f"kernel {fn.label!r} on {self.device} got an array of "
                        f"{allocation.target.device}"
                    )
                slot = slots.setdefault(id(allocation), len(buffers))
                if slot == len(buffers):
                    buffers.append(allocation.future)
                refs.append((slot, arg.offset, arg.shape, arg.dtype))
            wire.append((call_id, fn.function, fn.args, tuple(refs)))
        label = "+".join(dict.fromkeys(fn.label for _, fn, _ in group))
        self.chain(
            self._target,
            ops.run_calls,
            str(self._target.local),
            buffers,
            tuple(wire),
            label=_key_label(label),
            calls=tuple(call_id for call_id, _, _ in group),
        )

    def chain(
        self,
        target: Target,
        fn: Callable[..., Any],
        *args: Any,
        label: str,
        calls: tuple[int, ...] | None = None,
        touches: frozenset[str] = frozenset(),
    ) -> Any:
        """Submit ``fn(prev, waits, *args)`` on ``target`` after everything
        issued on this stream so far; it becomes the stream's last task.

        :param touches: the workers holding data among ``args`` (besides
            ``target``'s).
        :return: its future.
        :raises DeviceLostError: if a task it must follow was lost.
        """
        workers = {target.worker, *touches}
        prev = None
        tail = self._tail
        if tail is not None:
            prev = self._dependency(tail.future, tail.workers, bool(self._segment))
            if prev is not None:
                workers.update(tail.workers)
        waits = []
        for completion in self._waits:
            wait = self._dependency(completion.future, completion.workers, True)
            if wait is not None:
                waits.append(wait)
                workers.update(completion.workers)
        future = self._session.submit(target, fn, prev, waits, *args, label=label)
        self._waits = []
        if calls is None:
            call = self.current_call()
            calls = (call,) if call != ops.NO_CALL else ()
        self._unissued.difference_update(calls)
        self._tail = _Task(future, target, calls, frozenset(workers))
        self._segment.append(self._tail)
        return future

    def _dependency(self, future: Any, workers: frozenset[str], inherit: bool) -> Any:
        """``future`` if the next task must take it as argument: while it
        runs, or when it failed and its failure is ours to inherit. A task
        that depends on a lost worker will never run: one of this segment
        fails the segment; an older one is over."""
        status = future.status
        if self._session.any_lost(workers) and status != "finished":
            if inherit:
                raise self._session.lost_error(self._target, workers)
            return None
        if status == "pending":
            return future
        if status == "finished" or not inherit:
            return None  # done: nothing left to order after
        if status == "error":
            return future  # Dask fails the dependent with the same error
        raise self._session.lost_error(self._target, workers)

    def _wait(self, completion: Completion, event: Event) -> None:
        if not isinstance(completion, RemoteCompletion):
            super()._wait(completion, event)  # a host-side wait
            return
        completion.issued.wait()
        if completion.issue_error is not None:
            self._fail_from(completion.issue_error, event)
        elif completion.done:
            self._fail_from(completion.error, event)
        elif completion.future is not None:
            self._waits.append(completion)  # waited on device-side

    def _new_completion(self) -> Completion:
        return RemoteCompletion()

    def _complete(self, completion: Completion, error: BaseException | None) -> None:
        if not isinstance(completion, RemoteCompletion):
            completion.set(error)
            return
        if self._waits and error is None:
            # What this record follows includes the events waited on since
            # the last task: one empty task makes the stream's end follow them.
            try:
                self.chain(self._target, ops.noop, label="wait")
            except Exception as exc:
                error = exc
        segment, self._segment = self._segment, []
        self._waits = []
        tail = self._tail
        completion.issue_error = error
        if tail is not None:
            completion.future, completion.workers = tail.future, tail.workers
        completion.issued.set()
        if tail is None:
            completion.set(error)
            return
        self._session.when_done(
            tail.future,
            tail.workers,
            lambda status: self._settle(completion, segment, error),
        )

    # -- failures --------------------------------------------------------------

    def _settle(
        self,
        completion: RemoteCompletion,
        segment: list[_Task],
        issue_error: BaseException | None,
    ) -> None:
        """Complete a record once its segment is done (on Dask's callback
        thread: quick, no waiting)."""
        error: BaseException | None = None
        failed_call: int | None = None
        for task in segment:
            status = task.future.status
            if status == "finished":
                continue
            if status == "error":
                exc = exception_of(task.future)
                failed_call = getattr(exc, "call", None)
                cause = self._session.remote_error(exc, task.target)
            else:  # pending, cancelled: a worker died, or the session closed
                cause = self._session.lost_error(task.target, task.workers)
            error = self._blame(
                failed_call or (task.calls[0] if task.calls else 0), cause
            )
            break
        _registry.settle([call for task in segment for call in task.calls], failed_call)
        completion.set(error if error is not None else issue_error)

    def _blame(self, call_id: int, cause: BaseException) -> BaseException:
        """The error a record reports: the failing call's batch error (the
        dispatcher reads the node from it), caused by ``cause``."""
        ref = _registry.get(call_id)
        if ref is None or ref.single:
            return cause
        error = BatchError(ref.index, ref.calls)
        error.__cause__ = cause
        return error

    def close(self) -> None:
        """Stop issuing once the queue is drained. Tasks already on the
        cluster finish there; the memory they use stays until they do."""
        super().close()


def _key_label(text: str) -> str:
    """A task-key-safe label: letters, digits, ``_`` and ``+``; short."""
    cleaned = "".join(c if c.isalnum() or c in "_+" else "_" for c in text)
    return cleaned[:48] or "call"
