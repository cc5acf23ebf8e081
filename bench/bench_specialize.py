"""One import for every input shape: what a new shape signature costs.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_specialize.py \\
        --json bench/results/specialize.json

The model is the BERT-style sentence encoder of
``tests/asyncrt/frontend/symbolic_models.py`` at MiniLM-L6 size (6 layers,
width 384, 12 heads, vocabulary 30522: 86 MB of float32 weights), with
symbolic ``batch`` and ``sequence``, as ``torch.onnx.export`` writes a
Hugging Face ``BertModel`` with dynamic axes. Per shape, in one process:

* ``signature``: :meth:`SymbolicGraph.signature` (every request pays it),
  median of ``--sig-runs`` calls, in microseconds;
* ``specialize``: :meth:`SymbolicGraph.specialize` for that shape (what a
  new signature pays in the frontend), median (and min) of ``--repeats``;
* ``create``: ``graph_executor.create`` of the specialization (the
  executor's planning and first context), median of ``--repeats``;
* ``first`` / ``steady``: the first run on each new executor (median of
  ``--repeats``) and the median steady run (``run_sync``);
* ``ort first`` / ``ort steady``: ONNX Runtime's first run of that shape on
  one warm ``InferenceSession`` and its median steady run;
* ``today``: the path before symbolic graphs, per new shape:
  ``from_onnx(model, shape_dict)`` + ``graph_executor.create`` (median of
  two).

``new - steady`` is ``specialize + create + first - steady``: what the first
request of a new signature costs over the steady latency (the issue's target:
at most 100 ms at batch 2, sequence 64). ``--profile`` shows where a
specialization's time goes (cProfile's cumulative shares; cProfile inflates
small calls, so read them as proportions).

Memory (``--memory``, each in its own child process, the model read from an
``.onnx`` file): the RSS after ``from_onnx`` and the peak (``ru_maxrss``),
above a child that only imported the libraries, for the static import
(``from_onnx(path, shape_dict)``, as before), the symbolic import
(``from_onnx(path)``), and ONNX Runtime (``InferenceSession(path)`` and
one run at batch 2, sequence 64).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

MARK = "@@SPECIALIZE@@"
DEFAULT_SHAPES = "1x16,2x64,2x65,4x32,8x128,1x128"


def median_seconds(fn: Callable[[], Any], runs: int) -> float:
    """The median wall time of ``runs`` calls of ``fn``, seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _shapes(text: str) -> list[tuple[int, int]]:
    return [
        (int(b), int(s))
        for b, s in (item.split("x") for item in text.split(",") if item)
    ]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx
    from asyncrt.graph import SymbolicGraph
    from tests.asyncrt.frontend.symbolic_models import (
        BertConfig,
        bert_encoder,
        bert_feed,
    )

    config = BertConfig()
    model = bert_encoder(config)
    options = ort.SessionOptions()
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    start = time.perf_counter()
    graph, params = from_onnx(model)
    import_s = time.perf_counter() - start
    assert isinstance(graph, SymbolicGraph)
    rows = []
    for batch, seq in _shapes(args.shapes):
        feed = bert_feed(batch, seq, config)
        shapes = {name: array.shape for name, array in feed.items()}
        start = time.perf_counter()
        session.run(None, feed)
        ort_first = time.perf_counter() - start
        ort_steady = median_seconds(lambda f=feed: session.run(None, f), args.runs)
        signature = median_seconds(
            lambda s=shapes: graph.signature(s, {}), args.sig_runs
        )
        # A new signature, --repeats times: specialize, create, first run.
        specialize, create, first = [], [], []
        steady = 0.0
        for repeat in range(args.repeats):
            gc.collect()
            start = time.perf_counter()
            spec = graph.specialize(shapes, {})
            specialize.append(time.perf_counter() - start)
            start = time.perf_counter()
            ex = graph_executor.create(
                spec.graph, None, "cpu", params=spec.with_shared(params)
            )
            create.append(time.perf_counter() - start)
            with ex:
                start = time.perf_counter()
                got = ex.run_sync(**feed) or []
                first.append(time.perf_counter() - start)
                if repeat == args.repeats - 1:
                    steady = median_seconds(
                        lambda e=ex, f=feed: e.run_sync(**f), args.runs
                    )
        specialize_s = statistics.median(specialize)
        create_s = statistics.median(create)
        first_s = statistics.median(first)
        want = session.run(None, feed)
        error = max(
            float(np.abs(g.numpy() - w).max() / max(np.abs(w).max(), 1e-30))
            for g, w in zip(got, want, strict=True)
        )

        def today(shapes: Any = shapes) -> None:
            static, static_params = from_onnx(model, shapes)
            graph_executor.create(static, None, "cpu", params=static_params).close()

        today_s = median_seconds(today, 2) if args.today else None
        rows.append(
            {
                "shape": f"{batch}x{seq}",
                "signature_us": signature * 1e6,
                "specialize_ms": specialize_s * 1e3,
                "specialize_min_ms": min(specialize) * 1e3,
                "create_ms": create_s * 1e3,
                "first_ms": first_s * 1e3,
                "steady_ms": steady * 1e3,
                "new_minus_steady_ms": (specialize_s + create_s + first_s - steady)
                * 1e3,
                "ort_first_ms": ort_first * 1e3,
                "ort_steady_ms": ort_steady * 1e3,
                "today_ms": None if today_s is None else today_s * 1e3,
                "nodes": len(spec.graph.nodes),
                "max_rel_error": error,
            }
        )
        print(f"  {batch}x{seq} done", file=sys.stderr)
    profile = None
    if args.profile:
        shapes = {name: (2, 64) for name in graph.inputs}
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(5):
            graph.specialize(shapes, {})
        profiler.disable()
        profile = _shares(pstats.Stats(profiler))
    return {
        "import_s": import_s,
        "rows": rows,
        "profile": profile,
        "cpus": os.cpu_count(),
    }


#: Where a specialization's time goes: (label, function name, file suffix).
_PARTS = (
    ("whole specialization", "specialize", "graph/_symbolic.py"),
    ("node walk (lowering)", "lower", "frontend/_importer.py"),
    ("  shapes in Python", "fast_outputs", "frontend/_shapes.py"),
    ("  shapes by ONNX (fallback)", "infer_outputs", "frontend/_infer.py"),
    ("  folding shape nodes", "_evaluate", "frontend/_importer.py"),
    ("  emitting kernels", "_emit", "frontend/_importer.py"),
    ("graph checks (Graph())", "build", "graph/_builder.py"),
)


def _shares(stats: pstats.Stats) -> list[dict[str, Any]]:
    table = stats.stats  # type: ignore[attr-defined]
    total = None
    out = []
    for label, func, suffix in _PARTS:
        found = [
            (cum, calls)
            for (file, _, name), (_, calls, _, cum, _) in table.items()
            if name == func and file.endswith(suffix)
        ]
        cum = sum(c for c, _ in found)
        calls = sum(n for _, n in found)
        if total is None:
            total = cum or 1.0
        out.append({"part": label, "share": cum / total, "calls": calls // 5})
    return out


# -- memory ---------------------------------------------------------------------


def _status_mb(key: str) -> float:
    """A ``/proc/self/status`` figure (``VmRSS``, ``VmHWM``: the peak) in MB."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _rss_mb() -> float:
    return _status_mb("VmRSS")


def _peak_mb() -> float:
    return _status_mb("VmHWM")


def memory_child(kind: str, path: str) -> dict[str, Any]:
    import numpy as np
    import onnx  # noqa: F401  (the libraries every variant loads)
    import onnxruntime as ort

    import asyncrt.frontend  # noqa: F401
    from tests.asyncrt.frontend.symbolic_models import BertConfig, bert_feed

    gc.collect()
    base = _rss_mb()
    # The peak so far is the imports'; reset it (Linux: write 5 to clear_refs).
    with open("/proc/self/clear_refs", "w") as file:
        file.write("5")
    keep: Any
    if kind == "static":
        from asyncrt.frontend import from_onnx

        keep = from_onnx(path, {n: (2, 64) for n in ("input_ids",)})
    elif kind == "symbolic":
        from asyncrt.frontend import from_onnx

        keep = from_onnx(path)
    elif kind == "ort":
        keep = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        keep.run(None, bert_feed(2, 64, BertConfig()))
    gc.collect()
    after = _rss_mb()
    del keep, np
    return {
        "kind": kind,
        "base_mb": base,
        "after_mb": after - base,
        "peak_mb": _peak_mb() - base,
    }


def measure_memory(timeout: float) -> list[dict[str, Any]]:
    import onnx

    from tests.asyncrt.frontend.symbolic_models import BertConfig, bert_encoder

    results = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bert.onnx")
        onnx.save_model(bert_encoder(BertConfig()), path)
        for kind in ("static", "symbolic", "ort"):
            cmd = [sys.executable, __file__, "--memory-child", kind, path]
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT
            )
            line = next(
                (x for x in done.stdout.splitlines() if x.startswith(MARK)), None
            )
            if line is None:
                tail = done.stderr.strip().splitlines()[-3:]
                results.append({"kind": kind, "error": " | ".join(tail)})
            else:
                results.append(json.loads(line[len(MARK) :]))
    return results


# -- report ---------------------------------------------------------------------


def report(result: dict[str, Any]) -> str:
    lines = [
        f"symbolic import (from_onnx, once): {result['import_s'] * 1e3:.0f} ms",
        "",
        "| shape | signature us | specialize ms (min) | create ms | first ms | "
        "steady ms | new - steady ms | ORT first ms | ORT steady ms | "
        "specialize / ORT steady | today ms | nodes | max rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        today = "-" if r["today_ms"] is None else f"{r['today_ms']:.0f}"
        lines.append(
            f"| {r['shape']} | {r['signature_us']:.1f} | "
            f"{r['specialize_ms']:.1f} ({r['specialize_min_ms']:.1f}) | "
            f"{r['create_ms']:.1f} | {r['first_ms']:.1f} | {r['steady_ms']:.1f} | "
            f"{r['new_minus_steady_ms']:.1f} | {r['ort_first_ms']:.1f} | "
            f"{r['ort_steady_ms']:.1f} | "
            f"{r['specialize_ms'] / r['ort_steady_ms']:.2f} | {today} | "
            f"{r['nodes']} | {r['max_rel_error']:.1e} |"
        )
    if result.get("profile"):
        lines += ["", "| where a specialization's time goes (2x64) | share | calls |"]
        lines.append("|---|---|---|")
        for p in result["profile"]:
            lines.append(f"| {p['part']} | {p['share']:.0%} | {p['calls']} |")
    if result.get("memory"):
        lines += [
            "",
            "| memory (BERT, 86 MB of weights) | RSS after MB | peak MB |",
            "|---|---|---|",
        ]
        names = {
            "static": "from_onnx(path, shape_dict): static import",
            "symbolic": "from_onnx(path): symbolic import",
            "ort": "ONNX Runtime: InferenceSession + one run",
        }
        for m in result["memory"]:
            if "error" in m:
                lines.append(f"| {names[m['kind']]} | failed: {m['error']} | |")
            else:
                lines.append(
                    f"| {names[m['kind']]} | {m['after_mb']:.0f} | {m['peak_mb']:.0f} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="BxS,BxS,...")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--sig-runs", type=int, default=2000)
    parser.add_argument("--no-today", dest="today", action="store_false")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(MARK + json.dumps(memory_child(*args.memory_child)))
        return
    result = measure(args)
    if args.memory:
        result["memory"] = measure_memory(timeout=600)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
