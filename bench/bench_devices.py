"""Microbenchmarks of the DeviceAPI: launches, events, sim copy bandwidth.

Run ``python bench/bench_devices.py [--json out.json]``. It prints three
tables (a few seconds; well under a minute):

1. **floors** — what plain Python costs on this machine right now: calling
   an empty function, and a ``queue.SimpleQueue`` put/get (same thread, and
   producer thread -> consumer thread, which is what a stream launch is).
   Read every other figure against these: on a noisy machine they all move
   together.
2. **streams and events** — launch overhead of an empty kernel on a cpu and
   a sim stream, one ``launch`` at a time and by ``launch_many`` batches,
   measured end to end (launch N, then synchronize); a record + wait_event
   pair between two cpu streams; one ``record`` + ``await event.wait()``
   round trip from asyncio (and trio).
3. **sim copy bandwidth** — host->sim, sim->host and sim:0->sim:1 copies of
   64 KiB .. 64 MiB against the device's model (``SimConfig.copy_seconds``).
   The sim sleeps away whatever the host copy left of the modelled time, so
   a ratio near 1.0 means the model holds; below 1.0 the host's own memcpy
   is slower than the modelled link.

Each figure is the best and the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import anyio
import numpy as np

import devices
from devices import Device, Stream
from devices.sim import SimDeviceAPI

CPU, SIM0, SIM1 = Device("cpu", 0), Device("sim", 0), Device("sim", 1)
KIB, MIB = 1 << 10, 1 << 20
COPY_SIZES = (64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB)


@dataclass(frozen=True)
class Timing:
    """One figure: microseconds per operation."""

    group: str
    name: str
    ops: int
    best_us: float
    median_us: float


@dataclass(frozen=True)
class Bandwidth:
    """One copy size in one direction."""

    direction: str
    nbytes: int
    best_gbs: float
    median_gbs: float
    model_gbs: float

    @property
    def ratio(self) -> float:
        return self.median_gbs / self.model_gbs


def empty_kernel() -> None:
    """The kernel every launch benchmark runs."""


def repeat(run: Callable[[], float], repeats: int) -> tuple[float, float]:
    """Run ``run`` (returns seconds) ``repeats`` times: (best, median)."""
    seconds = [run() for _ in range(repeats)]
    return min(seconds), statistics.median(seconds)


def per_op(
    group: str, name: str, ops: int, run: Callable[[], float], repeats: int
) -> Timing:
    best, median = repeat(run, repeats)
    return Timing(group, name, ops, best / ops * 1e6, median / ops * 1e6)


# -- floors ----------------------------------------------------------------------


def floor_call(n: int) -> float:
    fn = empty_kernel
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - start


def floor_queue_same_thread(n: int) -> float:
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    put, get = q.put, q.get
    start = time.perf_counter()
    for _ in range(n):
        put(None)
        get()
    return time.perf_counter() - start


def floor_queue_cross_thread(n: int) -> float:
    """Producer puts ``n`` items, a consumer thread gets them: a stream's
    launch path without the stream."""
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    done = threading.Event()

    def consume() -> None:
        get = q.get
        for _ in range(n):
            get()
        done.set()

    thread = threading.Thread(target=consume)
    thread.start()
    start = time.perf_counter()
    put = q.put
    for _ in range(n):
        put(None)
    done.wait()
    elapsed = time.perf_counter() - start
    thread.join()
    return elapsed


# -- streams and events ----------------------------------------------------------


def launches(stream: Stream, n: int) -> float:
    stream.synchronize()
    launch, fn = stream.launch, empty_kernel
    start = time.perf_counter()
    for _ in range(n):
        launch(fn)
    stream.synchronize()
    return time.perf_counter() - start


def batched_launches(stream: Stream, n: int, batch: int) -> float:
    calls: list[devices.Call] = [(empty_kernel, (), 0.0)] * batch
    stream.synchronize()
    start = time.perf_counter()
    for _ in range(n // batch):
        stream.launch_many(calls)
    stream.synchronize()
    return time.perf_counter() - start


def record_wait_pairs(a: Stream, b: Stream, n: int) -> float:
    """A ping-pong chain: each stream waits on the other's latest record."""
    a.synchronize()
    b.synchronize()
    start = time.perf_counter()
    for _ in range(n // 2):
        b.wait_event(a.record())
        a.wait_event(b.record())
    a.synchronize()
    b.synchronize()
    return time.perf_counter() - start


def await_events(stream: Stream, n: int, backend: str) -> float:
    async def main() -> float:
        start = time.perf_counter()
        for _ in range(n):
            await stream.record().wait()
        return time.perf_counter() - start

    return anyio.run(main, backend=backend)


# -- sim copies --------------------------------------------------------------------


def copy_bandwidth(direction: str, nbytes: int, repeats: int) -> Bandwidth:
    cpu = devices.get_api("cpu")
    sim = devices.get_api("sim")
    assert isinstance(sim, SimDeviceAPI)
    if direction == "h2d":
        src, dst = cpu.alloc(CPU, nbytes), sim.alloc(SIM0, nbytes)
        model = sim.config(SIM0).copy_seconds(nbytes)
    elif direction == "d2h":
        src, dst = sim.alloc(SIM0, nbytes), cpu.alloc(CPU, nbytes)
        model = sim.config(SIM0).copy_seconds(nbytes)
    else:
        src, dst = sim.alloc(SIM0, nbytes), sim.alloc(SIM1, nbytes)
        model = max(
            sim.config(SIM0).copy_seconds(nbytes), sim.config(SIM1).copy_seconds(nbytes)
        )
    try:
        api = devices.get_api(dst.device.kind)
        api.copy_data_from_to(src, 0, dst, 0, nbytes)  # warm the pages

        def run() -> float:
            start = time.perf_counter()
            api.copy_data_from_to(src, 0, dst, 0, nbytes)
            return time.perf_counter() - start

        best, median = repeat(run, repeats)
    finally:
        for buffer in (src, dst):
            devices.get_api(buffer.device.kind).free(buffer)
    return Bandwidth(
        direction,
        nbytes,
        nbytes / best / 1e9,
        nbytes / median / 1e9,
        nbytes / model / 1e9,
    )


# -- driver ------------------------------------------------------------------------


def run_all(n: int, repeats: int) -> tuple[list[Timing], list[Bandwidth]]:
    timings: list[Timing] = []

    def add(group: str, name: str, ops: int, run: Callable[[], float]) -> None:
        timing = per_op(group, name, ops, run, repeats)
        timings.append(timing)
        print(f"  {name:<44} {timing.median_us:9.3f} us", file=sys.stderr)

    print("measuring ...", file=sys.stderr)
    add("floor", "empty function call", n, lambda: floor_call(n))
    add(
        "floor",
        "SimpleQueue put+get, one thread",
        n,
        lambda: floor_queue_same_thread(n),
    )
    add(
        "floor",
        "SimpleQueue put -> get on another thread",
        n,
        lambda: floor_queue_cross_thread(n),
    )

    cpu, sim = devices.get_api("cpu"), devices.get_api("sim")
    with cpu.stream(CPU) as c1, cpu.stream(CPU) as c2, sim.stream(SIM0) as s0:
        for label, stream in (("cpu", c1), ("sim", s0)):
            add("launch", f"{label}: launch", n, partial(launches, stream, n))
            for batch in (100, n):
                add(
                    "launch",
                    f"{label}: launch_many, batches of {batch}",
                    n,
                    partial(batched_launches, stream, n, batch),
                )
        pairs = max(2, n // 4)
        add(
            "event",
            "cpu<->cpu: record + wait_event",
            pairs // 2 * 2,
            lambda: record_wait_pairs(c1, c2, pairs),
        )
        awaits = max(1, n // 10)
        for backend in ("asyncio", "trio"):
            add(
                "event",
                f"cpu: record + await ev.wait() ({backend})",
                awaits,
                partial(await_events, c1, awaits, backend),
            )

    bandwidths: list[Bandwidth] = []
    for direction in ("h2d", "d2h", "sim0->sim1"):
        for nbytes in COPY_SIZES:
            reps = max(repeats, min(50, (64 * MIB) // nbytes))
            bandwidths.append(copy_bandwidth(direction, nbytes, reps))
    return timings, bandwidths


def size_text(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def print_tables(timings: list[Timing], bandwidths: list[Bandwidth]) -> None:
    print(f"{'group':<7} {'what':<44} {'best us/op':>11} {'median us/op':>13}")
    for t in timings:
        print(f"{t.group:<7} {t.name:<44} {t.best_us:11.3f} {t.median_us:13.3f}")
    sim = devices.get_api("sim")
    assert isinstance(sim, SimDeviceAPI)
    config = sim.config(SIM0)
    print()
    print(
        f"sim copies (model: latency {config.latency * 1e6:.0f} us, "
        f"bandwidth {config.bandwidth / 1e9:.1f} GB/s)"
    )
    print(
        f"{'direction':<11} {'size':>7} {'best GB/s':>10} {'median GB/s':>12} "
        f"{'model GB/s':>11} {'ratio':>6}"
    )
    for b in bandwidths:
        print(
            f"{b.direction:<11} {size_text(b.nbytes):>7} {b.best_gbs:10.2f} "
            f"{b.median_gbs:12.2f} {b.model_gbs:11.2f} {b.ratio:6.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument(
        "-n",
        "--launches",
        type=int,
        default=20000,
        help="launches per run (default 20000)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs per figure (default 5)"
    )
    args = parser.parse_args(argv)
    if args.launches < 100 or args.repeats < 1:
        parser.error("need --launches >= 100 and --repeats >= 1")

    devices.sim.configure(2)  # the default model
    started = time.perf_counter()
    timings, bandwidths = run_all(args.launches, args.repeats)
    elapsed = time.perf_counter() - started
    machine = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
    }
    print(
        f"\nasyncrt device bench: python {machine['python']}, "
        f"{machine['cpu_count']} cpus, N={args.launches}, "
        f"{args.repeats} repeats, {elapsed:.1f} s"
    )
    print_tables(timings, bandwidths)
    if args.json:
        report = {
            "machine": machine,
            "launches": args.launches,
            "repeats": args.repeats,
            "seconds": elapsed,
            "timings": [asdict(t) for t in timings],
            "bandwidths": [asdict(b) | {"ratio": b.ratio} for b in bandwidths],
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
