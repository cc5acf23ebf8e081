"""Run contexts: the activations of one run, and a fair, bounded pool of them.

A :class:`RunContext` owns what one run writes: an input buffer for every
graph input, and a :class:`~scheduler.dispatch.Program` (arenas, streams and
pre-bound calls). Parameters are not copied into contexts: every context
binds the executor's shared, read-only parameter arrays. What a context costs
in device memory is known before it is made (:func:`context_nbytes`): the
plan's arenas plus its input buffers.

:class:`ContextPool` lends contexts to concurrent runs. Policy:

* at most ``limit`` contexts exist at once, and their bytes stay within
  ``budget`` (if given) — except that one context is always allowed, so a
  budget smaller than one context still runs, one run at a time;
* callers beyond that wait in FIFO order; a context that comes back goes
  straight to the longest waiter, and a caller never overtakes a waiter;
* a context is made off the event loop, in a worker thread (a first run or
  pool growth never holds the loop for an allocation, a stream's start or a
  remote device's round trips);
* a device that runs out of memory while the pool grows is not an error for
  the caller as long as another context exists: the caller waits for that
  one instead (or takes one that came back meanwhile), and the pool stops
  growing until a context is dropped (more attempts would only fail again).
  Only when no context exists at all does the
  :class:`~asyncrt.errors.OutOfMemoryError` reach the caller (the graph does
  not fit on the device), after a second try alone if other contexts were
  being made at the same time (two half-made contexts may crowd each other
  out where one fits); the failed context is not counted;
* a context dropped instead of returned (:meth:`ContextPool.discard`, e.g.
  made before the parameters changed) frees room: the longest waiter is
  woken to make a new one in its own task;
* closing wakes every waiter with :class:`~asyncrt.errors.ClosedResourceError`;
  lent contexts are closed when they come back.

The pool is driven from one event loop (it is not thread-safe).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, Protocol, TypeVar

import anyio

from devices import NDArray, empty, get_api
from scheduler.dag import Entry
from scheduler.dispatch import Kernel, Program
from scheduler.plan import Plan

from ..errors import ClosedResourceError, OutOfMemoryError

__all__ = ("ContextPool", "PooledContext", "RunContext", "context_nbytes")


class PooledContext(Protocol):
    """What the pool needs of a context: its bytes, and a way to free it."""

    @property
    def nbytes(self) -> int:
        """Device bytes the context holds."""

    def close(self) -> None:
        """Free the context."""


C = TypeVar("C", bound=PooledContext)


def context_nbytes(plan: Plan, inputs: Iterable[int]) -> int:
    """Device bytes a context of ``plan`` costs: its arenas and the buffers
    of the graph inputs ``inputs`` (node ids) that it owns."""
    arenas = sum(arena.size for arena in plan.arenas.values())
    return arenas + sum(plan.tensors[Entry(nid, 0)].nbytes for nid in inputs)


class RunContext:
    """The activations of one run at a time.

    :param plan: the plan.
    :param kernels: the kernel of each launch, by node id.
    :param inputs: node ids of graph inputs that this context owns a buffer
        for (parameters are passed in ``shared`` instead).
    :param shared: the shared parameter arrays, by entry.
    :raises OutOfMemoryError: if a device has no room for the context (what
        was allocated is freed again).
    """

    def __init__(
        self,
        plan: Plan,
        kernels: Mapping[int, Kernel],
        inputs: tuple[int, ...],
        shared: Mapping[Entry, NDArray],
    ) -> None:
        self.nbytes = context_nbytes(plan, inputs)
        self.inputs: dict[Entry, NDArray] = {}
        try:
            for nid in inputs:
                entry = Entry(nid, 0)
                spec = plan.tensors[entry]
                self.inputs[entry] = empty(
                    spec.shape, spec.dtype, plan.storage[entry].device
                )
            self.program = Program(
                plan, kernels, {**self.inputs, **shared}, constant=shared.keys()
            )
        except BaseException:
            self._free_inputs()
            raise
        self.is_set: set[Entry] = set()
        self.generation = 0

    @property
    def usable(self) -> bool:
        """Whether the context may serve another run (always, in process)."""
        return True

    def output(self, entry: Entry) -> NDArray:
        """The array of a head in this context (overwritten by its next run)."""
        return self.program.arrays[entry]

    def close(self) -> None:
        """Free the program's streams and arenas. The input buffers are
        freed with the context (``get_input`` may have handed them out)."""
        self.program.close()

    def _free_inputs(self) -> None:
        for array in self.inputs.values():
            get_api(array.device.kind).free(array.buffer)


class ContextPool(Generic[C]):
    """Contexts lent to callers first come, first served; see the module
    docstring for the policy.

    :param make: creates a context.
    :param limit: the most contexts that may exist at once.
    :param budget: the most bytes the contexts may hold together, or
        ``None`` for no limit; one context is always allowed.
    :param cost: the bytes the next context will cost (checked against
        ``budget`` before it is made).
    :raises ValueError: if ``limit`` < 1 or ``budget`` < 0.
    """

    def __init__(
        self,
        make: Callable[[], C],
        limit: int,
        *,
        budget: int | None = None,
        cost: Callable[[], int] = lambda: 0,
    ) -> None:
        if limit < 1:
            raise ValueError("the context limit must be >= 1")
        if budget is not None and budget < 0:
            raise ValueError("the memory budget must be >= 0")
        self._make = make
        self.limit = limit
        self.budget = budget
        self._cost = cost
        self._idle: list[C] = []
        self._lent: set[C] = set()
        self._count = 0
        self._bytes = 0
        self._waiters: collections.deque[_Waiter[C]] = collections.deque()
        self._closed = False
        self._full = False  # a device ran out of memory for one more context
        self._making = 0  # contexts being made now
        self._attempts = 0  # contexts begun, ever (to tell if makers overlapped)

    @property
    def size(self) -> int:
        """How many contexts exist (idle or lent)."""
        return self._count

    @property
    def idle(self) -> int:
        """How many contexts wait unused."""
        return len(self._idle)

    @property
    def lent(self) -> frozenset[C]:
        """The contexts lent out now (runs in flight)."""
        return frozenset(self._lent)

    @property
    def waiting(self) -> int:
        """How many callers wait for a context."""
        return len(self._waiters)

    @property
    def nbytes(self) -> int:
        """Device bytes the existing contexts hold together."""
        return self._bytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def acquire(self) -> C:
        """Borrow a context, waiting (fairly) if none may be lent now.

        :raises ClosedResourceError: if the pool is or gets closed.
        :raises OutOfMemoryError: if no context exists and a device has no
            room for a first one.
        """
        self._check_open()
        if not self._waiters:  # fairness: never overtake a waiter
            context = await self._take()
            if context is not None:
                return context
        return await self._wait(front=False)

    async def _wait(self, *, front: bool) -> C:
        while True:
            if self._closed:  # closed while this caller tried to grow
                raise ClosedResourceError("the executor was closed while waiting")
            waiter: _Waiter[C] = _Waiter()
            if front:
                self._waiters.appendleft(waiter)
            else:
                self._waiters.append(waiter)
            try:
                await waiter.event.wait()
            except BaseException:
                if waiter.context is not None:  # handed over just as we left
                    self.release(waiter.context)
                elif waiter.may_grow:  # pass the room we were given on
                    self._wake_grower()
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
            if waiter.context is not None:
                return waiter.context
            if not waiter.may_grow or self._closed:
                raise ClosedResourceError("the executor was closed while waiting")
            context = await self._take()
            if context is not None:
                return context
            front = True  # keep our place at the head of the queue

    def _may_grow(self) -> bool:
        """Whether the limits allow one more context now."""
        if self._count >= self.limit:
            return False
        if self._count == 0:
            return True
        if self._full:
            return False
        return self.budget is None or self._bytes + self._cost() <= self.budget

    async def _take(self) -> C | None:
        """Lend an idle context, or a new one if the limits allow; ``None``
        if the caller must wait."""
        retried = False
        while not self._idle and self._may_grow():
            others, attempts = self._making, self._attempts
            try:
                context = await self._grow()
            except OutOfMemoryError:
                if self._count:
                    # Wait for one of the others instead (or take the one
                    # that came back, to the idle list, while we tried).
                    self._full = True  # only a dropped context makes room
                    break
                if not retried and (others or self._attempts != attempts + 1):
                    # Half-made contexts crowded each other out: alone (the
                    # others wait while the pool is full), one may fit.
                    retried = self._full = True
                    continue
                self._wake_grower()  # the others try too (and fail clearly)
                raise  # nothing will come back: the graph does not fit
            if self._closed:  # closed while it was made
                self._drop(context)
                raise ClosedResourceError("the executor was closed while waiting")
            self._lent.add(context)
            return context
        if not self._idle:
            return None
        context = self._idle.pop()
        self._lent.add(context)
        return context

    async def _grow(self) -> C:
        """Make a context off the event loop (allocation, streams, kernel
        binding and, for remote devices, round trips take milliseconds or
        more). A caller cancelled meanwhile leaves the finished context idle
        for the next caller; one that left before the thread finished
        (asyncio's own cancellation does not wait for it) gives up the
        place, and the thread closes what it made."""
        # Reserve the place and the bytes while it is made, so that callers
        # growing meanwhile count it against the limits.
        reserved = self._cost()
        self._count += 1
        self._bytes += reserved
        self._making += 1
        self._attempts += 1
        made: list[C] = []
        handover = threading.Lock()
        left: list[bool] = []

        def make() -> None:
            context = self._make()
            with handover:
                if not left:
                    made.append(context)
                    return
            context.close()  # nobody will take it: free its streams and memory

        try:
            await anyio.to_thread.run_sync(make)
        except BaseException as error:
            with handover:
                left.append(True)
            self._making -= 1
            if made:  # cancelled once it was made: keep it for others
                self._bytes += made[0].nbytes - reserved
                self._lent.add(made[0])
                self.release(made[0])
            else:
                self._count -= 1
                self._bytes -= reserved
                if not isinstance(error, OutOfMemoryError):  # (the caller decides)
                    self._wake_grower()  # others may still succeed (or fail clearly)
            raise
        self._making -= 1
        self._bytes += made[0].nbytes - reserved
        return made[0]

    def _wake_grower(self) -> None:
        """Tell the longest waiter that it may make a context."""
        if self._waiters and not self._closed and self._may_grow():
            waiter = self._waiters.popleft()
            waiter.may_grow = True
            waiter.event.set()

    def adopt(self, context: C) -> bool:
        """Take a context made elsewhere as an idle one (or hand it to the
        longest waiter), if the limits allow a new context now.

        :returns: ``False`` if they do not (the caller keeps, and closes,
            ``context``).
        """
        if self._closed or not self._may_grow():
            return False
        self._count += 1
        self._bytes += context.nbytes
        self._lent.add(context)
        self.release(context)
        return True

    def release(self, context: C) -> None:
        """Return a lent context: to the longest waiter, or to the idle list."""
        if self._closed:
            self._drop(context)
            return
        if self._waiters:
            waiter = self._waiters.popleft()
            waiter.context = context  # stays lent
            waiter.event.set()
        else:
            self._lent.discard(context)
            self._idle.append(context)

    def discard(self, context: C) -> None:
        """Drop a lent context instead of returning it (it is stale or
        broken); a waiter may make a new one in its place."""
        self._drop(context)
        self._wake_grower()

    def _drop(self, context: C) -> None:
        self._lent.discard(context)
        self._count -= 1
        self._bytes -= context.nbytes
        self._full = False  # its memory is free again
        context.close()

    def clear_idle(self) -> None:
        """Close the idle contexts (e.g. after parameters changed)."""
        while self._idle:
            context = self._idle.pop()
            self._count -= 1
            self._bytes -= context.nbytes
            self._full = False
            context.close()

    def close(self) -> None:
        """Close idle contexts now, lent ones when they come back; wake every
        waiter with :class:`ClosedResourceError`."""
        self._closed = True
        self.clear_idle()
        while self._waiters:
            self._waiters.popleft().event.set()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("the executor is closed")


class _Waiter(Generic[C]):
    __slots__ = ("context", "event", "may_grow")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.context: C | None = None
        self.may_grow = False
