"""One timing loop for the small diagnostic scripts of ``bench/``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ("seconds",)


def seconds(fn: Callable[[], Any], runs: int, warmup: int = 3) -> list[float]:
    """``fn``'s wall time in each of ``runs`` calls after ``warmup`` calls,
    sorted: ``[0]`` the best, ``[runs // 2]`` the median."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)
