"""The executor on a real GPU: graphs on ``cuda:0`` alone and beside the cpu
and a sim, checked against numpy references and ONNX Runtime. Skips cleanly
without cupy and an NVIDIA GPU (the sims carry the heterogeneous paths
there)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncrt
from asyncrt import debug_executor, graph_executor
from asyncrt.errors import NodeFailedError
from asyncrt.frontend import from_onnx
from devices import Device

from .frontend.placements import round_robin
from .frontend.test_onnx_models import _case
from .test_cancellation import assert_all_back, assert_next_run_correct
from .test_executor import PARAMS, C, N, W, mlp_graph, reference
from .test_fusion import CHAIN_PARAMS, chain_graph
from .test_random_schedules import COMMON, Case, cases, run_placings

pytestmark = pytest.mark.cuda

cupy = pytest.importorskip("cupy")
if not Device("cuda", 0).exist:
    pytest.skip("no CUDA device", allow_module_level=True)

#: cupy's transcendental functions are not numpy's: a few ulps apart.
RTOL = 1e-5


def _mlp(device: str | list[str], **options: Any) -> graph_executor.GraphModule:
    ex = graph_executor.create(mlp_graph(), None, device, **options)
    ex.load_params(PARAMS)
    return ex


def _check_mlp(outs: Any, x: np.ndarray) -> None:
    assert outs is not None
    for got, want in zip(outs, reference(x, C, W), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=RTOL, atol=RTOL)


# -- one graph, on the gpu and across devices ----------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "devices", [["cuda:0"], ["cpu:0", "cuda:0"], ["cuda:0", "cpu:0", "sim:0"]]
)
async def test_builtin_kernels_run_on_cuda(devices: list[str]) -> None:
    with _mlp(devices, policy=round_robin) as ex:
        assert Device("cuda", 0) in set(ex.plan.placement.values())
        rng = np.random.default_rng(1)
        for _ in range(3):
            x = rng.standard_normal(N).astype(np.float32)
            _check_mlp(await ex.run(x=x), x)
        outs = ex.run_sync(x=x)
        assert outs is not None
        _check_mlp(outs, x)


@pytest.mark.anyio
async def test_concurrent_runs_across_the_gpu_and_the_cpu() -> None:
    with _mlp(
        ["cuda:0", "cpu:0"], policy=round_robin, max_streams=2, max_contexts=4
    ) as ex:
        assert Device("cuda", 0) in set(ex.plan.placement.values())
        xs = [
            np.random.default_rng(i).standard_normal(N).astype(np.float32)
            for i in range(8)
        ]
        outs: list[Any] = [None] * len(xs)

        async def one(k: int) -> None:
            outs[k] = await ex.run(x=xs[k])

        async with anyio.create_task_group() as tg:
            for k in range(len(xs)):
                tg.start_soon(one, k)
        for x, out in zip(xs, outs, strict=True):
            _check_mlp(out, x)


@pytest.mark.parametrize("name", ["cnn", "encoder"])
@pytest.mark.parametrize("where", ["cuda", "split"])
def test_onnx_models_match_onnxruntime(name: str, where: str) -> None:
    model, x, expected = _case(name)
    graph, params = from_onnx(model)
    if where == "cuda":
        devices, policy = ["cuda:0"], "auto"
    else:
        devices, policy = ["cpu:0", "cuda:0", "sim:0"], round_robin
    with graph_executor.create(
        graph, None, devices, policy=policy, params=params
    ) as ex:
        used = {
            ex.plan.placement[n]
            for n, node in enumerate(graph.nodes)
            if not node.is_null
        }
        assert Device("cuda", 0) in used
        (y,) = ex.run_sync(x=x) or []
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_fused_chain_is_one_elementwise_kernel_and_matches() -> None:
    x = np.linspace(-2, 2, 100_000, dtype=np.float32)
    graph = chain_graph(100_000)
    with graph_executor.create(graph, None, "cuda", params=CHAIN_PARAMS) as plain:
        expected = plain.run_sync(x=x)
    with graph_executor.create(
        graph, None, "cuda", fuse=True, params=CHAIN_PARAMS
    ) as fused:
        (launch,) = fused.plan.launches()
        got = fused.run_sync(x=x)
    assert launch.name.startswith("fused_")
    assert expected is not None and got is not None
    np.testing.assert_allclose(got[0].numpy(), expected[0].numpy(), rtol=RTOL)
    want = np.sqrt(np.exp(np.tanh(x * np.float32(1.25))))
    np.testing.assert_allclose(got[0].numpy(), want, rtol=RTOL)


# -- failures, cancellation, profiling ------------------------------------------


@pytest.mark.anyio
async def test_a_failing_gpu_kernel_names_its_node_and_the_executor_recovers() -> None:
    calls = {"n": 0}

    def flaky_relu(a: Any, out: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise FloatingPointError("boom")
        cupy.maximum(a, 0, out=out)

    lib = asyncrt.Module({"relu": {"cuda": flaky_relu}})
    x = np.linspace(-1, 1, N, dtype=np.float32)
    with graph_executor.create(mlp_graph(), lib, "cuda") as ex:
        ex.load_params(PARAMS)
        _check_mlp(await ex.run(x=x), x)
        with pytest.raises(NodeFailedError) as failed:
            await ex.run(x=x)
        assert failed.value.node == "relu0"
        assert_all_back(ex, 4)
        _check_mlp(await ex.run(x=x), x)


@pytest.mark.anyio
@settings(COMMON, max_examples=10)
@given(
    delays=st.lists(st.floats(0.0, 0.003), min_size=2, max_size=6),
    limit=st.integers(1, 3),
)
async def test_cancelled_gpu_runs_give_everything_back(
    delays: list[float], limit: int
) -> None:
    def sleepy_relu(a: Any, out: Any) -> None:
        time.sleep(0.001)  # the issuing thread holds the run a while
        cupy.maximum(a, 0, out=out)

    lib = asyncrt.Module({"relu": {"cuda": sleepy_relu}})
    async with graph_executor.create(
        mlp_graph(), lib, ["cuda:0", "cpu:0"], policy=round_robin, max_contexts=limit
    ) as ex:
        ex.load_params(PARAMS)
        rng = np.random.default_rng(len(delays))

        async def one(delay: float) -> None:
            x = rng.standard_normal(N).astype(np.float32)
            with anyio.move_on_after(delay):
                _check_mlp(await ex.run(x=x), x)

        async with anyio.create_task_group() as tg:
            for delay in delays:
                tg.start_soon(one, delay)
        assert_all_back(ex, limit)
        await assert_next_run_correct(ex)


@pytest.mark.parametrize("fuse", [False, "auto"])
def test_debug_executor_times_gpu_launches_on_the_device(fuse: Any) -> None:
    x = np.linspace(-2, 2, N, dtype=np.float32)
    with debug_executor.create(mlp_graph(), None, ["cuda:0"], fuse=fuse) as ex:
        ex.load_params(PARAMS)
        report = ex.profile(runs=3, x=x)
        _check_mlp(ex.run_sync(x=x), x)
    assert report.runs == 3
    by_name = {n.name: n for n in report.nodes}
    # Unfused, every node is timed; by default cupy fuses the chain into
    # one kernel, which the profile names.
    names = (
        ("add0", "relu0", "mul0", "tanh0", "sub0")
        if fuse is False
        else ("fused_add_relu_mul_tanh", "sub0")
    )
    assert set(by_name) == set(names)
    for name in names:
        node = by_name[name]
        assert node.device == "cuda:0"
        # CUDA events around the launch: a device time, far under a second
        assert len(node.measurements) == 3
        assert all(0 < t < 1 for t in node.measurements)


def test_time_evaluator_on_cuda() -> None:
    with _mlp("cuda") as ex:
        ex.set_input(x=np.ones(N, np.float32))
        result = asyncrt.time_evaluator(ex.run_sync, number=3, repeat=2)()
        _check_mlp([ex.get_output(0), ex.get_output(1)], np.ones(N, np.float32))
    assert len(result.results) == 2
    assert all(t > 0 for t in result.results)


# -- random graphs across the gpu, the cpu and a sim --------------------------


@settings(COMMON, max_examples=25)
@given(case=cases(with_slow=True), data=st.data())
def test_random_schedules_with_the_gpu(
    anyio_backend: str, case: Case, data: st.DataObject
) -> None:
    """The randomized differential test with ``cuda:0`` among the devices:
    random pins, policies, streams and kernel delays; outputs within cupy's
    rounding of the sequential numpy reference."""
    run_placings(
        data,
        case,
        data.draw(st.booleans()),
        anyio_backend,
        among=("cpu:0", "cuda:0", "sim:0"),
        rtol=RTOL,
    )
