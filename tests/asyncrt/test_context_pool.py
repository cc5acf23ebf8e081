"""``ContextPool``: a context made outside the pool joins it only where the
pool's limits allow, and goes to the longest waiter first; contexts are made
one at a time, and a device without room stops the growth but never strands
a caller."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from asyncrt.errors import ClosedResourceError, OutOfMemoryError
from asyncrt.runtime._context import ContextPool


class Context:
    def __init__(self, nbytes: int = 10) -> None:
        self.nbytes = nbytes
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_an_adopted_context_is_lent_before_a_new_one_is_made() -> None:
    made: list[Context] = []
    pool: ContextPool[Context] = ContextPool(
        lambda: made.append(Context()) or made[-1], 2
    )
    adopted = Context()
    assert pool.adopt(adopted)
    assert (pool.size, pool.idle, pool.nbytes) == (1, 1, 10)

    async def borrow() -> Context:
        return await pool.acquire()

    assert anyio.run(borrow) is adopted
    assert made == []


def test_adopt_refuses_past_the_limit_the_budget_or_after_close() -> None:
    pool: ContextPool[Context] = ContextPool(Context, 1)
    assert pool.adopt(Context())
    assert not pool.adopt(Context())  # the limit: one context
    budgeted: ContextPool[Context] = ContextPool(Context, 4, budget=15, cost=lambda: 10)
    assert budgeted.adopt(Context())  # one context is always allowed
    assert not budgeted.adopt(Context())  # 10 + 10 > 15
    budgeted.close()
    assert not budgeted.adopt(Context())


@pytest.mark.anyio
async def test_an_adopted_context_goes_to_the_longest_waiter() -> None:
    first = Context()
    pool: ContextPool[Context] = ContextPool(Context, 2)
    lent = await pool.acquire()
    pool.limit = 1  # now nothing new may be made: a caller waits
    got: list[Context] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _borrow_into(pool, got))
        while pool.waiting == 0:
            await anyio.sleep(0)
        pool.limit = 2
        assert pool.adopt(first)
    assert got == [first]
    assert pool.lent == {lent, first}


async def _borrow_into(pool: ContextPool[Context], got: list[Context]) -> None:
    got.append(await pool.acquire())


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_context_finished_after_its_caller_left_is_closed() -> None:
    """asyncio's own cancellation (``wait_for``'s timeout, ``task.cancel()``)
    does not wait for the worker thread making a context: the context it
    finishes later must be closed, not leaked with its streams and memory."""
    import asyncio
    import threading

    proceed, entered = threading.Event(), threading.Event()
    made: list[Context] = []

    def make() -> Context:
        entered.set()
        proceed.wait(5)
        made.append(Context())
        return made[-1]

    pool: ContextPool[Context] = ContextPool(make, 1)
    task = asyncio.ensure_future(pool.acquire())
    while not entered.is_set():
        await anyio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (pool.size, pool.nbytes, pool.lent) == (0, 0, frozenset())
    proceed.set()
    with anyio.fail_after(5):
        while not made or not made[0].closed:
            await anyio.sleep(0.001)
    assert (pool.size, pool.idle, pool.nbytes) == (0, 0, 0)
    with anyio.fail_after(5):
        second = await pool.acquire()  # the pool is still usable
    assert second is not made[0] and not second.closed


# -- growth: one context at a time, and a full device --------------------------


class Maker:
    """Makes contexts in the pool's worker thread; ``room`` of them fit
    (more raise :class:`OutOfMemoryError`), makers may be held at a gate,
    and with ``crowding`` makers that overlap all fail (half-made contexts
    that leave no room for each other)."""

    def __init__(self, room: int, *, crowding: bool = False) -> None:
        self.room = room
        self.crowding = crowding
        self.crowded = False
        self.calls = 0
        self.busy = 0
        self.most_busy = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> Context:
        with self._lock:
            self.calls += 1
            self.busy += 1
            self.most_busy = max(self.most_busy, self.busy)
            self.crowded |= self.busy > 1
        self.entered.set()
        try:
            self.gate.wait(5)
            time.sleep(0.002)
            with self._lock:
                if self.room == 0 or (self.crowding and self.crowded):
                    raise OutOfMemoryError("sim:0", 10, 0)
                self.room -= 1
            return Context()
        finally:
            with self._lock:
                self.busy -= 1
                self.crowded &= self.busy > 0


async def _hold(pool: ContextPool[Context], seconds: float, got: list[Context]) -> None:
    context = await pool.acquire()
    got.append(context)
    await anyio.sleep(seconds)
    pool.release(context)


async def _burst(
    pool: ContextPool[Context], maker: Maker, callers: int, seconds: float, waiting: int
) -> list[Context]:
    """``callers`` borrow a context each for ``seconds`` at once; the makers
    are held until ``pool.limit`` of them run (``waiting`` callers wait
    meanwhile). The contexts each caller got, in turn."""
    maker.gate.clear()
    got: list[Context] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(_hold, pool, seconds, got)
            while maker.busy < pool.limit:
                await anyio.sleep(0.001)
            assert pool.waiting == waiting
            maker.gate.set()
    return got


@pytest.mark.anyio
async def test_contexts_are_made_concurrently_up_to_the_limit() -> None:
    maker = Maker(room=8)
    pool: ContextPool[Context] = ContextPool(maker, 4)
    got = await _burst(pool, maker, 12, 0.01, waiting=8)  # four made at once
    assert maker.most_busy == 4 and maker.calls == 4
    assert (pool.size, pool.idle, len(got), len(set(got))) == (4, 4, 12, 4)


@pytest.mark.anyio
async def test_contexts_that_crowd_each_other_out_are_retried_alone() -> None:
    """Four contexts made at once leave no room for any; the graph fits,
    so no caller may see an out-of-memory error."""
    maker = Maker(room=1, crowding=True)
    pool: ContextPool[Context] = ContextPool(maker, 4)
    got = await _burst(pool, maker, 6, 0.005, waiting=2)
    assert maker.calls == 5  # four crowded out, then one alone
    assert pool.size == 1 and len(got) == 6 and set(got) == {got[0]}


@pytest.mark.anyio
async def test_a_context_back_while_a_growth_fails_goes_to_the_grower() -> None:
    """The context came back to the idle list (nobody waited) while a second
    one was being made; that one found no room. The grower must take the
    idle context rather than wait for a hand-over that will not come."""
    maker = Maker(room=1)
    pool: ContextPool[Context] = ContextPool(maker, 2)
    first = await pool.acquire()
    maker.gate.clear()
    maker.entered.clear()
    got: list[Context] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_borrow_into, pool, got)
            while not maker.entered.is_set():
                await anyio.sleep(0.001)
            pool.release(first)  # nobody waits: it goes idle
            assert pool.idle == 1
            maker.gate.set()  # now the growth fails
    assert got == [first] and pool.size == 1


@pytest.mark.anyio
async def test_a_full_device_stops_growth_until_a_context_is_dropped() -> None:
    maker = Maker(room=1)
    pool: ContextPool[Context] = ContextPool(maker, 4)
    got: list[Context] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(_hold, pool, 0.005, got)
    # four were begun at once, one fitted and served all eight; the pool
    # tried no more while it was full
    assert maker.calls == 4 and pool.size == 1 and set(got) == {got[0]}
    maker.room = 2
    lent = await pool.acquire()
    assert maker.calls == 4
    pool.discard(lent)  # its room is free: the pool may grow again
    again = await pool.acquire()
    other = await pool.acquire()
    assert maker.calls == 6 and lent not in (again, other) and pool.size == 2


@pytest.mark.anyio
async def test_closing_while_a_growth_fails_wakes_the_grower() -> None:
    maker = Maker(room=1)
    pool: ContextPool[Context] = ContextPool(maker, 2)
    await pool.acquire()
    maker.gate.clear()
    maker.entered.clear()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def grow() -> None:
                with pytest.raises(ClosedResourceError):
                    await pool.acquire()

            tg.start_soon(grow)
            while not maker.entered.is_set():
                await anyio.sleep(0.001)
            pool.close()
            maker.gate.set()
