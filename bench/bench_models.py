"""The test suite's two ONNX models (a small CNN and a transformer encoder
block) on the cpu device: asyncrt through its ONNX frontend against ONNX
Runtime, in one run.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_models.py \\
        --rounds 2 --json bench/results/models.json

The models are ``tests/asyncrt/frontend/models.py``'s, at the size the tests
use and at a serving size (``cnn-b32``: batch 32; ``enc-s128``: batch 1,
sequence 128, width 256, 8 heads, as W4). Every (model, runner) pair runs in
its own child process of this interpreter (ONNX Runtime is a dev
dependency), rounds interleaved; each pair's best-median round is reported.
Runners:

* ``ort-seq-t1`` / ``ort-seq-tdef`` / ``ort-par-t1`` / ``ort-par-tdef``:
  ONNX Runtime's CPU provider, sequential or parallel execution, one or the
  default intra-op threads (as ``../shared/bench/peers.py`` runs it);
* ``asyncrt``: ``from_onnx`` then ``graph_executor.create(..., "cpu")`` and
  ``run_sync(x=...)`` (inputs in, outputs out as new arrays the caller
  owns, as ``sess.run``): the default options (``fuse="auto"``);
* ``asyncrt-fused``: the same with ``fuse=True``;
* ``asyncrt-t1`` / ``asyncrt-fused-t1``: the same with
  ``kernel_threads=1`` (one BLAS thread, as ``ort-seq-t1``: on a host whose
  other core is busy, two BLAS threads wait for each other);
* ``asyncrt-cuda`` / ``asyncrt-cuda-fused``: the same on ``cuda:0`` (cupy
  kernels; fused chains as ``cupy.ElementwiseKernel``), outputs copied back
  to host arrays inside the timed call, as ONNX Runtime returns them;
* ``ort-cuda``: ONNX Runtime's CUDA provider, where its build has one;
* ``tvm`` / ``tvm-fused``: TVM Relax as ``../shared/bench/peers.py`` runs
  it (``from_onnx``, ``DecomposeOpsForInference``, ``tvm.compile`` for
  ``llvm`` without or with the default pipeline's fusion, the VM), in the
  peers' interpreter (``--peer-py`` or ``$PEER_PY``, made by
  ``../shared/bench/setup_peers.sh``); skipped without one.

``gpt`` (a GPT-2-style decoder, batch 4 x sequence 100), ``mnv3`` (a
MobileNetV3-Small-style CNN, batch 1, 224 x 224) and ``resnet18`` (a
ResNet-18-style CNN, batch 1, 224 x 224) are exported from PyTorch
by ``export_models.py`` on first use (PyTorch is the ``bench`` extra);
``mnv3-b8``, ``resnet18-b4`` (any ``-b<N>``) run the CNN at that batch.
``minilm-2x64`` (any ``minilm-<B>x<S>``) is ``bench_encoder.py``'s
MiniLM-size BERT encoder at batch B x sequence S (its inputs' dims
symbolic, as exported; ``minilm-2x64-fixed`` with them set), here in
processes of its own per runner (``bench_encoder.py`` runs every runtime in one process,
where each one's spinning pool threads take cores from the next).

The GPU runners and the ``enc-b16`` model (the encoder at batch 16, sequence
128, width 256) are not in the defaults: they need cupy and a GPU.

``--neighbour`` keeps a CPU-bound process running on the same cores
meanwhile (a busy neighbour: compare each runner's time with a run
without it); ``--neighbours N`` keeps N of them (as many as the cores:
none left free). The table gives each pair's best round and the median of
its rounds, each against ONNX Runtime's: beside a neighbour the rounds
differ most, and the best alone would hide it; and the slowest tenth of
the runs, each round's 90th percentile (the median of rounds' of them:
beside a neighbour a run the scheduler cuts short takes several times the
median run).

Outputs are compared with ONNX Runtime's (``max|d| / max|ref| <= 1e-4``).
Each pair: warm-up, then at least ``--min-runs`` timed runs and
``--min-time`` seconds. ``--profile`` also writes each asyncrt runner's
per-launch kernel times (each kernel run alone, in plan order) to
``results/models-profile-<model>-<runner>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_executor import run_child  # noqa: E402

MARK = "@@MODELS@@"
RUNNERS = (
    "ort-seq-t1",
    "ort-seq-tdef",
    "ort-par-t1",
    "ort-par-tdef",
    "asyncrt",
    "asyncrt-fused",
    "asyncrt-t1",
    "asyncrt-fused-t1",
)
#: Run in the peers' interpreter, and by default only where there is one.
TVM_RUNNERS = ("tvm", "tvm-fused")
MODELS = ("cnn", "cnn-b32", "enc", "enc-s128", "gpt", "mnv3", "resnet18")
#: Exported from PyTorch by ``export_models.py`` (the ``bench`` extra).
EXPORTED = ("gpt", "mnv3", "resnet18")


def build_model(name: str) -> tuple[Any, dict[str, Any]]:
    """The ONNX model ``name`` and its input feed (fixed seed)."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from tests.asyncrt.frontend.models import encoder_block, small_cnn

    base, _, batch_text = name.partition("-b")
    if name in EXPORTED or (base in ("mnv3", "resnet18") and batch_text.isdigit()):
        import export_models

        model, feed = export_models.load(base), export_models.feed(base)
        if name != base:  # the CNN at another batch: its batch axis set
            batch = int(batch_text)
            for value in (*model.graph.input, *model.graph.output):
                value.type.tensor_type.shape.dim[0].dim_value = batch
            del model.graph.value_info[:]  # (shapes inferred again)
            rng = np.random.default_rng(0)
            feed = {"x": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
        return model, feed
    if base == "minilm" or name.startswith("minilm-"):
        from tests.asyncrt.frontend.symbolic_models import (
            BertConfig,
            bert_encoder,
            bert_feed,
        )

        shape, _, fixed = name.removeprefix("minilm-").partition("-")
        batch, seq = (int(v) for v in shape.split("x"))
        model = bert_encoder(BertConfig())
        if fixed == "fixed":  # its symbolic dims set: one static plan
            sizes = {"batch": batch, "sequence": seq}
            for value in (*model.graph.input, *model.graph.output):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.dim_param:
                        dim.dim_value = sizes[dim.dim_param]
        return model, bert_feed(batch, seq, BertConfig())
    rng = np.random.default_rng(0)
    if name.startswith("cnn"):
        batch = 32 if name == "cnn-b32" else 2
        model = small_cnn(batch=batch)
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
    else:
        serving = {"batch": 1, "seq": 128, "dim": 256, "heads": 8}
        kw = {
            "enc-s128": serving,
            "enc-b16": {**serving, "batch": 16},
        }.get(name, {})
        model = encoder_block(**kw)
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = rng.standard_normal(shape).astype(np.float32)
    return model, {model.graph.input[0].name: x}


def _ort_session(model: Any, runner: str) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    if runner == "ort-cuda":
        return ort.InferenceSession(
            model.SerializeToString(), so, providers=["CUDAExecutionProvider"]
        )
    if "-par-" in runner:
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        so.inter_op_num_threads = 2
    else:
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if runner.endswith("-t1"):
        so.intra_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )


def _tvm_runner(model: Any, feed: dict[str, Any], fused: bool) -> Any:
    """TVM Relax compiled for llvm, as the shared peers harness builds it:
    numpy in, numpy out."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

    mod = relax.transform.DecomposeOpsForInference()(tvm_from_onnx(model))
    target = tvm.target.Target("llvm")
    pipeline = {"relax_pipeline": relax.get_default_pipeline(target)} if fused else {}
    main = relax.VirtualMachine(tvm.compile(mod, target=target, **pipeline), tvm.cpu())[
        "main"
    ]
    device = tvm.cpu()

    def fn() -> list[Any]:
        out = main(*[tvm.runtime.tensor(value, device) for value in feed.values()])
        if isinstance(out, tvm.runtime.Tensor):
            return [out.numpy()]
        return [o.numpy() for o in out]

    return fn


def child(model_name: str, runner: str, a: argparse.Namespace) -> None:
    import numpy as np

    model, feed = build_model(model_name)
    reference = _ort_session(model, "ort-seq-t1").run(None, feed)
    t0 = time.perf_counter()
    if runner.startswith("ort"):
        sess = _ort_session(model, runner)

        def fn() -> list[Any]:
            return list(sess.run(None, feed))

    elif runner.startswith("tvm"):
        fn = _tvm_runner(model, feed, fused=runner == "tvm-fused")
    else:
        from asyncrt import graph_executor
        from asyncrt.frontend import from_onnx
        from asyncrt.graph import SymbolicGraph

        graph, params = from_onnx(model)
        on_gpu = "-cuda" in runner
        options: dict[str, Any] = {"fuse": True if "-fused" in runner else "auto"}
        if runner.endswith("-t1"):
            options["kernel_threads"] = 1
        ex = graph_executor.create(
            graph, None, "cuda" if on_gpu else "cpu", params=params, **options
        )

        def fn() -> list[Any]:
            outputs = ex.run_sync(**feed) or []
            return [o.numpy() for o in outputs] if on_gpu else outputs

    setup_s = time.perf_counter() - t0
    out = fn()
    rel_err = max(
        float(np.max(np.abs(np.asarray(o).astype(np.float64) - r)))
        / max(float(np.max(np.abs(r))), 1e-30)
        for o, r in zip(out, reference, strict=True)
    )
    for _ in range(5):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < a.min_runs or time.perf_counter() - start < a.min_time:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if len(times) >= a.max_runs:
            break
    times.sort()
    res = {
        "model": model_name,
        "runner": runner,
        "ok": True,
        "runs": len(times),
        "median_s": times[len(times) // 2],
        "min_s": times[0],
        "p90_s": times[9 * len(times) // 10],
        "setup_s": setup_s,
        "rel_err": rel_err,
        "correct": rel_err <= 1e-4,
        "nodes": len(model.graph.node),
    }
    if a.profile and runner.startswith("asyncrt"):
        from bench_kernels import profile

        if isinstance(graph, SymbolicGraph):  # (one core per signature: the
            # feed's, imported with its shapes, has the same kernels)
            shapes = {name: value.shape for name, value in feed.items()}
            graph, params = from_onnx(model, shapes)
            ex.close()
            device = "cuda" if on_gpu else "cpu"
            ex = graph_executor.create(graph, None, device, params=params, **options)
        res["profile"] = profile(ex, feed)
        res["launches"] = len(res["profile"])
    print(MARK + json.dumps(res), flush=True)


def run_pair(model: str, runner: str, a: argparse.Namespace) -> dict[str, Any]:
    python = a.peer_py if runner.startswith("tvm") else sys.executable
    if not python:
        return {"model": model, "runner": runner, "ok": False, "error": "no --peer-py"}
    cmd = [
        python,
        __file__,
        "--child",
        model,
        runner,
        "--min-runs",
        str(a.min_runs),
        "--min-time",
        str(a.min_time),
        "--max-runs",
        str(a.max_runs),
    ]
    if a.profile:
        cmd.append("--profile")
    return run_child(cmd, MARK, a.timeout, {"model": model, "runner": runner})


def table(
    best: dict[tuple[str, str], dict[str, Any]], results: list[dict[str, Any]]
) -> str:
    """Each pair's best round (its median run) against ONNX Runtime's best,
    and the median of its rounds against ONNX Runtime's median of rounds:
    the best filters a quiet host's noise, the median of rounds keeps what
    a busy one does to every round (beside a neighbour, ONNX Runtime's
    spinning threads made one round of MobileNetV3 1.2 ms and the next two
    5.2-5.4), and the median of its rounds' 90th percentiles (the slowest
    tenth of the runs) against ONNX Runtime's."""
    rounds: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        if r.get("ok"):
            rounds.setdefault((r["model"], r["runner"]), []).append(r)

    def typical(key: tuple[str, str], field: str = "median_s") -> float:
        times = sorted(r.get(field, float("nan")) for r in rounds.get(key, []))
        return times[len(times) // 2] if times else float("nan")

    lines = [
        "| model | runner | median ms | / ORT best | median of rounds ms "
        "| / ORT's | p90 ms | / ORT's | rel err | correct |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(m for m, _ in best):
        rows = {r: v for (m, r), v in best.items() if m == model}
        ort = [r for r, v in rows.items() if r.startswith("ort") and v.get("ok")]
        ort_best = min((rows[r]["median_s"] for r in ort), default=float("nan"))
        ort_typical = min((typical((model, r)) for r in ort), default=float("nan"))
        ort_tail = min(
            (typical((model, r), "p90_s") for r in ort), default=float("nan")
        )
        for runner, v in rows.items():
            if not v.get("ok"):
                lines.append(
                    f"| {model} | {runner} | failed: {v['error'][:80]} ||||||||"
                )
                continue
            middle, tail = typical((model, runner)), typical((model, runner), "p90_s")
            lines.append(
                f"| {model} | {runner} | {1e3 * v['median_s']:.3f} | "
                f"{v['median_s'] / ort_best:.2f} | {1e3 * middle:.3f} | "
                f"{middle / ort_typical:.2f} | {1e3 * tail:.3f} | "
                f"{tail / ort_tail:.2f} | {v['rel_err']:.1e} | {v['correct']} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runners", help="default: all, tvm ones with --peer-py")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-runs", type=int, default=20)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--max-runs", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--neighbour",
        action="store_true",
        help="a CPU-bound process on the same cores throughout (a busy neighbour)",
    )
    ap.add_argument(
        "--neighbours",
        type=int,
        default=0,
        help="this many CPU-bound processes throughout (as many as the cores: "
        "none left free)",
    )
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "RUNNER"))
    ap.add_argument(
        "--peer-py",
        default=os.environ.get("PEER_PY"),
        help="the peers' python, for the tvm runners (default: $PEER_PY)",
    )
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a)
        return
    if a.runners is None:
        a.runners = ",".join(RUNNERS + (TVM_RUNNERS if a.peer_py else ()))
    best: dict[tuple[str, str], dict[str, Any]] = {}
    results = []
    count = max(a.neighbours, int(a.neighbour))
    neighbours = [
        subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)
    ]
    try:
        rounds(a, best, results)
    finally:
        for neighbour in neighbours:
            neighbour.kill()
            neighbour.wait()
    print()
    print(table(best, results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"best": list(best.values()), "all": results}, f, indent=1)
    if a.profile:
        for r in best.values():
            if "profile" in r:
                write_profile(r)


#: The busy neighbour: one CPU-bound Python process, all the time.
BUSY_LOOP = "x = 0\nwhile True:\n    x = (x * 1103515245 + 12345) % 2147483648\n"


def rounds(
    a: argparse.Namespace,
    best: dict[tuple[str, str], dict[str, Any]],
    results: list[dict[str, Any]],
) -> None:
    """Every (model, runner) pair, ``a.rounds`` times, into ``results``; the
    best-median result of each pair into ``best``."""
    for _ in range(a.rounds):
        for model in a.models.split(","):
            for runner in a.runners.split(","):
                r = run_pair(model, runner, a)
                results.append(r)
                shown = f"{1e3 * r['median_s']:.3f} ms" if r.get("ok") else "FAILED"
                print(f"{model:9} {runner:14} {shown}", flush=True)
                key = (model, runner)
                if key not in best or (
                    r.get("ok")
                    and r["median_s"] < best[key].get("median_s", float("inf"))
                ):
                    best[key] = r


#: Kernels whose work is a product (a GEMM, a convolution, a pointwise
#: convolution with the depthwise one reading it): named with one of these.
PRODUCT_KERNELS = ("conv", "matmul", "gemm", "pointwise", "dense")


def write_profile(r: dict[str, Any]) -> None:
    """``results/models-profile-<model>-<runner>.md``: kernel times, largest
    first, against the run's median, and the share of the products
    (:data:`PRODUCT_KERNELS`) against everything else."""
    rows = sorted(r["profile"], key=lambda x: -x["median_us"])
    total = sum(x["median_us"] for x in rows)
    run_us = 1e6 * r["median_s"]
    products = sum(
        x["median_us"]
        for x in rows
        if any(word in x["func"].split(".")[0] for word in PRODUCT_KERNELS)
    )
    lines = [
        f"# {r['model']} / {r['runner']}: where the time goes",
        "",
        f"run median {run_us:.1f} us; kernels alone {total:.1f} us "
        f"({len(rows)} launches); the rest ({run_us - total:.1f} us) is "
        "per-run overhead (input/output copies, dispatch) and cache effects",
        "",
        f"products (GEMMs and convolutions: kernels named "
        f"{', '.join(PRODUCT_KERNELS)}) {products:.1f} us, "
        f"{products / max(total, 1e-9):.0%} of the kernels' time; everything "
        f"else {total - products:.1f} us, {1 - products / max(total, 1e-9):.0%}",
        "",
        "| node | kernel | median us | share of kernels |",
        "|---|---|---|---|",
    ]
    for x in rows:
        lines.append(
            f"| {x['node']} | {x['func']} | {x['median_us']:.1f} | "
            f"{x['median_us'] / total:.0%} |"
        )
    path = HERE / "results" / f"models-profile-{r['model']}-{r['runner']}.md"
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
