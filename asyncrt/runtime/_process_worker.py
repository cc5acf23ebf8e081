"""The worker process of a process-backed executor (:mod:`asyncrt.runtime._process`).

Started as ``python -m asyncrt.runtime._process_worker SOCKET BLOCK SPEC`` (three
file descriptors): it reads its :class:`~asyncrt.runtime._process_wire.WorkerSpec`,
builds an ordinary executor from it (one run context: the stateful API),
maps the I/O block, says ``READY`` and then serves runs one at a time. A
run copies the inputs out of the block, runs the executor and copies the
outputs into the block.

Runs are blocking ``run_sync()`` calls on the main thread (a one-stream cpu
plan then runs on that thread itself, with no hop to a stream thread), while
a reader thread owns the socket: a ``CANCEL`` (or ``EXIT``) stops the run in
flight through the executor's own stop flags (in-flight kernels drain, the
run answers ``CANCELLED``). A plan with coroutine kernels needs an event
loop instead: the worker then serves on one, and cancels through a cancel
scope.

Every kernel, copy and wait of the graph happens here, on this process's
threads and interpreter, so none of it holds the parent's GIL.
"""

from __future__ import annotations

import contextlib
import importlib
import mmap
import os
import queue
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio

from devices import from_dlpack
from devices.errors import ClosedResourceError

from ._process_wire import (
    CANCEL,
    CANCELLED,
    EXIT,
    FAILED,
    OK,
    READY,
    RUN,
    Given,
    Message,
    WorkerSpec,
    decode,
    encode,
    encode_error,
)


def build(spec: WorkerSpec) -> Any:
    """The executor ``spec`` describes (imports its modules first)."""
    for module in spec.imports:
        importlib.import_module(module)
    from devices import Device, restore_process_state

    if spec.device_state is not None:
        restore_process_state(spec.device_state)

    from .. import graph_executor
    from ._options import ExecutorOptions

    devices = [Device.parse(d) for d in spec.devices]
    placement = {nid: Device.parse(d) for nid, d in spec.placement.items()}
    options = ExecutorOptions.of(
        max_contexts=1, policy=Given(placement), **spec.options
    )
    return graph_executor.create(
        spec.graph, None, devices, params=dict(spec.params), options=options
    )


class Worker:
    """Serves runs of one executor over one connection and one I/O block."""

    def __init__(self, conn: Connection, spec: WorkerSpec, block: mmap.mmap) -> None:
        self.conn = conn
        self.executor = build(spec)
        self.inputs = {s.name: s.view(block) for s in spec.layout.inputs}
        self.outputs = [from_dlpack(s.view(block)) for s in spec.layout.outputs]

    def serve(self) -> None:
        """Answer messages until ``EXIT`` or the parent goes away."""
        if self.executor.core.own_context().program.needs_event_loop:
            anyio.run(self.serve_async)
            return
        self._running = 0  # the run the main thread is in, 0 between runs
        self._cancelled = 0  # the latest run the parent cancelled
        inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        reader = threading.Thread(
            target=self._read, args=(inbox,), name="asyncrt-worker-reader", daemon=True
        )
        reader.start()
        while True:
            kind, run = inbox.get()
            if kind == EXIT:
                return
            self._send(self._run_sync(run))

    def _send(self, message: Any) -> None:
        self.conn.send_bytes(encode(message))

    def _read(self, inbox: queue.SimpleQueue[Message]) -> None:
        """The reader thread: a CANCEL stops its run at once; RUN and EXIT go
        to the main thread, in order."""
        while True:
            try:
                kind, run = decode(self.conn.recv_bytes())
            except (EOFError, OSError):
                kind, run = EXIT, self._running  # the parent is gone
            if kind in (CANCEL, EXIT):
                self._cancel(run)
            if kind != CANCEL:
                inbox.put((kind, run))
            if kind == EXIT:
                return

    def _cancel(self, run: int) -> None:
        """Stop ``run``: whether it has not started yet (the main thread
        sees ``_cancelled`` first), is starting (a run clears the stop flags
        as it starts, so they are raised again until it ends) or runs."""
        self._cancelled = max(self._cancelled, run)
        while run and self._running == run:
            self.executor.core.stop_own_run()
            time.sleep(0.001)

    def _run_sync(self, run: int) -> tuple[str, int, Any]:
        self._running = run  # before looking at _cancelled: see _cancel
        try:
            if self._cancelled >= run:
                return (CANCELLED, run, None)
            self.executor.set_input(**self.inputs)
            self.executor.run_sync()
            for index, target in enumerate(self.outputs):
                self.executor.get_output(index, out=target)
        except ClosedResourceError:  # stopped by the reader thread
            return (CANCELLED, run, None)
        except Exception as exc:
            return (FAILED, run, encode_error(exc))
        finally:
            self._running = 0
        return (OK, run, None)

    async def _next_message(self) -> Message:
        """The parent's next message, awaited on the event loop (``EXIT``
        if the parent is gone)."""
        await anyio.wait_readable(self.conn.fileno())
        try:
            kind, run = decode(self.conn.recv_bytes())
        except (EOFError, OSError):
            return (EXIT, 0)
        return str(kind), int(run)

    async def serve_async(self) -> None:
        """Answer messages until ``EXIT`` or the parent goes away (plans with
        coroutine kernels)."""
        while True:
            kind, run = await self._next_message()
            if kind == EXIT:
                return
            if kind == RUN:
                reply, leave = await self._run_async(run)
                self._send(reply)
                if leave:
                    return
            # A CANCEL of a run that has already answered: nothing to do.

    async def _run_async(self, run: int) -> tuple[tuple[str, int, Any], bool]:
        """One run; returns the reply and whether ``EXIT`` arrived meanwhile."""
        reply: tuple[str, int, Any] | None = None
        leave = False

        async def watch(scope: anyio.CancelScope) -> None:
            nonlocal leave
            while True:
                kind, number = await self._next_message()
                if kind == EXIT or (kind == CANCEL and number == run):
                    leave = kind == EXIT
                    scope.cancel()
                    return

        async with anyio.create_task_group() as group:
            group.start_soon(watch, group.cancel_scope)
            try:
                self.executor.set_input(**self.inputs)
                await self.executor.run()
                for index, target in enumerate(self.outputs):
                    self.executor.get_output(index, out=target)
                reply = (OK, run, None)
            except Exception as exc:
                reply = (FAILED, run, encode_error(exc))
            group.cancel_scope.cancel()
        return (reply if reply is not None else (CANCELLED, run, None)), leave


def renice(increment: int) -> None:
    """Add ``increment`` to the niceness of every thread of this process.

    On Linux niceness is per thread, and importing numpy already started
    BLAS threads: each gets it (threads started later inherit it from the
    main thread). Elsewhere it is the process's.
    """
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():  # pragma: no cover - not Linux
        os.nice(increment)
        return
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + increment)
    for task in tasks.iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended
            os.setpriority(os.PRIO_PROCESS, int(task.name), target)


def main(argv: list[str]) -> None:
    """Entry point: ``argv`` is ``[socket_fd, block_fd, spec_fd]``."""
    # The parent decides when this process ends; a Ctrl-C meant for it
    # must not tear a run apart here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    block_fd, spec_fd = int(argv[1]), int(argv[2])
    try:
        try:
            with os.fdopen(spec_fd, "rb") as spec_file:
                spec = WorkerSpec.from_bytes(spec_file.read())
            if spec.nice:
                renice(spec.nice)
            block = mmap.mmap(block_fd, spec.layout.nbytes)
            os.close(block_fd)
            worker = Worker(conn, spec, block)
        except Exception as exc:
            conn.send_bytes(encode((FAILED, 0, encode_error(exc))))
            return
        conn.send_bytes(encode((READY, 0, os.getpid())))
        worker.serve()
    except OSError:
        pass  # the parent went away (a broken pipe): nothing left to tell it
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # No interpreter teardown: the parent waits for this exit, and there
        # is nothing to save (the executor's memory goes with the process).
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
