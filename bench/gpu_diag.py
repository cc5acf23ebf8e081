"""GPU triage: where does cuda:0 first differ from cpu:0?

    python bench/gpu_diag.py model enc             # run a bench model on cuda
    python bench/gpu_diag.py case NAME [NAME ...]  # ONNX node tests, per node

``model`` prints the whole cause chain of a failure; ``case`` runs the node
test on both devices with the debug executor and prints, in topological
order, every node whose output differs (max absolute and ulp difference).
"""

import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, "bench")
sys.path.insert(0, ".")

from asyncrt import debug_executor, graph_executor
from asyncrt.frontend import from_onnx, static_inputs


def run_model(name: str) -> None:
    from bench_models import build_model

    model, feed = build_model(name)
    graph, params = from_onnx(model)
    with graph_executor.create(graph, None, "cuda", params=params) as ex:
        try:
            ex.run_sync(**feed)
            print(name, "ok")
        except Exception as exc:
            traceback.print_exception(exc)


def _dump(graph, params, feeds, device: str) -> dict[str, np.ndarray]:
    root = Path(tempfile.mkdtemp())
    with debug_executor.create(graph, None, device, dump_root=root) as ex:
        ex.load_params(params)
        ex.dump(**feeds)
    return {p.name: np.load(p) for p in root.rglob("*.npy")}


def run_case(name: str) -> None:
    from tests.asyncrt.frontend.conformance import node_cases

    (case,) = [c for c in node_cases() if c.name == name]
    inputs, _ = case.data_sets[0]
    model = case.model
    init = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    feeds = dict(zip(names, inputs, strict=True))
    bound = set(static_inputs(model))
    graph, params = from_onnx(model, bind={n: feeds[n] for n in bound})
    runtime = {n: v for n, v in feeds.items() if n not in bound}
    cpu = _dump(graph, params, runtime, "cpu")
    gpu = _dump(graph, params, runtime, "cuda")
    order = sorted(cpu, key=lambda f: int(f.split("topo-index_")[1].split("_")[0]))
    print(f"== {name}: {len(order)} tensors")
    for key in order:
        a, b = cpu[key], gpu.get(key)
        if b is None or a.shape != b.shape:
            print("  missing/shape", key, a.shape, None if b is None else b.shape)
            continue
        if a.dtype.kind != "f":
            if not np.array_equal(a, b):
                print("  DIFF", key, a.dtype)
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        if np.nanmax(diff, initial=0) > 0:
            ulp = diff / np.spacing(np.abs(a)).astype(np.float64)
            print(
                f"  DIFF {key} {a.dtype} max|d|={np.nanmax(diff):.3g} "
                f"ulp={np.nanmax(ulp):.1f} n={int((diff > 0).sum())}/{a.size}"
            )


if __name__ == "__main__":
    mode, *names = sys.argv[1:]
    for item in names:
        (run_model if mode == "model" else run_case)(item)
