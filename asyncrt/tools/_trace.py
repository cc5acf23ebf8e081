"""A :class:`Trace`: the traced runs of one executor, and what to make of
them (a profile report, a Chrome trace, a Gantt chart)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.plan import Plan
from scheduler.trace import RunTrace, TraceRecorder

from ._pictures import save_gantt
from ._profile import NodeOp, ProfileReport
from ._timeline import chrome_trace, save_chrome_trace

__all__ = ("Trace",)


class Trace:
    """The runs an executor traced (as many as its recorder keeps).

    :param plan: the executor's plan.
    :param names: node names by id.
    :param recorder: the recorder the executor's programs trace into.
    :param ops: operator types and configurations by node id, for the
        report's grouping (:func:`~asyncrt.tools._profile.node_ops`).
    """

    def __init__(
        self,
        plan: Plan,
        names: Mapping[int, str],
        recorder: TraceRecorder,
        ops: Mapping[int, NodeOp] | None = None,
    ) -> None:
        self.plan = plan
        self.names = dict(names)
        self.recorder = recorder
        self.ops = dict(ops or {})

    def runs(self) -> list[RunTrace]:
        """The finished runs, oldest first."""
        return self.recorder.runs()

    def clear(self) -> None:
        """Forget the runs recorded so far."""
        self.recorder.clear()

    def report(self) -> ProfileReport:
        """The profile report of the complete runs.

        :raises ArgumentError: if no run is complete.
        """
        return ProfileReport.from_runs(self.plan, self.runs(), self.names, self.ops)

    def chrome_trace(self) -> dict[str, Any]:
        """The runs as a Chrome trace / Perfetto JSON object."""
        return chrome_trace(self.runs())

    def save_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`chrome_trace` to ``path``.

        :raises OSError: if it cannot be written.
        """
        return save_chrome_trace(path, self.runs())

    def save_gantt(self, path: str | os.PathLike[str], *, title: str = "") -> Path:
        """Draw the runs as a Gantt chart of the streams.

        :raises MissingDependencyError: without matplotlib.
        :raises ArgumentError: if no run was recorded or the suffix is wrong.
        """
        return save_gantt(path, self.runs(), title=title)
