"""Which of OpenBLAS's kernel sets a process-backed executor's workers load.

Why: numpy's OpenBLAS picks its kernels from the CPU model when it loads
(``DYNAMIC_ARCH``), and the newest set is not always the fastest. On AMD
EPYC hosts with AVX-512 it loads its SkylakeX kernels, while its AVX2
(Haswell) kernels run W3's float32 64x1024x1024 products 16-20% faster on
one thread there (1.40 ms against 1.67-1.79 ms, which is ONNX Runtime's
MLAS time). OpenBLAS reads ``OPENBLAS_CORETYPE`` once, when it loads, so a
running process cannot switch; a worker process about to start can.

How: with ``worker_blas="auto"`` (the default), before its first pooled run
a process-backed executor starts one worker per candidate kernel set, times
its own graph in them (zero inputs, runs interleaved round by round, so
that load on the machine falls on both alike), keeps the faster worker and
starts every later one with its set. The default set wins unless another is
:data:`MARGIN` faster. Results then differ from the default set's by float
rounding only (as they would on another CPU).

There is a choice to make only where numpy's BLAS is OpenBLAS and it chose
an AVX-512 set (whose CPUs all have AVX2), and ``OPENBLAS_CORETYPE`` is not
set already: elsewhere the executor starts its workers as they are.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import threadpoolctl

__all__ = (
    "AVX512_SETS",
    "ENV",
    "MARGIN",
    "Timing",
    "candidates",
    "faster",
    "time_interleaved",
)

#: The environment variable OpenBLAS reads its kernel set from.
ENV = "OPENBLAS_CORETYPE"
#: OpenBLAS kernel sets (lower case, as threadpoolctl reports them) that
#: need AVX-512; their hosts can also run the AVX2 ``"Haswell"`` set.
AVX512_SETS = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
#: How much faster (median run time) another set must be to replace the
#: one OpenBLAS chose: less is noise on a shared machine.
MARGIN = 0.03
#: Runs timed per candidate at most, and the seconds of timing after which
#: the rounds stop early (once :data:`MIN_ROUNDS` are done).
MAX_ROUNDS = 9
MIN_ROUNDS = 3
BUDGET_SECONDS = 1.0
#: A graph whose warm-up run takes longer keeps OpenBLAS's own choice: its
#: timing would hold up the first request too long (choose with
#: ``worker_blas=<set>`` instead).
MAX_RUN_SECONDS = 0.25


@functools.cache
def _blas_info() -> tuple[dict[str, Any], ...]:
    return tuple(threadpoolctl.threadpool_info())


def candidates(
    env: Mapping[str, str] | None = None,
    blas: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, ...]:
    """The kernel sets worth timing: OpenBLAS's own choice first, then
    ``"Haswell"``; ``()`` where there is nothing to choose.

    :param env: the environment the workers start with (default: this
        process's); a ``OPENBLAS_CORETYPE`` in it is the user's choice.
    :param blas: threadpoolctl's view of the BLAS libraries (default: this
        process's, which the workers share).
    """
    if ENV in (os.environ if env is None else env):
        return ()
    openblas = [
        info
        for info in (_blas_info() if blas is None else blas)
        if info.get("internal_api") == "openblas"
    ]
    if not openblas:
        return ()  # MKL, Accelerate, ...: one kernel set per CPU
    chosen = str(openblas[0].get("architecture") or "")
    if chosen.lower() not in AVX512_SETS:
        return ()
    return (chosen, "Haswell")


#: Runs one candidate's worker once (its inputs already in place).
RunOnce = Callable[[], Awaitable[None]]


class Timing:
    """Median run seconds per candidate, from :func:`time_interleaved`."""

    def __init__(self, medians: Mapping[str, float]) -> None:
        self.medians = dict(medians)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}: {v * 1e3:.3f} ms" for k, v in self.medians.items())
        return f"<Timing {shown}>"


async def time_interleaved(
    runs: Mapping[str, RunOnce],
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing | None:
    """Time each candidate's runs, one run of each per round (the order
    alternating) after one untimed warm-up run each.

    :returns: the medians, or ``None`` if a run of the first round took
        longer than :data:`MAX_RUN_SECONDS` (the caller keeps the default
        set).
    """
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        await run()  # first-touch page faults, lazy imports, caches
    began = clock()
    order = list(runs)
    for done in range(MAX_ROUNDS):
        if done >= MIN_ROUNDS and clock() - began > BUDGET_SECONDS:
            break
        for name in order:
            start = clock()
            await runs[name]()
            samples[name].append(clock() - start)
        if done == 0 and max(s[0] for s in samples.values()) > MAX_RUN_SECONDS:
            return None
        order.reverse()  # neither candidate always runs right after the other
    return Timing({name: statistics.median(s) for name, s in samples.items()})


def faster(timing: Timing, default: str) -> str:
    """The candidate to keep: ``default`` unless another's median is more
    than :data:`MARGIN` below it (the fastest such one)."""
    best = min(timing.medians, key=timing.medians.__getitem__)
    if timing.medians[best] < timing.medians[default] * (1 - MARGIN):
        return best
    return default
