"""Shared fixtures: both async backends, leak checks, a clean sim setup."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from asyncrt.runtime import _threads
from devices import sim


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every ``@pytest.mark.anyio`` test runs on asyncio and on trio."""
    return str(request.param)


def _asyncrt_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("asyncrt-")}


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves an asyncrt worker thread running."""
    before = _asyncrt_threads()
    yield
    leaked = _asyncrt_threads() - before
    for thread in leaked:
        thread.join(timeout=2.0)
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"threads left running: {still}"


class _QuietNeighbours:
    """No other process keeps a core busy."""

    cores = 0.0

    def update(self) -> float:
        return 0.0


@pytest.fixture(autouse=True)
def quiet_neighbours(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel pools are not resized for what else runs on the machine
    (xdist's other workers, a shared CI host): the tests assert the thread
    counts of the sharing policy. The tests of the estimate make their own
    (:class:`asyncrt.runtime._neighbours.BusyNeighbours`)."""
    monkeypatch.setattr(_threads.limits, "_neighbours", _QuietNeighbours())
    monkeypatch.setattr(_threads, "BusyNeighbours", _QuietNeighbours)


@pytest.fixture(autouse=True)
def default_sim_devices() -> Iterator[None]:
    """Two sim devices with the default config, restored after each test."""
    sim.configure(2)
    yield
    sim.configure(2)
