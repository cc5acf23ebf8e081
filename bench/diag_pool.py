"""A kernel-thread hand-off on this machine: asyncrt's Python pool against
numba's native parallel loop (device run; no BLAS beside either).

    python3 bench/diag_pool.py
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from _timing import seconds  # noqa: E402

from asyncrt.runtime import _threads  # noqa: E402


def _best_us(fn: Any, runs: int = 200) -> float:
    return 1e6 * seconds(fn, runs, warmup=1)[0]


@numba.njit(parallel=True, nogil=True)
def _touch(out: Any) -> None:  # pragma: no cover - compiled by numba
    for i in numba.prange(out.shape[0]):
        out[i] += 1.0


@numba.njit(nogil=True)
def _touch_range(out: Any, first: int, last: int) -> None:  # pragma: no cover
    for i in range(first, last):
        out[i] += 1.0


def main() -> None:
    cores = _threads.available_cores()
    print(f"cores {cores}, numba threading layer:", end=" ")
    small = np.zeros(cores * 16)
    _touch(small)
    print(numba.threading_layer())
    for parts in sorted({2, 4, 8, cores}):
        if parts > cores:
            continue
        numba.set_num_threads(parts)
        share = small.size // parts
        calls = [
            functools.partial(_touch_range, small, i * share, (i + 1) * share)
            for i in range(parts)
        ]
        _touch_range(small, 0, 1)
        python_pool = _best_us(functools.partial(_threads.run_parts, calls))
        native = _best_us(lambda: _touch(small))
        print(
            f"{parts} parts of nothing: python pool {python_pool:.1f} us, "
            f"numba parallel {native:.1f} us"
        )


if __name__ == "__main__":
    main()
