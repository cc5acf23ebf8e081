"""The debug executor: the executor's API, traced; TVM's profile,
run_individual, debug_get_output and the dump layout; async twins."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from asyncrt import debug_executor, nd
from asyncrt.errors import ArgumentError, InputError
from asyncrt.graph import Graph, GraphBuilder
from devices import sim
from devices.sim import SimConfig

from .library_reference import library_tanh

N = 64
CONFIG = SimConfig(flops=1e9, bandwidth=4e9, latency=2e-6)
RNG = np.random.default_rng(3)
W = RNG.standard_normal((N, N)).astype(np.float32)
X = RNG.standard_normal((4, N)).astype(np.float32)


def graph() -> Graph:
    """x -> matmul(w) on sim:0 -> tanh on cpu, and relu(x) on sim:1; sum."""
    b = GraphBuilder()
    x = b.input("x", shape=(4, N), dtype="float32")
    w = b.param("w", shape=(N, N), dtype="float32")
    m = b.op("matmul", x, w, shape=(4, N), dtype="float32", name="mm", device="sim:0")
    t = b.op("tanh", m, shape=(4, N), dtype="float32", name="th", device="cpu:0")
    r = b.op("relu", x, shape=(4, N), dtype="float32", name="rl", device="sim:1")
    b.output(b.op("add", t, r, shape=(4, N), dtype="float32", name="out"))
    return b.build()


def expected() -> dict[str, np.ndarray]:
    mm = X @ W
    th, rl = library_tanh(mm), np.maximum(X, 0)
    return {"x": X, "w": W, "mm": mm, "th": th, "rl": rl, "out": th + rl}


@pytest.fixture
def ex(tmp_path: Path) -> Any:
    sim.configure(2, CONFIG)
    module = debug_executor.create(
        graph(), None, ["cpu:0", "sim:0", "sim:1"], dump_root=tmp_path / "dbg"
    )
    module.load_params({"w": W})
    yield module
    module.close()


@pytest.mark.anyio
async def test_runs_as_the_graph_executor_and_traces_every_run(ex: Any) -> None:
    results: list[Any] = [None] * 3

    async def one(i: int) -> None:
        results[i] = await ex.run(x=X)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(one, i)
    for out in results:
        np.testing.assert_allclose(out[0].numpy(), expected()["out"], rtol=1e-5)
    runs = ex.trace.runs()
    assert len(runs) == 3 and all(r.complete for r in runs)
    assert len({r.run for r in runs}) == 3


def test_profile_reports_every_launch_with_device_times(ex: Any) -> None:
    report = ex.profile(runs=3, x=X)
    assert report.runs == 3
    by_name = {n.name: n for n in report.nodes}
    assert {"mm", "th", "rl", "out"} <= set(by_name)
    launches = {launch.name: launch for launch in ex.plan.launches()}
    for name in ("mm", "rl"):  # on the sims: the modelled time, exactly
        assert by_name[name].time == pytest.approx(
            CONFIG.compute_seconds(launches[name].work), rel=1e-12
        )
        assert len(set(by_name[name].measurements)) == 1  # no noise in a model
    assert by_name["mm"].device == "sim:0" and by_name["mm"].op == "matmul"
    # w lives on the host: a planned copy brings it to sim:0 first.
    copy = by_name[by_name["mm"].inputs[1]]
    assert copy.op == "__copy" and copy.inputs == ("w",)
    assert copy.time == pytest.approx(CONFIG.copy_seconds(W.nbytes), rel=1e-12)
    assert by_name["out"].shapes == ((4, N),)
    assert sum(n.percent for n in report.nodes) == pytest.approx(100.0)
    assert report.total == pytest.approx(sum(n.time for n in report.nodes))


def test_run_individual_gives_repeat_means_per_graph_node(ex: Any) -> None:
    ex.set_input(x=X)
    times = ex.run_individual(number=2, repeat=3)
    assert len(times) == len(ex.graph.nodes)
    assert all(len(row) == 3 for row in times)
    names = [node.name for node in ex.graph.nodes]
    assert times[names.index("x")] == [0.0] * 3  # inputs take no time
    assert times[names.index("w")] == [0.0] * 3
    work = {launch.name: launch.work for launch in ex.plan.launches()}
    for value in times[names.index("mm")]:
        assert value == pytest.approx(CONFIG.compute_seconds(work["mm"]), rel=1e-12)
    assert all(v > 0 for v in times[names.index("th")])
    # The executor's own trace is left alone, and tracing goes on after.
    before = len(ex.trace.runs())
    ex.run_sync()
    assert len(ex.trace.runs()) == before + 1


def test_debug_get_output_by_name_and_index(ex: Any) -> None:
    ex.set_input(x=X)
    values = expected()
    for name in ("mm", "th", "rl", "out", "x", "w"):
        got = ex.debug_get_output(name).numpy()
        np.testing.assert_allclose(got, values[name], rtol=1e-5, atol=1e-6)
    index = [n.name for n in ex.graph.nodes].index("th")
    target = nd.empty((4, N), "float32")
    assert ex.debug_get_output(index, target) is target
    np.testing.assert_allclose(target.numpy(), values["th"], rtol=1e-5)
    with pytest.raises(InputError, match="no node named 'nope'"):
        ex.debug_get_output("nope")
    with pytest.raises(InputError, match="out of range"):
        ex.debug_get_output(99)
    with pytest.raises(InputError, match="output"):
        ex.debug_get_output("mm", index=1)


def test_dump_writes_tvm_layout(ex: Any, tmp_path: Path) -> None:
    host_dir = ex.dump(x=X)
    root = tmp_path / "dbg"
    assert host_dir == root / "_tvmdbg_device_CPU_0"
    values = expected()
    files = {
        "th": root / "_tvmdbg_device_CPU_0/th____topo-index_3____output-num_0.npy",
        "mm": root / "_tvmdbg_device_SIM_0/mm____topo-index_2____output-num_0.npy",
        "rl": root / "_tvmdbg_device_SIM_1/rl____topo-index_4____output-num_0.npy",
        "x": root / "_tvmdbg_device_CPU_0/x____topo-index_0____output-num_0.npy",
    }
    for name, path in files.items():
        np.testing.assert_allclose(np.load(path), values[name], rtol=1e-5, atol=1e-6)
    dumped = json.loads((host_dir / "_tvmdbg_graph_dump.json").read_text())
    nodes = {node["name"]: node for node in dumped["nodes"]}
    assert nodes["x"]["op"] == "param" and nodes["w"]["op"] == "param"
    assert nodes["mm"]["op"] == "matmul"
    assert nodes["mm"]["inputs"] == ["x", "w"]
    assert nodes["mm"]["shape"] == [4, N]
    assert nodes["mm"]["attrs"]["T"] == "type: float32"
    assert nodes["mm"]["device"] == "sim:0"
    assert isinstance(nodes["mm"]["stream"], int)
    trace = json.loads((host_dir / "_tvmdbg_execution_trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"mm", "th", "rl", "out"} <= names
    # A second dump replaces the tensors of the first.
    stale = root / "_tvmdbg_device_SIM_0/old.npy"
    np.save(stale, np.zeros(1))
    ex.dump()
    assert not stale.exists() and files["mm"].exists()


def test_dump_makes_a_temporary_root_when_none_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # cleaned up for us
    sim.configure(2, CONFIG)
    with debug_executor.create(graph(), None, ["cpu:0", "sim:0", "sim:1"]) as ex:
        assert ex.dump_root is None
        ex.load_params({"w": W})
        path = ex.dump(x=X)
        assert ex.dump_root is not None and path.parent == ex.dump_root
        assert ex.dump_root.name.startswith("asyncrtdbg_")
        assert ex.dump_root.parent == tmp_path


@pytest.mark.anyio
async def test_async_twins(ex: Any) -> None:
    report = await ex.aprofile(runs=2, x=X)
    assert report.runs == 2
    times = await ex.arun_individual(1, repeat=2)
    assert len(times) == len(ex.graph.nodes)
    got = await ex.adebug_get_output("rl")
    np.testing.assert_allclose(got.numpy(), expected()["rl"])
    path = await ex.adump()
    assert (path / "_tvmdbg_graph_dump.json").exists()


@pytest.mark.anyio
async def test_coroutine_kernels_are_profiled(tmp_path: Path) -> None:
    import asyncrt

    async def slow_double(x: np.ndarray, out: np.ndarray) -> None:
        await anyio.sleep(0)
        np.multiply(x, 2, out)

    b = GraphBuilder()
    x = b.input("x", shape=(N,), dtype="float32")
    b.output(b.op("slow_double", x, shape=(N,), dtype="float32", name="d"))
    lib = asyncrt.Module({"slow_double": slow_double})
    with debug_executor.create(b.build(), lib, "cpu") as ex:
        report = await ex.aprofile(runs=2, x=np.ones(N, np.float32))
        assert [n.name for n in report.nodes] == ["d"]
        np.testing.assert_array_equal((await ex.adebug_get_output("d")).numpy(), 2)


def test_bad_arguments(tmp_path: Path, ex: Any) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(ArgumentError, match="not a folder"):
        debug_executor.create(graph(), None, "cpu", dump_root=afile)
    with pytest.raises(ArgumentError, match="max_runs"):
        debug_executor.create(graph(), None, "cpu", max_runs=0)
    with pytest.raises(ArgumentError, match="number"):
        ex.run_individual(0)
    with pytest.raises(ArgumentError, match="runs"):
        ex.profile(runs=0)
    with pytest.raises(InputError, match="never set"):
        ex.profile()


def test_a_failed_measurement_puts_the_tracer_back() -> None:
    import asyncrt
    from asyncrt.errors import NodeFailedError

    broken = {"now": False}

    def flaky(x: np.ndarray, out: np.ndarray) -> None:
        if broken["now"]:
            raise RuntimeError("flaky")
        np.copyto(out, x)

    b = GraphBuilder()
    x = b.input("x", shape=(N,), dtype="float32")
    b.output(b.op("flaky", x, shape=(N,), dtype="float32", name="f"))
    lib = asyncrt.Module({"flaky": flaky})
    with debug_executor.create(b.build(), lib, "cpu") as ex:
        ex.set_input(x=np.ones(N, np.float32))
        broken["now"] = True
        with pytest.raises(NodeFailedError):
            ex.run_individual(2)
        with pytest.raises(NodeFailedError):
            ex.debug_get_output("f")
        broken["now"] = False
        before = len(ex.trace.runs())
        ex.run_sync()
        assert len(ex.trace.runs()) == before + 1  # traced into ex.trace again


def test_an_ambiguous_node_name_is_refused_not_the_first_returned() -> None:
    # Real TVM files repeat operator names; a lookup by such a name must not
    # silently pick one of the nodes.
    b = GraphBuilder()
    x = b.input("x", shape=(2,), dtype="float32")
    first = b.op("relu", x, shape=(2,), dtype="float32", name="act")
    b.output(b.op("negative", first, shape=(2,), dtype="float32", name="act2"))
    data = b.build().to_dict()
    data["nodes"][2]["name"] = "act"  # as TVM's compiler may write it
    with debug_executor.create(json.dumps(data)) as module:
        module.set_input(x=np.array([-1.0, 2.0], np.float32))
        with pytest.raises(InputError, match=r"'act' is ambiguous: nodes 1, 2"):
            module.debug_get_output("act")
        np.testing.assert_array_equal(module.debug_get_output(2).numpy(), [0, -2])


def test_a_fused_node_is_refused_by_name_and_kept_with_fuse_off(tmp_path: Path) -> None:
    # relu -> negative -> exp fuses into one kernel: the members have no
    # tensor of their own, which the error says (it used to be a KeyError).
    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    r = b.op("relu", x, shape=(4,), dtype="float32", name="r")
    n = b.op("negative", r, shape=(4,), dtype="float32", name="n")
    b.output(b.op("exp", n, shape=(4,), dtype="float32", name="e"))
    data = np.array([-1.0, 0.5, 2.0, -3.0], np.float32)
    want_n = -np.maximum(data, 0)
    with debug_executor.create(b.build(), fuse=True, dump_root=tmp_path / "f") as fused:
        fused.set_input(x=data)
        assert [node.name for node in fused.profile(runs=1).nodes] == [
            "fused_relu_neg_exp"
        ]
        with pytest.raises(
            InputError, match=r"'n' was fused into 'fused_relu_neg_exp'.*fuse=False"
        ):
            fused.debug_get_output("n")
        np.testing.assert_allclose(fused.debug_get_output("e").numpy(), np.exp(want_n))
        root = fused.dump()
        assert not list(root.glob("n____*.npy"))
    with debug_executor.create(b.build(), fuse=False, dump_root=tmp_path) as plain:
        plain.set_input(x=data)
        np.testing.assert_array_equal(plain.debug_get_output("n").numpy(), want_n)
