"""The batcher on real models: a BERT-style encoder with symbolic batch and
sequence (every batched request equals its unbatched run), grouping by
shape, declared padding, a batch the model refuses, worker processes and
remote devices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import InputError
from asyncrt.graph import GraphBuilder
from asyncrt.serving import Batcher

pytest.importorskip("onnx")

from ..frontend.symbolic_models import bert_encoder, bert_feed

NAMES = ("input_ids", "attention_mask", "token_type_ids")
AXES = dict.fromkeys(NAMES, 0)
TIMEOUT = 60


@pytest.fixture(scope="module")
def encoder() -> tuple[Any, dict[str, np.ndarray]]:
    from asyncrt.frontend import from_onnx

    graph, params = from_onnx(bert_encoder())
    return graph, params


def sentence(length: int, seed: int) -> dict[str, np.ndarray]:
    """One sentence of ``length`` tokens, none of them padding."""
    feed = bert_feed(1, length, seed=seed)
    feed["attention_mask"][:] = 1
    return feed


async def run_all(
    batcher: Batcher, requests: list[dict[str, np.ndarray]]
) -> list[list[asyncrt.NDArray]]:
    """Every request at once; their outputs in order."""
    outputs: list[list[asyncrt.NDArray]] = [[] for _ in requests]

    async def one(index: int) -> None:
        outputs[index] = await batcher.run(**requests[index])

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for index in range(len(requests)):
                tg.start_soon(one, index)
    return outputs


async def alone(
    ex: graph_executor.GraphModule, requests: list[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    results = []
    for request in requests:
        outputs = await ex.run(**request)
        assert outputs is not None
        results.append([o.numpy() for o in outputs])
    return results


def assert_equal(
    batched: list[list[asyncrt.NDArray]], unbatched: list[list[np.ndarray]]
) -> None:
    for got, want in zip(batched, unbatched, strict=True):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.anyio
async def test_every_batched_request_equals_its_unbatched_run(
    encoder: tuple[Any, dict[str, np.ndarray]],
) -> None:
    graph, params = encoder
    requests = [bert_feed(1, 8, seed=seed) for seed in range(24)]
    async with graph_executor.create(graph, None, "cpu", params=params) as ex:
        unbatched = await alone(ex, requests)
        async with Batcher(ex, batch_axes=AXES, max_batch=8) as batcher:
            batched = await run_all(batcher, requests)
        assert_equal(batched, unbatched)
        stats = batcher.stats()
        assert stats.requests == 24 and stats.rows == 24
        assert stats.batches < 24
        assert set(stats.sizes) <= {1, 2, 4, 8}
        cache = ex.plan_cache_stats()
        assert cache is not None and cache.size <= 5  # sequence 8: batch 1 .. 8


@pytest.mark.anyio
async def test_different_lengths_are_grouped_never_mixed(
    encoder: tuple[Any, dict[str, np.ndarray]],
) -> None:
    graph, params = encoder
    requests = [sentence(6 if i % 2 else 9, seed=i) for i in range(12)]
    async with graph_executor.create(graph, None, "cpu", params=params) as ex:
        unbatched = await alone(ex, requests)
        async with Batcher(ex, batch_axes=AXES, max_batch=8) as batcher:
            batched = await run_all(batcher, requests)
        assert_equal(batched, unbatched)
        assert batcher.stats().batches >= 2


@pytest.mark.anyio
async def test_declared_padding_joins_lengths_and_trims_outputs(
    encoder: tuple[Any, dict[str, np.ndarray]],
) -> None:
    graph, params = encoder
    requests = [sentence(3 + i % 9, seed=i) for i in range(18)]
    padding = asyncrt.Padding(
        axes=dict.fromkeys(NAMES, 1),
        values=dict.fromkeys(NAMES, 0),
        trim={0: 1},  # last_hidden_state's sequence axis; pooler_output has none
        buckets=(8, 16),
    )
    async with graph_executor.create(graph, None, "cpu", params=params) as ex:
        unbatched = await alone(ex, requests)
        async with Batcher(ex, batch_axes=AXES, padding=padding) as batcher:
            batched = await run_all(batcher, requests)
        assert_equal(batched, unbatched)
        lengths = {r.length for r in batcher.records()}
        assert lengths <= {8, 16}


@pytest.mark.anyio
async def test_a_batch_the_model_refuses_runs_its_requests_alone(
    encoder: tuple[Any, dict[str, np.ndarray]],
) -> None:
    """Padded to 600 tokens, past the encoder's 512 positions, the batch is
    refused; each request then runs alone, at its own length."""
    graph, params = encoder
    requests = [sentence(4, seed=i) for i in range(3)]
    padding = asyncrt.Padding(
        axes=dict.fromkeys(NAMES, 1),
        values=dict.fromkeys(NAMES, 0),
        trim={0: 1},
        buckets=(600,),
    )
    async with graph_executor.create(graph, None, "cpu", params=params) as ex:
        unbatched = await alone(ex, requests)
        async with Batcher(ex, batch_axes=AXES, padding=padding) as batcher:
            batched = await run_all(batcher, requests)
            with pytest.raises(InputError, match="sequence"):
                await batcher.run(**sentence(700, seed=0))  # refused alone
        assert_equal(batched, unbatched)
        errors = [r.error for r in batcher.records() if r.error]
        assert errors and "one by one" in errors[0]


def test_batch_axes_cover_every_input(
    encoder: tuple[Any, dict[str, np.ndarray]],
) -> None:
    graph, params = encoder
    with graph_executor.create(graph, None, "cpu", params=params) as ex:
        with pytest.raises(asyncrt.errors.ArgumentError, match="missing: token_type"):
            Batcher(ex, batch_axes={"input_ids": 0, "attention_mask": 0})
        some_weight = next(iter(params))
        with pytest.raises(asyncrt.errors.ArgumentError, match="parameter"):
            Batcher(ex, batch_axes={**AXES, some_weight: 0})
        with pytest.raises(asyncrt.errors.ArgumentError, match="batch axis"):
            Batcher(
                ex,
                batch_axes=AXES,
                padding=asyncrt.Padding(axes={"input_ids": 0}, values={"input_ids": 0}),
            )


# -- worker processes and remote devices -------------------------------------------

ROWS, WIDTH = 4, 8


def mlp(device: str = "cpu") -> tuple[Any, dict[str, np.ndarray]]:
    """x (ROWS, WIDTH) -> dense(w) -> relu -> softmax, on ``device``."""
    b = GraphBuilder()
    x = b.input("x", shape=(ROWS, WIDTH), dtype="float32")
    w = b.param("w", shape=(WIDTH, WIDTH), dtype="float32")
    spec: dict[str, Any] = {"shape": (ROWS, WIDTH), "dtype": "float32"}
    h = b.op("dense", x, w, name="fc", device=device, **spec)
    h = b.op("relu", h, name="relu", device=device, **spec)
    b.output(b.op("softmax", h, name="probs", device="cpu:0", **spec))
    weights = np.random.default_rng(0).standard_normal((WIDTH, WIDTH))
    return b.build(), {"w": weights.astype(np.float32)}


def mlp_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ w.T, 0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


async def serve_rows(batcher: Batcher, w: np.ndarray, count: int) -> None:
    rng = np.random.default_rng(1)
    requests = [
        {"x": rng.standard_normal((1, WIDTH)).astype(np.float32)} for _ in range(count)
    ]
    outputs = await run_all(batcher, requests)
    for request, (probs,) in zip(requests, outputs, strict=True):
        np.testing.assert_allclose(
            probs.numpy(), mlp_reference(request["x"], w), rtol=1e-5, atol=1e-6
        )


@pytest.mark.anyio
async def test_with_worker_processes() -> None:
    graph, params = mlp()
    ex = graph_executor.create(
        graph,
        None,
        "cpu",
        params=params,
        processes=True,
        max_contexts=2,
        worker_blas="default",
    )
    async with ex, Batcher(ex, batch_axes={"x": 0}) as batcher:
        await serve_rows(batcher, params["w"], 10)
    assert batcher.stats().requests == 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    from devices import remote

    local = distributed.LocalCluster(
        n_workers=1,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    )
    try:
        with remote.connect(local.scheduler_address) as connection:
            yield connection
    finally:
        local.close()


@pytest.mark.anyio
async def test_with_a_remote_device(cluster: Any) -> None:
    graph, params = mlp(device="remote:0")
    ex = graph_executor.create(graph, None, ["cpu", "remote:0"], params=params)
    async with ex, Batcher(ex, batch_axes={"x": 0}) as batcher:
        await serve_rows(batcher, params["w"], 10)
    assert batcher.stats().requests == 10


def test_a_static_graph_batches_its_inputs_not_its_parameters() -> None:
    graph, params = mlp()
    refused = pytest.raises(asyncrt.errors.ArgumentError, match="'w' is a parameter")
    with graph_executor.create(graph, None, "cpu", params=params) as ex, refused:
        Batcher(ex, batch_axes={"x": 0, "w": 0})
    missing = pytest.raises(asyncrt.errors.ArgumentError, match="missing: w")
    with graph_executor.create(graph, None, "cpu") as ex, missing:  # w not loaded
        Batcher(ex, batch_axes={"x": 0})
