"""Run contexts: the activations of one run, and a fair pool of them.

A :class:`RunContext` owns what one run writes: an input buffer for every
graph input, and a :class:`~scheduler.dispatch.Program` (arenas, streams and
pre-bound calls). Parameters are not copied into contexts: every context
binds the executor's shared, read-only parameter arrays.

:class:`ContextPool` lends contexts to concurrent runs: at most ``limit``
exist at once; callers beyond that wait in FIFO order, and a context that
comes back goes straight to the longest waiter.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping

import anyio

from devices import NDArray, empty
from scheduler.dag import Entry
from scheduler.dispatch import Kernel, Program
from scheduler.plan import Plan

from .errors import ClosedResourceError

__all__ = ("ContextPool", "RunContext")


class RunContext:
    """The activations of one run at a time.

    :param plan: the plan.
    :param kernels: the kernel of each launch, by node id.
    :param inputs: node ids of graph inputs that this context owns a buffer
        for (parameters are passed in ``shared`` instead).
    :param shared: the shared parameter arrays, by entry.
    """

    def __init__(
        self,
        plan: Plan,
        kernels: Mapping[int, Kernel],
        inputs: tuple[int, ...],
        shared: Mapping[Entry, NDArray],
    ) -> None:
        self.inputs: dict[Entry, NDArray] = {}
        for nid in inputs:
            entry = Entry(nid, 0)
            spec = plan.tensors[entry]
            self.inputs[entry] = empty(
                spec.shape, spec.dtype, plan.storage[entry].device
            )
        self.is_set: set[Entry] = set()
        self.program = Program(plan, kernels, {**self.inputs, **shared})
        self.generation = 0

    def output(self, entry: Entry) -> NDArray:
        """The array of a head in this context (overwritten by its next run)."""
        return self.program.arrays[entry]

    def close(self) -> None:
        """Free the program's streams and arenas."""
        self.program.close()


class ContextPool:
    """At most ``limit`` contexts, lent to callers first come, first served.

    :param make: creates a context.
    :param limit: the most contexts that may exist at once.
    """

    def __init__(self, make: Callable[[], RunContext], limit: int) -> None:
        if limit < 1:
            raise ValueError("the context limit must be >= 1")
        self._make = make
        self.limit = limit
        self._idle: list[RunContext] = []
        self._count = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._closed = False

    @property
    def size(self) -> int:
        """How many contexts exist (idle or lent)."""
        return self._count

    @property
    def idle(self) -> int:
        """How many contexts wait unused."""
        return len(self._idle)

    async def acquire(self) -> RunContext:
        """Borrow a context, waiting (fairly) if all are lent.

        :raises ClosedResourceError: if the pool is closed.
        """
        self._check_open()
        context = self._take_without_waiting()
        if context is not None:
            return context
        waiter = _Waiter()
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.context is not None:  # handed over just as we left
                self.release(waiter.context)
            else:
                self._waiters.remove(waiter)
            raise
        if waiter.context is None:
            raise ClosedResourceError("the executor was closed while waiting")
        return waiter.context

    def _take_without_waiting(self) -> RunContext | None:
        """An idle context, or a new one if under the limit; ``None`` if the
        caller must queue (also when others queue already: fairness)."""
        if self._waiters:
            return None
        if self._idle:
            return self._idle.pop()
        if self._count < self.limit:
            self._count += 1
            try:
                return self._make()
            except BaseException:
                self._count -= 1
                raise
        return None

    def release(self, context: RunContext) -> None:
        """Return a context: to the longest waiter, or to the idle list."""
        if self._closed:
            context.close()
            self._count -= 1
            return
        if self._waiters:
            waiter = self._waiters.popleft()
            waiter.context = context
            waiter.event.set()
        else:
            self._idle.append(context)

    def discard(self, context: RunContext) -> None:
        """Drop a lent context instead of returning it (it is broken)."""
        context.close()
        self._count -= 1

    def clear_idle(self) -> None:
        """Close the idle contexts (e.g. after parameters changed)."""
        while self._idle:
            self._idle.pop().close()
            self._count -= 1

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


class _Waiter:
    __slots__ = ("context", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.context: RunContext | None = None
