"""The models of ``bench_models.py`` on the cpu, one checkout against
another, interleaved: for an A/B of a change on this noisy shared host.

    git worktree add /work/wt-base <commit>
    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_ab.py \\
        --base /work/wt-base --models cnn,enc --rounds 6

Each round runs every (model, checkout) pair in a child process of its own
(``run_sync`` median of at least 200 runs and a second), alternating which
checkout goes first; the table gives every round's median in us and the
ratio of the two checkouts' best medians (above 1: this checkout is faster).
``--options`` passes executor options to both (JSON: ``{"fuse": true,
"kernel_threads": 1}``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from bench_models import build_model
from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
model, feed = build_model(sys.argv[1])
graph, params = from_onnx(model)
options = json.loads(sys.argv[3])
ex = graph_executor.create(graph, None, "cpu", params=params, **options)
for _ in range(50):
    ex.run_sync(**feed)
times = []
start = time.perf_counter()
while len(times) < 200 or time.perf_counter() - start < 1.0:
    t = time.perf_counter()
    ex.run_sync(**feed)
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps(times[len(times) // 2]))
"""


def median_us(tree: Path, model: str, options: str = "{}") -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(HERE), options],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{model} in {tree} failed:\n{done.stderr[-2000:]}")
    return 1e6 * float(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout")
    ap.add_argument("--models", default="cnn,enc")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--options",
        default="{}",
        help='executor options as JSON, e.g. \'{"fuse": true, "kernel_threads": 1}\'',
    )
    a = ap.parse_args()
    trees = {"base": a.base.resolve(), "this": HERE.parent}
    results: dict[tuple[str, str], list[float]] = {}
    for r in range(a.rounds):
        order = list(trees.items())
        for model in a.models.split(","):
            for name, tree in order if r % 2 == 0 else order[::-1]:
                results.setdefault((model, name), []).append(
                    median_us(tree, model, a.options)
                )
    for model in a.models.split(","):
        base, this = results[model, "base"], results[model, "this"]
        print(
            f"{model:9} base {[round(x, 1) for x in base]}  "
            f"this {[round(x, 1) for x in this]}  base/this {min(base) / min(this):.3f}"
        )


if __name__ == "__main__":
    main()
