"""A tour of asyncrt's devices: streams, events and copies from async code.

Runs a small pipeline across every device present (cpu, two simulated
accelerators, and a GPU when there is one):

    host data -> sim:0 (scale) -> sim:1 (add) -> cpu (sum) -> host

Each device works on its own stream; events order the streams device-side
(SyncStreamFromTo), and the coroutine only awaits the final event. A ticker
task runs alongside to show that the event loop never blocks.

    python examples/devices_tour.py [--backend asyncio|trio] [--size N]
"""

from __future__ import annotations

import argparse
import time

import anyio
import numpy as np

import asyncrt
import devices
from devices.sim import SimConfig


def scale(x: np.ndarray, out: np.ndarray) -> None:
    np.multiply(x, 2.0, out=out)


def add_one(x: np.ndarray, out: np.ndarray) -> None:
    np.add(x, 1.0, out=out)


def total(x: np.ndarray, out: np.ndarray) -> None:
    out[...] = x.sum(dtype=np.float64)


async def tour(size: int) -> None:
    # Two simulated accelerators: sim:1 computes 4x slower than sim:0, and
    # both sit behind a 2 GB/s link.
    devices.sim.configure(
        2, [SimConfig(flops=2e9, bandwidth=2e9), SimConfig(flops=0.5e9, bandwidth=2e9)]
    )
    print("devices present:")
    for dev in asyncrt.list_devices():
        attrs = devices.get_api(dev.kind).attributes(dev)
        name = attrs.get("device_name", "?")
        memory = attrs.get("total_global_memory")
        gib = f"{memory / 2**30:.1f} GiB" if memory else "?"
        print(f"  {dev!s:8} {name}  ({gib})")

    cpu, sim0, sim1 = asyncrt.cpu(), asyncrt.sim(0), asyncrt.sim(1)
    host = np.random.default_rng(0).standard_normal(size).astype(np.float32)

    s0 = devices.get_api("sim").create_stream(sim0)
    s1 = devices.get_api("sim").create_stream(sim1)
    sc = devices.get_api("cpu").create_stream(cpu)
    try:
        a = asyncrt.nd.empty((size,), "float32", sim0)
        b = asyncrt.nd.empty((size,), "float32", sim0)
        c = asyncrt.nd.empty((size,), "float32", sim1)
        d = asyncrt.nd.empty((size,), "float32", sim1)
        e = asyncrt.nd.empty((size,), "float32", cpu)
        result = asyncrt.nd.empty((), "float64", cpu)

        start = time.perf_counter()
        a.copyfrom(host, stream=s0)  # host -> sim:0 over the link
        s0.launch(scale, (a.backend_array(), b.backend_array()), work=size)
        b.copyto(c, stream=s0)  # sim:0 -> sim:1, device to device
        s1.wait_event(s0.record())  # SyncStreamFromTo(sim:0 -> sim:1)
        s1.launch(add_one, (c.backend_array(), d.backend_array()), work=size)
        d.copyto(e, stream=s1)  # sim:1 -> host
        sc.wait_event(s1.record())
        sc.launch(total, (e.backend_array(), result.backend_array()))
        done = sc.record()
        print(f"launched everything in {1e6 * (time.perf_counter() - start):.0f} us")

        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(0.001)
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await done.wait()
            tg.cancel_scope.cancel()
        elapsed = time.perf_counter() - start

        expected = float((host * 2.0 + 1.0).sum(dtype=np.float64))
        got = float(result.numpy())
        print(f"result {got:.4f} (expected {expected:.4f}) in {1e3 * elapsed:.1f} ms")
        print(f"the event loop ticked {ticks} times while the devices worked")
        if not np.isclose(got, expected, rtol=1e-5):
            raise SystemExit("wrong result")
    finally:
        for stream in (s0, s1, sc):
            stream.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--size", type=int, default=1 << 20)
    args = parser.parse_args()
    anyio.run(tour, args.size, backend=args.backend)


if __name__ == "__main__":
    main()
