"""Multi-device plans, measured: is the plan faithful, and does a split pay?

Two questions, on the benchmark graphs W3 (MLP) and W4 (attention block)
of the shared harness and a branchy graph (4 independent branches of
matrix products):

1. **Faithfulness.** On sim devices the timing model is exact by
   construction, so the plan's predicted makespan should match the measured
   run time. Each graph is planned on ``sim:0`` alone and on ``sim:0`` +
   ``sim:1`` (``auto`` policy, 1 and 2 streams); the table shows predicted,
   measured (median) and their ratio. The sims are set slow enough
   (``--sim-flops``) that their modelled time, not the host's real numpy
   work inside each call, sets the pace.
2. **Heterogeneous split.** The same graphs on ``cpu:0`` + ``sim:0`` +
   ``sim:1`` (``auto`` policy) against each device alone. A sim keeps its
   own clock (``devices.sim``) and runs its kernels' real numpy work on
   this host's cores within it: the host never sees a result before that
   work is done, and on a small host it competes with the cpu device for
   cores. The honest setting is a modelled machine: the host ``cpu:0`` is
   *one core* (BLAS at one thread, ``kernel_threads=1``) and the two sims
   are accelerators whose real work runs on the remaining core(s), each a
   roofline at ``--split-share`` (default 0.35) of one core's measured
   matmul speed and elementwise memory bandwidth, so both sims' real work
   fits in their modelled time. The table gives the measured makespan of
   each device alone and of the split, the split's predicted makespan,
   best single over split, and, as a reference line and *not* a device of
   the modelled machine, ``cpu:0`` with every core (BLAS at
   ``--host-threads``, default 2).

Runs use ``run_sync`` on a planned executor with the parameters declared at
creation (copied to devices once); every output is checked against the cpu
run.

    .venv/bin/python bench/bench_split.py              # ~1-2 min
    .venv/bin/python bench/bench_split.py --json out.json --runs 9
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import threadpoolctl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_executor import DEFAULT_PEERS_DIR, load_harness, to_asyncrt  # noqa: E402

from asyncrt import Module, graph_executor  # noqa: E402
from asyncrt.graph import Graph, GraphBuilder  # noqa: E402
from devices import Device, get_api, sim  # noqa: E402
from devices.sim import SimConfig  # noqa: E402
from scheduler.cost import AnalyticCostModel, start_latency  # noqa: E402
from scheduler.dag import GraphSpec, make_dag  # noqa: E402

Workload = tuple[Graph, Module | None, dict[str, Any], dict[str, Any]]


def branchy(batch: int = 128, width: int = 512, branches: int = 4) -> Workload:
    """x -> branches x (matmul, tanh, matmul, relu) -> sum."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", shape=(batch, width), dtype="float32")
    params: dict[str, Any] = {}
    ends = []
    for i in range(branches):
        for tag in "ab":
            params[f"w{i}{tag}"] = (
                rng.standard_normal((width, width)).astype(np.float32) / width**0.5
            )
        w1 = b.param(f"w{i}a", shape=(width, width), dtype="float32")
        w2 = b.param(f"w{i}b", shape=(width, width), dtype="float32")
        shape = (batch, width)
        h = b.op("matmul", x, w1, shape=shape, dtype="float32", name=f"mm{i}a")
        h = b.op("tanh", h, shape=shape, dtype="float32", name=f"tanh{i}")
        h = b.op("matmul", h, w2, shape=shape, dtype="float32", name=f"mm{i}b")
        ends.append(b.op("relu", h, shape=shape, dtype="float32", name=f"relu{i}"))
    b.output(b.op("sum", *ends, shape=(batch, width), dtype="float32", name="join"))
    inputs = {"x": rng.standard_normal((batch, width)).astype(np.float32)}
    return b.build(), None, params, inputs


def harness(name: str, peers_dir: Path) -> Workload:
    _, workloads = load_harness(peers_dir)
    wl = workloads.build(name)
    graph, lib, params = to_asyncrt(wl, workloads)
    return graph, lib, params, dict(wl.inputs)


def measure(
    work: Workload,
    devices: list[str],
    policy: str,
    streams: int,
    runs: int,
    kernel_threads: int | str = "auto",
) -> tuple[float, float, list[np.ndarray[Any, Any]], str]:
    """(predicted, measured median seconds, outputs, placement summary)."""
    graph, lib, params, inputs = work
    with graph_executor.create(
        graph,
        lib,
        devices,
        policy=policy,
        max_streams=streams,
        params=params,
        kernel_threads=kernel_threads,
    ) as ex:
        outputs = ex.run_sync(**inputs)  # warm-up (and the answer)
        assert outputs is not None
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            ex.run_sync(**inputs)
            times.append(time.perf_counter() - start)
        counts: dict[str, int] = {}
        for nid, device in ex.plan.placement.items():
            if ex.graph.nodes[nid].op != "null":
                counts[str(device)] = counts.get(str(device), 0) + 1
        where = " ".join(f"{d}:{n}" for d, n in sorted(counts.items()))
        return (
            ex.plan.makespan,
            statistics.median(times),
            [o.numpy() for o in outputs],
            where,
        )


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """The modelled machine of part 2: the cpu streams' threads on the first
    core this process may use, the sim streams' on the rest (other threads,
    the event loop's among them, stay free); all back on every core
    afterwards.

    Without it the sims' threads, waking from their modelled sleeps, preempt
    the cpu stream's thread mid-kernel (the scheduler favours threads that
    slept), and a cpu matmul that takes 0.7 ms alone takes 1.5-2.3 ms.
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("part 2 needs at least 2 cores")
    threads = [
        t
        for t in threading.enumerate()
        if t.native_id is not None
        and t.name.startswith(("asyncrt-cpu:", "asyncrt-sim:"))
    ]
    for thread in threads:
        host = thread.name.startswith("asyncrt-cpu:")
        os.sched_setaffinity(thread.native_id or 0, cores[:1] if host else cores[1:])
    try:
        yield
    finally:
        for thread in threads:
            if thread.is_alive():
                os.sched_setaffinity(thread.native_id or 0, cores)


def same(a: list[np.ndarray[Any, Any]], b: list[np.ndarray[Any, Any]]) -> bool:
    return all(
        float(np.max(np.abs(x - y))) <= 1e-4 * max(float(np.max(np.abs(y))), 1e-30)
        for x, y in zip(a, b, strict=True)
    )


def interleaved(
    work: Workload, setups: dict[str, list[str]], runs: int
) -> dict[str, tuple[float, float, list[np.ndarray[Any, Any]], str, float]]:
    """Each setup's (predicted, measured median seconds, outputs, placement,
    the predicted start of its streams),
    BLAS at one thread and the streams :func:`pinned`: all executors open at
    once and run in turn, ``runs`` rounds, so a drift of this shared host
    touches them alike. A setup with one device uses ``single``, several
    ``auto``."""
    graph, lib, params, inputs = work
    with contextlib.ExitStack() as stack:
        executors = {
            name: stack.enter_context(
                graph_executor.create(
                    graph,
                    lib,
                    devices,
                    policy="single" if len(devices) == 1 else "auto",
                    params=params,
                    kernel_threads=1,
                )
            )
            for name, devices in setups.items()
        }
        outputs = {name: ex.run_sync(**inputs) for name, ex in executors.items()}
        times: dict[str, list[float]] = {name: [] for name in executors}
        with pinned():
            for ex in executors.values():
                ex.run_sync(**inputs)
            names = list(executors)
            for round_ in range(runs):
                # Each round starts with the next setup: none always runs
                # right after the same other one (the sims' runs leave the
                # caches holding their own copies of the weights).
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    ex = executors[name]
                    start = time.perf_counter()
                    ex.run_sync(**inputs)
                    times[name].append(time.perf_counter() - start)
        result = {}
        for name, ex in executors.items():
            counts: dict[str, int] = {}
            for nid, device in ex.plan.placement.items():
                if ex.graph.nodes[nid].op != "null":
                    counts[str(device)] = counts.get(str(device), 0) + 1
            result[name] = (
                ex.plan.makespan,
                statistics.median(times[name]),
                [o.numpy() for o in outputs[name] or ()],
                " ".join(f"{d}:{n}" for d, n in sorted(counts.items())),
                start_latency(_figures(ex.plan.speeds), ex.plan),
            )
        return result


def _figures(speeds: Any) -> AnalyticCostModel:
    """A cost model of just a plan's figures (what its start is read from)."""
    return AnalyticCostModel(make_dag([], GraphSpec((), (), ())), speeds)


def split(works: dict[str, Workload], share: float, runs: int) -> list[dict[str, Any]]:
    """Part 2, with BLAS already limited to one thread: each graph on each
    device alone and split over all three (``auto``), interleaved."""
    attrs = get_api("cpu").attributes(Device("cpu", 0))
    flops, memory = float(attrs["flops"]), float(attrs["memory_bandwidth"])
    print(
        f"\n2. split: cpu:0 = one core (measured {flops:.3g} FLOP/s, "
        f"{memory:.3g} B/s elementwise, {attrs['launch_overhead'] * 1e6:.1f} us "
        f"per call, {attrs['sync_latency'] * 1e6:.0f} us a wake-up on an "
        f"event)\n   + sim:0, sim:1, each a roofline at {share:g} of that "
        f"({share * flops:.3g} FLOP/s, {share * memory:.3g} B/s); "
        f"median of {runs} interleaved rounds"
    )
    config = SimConfig(flops=share * flops, memory_bandwidth=share * memory)
    sim.configure(2, [config, config])
    print(
        f"{'graph':8} {'cpu:0':>8} {'sim:0':>8} {'sim:1':>8} {'split':>8} "
        f"{'best/split':>10} {'pred split':>10} {'meas/pred':>9} "
        f"{'start':>6} {'pred cpu:0':>10}  placement"
    )
    setups = {
        "cpu:0": ["cpu:0"],
        "sim:0": ["sim:0"],
        "sim:1": ["sim:1"],
        "split": ["cpu:0", "sim:0", "sim:1"],
    }
    rows = []
    for name, work in works.items():
        got = interleaved(work, setups, runs)
        reference = got["cpu:0"][2]
        for setup, (_, _, outputs, _, _) in got.items():
            if not same(outputs, reference):
                raise SystemExit(f"{name}: {setup} outputs differ from the cpu's")
        singles = {d: got[d][1] for d in ("cpu:0", "sim:0", "sim:1")}
        predicted, measured, _, where, start = got["split"]
        best = min(singles.values())
        print(
            f"{name:8} {singles['cpu:0'] * 1e3:8.2f} {singles['sim:0'] * 1e3:8.2f} "
            f"{singles['sim:1'] * 1e3:8.2f} {measured * 1e3:8.2f} "
            f"{best / measured:10.2f} {predicted * 1e3:10.2f} "
            f"{measured / predicted:9.3f} {start * 1e3:6.2f} "
            f"{got['cpu:0'][0] * 1e3:10.2f}  {where}"
        )
        rows.append(
            dict(
                graph=name,
                singles_s=singles,
                predicted_singles_s={d: got[d][0] for d in singles},
                split_s=measured,
                predicted_split_s=predicted,
                speedup_vs_best_single=best / measured,
                measured_over_predicted=measured / predicted,
                predicted_start_s=start,
                placement=where,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sim-flops", type=float, default=2e9)
    parser.add_argument(
        "--split-share",
        type=float,
        default=0.35,
        help="each sim's speed in the split, as a share of one host core's",
    )
    parser.add_argument(
        "--host-threads",
        type=int,
        default=2,
        help="BLAS threads of the reference line (cpu:0 with every core)",
    )
    parser.add_argument(
        "--parts", default="12", help="which parts to run: 1, 2 or 12 (default)"
    )
    parser.add_argument("--json", help="write the results here")
    a = parser.parse_args()
    peers_dir = Path(a.peers_dir)
    works = {
        "W3": harness("W3", peers_dir),
        "W4": harness("W4", peers_dir),
        "branchy": branchy(),
    }
    results: dict[str, Any] = {"faithful": [], "split": [], "reference_host": []}

    if "1" in a.parts:
        faithful(works, a.sim_flops, a.runs, results)
    if "2" in a.parts:
        split_and_reference(works, a.split_share, a.host_threads, a.runs, results)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


def faithful(
    works: dict[str, Workload], sim_flops: float, runs: int, results: dict[str, Any]
) -> None:
    """Part 1: predicted against measured makespans on sims alone."""
    print(f"1. faithfulness: sim:0 {sim_flops:.3g} FLOP/s, sim:1 half that")
    sim.configure(2, [SimConfig(flops=sim_flops), SimConfig(flops=sim_flops / 2)])
    print(
        f"{'graph':8} {'devices':14} {'str':>3} {'predicted ms':>12} "
        f"{'measured ms':>11} {'ratio':>6}  placement"
    )
    for name, work in works.items():
        for devices, policy, streams in (
            (["sim:0"], "single", 1),
            (["sim:0", "sim:1"], "auto", 1),
            (["sim:0", "sim:1"], "auto", 2),
        ):
            predicted, measured, _, where = measure(
                work, devices, policy, streams, runs
            )
            ratio = measured / predicted
            print(
                f"{name:8} {'+'.join(devices):14} {streams:3} "
                f"{predicted * 1e3:12.2f} {measured * 1e3:11.2f} {ratio:6.3f}  {where}"
            )
            results["faithful"].append(
                dict(
                    graph=name,
                    devices=devices,
                    streams=streams,
                    predicted_s=predicted,
                    measured_s=measured,
                    ratio=ratio,
                )
            )


def split_and_reference(
    works: dict[str, Workload],
    share: float,
    threads: int,
    runs: int,
    results: dict[str, Any],
) -> None:
    """Part 2 on the modelled machine, then the reference line."""
    with threadpoolctl.threadpool_limits(1):  # cpu:0 is one core
        results["split"] = split(works, share, runs)
    with threadpoolctl.threadpool_limits(threads):
        print(f"reference: cpu:0 with BLAS at {threads} threads")
        for name, work in works.items():
            predicted, measured, _, _ = measure(
                work, ["cpu:0"], "single", 1, runs, kernel_threads=threads
            )
            print(
                f"{name:8} cpu:0 x{threads} threads {measured * 1e3:8.2f} ms "
                f"(predicted {predicted * 1e3:.2f})"
            )
            results["reference_host"].append(
                dict(
                    graph=name,
                    threads=threads,
                    measured_s=measured,
                    predicted_s=predicted,
                )
            )


if __name__ == "__main__":
    main()
