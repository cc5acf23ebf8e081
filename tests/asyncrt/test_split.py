"""The executor's row splitting (``create(split=...)``): a join of parallel
branches over large arrays runs as one part per cpu stream, bit-identical
to the unsplit node, through every way to run, debug and profile a graph.

The arrays are large (4 MiB) so that the measured cost model surely finds
the split worth a thread wake-up; the tests assert what the planner chose
and what the runs computed, never how long anything took. Fusion is off
(``fuse=False``): by default chains this large are fused instead, and a
fused node is not split.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asyncrt
from asyncrt import debug_executor, graph_executor
from asyncrt.errors import ArgumentError, NodeFailedError
from asyncrt.graph import Graph, GraphBuilder
from scheduler.happens_before import check_plan
from scheduler.plan import Launch, Plan

from .library_reference import library_tanh

N = 1 << 20  # float32: 4 MiB a tensor
BRANCHES = 4
RNG = np.random.default_rng(5)
X = RNG.uniform(-1.0, 1.0, N).astype(np.float32)
SCALES = RNG.uniform(0.5, 1.5, (BRANCHES, 1)).astype(np.float32)

Array = np.ndarray[Any, Any]


def wide(join: str = "sum", first_tanh: str = "tanh") -> Graph:
    """x -> ``BRANCHES`` x (multiply by a parameter, tanh) -> one join; the
    first branch's tanh is ``first_tanh``."""
    b = GraphBuilder()
    x = b.input("x", shape=(N,), dtype="float32")
    outs = []
    for i in range(BRANCHES):
        c = b.param(f"c{i}", shape=(1,), dtype="float32")
        m = b.op("multiply", x, c, shape=(N,), dtype="float32", name=f"m{i}")
        func = first_tanh if i == 0 else "tanh"
        outs.append(b.op(func, m, shape=(N,), dtype="float32", name=f"t{i}"))
    b.output(b.op(join, *outs, shape=(N,), dtype="float32", name="j"))
    return b.build()


def params() -> dict[str, Array]:
    return {f"c{i}": SCALES[i] for i in range(BRANCHES)}


def expected(x: Array = X) -> Array:
    branches = [library_tanh(np.multiply(x, SCALES[i])) for i in range(BRANCHES)]
    total = np.add(branches[0], branches[1])
    for other in branches[2:]:
        np.add(total, other, total)
    return total


def parts(plan: Plan) -> dict[str, list[Launch]]:
    found: dict[str, list[Launch]] = {}
    for launch in plan.launches():
        if launch.part is not None:
            found.setdefault(launch.name, []).append(launch)
    return found


def test_the_join_runs_in_one_part_per_stream_bit_for_bit() -> None:
    with graph_executor.create(wide(), None, "cpu", max_streams=2, fuse=False) as ex:
        check_plan(ex.plan)
        split = parts(ex.plan)
        assert set(split) == {"j"}
        assert [p.label for p in split["j"]] == ["j[0/2]", "j[1/2]"]
        assert "j[0/2] = sum(" in str(ex.plan) and "n" in ex.plan.to_dot()
        ex.load_params(params())
        got = ex.run_sync(x=X)
        assert got is not None
        np.testing.assert_array_equal(got[0].numpy(), expected())
        ex.set_input(x=X)  # TVM's stateful style too
        ex.run_sync()
        np.testing.assert_array_equal(ex.get_output(0).numpy(), expected())


def test_awaited_and_concurrent_runs_of_a_split_plan(anyio_backend: str) -> None:
    xs = [RNG.uniform(-1.0, 1.0, N).astype(np.float32) for _ in range(3)]
    with graph_executor.create(
        wide(), None, "cpu", max_streams=2, fuse=False, params=params()
    ) as ex:
        assert parts(ex.plan)
        results: list[Any] = [None] * len(xs)

        async def main() -> None:
            async def one(k: int) -> None:
                results[k] = await ex.run(x=xs[k])

            async with anyio.create_task_group() as tg:
                for k in range(len(xs)):
                    tg.start_soon(one, k)

        anyio.run(main, backend=anyio_backend)
        for x, got in zip(xs, results, strict=True):
            np.testing.assert_array_equal(got[0].numpy(), expected(x))


def test_what_keeps_the_join_whole() -> None:
    graph = wide()
    for options in (
        {"max_streams": 1},  # one stream: nothing to share the join with
        {"max_streams": 2, "fuse": False, "split": False},
        {
            "max_streams": 2,
            "fuse": False,
            "split_min_bytes": 4 * N + 1,
        },  # below the size
    ):
        with graph_executor.create(graph, None, "cpu", **options) as ex:
            assert not parts(ex.plan), options
    lib = asyncrt.Module({"my_sum": _my_sum})  # not known to be elementwise
    with graph_executor.create(
        wide("my_sum"), lib, "cpu", max_streams=2, fuse=False
    ) as ex:
        assert not parts(ex.plan)
    # "sum" from a lib is the lib's own kernel: it could mean anything.
    same_name = asyncrt.Module({"sum": _my_sum})
    with graph_executor.create(
        graph, same_name, "cpu", max_streams=2, fuse=False
    ) as ex:
        assert not parts(ex.plan)


def _my_sum(*arrays: Array) -> None:
    *inputs, out = arrays
    out[...] = sum(inputs)


def test_split_min_bytes_must_be_a_count() -> None:
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ArgumentError, match="split_min_bytes"):
            graph_executor.create(wide(), None, "cpu", split_min_bytes=bad)


def test_failed_and_cancelled_runs_of_a_split_plan_release_everything(
    anyio_backend: str,
) -> None:
    """A branch kernel that fails, then one cancelled while it runs: each
    run ends (the parts queued behind it skipped), its context goes back
    to the pool, and the next run computes the join as before. (A failing
    part itself: tests/scheduler/test_split.py.)"""
    mode = ["fail"]
    started, release = threading.Event(), threading.Event()

    def tanh(a: Array, out: Array) -> None:
        if mode[0] == "fail":
            raise RuntimeError("boom")
        if mode[0] == "block":
            started.set()
            release.wait(10.0)
        out[...] = library_tanh(a)

    lib = asyncrt.Module({"my_tanh": tanh})
    with graph_executor.create(
        wide(first_tanh="my_tanh"),
        lib,
        "cpu",
        max_streams=2,
        fuse=False,
        params=params(),
    ) as ex:
        # The join splits (a branch's tanh may too: t0's kernel declares
        # no work, so its stream idles while another branch's tanh runs).
        assert "j" in parts(ex.plan)

        async def run() -> Any:
            return await ex.run(x=X)

        with pytest.raises(NodeFailedError, match="'t0'"):
            anyio.run(run, backend=anyio_backend)
        assert not ex.pool.lent

        async def cancelled() -> None:
            mode[0] = "block"
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run)
                    await anyio.to_thread.run_sync(started.wait)
                    scope.cancel()
                    release.set()
            assert scope.cancelled_caught

        anyio.run(cancelled, backend=anyio_backend)
        assert not ex.pool.lent
        mode[0] = "run"
        got = anyio.run(run, backend=anyio_backend)
        np.testing.assert_array_equal(got[0].numpy(), expected())


def test_profile_and_dump_of_a_split_node(tmp_path: Path) -> None:
    with debug_executor.create(
        wide(),
        None,
        "cpu",
        max_streams=2,
        fuse=False,
        params=params(),
        dump_root=tmp_path / "dbg",
    ) as ex:
        assert parts(ex.plan)
        report = ex.profile(runs=2, x=X)
        lines = [node for node in report.nodes if node.name == "j"]
        assert len(lines) == 1  # both parts, one line
        assert len(lines[0].measurements) == 2  # one per run: the parts summed
        host = ex.dump(x=X)
        (dumped,) = host.glob("j____*.npy")
        np.testing.assert_array_equal(np.load(dumped), expected())
        np.testing.assert_array_equal(ex.debug_get_output("j").numpy(), expected())
