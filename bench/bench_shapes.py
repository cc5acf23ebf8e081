"""One executor for every input shape, against ONNX Runtime in the same run.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_shapes.py \\
        --json bench/results/shapes.json

The model is the BERT-style sentence encoder of
``tests/asyncrt/frontend/symbolic_models.py`` at MiniLM-L6 size (86 MB of
weights) with symbolic ``batch`` and ``sequence``. One symbolic executor
(``from_onnx(model)`` then ``graph_executor.create``) serves every shape;
first a warm-up signature (``--warm-up``, reported on its own: the
process's first run imports what the kernels use), then per shape, in one
process, rounds interleaved:

* ``new``: the first ``await ex.run(**feed)`` of that signature on the
  symbolic executor (specialization, planning, the first context and the
  run), and ``new - steady``: what a new signature costs over the steady
  latency (the issue's target: at most 100 ms at batch 2, sequence 64);
* ``cached``: the median of later runs of that signature on the same
  executor; ``static``: the median on an executor made for that shape alone
  (``from_onnx(model, shape_dict)``), runs interleaved with the cached ones;
  ``cached / static`` (target: within 5 %);
* ``ort``: ONNX Runtime's median on one ``InferenceSession`` at that shape;
* outputs of both asyncrt executors against ONNX Runtime's (max |d|).

``--memory``: in child processes, the peak RSS (``VmHWM``) above a child
that only imported the libraries, of (a) asyncrt: ``from_onnx(path)``,
``create``, then 64 concurrent callers for ``--memory-rounds`` rounds at
batch 1, sequence 16 with ``await ex.run``, with numba and without it
(``ASYNCRT_JIT=0``: what ``pip install asyncrt`` without the ``jit`` extra
runs); (b) ONNX Runtime: an
``InferenceSession(path)`` and the same 64 callers through
``loop.run_in_executor`` (the default thread pool), in the same loop shape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

DEFAULT_SHAPES = "1x16,2x64,2x65,4x32,8x128,1x128"


def _model() -> Any:
    from tests.asyncrt.frontend.symbolic_models import BertConfig, bert_encoder

    return bert_encoder(BertConfig())


def _feed(batch: int, seq: int, seed: int = 0) -> dict[str, Any]:
    from tests.asyncrt.frontend.symbolic_models import BertConfig, bert_feed

    return bert_feed(batch, seq, BertConfig(), seed)


async def _median(ex: Any, feed: dict[str, Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await ex.run(**feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def shapes(args: argparse.Namespace) -> list[dict[str, Any]]:
    import numpy as np
    import onnxruntime as ort

    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx

    model = _model()
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    graph, params = from_onnx(model)
    rows = []
    async with graph_executor.create(graph, params=params) as ex:
        # The process's first run also imports what the kernels use (numba,
        # scipy.special, numexpr: several hundred ms, once per process, as
        # ONNX Runtime pays its set-up once per session): timed on its own.
        warm = _feed(*(int(v) for v in args.warm_up.split("x")))
        start = time.perf_counter()
        await ex.run(**warm)
        first = time.perf_counter() - start
        start = time.perf_counter()
        await ex.run(**warm)
        print(
            f"process warm-up: first run of the first signature ({args.warm_up}) "
            f"{1e3 * first:.1f} ms, its second run "
            f"{1e3 * (time.perf_counter() - start):.1f} ms"
        )
        for text in args.shapes.split(","):
            batch, seq = (int(v) for v in text.split("x"))
            feed = _feed(batch, seq)
            start = time.perf_counter()
            ours = await ex.run(**feed)
            new = time.perf_counter() - start
            static_graph, static_params = from_onnx(
                model, {k: v.shape for k, v in feed.items()}
            )
            static = graph_executor.create(static_graph, params=static_params)
            try:
                theirs = session.run(None, feed)
                mine = await static.run(**feed)
                cached_t, static_t, ort_t = [], [], []
                for _ in range(args.rounds):  # interleaved: drift hits all alike
                    cached_t.append(await _median(ex, feed, args.runs))
                    static_t.append(await _median(static, feed, args.runs))
                    start = time.perf_counter()
                    for _ in range(args.runs):
                        session.run(None, feed)
                    ort_t.append((time.perf_counter() - start) / args.runs)
            finally:
                static.close()
            cached, fixed, peer = min(cached_t), min(static_t), min(ort_t)
            error = max(
                float(np.max(np.abs(a.numpy() - b)))
                for a, b in zip([*ours, *mine], [*theirs, *theirs], strict=True)
            )
            rows.append(
                {
                    "shape": text,
                    "new_ms": new * 1e3,
                    "new_minus_steady_ms": (new - cached) * 1e3,
                    "cached_ms": cached * 1e3,
                    "static_ms": fixed * 1e3,
                    "cached_over_static": cached / fixed,
                    "ort_ms": peer * 1e3,
                    "cached_over_ort": cached / peer,
                    "max_abs_diff_vs_ort": error,
                }
            )
        stats = ex.plan_cache_stats()
    print(
        "| shape | new ms | new - steady ms | cached ms | static ms | "
        "cached/static | ORT ms | cached/ORT | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['shape']} | {r['new_ms']:.1f} | {r['new_minus_steady_ms']:.1f} | "
            f"{r['cached_ms']:.2f} | {r['static_ms']:.2f} | "
            f"{r['cached_over_static']:.3f} | {r['ort_ms']:.2f} | "
            f"{r['cached_over_ort']:.2f} | {r['max_abs_diff_vs_ort']:.1e} |"
        )
    print(f"\nplan cache: {stats}")
    return rows


def memory_child(kind: str, path: str, rounds: int) -> None:
    import numpy as np  # noqa: F401 - the baseline imports the same libraries
    import onnxruntime as ort

    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx

    feed = _feed(1, 16)
    callers = 64

    async def serve_asyncrt() -> None:
        graph, params = from_onnx(path)
        async with graph_executor.create(graph, params=params) as ex:
            del params
            for _ in range(rounds):
                await asyncio.gather(*(ex.run(**feed) for _ in range(callers)))

    async def serve_ort() -> None:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        loop = asyncio.get_running_loop()
        for _ in range(rounds):
            await asyncio.gather(
                *(
                    loop.run_in_executor(None, session.run, None, feed)
                    for _ in range(callers)
                )
            )

    if kind == "asyncrt":
        asyncio.run(serve_asyncrt())
    elif kind == "ort":
        asyncio.run(serve_ort())
    print(json.dumps({"maxrss_mb": _peak_rss_mb()}))


def _peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM`` (reset by exec, unlike
    ``ru_maxrss``, which a child inherits from the parent it forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory(args: argparse.Namespace) -> dict[str, float]:
    import onnx

    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "encoder.onnx")
        onnx.save(_model(), path)

        def child(kind: str, jit: str = "1") -> float:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--memory-child",
                    kind,
                    path,
                    str(args.memory_rounds),
                ],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "ASYNCRT_JIT": jit},
            )
            return float(json.loads(out.stdout.strip().splitlines()[-1])["maxrss_mb"])

        base = child("baseline")
        result = {kind: child(kind) - base for kind in ("asyncrt", "ort")}
        # without the compiled engine: what `pip install asyncrt` runs
        result["asyncrt-nojit"] = child("asyncrt", jit="0") - base
    print(
        f"\npeak RSS above the libraries, 64 concurrent callers x "
        f"{args.memory_rounds} rounds: asyncrt {result['asyncrt']:.0f} MB with numba "
        f"({result['asyncrt'] / result['ort']:.2f}x), "
        f"{result['asyncrt-nojit']:.0f} MB without (ASYNCRT_JIT=0, "
        f"{result['asyncrt-nojit'] / result['ort']:.2f}x); ONNX Runtime "
        f"{result['ort']:.0f} MB"
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="BxS,BxS,...")
    ap.add_argument(
        "--warm-up", default="1x4", help="BxS run first, reported apart (imports)"
    )
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--memory-rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        kind, path, rounds = args.memory_child
        memory_child(kind, path, int(rounds))
        return
    result: dict[str, Any] = {"shapes": asyncio.run(shapes(args))}
    if args.memory:
        result["memory_mb"] = memory(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
