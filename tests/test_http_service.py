"""The example service (``examples/http_service.py``, Starlette on uvicorn)
and its load generator (``examples/load.py``): in process through httpx's
ASGI transport on both event loops, and end to end over TCP."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", EXAMPLES / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


service = load_example("http_service")
load = load_example("load")


@contextlib.asynccontextmanager
async def client(**settings: Any) -> AsyncIterator[Any]:
    """A client of the app in this process, its lifespan running (the model
    in this process too unless ``processes=True`` is given)."""
    app = service.create_app(service.Settings(**{"processes": False, **settings}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://service"
        ) as connection:
            yield connection


SENTENCES = [
    "a first sentence",
    "and a second, longer one with more words in it than the first",
    "short",
    "the quick brown fox jumps over the lazy dog " * 3,
]


@pytest.mark.anyio
@pytest.mark.parametrize("processes", [False, True])
async def test_embeddings_batched_equal_unbatched(processes: bool) -> None:
    async with client(processes=processes) as batched:
        response = await batched.get("/health")
        assert response.json() == {"status": "ok", "batching": True}
        answers: list[Any] = [None] * len(SENTENCES)

        async def one(index: int) -> None:
            reply = await batched.post("/embed", json={"sentences": [SENTENCES[index]]})
            assert reply.status_code == 200, reply.text
            answers[index] = reply.json()

        async with anyio.create_task_group() as tg:
            for index in range(len(SENTENCES)):
                tg.start_soon(one, index)
        together = await batched.post("/embed", json={"sentences": SENTENCES})
        stats = (await batched.get("/stats")).json()
    async with client(batching=False) as unbatched:
        alone = (await unbatched.post("/embed", json={"sentences": SENTENCES})).json()
    want = np.asarray(alone["embeddings"])
    assert want.shape == (len(SENTENCES), alone["dim"])
    np.testing.assert_allclose(np.linalg.norm(want, axis=1), 1, rtol=1e-5)
    for index, answer in enumerate(answers):
        np.testing.assert_allclose(answer["embeddings"][0], want[index], atol=1e-5)
    np.testing.assert_allclose(together.json()["embeddings"], want, atol=1e-5)
    assert stats["batching"]["requests"] == 2 * len(SENTENCES)
    assert stats["batching"]["batches"] < 2 * len(SENTENCES)
    assert stats["plan_cache"]["plans"] >= 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/embed", b"{not json", 400, "not JSON"),
        ("POST", "/embed", b'{"text": "x"}', 400, "expected"),
        ("POST", "/embed", b'{"sentences": []}', 400, "expected"),
        ("POST", "/embed", b'{"sentences": [1]}', 400, "expected"),
        ("POST", "/embed", b'{"sentences": ["a", "b", "c"]}', 413, "at most 2"),
        ("POST", "/embed", b"x" * 5000, 413, "over 4096"),
        ("GET", "/embed", b"", 405, None),
        ("GET", "/nowhere", b"", 404, None),
    ],
)
async def test_bad_requests_are_refused(
    method: str, path: str, body: bytes, status: int, message: str | None
) -> None:
    async with client(max_body=4096, max_sentences=2) as connection:
        reply = await connection.request(method, path, content=body)
        assert reply.status_code == status
        if message is not None:
            assert message in reply.json()["error"]
        ok = await connection.post("/embed", json={"sentences": ["still serving"]})
        assert ok.status_code == 200


@pytest.mark.anyio
async def test_after_shutdown_the_service_says_so() -> None:
    app = service.create_app(service.Settings(processes=False))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as c:
        async with app.router.lifespan_context(app):
            assert (await c.get("/health")).json()["status"] == "ok"
        assert (await c.get("/health")).json()["status"] == "stopping"
        reply = await c.post("/embed", json={"sentences": ["late"]})
        assert reply.status_code == 503 and "shutting down" in reply.json()["error"]


@pytest.mark.anyio
async def test_the_load_generator_in_process() -> None:
    app = service.create_app(service.Settings(processes=False))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        outcome = await load.run_load(
            "http://service", 40, 8, progress=False, transport=transport
        )
        problems = await load.check_answers(
            "http://service", outcome, 5, transport=transport
        )
    assert not outcome.errors and len(outcome.latencies) == 40
    assert not problems
    assert outcome.dim > 0


def test_tokenizer_is_stable_and_bounded() -> None:
    tokenizer = service.Tokenizer(vocab=30522, max_length=6)
    ids = tokenizer.ids("One two three four five six seven")
    assert ids[0] == service.CLS and ids[-1] == service.SEP and len(ids) == 6
    assert ids == tokenizer.ids("one two three four five six seven")
    assert all(service.FIRST_WORD <= i < 30522 for i in ids[1:-1])
    toy = service.Tokenizer(vocab=100)
    assert all(0 < i < 100 for i in toy.ids("a vocabulary of a hundred words"))


def test_load_against_the_spawned_service() -> None:
    """Over TCP: uvicorn serving, 60 requests, SIGTERM, a clean stop."""
    root = str(EXAMPLES.parent)  # this checkout's asyncrt, in the service too
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "load.py"),
            "--spawn",
            "-n",
            "60",
            "-c",
            "8",
            "--check",
            "5",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "60 requests, concurrency 8" in done.stdout
    assert "0 problems" in done.stdout
    assert "service: stopped (exit 0)" in done.stdout
