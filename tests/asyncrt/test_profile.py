"""The profile report, from runs with known times: means, shares, sums per
op and per device, sorting, cutting, and the text, JSON and CSV forms."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from asyncrt import graph_executor
from asyncrt.errors import ArgumentError
from asyncrt.graph import GraphBuilder
from asyncrt.profiling import ProfileReport
from scheduler.plan import Launch, Plan
from scheduler.trace import RunTrace, Span

#: Device seconds of each node in run 0 and run 1.
TIMES = {
    "mm": (4e-3, 6e-3),
    "t1": (1e-3, 1e-3),
    "t2": (2e-3, 2e-3),
    "out": (0.5e-3, 1.0e-3),
}


def plan() -> Plan:
    b = GraphBuilder()
    x = b.input("x", shape=(2, 8), dtype="float32")
    w = b.param("w", shape=(8, 8), dtype="float32")
    m = b.op("matmul", x, w, shape=(2, 8), dtype="float32", name="mm")
    t1 = b.op("tanh", m, shape=(2, 8), dtype="float32", name="t1")
    t2 = b.op("tanh", x, shape=(2, 8), dtype="float32", name="t2")
    b.output(b.op("add", t1, t2, shape=(2, 8), dtype="float32", name="out"))
    with graph_executor.create(b.build(), None, "cpu", fuse=False) as ex:
        return ex.plan  # every node a launch of its own


def fake_runs(p: Plan, *, complete: bool = True) -> list[RunTrace]:
    """Two runs, launches back to back on stream 0, with :data:`TIMES`."""
    runs = []
    for r in range(2):
        clock, spans = 10.0 * r, []
        for launch in p.launches():
            seconds = TIMES[launch.name][r]
            spans.append(
                Span("kernel", 0, "cpu:0/stream0", p.host, clock, clock + seconds,
                     seconds, launch)
            )  # fmt: skip
            clock += seconds
        runs.append(RunTrace(r, 0, 10.0 * r, clock, tuple(spans), complete))
    return runs


@pytest.fixture(scope="module")
def report() -> ProfileReport:
    p = plan()
    return ProfileReport.from_runs(p, fake_runs(p), {0: "x", 1: "w"})


def test_node_lines_are_means_with_shares(report: ProfileReport) -> None:
    nodes = {n.name: n for n in report.nodes}
    assert set(nodes) == set(TIMES)
    assert nodes["mm"].time == pytest.approx(5e-3)
    assert nodes["mm"].measurements == (4e-3, 6e-3)
    assert report.total == pytest.approx(5e-3 + 1e-3 + 2e-3 + 0.75e-3)
    assert nodes["mm"].percent == pytest.approx(100 * 5 / 8.75)
    assert sum(n.percent for n in report.nodes) == pytest.approx(100)
    assert nodes["mm"].inputs == ("x", "w") and nodes["out"].inputs == ("t1", "t2")
    assert nodes["mm"].shapes == ((2, 8),) and nodes["mm"].dtypes == ("float32",)
    assert nodes["mm"].op == "matmul" and nodes["mm"].device == "cpu:0"
    assert report.runs == 2
    assert report.run_time == pytest.approx((7.5e-3 + 10e-3) / 2)


def test_groups_per_op_and_device(report: ProfileReport) -> None:
    ops = {g.key: g for g in report.by_op()}
    assert ops["tanh"].count == 2 and ops["tanh"].time == pytest.approx(3e-3)
    assert next(g.key for g in report.by_op()) == "matmul"  # slowest first
    (device,) = report.by_device()
    assert device.key == "cpu:0" and device.count == 4
    assert device.percent == pytest.approx(100)
    with pytest.raises(ArgumentError, match="group by"):
        report.groups("stream")  # type: ignore[arg-type]


def test_sorting_and_cutting(report: ProfileReport) -> None:
    assert [n.name for n in report.sort("time").nodes] == ["mm", "t2", "t1", "out"]
    assert next(n.name for n in report.sort("time", descending=False).nodes) == "out"
    assert [n.name for n in report.sort("name").nodes] == ["mm", "out", "t1", "t2"]
    assert next(n.name for n in report.sort("order").nodes) == "mm"
    top = report.sort("time").head(2)
    assert [n.name for n in top.nodes] == ["mm", "t2"]
    assert top.total == report.total  # shares stay parts of the whole
    with pytest.raises(ArgumentError, match="cannot sort by 'speed'"):
        report.sort("speed")


def test_text_table(report: ProfileReport) -> None:
    text = report.sort("time").table()
    lines = text.splitlines()
    assert lines[0].split()[:6] == [
        "Node", "Op", "Device", "Stream", "Time(us)", "Time(%)",
    ]  # fmt: skip
    assert lines[2].split()[:5] == ["mm", "matmul", "cpu:0", "0", "5000.000"]
    assert lines[-1].split()[:5] == ["Total", "-", "-", "-", "8750.000"]
    assert "tanh" in report.table("op") and "cpu:0" in report.table("device")
    assert "4 nodes, 2 run(s)" in str(report)


def test_json_and_csv(report: ProfileReport) -> None:
    data = json.loads(report.to_json())
    assert data["runs"] == 2 and len(data["nodes"]) == 4
    assert {g["key"] for g in data["by_op"]} == {"matmul", "tanh", "add"}
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    mm = next(r for r in rows if r["name"] == "mm")
    assert float(mm["time_s"]) == pytest.approx(5e-3)
    assert mm["inputs"] == "x;w" and mm["shape"] == "(2, 8)"
    ops = list(csv.DictReader(io.StringIO(report.to_csv("op"))))
    assert {r["op"] for r in ops} == {"matmul", "tanh", "add"}


def test_only_complete_runs_count() -> None:
    p = plan()
    runs = fake_runs(p)
    broken = fake_runs(p, complete=False)
    report = ProfileReport.from_runs(p, [runs[0], broken[1]], {})
    assert report.runs == 1
    assert {n.name: n.time for n in report.nodes}["mm"] == pytest.approx(4e-3)
    with pytest.raises(ArgumentError, match="no complete"):
        ProfileReport.from_runs(p, broken, {})


def test_copies_are_named_by_their_launch() -> None:
    p = plan()
    (first, *_) = p.launches()
    copy = Launch(99, "copy_0_0_to_sim0", "__copy", (first.args[0], first.args[-1]), 1)
    span = Span("copy", 0, "l", p.host, 0.0, 1e-3, 1e-3, copy)
    report = ProfileReport.from_runs(p, [RunTrace(0, 0, 0.0, 1e-3, (span,), True)], {})
    (node,) = report.nodes
    assert node.name == "copy_0_0_to_sim0" and node.op == "__copy"


# -- grouped by operator type, with the configuration beside it ----------------------


def test_onnx_nodes_are_grouped_by_operator_type_with_their_configuration() -> None:
    from asyncrt import debug_executor
    from asyncrt.frontend import from_onnx

    from .frontend.models import small_cnn

    graph, params = from_onnx(small_cnn())
    convs = [n for n in graph.nodes if n.attrs.get("onnx_op") == "Conv"]
    assert len({n.func_name for n in convs}) > 1  # one kernel per configuration
    with debug_executor.create(graph, None, "cpu", params=params) as ex:
        x = np.zeros(graph.shape[0], np.float32)
        report = ex.profile(runs=1, x=x)
    ops = {g.key: g for g in report.by_op()}
    assert ops["Conv"].count == len(convs)
    assert ops["Conv"].kernels == len({n.func_name for n in convs})
    assert not any(key.startswith("conv.") for key in ops)
    conv = next(n for n in report.nodes if n.kind == "Conv")
    assert conv.op.startswith("conv.")  # the kernel itself stays in the data
    assert "strides=" in conv.config and "pads=" in conv.config
    table = report.table("node")
    assert "Config" in table.splitlines()[0] and "strides=" in table
    assert "Kernels" in report.table("op")
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert {r["op_type"] for r in rows} >= {"Conv", "Add"}
    assert next(r for r in rows if r["op_type"] == "Conv")["config"] == conv.config
