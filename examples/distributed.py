"""One graph across the host and the workers of a Dask cluster.

Starts a local Dask cluster of two worker processes (or connects to
``--scheduler``, with TLS from ``--tls-ca/--tls-cert/--tls-key``), makes its
workers the devices ``remote:0`` and ``remote:1``, and runs a branchy graph
— independent branches of matrix products and activations, joined at the
end — across ``cpu:0``, ``remote:0`` and ``remote:1``. The branches are
pinned round-robin to the three devices; with ``--policy auto`` the
scheduler places them instead, from the links measured when connecting
(on a slow network it may rightly keep everything on the host).

It prints the devices with their measured figures and the plan (which
stream of which device runs what, the copies between workers), runs the
graph a few times, concurrently too, and checks every output against numpy.

    python examples/distributed.py [--scheduler tls://host:8786 --tls-ca ca.pem
        --tls-cert cert.pem --tls-key key.pem] [--policy auto] [--backend trio]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from asyncrt import graph_executor
from asyncrt.graph import Graph, GraphBuilder
from devices import remote

BATCH, WIDTH, BRANCHES = 128, 256, 3
SPEC: dict[str, Any] = {"shape": (BATCH, WIDTH), "dtype": "float32"}


def branchy_graph(pins: list[str] | None) -> Graph:
    """x -> BRANCHES x (matmul, tanh, matmul, relu) -> sum, branch i pinned
    to ``pins[i]`` (or placed by the scheduler when ``pins`` is None)."""
    b = GraphBuilder()
    x = b.input("x", **SPEC)
    ends = []
    for i in range(BRANCHES):
        where = {"device": pins[i]} if pins else {}
        w1 = b.param(f"w{i}a", shape=(WIDTH, WIDTH), dtype="float32")
        w2 = b.param(f"w{i}b", shape=(WIDTH, WIDTH), dtype="float32")
        h = b.op("matmul", x, w1, name=f"mm{i}a", **SPEC, **where)
        h = b.op("tanh", h, name=f"tanh{i}", **SPEC, **where)
        h = b.op("matmul", h, w2, name=f"mm{i}b", **SPEC, **where)
        ends.append(b.op("relu", h, name=f"relu{i}", **SPEC, **where))
    b.output(b.op("sum", *ends, name="join", device="cpu:0", **SPEC))
    return b.build()


def reference(x: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
    total = np.zeros((BATCH, WIDTH), dtype=np.float32)
    for i in range(BRANCHES):
        h = np.tanh(x @ params[f"w{i}a"]) @ params[f"w{i}b"]
        total += np.maximum(h, 0)
    return total


async def run(conn: remote.Connection, policy: str | None) -> None:
    print("remote devices (measured when connecting):")
    print("  " + conn.describe().replace("\n", "\n  "))
    rng = np.random.default_rng(0)
    params = {
        f"w{i}{s}": (rng.standard_normal((WIDTH, WIDTH)) / WIDTH**0.5).astype(
            np.float32
        )
        for i in range(BRANCHES)
        for s in "ab"
    }
    targets = ["cpu:0", *map(str, conn.devices)]
    pins = None if policy else [targets[i % len(targets)] for i in range(BRANCHES)]
    graph = branchy_graph(pins)
    # Parameters given here are constants: copied once to the devices that
    # read them, not at every run.
    with graph_executor.create(
        graph, None, targets, params=params, policy=policy or "auto"
    ) as ex:
        print(ex.plan)
        worst = 0.0
        for round_ in range(3):
            x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
            start = time.perf_counter()
            out = await ex.run(x=x)
            elapsed = time.perf_counter() - start
            assert out is not None
            error = float(np.abs(out[0].numpy() - reference(x, params)).max())
            worst = max(worst, error)
            print(f"run {round_}: {elapsed * 1e3:.1f} ms, max |error| {error:.2e}")
        xs = [rng.standard_normal((BATCH, WIDTH)).astype(np.float32) for _ in "abcd"]
        results: dict[int, np.ndarray] = {}

        async def one(i: int) -> None:
            got = await ex.run(x=xs[i])
            assert got is not None
            results[i] = got[0].numpy()

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(len(xs)):
                tg.start_soon(one, i)
        elapsed = time.perf_counter() - start
        for i, got in results.items():
            worst = max(worst, float(np.abs(got - reference(xs[i], params)).max()))
        print(f"{len(xs)} concurrent runs: {elapsed * 1e3:.1f} ms")
    print(f"max |error| over all runs: {worst:.2e}")
    if worst > 1e-3:
        raise SystemExit("outputs differ from numpy")


def unshadow() -> None:
    """Run as a script, this file's name hides Dask's ``distributed``
    package: take its folder off the import path (before anything imports
    ``distributed``; the worker processes inherit the path)."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]


def main() -> None:
    unshadow()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheduler", help="a running scheduler's address")
    parser.add_argument("--tls-ca", help="CA certificate (PEM) for TLS")
    parser.add_argument("--tls-cert", help="client certificate (PEM)")
    parser.add_argument("--tls-key", help="client private key (PEM)")
    parser.add_argument("--policy", choices=["auto", "heft", "peft", "fastest"])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()

    cluster: Any = None
    security: Any = None
    address = args.scheduler
    if args.tls_ca:
        from distributed.security import Security

        security = Security(
            tls_ca_file=args.tls_ca,
            tls_client_cert=args.tls_cert,
            tls_client_key=args.tls_key,
            require_encryption=True,
        )
    if address is None:
        from distributed import LocalCluster

        cluster = LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",  # any free port: 8787 may be taken
        )
        address = cluster.scheduler_address
    try:
        with remote.connect(address, security=security) as conn:
            anyio.run(run, conn, args.policy, backend=args.backend)
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main()
