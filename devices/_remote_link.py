"""Measuring remote devices at connect time, for the cost model.

The analytic cost model (:mod:`scheduler.cost`) reads a device's ``flops``,
``launch_overhead``, ``host_bandwidth`` and ``host_latency`` (its link to
the host) and ``peer_bandwidth`` and ``peer_latency`` (its link to another
device of its kind). A remote device cannot know these without asking, so
:func:`measure` probes each one once, with small probes:

* ``host_latency``: the best round trip of an empty task (submit, run,
  result back);
* ``launch_overhead``: an empty task's share of a chain of
  :data:`CHAIN` of them, each depending on the one before: what one more
  launch on a stream costs;
* ``host_bandwidth``: :data:`PROBE` bytes sent up inside a task and
  :data:`PROBE` bytes brought back, less two round trips (best of two);
* ``peer_bandwidth``: :data:`PROBE` bytes made on this worker and pulled by a
  task on the next worker (in address order) that takes them as argument —
  exactly how a copy between two remote devices moves — less one round trip
  (best of two); ``peer_latency`` is the same hand-over with no payload;
* ``flops``: the worker's own float32 matmul throughput.

Figures are clamped to sane ranges: on a busy machine the fixed costs
subtracted can be most of a probe's time, so the bytes' own time counts at
least a tenth of it. A cluster of one worker reports its host link as its peer link.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _remote_ops as ops
from ._remote_session import Session, Target

__all__ = ("CHAIN", "PROBE", "LinkFigures", "measure")

#: Bytes moved by each bandwidth probe.
PROBE = 2 << 20
#: Tasks in the chain that measures the launch overhead.
CHAIN = 5

_MIN_SECONDS = 1e-6
_BANDWIDTH_RANGE = (1e6, 1e12)


@dataclass(frozen=True)
class LinkFigures:
    """What :func:`measure` found for one device (seconds, bytes/s, FLOP/s)."""

    flops: float
    launch_overhead: float
    host_latency: float
    host_bandwidth: float
    peer_latency: float
    peer_bandwidth: float


def _timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _bandwidth(nbytes: float, moving: float, total: float) -> float:
    """``nbytes / moving``, where ``moving`` is ``total`` less the fixed
    costs; noise can make that nothing, so it counts at least a tenth of
    ``total`` (an estimate too low, rather than an absurd one)."""
    low, high = _BANDWIDTH_RANGE
    seconds = max(moving, 0.1 * total, _MIN_SECONDS)
    return min(high, max(low, nbytes / seconds))


def measure(session: Session, target: Target, peer: Target | None) -> LinkFigures:
    """Probe ``target`` and its link to ``peer`` (see the module docstring).

    :raises RemoteError: if a probe fails on the worker.
    :raises DeviceLostError: if the worker is lost meanwhile.
    """

    both = frozenset({target.worker} | ({peer.worker} if peer else set()))

    def round_trip(where: Target, fn: Callable[..., Any], *args: Any) -> Any:
        future = session.submit(where, fn, *args, label="probe")
        return session.fetch(future, where, both)

    latency = min(_timed(lambda: round_trip(target, ops.noop)) for _ in range(3))

    def chain() -> None:
        future = None
        for _ in range(CHAIN):
            future = session.submit(target, ops.noop, future, label="probe")
        session.wait(future, target, both)

    overhead = max(0.0, (_timed(chain) - latency) / (CHAIN - 1))
    payload = ops.zeros(PROBE)
    up = min(_timed(lambda: round_trip(target, ops.nbytes_of, payload)) for _ in "ab")
    down = min(_timed(lambda: round_trip(target, ops.zeros, PROBE)) for _ in "ab")
    host_bandwidth = _bandwidth(2 * PROBE, up + down - 2 * latency, up + down)
    flops = float(round_trip(target, ops.measure_flops, str(target.local)))
    if peer is None or peer.worker == target.worker:
        return LinkFigures(
            flops, overhead, latency, host_bandwidth, latency, host_bandwidth
        )

    def hand_over(fn: Callable[..., Any], *args: Any) -> float:
        made = session.submit(target, fn, *args, label="probe")
        session.wait(made, target, both)
        return _timed(lambda: round_trip(peer, ops.noop, made)) - latency

    peer_latency = max(_MIN_SECONDS, min(hand_over(ops.noop) for _ in "ab"))
    moved = min(hand_over(ops.zeros, PROBE) for _ in "ab")
    peer_bandwidth = _bandwidth(PROBE, moved - peer_latency, moved)
    return LinkFigures(
        flops, overhead, latency, host_bandwidth, peer_latency, peer_bandwidth
    )
