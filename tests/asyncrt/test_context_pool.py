"""``ContextPool.adopt``: a context made outside the pool joins it only
where the pool's limits allow, and goes to the longest waiter first."""

from __future__ import annotations

import anyio
import pytest

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
