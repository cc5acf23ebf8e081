"""Load generator for ``http_service.py``: N requests at concurrency C.

Each of C workers keeps one HTTP/1.1 keep-alive connection (asyncio streams,
standard library only) and sends ``POST /infer`` with random inputs; every
answer is checked against the numpy reference. Prints throughput and the
latency p50/p99, and exits non-zero if any answer was wrong or failed.

    python examples/http_service.py --port 8080 &
    python examples/load.py --port 8080 -n 2000 -c 50

    python examples/load.py --spawn -n 2000 -c 50   # starts the service too

Loopback only: the target host must be 127.0.0.1, ::1 or localhost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from http_service import IN, reference

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


async def request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    path: str,
    body: bytes = b"",
) -> tuple[int, bytes]:
    """Send one request on a keep-alive connection; return status and body."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    status = int(status_line.split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def worker(
    host: str,
    port: int,
    jobs: asyncio.Queue[int],
    latencies: list[float],
    errors: list[str],
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            try:
                jobs.get_nowait()
            except asyncio.QueueEmpty:
                return
            x = rng.standard_normal(IN).astype(np.float32)
            body = json.dumps({"x": x.tolist()}).encode()
            start = time.perf_counter()
            status, answer = await request(reader, writer, "POST", "/infer", body)
            latencies.append(time.perf_counter() - start)
            if status != 200:
                errors.append(f"HTTP {status}: {answer[:200]!r}")
                continue
            got = np.asarray(json.loads(answer)["y"], dtype=np.float32)
            if not np.allclose(got, reference(x), rtol=1e-4, atol=1e-6):
                errors.append(f"wrong answer for x={x.tolist()}: {got.tolist()}")
    finally:
        writer.close()
        await writer.wait_closed()


def percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def run_load(host: str, port: int, requests: int, concurrency: int) -> int:
    """Run the load; print the figures; return the number of bad answers."""
    jobs: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        jobs.put_nowait(i)
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    await asyncio.gather(
        *[
            worker(host, port, jobs, latencies, errors, seed)
            for seed in range(concurrency)
        ]
    )
    wall = time.perf_counter() - start
    print(
        f"{len(latencies)} requests, concurrency {concurrency}: "
        f"{len(latencies) / wall:.0f} req/s, latency p50 "
        f"{percentile(latencies, 50) * 1e3:.2f} ms, p99 "
        f"{percentile(latencies, 99) * 1e3:.2f} ms, "
        f"{len(errors)} errors"
    )
    for error in errors[:5]:
        print("  ", error)
    return len(errors) + (requests - len(latencies))


def spawn_service() -> tuple[subprocess.Popen[str], int]:
    """Start http_service.py on a free loopback port; return it and the port."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "http_service.py")
    proc = subprocess.Popen(
        [sys.executable, script, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on"):
        proc.kill()
        raise RuntimeError(f"the service did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("-n", "--requests", type=int, default=1000)
    ap.add_argument("-c", "--concurrency", type=int, default=50)
    ap.add_argument("--spawn", action="store_true", help="start the service too")
    args = ap.parse_args()
    if args.host not in LOOPBACK:
        ap.error("this load generator only targets loopback addresses")
    proc = None
    port = args.port
    if args.spawn:
        proc, port = spawn_service()
    try:
        bad = asyncio.run(run_load(args.host, port, args.requests, args.concurrency))
    finally:
        if proc is not None:
            proc.terminate()  # SIGTERM: the service shuts down gracefully
            proc.wait(timeout=30)
            assert proc.stdout is not None
            print(f"service: {proc.stdout.read().strip()} (exit {proc.returncode})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
