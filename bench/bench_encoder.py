"""The MiniLM-size BERT encoder (``tests/asyncrt/frontend/symbolic_models.py``,
``bert_encoder(BertConfig())``) at a few batch x sequence shapes: asyncrt
with and without the import-time epilogue fusions against ONNX Runtime, in
one process, rounds interleaved.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_encoder.py \\
        --shapes 2x64,32x16 --rounds 5

Runners: ``ort`` (CPU provider, default threads), ``asyncrt`` (the default
executor), ``asyncrt-noepi`` (the default executor over an import without
:mod:`asyncrt.frontend._epilogue`'s fusions: main before them),
``asyncrt-fused`` (``fuse=True``). Each round times ``--runs`` calls of
every runner in turn (median); the best round's median is reported, with
its ratio to ``ort``. Outputs are checked against ONNX Runtime's (1e-4 of
the largest magnitude) before timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort

from asyncrt import graph_executor
from asyncrt.frontend import _rewrite, from_onnx
from tests.asyncrt.frontend.symbolic_models import (
    BertConfig,
    bert_encoder,
    bert_feed,
)


def _import(model: Any, epilogues: bool) -> tuple[Any, Any]:
    if epilogues:
        return from_onnx(model)
    saved = _rewrite.fuse_epilogues
    _rewrite.fuse_epilogues = lambda graph, const, opset: 0  # type: ignore[assignment]
    try:
        return from_onnx(model)
    finally:
        _rewrite.fuse_epilogues = saved


def _median_ms(call: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x64,32x16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    model = bert_encoder(BertConfig())
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    plain, plain_params = _import(model, epilogues=False)
    graph, params = _import(model, epilogues=True)
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        feed = bert_feed(batch, seq, BertConfig(), 0)
        ref = session.run(None, feed)
        executors = {
            "asyncrt": graph_executor.create(graph, params=params),
            "asyncrt-noepi": graph_executor.create(plain, params=plain_params),
            "asyncrt-fused": graph_executor.create(graph, params=params, fuse=True),
        }
        runners: dict[str, Callable[[], Any]] = {
            "ort": lambda feed=feed: session.run(None, feed)
        }
        for name, ex in executors.items():
            outs = ex.run_sync(**feed)
            for got, want in zip(outs, ref, strict=True):
                scale = float(np.abs(want).max()) or 1.0
                error = float(np.abs(got.numpy() - want).max()) / scale
                if error > 1e-4:
                    raise SystemExit(f"{name} at {shape}: error {error:.2e}")
            runners[name] = lambda ex=ex, feed=feed: ex.run_sync(**feed)
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, call in runners.items():
                call()
                got = _median_ms(call, args.runs)
                best[name] = min(best.get(name, got), got)
        for ex in executors.values():
            ex.close()
        base = best["ort"]
        line = "  ".join(f"{k} {v:.1f} ms ({v / base:.2f}x)" for k, v in best.items())
        print(f"{shape}: {line}", flush=True)


if __name__ == "__main__":
    main()
