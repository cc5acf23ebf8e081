"""The time evaluator: TVM's ``time_evaluator`` and ``BenchmarkResult``.

The measurement, as TVM's ``WrapTimeEvaluator`` does it:

1. one warm-up call, not measured;
2. ``repeat`` measurements; each times ``number`` calls in a row and keeps
   their mean (seconds per call);
3. while a measurement lasts less than ``min_repeat_ms``, ``number`` grows
   (to at least what would fill ``min_repeat_ms`` at the last speed, and at
   least by the golden ratio) and that measurement is taken again; the
   grown ``number`` is kept for the following repeats. A function too fast
   for the clock (a measurement of exactly 0) is retried at most
   ``limit_zero_time_iterations`` times, so nothing loops for ever;
4. optionally a pause of ``cooldown_interval_ms`` after every
   ``repeats_to_cooldown`` measurements.

:class:`TimeEvaluator` runs it on a plain function (``evaluator(*args)``,
blocking) or from async code (``await evaluator.acall(*args)``): a
coroutine function is awaited on the event loop, a plain one runs in a
worker thread, so the loop is never blocked.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from ..errors import ArgumentError

__all__ = (
    "BenchmarkResult",
    "Progress",
    "Schedule",
    "Settings",
    "TimeEvaluator",
    "time_evaluator",
)

#: Called after each measurement with (measurements done, measurements in all).
Progress = Callable[[int, int], None]

_GOLDEN_RATIO = 1.618


@dataclass(frozen=True)
class BenchmarkResult:
    """Times of repeated measurements (TVM's ``BenchmarkResult``).

    :ivar results: seconds per call, one per measurement (``repeat`` of them).
    :ivar mean: their mean.
    :ivar median: their median.
    :ivar std: their standard deviation (population, as numpy's default).
    :ivar min: the fastest.
    :ivar max: the slowest.
    :ivar number: calls per measurement in the end (after growing to
        ``min_repeat_ms``).
    """

    results: tuple[float, ...]
    mean: float
    median: float
    std: float
    min: float
    max: float
    number: int = 1

    @classmethod
    def from_results(cls, results: Sequence[float], number: int = 1) -> BenchmarkResult:
        """Summarise measurements.

        :param results: seconds per call, one per measurement.
        :param number: calls per measurement.
        :raises ArgumentError: if ``results`` is empty.
        """
        values = tuple(float(r) for r in results)
        if not values:
            raise ArgumentError("a benchmark result needs at least one measurement")
        return cls(
            results=values,
            mean=statistics.fmean(values),
            median=statistics.median(values),
            std=statistics.pstdev(values),
            min=min(values),
            max=max(values),
            number=number,
        )

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain data (seconds), for JSON."""
        return {**dataclasses.asdict(self), "results": list(self.results)}

    def __str__(self) -> str:
        heads = ("mean (ms)", "median (ms)", "max (ms)", "min (ms)", "std (ms)")
        values = (self.mean, self.median, self.max, self.min, self.std)
        return (
            "Execution time summary:\n"
            + " ".join(f"{h:^12}" for h in heads)
            + "\n"
            + " ".join(f"{1e3 * v:^12.4f}" for v in values)
        )


@dataclass(frozen=True)
class Settings:
    """How to measure; see the module docstring."""

    number: int = 10
    repeat: int = 1
    min_repeat_ms: float = 0.0
    limit_zero_time_iterations: int = 100
    cooldown_interval_ms: float = 0.0
    repeats_to_cooldown: int = 1

    def __post_init__(self) -> None:
        for name in (
            "number",
            "repeat",
            "limit_zero_time_iterations",
            "repeats_to_cooldown",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("min_repeat_ms", "cooldown_interval_ms"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ArgumentError(f"{name} must be a number >= 0, got {value!r}")

    def schedule(self) -> Schedule:
        """A new measurement series with these settings."""
        return Schedule(self)


class Schedule:
    """The state of one measurement series: how many calls to time next,
    and what the times taken so far were. Shared by every driver (sync,
    async, the debug executor's per-node runs), so all measure alike."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.number = settings.number
        self.repeat = settings.repeat
        self.min_seconds = settings.min_repeat_ms / 1e3
        self.limit_zero = settings.limit_zero_time_iterations
        self.results: list[float] = []
        self._zeros = 0

    @property
    def done(self) -> bool:
        """Whether every measurement was taken."""
        return len(self.results) >= self.repeat

    def cooldown(self) -> float:
        """Seconds to pause after the measurement just kept (0: none)."""
        every = self.settings.repeats_to_cooldown
        pause = self.settings.cooldown_interval_ms / 1e3
        if pause > 0 and not self.done and len(self.results) % every == 0:
            return pause
        return 0.0

    def report(self, seconds: float) -> bool:
        """Record that ``self.number`` calls took ``seconds``; return whether
        that measurement counts (else take it again with the new number)."""
        if seconds <= 0.0:
            self._zeros += 1
        if seconds >= self.min_seconds or self._zeros >= self.limit_zero:
            self.results.append(max(seconds, 0.0) / self.number)
            self._zeros = 0
            return True
        if seconds > 0.0:
            per_call = seconds / self.number
            self.number = max(
                int(self.min_seconds / per_call) + 1,
                math.ceil(self.number * _GOLDEN_RATIO),
            )
        return False


class TimeEvaluator:
    """Measures a function; see the module docstring. Make one with
    :func:`time_evaluator`."""

    def __init__(
        self,
        func: Callable[..., Any],
        settings: Settings,
        progress: Progress | None = None,
    ) -> None:
        self.func = func
        self.settings = settings
        self.progress = progress

    def _tick(self, schedule: Schedule) -> None:
        if self.progress is not None:
            self.progress(len(schedule.results), schedule.repeat)

    def __call__(self, *args: Any, **kwargs: Any) -> BenchmarkResult:
        """Measure ``func(*args, **kwargs)``, blocking the calling thread.

        :raises ArgumentError: if ``func`` is a coroutine function (use
            :meth:`acall`).
        """
        if inspect.iscoroutinefunction(self.func):
            raise ArgumentError(
                f"{_name(self.func)} is a coroutine function: measure it with "
                "`await evaluator.acall(...)`"
            )
        func, clock = self.func, time.perf_counter
        func(*args, **kwargs)  # warm-up
        schedule = self.settings.schedule()
        while not schedule.done:
            number = schedule.number
            start = clock()
            for _ in range(number):
                func(*args, **kwargs)
            if schedule.report(clock() - start):
                self._tick(schedule)
                pause = schedule.cooldown()
                if pause:
                    time.sleep(pause)
        return BenchmarkResult.from_results(schedule.results, schedule.number)

    async def acall(self, *args: Any, **kwargs: Any) -> BenchmarkResult:
        """Measure from async code without blocking the event loop: a
        coroutine function is awaited here; a plain function is measured
        in a worker thread."""
        if not inspect.iscoroutinefunction(self.func):
            return await anyio.to_thread.run_sync(lambda: self(*args, **kwargs))
        func: Callable[..., Awaitable[Any]] = self.func
        clock = time.perf_counter
        await func(*args, **kwargs)  # warm-up
        schedule = self.settings.schedule()
        while not schedule.done:
            number = schedule.number
            start = clock()
            for _ in range(number):
                await func(*args, **kwargs)
            if schedule.report(clock() - start):
                self._tick(schedule)
                pause = schedule.cooldown()
                if pause:
                    await anyio.sleep(pause)
        return BenchmarkResult.from_results(schedule.results, schedule.number)


def time_evaluator(
    func: Callable[..., Any],
    number: int = 10,
    repeat: int = 1,
    min_repeat_ms: float = 0.0,
    *,
    limit_zero_time_iterations: int = 100,
    cooldown_interval_ms: float = 0.0,
    repeats_to_cooldown: int = 1,
    progress: Progress | None = None,
) -> TimeEvaluator:
    """A function that measures ``func`` (TVM's ``time_evaluator``).

    .. code-block:: python

        timer = asyncrt.time_evaluator(lambda: ex.run_sync(), number=10, repeat=3)
        print(timer().mean)                        # seconds per call
        result = await asyncrt.time_evaluator(ex.run, repeat=3).acall(x=data)

    :param func: what to measure: a plain or a coroutine function.
    :param number: calls per measurement (the mean of them is kept).
    :param repeat: how many measurements.
    :param min_repeat_ms: the least milliseconds one measurement should
        last; ``number`` grows until it does.
    :param limit_zero_time_iterations: how often a measurement of 0 s is
        retried before it is kept.
    :param cooldown_interval_ms: a pause after every ``repeats_to_cooldown``
        measurements.
    :param repeats_to_cooldown: see ``cooldown_interval_ms``.
    :param progress: called after each measurement with (done, repeat).
    :return: the evaluator: call it, or ``await evaluator.acall(...)``.
    :raises ArgumentError: if a count is < 1, a duration < 0, or ``func``
        is not callable.
    """
    if not callable(func):
        raise ArgumentError(f"time_evaluator needs a callable, got {func!r}")
    settings = Settings(
        number,
        repeat,
        min_repeat_ms,
        limit_zero_time_iterations,
        cooldown_interval_ms,
        repeats_to_cooldown,
    )
    return TimeEvaluator(func, settings, progress)


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)
