"""``GraphModule.benchmark``: the time evaluator applied to an executor's
runs, with TVM's meaning of ``end_to_end``.

Without ``end_to_end`` the inputs are set once and the stateful run is
timed: the device work of a run, no input or output copies. With it, every
timed run is a full call with its inputs (copied in) and outputs (copied
out), as a client would see it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from devices import Device

from ..errors import ArgumentError
from ._time_evaluator import BenchmarkResult, Progress, TimeEvaluator, time_evaluator

if TYPE_CHECKING:
    from ..graph_executor import GraphModule

__all__ = ("abenchmark", "benchmark")


def _check_device(module: GraphModule, device: Device | str | None) -> None:
    """TVM passes the device to time on; here the plan decides, so only
    check that it is one the executor uses."""
    if device is None:
        return
    try:
        wanted = device if isinstance(device, Device) else Device.parse(str(device))
    except Exception as exc:
        raise ArgumentError(f"benchmark: cannot use device {device!r}: {exc}") from exc
    if wanted not in module.plan.devices:
        used = ", ".join(map(str, module.plan.devices))
        raise ArgumentError(
            f"benchmark: {wanted} is not one of this executor's devices ({used})"
        )


def _evaluator(
    func: Callable[..., Any],
    repeat: int,
    number: int,
    min_repeat_ms: float | None,
    progress: Progress | None,
) -> TimeEvaluator:
    return time_evaluator(
        func,
        number=number,
        repeat=repeat,
        min_repeat_ms=0.0 if min_repeat_ms is None else min_repeat_ms,
        progress=progress,
    )


def benchmark(
    module: GraphModule,
    device: Device | str | None,
    repeat: int,
    number: int,
    min_repeat_ms: float | None,
    end_to_end: bool,
    progress: Progress | None,
    inputs: Mapping[str, Any],
) -> BenchmarkResult:
    """Time ``module``'s runs, blocking; see :meth:`GraphModule.benchmark`."""
    _check_device(module, device)
    if end_to_end:
        evaluator = _evaluator(
            lambda: module.run_sync(**inputs), repeat, number, min_repeat_ms, progress
        )
        return evaluator()
    evaluator = _evaluator(module.run_sync, repeat, number, min_repeat_ms, progress)
    if inputs:
        module.set_input(**inputs)
    return evaluator()


async def abenchmark(
    module: GraphModule,
    device: Device | str | None,
    repeat: int,
    number: int,
    min_repeat_ms: float | None,
    end_to_end: bool,
    progress: Progress | None,
    inputs: Mapping[str, Any],
) -> BenchmarkResult:
    """Time ``module``'s runs, awaiting them; see
    :meth:`GraphModule.abenchmark`."""
    _check_device(module, device)

    async def full_run() -> None:
        await module.run(**inputs)

    async def stateful_run() -> None:
        await module.run()

    if end_to_end:
        return await _evaluator(
            full_run, repeat, number, min_repeat_ms, progress
        ).acall()
    evaluator = _evaluator(stateful_run, repeat, number, min_repeat_ms, progress)
    if inputs:
        module.set_input(**inputs)
    return await evaluator.acall()
