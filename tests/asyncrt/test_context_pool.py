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
