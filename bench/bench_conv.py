"""Every convolution of the exported CNNs against the machine's sgemm peak.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_conv.py \\
        --models mnv3,resnet18 > bench/results/conv-gflops.md

For each ``Conv`` node of the models ``export_models.py`` makes (shapes
from ONNX shape inference, weights and bias at their shapes, random
values), the library's conv kernel is configured with the node's
attributes, bound to its arrays as the dispatcher binds it, and timed
alone (median of ``--runs``), next to the sgemm peak measured in the same
run (numpy's matmul, best of three shapes) and the floor of
``bench_ops.py`` (the larger of bytes at the measured bandwidth and flops
at the peak). One thread by default (``threadpoolctl``), as the floors are
one core's; ``--threads 2`` measures with two. Nodes of the same shape
are timed once and counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_ops import Case, _kernel, _rand, _timed, machine  # noqa: E402

F32 = np.float32


def _dims(info: Any) -> tuple[int, ...]:
    return tuple(d.dim_value for d in info.type.tensor_type.shape.dim)


def conv_cases(name: str) -> list[tuple[Case, int]]:
    """Model ``name``'s convolutions, one case per distinct configuration,
    each with how many nodes share it."""
    import export_models
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.shape_inference.infer_shapes(export_models.load(name))
    graph = model.graph
    shapes = {i.name: _dims(i) for i in (*graph.input, *graph.value_info)}
    shapes.update({i.name: _dims(i) for i in graph.output})
    weights = {t.name: numpy_helper.to_array(t).shape for t in graph.initializer}
    found: dict[str, tuple[Case, int]] = {}
    for node in graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x_shape, w_shape = shapes[node.input[0]], weights[node.input[1]]
        out_shape = shapes[node.output[0]]
        rank = len(w_shape) - 2
        config = {
            "kernel_shape": list(w_shape[2:]),
            "strides": list(attrs.get("strides", [1] * rank)),
            "dilations": list(attrs.get("dilations", [1] * rank)),
            "pads": list(attrs.get("pads", [0] * 2 * rank)),
            "auto_pad": "NOTSET",
            "group": int(attrs.get("group", 1)),
            "bias": len(node.input) > 2,
        }
        key = repr((x_shape, w_shape, config))
        if key in found:
            case, count = found[key]
            found[key] = (case, count + 1)
            continue
        inputs = [_rand(*x_shape), _rand(*w_shape, low=-0.2, high=0.2)]
        if config["bias"]:
            inputs.append(_rand(w_shape[0]))
        out = np.empty(out_shape, F32)
        flops = 2.0 * out.size * int(np.prod(w_shape[1:]))
        kernel = "x".join(map(str, w_shape[2:]))
        label = (
            f"{node.name} {x_shape[1]}->{w_shape[0]} {x_shape[2]}x{x_shape[3]} "
            f"k{kernel} s{config['strides'][0]} g{config['group']}"
        )
        found[key] = (Case(label, "conv", config, inputs, [out], flops), 1)
    return list(found.values())


def table(name: str, runs: int, min_time: float) -> list[tuple[Case, int, float]]:
    """Model ``name``'s convolutions, each with its node count and time."""
    return [
        (case, count, _timed(_kernel(case), runs, min_time))
        for case, count in conv_cases(name)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mnv3,resnet18")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--min-time", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import threadpoolctl

    threadpoolctl.threadpool_limits(a.threads)
    found = machine(a.runs)
    bandwidth, peak = found["bandwidth"], found["peak"]
    tables = [table(name, a.runs, a.min_time) for name in a.models.split(",")]
    # Measured again after the cases: a busy neighbour lowers one of them.
    again = machine(a.runs)
    bandwidth = max(bandwidth, again["bandwidth"])
    peak = max(peak, again["peak"])
    print(f"# Convolutions against the sgemm peak ({a.threads} thread(s))\n")
    print(
        f"sgemm peak {peak / 1e9:.1f} GFLOP/s (numpy matmul, best of three "
        f"shapes, before and after), memory bandwidth {bandwidth / 1e9:.1f} "
        "GB/s, measured in this run.\n"
    )
    for name, rows in zip(a.models.split(","), tables, strict=True):
        print(f"## {name}\n")
        print("| conv | nodes | MFLOP | us | GFLOP/s | % peak | x floor |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        total_us = total_flops = 0.0
        for case, count, seconds in rows:
            floor = max(case.bytes / bandwidth, case.flops / peak)
            rate = case.flops / seconds
            total_us += 1e6 * seconds * count
            total_flops += case.flops * count
            print(
                f"| {case.name} | {count} | {case.flops / 1e6:.1f} | "
                f"{1e6 * seconds:.1f} | {rate / 1e9:.1f} | "
                f"{100 * rate / peak:.0f} | {seconds / floor:.1f} |"
            )
        rate = total_flops / (total_us / 1e6)
        print(
            f"\nAll convolutions: {total_us / 1e3:.2f} ms, "
            f"{total_flops / 1e9:.2f} GFLOP, {rate / 1e9:.1f} GFLOP/s "
            f"({100 * rate / peak:.0f} % of peak).\n"
        )


if __name__ == "__main__":
    main()
