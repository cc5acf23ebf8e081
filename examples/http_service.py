"""A small HTTP inference service: many clients, one executor, no threads of
its own and a loop that never blocks.

Only the standard library's asyncio streams serve HTTP/1.1 (keep-alive,
Content-Length bodies); every request is one ``await ex.run(x=...)`` on a
shared :mod:`asyncrt` executor, whose pool of run contexts lets many requests
run at once.

    python examples/http_service.py --port 8080
    curl -s localhost:8080/health
    curl -s -d '{"x": [0.1, 0.2, ...16 numbers...]}' localhost:8080/infer

Endpoints:

* ``GET /health`` -> ``{"status": "ok", "contexts": ..., "in_flight": ...}``
* ``POST /infer`` with ``{"x": [16 numbers]}`` -> ``{"y": [4 numbers]}``,
  the softmax of a two-layer MLP (built in :func:`build_graph`, weights
  from a fixed seed; :func:`reference` computes the same in numpy).

Errors are JSON too: 400 for a malformed request or input, 404 for an
unknown path, 405 for a wrong method, 413 for a body over ``--max-body``
bytes, 431 for oversized headers, 500 if the run fails, 503 while shutting
down. SIGINT or SIGTERM stop accepting connections, let requests in flight
finish (up to ``--grace`` seconds), then close the executor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import asyncrt
from asyncrt import graph_executor
from asyncrt.errors import AsyncrtError, InputError
from asyncrt.graph import Graph, GraphBuilder

IN, HIDDEN, OUT = 16, 32, 4
SEED = 2024
MAX_BODY = 64 * 1024
MAX_LINE = 8 * 1024
MAX_HEADERS = 64
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


# -- the model ---------------------------------------------------------------


def weights() -> dict[str, np.ndarray]:
    """The model's parameters (fixed seed, so clients can check answers)."""
    rng = np.random.default_rng(SEED)
    return {
        "w1": (rng.standard_normal((IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
        "b1": (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": (rng.standard_normal(OUT) * 0.1).astype(np.float32),
    }


def reference(x: np.ndarray) -> np.ndarray:
    """What ``POST /infer`` answers for ``x`` (shape ``(16,)``), in numpy."""
    p = weights()
    h = np.maximum(x.astype(np.float32)[None, :] @ p["w1"] + p["b1"], 0)
    z = h @ p["w2"] + p["b2"]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True))[0]


def build_graph() -> Graph:
    """x[1,16] -> matmul w1 -> + b1 -> relu -> matmul w2 -> + b2 -> softmax."""
    b = GraphBuilder()
    x = b.input("x", shape=(1, IN), dtype="float32")
    w1 = b.param("w1", shape=(IN, HIDDEN), dtype="float32")
    b1 = b.param("b1", shape=(HIDDEN,), dtype="float32")
    w2 = b.param("w2", shape=(HIDDEN, OUT), dtype="float32")
    b2 = b.param("b2", shape=(OUT,), dtype="float32")
    f32 = "float32"
    h = b.op("matmul", x, w1, shape=(1, HIDDEN), dtype=f32, name="fc1")
    h = b.op("bias_add", h, b1, shape=(1, HIDDEN), dtype=f32, name="fc1_bias")
    h = b.op("relu", h, shape=(1, HIDDEN), dtype=f32, name="relu")
    z = b.op("matmul", h, w2, shape=(1, OUT), dtype=f32, name="fc2")
    z = b.op("bias_add", z, b2, shape=(1, OUT), dtype=f32, name="fc2_bias")
    b.output(b.op("softmax", z, shape=(1, OUT), dtype=f32, name="softmax"))
    return b.build()


def create_executor(
    max_contexts: int = 8, processes: bool = False
) -> graph_executor.GraphModule:
    """The executor every request shares.

    :param processes: run each context in a worker process (worth it for
        graphs heavy enough that kernels would otherwise hold the event
        loop's GIL for long; a tiny graph pays more in messages than it
        saves).
    """
    # Requests run side by side: size the kernel pools for that, not for one
    # run's latency (no R x cores BLAS threads on the cores).
    ex = graph_executor.create(
        build_graph(),
        None,
        "cpu",
        max_contexts=max_contexts,
        kernel_threads="throughput",
        processes=processes,
        worker_nice=10 if processes else 0,  # the loop preempts the workers
    )
    ex.load_params(asyncrt.save_param_dict(weights()))
    return ex


# -- HTTP --------------------------------------------------------------------


class HTTPError(Exception):
    """An error answered to the client (and, if ``close``, the connection
    is closed after it)."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


class Service:
    """The HTTP front of one executor.

    :param ex: the executor.
    :param max_body: the largest request body accepted, bytes.
    """

    def __init__(
        self, ex: graph_executor.GraphModule, *, max_body: int = MAX_BODY
    ) -> None:
        self.ex = ex
        self.max_body = max_body
        self.in_flight = 0
        self.stopping = False
        self._connections: set[asyncio.Task[None]] = set()

    async def handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one connection: requests one after another (keep-alive)."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while not self.stopping:
                try:
                    request = await self._read_request(reader)
                except HTTPError as exc:
                    await self._send(writer, exc.status, {"error": str(exc)}, True)
                    return
                if request is None:  # the client closed the connection
                    return
                method, path, headers, body = request
                keep = headers.get("connection", "").lower() != "close"
                status, answer = await self._route(method, path, body)
                await self._send(writer, status, answer, not keep or self.stopping)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away mid-request
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _read_request(
        self, reader: asyncio.StreamReader
    ) -> tuple[str, str, dict[str, str], bytes] | None:
        try:
            line = await reader.readline()
        except (asyncio.LimitOverrunError, ValueError) as exc:
            raise HTTPError(431, "request line too long", close=True) from exc
        if not line:
            return None
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HTTPError(400, "malformed request line", close=True)
        method, target, _ = parts
        headers: dict[str, str] = {}
        while True:
            try:
                raw = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError) as exc:
                raise HTTPError(431, "header line too long", close=True) from exc
            if raw in (b"\r\n", b"\n", b""):
                break
            if len(headers) >= MAX_HEADERS:
                raise HTTPError(431, "too many headers", close=True)
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep:
                raise HTTPError(400, "malformed header", close=True)
            headers[name.strip().lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise HTTPError(400, "chunked bodies are not supported", close=True)
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise HTTPError(400, "bad Content-Length", close=True) from exc
        if length < 0:
            raise HTTPError(400, "bad Content-Length", close=True)
        if length > self.max_body:
            raise HTTPError(
                413, f"body of {length} bytes is over {self.max_body}", close=True
            )
        body = await reader.readexactly(length) if length else b""
        return method, target.split("?", 1)[0], headers, body

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        try:
            if path == "/health":
                if method != "GET":
                    raise HTTPError(405, "use GET /health")
                return 200, {
                    "status": "stopping" if self.stopping else "ok",
                    "contexts": self.ex.pool.size,
                    "in_flight": self.in_flight,
                }
            if path == "/infer":
                if method != "POST":
                    raise HTTPError(405, "use POST /infer")
                if self.stopping:
                    raise HTTPError(503, "shutting down")
                return 200, await self._infer(body)
            raise HTTPError(404, f"no such path: {path}")
        except HTTPError as exc:
            return exc.status, {"error": str(exc)}

    async def _infer(self, body: bytes) -> dict[str, Any]:
        try:
            request = json.loads(body)
            x = np.asarray(request["x"], dtype=np.float32).reshape(1, IN)
        except (ValueError, TypeError, KeyError) as exc:
            raise HTTPError(400, f'expected {{"x": [{IN} numbers]}}: {exc}') from exc
        if not np.isfinite(x).all():
            raise HTTPError(400, "x must be finite")
        self.in_flight += 1
        try:
            outputs = await self.ex.run(x=x)
        except InputError as exc:
            raise HTTPError(400, str(exc)) from exc
        except AsyncrtError as exc:
            raise HTTPError(500, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.in_flight -= 1
        assert outputs is not None
        return {"y": outputs[0].numpy()[0].tolist()}

    async def _send(
        self, writer: asyncio.StreamWriter, status: int, answer: Any, close: bool
    ) -> None:
        payload = json.dumps(answer).encode()
        head = (
            f"HTTP/1.1 {status} {REASONS[status]}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + payload)
        await writer.drain()

    async def drain(self, grace: float) -> None:
        """Stop taking requests; wait up to ``grace`` seconds for requests
        in flight, then drop the idle connections."""
        self.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)


async def serve(
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str, int], None] | None = None,
    max_contexts: int = 8,
    max_body: int = MAX_BODY,
    grace: float = 5.0,
    processes: bool = False,
) -> None:
    """Serve until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is not
    given); then shut down gracefully.

    :param on_ready: called with the host and the bound port (useful with
        ``port=0``).
    """
    stop = asyncio.Event() if stop is None else stop
    loop = asyncio.get_running_loop()
    signals: list[signal.Signals] = []
    if sys.platform != "win32":
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(RuntimeError, ValueError):  # not main thread
                loop.add_signal_handler(sig, stop.set)
                signals.append(sig)
    async with create_executor(max_contexts, processes) as ex:
        service = Service(ex, max_body=max_body)
        server = await asyncio.start_server(service.handle, host, port, limit=MAX_LINE)
        bound = server.sockets[0].getsockname()
        if on_ready is not None:
            on_ready(bound[0], bound[1])
        try:
            await stop.wait()
        finally:
            server.close()
            await service.drain(grace)
            await server.wait_closed()
            for sig in signals:
                loop.remove_signal_handler(sig)
    # leaving `async with` closed the executor: its threads are gone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1", help="loopback by default")
    ap.add_argument("--port", type=int, default=8080, help="0 picks a free one")
    ap.add_argument("--contexts", type=int, default=8, help="runs in flight")
    ap.add_argument("--max-body", type=int, default=MAX_BODY)
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop")
    ap.add_argument(
        "--processes", action="store_true", help="run contexts in worker processes"
    )
    args = ap.parse_args()

    def ready(host: str, port: int) -> None:
        print(f"listening on http://{host}:{port}", flush=True)

    coro = serve(
        args.host,
        args.port,
        on_ready=ready,
        max_contexts=args.contexts,
        max_body=args.max_body,
        grace=args.grace,
        processes=args.processes,
    )
    if args.uvloop:
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
