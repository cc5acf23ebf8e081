"""Arena size vs lower bound vs TVM's own plan, on every real TVM graph.

    python bench/bench_storage.py [--alignment 1]

TVM's plan bytes are computed as ``tests/data/tvm-graphs/SOURCES.md``
describes: per storage id, the largest tvm_op entry assigned to it, summed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from asyncrt.graph import load_graph, to_dag
from scheduler.liveness import compute_liveness

GRAPHS = Path(__file__).resolve().parents[1] / "tests" / "data" / "tvm-graphs"


def tvm_plan_bytes(graph) -> int:  # type: ignore[no-untyped-def]
    largest: dict[int, int] = {}
    for nid, node in enumerate(graph.nodes):
        if node.is_null:
            continue
        for index in range(node.num_outputs):
            eid = graph.entry_id(nid, index)
            size = graph.tensor(eid).nbytes
            sid = graph.storage_id[eid]
            largest[sid] = max(largest.get(sid, 0), size)
    return sum(largest.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alignment", type=int, default=1)
    a = ap.parse_args()
    print(
        "| graph | nodes | lower bound | asyncrt arena | arena / bound | TVM plan | "
        "asyncrt / TVM |"
    )
    print("|---|---|---|---|---|---|---|")
    for path in sorted(GRAPHS.glob("*.json")):
        graph = load_graph(path)
        plan = compute_liveness(to_dag(graph), alignment=a.alignment).plan()
        tvm = tvm_plan_bytes(graph)
        print(
            f"| {path.stem[:44]} | {len(graph.nodes)} | {plan.lower_bound:,} | "
            f"{plan.size:,} | {plan.ratio:.3f} | {tvm:,} | {plan.size / tvm:.3f} |"
        )


if __name__ == "__main__":
    main()
