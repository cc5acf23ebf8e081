"""Winograd's 3 x 3 convolutions off, F(2 x 2) only, and as bound by
default (F(4 x 4) where it applies), interleaved in one process.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_winograd.py \\
        --model bench/models/resnet18.onnx --runs 60

Three executors of the same model (one bound with
:mod:`asyncrt.ops._winograd` refusing every convolution, so they take
im2col; one with F(4 x 4, 3 x 3) refused; the default one), called in turn
``--runs`` times each: load on the machine falls on all alike. Prints each
one's median and tenth percentile, its ratio to im2col's, and the largest
difference between its outputs and im2col's (relative to the largest
output).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnx

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
from asyncrt.ops import _winograd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench/models/resnet18.onnx")
    ap.add_argument("--runs", type=int, default=60)
    a = ap.parse_args()
    model = onnx.load(a.model)
    graph, params = from_onnx(model)
    rng = np.random.default_rng(0)
    feed = {}
    for value in model.graph.input:
        if value.name in params:
            continue
        dims = value.type.tensor_type.shape.dim
        shape = [d.dim_value or 1 for d in dims]
        feed[value.name] = rng.standard_normal(shape).astype(np.float32)
    executors = {}
    outputs = {}
    configurations = (
        ("im2col", {"MIN_CHANNELS": 1 << 30}),
        ("F(2x2)", {"MIN_TILES_4": 1 << 30}),
        ("default", {}),
    )
    for name, settings in configurations:
        saved = {key: getattr(_winograd, key) for key in settings}
        for key, value in settings.items():  # read when kernels are bound
            setattr(_winograd, key, value)
        try:
            executor = graph_executor.create(graph, None, "cpu", params=params)
            outputs[name] = [np.asarray(o) for o in executor.run_sync(**feed) or []]
        finally:
            for key, value in saved.items():
                setattr(_winograd, key, value)
        executors[name] = executor
    times: dict[str, list[float]] = {name: [] for name in executors}
    for _ in range(a.runs):
        for name, executor in executors.items():
            start = time.perf_counter()
            executor.run_sync(**feed)
            times[name].append(time.perf_counter() - start)
    medians = {}
    for name, spans in times.items():
        spans.sort()
        medians[name] = spans[len(spans) // 2]
        error = max(
            float(np.abs(o - i).max()) / max(float(np.abs(i).max()), 1e-30)
            for o, i in zip(outputs[name], outputs["im2col"], strict=True)
        )
        print(
            f"{name:8s} median {medians[name] * 1e3:8.2f} ms"
            f"  p10 {spans[len(spans) // 10] * 1e3:8.2f} ms"
            f"  / im2col {medians[name] / medians['im2col']:.3f}"
            f"  (outputs differ from im2col's by {error:.1e} of the largest)"
        )
    for executor in executors.values():
        executor.close()


if __name__ == "__main__":
    main()
