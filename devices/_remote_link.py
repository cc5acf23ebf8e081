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

A figure is a difference of timings (a probe less the fixed costs around
it), so on a busy machine, or where workers share a process and a
"transfer" is a reference, the difference can be lost in the noise. Such a
figure is *unresolved*: it is named in :attr:`LinkFigures.unresolved` and
printed as ``unknown`` (:func:`describe`), never as the clamp it was cut to
(``0.00 ms + 1000000 MB/s``). The cost model still needs a number, so an
unresolved bandwidth keeps a conservative estimate (the bytes' own time
counted as at least a tenth of the probe's) and an unresolved latency its
floor. A cluster of one worker reports its host link as its peer link.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _remote_ops as ops
from ._remote_session import Session, Target

__all__ = ("CHAIN", "PROBE", "LinkFigures", "describe", "measure")

#: Bytes moved by each bandwidth probe.
PROBE = 2 << 20
#: Tasks in the chain that measures the launch overhead.
CHAIN = 5

_MIN_SECONDS = 1e-6
_BANDWIDTH_RANGE = (1e6, 1e12)
#: A difference of timings below this share of the probe is noise.
_RESOLVED_SHARE = 0.1


@dataclass(frozen=True)
class LinkFigures:
    """What :func:`measure` found for one device (seconds, bytes/s, FLOP/s).

    :ivar unresolved: the names of the figures the probes could not resolve
        (see the module docstring); their values are estimates for the cost
        model, not measurements.
    """

    flops: float
    launch_overhead: float
    host_latency: float
    host_bandwidth: float
    peer_latency: float
    peer_bandwidth: float
    unresolved: tuple[str, ...] = ()


def _timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _bandwidth(nbytes: float, moving: float, total: float) -> tuple[float, bool]:
    """``nbytes / moving``, where ``moving`` is ``total`` less the fixed
    costs, and whether that was resolved; noise can make ``moving`` nothing,
    so it counts at least a tenth of ``total`` (an estimate too low, rather
    than an absurd one)."""
    low, high = _BANDWIDTH_RANGE
    floor = max(_RESOLVED_SHARE * total, _MIN_SECONDS)
    seconds = max(moving, floor)
    value = nbytes / seconds
    return min(high, max(low, value)), moving >= floor and low <= value <= high


def _latency(extra: float, whole: float) -> tuple[float, bool]:
    """A latency of ``extra`` seconds within a probe of ``whole`` seconds,
    floored, and whether it stood out of the probe's noise."""
    return max(_MIN_SECONDS, extra), extra >= max(_MIN_SECONDS, _RESOLVED_SHARE * whole)


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

    chained = _timed(chain)
    overhead = max(0.0, (chained - latency) / (CHAIN - 1))
    unresolved = []
    if chained - latency < _RESOLVED_SHARE * chained:
        unresolved.append("launch_overhead")
    payload = ops.zeros(PROBE)
    up = min(_timed(lambda: round_trip(target, ops.nbytes_of, payload)) for _ in "ab")
    down = min(_timed(lambda: round_trip(target, ops.zeros, PROBE)) for _ in "ab")
    host_bandwidth, resolved = _bandwidth(2 * PROBE, up + down - 2 * latency, up + down)
    if not resolved:
        unresolved.append("host_bandwidth")
    flops = float(round_trip(target, ops.measure_flops, str(target.local)))
    if peer is None or peer.worker == target.worker:
        if "host_bandwidth" in unresolved:
            unresolved.append("peer_bandwidth")
        return LinkFigures(
            flops,
            overhead,
            latency,
            host_bandwidth,
            latency,
            host_bandwidth,
            tuple(unresolved),
        )

    def hand_over(fn: Callable[..., Any], *args: Any) -> tuple[float, float]:
        """The hand-over's time less a host round trip, and its whole time."""
        made = session.submit(target, fn, *args, label="probe")
        session.wait(made, target, both)
        whole = _timed(lambda: round_trip(peer, ops.noop, made))
        return whole - latency, whole

    extra, whole = min(hand_over(ops.noop) for _ in "ab")
    peer_latency, resolved = _latency(extra, whole)
    if not resolved:
        unresolved.append("peer_latency")
    moved, whole = min(hand_over(ops.zeros, PROBE) for _ in "ab")
    peer_bandwidth, resolved = _bandwidth(
        PROBE, moved - max(extra, 0.0), max(moved, _MIN_SECONDS)
    )
    if not resolved:
        unresolved.append("peer_bandwidth")
    return LinkFigures(
        flops,
        overhead,
        latency,
        host_bandwidth,
        peer_latency,
        peer_bandwidth,
        tuple(unresolved),
    )


def describe(attributes: Mapping[str, Any]) -> str:
    """A remote device's measured figures as one line of text, ``unknown``
    where the probes could not resolve a figure (its ``unresolved``
    attribute names them).

    :param attributes: the device's attributes (``DeviceAPI.attributes``).
    """
    unknown = set(attributes.get("unresolved", ()))

    def figure(name: str, text: str) -> str:
        return "unknown" if name in unknown else text

    return (
        f"{attributes['flops'] / 1e9:.1f} GFLOP/s, launch "
        + figure("launch_overhead", f"{attributes['launch_overhead'] * 1e3:.2f} ms")
        + ", host link "
        + figure("host_latency", f"{attributes['host_latency'] * 1e3:.2f} ms")
        + " + "
        + figure("host_bandwidth", f"{attributes['host_bandwidth'] / 1e6:.0f} MB/s")
        + ", peer link "
        + figure("peer_latency", f"{attributes['peer_latency'] * 1e3:.2f} ms")
        + " + "
        + figure("peer_bandwidth", f"{attributes['peer_bandwidth'] / 1e6:.0f} MB/s")
    )
