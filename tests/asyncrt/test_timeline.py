"""Timelines: the Chrome trace-event JSON of concurrent runs (tracks,
slices, flows, run boundaries), the Gantt chart and the plan picture."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from asyncrt import debug_executor
from asyncrt.errors import ArgumentError, MissingDependencyError, RenderError
from asyncrt.graph import Graph, GraphBuilder
from asyncrt.profiling import chrome_trace, save_gantt, save_plan_picture
from devices import sim
from scheduler.trace import RunTrace

N = 32
PNG = b"\x89PNG\r\n\x1a\n"


def graph() -> Graph:
    """Two branches on the sims, joined on the cpu."""
    b = GraphBuilder()
    x = b.input("x", shape=(N, N), dtype="float32")
    a = b.op("matmul", x, x, shape=(N, N), dtype="float32", name="a", device="sim:0")
    c = b.op("tanh", x, shape=(N, N), dtype="float32", name="c", device="sim:1")
    b.output(b.op("add", a, c, shape=(N, N), dtype="float32", name="j", device="cpu"))
    return b.build()


@pytest.fixture(scope="module")
def runs() -> list[RunTrace]:
    """Three concurrent runs (so three contexts) of the graph."""
    sim.configure(2)

    async def main() -> list[RunTrace]:
        x = np.ones((N, N), np.float32)
        with debug_executor.create(graph(), None, ["cpu", "sim:0", "sim:1"]) as ex:
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(lambda: ex.run(x=x))
            return ex.trace.runs()

    return anyio.run(main)


def test_trace_is_valid_trace_event_json(runs: list[RunTrace]) -> None:
    trace = json.loads(json.dumps(chrome_trace(runs)))  # plain JSON
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] == "ms"
    for event in events:
        assert {"ph", "pid", "tid", "name"} <= set(event)
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0 and event["cat"] in {"kernel", "copy", "sync"}


def test_one_process_per_device_one_track_per_stream(runs: list[RunTrace]) -> None:
    events = chrome_trace(runs)["traceEvents"]
    processes = {
        e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"
    }
    assert set(processes.values()) == {"runs", "cpu:0", "sim:0", "sim:1"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["name"] == "thread_name"
    }
    labels = {s.label for run in runs for s in run.spans}
    assert {name.split(" ")[0] for name in threads.values()} == labels
    assert len(labels) > len({s.stream for run in runs for s in run.spans})
    # Slices on one track never overlap (they are sequential on a stream).
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in threads
            by_track[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for slices in by_track.values():
        slices.sort()
        for (_, end), (start, _) in itertools.pairwise(slices):
            assert end <= start + 0.002  # µs rounding of the two ends
    kernels = {e["name"] for e in events if e["ph"] == "X" and e["cat"] == "kernel"}
    assert kernels == {"a", "c", "j"}


def test_each_run_is_an_async_slice(runs: list[RunTrace]) -> None:
    events = chrome_trace(runs)["traceEvents"]
    begins = {e["id"]: e for e in events if e["ph"] == "b"}
    ends = {e["id"]: e for e in events if e["ph"] == "e"}
    assert set(begins) == set(ends) == {r.run for r in runs}
    for run_id, begin in begins.items():
        assert begin["cat"] == ends[run_id]["cat"] == "run"
        assert begin["ts"] <= ends[run_id]["ts"]
    contexts = {begin["args"]["context"] for begin in begins.values()}
    assert len(contexts) == 3  # concurrent runs use different contexts


def test_flows_join_records_to_waiting_launches(runs: list[RunTrace]) -> None:
    events = chrome_trace(runs)["traceEvents"]
    slices = {(e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "X"}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(finishes)
    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        assert finish["bp"] == "e"
        # Each end sits on a slice of its track (so viewers can bind it).
        assert (start["pid"], start["tid"], start["ts"]) in slices
        assert (finish["pid"], finish["tid"], finish["ts"]) in slices
        assert (start["pid"], start["tid"]) != (finish["pid"], finish["tid"])


def test_gantt_png(runs: list[RunTrace], tmp_path: Path) -> None:
    path = save_gantt(tmp_path / "gantt.png", runs, title="three runs")
    assert path.read_bytes().startswith(PNG)
    with pytest.raises(ArgumentError, match=r"\.png, \.svg or \.pdf"):
        save_gantt(tmp_path / "gantt.txt", runs)
    with pytest.raises(ArgumentError, match="no traced run"):
        save_gantt(tmp_path / "empty.png", [])


def test_gantt_without_matplotlib_names_the_extra(
    runs: list[RunTrace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(MissingDependencyError, match=r"asyncrt\[plot\]") as info:
        save_gantt(tmp_path / "gantt.png", runs)
    assert info.value.package == "matplotlib"


def _plan() -> Any:
    with debug_executor.create(graph(), None, ["cpu", "sim:0", "sim:1"]) as ex:
        return ex.plan


def test_plan_picture_as_dot_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan()
    path = save_plan_picture(plan, tmp_path / "plan.dot")
    assert path.read_text().startswith("digraph plan {")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    fallback = save_plan_picture(plan, tmp_path / "plan.png")
    assert fallback == tmp_path / "plan.dot"  # no graphviz: DOT text instead
    with pytest.raises(ArgumentError, match="plan picture"):
        save_plan_picture(plan, tmp_path / "plan.jpg")


def test_plan_picture_when_dot_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    false = shutil.which("false")
    if false is None:
        pytest.skip("no `false` program here")
    monkeypatch.setattr(shutil, "which", lambda name: false)
    with pytest.raises(RenderError, match="dot failed"):
        save_plan_picture(_plan(), tmp_path / "plan.png")


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed")
def test_plan_picture_png_with_graphviz(tmp_path: Path) -> None:
    path = save_plan_picture(_plan(), tmp_path / "plan.png")
    assert path == tmp_path / "plan.png"
    assert path.read_bytes().startswith(PNG)
