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
from ._time_evaluator import Progress, TimeEvaluator, time_evaluator

if TYPE_CHECKING:
    from ..graph_executor import GraphModule

__all__ = ("evaluator",)


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


def evaluator(
    module: GraphModule,
    device: Device | str | None,
    times: tuple[int, int, float | None],
    end_to_end: bool,
    progress: Progress | None,
    inputs: Mapping[str, Any],
    *,
    awaited: bool,
) -> TimeEvaluator:
    """The time evaluator of ``module``'s runs (see
    :meth:`GraphModule.benchmark`): full calls with ``inputs`` if
    ``end_to_end``, else stateful runs with the inputs set once now;
    awaited runs (call its ``acall``) or blocking ones.

    :param times: ``(repeat, number, min_repeat_ms)``.
    :raises ArgumentError: for a device the executor does not use.
    """
    _check_device(module, device)

    async def full_run() -> None:
        await module.run(**inputs)

    async def stateful_run() -> None:
        await module.run()

    if awaited:
        runs: tuple[Callable[[], Any], Callable[[], Any]] = (full_run, stateful_run)
    else:
        runs = (lambda: module.run_sync(**inputs), module.run_sync)
    repeat, number, min_repeat_ms = times
    timed = time_evaluator(
        runs[0] if end_to_end else runs[1],
        number=number,
        repeat=repeat,
        min_repeat_ms=0.0 if min_repeat_ms is None else min_repeat_ms,
        progress=progress,
    )
    if inputs and not end_to_end:
        module.set_input(**inputs)
    return timed
