"""Remote devices on a local Dask cluster: launch overhead and a speedup.

Starts a ``LocalCluster`` of two worker processes (one thread each, on
loopback), connects (``devices.remote.connect``) and measures, in one run:

1. **Per-launch overhead** against raw Dask, both running the same empty
   function (``remote_kernels.nothing``) on the same worker:

   * ``dask chain``: N ``client.submit`` calls, each taking the previous
     future as argument (what a stream must do to keep its order), then
     waiting for the last;
   * ``asyncrt launch``: N ``stream.launch`` of that function on a
     ``remote:0`` stream (one task each), then ``synchronize()``;
   * ``asyncrt launch_many``: the same N calls as one batch (one task);
   * ``dask round trip`` / ``asyncrt round trip``: one call and wait for it,
     N times (``submit(...).result()`` / ``launch`` + ``synchronize``).

2. **A branchy graph** where two workers beat one: BRANCHES independent
   chains of DEPTH kernels joined on the host, run with every branch on
   ``remote:0`` and with the branches alternating between ``remote:0`` and
   ``remote:1``. Two kernels: ``nap`` (sleeps 50 ms: work off the GIL that
   needs no core, like I/O or an accelerator) and ``matmul`` (numpy BLAS:
   real work, so the speedup depends on idle cores).

Figures are medians (and best) of ``--repeats`` rounds; ratios compare
figures of the same run only.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_remote.py \
        [--json bench/results/remote.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# This script's folder is on the path (and the workers inherit it): they
# import the kernels by this name.
import remote_kernels

import devices
from asyncrt import graph_executor
from asyncrt.graph import Graph, GraphBuilder
from devices import Device, remote
from devices.remote import RemoteFunction

R0, R1 = Device("remote", 0), Device("remote", 1)
NOTHING = RemoteFunction(remote_kernels.nothing, (), "nothing")


def timed(action: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(median, best) seconds of ``action`` over ``repeats`` rounds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def launch_figures(conn: remote.Connection, n: int, repeats: int) -> dict[str, Any]:
    client, worker = conn.client, conn.workers[R0]
    api = devices.get_api("remote")
    keys = iter(range(10**9))

    def submit(*args: Any) -> Any:
        return client.submit(
            remote_kernels.nothing,
            *args,
            key=f"raw-{next(keys)}",
            workers=[worker],
            allow_other_workers=False,
            pure=False,
        )

    def dask_chain() -> None:
        future = None
        for _ in range(n):
            future = submit(future)
        future.result()

    def dask_round_trip() -> None:
        for _ in range(n // 4):
            submit().result()

    with api.stream(R0) as stream:

        def asyncrt_launch() -> None:
            for _ in range(n):
                stream.launch(NOTHING, ())
            stream.synchronize()

        def asyncrt_launch_many() -> None:
            stream.launch_many([(NOTHING, (), 0.0)] * n)
            stream.synchronize()

        def asyncrt_round_trip() -> None:
            for _ in range(n // 4):
                stream.launch(NOTHING, ())
                stream.synchronize()

        variants = {
            "dask chain": (dask_chain, n),
            "asyncrt launch": (asyncrt_launch, n),
            "asyncrt launch_many": (asyncrt_launch_many, n),
            "dask round trip": (dask_round_trip, n // 4),
            "asyncrt round trip": (asyncrt_round_trip, n // 4),
        }
        for action, _ in variants.values():  # warm up: imports, connections
            action()
        figures = {}
        for name, (action, count) in variants.items():
            median, best = timed(action, repeats)
            figures[name] = {
                "median_ms": 1e3 * median / count,
                "best_ms": 1e3 * best / count,
            }
    return figures


def branchy(
    kernel: str, devices_: list[str], branches: int, depth: int, n: int
) -> Graph:
    b = GraphBuilder()
    x = b.input("x", shape=(n, n), dtype="float32")
    spec: dict[str, Any] = {"shape": (n, n), "dtype": "float32"}
    ends = []
    for i in range(branches):
        h = x
        for d in range(depth):
            args = (h, x) if kernel == "matmul" else (h,)
            h = b.op(
                kernel,
                *args,
                name=f"{kernel}{i}_{d}",
                device=devices_[i % len(devices_)],
                **spec,
            )
        ends.append(h)
    b.output(b.op("sum", *ends, name="join", device="cpu:0", **spec))
    return b.build()


def speedup_figures(
    kernel: str, branches: int, depth: int, n: int, repeats: int
) -> dict[str, Any]:
    x = (np.random.default_rng(0).standard_normal((n, n)) / n).astype(np.float32)
    figures: dict[str, Any] = {}
    for label, where in (
        ("one worker", ["remote:0"]),
        ("two workers", ["remote:0", "remote:1"]),
    ):
        graph = branchy(kernel, where, branches, depth, n)
        used = ["cpu:0", *dict.fromkeys(where)]
        with graph_executor.create(graph, None, used, max_streams=branches) as ex:
            ex.run_sync(x=x)  # warm up
            median, best = timed(lambda: ex.run_sync(x=x), repeats)
            figures[label] = {"median_ms": 1e3 * median, "best_ms": 1e3 * best}
    figures["speedup"] = (
        figures["one worker"]["median_ms"] / figures["two workers"]["median_ms"]
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="launches per round")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--branches", type=int, default=4)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    from distributed import LocalCluster

    cluster = LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # any free port: 8787 may be taken
    )
    results: dict[str, Any] = {}
    try:
        with remote.connect(cluster.scheduler_address) as conn:
            print(conn.describe(), file=sys.stderr)
            results["launch"] = launch_figures(conn, args.n, args.repeats)
            results["nap"] = speedup_figures(
                "nap", args.branches, args.depth, 8, args.repeats
            )
            results["matmul"] = speedup_figures(
                "matmul", args.branches, args.depth, 512, args.repeats
            )
    finally:
        cluster.close()

    launch = results["launch"]
    print(f"per-launch overhead, ms (median / best of {args.repeats}, n={args.n}):")
    for name, figure in launch.items():
        print(f"  {name:22s} {figure['median_ms']:8.3f} / {figure['best_ms']:8.3f}")
    ratio = launch["asyncrt launch"]["median_ms"] / launch["dask chain"]["median_ms"]
    batch = (
        launch["dask chain"]["median_ms"] / launch["asyncrt launch_many"]["median_ms"]
    )
    trip = (
        launch["asyncrt round trip"]["median_ms"]
        / launch["dask round trip"]["median_ms"]
    )
    print(
        f"  asyncrt launch / dask chain: {ratio:.2f}x; round trip: {trip:.2f}x; "
        f"launch_many is {batch:.0f}x cheaper per call than a dask chain"
    )
    for kernel in ("nap", "matmul"):
        fig = results[kernel]
        print(
            f"{args.branches} branches x {args.depth} {kernel}: one worker "
            f"{fig['one worker']['median_ms']:.1f} ms, two workers "
            f"{fig['two workers']['median_ms']:.1f} ms: speedup {fig['speedup']:.2f}x"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
