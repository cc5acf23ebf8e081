"""What the batcher's tests share: a fake clock, a static graph whose
kernel the test holds or breaks, and waiting on the batcher's state."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

import asyncrt
from asyncrt.graph import Graph, GraphBuilder

__all__ = ("FakeClock", "Gate", "expected", "request", "settle", "static_graph")

#: The static graph's batch size and features.
ROWS, FEATURES = 4, 3


class FakeClock:
    """A clock that moves only when the test says (:meth:`advance`)."""

    def __init__(self) -> None:
        self.time = 0.0
        self._waiting: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self.time

    async def wait_until(self, deadline: float, wakeup: anyio.Event) -> None:
        if deadline <= self.time:
            return
        entry = (deadline, wakeup)
        self._waiting.append(entry)
        try:
            await wakeup.wait()
        finally:
            self._waiting.remove(entry)

    def advance(self, seconds: float) -> None:
        """Move the time on; wake whoever waits for a deadline passed."""
        self.time += seconds
        for deadline, wakeup in list(self._waiting):
            if deadline <= self.time:
                wakeup.set()

    @property
    def deadline(self) -> float:
        """The earliest deadline waited for (``inf`` if none)."""
        return min((d for d, _ in self._waiting), default=math.inf)


async def settle() -> None:
    """Let every task run until it waits (the dispatcher included)."""
    await anyio.wait_all_tasks_blocked()


class Gate:
    """A kernel the test holds: each call waits until :meth:`open`, and the
    calls in flight are counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = threading.Event()
        self.inside = 0
        self.most_inside = 0
        self.calls = 0
        self.entered = threading.Semaphore(0)

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        with self._lock:
            self.inside += 1
            self.calls += 1
            self.most_inside = max(self.most_inside, self.inside)
        self.entered.release()
        try:
            if not self._open.wait(10):
                raise TimeoutError("the test never opened the gate")
            np.multiply(x, 2, out=out)
        finally:
            with self._lock:
                self.inside -= 1

    def open(self) -> None:
        self._open.set()

    async def wait_entered(self, count: int = 1) -> None:
        """Wait (off the loop) until ``count`` more calls have started."""
        for _ in range(count):
            ok = await anyio.to_thread.run_sync(self.entered.acquire, True, 10)
            if not ok:
                raise TimeoutError("the kernel was not called")


def double(x: np.ndarray, out: np.ndarray) -> None:
    """2x; a negative input is poison (ValueError)."""
    if (x < 0).any():
        raise ValueError("a negative input on purpose")
    np.multiply(x, 2, out=out)


def static_graph(
    kernel: Callable[..., None] = double,
) -> tuple[Graph, asyncrt.Module]:
    """x (ROWS, FEATURES) -> kernel (``"k"``) -> y; softmax of y's rows -> p."""
    b = GraphBuilder()
    x = b.input("x", shape=(ROWS, FEATURES), dtype="float32")
    y = b.op("k", x, shape=(ROWS, FEATURES), dtype="float32", name="k0")
    p = b.op("softmax", y, shape=(ROWS, FEATURES), dtype="float32", name="probs")
    b.output(y, p)
    return b.build(), asyncrt.Module({"k": kernel})


def request(value: float, rows: int = 1) -> dict[str, Any]:
    """A request of ``rows`` rows, every element ``value``."""
    return {"x": np.full((rows, FEATURES), value, np.float32)}


def expected(x: np.ndarray) -> list[np.ndarray]:
    """What :func:`static_graph` (with :func:`double`) answers for ``x``."""
    y = 2 * x
    e = np.exp(y - y.max(axis=-1, keepdims=True))
    return [y, e / e.sum(axis=-1, keepdims=True)]
