"""How many cores other processes keep busy: the share of the machine a
process's kernel pools should leave alone.

A BLAS pool of ``T`` threads splits each call ``T`` ways and waits for
every part: on cores that other processes keep busy, a part whose thread
is not running holds up the whole call, and the pool's helpers spin
meanwhile, taking more time from the threads they wait for. On the 2-core
VM with two CPU-bound neighbours MobileNetV3 took 252 ms a run with two
BLAS threads against 3.3 ms with one (ONNX Runtime: 6.6 ms); ResNet-18
136 against 33 ms. So the shared (``"auto"``) pools take no more threads
than there are cores left free (:mod:`asyncrt.runtime._threads`).

The estimate is CPU time, not a queue length: over a window of at least
:data:`WINDOW_SECONDS`, the busy time of the cores this process may run on
(``/proc/stat``'s line for each, every state but idle and iowait; steal
counts, as time the hypervisor gave away) less this process's own
(``os.times``), per second of wall time. Read at most once per window,
by the thread that starts or ends a run (and when a lease is taken, so
that the first window ends by the first run, an executor's binding and
compiling between them): two short reads, no waiting. 0 until the first
window has passed (the load average would answer at once, but it trails
by a minute and counts this process's own recent runs). Where
``/proc/stat`` is not there (not Linux), the estimate stays 0 and nothing
changes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ("WINDOW_SECONDS", "BusyNeighbours", "machine_busy_seconds")

#: The shortest window an estimate spans (the kernel counts CPU time in
#: ticks of 1-10 ms).
WINDOW_SECONDS = 0.25

# /proc/stat's cpu line: user nice system idle iowait irq softirq steal ...
_IDLE_FIELDS = (3, 4)


def machine_busy_seconds(
    stat_path: str = "/proc/stat", cores: set[int] | None = None
) -> float | None:
    """CPU seconds the cores this process may run on (``cores``, by default
    its affinity) have spent busy since boot, every process's time (this
    one's too), or ``None`` where that cannot be read. Cores outside the
    affinity (a container's cpuset, ``taskset``) are not counted: what runs
    there takes nothing from this process."""
    try:
        chosen = os.sched_getaffinity(0) if cores is None else cores
        mine = {f"cpu{core}".encode() for core in chosen}
        with open(stat_path, "rb") as stat:
            lines = [line.split() for line in stat if line.startswith(b"cpu")]
    except (OSError, AttributeError):  # (no sched_getaffinity: not Linux)
        return None
    ticks = 0
    found = False
    for fields in lines:
        if fields[0] not in mine:
            continue
        try:
            values = [int(value) for value in fields[1:9]]
        except ValueError:
            return None
        ticks += sum(t for i, t in enumerate(values) if i not in _IDLE_FIELDS)
        found = True
    if not found:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


class BusyNeighbours:
    """The cores other processes kept busy over the latest window.

    :param machine: the machine's busy CPU seconds (``None``: unknown).
    :param own: this process's CPU seconds.
    :param clock: wall time, in seconds.
    """

    def __init__(
        self,
        machine: Callable[[], float | None] = machine_busy_seconds,
        own: Callable[[], float] = _own_seconds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._machine = machine
        self._own = own
        self._clock = clock
        self._since: tuple[float, float, float] | None = None
        #: The latest estimate, in cores (0 until a window has passed).
        self.cores = 0.0

    def update(self) -> float:
        """:attr:`cores`, measured again if a window has passed since the
        last measurement."""
        now = self._clock()
        since = self._since
        if since is not None and now - since[0] < WINDOW_SECONDS:
            return self.cores
        machine = self._machine()
        if machine is None:
            return self.cores
        own = self._own()
        if since is not None:
            wall = now - since[0]
            others = (machine - since[1]) - (own - since[2])
            self.cores = max(0.0, others / wall)
        self._since = (now, machine, own)
        return self.cores
