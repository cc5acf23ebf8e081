"""Shared fixtures: both async backends, leak checks, a clean sim setup."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

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


@pytest.fixture(autouse=True)
def default_sim_devices() -> Iterator[None]:
    """Two sim devices with the default config, restored after each test."""
    sim.configure(2)
    yield
    sim.configure(2)
