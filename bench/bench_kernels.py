"""Kernel efficiency: W2 (wide elementwise), W3 (MLP), W4 (attention) on the
cpu device, asyncrt with elementwise fusion against ONNX Runtime, TVM and
the numpy floor, all in one run.

    PEER_PY=/tmp/peerbench/.venv-peers/bin/python \\
        flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_kernels.py \\
        --peers-dir /tmp/peerbench --json bench/results/kernels.json

Peers run under ``$PEER_PY`` through the shared harness, exactly as
``bench_executor.py`` runs them (``peers.run_pair``); asyncrt runs in a child
of this interpreter with the same protocol (warm-up, then at least
``--min-runs`` timed runs and ``--min-time`` seconds), interleaved with the
peers, so every ratio compares runs minutes apart at most.

asyncrt variants (each ``ex.run_sync(**feed)``: inputs in, outputs out, as
``sess.run`` does):

* ``asyncrt-unfused-s1``: no fusion, one stream (the reference);
* ``asyncrt-default-s1``: the default options (``fuse="auto"``: the
  chains that compile into one loop with the same results), one stream;
* ``asyncrt-fused-s1``: ``fuse=True``, one cpu stream: kernel pools get
  every core (``kernel_threads="auto"``);
* ``asyncrt-fused-s2``: ``fuse=True``, two cpu streams: one thread each;
* ``asyncrt-onnx-unfused-s1``: the workload's own ONNX model through
  ``asyncrt.frontend.from_onnx`` (the user's path: the library's kernels for
  every op, ``Reshape`` an alias), no fusion, one stream;
* ``asyncrt-onnx-default-s1``: the same with the default options.

The other variants convert the workloads as ``bench_executor.to_asyncrt``
does, as a TVM graph would name them (built-in kernels for
Add/Mul/MatMul/Tanh/...; ``Softmax`` over the last axis maps to the
built-in ``softmax``; LayerNormalization and Transpose to the library's
configured ``layer_norm`` and ``transpose``, Reshape to TVM's ``__nop``;
other ops wrap the harness's numpy kernels). ``--profile`` writes, per
workload, each node's kernel time (run alone, in plan order) under
``bench/results/``. ``--ops`` first prints numexpr against numpy per op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_executor import (  # noqa: E402
    interleaved_rounds,
    load_harness,
    run_child,
    to_asyncrt,
)

DEFAULT_PEERS_DIR = Path("/tmp/peerbench")
DEFAULT_PEERS = (
    "floor",
    "ort-seq-t1",
    "ort-seq-tdef",
    "ort-par-t1",
    "ort-par-tdef",
    "tvm",
)
VARIANTS = (
    "asyncrt-unfused-s1",
    "asyncrt-default-s1",
    "asyncrt-fused-s1",
    "asyncrt-fused-s2",
    "asyncrt-onnx-unfused-s1",
    "asyncrt-onnx-default-s1",
)
RESULTS = HERE / "results"


def _variant(name: str) -> tuple[bool | str, int]:
    """(fuse, streams) of a variant name."""
    fuse = True if "-fused-" in name else "auto" if "-default-" in name else False
    return fuse, int(name.rsplit("-s", 1)[1])


def child(wl_name: str, variant: str, a: argparse.Namespace) -> None:
    peers, workloads = load_harness(Path(a.peers_dir))
    import numpy as np

    from asyncrt import graph_executor

    wl = workloads.build(wl_name)
    feed = wl.inputs
    rss_base = peers.maxrss_mb()
    fuse, streams = _variant(variant)
    t0 = time.perf_counter()
    if "-onnx-" in variant:  # the user's path: the workload's ONNX model
        from asyncrt.frontend import from_onnx

        graph, params = from_onnx(wl.to_onnx())
        lib = None
    else:
        graph, lib, params = to_asyncrt(wl, workloads)
    ex = graph_executor.create(
        graph, lib, "cpu", fuse=fuse, max_streams=streams, params=params
    )
    setup_s = time.perf_counter() - t0

    def fn() -> list[Any]:
        return ex.run_sync(**feed) or []

    times, cpu_run, nwarm = peers.measure_sync(fn, a)
    out = [o.numpy() for o in fn()]
    ref = wl.floor_outputs()
    rel_err = max(
        float(np.max(np.abs(np.asarray(o, np.float64) - r)))
        / max(float(np.max(np.abs(r))), 1e-30)
        for o, r in zip(out, ref, strict=True)
    )
    ts = sorted(times)
    launches = list(ex.plan.launches())
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
        "rss_peak_mb": peers.maxrss_mb(),
        "nodes": len(wl.nodes),
        "launches": len(launches),
        "streams": len(ex.plan.streams),
        "times_s": times,
    }
    if a.profile:
        res["profile"] = profile(ex, feed)
    ex.close()
    print(peers.MARK + json.dumps(res), flush=True)


def profile(ex: Any, feed: dict[str, Any], repeats: int = 20) -> list[dict[str, Any]]:
    """Each launch's kernel time, run alone in plan order (median of
    ``repeats``), on the executor's own context: the calls its program
    makes (kernels bound to their arrays where they bind)."""
    ex.set_input(**feed)
    ex.run_sync()  # every tensor written once
    program = ex.core.own_context().program
    calls = [
        (launch, fn, args)
        for action in program._actions
        for (fn, args, _), launch in zip(
            getattr(action, "calls", ()), getattr(action, "launches", ()), strict=True
        )
        if launch is not None  # not a cancellation check
    ]
    rows = []
    for launch, fn, args in calls:
        samples = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn(*args)
            samples.append(time.perf_counter() - t)
        samples.sort()
        rows.append(
            {
                "node": launch.name,
                "func": launch.func_name,
                "median_us": 1e6 * samples[len(samples) // 2],
            }
        )
    return rows


def run_asyncrt(wl: str, variant: str, a: argparse.Namespace, mark: str) -> Any:
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
    ]
    if a.profile:
        cmd.append("--profile")
    return run_child(cmd, mark, a.timeout, {"workload": wl, "peer": variant})


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per workload, every peer's median and its ratios."""
    lines = []
    for wl in sorted({r["workload"] for r in results}):
        rows = [r for r in results if r["workload"] == wl]
        ok = {r["peer"]: r for r in rows if r.get("ok")}
        ort = [r for p, r in ok.items() if p.startswith("ort-")]
        ort_best = min(ort, key=lambda r: r["median_s"]) if ort else None
        floor = ok.get("floor")
        tvm = ok.get("tvm")
        lines += [f"\n## {wl}\n"]
        if ort_best:
            lines.append(f"ORT best: {ort_best['peer']}\n")
        lines.append(
            "| peer | median ms | / ORT best | / TVM | / floor | CPU ms/run | "
            "launches | correct |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in rows:
            if not r.get("ok"):
                lines.append(
                    f"| {r['peer']} | failed: {r.get('error', '')[:80]} |||||||"
                )
                continue
            med = r["median_s"]

            def ratio(ref: dict[str, Any] | None, med: float = med) -> str:
                return f"{med / ref['median_s']:.2f}" if ref else "-"

            lines.append(
                f"| {r['peer']} | {1e3 * med:.2f} | {ratio(ort_best)} | "
                f"{ratio(tvm)} | {ratio(floor)} | {1e3 * r['cpu_s_per_run']:.1f} | "
                f"{r.get('launches', '-')} | {r['correct']} |"
            )
    return "\n".join(lines)


def ops_table() -> str:
    """numexpr against numpy, one op at a time, float32[2^21], one thread."""
    import numexpr
    import numpy as np

    n = 1 << 21
    x = np.random.default_rng(0).uniform(0.1, 2.0, n).astype(np.float32)
    out = np.empty_like(x)
    numexpr.set_num_threads(1)

    def best(fn: Any) -> float:
        fn()
        samples = []
        for _ in range(7):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return min(samples)

    lines = ["| op | numpy ms | numexpr ms | numexpr / numpy |", "|---|---|---|---|"]
    for op, ufunc, expr in (
        ("mul", np.multiply, "x * x"),
        ("exp", np.exp, "exp(x)"),
        ("log", np.log, "log(x)"),
        ("sqrt", np.sqrt, "sqrt(x)"),
        ("tanh", np.tanh, "tanh(x)"),
    ):
        args = (x, x, out) if ufunc is np.multiply else (x, out)
        t_np = best(lambda u=ufunc, a=args: u(*a))
        t_ne = best(lambda e=expr: numexpr.evaluate(e, local_dict={"x": x}, out=out))
        lines.append(
            f"| {op} | {1e3 * t_np:.2f} | {1e3 * t_ne:.2f} | {t_ne / t_np:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="W2,W3,W4")
    ap.add_argument("--peers", default=",".join(DEFAULT_PEERS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    ap.add_argument("--min-runs", type=int, default=10)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--max-runs", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a)
        return
    if a.ops:
        print(ops_table(), flush=True)
    peers, _ = load_harness(Path(a.peers_dir))
    calibration, results, best = interleaved_rounds(a, peers, run_asyncrt)
    print(table(best))
    print(f"free cores at end: {peers.calibrate()}", flush=True)
    if a.profile:
        RESULTS.mkdir(exist_ok=True)
        for r in best:
            if "profile" in r:
                path = RESULTS / f"kernels-profile-{r['workload']}-{r['peer']}.md"
                rows = sorted(r["profile"], key=lambda x: -x["median_us"])
                total = sum(x["median_us"] for x in rows)
                text = [
                    f"# {r['workload']} {r['peer']}: kernel time per launch "
                    f"(alone, median), total {total / 1e3:.2f} ms; "
                    f"run median {1e3 * r['median_s']:.2f} ms\n",
                    "| node | func | us | share |",
                    "|---|---|---|---|",
                ]
                text += [
                    f"| {x['node']} | {x['func']} | {x['median_us']:.1f} | "
                    f"{x['median_us'] / total:.1%} |"
                    for x in rows
                ]
                path.write_text("\n".join(text) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"calibration": calibration, "results": results}, f, indent=1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
