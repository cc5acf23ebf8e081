"""Where a model's time goes, asyncrt beside ONNX Runtime, by op.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/compare_ops.py gpt enc-b16

For each model (``bench_models.py``'s names) in one process: the wall
median of a run of each (default settings: every core), then ONNX
Runtime's per-node kernel times (its profiler, summed by op type) beside
asyncrt's (each launch run alone in plan order, ``bench_kernels.profile``,
summed by kernel). The two sides' ops differ (ONNX Runtime fuses
``FastGelu`` and ``SkipLayerNormalization``, asyncrt ``matmul_bias`` and
``scale_where_softmax``), so compare totals and the big rows, not row by
row. ``--top N`` lists asyncrt's N slowest launches too.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _timing import seconds  # noqa: E402
from bench_kernels import profile  # noqa: E402
from bench_models import build_model  # noqa: E402


def _median_ms(fn: Any, runs: int) -> float:
    return 1e3 * seconds(fn, runs)[runs // 2]


def _ort_by_op(model: Any, feed: dict[str, Any], runs: int) -> tuple[float, Any]:
    import onnxruntime as ort

    plain = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    wall = _median_ms(lambda: plain.run(None, feed), runs)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    for _ in range(runs):
        session.run(None, feed)
    with open(session.end_profiling()) as file:
        events = json.load(file)
    by_op: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"] / 1e3 / runs
    return wall, by_op


def compare(name: str, runs: int, top: int) -> None:
    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx

    model, feed = build_model(name)
    # asyncrt first: ONNX Runtime's pool threads spin after its runs, and a
    # session made before would take the cores from asyncrt's measurement
    # (GPT-2: 39 ms instead of 19).
    graph, params = from_onnx(model)
    ex = graph_executor.create(graph, None, "cpu", params=params)
    wall = _median_ms(lambda: ex.run_sync(**feed), runs)
    launches = profile(ex, feed)
    ex.close()
    ort_wall, ort_ops = _ort_by_op(model, feed, runs)
    ours: collections.Counter[str] = collections.Counter()
    for row in launches:
        ours[row["func"].split(".")[0]] += row["median_us"] / 1e3
    print(
        f"\n## {name}: asyncrt {wall:.3f} ms, ONNX Runtime {ort_wall:.3f} ms "
        f"({wall / ort_wall:.2f}x)"
    )
    print(
        f"kernel sums: asyncrt {sum(ours.values()):.3f} ms, "
        f"ONNX Runtime {sum(ort_ops.values()):.3f} ms"
    )
    left = [f"{op} {ms:.3f}" for op, ms in ours.most_common()]
    right = [f"{op} {ms:.3f}" for op, ms in ort_ops.most_common()]
    print(f"| {'asyncrt (ms)':34s} | {'ONNX Runtime (ms)':34s} |")
    for a, b in itertools.zip_longest(left, right, fillvalue=""):
        print(f"| {a:34s} | {b:34s} |")
    for row in sorted(launches, key=lambda r: -r["median_us"])[:top]:
        print(
            f"    {row['node'][:48]:48s} {row['func'].split('.')[0]:22s} "
            f"{row['median_us']:9.1f} us"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--top", type=int, default=0)
    a = parser.parse_args()
    for name in a.models:
        compare(name, a.runs, a.top)


if __name__ == "__main__":
    main()
