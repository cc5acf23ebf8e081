"""The kernels of issue 22's missing ops against ONNX Runtime, in one run.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_new_ops.py \\
        --json bench/results/new-ops.json

One-node ONNX models at serving sizes: ConvTranspose (a U-Net's 2x2/2
upsampling, which tiles its output; a DCGAN's 4x4/2 with pads; a grouped
3x3/2 with output_padding; a 1-d one), Resize (nearest and linear 2x
upsampling, cubic, an antialiased linear downscale), GatherND, ScatterND and
ScatterElements. Each runs through ``from_onnx`` and ``run_sync`` on the cpu
device (inputs in, outputs out, as ``InferenceSession.run``) and through
ONNX Runtime's CPU provider with one intra-op thread and with its default,
interleaved in rounds; each figure is the best round's median. The table
gives microseconds per run and asyncrt's time over ONNX Runtime's (below
1: faster). Outputs are checked against ONNX Runtime's first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.asyncrt.ops.single_node import node_model  # noqa: E402


def _cases() -> dict[str, tuple[Any, dict[str, np.ndarray[Any, Any]]]]:
    rng = np.random.default_rng(0)

    def floats(*shape: int) -> np.ndarray[Any, Any]:
        return rng.standard_normal(shape).astype(np.float32)

    def conv_t(x: Any, w: Any, **attrs: Any) -> Any:
        inputs = {"x": x, "w": w, "b": floats(w.shape[1] * attrs.get("group", 1))}
        return node_model("ConvTranspose", inputs, constants=("w", "b"), **attrs), {
            "x": x
        }

    def resize(x: Any, scales: list[float], **attrs: Any) -> Any:
        inputs = {"x": x, "roi": None, "scales": np.array(scales, np.float32)}
        model = node_model("Resize", inputs, constants=("scales",), **attrs)
        return model, {"x": x}

    table = np.arange(64 * 32 * 32, dtype=np.float32).reshape(64, 32, 32)
    rows = np.stack([rng.integers(0, 64, 512), rng.integers(0, 32, 512)], axis=1)
    scatter_data = floats(64, 256)
    return {
        "convT unet 2x2/2 64->32 @64x64": conv_t(
            floats(1, 64, 64, 64), floats(64, 32, 2, 2), strides=[2, 2]
        ),
        "convT dcgan 4x4/2 p1 128->64 @32x32": conv_t(
            floats(1, 128, 32, 32), floats(128, 64, 4, 4), strides=[2, 2], pads=[1] * 4
        ),
        "convT 3x3/2 g4 op1 64->64 @28x28 b4": conv_t(
            floats(4, 64, 28, 28),
            floats(64, 16, 3, 3),
            strides=[2, 2],
            pads=[1] * 4,
            output_padding=[1, 1],
            group=4,
        ),
        "convT 1-d 5/4 32->16 @1024": conv_t(
            floats(2, 32, 1024), floats(32, 16, 5), strides=[4], pads=[2, 2]
        ),
        "resize nearest x2 64@56x56": resize(
            floats(1, 64, 56, 56), [1, 1, 2, 2], mode="nearest"
        ),
        "resize linear x2 3@224x224": resize(
            floats(1, 3, 224, 224), [1, 1, 2, 2], mode="linear"
        ),
        "resize cubic x2 16@64x64": resize(
            floats(1, 16, 64, 64), [1, 1, 2, 2], mode="cubic"
        ),
        "resize linear antialias /3.5 3@448x448": resize(
            floats(1, 3, 448, 448), [1, 1, 0.2857, 0.2857], mode="linear", antialias=1
        ),
        "gathernd 512 rows of 64x32x32": (
            node_model(
                "GatherND", {"t": table, "i": rows}, constants=("t",), batch_dims=0
            ),
            {"i": rows},
        ),
        "scatternd add 512 rows into 64x256": (
            node_model(
                "ScatterND",
                {
                    "d": scatter_data,
                    "i": rows[:, :1],
                    "u": floats(512, 256),
                },
                reduction="add",
            ),
            {"d": scatter_data, "i": rows[:, :1], "u": floats(512, 256)},
        ),
        "scatterelements 64x256 axis 1": (
            node_model(
                "ScatterElements",
                {
                    "d": scatter_data,
                    "i": rng.integers(0, 256, (64, 128)),
                    "u": floats(64, 128),
                },
                axis=1,
            ),
            {
                "d": scatter_data,
                "i": rng.integers(0, 256, (64, 128)),
                "u": floats(64, 128),
            },
        ),
    }


def _median_us(call: Callable[[], Any], min_runs: int, min_time: float) -> float:
    times = []
    started = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - started < min_time:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-runs", type=int, default=20)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--only", help="run the cases whose name has this text")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    import onnxruntime as ort

    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx

    ort.set_default_logger_severity(3)
    results = {}
    for name, (model, feeds) in _cases().items():
        if args.only and args.only not in name:
            continue
        graph, params = from_onnx(model)
        executor = graph_executor.create(graph, None, "cpu", params=params)
        sessions = {}
        for label, threads in (("ort-t1", 1), ("ort-tdef", 0)):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            sessions[label] = ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        (ours,) = executor.run_sync(**feeds) or []
        (theirs,) = sessions["ort-t1"].run(None, feeds)
        scale = float(np.abs(theirs).max()) or 1.0
        error = float(np.abs(ours.numpy() - theirs).max()) / scale
        if error > 1e-4:
            raise SystemExit(f"{name}: asyncrt differs from ONNX Runtime by {error}")
        runners: dict[str, Callable[[], Any]] = {
            "asyncrt": lambda ex=executor, f=feeds: ex.run_sync(**f),
            **{
                label: (lambda s=session, f=feeds: s.run(None, f))
                for label, session in sessions.items()
            },
        }
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for label, call in runners.items():
                call()  # warm
                figure = _median_us(call, args.min_runs, args.min_time)
                best[label] = min(best.get(label, figure), figure)
        executor.close()
        results[name] = best
        sys.stderr.write(f"{name}: {best}\n")
    lines = [
        "| case | asyncrt us | ORT 1 thread us | ORT default us | vs ORT 1t | "
        "vs ORT default |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, best in results.items():
        lines.append(
            f"| {name} | {best['asyncrt']:.0f} | {best['ort-t1']:.0f} | "
            f"{best['ort-tdef']:.0f} | {best['asyncrt'] / best['ort-t1']:.2f} | "
            f"{best['asyncrt'] / best['ort-tdef']:.2f} |"
        )
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
