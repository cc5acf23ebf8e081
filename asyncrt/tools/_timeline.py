"""Timelines of traced runs in the Chrome trace-event format.

The JSON opens in Perfetto (ui.perfetto.dev) and in ``chrome://tracing``:

* one *process* per device, one *thread* (track) per stream that ran work
  (concurrent runs use different streams, so their work never overlaps on a
  track);
* kernels and copies are complete events (``"ph": "X"``, categories
  ``kernel`` and ``copy``) with the node, op, run and device time in their
  ``args``; records and waits are complete events of category ``sync``
  (a record lasts 0 µs, a wait as long as its stream was held), and a flow
  arrow (``"s"`` -> ``"f"``) joins each record to the waits on it;
* each run is an async slice (``"b"``/``"e"``, category ``run``, one id per
  run) in a ``runs`` process, from issue to its last stream's end, so
  concurrent runs show as overlapping slices.

Timestamps are microseconds from the earliest run's start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.trace import RunTrace, Span

__all__ = ("chrome_trace", "save_chrome_trace")

_RUNS_PID = 0


def chrome_trace(runs: Sequence[RunTrace]) -> dict[str, Any]:
    """The trace-event JSON object of ``runs``.

    :param runs: traced runs (of one executor).
    :return: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.
    """
    events: list[dict[str, Any]] = []
    origin = min((r.start for r in runs), default=0.0)

    def us(seconds: float) -> float:
        return round((seconds - origin) * 1e6, 3)

    pids, tids = _tracks(runs)
    events.append(_meta("process_name", _RUNS_PID, 0, {"name": "runs"}))
    events.append(_meta("process_sort_index", _RUNS_PID, 0, {"sort_index": 0}))
    for device, pid in pids.items():
        events.append(_meta("process_name", pid, 0, {"name": device}))
        events.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
    for (device, label), (tid, stream) in tids.items():
        pid = pids[device]
        name = f"{label} (plan stream {stream})"
        events.append(_meta("thread_name", pid, tid, {"name": name}))
        events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
    for run in runs:
        name = f"run {run.run}"
        args = {"run": run.run, "context": run.context, "complete": run.complete}
        common = {"cat": "run", "name": name, "id": run.run, "pid": _RUNS_PID}
        events.append(
            {**common, "ph": "b", "tid": 0, "ts": us(run.start), "args": args}
        )
        events.append({**common, "ph": "e", "tid": 0, "ts": us(run.end)})
        slices = []
        for span in run.spans:
            pid = pids[str(span.device)]
            tid = tids[str(span.device), span.label][0]
            slices.append((span, _slice(span, run.run, pid, tid, us)))
        events.extend(event for _, event in slices)
        flows = _flows(slices, first_id=len(events))
        events.extend(flows)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "asyncrt", "runs": len(runs)},
    }


def save_chrome_trace(path: str | os.PathLike[str], runs: Sequence[RunTrace]) -> Path:
    """Write :func:`chrome_trace` of ``runs`` to ``path``.

    :return: the path written.
    :raises OSError: if the file cannot be written.
    """
    target = Path(path)
    target.write_text(json.dumps(chrome_trace(runs)), encoding="utf-8")
    return target


def _tracks(
    runs: Sequence[RunTrace],
) -> tuple[dict[str, int], dict[tuple[str, str], tuple[int, int]]]:
    """Process ids by device and (thread id, plan stream) by stream label,
    in a stable order: devices by name, streams by plan stream, label."""
    streams: dict[tuple[str, str], int] = {}
    for run in runs:
        for span in run.spans:
            streams.setdefault((str(span.device), span.label), span.stream)
    devices = sorted({device for device, _ in streams})
    pids = {device: i + 1 for i, device in enumerate(devices)}
    ordered = sorted(streams, key=lambda key: (key[0], streams[key], key[1]))
    tids = {key: (i + 1, streams[key]) for i, key in enumerate(ordered)}
    return pids, tids


def _flows(
    slices: Sequence[tuple[Span, dict[str, Any]]], first_id: int
) -> list[dict[str, Any]]:
    """Arrows from each record to the launch that follows each wait on it:
    the start binds to the record's slice, the end to the waiting stream's
    next launch (or to the wait, if nothing follows it)."""
    records = {span.event: event for span, event in slices if span.kind == "record"}
    arrows: list[dict[str, Any]] = []
    pending: list[tuple[Span, dict[str, Any]]] = []  # waits not yet followed

    def connect(target: dict[str, Any]) -> None:
        for wait, _ in pending:
            source = records.get(wait.event)
            if source is None:
                continue
            flow = {
                "cat": "sync",
                "name": f"e{wait.event}",
                "id": first_id + len(arrows),
            }
            arrows.append(
                {**flow, "ph": "s", "pid": source["pid"], "tid": source["tid"],
                 "ts": source["ts"]}
            )  # fmt: skip
            arrows.append(
                {**flow, "ph": "f", "bp": "e", "pid": target["pid"],
                 "tid": target["tid"], "ts": target["ts"]}
            )  # fmt: skip
        pending.clear()

    previous: Span | None = None
    for span, event in slices:
        if previous is not None and previous.label != span.label and pending:
            connect(pending[-1][1])  # the stream ended on waits
        if span.kind == "wait":
            pending.append((span, event))
        elif span.launch is not None and pending:
            connect(event)
        previous = span
    if pending:
        connect(pending[-1][1])
    return arrows


def _slice(span: Span, run: int, pid: int, tid: int, us: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"run": run, "stream": span.stream}
    if span.launch is not None:
        name = span.launch.name
        args.update(
            node=span.launch.name,
            op=span.launch.func_name,
            device_time_us=round(span.device_time * 1e6, 3),
        )
        cat: str = span.kind
    else:
        name = f"{span.kind} e{span.event}"
        args["event"] = span.event
        cat = "sync"
    start = us(span.start)
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": start,
        "dur": max(round(us(span.end) - start, 3), 0.0),
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
