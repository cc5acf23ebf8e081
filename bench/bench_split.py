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
2. **Heterogeneous split.** The same graphs on ``cpu`` + ``sim:0`` +
   ``sim:1`` with sim speeds of the order of this host's (so a split can
   pay), against each device alone: measured makespan of the split over
   the best single device.

Runs use ``run_sync`` on a planned executor with the parameters declared at
creation (copied to devices once); every output is checked against the cpu
run.

    .venv/bin/python bench/bench_split.py              # ~1-2 min
    .venv/bin/python bench/bench_split.py --json out.json --runs 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_executor import DEFAULT_PEERS_DIR, load_harness, to_asyncrt  # noqa: E402

from asyncrt import Module, graph_executor  # noqa: E402
from asyncrt.graph import Graph, GraphBuilder  # noqa: E402
from devices import Device, get_api, sim  # noqa: E402
from devices.sim import SimConfig  # noqa: E402

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
    work: Workload, devices: list[str], policy: str, streams: int, runs: int
) -> tuple[float, float, list[np.ndarray[Any, Any]], str]:
    """(predicted, measured median seconds, outputs, placement summary)."""
    graph, lib, params, inputs = work
    with graph_executor.create(
        graph, lib, devices, policy=policy, max_streams=streams, params=params
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


def same(a: list[np.ndarray[Any, Any]], b: list[np.ndarray[Any, Any]]) -> bool:
    return all(
        float(np.max(np.abs(x - y))) <= 1e-4 * max(float(np.max(np.abs(y))), 1e-30)
        for x, y in zip(a, b, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sim-flops", type=float, default=2e9)
    parser.add_argument(
        "--split-flops",
        type=float,
        default=0.0,
        help="sim speed for the split (default: the cpu's)",
    )
    parser.add_argument("--json", help="write the results here")
    a = parser.parse_args()
    peers_dir = Path(a.peers_dir)
    works = {
        "W3": harness("W3", peers_dir),
        "W4": harness("W4", peers_dir),
        "branchy": branchy(),
    }
    results: dict[str, Any] = {"faithful": [], "split": []}

    print(f"1. faithfulness: sim:0 {a.sim_flops:.3g} FLOP/s, sim:1 half that")
    sim.configure(2, [SimConfig(flops=a.sim_flops), SimConfig(flops=a.sim_flops / 2)])
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
                work, devices, policy, streams, a.runs
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

    cpu_flops = float(get_api("cpu").get_attr(Device("cpu", 0), "flops"))
    split_flops = a.split_flops or cpu_flops
    print(
        f"\n2. split: cpu (measured {cpu_flops:.3g} FLOP/s) + sim:0, sim:1 at "
        f"{split_flops:.3g} FLOP/s"
    )
    sim.configure(2, [SimConfig(flops=split_flops), SimConfig(flops=split_flops)])
    print(
        f"{'graph':8} {'cpu':>8} {'sim:0':>8} {'sim:1':>8} {'split':>8} "
        f"{'best/split':>10} {'pred split':>10}  placement"
    )
    for name, work in works.items():
        singles = {}
        reference = None
        for device in ("cpu:0", "sim:0", "sim:1"):
            _, measured, outputs, _ = measure(work, [device], "single", 1, a.runs)
            singles[device] = measured
            if reference is None:
                reference = outputs
        assert reference is not None
        predicted, split, outputs, where = measure(
            work, ["cpu:0", "sim:0", "sim:1"], "auto", 1, a.runs
        )
        if not same(outputs, reference):
            raise SystemExit(f"{name}: split outputs differ from the cpu's")
        best = min(singles.values())
        print(
            f"{name:8} {singles['cpu:0'] * 1e3:8.2f} {singles['sim:0'] * 1e3:8.2f} "
            f"{singles['sim:1'] * 1e3:8.2f} {split * 1e3:8.2f} {best / split:10.2f} "
            f"{predicted * 1e3:10.2f}  {where}"
        )
        results["split"].append(
            dict(
                graph=name,
                singles_s=singles,
                split_s=split,
                speedup_vs_best_single=best / split,
                predicted_split_s=predicted,
            )
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
