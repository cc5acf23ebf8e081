"""Streams: in-order queues of work on one device.

A :class:`Stream` owns one worker thread that takes work from a queue in
order. Launching only appends to the queue, so it never blocks the caller.
Four kinds of item travel through the queue:

* a call (``fn(*args)``, or a batch of them) — the backend decides how to
  execute it (:meth:`Stream._execute`): the cpu runs it, the simulated
  accelerator runs it and then models its duration, cuda issues it;
* a record — completes an :class:`~devices.Event`'s :class:`Completion`;
* a wait — holds the worker until another stream's completion is done
  (SyncStreamFromTo across any two streams, whatever their backends);
* stop — ends the worker after everything queued before it.

Failures are scoped to the segment between two records: when a call raises,
the stream skips the rest of its work up to the next record, and that record
completes with the error; a stream that waits on a failed completion fails
the same way. Executors that share a stream between runs catch their own
kernels' errors, so one run's failure never leaks into another's segment.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._device import Device
from ._event import Completion, Event, wait_completion
from .errors import ClosedResourceError, StreamError

__all__ = ("BatchError", "Call", "Stream")

#: One call on a stream: the function, its positional arguments, and the
#: work it does in floating-point operations (0 if unknown; cost models and
#: the simulated accelerator use it).
Call = tuple[Callable[..., Any], tuple[Any, ...], float]

_CALL: Final = 0
_BATCH: Final = 1
_RECORD: Final = 2
_WAIT: Final = 3
_STOP: Final = 4

_stream_ids = itertools.count()


class BatchError(Exception):
    """Raised inside a stream when call ``index`` of a batch failed; the
    call's exception is chained as ``__cause__``. The next record reports it.

    :ivar index: the failing call's position in the batch.
    :ivar batch: the batch (the sequence given to ``launch_many``).
    """

    def __init__(self, index: int, batch: Sequence[Call]) -> None:
        self.index = index
        self.batch = batch
        super().__init__(f"call {index} of a batch failed")


class Stream:
    """An in-order queue of work on one device, run by a worker thread.

    Make streams with ``devices.get_api(kind).create_stream(device)`` (or
    :meth:`devices.Device.create_stream`), not directly.

    :param device: the device the stream's work runs on.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.label = f"{device}/stream{next(_stream_ids)}"
        self._queue: queue.SimpleQueue[tuple[int, Any, Any, float, float]] = (
            queue.SimpleQueue()
        )
        #: When the item the worker is handling was queued (``perf_counter``).
        self._queued_at = 0.0
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._worker, name=f"asyncrt-{self.label}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<Stream {self.label}{state}>"

    # -- the public verbs ------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def launch(
        self, fn: Callable[..., Any], args: tuple[Any, ...] = (), *, work: float = 0.0
    ) -> None:
        """Queue ``fn(*args)`` after everything launched before; return at once.

        :param fn: the callable; it runs on the stream's worker thread.
        :param args: its positional arguments.
        :param work: the call's work in floating-point operations, for
            backends that model time (the simulated accelerator).
        :raises ClosedResourceError: if the stream is closed.
        """
        self._put(_CALL, fn, args, work)

    def launch_many(self, calls: Sequence[Call]) -> None:
        """Queue a batch of calls as one item: the cheapest way to launch a
        precomputed list (no per-call queue traffic).

        :param calls: ``(fn, args, work)`` triples, run in order.
        :raises ClosedResourceError: if the stream is closed.
        """
        self._put(_BATCH, calls, None, 0.0)

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (or a new one) at the current end of the queue.

        :return: the event; it completes when the stream reaches it.
        :raises ClosedResourceError: if the stream is closed.
        :raises StreamError: if ``event`` is still pending from an earlier
            record.
        """
        event = Event() if event is None else event
        with self._lock:
            self._check_open()
            completion = self._new_completion()
            event._rearm(self.label, completion)
            self._queue.put((_RECORD, completion, None, 0.0, time.perf_counter()))
        return event

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait until ``event`` completes
        (device-side: the caller does not wait). An event never recorded is
        complete already.

        :raises ClosedResourceError: if the stream is closed.
        """
        completion = event.completion
        # A done completion needs no wait, unless it carries a failure that
        # this stream must inherit.
        if not completion.done or completion.error is not None:
            self._put(_WAIT, completion, event, 0.0)
        else:
            self._check_open()

    def synchronize(self, timeout: float | None = None) -> None:
        """Block the calling thread until all work launched so far is done.

        :raises StreamError: if that work failed.
        :raises TimeoutError: if ``timeout`` seconds pass first.
        """
        self.record().synchronize(timeout)

    async def wait(self) -> None:
        """Await all work launched so far without blocking the event loop.

        :raises StreamError: if that work failed.
        """
        await self.record().wait()

    def close(self) -> None:
        """Finish the queued work, then stop the worker thread and join it.

        Idempotent. Launching on a closed stream raises
        :class:`~devices.errors.ClosedResourceError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put((_STOP, None, None, 0.0, 0.0))
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- what a backend overrides ---------------------------------------

    def _execute(
        self, fn: Callable[..., Any], args: tuple[Any, ...], work: float
    ) -> None:
        """Run one call on the worker thread. Backends override this."""
        fn(*args)

    def _execute_many(self, calls: Sequence[Call]) -> None:
        """Run a batch on the worker thread; the default loops
        :meth:`_execute`. Backends that need no per-call hook run the calls
        directly."""
        execute = self._execute
        index = 0
        try:
            for fn, args, work in calls:
                execute(fn, args, work)
                index += 1
        except Exception as exc:
            raise BatchError(index, calls) from exc

    def _on_thread_start(self) -> None:
        """Prepare the worker thread (e.g. make a device current on it)."""

    def _new_completion(self) -> Completion:
        """The completion a record on this stream makes."""
        return Completion()

    def _complete(self, completion: Completion, error: BaseException | None) -> None:
        """Reached a record on the worker: complete it (cuda defers this to
        the device through a host callback)."""
        completion.set(error)

    # -- internals -------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError(f"stream {self.label} is closed")

    def _put(self, kind: int, a: Any, b: Any, work: float) -> None:
        # Under the lock, so nothing lands behind close()'s stop marker.
        with self._lock:
            if self._closed:
                raise ClosedResourceError(f"stream {self.label} is closed")
            self._queue.put((kind, a, b, work, time.perf_counter()))

    def _worker(self) -> None:
        self._on_thread_start()
        get = self._queue.get
        while True:
            kind, a, b, work, self._queued_at = get()
            if kind <= _BATCH:  # a call or a batch
                if self._error is None:
                    try:
                        if kind == _CALL:
                            self._execute(a, b, work)
                        else:
                            self._execute_many(a)
                    except BaseException as exc:  # reported by the next record
                        self._error = exc
            elif kind == _RECORD:
                error, self._error = self._error, None
                self._complete(a, error)
            elif kind == _WAIT:
                self._wait(a, b)
            else:
                break

    def _wait(self, completion: Completion, event: Event) -> None:
        """Hold the worker until ``completion`` is done (backends with
        device-side waits override this)."""
        completion.wait()
        self._fail_from(completion.error, event)

    def _fail_from(self, cause: BaseException | None, event: Event) -> None:
        if cause is not None and self._error is None:
            error = StreamError(
                f"{self.label} waited on {event!r}, whose stream failed",
                self.label,
            )
            error.__cause__ = cause
            self._error = error


async def wait_all(completions: Sequence[Completion]) -> None:
    """Await several completions (helper for executors)."""
    for completion in completions:
        await wait_completion(completion)
