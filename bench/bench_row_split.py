"""Row splits of elementwise joins over the cpu streams, measured A/B.

For each workload of the shared harness, three executors are open at once
on ``cpu``: one stream, two streams with every node whole
(``split=False``), and two streams with row splits (the default,
:mod:`scheduler.split`). Their stateful runs (``set_input`` once, then
``run_sync``) are interleaved one by one, ``--runs`` times each, so a
drift of this shared host touches all three alike; the table gives each
one's median and the ratios, and which launches are parts of split nodes.

    PYTHONPATH=. .venv/bin/python bench/bench_row_split.py --workload W2,W3,W4
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

from asyncrt import graph_executor  # noqa: E402

SETUPS = {
    "s1": {"max_streams": 1},
    "s2-whole": {"max_streams": 2, "split": False},
    "s2-split": {"max_streams": 2},
}


def measure(name: str, peers_dir: Path, runs: int) -> dict[str, Any]:
    _, workloads = load_harness(peers_dir)
    wl = workloads.build(name)
    graph, lib, params = to_asyncrt(wl, workloads)
    executors = {
        setup: graph_executor.create(graph, lib, "cpu", params=params, **options)
        for setup, options in SETUPS.items()
    }
    try:
        reference = wl.floor_outputs()
        for ex in executors.values():
            ex.set_input(**wl.inputs)
            ex.run_sync()
            for i, want in enumerate(reference):
                got = ex.get_output(i).numpy()
                scale = max(float(np.max(np.abs(want))), 1e-30)
                assert float(np.max(np.abs(got - want))) / scale <= 1e-4
        split_out = executors["s2-split"].get_output(0).numpy()
        whole_out = executors["s2-whole"].get_output(0).numpy()
        identical = bool(np.array_equal(split_out, whole_out))
        times: dict[str, list[float]] = {setup: [] for setup in executors}
        for _ in range(runs):
            for setup, ex in executors.items():
                start = time.perf_counter()
                ex.run_sync()
                times[setup].append(time.perf_counter() - start)
        medians = {setup: statistics.median(t) for setup, t in times.items()}
        parts = [
            launch.label
            for launch in executors["s2-split"].plan.launches()
            if launch.part is not None
        ]
        return {
            "workload": name,
            "runs": runs,
            "median_s": medians,
            "s1_over_s2_whole": medians["s1"] / medians["s2-whole"],
            "s1_over_s2_split": medians["s1"] / medians["s2-split"],
            "whole_over_split": medians["s2-whole"] / medians["s2-split"],
            "parts": parts,
            "split_equals_whole": identical,
            "times_s": times,
        }
    finally:
        for ex in executors.values():
            ex.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W2", help="comma list of W1..W4")
    parser.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = []
    print(
        f"{'workload':8} {'s1 ms':>8} {'s2 whole':>9} {'s2 split':>9} "
        f"{'s1/whole':>9} {'s1/split':>9} {'whole/split':>11}  parts"
    )
    for name in args.workload.split(","):
        r = measure(name, Path(args.peers_dir), args.runs)
        results.append(r)
        m = r["median_s"]
        print(
            f"{name:8} {m['s1'] * 1e3:8.2f} {m['s2-whole'] * 1e3:9.2f} "
            f"{m['s2-split'] * 1e3:9.2f} {r['s1_over_s2_whole']:9.3f} "
            f"{r['s1_over_s2_split']:9.3f} {r['whole_over_split']:11.3f}  "
            f"{' '.join(r['parts']) or '-'}"
            f"{'' if r['split_equals_whole'] else '  (outputs differ!)'}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
