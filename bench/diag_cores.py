"""Diagnose how compiled kernels split on a many-core machine (device run).

    python3 bench/diag_cores.py

Prints the kernel-thread limits an executor gets, how each compiled kernel
of the MiniLM-size encoder at batch 16 was split when bound, and the
softmax and GELU kernels' times alone, right after a GEMM, and unsplit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
from _timing import seconds  # noqa: E402
from bench_models import build_model  # noqa: E402

from asyncrt import graph_executor  # noqa: E402
from asyncrt.frontend import from_onnx  # noqa: E402
from asyncrt.ops import _jit  # noqa: E402
from asyncrt.runtime import _threads  # noqa: E402

splits: list[tuple[str, int]] = []
_bind_parts = _jit.bind_parts


def _spy(kernel: Any, arrays: Any, shares: Any, *args: Any, **kwargs: Any) -> Any:
    splits.append((getattr(kernel, "__name__", str(kernel)), len(shares)))
    return _bind_parts(kernel, arrays, shares, *args, **kwargs)


def _best_us(fn: Any, runs: int = 20) -> float:
    return 1e6 * seconds(fn, runs, warmup=1)[0]


def main() -> None:
    _jit.bind_parts = _spy
    model, feed = build_model(sys.argv[1] if len(sys.argv) > 1 else "enc-b16")
    graph, params = from_onnx(model)
    ex = graph_executor.create(graph, None, "cpu", params=params)
    ex.run_sync(**feed)
    limits = _threads.limits
    print(
        f"cores {_threads.available_cores()} threads {limits.threads} "
        f"compiled_threads {limits.compiled_threads}"
    )
    print("bound splits:", splits)
    from asyncrt.ops import _builtin

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8, 128, 128)).astype(np.float32)
    out = np.empty_like(x)
    a = rng.standard_normal((2048, 256)).astype(np.float32)
    w = rng.standard_normal((256, 768)).astype(np.float32)
    y = np.empty((2048, 768), np.float32)
    for parts in (1, 4, 8, 16):
        limits.compiled_threads = parts
        softmax = _builtin.bind_softmax_last_axis(x, out)
        alone = _best_us(softmax)

        def after_gemm(softmax: Any = softmax) -> None:
            np.matmul(a, w, out=y)
            softmax()

        gemm = _best_us(lambda: np.matmul(a, w, out=y))
        print(
            f"softmax 16x8x128x128 split {parts}: alone {alone:.0f} us, "
            f"after a GEMM {_best_us(after_gemm) - gemm:.0f} us (GEMM {gemm:.0f})"
        )
    ex.close()


if __name__ == "__main__":
    main()
