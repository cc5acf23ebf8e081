"""What a model's first run costs: the executor made and one run, in a fresh
process, with numba's disk cache empty (every kernel compiled) and then
filled (every kernel loaded), beside ONNX Runtime's session made and first
run.

    .venv/bin/python bench/bench_first_run.py --models mnv3,resnet18

Each model runs in child processes of this interpreter whose
``XDG_CACHE_HOME`` is a new empty folder (asyncrt's compiled kernels live
under it): ``cold`` is the first process there, ``cached`` the next one.
The models in turn share the folder, so a later model's cold figure loads
what an earlier one compiled (the order is the command's); ``--fresh``
gives each model an empty folder of its own. Times are wall seconds from
``from_onnx`` (the model already built) to the first outputs; ``import``
is ``import asyncrt`` and numba's own import alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MARK = "FIRST-RUN-RESULT "


def child(model_name: str) -> None:
    from bench_models import build_model

    model, feed = build_model(model_name)
    t0 = time.perf_counter()
    import asyncrt  # noqa: F401

    t1 = time.perf_counter()
    from asyncrt import graph_executor
    from asyncrt.frontend import from_onnx

    graph, params = from_onnx(model)
    executor = graph_executor.create(graph, None, "cpu", params=params)
    executor.run_sync(**feed)
    t2 = time.perf_counter()
    import onnxruntime as ort

    t3 = time.perf_counter()
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    session.run(None, feed)
    t4 = time.perf_counter()
    result = {"import_s": t1 - t0, "first_run_s": t2 - t1, "ort_first_run_s": t4 - t3}
    print(MARK + json.dumps(result), flush=True)


def numba_import_s() -> float:
    code = "import time; t = time.perf_counter(); import numba; "
    code += "print(time.perf_counter() - t)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def run(model_name: str, cache: str) -> dict[str, Any]:
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    out = subprocess.run(
        [sys.executable, __file__, "--child", model_name],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            result: dict[str, Any] = json.loads(line[len(MARK) :])
            return result
    raise RuntimeError(f"{model_name}: no result\n{out.stdout}\n{out.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mnv3,resnet18")
    ap.add_argument("--fresh", action="store_true", help="an empty cache per model")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    print(f"numba's import alone: {numba_import_s():.2f} s")
    print("| model | cold s | cached s | import asyncrt s | ONNX Runtime's s |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as shared:
        for model_name in a.models.split(","):
            with tempfile.TemporaryDirectory() as own:
                cache = own if a.fresh else shared
                cold, cached = run(model_name, cache), run(model_name, cache)
            print(
                f"| {model_name} | {cold['first_run_s']:.2f} | "
                f"{cached['first_run_s']:.2f} | {cached['import_s']:.2f} | "
                f"{cached['ort_first_run_s']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
