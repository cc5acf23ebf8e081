"""Serving many callers: throughput, latency and event-loop lag of one
MiniLM-size encoder under concurrent batch-1 requests, asyncrt with and
without the batcher beside ONNX Runtime, in one run.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_serving.py \\
        --rounds 5 --json bench/results/serving.json

The model is the BERT-style sentence encoder of
``tests/asyncrt/frontend/symbolic_models.py`` at MiniLM-L6 size (6 layers,
width 384, 86 MB of weights) with symbolic batch and sequence, written to
an ``.onnx`` file once. ``--callers`` tasks on one asyncio loop each send
``--requests`` requests one after another (batch 1, sequence ``--seq``,
every request its own random sentence). Every mode runs in a fresh child
process (the model imported there, a warm-up pass of the same load first,
then the timed pass); the modes take turns round by round, so the machine's
drift falls on all of them alike. Modes:

* ``seq``: one caller at a time, the default executor (what one caller gets);
* ``conc``: the callers at once on the default executor (``"auto"`` kernel
  threads: shared among the runs in flight);
* ``conc-fixed``: the same with ``kernel_threads=<cores>``, every run's
  pools at every core whatever else runs: what ``"auto"`` gave before it
  shared the cores (its lease was ``cores // streams``, one stream here);
* ``conc-throughput``: ``kernel_threads="throughput"`` (one thread per
  pool for 4 contexts on 2 cores);
* ``batched``: the callers through :class:`asyncrt.Batcher`
  (``--max-delay-ms``, ``--max-batch``, preferred sizes the powers of two)
  on the default executor; every request's outputs are checked against its
  own unbatched run (``max_abs_err``); ``batched-throughput`` on the
  ``"throughput"`` executor;
* ``batched-proc``: the batcher on an executor of the model imported at
  the batch's shape (``--max-batch`` x ``--seq``) with ``processes=True``
  (``--proc-contexts`` worker processes, ``--worker-nice``): no kernel runs
  in the loop's process;
* ``ort-executor``: one ONNX Runtime session (its default threads) called
  through ``loop.run_in_executor`` by the callers at once (the loop's
  default thread pool), and ``ort-seq`` one caller at a time.

Per mode: requests per second (median over rounds, and each round's),
request latency p50/p99 (pooled), the lateness of a 1 ms ticker on the
same loop while serving (p99, pooled) beside the same ticker idle in the
same child before the load (``idle lag p99``), and for ``batched`` the
batcher's figures (mean batch rows, batch time p50, queue delay p99). The
summary gives the ratios the serving issue asks about and the latency
bound ``max_delay + 2 x batch time p50``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

MARK = "@@SERVING@@"
MODES = (
    "seq",
    "conc",
    "conc-fixed",
    "conc-throughput",
    "batched",
    "batched-throughput",
    "batched-proc",
    "ort-executor",
)
NAMES = ("input_ids", "attention_mask", "token_type_ids")
PERIOD = 0.001


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile of ``xs`` (``nan`` if empty)."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# -- the child: one mode, one process ------------------------------------------------


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(PERIOD)
        lags.append(time.perf_counter() - start - PERIOD)


async def idle_lags(seconds: float) -> list[float]:
    lags: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(ticker(stop, lags))
    await asyncio.sleep(seconds)
    stop.set()
    await task
    return lags[5:]


def sentences(count: int, seq: int, vocab: int) -> list[dict[str, Any]]:
    import numpy as np

    rng = np.random.default_rng(42)
    return [
        {
            "input_ids": rng.integers(0, vocab, (1, seq), dtype=np.int64),
            "attention_mask": np.ones((1, seq), np.int64),
            "token_type_ids": np.zeros((1, seq), np.int64),
        }
        for _ in range(count)
    ]


async def load(
    call: Any, requests: list[dict[str, Any]], callers: int, keep: bool
) -> dict[str, Any]:
    """``callers`` tasks taking requests in turn; latencies, wall time, the
    ticker's lags and (if ``keep``) every request's outputs."""
    queue = list(enumerate(requests))
    queue.reverse()
    latencies: list[float] = []
    outputs: dict[int, Any] = {}

    async def caller() -> None:
        while queue:
            index, feed = queue.pop()
            start = time.perf_counter()
            result = await call(feed)
            latencies.append(time.perf_counter() - start)
            if keep:
                outputs[index] = result

    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop, lags))
    await asyncio.sleep(0.01)
    lags.clear()
    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    wall = time.perf_counter() - start
    stop.set()
    await tick
    return {"latencies": latencies, "wall": wall, "lags": lags, "outputs": outputs}


async def child_main(a: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from tests.asyncrt.frontend.symbolic_models import BertConfig

    mode = a.child
    callers = 1 if mode in ("seq", "ort-seq") else a.callers
    total = a.callers * a.requests
    requests = sentences(total, a.seq, BertConfig().vocab)
    result: dict[str, Any] = {"mode": mode, "callers": callers}
    idle = await idle_lags(0.5)
    if mode.startswith("ort"):
        import onnxruntime as ort

        session = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
        loop = asyncio.get_running_loop()

        async def call(feed: dict[str, Any]) -> Any:
            return await loop.run_in_executor(None, session.run, None, feed)

        await load(call, requests[: a.callers], callers, False)  # warm-up
        timed = await load(call, requests, callers, False)
    else:
        from asyncrt import graph_executor
        from asyncrt.frontend import from_onnx

        graph, params = from_onnx(a.model)
        options: dict[str, Any] = {}
        if mode == "conc-fixed":
            options["kernel_threads"] = os.cpu_count() or 1
        elif mode in ("conc-throughput", "batched-throughput"):
            options["kernel_threads"] = "throughput"
        async with graph_executor.create(
            graph, None, "cpu", params=params, **options
        ) as ex:
            if mode.startswith("batched"):
                unbatched = [await ex.run(**feed) for feed in requests]
                if mode in ("batched", "batched-throughput"):
                    timed = await batched(a, ex, requests, callers, result)
                else:  # its batches in worker processes: a static import
                    shape = (a.max_batch, a.seq)
                    static, static_params = from_onnx(
                        a.model, dict.fromkeys(NAMES, shape)
                    )
                    async with graph_executor.create(
                        static,
                        None,
                        "cpu",
                        params=static_params,
                        processes=True,
                        max_contexts=a.proc_contexts,
                        worker_nice=a.worker_nice,
                    ) as in_workers:
                        timed = await batched(a, in_workers, requests, callers, result)
                worst = 0.0
                for index, outputs in timed["outputs"].items():
                    for got, want in zip(outputs, unbatched[index], strict=True):
                        diff = np.abs(got.numpy() - want.numpy()).max()
                        worst = max(worst, float(diff))
                result["max_abs_err"] = worst
                result["answers_checked"] = len(timed["outputs"])
            else:

                async def call(feed: dict[str, Any]) -> Any:
                    return await ex.run(**feed)

                await load(call, requests[: max(callers, 8)], callers, False)
                timed = await load(call, requests, callers, False)
            cache = ex.plan_cache_stats()
            result["plans"] = None if cache is None else cache.size
    result.update(
        requests=len(timed["latencies"]),
        wall_s=timed["wall"],
        rps=len(timed["latencies"]) / timed["wall"],
        latency_ms=[x * 1e3 for x in timed["latencies"]],
        lag_ms=[x * 1e3 for x in timed["lags"]],
        idle_lag_ms=[x * 1e3 for x in idle],
    )
    return result


async def batched(
    a: argparse.Namespace,
    ex: Any,
    requests: list[dict[str, Any]],
    callers: int,
    result: dict[str, Any],
) -> dict[str, Any]:
    """The load through a batcher on ``ex`` (a warm-up pass, then the
    timed one); its figures go to ``result``."""
    from asyncrt import Batcher

    batcher = Batcher(
        ex,
        batch_axes=dict.fromkeys(NAMES, 0),
        max_batch=a.max_batch,
        max_delay_ms=a.max_delay_ms,
    )
    async with batcher:
        await load(lambda f: batcher.run(**f), requests, callers, False)
        warm = len(batcher.records())
        timed = await load(lambda f: batcher.run(**f), requests, callers, True)
    records = batcher.records()[warm:]
    result["batch_rows_mean"] = statistics.mean(r.rows for r in records)
    result["batch_ms"] = [(r.end - r.start) * 1e3 for r in records]
    result["batch_sizes"] = [r.size for r in records]
    result["queue_delay_ms"] = [d * 1e3 for r in records for d in r.queue_delays]
    return timed


def child(a: argparse.Namespace) -> None:
    if a.switch_interval_ms:
        sys.setswitchinterval(a.switch_interval_ms / 1e3)
    result = asyncio.run(child_main(a))
    print(MARK + json.dumps(result), flush=True)


# -- the parent: rounds, summary ------------------------------------------------------


def write_model(path: Path) -> None:
    import onnx

    from tests.asyncrt.frontend.symbolic_models import BertConfig, bert_encoder

    onnx.save(bert_encoder(BertConfig()), str(path))


def run_child(a: argparse.Namespace, mode: str, model: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        mode,
        "--model",
        str(model),
        "--callers",
        str(a.callers),
        "--requests",
        str(a.requests),
        "--seq",
        str(a.seq),
        "--max-batch",
        str(a.max_batch),
        "--max-delay-ms",
        str(a.max_delay_ms),
        "--switch-interval-ms",
        str(a.switch_interval_ms),
        "--proc-contexts",
        str(a.proc_contexts),
        "--worker-nice",
        str(a.worker_nice),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return dict(json.loads(line[len(MARK) :]))
    raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")


def summarise(mode: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    latency = [x for r in rounds for x in r["latency_ms"]]
    lag = [x for r in rounds for x in r["lag_ms"]]
    idle = [x for r in rounds for x in r["idle_lag_ms"]]
    summary: dict[str, Any] = {
        "mode": mode,
        "rounds": len(rounds),
        "rps_median": statistics.median(r["rps"] for r in rounds),
        "rps_rounds": [round(r["rps"], 1) for r in rounds],
        "latency_p50_ms": pct(latency, 50),
        "latency_p99_ms": pct(latency, 99),
        "lag_p99_ms": pct(lag, 99),
        "idle_lag_p99_ms": pct(idle, 99),
    }
    if "batch_ms" in rounds[0]:
        batch_ms = [x for r in rounds for x in r["batch_ms"]]
        delays = [x for r in rounds for x in r["queue_delay_ms"]]
        sizes = [x for r in rounds for x in r["batch_sizes"]]
        summary.update(
            batch_rows_mean=statistics.mean(r["batch_rows_mean"] for r in rounds),
            batch_ms_p50=pct(batch_ms, 50),
            batch_ms_p99=pct(batch_ms, 99),
            queue_delay_p99_ms=pct(delays, 99),
            batch_sizes={str(s): sizes.count(s) for s in sorted(set(sizes))},
            max_abs_err=max(r["max_abs_err"] for r in rounds),
            answers_checked=sum(r["answers_checked"] for r in rounds),
        )
    return summary


def report(a: argparse.Namespace, summaries: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        f"{a.callers} callers x {a.requests} requests, batch 1, sequence {a.seq}, "
        f"{len(next(iter(summaries.values()))['rps_rounds'])} interleaved rounds; "
        f"cores {os.cpu_count()}",
        f"{'mode':16s} {'req/s':>7s}  {'rounds':28s} {'p50 ms':>7s} {'p99 ms':>7s} "
        f"{'lag p99':>8s} {'idle p99':>8s}",
    ]
    for mode, s in summaries.items():
        rounds = ",".join(f"{x:.0f}" for x in s["rps_rounds"])
        lines.append(
            f"{mode:16s} {s['rps_median']:7.1f}  {rounds:28s} "
            f"{s['latency_p50_ms']:7.1f} {s['latency_p99_ms']:7.1f} "
            f"{s['lag_p99_ms']:8.2f} {s['idle_lag_p99_ms']:8.2f}"
        )
    rps = {m: s["rps_median"] for m, s in summaries.items()}

    def ratio(top: str, bottom: str) -> None:
        if top in rps and bottom in rps:
            lines.append(f"{top} / {bottom}: {rps[top] / rps[bottom]:.2f}x")

    ratio("conc", "seq")
    ratio("conc-fixed", "seq")
    ratio("conc", "conc-fixed")
    ratio("batched", "conc")
    ratio("batched", "ort-executor")
    ratio("batched-throughput", "conc-throughput")
    ratio("batched-throughput", "ort-executor")
    ratio("batched-proc", "conc")
    ratio("batched-proc", "ort-executor")
    for name in ("batched", "batched-throughput", "batched-proc"):
        batched = summaries.get(name)
        if batched is None:
            continue
        bound = a.max_delay_ms + 2 * batched["batch_ms_p50"]
        lines.append(
            f"{name}: {batched['batch_rows_mean']:.1f} rows per batch, sizes "
            f"{batched['batch_sizes']}, batch time p50 {batched['batch_ms_p50']:.1f} "
            f"ms (p99 {batched['batch_ms_p99']:.1f}), queue delay p99 "
            f"{batched['queue_delay_p99_ms']:.1f} ms"
        )
        lines.append(
            f"{name}: latency p99 {batched['latency_p99_ms']:.1f} ms against "
            f"max_delay + 2 x batch time p50 = {bound:.1f} ms; loop lag p99 "
            f"{batched['lag_p99_ms']:.2f} ms (idle {batched['idle_lag_p99_ms']:.2f}); "
            f"max |batched - unbatched| {batched['max_abs_err']:.2e} over "
            f"{batched['answers_checked']} answers"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument("--requests", type=int, default=4, help="per caller")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.0,
        help="sys.setswitchinterval in the children (0: Python's 5 ms)",
    )
    ap.add_argument(
        "--proc-contexts", type=int, default=2, help="batched-proc's worker processes"
    )
    ap.add_argument("--worker-nice", type=int, default=10, help="batched-proc's")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    modes = [m for m in a.modes.split(",") if m]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "minilm.onnx"
        write_model(model)
        for index in range(a.rounds):
            load_avg = os.getloadavg()[0]
            for mode in modes:
                result = run_child(a, mode, model)
                results[mode].append(result)
                print(
                    f"round {index + 1}/{a.rounds} {mode:16s} "
                    f"{result['rps']:7.1f} req/s (load {load_avg:.2f})",
                    file=sys.stderr,
                    flush=True,
                )
    summaries = {mode: summarise(mode, rounds) for mode, rounds in results.items()}
    lines = report(a, summaries)
    print("\n".join(lines))
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(a).items() if k != "json"},
                    "modes": summaries,
                    "report": lines,
                },
                indent=2,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
