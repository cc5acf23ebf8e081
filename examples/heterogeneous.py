"""One graph across the cpu and two simulated accelerators (and a GPU if
there is one), from async code.

A branchy graph — four independent branches of matrix products and
activations, joined at the end — is planned across every device present:
the placement policy predicts where each node finishes first, copies are
inserted where a tensor crosses devices, each device runs its work on its
own streams, and events order the streams. The example prints the plan,
runs it, checks the outputs against numpy, and compares the measured time
with the plan's prediction and with everything on one device.

    python examples/heterogeneous.py [--policy auto|heft|peft|fastest] [--streams 2]
"""

from __future__ import annotations

import argparse
import time

import anyio
import numpy as np

import asyncrt
import devices
from asyncrt import graph_executor
from asyncrt.graph import Graph, GraphBuilder
from devices.sim import SimConfig

BATCH, WIDTH, BRANCHES = 64, 256, 4


def branchy_graph() -> Graph:
    """x -> BRANCHES x (matmul, tanh, matmul, relu) -> sum."""
    b = GraphBuilder()
    x = b.input("x", shape=(BATCH, WIDTH), dtype="float32")
    ends = []
    for i in range(BRANCHES):
        w1 = b.param(f"w{i}a", shape=(WIDTH, WIDTH), dtype="float32")
        w2 = b.param(f"w{i}b", shape=(WIDTH, WIDTH), dtype="float32")
        h = b.op("matmul", x, w1, shape=(BATCH, WIDTH), dtype="float32", name=f"mm{i}a")
        h = b.op("tanh", h, shape=(BATCH, WIDTH), dtype="float32", name=f"tanh{i}")
        h = b.op("matmul", h, w2, shape=(BATCH, WIDTH), dtype="float32", name=f"mm{i}b")
        ends.append(
            b.op("relu", h, shape=(BATCH, WIDTH), dtype="float32", name=f"relu{i}")
        )
    b.output(b.op("sum", *ends, shape=(BATCH, WIDTH), dtype="float32", name="join"))
    return b.build()


def reference(x: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
    total = np.zeros((BATCH, WIDTH), dtype=np.float32)
    for i in range(BRANCHES):
        h = np.tanh(x @ params[f"w{i}a"]) @ params[f"w{i}b"]
        total += np.maximum(h, 0)
    return total


async def main(policy: str, streams: int) -> None:
    # Two accelerators, each slower than this host's cores but working in
    # parallel with it, behind a 16 GB/s link. (A simulated device really
    # computes on the host, so it is only faithful when its modelled time
    # exceeds the real work: keep its flops below the host's.)
    devices.sim.configure(2, SimConfig(flops=20e9, bandwidth=16e9, latency=10e-6))
    present = asyncrt.list_devices()
    print("devices:", ", ".join(map(str, present)))
    rng = np.random.default_rng(0)
    params = {
        f"w{i}{s}": (rng.standard_normal((WIDTH, WIDTH)) / WIDTH**0.5).astype(
            np.float32
        )
        for i in range(BRANCHES)
        for s in "ab"
    }
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    graph = branchy_graph()
    with graph_executor.create(
        graph, None, present, policy=policy, max_streams=streams
    ) as ex:
        ex.load_params(params)
        print(ex.plan)
        outputs = await ex.run(x=x)  # the first run warms the contexts
        assert outputs is not None
        start = time.perf_counter()
        for _ in range(10):
            outputs = await ex.run(x=x)
        measured = (time.perf_counter() - start) / 10
        assert outputs is not None
        error = float(np.max(np.abs(outputs[0].numpy() - reference(x, params))))
        print(f"max |error| vs numpy: {error:.2e}")
        print(
            f"measured {1e3 * measured:.2f} ms per run; "
            f"predicted {1e3 * ex.plan.makespan:.2f} ms"
        )
        if error > 1e-3:
            raise SystemExit("wrong result")
    with graph_executor.create(graph, None, "cpu") as single:
        single.load_params(params)
        await single.run(x=x)
        start = time.perf_counter()
        for _ in range(10):
            await single.run(x=x)
        alone = (time.perf_counter() - start) / 10
        print(f"everything on cpu:0: {1e3 * alone:.2f} ms per run")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="auto")
    parser.add_argument("--streams", type=int, default=2)
    args = parser.parse_args()
    anyio.run(main, args.policy, args.streams)
