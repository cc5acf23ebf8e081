"""Would another library close the kernel gaps? One-off probes, per kernel.

Times asyncrt's own kernels on the serving-size shapes where they miss
ONNX Runtime by most (``bench_models.py``'s profiles: depthwise and dense
3x3 convolutions at batch 32, erf-GELU and the W3 matmul) against the same
computation through libraries asyncrt does not depend on, in whatever
interpreter runs this file: numba (an elementwise ufunc compiled from a
scalar expression, as a fusion engine would make it) and PyTorch (oneDNN
convolutions, MKL matmul); ``bench_kernels.py --ops`` does numexpr. A library that
is not installed is skipped. Each row is the best of 5 medians, in us::

    .venv/bin/python bench/probe_libraries.py         # asyncrt alone
    /tmp/probe/bin/python bench/probe_libraries.py    # with torch, numba

(``/tmp/probe``: a venv with this repo's requirements plus ``torch`` and
``numba``.) Findings are in ``bench/README.md``.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from asyncrt.ops import _builtin as _ops
from asyncrt.ops import _im2col, lookup


def best_us(fn: Callable[[], Any], number: int = 100) -> float:
    """The best of 5 timings of ``number`` calls, per call, in us."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _tanh(x: float) -> float:
    return math.tanh(x)


def erf_gelu_scalar_source() -> str:
    """erf-GELU as one scalar function over Eigen's float32 erf polynomial
    (the one asyncrt's whole-array erf evaluates pass by pass)."""

    def horner(coefficients: tuple[float, ...]) -> str:
        expr = f"f32({coefficients[0]!r})"
        for c in coefficients[1:]:
            expr = f"({expr}) * s + f32({c!r})"
        return expr

    return (
        "def gelu(a):\n"
        "    u = min(max(a * f32(0.70710677), f32(-4)), f32(4))\n"
        "    s = u * u\n"
        f"    return f32(0.5) * a * (f32(1) + u * ({horner(_ops._ERF_P)})"
        f" / ({horner(_ops._ERF_Q)}))\n"
    )


def probe_gelu(rows: list[tuple[str, str, float]]) -> None:
    a = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    out = np.empty_like(a)
    kernel = lookup("gelu").make(np, {"approximate": "none"})
    rows.append(
        ("erf-GELU 128x512", "asyncrt (numpy passes)", best_us(kernel.bind(a, out)))
    )
    if has("numba"):
        import numba

        namespace: dict[str, Any] = {"f32": np.float32}
        exec(erf_gelu_scalar_source(), namespace)  # our own generated source
        ufunc = numba.vectorize(["float32(float32)"], nopython=True)(namespace["gelu"])
        rows.append(
            ("erf-GELU 128x512", "numba.vectorize", best_us(lambda: ufunc(a, out=out)))
        )
        tanh = numba.vectorize(["float32(float32)"], nopython=True)(_tanh)
        rows.append(
            ("tanh 128x512", "numba.vectorize", best_us(lambda: tanh(a, out=out)))
        )
    rows.append(("tanh 128x512", "numpy", best_us(lambda: np.tanh(a, out=out))))
    if has("torch"):
        import torch

        t = torch.from_numpy(a)
        rows.append(
            ("erf-GELU 128x512", "torch", best_us(lambda: torch.nn.functional.gelu(t)))
        )


def probe_conv(rows: list[tuple[str, str, float]]) -> None:
    rng = np.random.default_rng(0)
    for batch in (2, 32):
        for name, c, group in (("conv 3->8 3x3", 3, 1), ("depthwise 8 3x3", 8, 8)):
            x = rng.standard_normal((batch, c, 16, 16)).astype(np.float32)
            w = rng.standard_normal((8, c // group, 3, 3)).astype(np.float32)
            b = rng.standard_normal(8).astype(np.float32)
            out = np.empty((batch, 8, 16, 16), np.float32)
            bound = _im2col.bind_stride1(
                np,
                x,
                w,
                b,
                out,
                group,
                (1, 1),
                (1, 1),
                activation="relu",
                limit=math.inf,
            )
            assert bound is not None
            label = f"{name}, batch {batch}"
            rows.append((label, "asyncrt (im2col + BLAS)", best_us(bound)))
            if has("torch"):
                import torch

                conv = functools.partial(
                    _torch_conv, *map(torch.from_numpy, (x, w, b)), group
                )
                rows.append((label, "torch (oneDNN)", best_us(conv)))


def _torch_conv(x: Any, w: Any, b: Any, group: int) -> Any:
    import torch

    with torch.inference_mode():
        y = torch.nn.functional.conv2d(x, w, b, padding=1, groups=group)
        return torch.relu_(y)


def probe_matmul(rows: list[tuple[str, str, float]]) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 1024)).astype(np.float32)
    w = rng.standard_normal((1024, 1024)).astype(np.float32)
    out = np.empty((64, 1024), np.float32)
    rows.append(
        (
            "matmul 64x1024x1024",
            "numpy (OpenBLAS)",
            best_us(lambda: np.matmul(a, w, out=out), 20),
        )
    )
    if has("torch"):
        import torch

        ta, tw, to = map(torch.from_numpy, (a, w, out))
        rows.append(
            (
                "matmul 64x1024x1024",
                "torch (MKL)",
                best_us(lambda: torch.matmul(ta, tw, out=to), 20),
            )
        )


def main() -> None:
    rows: list[tuple[str, str, float]] = []
    probe_gelu(rows)
    probe_conv(rows)
    probe_matmul(rows)
    print("| kernel | library | us |\n|---|---|---|")
    for kernel, library, us in rows:
        print(f"| {kernel} | {library} | {us:.1f} |")


if __name__ == "__main__":
    main()
