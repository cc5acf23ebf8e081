"""Load generator for ``http_service.py``: N requests at concurrency C,
throughput and latency percentiles, every answer checked.

Each of C workers sends ``POST /embed`` with one sentence (random words,
``--words`` long) after another over its own keep-alive connection
(httpx), while a progress bar counts the answers. At the end it prints
requests per second and the latency percentiles, then checks the answers:
every embedding has the service's dimension and unit length, and
``--check`` sentences sent again one at a time (so each runs in a batch of
its own) get the embedding they got under load, to 1e-4. It exits
non-zero if any answer was wrong or failed.

    python examples/http_service.py --port 8080 &
    python examples/load.py --port 8080 -n 2000 -c 64

    python examples/load.py --spawn -n 2000 -c 64   # starts the service too

Loopback only: the target host must be 127.0.0.1, ::1 or localhost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
TEXT = (
    "the quick brown fox jumps over a lazy dog while asyncrt batches many "
    "small requests into few runs of one encoder on two cores every second"
)
WORDS = TEXT.split()


def sentence(rng: random.Random, words: int) -> str:
    """A random sentence of about ``words`` words."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words)))


@dataclass
class Outcome:
    """What the load produced."""

    latencies: list[float] = field(default_factory=list)
    answers: dict[str, np.ndarray] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    dim: int = 0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``nan`` if empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def embed(client: httpx.AsyncClient, text: str) -> tuple[int, Any]:
    response = await client.post("/embed", json={"sentences": [text]})
    try:
        return response.status_code, response.json()
    except json.JSONDecodeError:
        return response.status_code, {"error": response.text[:200]}


async def run_load(
    base_url: str,
    requests: int,
    concurrency: int,
    *,
    words: int = 8,
    seed: int = 0,
    progress: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Outcome:
    """Send ``requests`` sentences from ``concurrency`` workers.

    :param transport: an httpx transport (tests pass an in-process
        ``ASGITransport``); default: TCP to ``base_url``.
    """
    rng = random.Random(seed)
    texts = [sentence(rng, words) for _ in range(requests)]
    todo = list(reversed(texts))
    outcome = Outcome()
    limits = httpx.Limits(max_connections=concurrency)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        console=Console(stderr=True),
        disable=not progress,
        transient=True,
    )
    task = bar.add_task("requests", total=requests, rate="")

    async def worker(client: httpx.AsyncClient) -> None:
        while todo:
            text = todo.pop()
            start = time.perf_counter()
            try:
                status, answer = await embed(client, text)
            except httpx.HTTPError as exc:
                outcome.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            outcome.latencies.append(time.perf_counter() - start)
            if status != 200:
                outcome.errors.append(f"HTTP {status}: {answer.get('error')}")
            else:
                outcome.answers[text] = np.asarray(answer["embeddings"][0], np.float32)
                outcome.dim = int(answer["dim"])
            done = len(outcome.latencies)
            rate = done / (time.perf_counter() - began)
            bar.update(task, completed=done, rate=f"{rate:.0f} req/s")

    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=60.0, transport=transport
    ) as client:
        with bar:
            began = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(worker, client)
            outcome.wall = time.perf_counter() - began
    return outcome


async def check_answers(
    base_url: str,
    outcome: Outcome,
    count: int,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[str]:
    """Problems with the answers: a wrong dimension or norm, or (for
    ``count`` sentences sent again one at a time) a different embedding."""
    problems = []
    for text, vector in outcome.answers.items():
        if vector.shape != (outcome.dim,) or abs(np.linalg.norm(vector) - 1) > 1e-3:
            problems.append(f"not a unit vector of {outcome.dim}: {text!r}")
    async with httpx.AsyncClient(
        base_url=base_url, timeout=60.0, transport=transport
    ) as client:
        for text in list(outcome.answers)[:count]:
            status, answer = await embed(client, text)
            alone = np.asarray(answer["embeddings"][0], np.float32)
            if status != 200 or not np.allclose(
                alone, outcome.answers[text], rtol=1e-4, atol=1e-5
            ):
                problems.append(f"{text!r}: batched and alone differ")
    return problems


def report(outcome: Outcome, concurrency: int, console: Console) -> None:
    ms = [x * 1e3 for x in outcome.latencies]
    table = Table(title=f"{len(ms)} requests, concurrency {concurrency}")
    for column in ("req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{len(ms) / outcome.wall:.1f}" if outcome.wall else "-",
        f"{percentile(ms, 50):.1f}",
        f"{percentile(ms, 90):.1f}",
        f"{percentile(ms, 99):.1f}",
        f"{max(ms, default=float('nan')):.1f}",
        str(len(outcome.errors)),
    )
    console.print(table)
    for error in outcome.errors[:5]:
        console.print("  ", error)


def spawn_service(extra: list[str]) -> tuple[subprocess.Popen[str], int]:
    """Start http_service.py on a free loopback port; return it and the port."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "http_service.py")
    proc = subprocess.Popen(
        [sys.executable, script, "--port", "0", *extra],
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
    ap.add_argument("-c", "--concurrency", type=int, default=64)
    ap.add_argument("--words", type=int, default=8, help="words per sentence")
    ap.add_argument("--check", type=int, default=20, help="answers re-checked")
    ap.add_argument("--spawn", action="store_true", help="start the service too")
    ap.add_argument(
        "--service-args", default="", help="arguments for the spawned service"
    )
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    if args.host not in LOOPBACK:
        ap.error("this load generator only targets loopback addresses")
    console = Console()
    proc = None
    port = args.port
    if args.spawn:
        proc, port = spawn_service(args.service_args.split())
    host = f"[{args.host}]" if ":" in args.host else args.host
    base_url = f"http://{host}:{port}"
    try:
        outcome = anyio.run(
            lambda: run_load(
                base_url,
                args.requests,
                args.concurrency,
                words=args.words,
                progress=not args.no_progress,
            )
        )
        report(outcome, args.concurrency, console)
        problems = anyio.run(lambda: check_answers(base_url, outcome, args.check))
        for problem in problems[:5]:
            console.print("  ", problem)
        console.print(
            f"{len(outcome.answers)} answers checked, {args.check} against a run "
            f"alone: {len(problems)} problems"
        )
    finally:
        if proc is not None:
            proc.terminate()  # SIGTERM: the service shuts down gracefully
            proc.wait(timeout=60)
            assert proc.stdout is not None
            print(f"service: {proc.stdout.read().strip()} (exit {proc.returncode})")
    bad = len(outcome.errors) + len(problems) + (args.requests - len(outcome.latencies))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
