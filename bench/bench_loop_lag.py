"""Event-loop lag while 50 concurrent requests run W3 (the MLP): asyncrt's
``await ex.run()`` against ONNX Runtime, in one run.

The protocol is the shared harness's (``../shared/bench/loop_lag.py``): a
ticker coroutine sleeps 1 ms in a loop and records how late it wakes, while
a burst of ``--requests`` requests (all started at once with
``asyncio.gather``) runs W3; each mode is repeated ``--rounds`` times and the
lags pooled; within one child the modes take turns round by round. Modes:

* ``idle``, ``direct``, ``executor``, ``run_async``: ONNX Runtime, measured by
  the shared harness itself in a child under ``$PEER_PY`` (it has
  onnxruntime; this venv need not);
* ``asyncrt-cN``: W3 converted to an asyncrt graph (``bench_executor.py``'s
  ``to_asyncrt``), ``await ex.run(x=...)`` on one executor with
  ``max_contexts=N``, in a child of this interpreter (with its own ``idle``
  baseline, ``asyncrt-idle``, measured in that same process);
* ``asyncrt-cN-uvloop``: the same on uvloop, if it is installed;
* ``asyncrt-proc-...``: the same with ``processes=True`` (each run context
  in a worker process, ``worker_nice`` from ``--worker-nice``), so no kernel
  or dispatcher thread shares the event loop's interpreter; the workers'
  OpenBLAS kernel set is ``worker_blas="auto"``'s choice (timed when the
  pool starts), or OpenBLAS's own for ``...-default``
  (``--run-in process-default``);
* ``...-throughput``: the same with ``kernel_threads="throughput"`` (kernel
  pools sized for N concurrent runs: N streams each running single-threaded
  BLAS on 2 cores, instead of N x cores BLAS threads fighting over them;
  ONNX Runtime sizes its own pool). Plain ``asyncrt-cN`` uses ``"auto"``.

    PEER_PY=/path/to/peers-venv/bin/python python bench/bench_loop_lag.py

Targets: asyncrt's lag p99 within 1 ms of idle; throughput at least that of
``executor`` (``run_in_executor``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_PEERS_DIR = ROOT.parent / "shared" / "bench"
MARK = "@@LOOPLAG@@"
PERIOD = 0.001


def pct(xs: list[float], q: float) -> float:
    """The shared harness's percentile (nearest rank on the sorted list)."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))]


# -- the asyncrt child ---------------------------------------------------------


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(PERIOD)
        lags.append(time.perf_counter() - t - PERIOD)


async def scenario(
    ex: Any, feed: dict[str, Any], n_req: int, idle_s: float
) -> dict[str, Any]:
    """One burst (or an idle spell when ``ex`` is None), as the harness does."""

    async def request() -> tuple[float, Any]:
        t = time.perf_counter()
        outs = await ex.run(**feed)
        return time.perf_counter() - t, outs

    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop, lags))
    await asyncio.sleep(0.02)  # let the ticker settle
    lags.clear()
    t0 = time.perf_counter()
    if ex is None:
        await asyncio.sleep(idle_s)
        res: list[tuple[float, Any]] = []
    else:
        res = await asyncio.gather(*[request() for _ in range(n_req)])
    wall = time.perf_counter() - t0
    stop.set()
    await tick
    lat = [r[0] for r in res]
    return {
        "requests": len(res),
        "wall_s": wall,
        "throughput_rps": len(res) / wall if res else None,
        "latency_p50_ms": pct(lat, 50) * 1e3 if lat else None,
        "ticks_expected": int(wall / PERIOD),
        "lags_ms": [x * 1e3 for x in lags],
        "_out": _host(res[0][1][0]) if res else None,
    }


def _host(array: Any) -> Any:
    """A numpy copy of an output (asyncrt's NDArray or ORT's numpy array)."""
    return array.numpy() if hasattr(array, "numpy") else array


class OrtExecutor:
    """ONNX Runtime through ``run_in_executor`` (the harness's ``executor``
    mode), with ``run(**feed)`` like an executor, so its rounds interleave
    with asyncrt's in one process."""

    def __init__(self, sess: Any) -> None:
        self.sess = sess

    async def run(self, **feed: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.sess.run, None, feed)

    def close(self) -> None:
        pass


def _ort_session(wl: Any) -> Any:
    """W3 in an ONNX Runtime session as the harness makes it, or None if
    onnxruntime is not installed here."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return ort.InferenceSession(
        wl.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
    )


def summarise(mode: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    lags = [x for r in rounds for x in r["lags_ms"]]
    thr = sorted(r["throughput_rps"] for r in rounds if r["throughput_rps"])
    walls = sorted(r["wall_s"] for r in rounds)
    return {
        "mode": mode,
        "rounds": len(rounds),
        "ticks": len(lags),
        "ticks_expected": sum(r["ticks_expected"] for r in rounds),
        "lag_p50_ms": pct(lags, 50),
        "lag_p99_ms": pct(lags, 99),
        "lag_max_ms": max(lags) if lags else float("nan"),
        "throughput_rps_median": thr[len(thr) // 2] if thr else None,
        "wall_s_median": walls[len(walls) // 2],
        "latency_p50_ms_median": sorted(r["latency_p50_ms"] or 0 for r in rounds)[
            len(rounds) // 2
        ],
        "rel_err_max": max((r.get("rel_err", 0.0) for r in rounds), default=0.0),
    }


async def _warm_pool(ex: Any, feed: dict[str, Any], contexts: int) -> None:
    """Run ``contexts`` requests at once so every worker process exists."""
    await asyncio.gather(*(ex.run(**feed) for _ in range(contexts)))


def _kernel_threads(text: str) -> int | str:
    """``--kernel-threads`` as ``create`` takes it: a policy name or a count."""
    return int(text) if text.isdigit() else text


def child(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    import numpy as np
    from bench_executor import load_harness, to_asyncrt

    from asyncrt import graph_executor

    _, workloads = load_harness(Path(a.peers_dir))
    wl = workloads.build("W3")
    feed = dict(wl.inputs)
    ref = wl.floor_outputs()[0]
    graph, lib, params = to_asyncrt(wl, workloads)
    results: dict[str, Any] = {}
    suffix = "" if a.kernel_threads == "auto" else f"-{a.kernel_threads}"
    env_suffix = "".join("-" + item.split("=", 1)[1] for item in a.worker_env)
    # (mode, contexts, uvloop, where the contexts live)
    plan: list[tuple[str, int, bool, str]] = [("asyncrt-idle" + suffix, 0, False, "")]
    if "ort" in a.run_in.split(","):
        plan.append(("ort-executor-here", 1, False, "ort"))
    for run_in in [r for r in a.run_in.split(",") if r != "ort"]:
        prefix = "asyncrt" if run_in == "thread" else "asyncrt-proc"
        tail = suffix + {"process+env": env_suffix, "process-default": "-default"}.get(
            run_in, ""
        )
        for n in [int(c) for c in a.contexts.split(",") if c]:
            plan.append((f"{prefix}-c{n}{tail}", n, False, run_in))
            if a.uvloop:
                plan.append((f"{prefix}-c{n}-uvloop{tail}", n, True, run_in))
    # Every executor is made and warmed first; then the modes take turns,
    # round by round, so the machine's drift (a shared VM) spreads over all
    # of them instead of favouring whichever ran in a quiet minute.
    executors: dict[str, Any] = {}
    runners: dict[str, Any] = {}
    for mode, contexts, use_uvloop, run_in in plan:
        runner: Any = asyncio.run
        if use_uvloop:
            try:
                import uvloop
            except ImportError:
                results[mode] = {"mode": mode, "error": "uvloop not installed"}
                continue
            runner = uvloop.run
        if run_in == "ort":
            sess = _ort_session(wl)
            if sess is None:
                results[mode] = {"mode": mode, "error": "onnxruntime not installed"}
                continue
            executors[mode], runners[mode] = OrtExecutor(sess), runner
            continue
        processes = run_in.startswith("process") and contexts > 0
        ex = graph_executor.create(
            graph,
            lib if len(lib) else None,
            "cpu",
            max_contexts=max(contexts, 1),
            kernel_threads=_kernel_threads(a.kernel_threads),
            processes=processes,
            worker_nice=a.worker_nice if processes else 0,
            worker_env=(
                dict(e.split("=", 1) for e in a.worker_env)
                if run_in == "process+env"
                else None
            ),
            worker_blas="default" if run_in == "process-default" else "auto",
        )
        ex.load_params(params)
        for _ in range(3):  # warm up: caches hot
            ex.run_sync(**feed)
        if processes:  # start every worker before measuring
            runner(_warm_pool(ex, feed, contexts))
        executors[mode], runners[mode] = ex, runner
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in executors}
    for _ in range(a.rounds):
        for mode, contexts, _uv, _where in plan:
            if mode not in executors:
                continue
            target = executors[mode] if contexts else None
            r = runners[mode](scenario(target, feed, a.requests, idle_s=0.5))
            out = r.pop("_out")
            if out is not None:
                r["rel_err"] = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
            rounds[mode].append(r)
    for mode, ex in executors.items():
        results[mode] = summarise(mode, rounds[mode])
        if hasattr(ex, "pool"):
            results[mode]["contexts_made"] = ex.pool.size
        if getattr(ex, "worker_blas", None) is not None:
            results[mode]["worker_blas"] = ex.worker_blas
            timing = ex.worker_blas_timing or {}
            results[mode]["worker_blas_ms"] = {k: v * 1e3 for k, v in timing.items()}
        ex.close()
    print(MARK + json.dumps(results), flush=True)


# -- the parent ------------------------------------------------------------------


def run_ort(a: argparse.Namespace) -> dict[str, Any]:
    peer_py = os.environ.get("PEER_PY", "python3")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ort.json")
        cmd = [
            peer_py,
            str(Path(a.peers_dir) / "loop_lag.py"),
            "--requests",
            str(a.requests),
            "--rounds",
            str(a.rounds),
            "--modes",
            a.ort_modes,
            "--json",
            out,
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        if p.returncode != 0 or not os.path.exists(out):
            tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
            return {"ort": {"mode": "ort", "error": " | ".join(tail)}}
        header = [line for line in p.stdout.splitlines() if line.startswith("#")]
        with open(out) as f:
            data = json.load(f)
    results: dict[str, Any] = data["results"]
    for r in results.values():
        r.pop("per_round", None)
    results["_header"] = header
    return results


def run_asyncrt(a: argparse.Namespace, kernel_threads: str) -> dict[str, Any]:
    """The asyncrt modes in one child whose executors take ``kernel_threads``
    (``"auto"``: one run's latency first; ``"throughput"``: pools sized for
    ``max_contexts`` concurrent runs; or a number), for every ``--run-in``
    (``ort`` is ONNX Runtime through ``run_in_executor`` in that same child,
    interleaved with the rest)."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--requests",
        str(a.requests),
        "--rounds",
        str(a.rounds),
        "--contexts",
        a.contexts,
        "--peers-dir",
        str(a.peers_dir),
        "--kernel-threads",
        kernel_threads,
        "--run-in",
        a.run_in,
        "--worker-nice",
        str(a.worker_nice),
    ]
    for item in a.worker_env:
        cmd += ["--worker-env", item]
    if not a.uvloop:
        cmd.append("--no-uvloop")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            result: dict[str, Any] = json.loads(line[len(MARK) :])
            return result
    tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
    return {f"asyncrt-{kernel_threads}": {"mode": "asyncrt", "error": " | ".join(tail)}}


def table(results: dict[str, Any]) -> str:
    lines = [
        "| mode | lag p50 ms | lag p99 ms | lag max ms | ticks (got/expected) "
        "| req/s | burst wall s | rel err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in results.items():
        if mode.startswith("_"):
            continue
        if "error" in s:
            lines.append(f"| {mode} | failed: {s['error'][:100]} | | | | | | |")
            continue
        busy = bool(s.get("throughput_rps_median"))
        thr = f"{s['throughput_rps_median']:.1f}" if busy else "-"
        wall = f"{s['wall_s_median']:.2f}" if busy else "-"
        err = f"{s.get('rel_err_max', 0.0):.1e}" if busy else "-"
        lines.append(
            f"| {mode} | {s['lag_p50_ms']:.3f} | {s['lag_p99_ms']:.3f} | "
            f"{s['lag_max_ms']:.1f} | {s['ticks']}/{s['ticks_expected']} | {thr} "
            f"| {wall} | {err} |"
        )
    return "\n".join(lines)


def verdict(results: dict[str, Any]) -> list[str]:
    """Each asyncrt mode against the targets: lag p99 within 1 ms of idle
    (the ORT child's, and the one measured in its own process, interleaved),
    throughput at least ONNX Runtime's through ``run_in_executor`` (the one
    interleaved in the same process where there is one, else the ORT
    child's)."""
    notes = []
    idle = results.get("idle", {})
    executor = results.get("ort-executor-here") or results.get("executor", {})
    idles = sorted((k for k in results if k.startswith("asyncrt-idle")), key=len)
    for mode, s in results.items():
        if "worker_blas" in s:
            timed = ", ".join(
                f"{k} {v:.2f} ms" for k, v in s.get("worker_blas_ms", {}).items()
            )
            notes.append(
                f"{mode}: workers load OpenBLAS kernel set {s['worker_blas']!r}"
                + (f" (timed per run: {timed})" if timed else "")
            )
        parts = re.match(r"^asyncrt(?:-proc)?-c\d+(?:-uvloop)?(.*)$", mode)
        if parts is None or "error" in s:
            continue
        tail = parts.group(1)
        local = [k for k in idles if tail.startswith(k[len("asyncrt-idle") :])]
        local_idle = results[local[-1]] if local else {}
        for name, base in (("idle (ORT child)", idle), ("asyncrt-idle", local_idle)):
            if "lag_p99_ms" in base:
                gap = s["lag_p99_ms"] - base["lag_p99_ms"]
                ok = "meets" if gap <= 1.0 else "misses"
                notes.append(
                    f"{mode}: p99 {s['lag_p99_ms']:.3f} ms is {gap:+.3f} ms vs "
                    f"{name}: {ok} the 1 ms target"
                )
        if executor.get("throughput_rps_median"):
            ratio = s["throughput_rps_median"] / executor["throughput_rps_median"]
            ok = "meets" if ratio >= 1.0 else "misses"
            notes.append(
                f"{mode}: throughput {ratio:.2f}x run_in_executor: {ok} the target"
            )
    return notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--contexts", default="2,4", help="asyncrt max_contexts list")
    ap.add_argument("--ort-modes", default="idle,direct,executor,run_async")
    ap.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    ap.add_argument(
        "--kernel-threads",
        default="auto,throughput",
        help="the executors' kernel_threads, a comma list ('auto', "
        "'throughput', or numbers); each is one child",
    )
    ap.add_argument(
        "--run-in",
        default="ort,thread,process",
        help="the modes of the asyncrt child, a comma list: 'thread' "
        "(kernels on stream threads of this process), 'process' "
        "(processes=True), 'process-default' (the same with "
        "worker_blas='default': OpenBLAS's own kernel set), 'process+env' "
        "(with --worker-env in the workers) and 'ort' (ONNX Runtime via "
        "run_in_executor, if installed here, interleaved with them)",
    )
    ap.add_argument(
        "--worker-nice",
        type=int,
        default=19,
        help="the process modes' worker_nice (default 19: workers yield to "
        "the event loop's process)",
    )
    ap.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the 'process+env' workers "
        "(repeatable), e.g. OPENBLAS_CORETYPE=Haswell",
    )
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    print(f"# {os.cpu_count()} cpus, loadavg at start {os.getloadavg()}", flush=True)
    results: dict[str, Any] = {}
    t = time.perf_counter()
    results.update(run_ort(a))
    print(f"# ONNX Runtime modes done in {time.perf_counter() - t:.1f} s", flush=True)
    for kernel_threads in a.kernel_threads.split(","):
        t = time.perf_counter()
        results.update(run_asyncrt(a, kernel_threads))
        print(
            f"# asyncrt modes (kernel_threads={kernel_threads}) "
            f"done in {time.perf_counter() - t:.1f} s",
            flush=True,
        )
    for line in results.pop("_header", []):
        print(line)
    print(f"# loadavg at end {os.getloadavg()}\n")
    print(table(results))
    print()
    for note in verdict(results):
        print("#", note)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
