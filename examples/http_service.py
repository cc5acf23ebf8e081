"""A sentence-embedding service: an ASGI app (Starlette, served by uvicorn)
in front of one asyncrt executor, every request batched with the others.

    pip install 'asyncrt[serve,onnx]'
    python examples/http_service.py --model minilm.onnx --port 8080
    curl -s localhost:8080/health
    curl -s -d '{"sentences": ["a first sentence", "and a second"]}' \\
        localhost:8080/embed

The model is a BERT-style encoder exported to ONNX with symbolic batch and
sequence (inputs ``input_ids``, ``attention_mask``, ``token_type_ids``;
first output ``last_hidden_state``), such as ``all-MiniLM-L6-v2`` exported
by ``optimum-cli export onnx``. Without ``--model``, and run from a
checkout of the repository, it serves the test suite's BERT-style encoder
with random weights (``--demo-size tiny`` or ``minilm``): the embeddings
mean nothing, the work is a real encoder's.

Each sentence is one request of the :class:`asyncrt.Batcher`: sentences
that arrive within ``--max-delay-ms`` of each other (from one HTTP request
or many) run as one batch, padded to a length bucket (16, 32, 64, 128
tokens) with the attention mask 0 where padded, so one executor holds a
handful of plans. The embedding is the mean of ``last_hidden_state`` over
the sentence's tokens, L2-normalised (as sentence-transformers pools
MiniLM). ``--no-batching`` sends every sentence to ``ex.run`` on its own.

The model runs in two worker processes (``processes=True``): kernels never
compete with the server's event loop for its GIL or its CPU, so health
checks and new connections are answered promptly under full load, and
batches run as fast as in the server's process (``bench/bench_serving.py``:
``batched-proc`` beside ``batched``). ``--in-process`` keeps the model in
the server (one copy of the weights instead of one per worker).

The tokenizer here is a stand-in (words hashed to ids between BERT's
``[CLS]`` and ``[SEP]``): a real service uses the model's own (Hugging
Face ``tokenizers``) and changes nothing else.

Endpoints (JSON):

* ``GET /health`` -> ``{"status": "ok" | "stopping", "batching": bool}``
* ``POST /embed`` with ``{"sentences": [str, ...]}`` ->
  ``{"embeddings": [[float, ...], ...], "dim": int}``
* ``GET /stats`` -> the batcher's figures (requests, batch sizes, queue
  delay and batch time percentiles) and the plan cache's.

Errors are JSON too: 400 for a malformed request, 413 for a body over
``--max-body`` bytes or more than ``--max-sentences`` sentences, 500 if
the model fails (the node named), 503 while shutting down. SIGINT or
SIGTERM stop the server (uvicorn): the requests in flight finish, the
batcher runs what it holds, then the executor closes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import AsyncrtError, ClosedResourceError, InputError

NAMES = ("input_ids", "attention_mask", "token_type_ids")
CLS, SEP, FIRST_WORD = 101, 102, 1000
BUCKETS = (16, 32, 64, 128)
MAX_BODY = 256 * 1024
MAX_SENTENCES = 64


# -- the model -----------------------------------------------------------------


def demo_model(size: str = "tiny") -> bytes:
    """The test suite's BERT-style encoder (random weights), serialised:
    ``"tiny"`` (2 layers, width 32) or ``"minilm"`` (MiniLM-L6's shape,
    86 MB). Needs a checkout of the repository (it lives in ``tests/``)."""
    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tests.asyncrt.frontend.symbolic_models import (
        TINY,
        BertConfig,
        bert_encoder,
    )

    config = BertConfig() if size == "minilm" else TINY
    return bytes(bert_encoder(config).SerializeToString())


def vocabulary_size(params: dict[str, np.ndarray]) -> int:
    """The rows of the word embedding table (the parameter named so, as
    exporters name BERT's; else the 2-D parameter with the most rows)."""
    words = [p for n, p in params.items() if "word_embeddings" in n and p.ndim == 2]
    tables = words or [p for p in params.values() if p.ndim == 2]
    return max(t.shape[0] for t in tables) if tables else 30522


class Tokenizer:
    """A stand-in tokenizer: lower-cased words hashed to ids (stable across
    runs), between ``[CLS]`` and ``[SEP]``, at most ``max_length`` ids.

    :param vocab: the model's vocabulary size.
    :param max_length: the most ids a sentence becomes.
    """

    def __init__(self, vocab: int, max_length: int = BUCKETS[-1]) -> None:
        self.vocab = vocab
        self.max_length = max_length
        # BERT's ids where the vocabulary has them; a toy one's first ids else
        self.cls, self.sep, self.first = (
            (CLS, SEP, FIRST_WORD) if vocab > 2 * FIRST_WORD else (1, 2, 3)
        )

    def ids(self, sentence: str) -> list[int]:
        """The ids of ``sentence``."""
        span = max(1, self.vocab - self.first)
        words = [
            self.first
            + int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "big")
            % span
            for w in sentence.lower().split()
        ]
        return [self.cls, *words[: self.max_length - 2], self.sep]

    def encode(self, sentence: str) -> dict[str, np.ndarray]:
        """The model's inputs for one sentence (one row)."""
        ids = np.array([self.ids(sentence)], dtype=np.int64)
        return {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }


def pool(hidden: np.ndarray) -> np.ndarray:
    """Mean over the tokens (the request's own, padding trimmed), then
    L2-normalised: one embedding per row."""
    mean = hidden.mean(axis=1)
    norm = np.linalg.norm(mean, axis=-1, keepdims=True)
    return np.asarray(mean / np.maximum(norm, 1e-12), dtype=np.float32)


# -- the service -----------------------------------------------------------------


@dataclass
class Settings:
    """How the service runs.

    :ivar model: an ONNX file or its bytes; ``None`` for the demo model.
    :ivar demo_size: the demo model's size.
    :ivar batching: batch sentences across requests.
    :ivar max_batch: the batcher's ``max_batch``.
    :ivar max_delay_ms: the batcher's ``max_delay_ms``.
    :ivar processes: run the model in worker processes (the executor's
        ``processes=True``, at ``worker_nice`` 10): no kernel holds the
        server's CPU or GIL, so its event loop answers within about a
        millisecond of idle under full load (bench/bench_serving.py's
        ``batched-proc``), at the memory of one model per worker.
    :ivar max_contexts: the executor's ``max_contexts`` (with
        ``processes``, its worker processes).
    :ivar max_body: the largest request body accepted, bytes.
    :ivar max_sentences: the most sentences one request may embed.
    """

    model: str | bytes | None = None
    demo_size: str = "tiny"
    batching: bool = True
    max_batch: int = 32
    max_delay_ms: float = 2.0
    processes: bool = True
    max_contexts: int = 2
    max_body: int = MAX_BODY
    max_sentences: int = MAX_SENTENCES


class HTTPError(Exception):
    """An error answered to the client as ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Embedder:
    """An executor, its batcher and the tokenizer: sentences in, embeddings
    out. Use it as an async context manager (it owns both).

    :param settings: how it runs.
    """

    def __init__(self, settings: Settings) -> None:
        from asyncrt.frontend import from_onnx

        self.settings = settings
        source = settings.model
        graph, params = from_onnx(
            demo_model(settings.demo_size) if source is None else source
        )
        self.tokenizer = Tokenizer(vocabulary_size(params))
        self.ex = graph_executor.create(
            graph,
            None,
            "cpu",
            params=params,
            max_contexts=settings.max_contexts,
            processes=settings.processes,
            worker_nice=10,  # the server's loop preempts the workers
        )
        self.batcher: asyncrt.Batcher | None = None
        if settings.batching:
            self.batcher = asyncrt.Batcher(
                self.ex,
                batch_axes=dict.fromkeys(NAMES, 0),
                max_batch=settings.max_batch,
                max_delay_ms=settings.max_delay_ms,
                padding=asyncrt.Padding(
                    axes=dict.fromkeys(NAMES, 1),
                    values=dict.fromkeys(NAMES, 0),
                    trim={0: 1},  # last_hidden_state, back to each sentence
                    buckets=BUCKETS,
                ),
            )
        self.stopping = False

    async def __aenter__(self) -> Embedder:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.ex)
            if self.batcher is not None:
                await stack.enter_async_context(self.batcher)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.stopping = True
        await self._stack.__aexit__(*exc_info)

    async def embed_one(self, sentence: str) -> np.ndarray:
        """The embedding of one sentence."""
        inputs = self.tokenizer.encode(sentence)
        if self.batcher is not None:
            outputs = await self.batcher.run(**inputs)
        else:
            outputs = await self.ex.run(**inputs) or []
        return pool(outputs[0].numpy())[0]

    async def embed(self, sentences: Sequence[str]) -> np.ndarray:
        """The embeddings of ``sentences``, each its own batcher request
        (run concurrently, so they share batches with each other and with
        other clients' sentences)."""
        results: list[np.ndarray | None] = [None] * len(sentences)
        errors: list[Exception] = []

        async def one(index: int) -> None:
            try:
                results[index] = await self.embed_one(sentences[index])
            except Exception as exc:  # the first one is the request's answer
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for index in range(len(sentences)):
                tg.start_soon(one, index)
        if errors:
            raise errors[0]
        return np.stack([r for r in results if r is not None])

    def stats(self) -> dict[str, Any]:
        """The batcher's and the plan cache's figures."""
        cache = self.ex.plan_cache_stats()
        return {
            "batching": None
            if self.batcher is None
            else self.batcher.stats().to_dict(),
            "plan_cache": None
            if cache is None
            else {
                "plans": cache.size,
                "max_plans": cache.max_plans,
                "hits": cache.hits,
                "misses": cache.misses,
                "builds": cache.builds,
            },
        }


def parse_sentences(body: bytes, limit: int) -> list[str]:
    """The sentences of a ``/embed`` body.

    :raises HTTPError: 400 if malformed, 413 if more than ``limit``.
    """
    try:
        request = json.loads(body)
    except ValueError as exc:
        raise HTTPError(400, f"the body is not JSON: {exc}") from exc
    sentences = request.get("sentences") if isinstance(request, dict) else None
    if (
        not isinstance(sentences, list)
        or not sentences
        or not all(isinstance(s, str) for s in sentences)
    ):
        raise HTTPError(400, 'expected {"sentences": ["a sentence", ...]}')
    if len(sentences) > limit:
        raise HTTPError(413, f"{len(sentences)} sentences; at most {limit}")
    return sentences


def create_app(settings: Settings | None = None) -> Starlette:
    """The ASGI app. Its lifespan makes the executor and the batcher, and
    closes them (after the batcher has run what it holds) on shutdown.

    :param settings: how it runs (default :class:`Settings`).
    """
    settings = Settings() if settings is None else settings
    state: dict[str, Embedder] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with Embedder(settings) as embedder:
            state["embedder"] = embedder
            yield
        state.pop("embedder", None)

    def embedder() -> Embedder:
        found = state.get("embedder")
        if found is None or found.stopping:
            raise HTTPError(503, "shutting down")
        return found

    async def health(request: Request) -> JSONResponse:
        found = state.get("embedder")
        status = "ok" if found is not None and not found.stopping else "stopping"
        return JSONResponse({"status": status, "batching": settings.batching})

    async def embed(request: Request) -> JSONResponse:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body:
            raise HTTPError(413, f"body of {length} bytes is over {settings.max_body}")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_body:
                raise HTTPError(413, f"body over {settings.max_body} bytes")
        sentences = parse_sentences(body, settings.max_sentences)
        try:
            embeddings = await embedder().embed(sentences)
        except InputError as exc:
            raise HTTPError(400, str(exc)) from exc
        except ClosedResourceError as exc:
            raise HTTPError(503, "shutting down") from exc
        except AsyncrtError as exc:  # a kernel failed: NodeFailedError names it
            raise HTTPError(500, f"{type(exc).__name__}: {exc}") from exc
        return JSONResponse(
            {"embeddings": embeddings.tolist(), "dim": int(embeddings.shape[1])}
        )

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(embedder().stats())

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status if isinstance(exc, HTTPError) else 500
        return JSONResponse({"error": str(exc)}, status_code=status)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/embed", embed, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        exception_handlers={HTTPError: http_error},
        lifespan=lifespan,
    )


# -- serving -----------------------------------------------------------------


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    on_ready: Callable[[str, int], None] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM (uvicorn's handlers), then shut down
    gracefully.

    :param on_ready: called with the host and the bound port (useful with
        ``port=0``), once the socket is bound.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections wait in the backlog while the model loads
    if on_ready is not None:
        on_ready(host, sock.getsockname()[1])
    config = uvicorn.Config(create_app(settings), log_level="warning", lifespan="on")
    # uvicorn shuts down on SIGINT/SIGTERM, then raises the signal again for
    # the handler it found: a quiet one lets this function return instead.
    previous = {sig: signal.signal(sig, _stopped) for sig in STOP_SIGNALS}
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stopped(signum: int, frame: object) -> None:
    """The signal uvicorn raises again once it has shut down: done."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a BERT-style encoder (.onnx)")
    ap.add_argument("--demo-size", choices=("tiny", "minilm"), default="tiny")
    ap.add_argument("--host", default="127.0.0.1", help="loopback by default")
    ap.add_argument("--port", type=int, default=8080, help="0 picks a free one")
    ap.add_argument("--no-batching", action="store_true")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run the model in the server's process (less memory, more loop lag)",
    )
    ap.add_argument(
        "--contexts", type=int, default=2, help="runs in flight (worker processes)"
    )
    ap.add_argument("--max-body", type=int, default=MAX_BODY)
    ap.add_argument("--max-sentences", type=int, default=MAX_SENTENCES)
    args = ap.parse_args()
    settings = Settings(
        model=args.model,
        demo_size=args.demo_size,
        batching=not args.no_batching,
        max_batch=args.max_batch,
        max_delay_ms=args.max_delay_ms,
        processes=not args.in_process,
        max_contexts=args.contexts,
        max_body=args.max_body,
        max_sentences=args.max_sentences,
    )

    def ready(host: str, port: int) -> None:
        print(f"listening on http://{host}:{port}", flush=True)

    serve(settings, args.host, args.port, on_ready=ready)
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
