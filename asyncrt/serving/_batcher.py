"""The dynamic batcher: many callers' small requests joined into few runs.

One batched run of 16 sentences costs far less than 16 runs of one, and an
async service sees its requests one at a time. A :class:`Batcher` sits in
front of an executor: ``await batcher.run(**request)`` returns that
request's outputs, and concurrent requests run together. The policy:

* **Checked alone.** A request is checked before it queues
  (:func:`~asyncrt.serving._spec.prepare`: names, dtypes, ranks, rows, and
  its shape against the model); a bad one raises
  :class:`~asyncrt.errors.InputError` in its caller and never touches a
  batch.
* **Grouped.** Requests join a batch only with requests of the same group:
  the same shape but on the batch axis (and the padded length, where
  :class:`~asyncrt.serving.Padding` says how to pad). Nothing is mixed
  silently.
* **Dispatched.** One task (the dispatcher) waits for a free batch slot
  (at most ``max_concurrent_batches`` batches run at once: by default the
  executor's ``max_contexts``), then for a ready group: one that holds
  ``max_batch`` rows (or ``max_batch_bytes``), or whose oldest request has
  waited ``max_delay_ms``, or any group once the batcher is closing; the
  group of the oldest request first. So a request waits at most
  ``max_delay_ms`` for others to join while a slot is free; while every
  slot is busy, it waits for one, and the batch that gets it is as full
  as the queue allows. It takes the group's requests in arrival order
  while they fit (``max_batch`` rows and ``max_batch_bytes`` of inputs,
  padding included) and starts their batch in a task of its own.
* **Padded to a preferred size.** A batch of ``n`` rows runs with the next
  of ``preferred_batch_sizes`` (default: powers of two up to
  ``max_batch``), the extra rows a copy of the last (as TensorFlow
  Serving pads to its allowed batch sizes), so a symbolic graph's plan
  cache sees a handful of shape signatures; a static graph runs every
  batch at its own batch size.
* **Split back.** Every request gets fresh arrays of its own rows (and its
  own length, for the outputs the padding trims): no request shares
  memory with another.
* **Cancelled alone.** A caller that stops waiting (a timeout, a cancelled
  task) leaves the queue; if its batch already started, the batch runs on
  for the others and its rows are dropped. Batches run in the batcher's
  own tasks, never in a caller's.
* **Failed together, served on.** If the run fails (a kernel raised:
  :class:`~asyncrt.errors.NodeFailedError` naming the node), every request
  of that batch raises it, and the batcher goes on with the next batch. If
  the model refuses the joined batch's shapes
  (:class:`~asyncrt.errors.InputError`, a limit the per-request check
  could not see), its requests run one by one, so only a request the model
  refuses alone fails.

Leaving ``async with`` (or :meth:`Batcher.close`) stops new requests, runs
the queued ones at once and waits for every batch; cancelling the block
fails the requests still waiting with
:class:`~asyncrt.errors.ClosedResourceError`. The batcher belongs to one
event loop (asyncio or trio, through anyio).
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import anyio
import numpy as np
from anyio.abc import TaskGroup

from devices import NDArray
from devices._ndarray import wrap_fresh_host
from scheduler.errors import describe

from ..errors import ArgumentError, ClosedResourceError, InputError
from ..graph_executor import GraphModule
from ._arrays import join, split
from ._spec import Config, Padding, Prepared, configure, finite_delay, prepare
from ._stats import BatchRecord, BatchStats, StatsRecorder, chrome_trace

__all__ = ("Batcher", "Clock", "LoopClock")

#: Joining or splitting more bytes than this happens in a worker thread: numpy
#: releases the GIL around each large copy, and the loop would wait for it
#: back behind the kernel threads once per copy.
OFFLOAD_BYTES = 64 << 10


class Clock(Protocol):
    """The time a batcher keeps: the event loop's (:class:`LoopClock`), or a
    test's own."""

    def now(self) -> float:
        """The time now, in seconds."""

    async def wait_until(self, deadline: float, wakeup: anyio.Event) -> None:
        """Return at ``deadline`` or once ``wakeup`` is set, whichever is
        first (``deadline`` may be ``math.inf``)."""


class LoopClock:
    """The event loop's clock (``anyio.current_time``)."""

    def now(self) -> float:
        """The loop's time now."""
        return anyio.current_time()

    async def wait_until(self, deadline: float, wakeup: anyio.Event) -> None:
        """Sleep until ``deadline`` or until ``wakeup`` is set."""
        with anyio.move_on_at(deadline):
            await wakeup.wait()


class _Request:
    __slots__ = (
        "abandoned",
        "arrival",
        "done",
        "error",
        "outputs",
        "prepared",
        "queued",
        "traceback",
    )

    def __init__(self, prepared: Prepared, arrival: float) -> None:
        self.prepared = prepared
        self.arrival = arrival
        self.done = anyio.Event()
        self.queued = True  # in its group's queue (not yet in a batch)
        self.abandoned = False  # its caller stopped waiting
        self.outputs: list[NDArray] = []
        self.error: BaseException | None = None
        self.traceback: TracebackType | None = None


class _Group:
    __slots__ = ("requests", "rows")

    def __init__(self) -> None:
        self.requests: collections.deque[_Request] = collections.deque()
        self.rows = 0


class Batcher:
    """Joins concurrent requests into batched runs of one executor; see the
    module docstring for the policy.

    .. code-block:: python

        batcher = asyncrt.Batcher(
            ex, batch_axes={"input_ids": 0, "attention_mask": 0}, max_delay_ms=2
        )
        async with batcher:  # in the service's lifespan
            ...
            outputs = await batcher.run(input_ids=ids, attention_mask=mask)

    :param ex: the executor (a graph with a symbolic batch dimension, or a
        static graph whose batch size every batch is padded to).
    :param batch_axes: every input a request gives, with the axis its
        requests are joined along.
    :param output_axes: each output's batch axis (default: 0 for all).
    :param max_batch: the most rows a batch holds (a request may bring
        several); default 32, or a static graph's batch size.
    :param max_delay_ms: the longest a request waits for others to join
        while a batch slot is free.
    :param preferred_batch_sizes: the sizes a batch is padded up to,
        ascending and ending at ``max_batch`` (default: powers of two and
        ``max_batch``); ``()`` runs each batch at its own size.
    :param padding: how requests of different lengths share a batch
        (default: they do not; they are grouped by shape).
    :param max_batch_bytes: the most bytes a batch's joined inputs may
        hold (padding included), or ``None``.
    :param max_concurrent_batches: the most batches running at once
        (default: the executor's ``max_contexts``).
    :param history: how many recent requests and batches the figures and
        the timeline keep.
    :param clock: the time it keeps (default: the event loop's).
    :raises ArgumentError: for an executor or settings it cannot batch with
        (named, with what it accepts).
    """

    def __init__(
        self,
        ex: GraphModule,
        *,
        batch_axes: Mapping[str, int],
        output_axes: Sequence[int] | None = None,
        max_batch: int | None = None,
        max_delay_ms: float = 2.0,
        preferred_batch_sizes: Sequence[int] | None = None,
        padding: Padding | None = None,
        max_batch_bytes: int | None = None,
        max_concurrent_batches: int | None = None,
        history: int = 4096,
        clock: Clock | None = None,
    ) -> None:
        self._config: Config = configure(
            ex,
            batch_axes,
            output_axes,
            max_batch,
            preferred_batch_sizes,
            padding,
            max_batch_bytes,
        )
        self._delay = finite_delay(max_delay_ms)
        concurrency = (
            ex.options.max_contexts
            if max_concurrent_batches is None
            else max_concurrent_batches
        )
        if (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or concurrency < 1
        ):
            raise ArgumentError(
                f"max_concurrent_batches must be an int >= 1 or None, got "
                f"{max_concurrent_batches!r}"
            )
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ArgumentError(f"history must be an int >= 1, got {history!r}")
        self._ex = ex
        self._concurrency = concurrency
        self._clock: Clock = LoopClock() if clock is None else clock
        self._groups: dict[Hashable, _Group] = {}
        self._queued = 0
        self._running = 0
        self._free_slots = list(range(concurrency))
        self._stats = StatsRecorder(history)
        self._state = "new"  # -> "open" -> "closing" -> "closed"
        self._wakeup: anyio.Event | None = None
        self._slots: anyio.Semaphore | None = None
        self._task_group: TaskGroup | None = None

    # -- what it is ----------------------------------------------------------------

    @property
    def executor(self) -> GraphModule:
        """The executor it runs batches on."""
        return self._ex

    @property
    def max_batch(self) -> int:
        """The most rows a batch holds."""
        return self._config.max_batch

    @property
    def max_delay_ms(self) -> float:
        """The longest a request waits for others while a slot is free."""
        return self._delay * 1e3

    @property
    def preferred_batch_sizes(self) -> tuple[int, ...]:
        """The sizes batches are padded up to."""
        return self._config.sizes

    @property
    def max_concurrent_batches(self) -> int:
        """The most batches running at once."""
        return self._concurrency

    @property
    def closed(self) -> bool:
        """Whether it stopped taking requests."""
        return self._state in ("closing", "closed")

    def stats(self) -> BatchStats:
        """Its figures now: requests, batches, sizes, queue delays."""
        return self._stats.snapshot(queued=self._queued, running=self._running)

    def records(self) -> tuple[BatchRecord, ...]:
        """The recent batches, oldest first."""
        return tuple(self._stats.records)

    def chrome_trace(self) -> dict[str, Any]:
        """The recent batches as a Chrome trace / Perfetto JSON object: a
        track per batch slot, and each request's wait in the queue."""
        return chrome_trace(self.records())

    def save_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`chrome_trace` to ``path`` (JSON).

        :raises OSError: if it cannot be written.
        """
        import json

        target = Path(path)
        target.write_text(json.dumps(self.chrome_trace()))
        return target

    # -- lifetime ------------------------------------------------------------------

    async def __aenter__(self) -> Batcher:
        if self._state != "new":
            raise ClosedResourceError(
                "a Batcher serves one `async with` block; make a new one"
            )
        self._slots = anyio.Semaphore(self._concurrency)
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._state = "open"
        self._task_group.start_soon(self._dispatch)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self.close()
        try:
            return bool(await self._tasks().__aexit__(exc_type, exc, tb))
        finally:
            self._state = "closed"

    def close(self) -> None:
        """Stop taking requests; the queued ones run at once (no waiting
        for others). Leaving ``async with`` waits for them. Idempotent."""
        if self._state == "open":
            self._state = "closing"
            self._wake()

    def _tasks(self) -> TaskGroup:
        if self._task_group is None:
            raise ClosedResourceError("this Batcher was never entered")
        return self._task_group

    def _semaphore(self) -> anyio.Semaphore:
        if self._slots is None:
            raise ClosedResourceError("this Batcher was never entered")
        return self._slots

    def _check_open(self) -> None:
        if self._state == "new":
            raise ClosedResourceError(
                "this Batcher is not running: use it in `async with batcher:`"
            )
        if self._state != "open":
            raise ClosedResourceError("this Batcher is closed")

    # -- requests ------------------------------------------------------------------

    async def run(self, **inputs: Any) -> list[NDArray]:
        """Run one request in a batch with others; return its outputs.

        :param inputs: every input in ``batch_axes``: numpy arrays (of the
            model's dtypes), NDArrays or nested lists, each with the
            request's rows on its batch axis (usually 1).
        :return: one new cpu array per output, of this request's rows.
        :raises InputError: if the request does not fit the model or the
            batcher (raised before it joins a batch), or if the model
            refused it.
        :raises NodeFailedError: if a kernel failed in its batch.
        :raises ClosedResourceError: if the batcher is not running, or was
            stopped before the request's batch finished.
        """
        self._check_open()
        try:
            prepared = prepare(self._config, inputs)
        except InputError:
            self._stats.rejected += 1
            raise
        request = _Request(prepared, self._clock.now())
        self._enqueue(request)
        try:
            await request.done.wait()
        except BaseException:
            self._abandon(request)
            raise
        if request.error is not None:
            raise request.error.with_traceback(request.traceback)
        return request.outputs

    def _enqueue(self, request: _Request) -> None:
        key = request.prepared.key
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
            first = True
        else:
            first = False
        group.requests.append(request)
        group.rows += request.prepared.rows
        self._queued += 1
        # The dispatcher waits for the oldest deadline: a new group brings a
        # deadline of its own, a full group is ready now.
        if first or self._full(group):
            self._wake()

    def _abandon(self, request: _Request) -> None:
        self._stats.cancelled += 1
        if not request.queued:
            request.abandoned = True  # its batch runs on; its rows are dropped
            return
        key = request.prepared.key
        group = self._groups[key]
        group.requests.remove(request)
        group.rows -= request.prepared.rows
        self._queued -= 1
        request.queued = False
        if not group.requests:
            del self._groups[key]

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # -- forming batches -------------------------------------------------------------

    def _plan(self, group: _Group) -> tuple[int, int, int]:
        """How many of ``group``'s requests the next batch takes, their rows
        and the batch's length."""
        config = self._config
        budget = config.max_batch_bytes
        head = group.requests[0].prepared
        count = rows = length = 0
        for request in group.requests:
            prepared = request.prepared
            more = rows + prepared.rows
            if more > config.max_batch:
                break
            longer = self._length(max(length, prepared.length))
            if (
                budget is not None
                and count
                and config.batch_size(more) * head.row_bytes(longer) > budget
            ):
                break
            count, rows, length = count + 1, more, max(length, prepared.length)
        return count, rows, self._length(length)

    def _length(self, longest: int) -> int:
        """A batch's length for its longest request's ``longest``."""
        padding = self._config.padding
        if padding is None:
            return 0
        bucket = padding.bucket(longest)
        return longest if bucket < 0 else bucket

    def _full(self, group: _Group) -> bool:
        if group.rows >= self._config.max_batch:
            return True
        if self._config.max_batch_bytes is None:
            return False
        return self._plan(group)[0] < len(group.requests)

    def _ready(self, now: float) -> _Group | None:
        """The group whose batch starts now: ready, and with the oldest
        request of the ready ones."""
        closing = self._state != "open"
        best: _Group | None = None
        for group in self._groups.values():
            head = group.requests[0].arrival
            if (closing or head + self._delay <= now or self._full(group)) and (
                best is None or head < best.requests[0].arrival
            ):
                best = group
        return best

    async def _next_batch(self) -> list[_Request] | None:
        """The requests of the next batch, once a group is ready; ``None``
        once closing with nothing queued."""
        while True:
            group = self._ready(self._clock.now())
            if group is not None:
                return self._take(group)
            if self._state != "open" and not self._groups:
                return None
            deadline = min(
                (g.requests[0].arrival + self._delay for g in self._groups.values()),
                default=math.inf,
            )
            self._wakeup = anyio.Event()
            try:
                await self._clock.wait_until(deadline, self._wakeup)
            finally:
                self._wakeup = None

    def _take(self, group: _Group) -> list[_Request]:
        count = self._plan(group)[0]
        requests = [group.requests.popleft() for _ in range(count)]
        for request in requests:
            request.queued = False
            group.rows -= request.prepared.rows
        self._queued -= count
        if not group.requests:
            del self._groups[requests[0].prepared.key]
        return requests

    async def _dispatch(self) -> None:
        slots = self._semaphore()
        try:
            while True:
                await slots.acquire()
                try:
                    requests = await self._next_batch()
                except BaseException:
                    slots.release()
                    raise
                if requests is None:
                    slots.release()
                    return
                self._free_slots.sort()
                slot = self._free_slots.pop(0)
                self._tasks().start_soon(self._run_batch, requests, slot)
        finally:  # cancelled: nothing will run what is still queued
            for group in self._groups.values():
                for request in group.requests:
                    request.queued = False
                    self._fail(
                        [request],
                        ClosedResourceError(
                            "the batcher was stopped before this request's batch ran"
                        ),
                    )
            self._groups.clear()
            self._queued = 0

    # -- running batches -------------------------------------------------------------

    async def _run_batch(self, requests: list[_Request], slot: int) -> None:
        self._running += 1
        start = self._clock.now()
        rows = sum(r.prepared.rows for r in requests)
        size = self._config.batch_size(rows)
        length = self._length(max(r.prepared.length for r in requests))
        error: str | None = None
        try:
            error = await self._execute(requests, size, length)
        finally:
            unfinished = [r for r in requests if not r.done.is_set()]
            if unfinished:
                error = error or "stopped"
                self._fail(
                    unfinished,
                    ClosedResourceError(
                        "the batcher was stopped while this request's batch ran"
                    ),
                )
            self._running -= 1
            self._stats.batch(
                BatchRecord(
                    start=start,
                    end=self._clock.now(),
                    slot=slot,
                    rows=rows,
                    size=size,
                    length=length if self._config.padding is not None else None,
                    queue_delays=tuple(start - r.arrival for r in requests),
                    error=error,
                )
            )
            self._free_slots.append(slot)
            self._semaphore().release()

    async def _execute(
        self, requests: list[_Request], size: int, length: int
    ) -> str | None:
        """Run ``requests`` as one batch of ``size`` rows and answer each;
        return why it failed, or ``None``."""
        try:
            inputs = await self._offload(
                size * requests[0].prepared.row_bytes(length),
                self._joined,
                requests,
                size,
                length,
            )
            outputs = await self._ex.run(**inputs)
            if outputs is None:  # only a stateful run (no inputs) returns None
                raise InputError("the executor returned no outputs")
            nbytes = sum(o.nbytes for o in outputs)
            pieces = await self._offload(nbytes, self._split, outputs, requests, size)
        except InputError as exc:
            padded = self._config.padding is not None
            if len(requests) == 1 and (
                not padded or length == requests[0].prepared.length
            ):
                self._fail(requests, exc)
                return describe(exc)
            # The model refused the joined (or padded) shapes: run each
            # request alone at its own length, so only a request the model
            # refuses alone fails.
            for request in requests:
                rows = request.prepared.rows
                own = request.prepared.length if padded else 0
                await self._execute([request], self._config.batch_size(rows), own)
            return f"{describe(exc)} (its requests ran one by one)"
        except Exception as exc:  # a kernel failed, ...: this batch only
            self._fail(requests, exc)
            return describe(exc)
        for request, outputs_of_request in zip(requests, pieces, strict=True):
            request.outputs = outputs_of_request
            if not request.abandoned:
                self._stats.requests += 1
            request.done.set()
        return None

    async def _offload(self, nbytes: int, func: Any, *args: Any) -> Any:
        """``func(*args)``, off the event loop if it moves many bytes."""
        if nbytes > OFFLOAD_BYTES:
            return await anyio.to_thread.run_sync(func, *args)
        return func(*args)

    def _joined(
        self, requests: list[_Request], size: int, length: int
    ) -> dict[str, np.ndarray[Any, Any]]:
        return {
            spec.name: join(
                [r.prepared.arrays[spec.name] for r in requests],
                spec.axis,
                size,
                length_axis=spec.length_axis,
                length=length,
                pad_value=spec.pad_value,
            )
            for spec in self._config.inputs
        }

    def _split(
        self, outputs: Sequence[NDArray], requests: list[_Request], size: int
    ) -> list[list[NDArray]]:
        rows = [r.prepared.rows for r in requests]
        lengths = [r.prepared.length for r in requests]
        per_request: list[list[NDArray]] = [[] for _ in requests]
        for index, output in enumerate(outputs):
            axis = self._config.output_axes[index]
            array = np.asarray(output)
            if array.ndim <= axis or array.shape[axis] != size:
                raise ArgumentError(
                    f"output {index} has shape {array.shape} for a batch of {size} "
                    f"rows: its batch axis is not {axis} (give it in output_axes)"
                )
            pieces = split(
                array,
                axis,
                rows,
                length_axis=self._config.trim.get(index),
                lengths=lengths,
            )
            for mine, piece in zip(per_request, pieces, strict=True):
                mine.append(wrap_fresh_host(piece, output.dtype))
        return per_request

    def _fail(self, requests: Sequence[_Request], error: BaseException) -> None:
        for request in requests:
            request.error = error
            request.traceback = error.__traceback__
            if not request.abandoned:
                self._stats.failed += 1
            request.done.set()
