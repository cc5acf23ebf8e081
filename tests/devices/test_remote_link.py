"""The link figures of remote devices: measured where the probes resolve
them, and printed as unknown where the noise swallows them — never as the
clamp they were cut to. A fake session on a fake clock plays the cluster,
so the timings are exact."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from devices import Device, _remote_link, _remote_ops
from devices._remote_session import Target

ROUND_TRIP = 1e-3  # a task submitted and its result back
LAUNCH = 0.2e-3  # one more task in a chain
HOST_BANDWIDTH = 1e9

T0 = Target(Device("remote", 0), "tcp://a:1", Device("cpu", 0), "a")
T1 = Target(Device("remote", 1), "tcp://b:1", Device("cpu", 0), "b")


@dataclass
class Task:
    target: Target
    fn: Any
    args: tuple[Any, ...]


@dataclass
class FakeSession:
    """Charges each wait what the link would cost, on a fake clock."""

    peer_latency: float
    peer_bandwidth: float
    now: float = 0.0
    queued: list[Task] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def submit(self, target: Target, fn: Any, *args: Any, label: str) -> Task:
        task = Task(target, fn, args)
        self.queued.append(task)
        return task

    def wait(self, future: Task, target: Target, workers: frozenset[str]) -> None:
        cost = ROUND_TRIP + LAUNCH * (len(self.queued) - 1)
        for arg in future.args:
            if isinstance(arg, np.ndarray):
                cost += arg.nbytes / HOST_BANDWIDTH
            elif isinstance(arg, Task) and arg.target != future.target:
                made = self._result(arg)
                size = made.nbytes if isinstance(made, np.ndarray) else 0
                cost += self.peer_latency + size / self.peer_bandwidth
        self.queued.clear()
        self.now += cost

    def fetch(self, future: Task, target: Target, workers: frozenset[str]) -> Any:
        self.wait(future, target, workers)
        result = self._result(future)
        if isinstance(result, np.ndarray):
            self.now += result.nbytes / HOST_BANDWIDTH
        return result

    def _result(self, task: Task) -> Any:
        if task.fn is _remote_ops.measure_flops:
            return 1e9
        args = [self._result(a) if isinstance(a, Task) else a for a in task.args]
        return task.fn(*args)


def measure(
    monkeypatch: pytest.MonkeyPatch, latency: float, bandwidth: float
) -> _remote_link.LinkFigures:
    session = FakeSession(latency, bandwidth)
    fake_time = types.SimpleNamespace(perf_counter=session.clock)
    monkeypatch.setattr(_remote_link, "time", fake_time)
    return _remote_link.measure(session, T0, T1)  # type: ignore[arg-type]


def attributes(figures: _remote_link.LinkFigures) -> dict[str, Any]:
    return {
        name: getattr(figures, name)
        for name in (
            "flops", "launch_overhead", "host_latency", "host_bandwidth",
            "peer_latency", "peer_bandwidth", "unresolved",
        )
    }  # fmt: skip


def test_a_real_link_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = measure(monkeypatch, latency=0.5e-3, bandwidth=100e6)
    assert figures.unresolved == ()
    assert figures.host_latency == pytest.approx(ROUND_TRIP)
    assert figures.launch_overhead == pytest.approx(LAUNCH)
    assert figures.host_bandwidth == pytest.approx(HOST_BANDWIDTH)
    assert figures.peer_latency == pytest.approx(0.5e-3)
    assert figures.peer_bandwidth == pytest.approx(100e6)
    text = _remote_link.describe(attributes(figures))
    assert text == (
        "1.0 GFLOP/s, launch 0.20 ms, host link 1.00 ms + 1000 MB/s, "
        "peer link 0.50 ms + 100 MB/s"
    )


def test_a_link_lost_in_the_noise_is_unknown_not_implausible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Workers that share memory: a hand-over costs nothing beyond the round
    # trip (here a hair less: noise), so there is nothing to measure.
    figures = measure(monkeypatch, latency=-0.01e-3, bandwidth=1e15)
    assert set(figures.unresolved) == {"peer_latency", "peer_bandwidth"}
    text = _remote_link.describe(attributes(figures))
    assert text.endswith("peer link unknown + unknown")
    assert "0.00 ms" not in text and "1000000 MB/s" not in text
    # The cost model still gets numbers: finite, positive, within the clamps.
    assert figures.peer_latency > 0 and 0 < figures.peer_bandwidth <= 1e12
