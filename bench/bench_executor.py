"""asyncrt's graph executor against the peers, in one run.

Uses the shared peer harness (``../shared/bench``: ``peers.py``,
``workloads.py``): every peer runs in its own child process under
``$PEER_PY`` exactly as ``peers.py`` runs it, and asyncrt runs in a child of
this interpreter with the same measuring protocol (warm-up, then at least
``--min-runs`` timed runs and ``--min-time`` seconds). Ratios are taken
within this one run, because the shared machine drifts between runs.

    PEER_PY=/path/to/peers-venv/bin/python \\
        python bench/bench_executor.py --workload W1 --json out.json

asyncrt variants (append ``-sN`` for N compute streams, e.g.
``asyncrt-stateful-s2``, then ``-nosplit`` to keep every node whole, e.g.
``asyncrt-stateful-s2-nosplit``: ``create(split=False)``, no row splits of
elementwise joins over the streams):

* ``asyncrt-sync``: ``ex.run_sync(**feed)`` — inputs copied in, outputs
  copied out, every run (what a blocking caller pays);
* ``asyncrt-async``: ``await ex.run(**feed)`` inside an asyncio loop, timed
  per await (what a coroutine pays, loop wake-up included);
* ``asyncrt-stateful``: ``ex.run_sync()`` after ``set_input`` — TVM's style,
  no copies: the pure per-node cost of the executor.

Workload nodes become asyncrt graphs: ``Add``/``Mul``/``MatMul``/... map to
asyncrt's built-in destination-passing kernels; other ops wrap the harness's
numpy kernels (``out[...] = f(*inputs)``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# This checkout's asyncrt, not the one an editable install points at (a
# child runs this file from bench/, where ``import asyncrt`` found the
# installed checkout's).
sys.path.insert(0, str(ROOT))
DEFAULT_PEERS_DIR = ROOT.parent / "shared" / "bench"
ASYNCRT_VARIANTS = ("asyncrt-stateful", "asyncrt-sync", "asyncrt-async")
DEFAULT_PEERS = ("floor", "ort-seq-t1", "ort-seq-tdef", "tvm", "dask-threaded-1")
# harness op type -> asyncrt built-in kernel (destination passing)
BUILTIN = {
    "Add": "add",
    "Sub": "subtract",
    "Mul": "multiply",
    "Div": "divide",
    "MatMul": "matmul",
    "Relu": "relu",
    "Tanh": "tanh",
    "Exp": "exp",
    "Sqrt": "sqrt",
    "Sum": "sum",
}


def _layer_norm(attrs: dict[str, Any]) -> str:
    from asyncrt.ops import register_op_kernel

    config = {"axis": attrs.get("axis", -1), "epsilon": attrs.get("epsilon", 1e-5)}
    config |= {"bias": True, "stats": 0, "stash_dtype": "float32"}
    return register_op_kernel("layer_norm", config)


def _transpose(attrs: dict[str, Any]) -> str:
    from asyncrt.ops import register_op_kernel

    return register_op_kernel("transpose", {"perm": [int(p) for p in attrs["perm"]]})


#: ONNX ops of the workloads that the library's configured kernels run, as
#: a TVM graph names them: a reshape is TVM's ``__nop`` (the output aliases
#: its input), a layer norm and a transpose the library's ops with their
#: attributes (the harness's numpy kernels otherwise: a layer norm's seven
#: passes over memory).
CONFIGURED = {
    "Reshape": lambda attrs: "__nop",
    "LayerNormalization": _layer_norm,
    "Transpose": _transpose,
}


def load_harness(peers_dir: Path) -> tuple[Any, Any]:
    sys.path.insert(0, str(peers_dir))
    import peers  # type: ignore[import-not-found]
    import workloads  # type: ignore[import-not-found]

    return peers, workloads


def to_asyncrt(wl: Any, workloads: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The workload as (asyncrt Graph, kernel Module, params)."""
    import numpy as np

    import asyncrt
    from asyncrt.graph import GraphBuilder

    values: dict[str, Any] = {**wl.consts, **wl.inputs}
    for out, fn, ins in wl.numpy_nodes():  # shapes and dtypes of every tensor
        values[out] = np.asarray(fn(*[values[i] for i in ins]))
    b = GraphBuilder()
    handles = {}
    for name, value in wl.inputs.items():
        handles[name] = b.input(name, shape=value.shape, dtype=str(value.dtype))
    for name, value in wl.consts.items():
        handles[name] = b.param(name, shape=value.shape, dtype=str(value.dtype))
    lib = asyncrt.Module()
    for k, (op, ins, out, attrs) in enumerate(wl.nodes):
        func = BUILTIN.get(op) if not attrs else None
        if op == "Softmax" and attrs.get("axis", -1) in (-1, values[ins[0]].ndim - 1):
            func = "softmax"  # the built-in softmax is over the last axis
        if op in CONFIGURED:
            func = CONFIGURED[op](attrs)
        if func is None:
            func = f"{op.lower()}_{k}"
            fn = workloads.numpy_kernel(op, attrs)
            lib.add(
                func,
                _wrap(fn),
                kinds=("cpu", "sim"),
                flops=_timed_flops(fn, [values[i] for i in ins]),
            )
        value = values[out]
        handles[out] = b.op(
            func,
            *[handles[i] for i in ins],
            shape=value.shape,
            dtype=str(value.dtype),
            name=out,
        )
    b.output(*[handles[o] for o in wl.outputs])
    return b.build(), lib, dict(wl.consts)


def _timed_flops(fn: Any, args: list[Any]) -> Any:
    """The harness's own kernels are opaque to the cost model: their work is
    declared from timing one call here (best of three), in the units of the
    cpu's ``flops`` at one BLAS thread (they run on one core), so that
    placement does not take a layer norm for free."""
    import threadpoolctl

    from devices import Device, get_api

    with threadpoolctl.threadpool_limits(1):
        rate = float(get_api("cpu").attributes(Device("cpu", 0))["flops"])
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    work = best * rate
    return lambda ins, outs: work


def _wrap(fn: Any) -> Any:
    def kernel(*args: Any) -> None:
        args[-1][...] = fn(*args[:-1])

    return kernel


def child(wl_name: str, variant: str, a: argparse.Namespace) -> None:
    peers, workloads = load_harness(Path(a.peers_dir))
    import numpy as np

    from asyncrt import graph_executor

    wl = workloads.build(wl_name)
    feed = wl.inputs
    rss_base = peers.maxrss_mb()
    t0 = time.perf_counter()
    graph, lib, params = to_asyncrt(wl, workloads)
    # "...-fused": elementwise fusion on; "...-nosplit": row splits off;
    # "...-s2": 2 compute streams on the device.
    fuse = variant.endswith("-fused")
    unfused = variant.removesuffix("-fused")
    split = not unfused.endswith("-nosplit")
    name = unfused if split else unfused[: -len("-nosplit")]
    streams = re.search(r"-s(\d+)$", name)
    variant_base = name[: streams.start()] if streams else name
    ex = graph_executor.create(
        graph,
        lib,
        a.device,
        max_streams=int(streams.group(1)) if streams else 1,
        params=params,
        split=split,
        fuse=fuse,
    )
    setup_s = time.perf_counter() - t0
    if variant_base == "asyncrt-stateful":
        ex.set_input(**feed)

        def fn() -> list[Any]:
            ex.run_sync()
            return [ex.get_output(i) for i in range(ex.get_num_outputs())]

        times, cpu_run, nwarm = peers.measure_sync(fn, a)
    elif variant_base == "asyncrt-sync":

        def fn() -> list[Any]:
            return ex.run_sync(**feed) or []

        times, cpu_run, nwarm = peers.measure_sync(fn, a)
    else:
        import asyncio

        async def measure() -> tuple[list[float], float, int]:
            async def once() -> list[Any]:
                return await ex.run(**feed) or []

            t_start, i = time.perf_counter(), 0
            while peers._warm_count(i, t_start):
                await once()
                i += 1
            out_times: list[float] = []
            c0, t_start = peers.cpu_s(), time.perf_counter()
            while peers._more(len(out_times), t_start, a):
                t = time.perf_counter()
                await once()
                out_times.append(time.perf_counter() - t)
            return out_times, (peers.cpu_s() - c0) / len(out_times), i

        times, cpu_run, nwarm = asyncio.run(measure())

        def fn() -> list[Any]:
            return ex.run_sync(**feed) or []

    out = [o.numpy() for o in fn()]
    rss_peak = peers.maxrss_mb()
    ref = wl.floor_outputs()
    rel_err = max(
        float(np.max(np.abs(np.asarray(o, np.float64) - r)))
        / max(float(np.max(np.abs(r))), 1e-30)
        for o, r in zip(out, ref, strict=True)
    )
    arena = ex.plan.arenas[ex.plan.host]
    param_bytes = sum(v.nbytes for v in params.values())
    ts = sorted(times)
    res = {
        "workload": wl_name,
        "peer": variant,
        "ok": True,
        "runs": len(times),
        "warmup_runs": nwarm,
        "min_s": ts[0],
        "median_s": ts[len(ts) // 2],
        "cpu_s_per_run": cpu_run,
        "setup_s": setup_s,
        "rel_err": rel_err,
        "correct": rel_err <= 1e-4,
        "rss_base_mb": rss_base,
        "rss_peak_mb": rss_peak,
        "nodes": len(wl.nodes),
        "arena_bytes": arena.size,
        "arena_lower_bound": arena.lower_bound,
        "param_bytes": param_bytes,
        # launches that are parts of nodes split into rows (scheduler.split)
        "parts": [
            launch.label for launch in ex.plan.launches() if launch.part is not None
        ],
        "times_s": times,
    }
    ex.close()
    print(peers.MARK + json.dumps(res), flush=True)


def run_asyncrt(
    wl: str, variant: str, a: argparse.Namespace, mark: str
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        wl,
        variant,
        "--peers-dir",
        str(a.peers_dir),
        "--min-runs",
        str(a.min_runs),
        "--min-time",
        str(a.min_time),
        "--max-runs",
        str(a.max_runs),
        "--device",
        a.device,
    ]
    failed = {"workload": wl, "peer": variant}
    return run_child(cmd, mark, a.timeout, failed)


def run_child(
    cmd: list[str], mark: str, timeout: float, failed: dict[str, Any]
) -> dict[str, Any]:
    """Run a benchmark child; its result is the JSON after ``mark`` on its
    stdout, or ``failed`` with ``ok: False`` and the child's last lines."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith(mark):
            result: dict[str, Any] = json.loads(line[len(mark) :])
            return result
    tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
    return {**failed, "ok": False, "error": " | ".join(tail)}


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for wl in sorted({r["workload"] for r in results}):
        rows = [r for r in results if r["workload"] == wl]
        floor = next((r for r in rows if r["peer"] == "floor" and r.get("ok")), None)
        lines.append(f"\n## {wl}\n")
        lines.append(
            "| peer | median ms | per node us | vs floor | CPU ms/run | "
            "peak RSS - base MB | correct |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for r in rows:
            if not r.get("ok"):
                error = r.get("error", "")[:80]
                lines.append(f"| {r['peer']} | failed: {error} | | | | | |")
                continue
            med = r["median_s"]
            ratio = med / floor["median_s"] if floor else float("nan")
            per_node = 1e6 * med / r["nodes"]
            rss = r["rss_peak_mb"] - r["rss_base_mb"]
            lines.append(
                f"| {r['peer']} | {1e3 * med:.3f} | {per_node:.3f} | {ratio:.2f} | "
                f"{1e3 * r['cpu_s_per_run']:.2f} | {rss:.1f} | {r['correct']} |"
            )
        for r in rows:
            if r.get("ok") and "arena_bytes" in r:
                lines.append(
                    f"\n{r['peer']}: one run context = arena {r['arena_bytes']:,} B "
                    f"(lower bound {r['arena_lower_bound']:,}) + params "
                    f"{r['param_bytes']:,} B"
                )
                break
    return "\n".join(lines)


def interleaved_rounds(
    a: argparse.Namespace,
    peers: Any,
    run_variant: Callable[[str, str, argparse.Namespace, str], dict[str, Any]],
) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """Run every peer and asyncrt variant on every workload, ``a.rounds``
    times, interleaved (the machine drifts, so neighbours compare best).

    :return: the calibration at the start, every result, and each pair's
        best-median round.
    """
    peer_args = argparse.Namespace(
        min_runs=a.min_runs,
        min_time=a.min_time,
        max_runs=a.max_runs,
        dist_budget=20.0,
        timeout=a.timeout,
    )
    calibration = peers.calibrate()
    print(f"free cores at start: {calibration}", flush=True)
    results: list[dict[str, Any]] = []
    names = [p for p in a.peers.split(",") if p]
    variants = [v for v in a.variants.split(",") if v]
    for _ in range(a.rounds):
        for wl in a.workload.split(","):
            for name in [*names, *variants]:
                if name.startswith("asyncrt"):
                    r = run_variant(wl, name, a, peers.MARK)
                else:
                    r = peers.run_pair(wl, name, peer_args)
                status = "ok" if r.get("ok") else f"FAILED {r.get('error', '')[:100]}"
                med = f"{1e3 * r['median_s']:.3f} ms" if r.get("ok") else ""
                print(f"{wl} {name:20} {med} {status}", flush=True)
                results.append(r)
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        key = (r["workload"], r["peer"])
        if key not in best or (
            r.get("ok") and r["median_s"] < best[key].get("median_s", float("inf"))
        ):
            best[key] = r
    return calibration, results, list(best.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="W1", help="comma list of W1..W4")
    ap.add_argument("--peers", default=",".join(DEFAULT_PEERS))
    ap.add_argument("--variants", default=",".join(ASYNCRT_VARIANTS))
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--min-runs", type=int, default=20)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--max-runs", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a)
        return
    peers, _ = load_harness(Path(a.peers_dir))
    calibration, results, best = interleaved_rounds(a, peers, run_asyncrt)
    report = table(best)
    print(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"calibration": calibration, "results": results}, f, indent=1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
