"""The worker process of a process-backed executor (:mod:`asyncrt._process`).

Started as ``python -m asyncrt._process_worker SOCKET BLOCK SPEC`` (three
file descriptors): it reads its :class:`~asyncrt._process_wire.WorkerSpec`,
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
import pickle
import queue
import sys
import threading
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
    WorkerSpec,
    encode_error,
)


def build(spec: WorkerSpec) -> Any:
    """The executor ``spec`` describes (imports its modules first)."""
    for module in spec.imports:
        importlib.import_module(module)
    from devices import Device, sim

    if spec.sim_configs is not None:
        sim.configure(len(spec.sim_configs), spec.sim_configs)

    from . import graph_executor

    devices = [Device.parse(d) for d in spec.devices]
    placement = {nid: Device.parse(d) for nid, d in spec.placement.items()}
    return graph_executor.create(
        spec.graph,
        None,
        devices,
        max_contexts=1,
        policy=Given(placement),
        max_streams=spec.max_streams,
        params=dict(spec.params),
        fuse=spec.fuse,  # type: ignore[arg-type]
        kernel_threads=spec.kernel_threads,
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
        if self.executor._own_context().program.needs_event_loop:
            anyio.run(self.serve_async)
            return
        inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        reader = threading.Thread(
            target=self._read, args=(inbox,), name="asyncrt-worker-reader"
        )
        reader.start()
        try:
            while inbox.get() != EXIT:  # anything else is RUN
                self.conn.send(self._run_sync())
        finally:
            reader.join()

    def _read(self, inbox: queue.SimpleQueue[str]) -> None:
        """The reader thread: CANCEL stops the run in flight at once; RUN and
        EXIT go to the main thread, in order."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                message = EXIT  # the parent is gone
            if message in (CANCEL, EXIT):
                self.executor._stop_own_run()
            if message != CANCEL:
                inbox.put(message)
            if message == EXIT:
                return

    def _run_sync(self) -> tuple[str, Any]:
        try:
            self.executor.set_input(**self.inputs)
            self.executor.run_sync()
            for index, target in enumerate(self.outputs):
                self.executor.get_output(index, out=target)
        except ClosedResourceError:  # stopped by the reader thread
            return (CANCELLED, None)
        except Exception as exc:
            return (FAILED, encode_error(exc))
        return (OK, None)

    async def _next_message(self) -> str:
        """The parent's next message, awaited on the event loop (``EXIT``
        if the parent is gone)."""
        await anyio.wait_readable(self.conn.fileno())
        try:
            message: str = self.conn.recv()
        except (EOFError, OSError):
            return EXIT
        return message

    async def serve_async(self) -> None:
        """Answer messages until ``EXIT`` or the parent goes away."""
        while True:
            message = await self._next_message()
            if message == EXIT:
                return
            if message == RUN:
                reply, leave = await self._run()
                self.conn.send(reply)
                if leave:
                    return
            # CANCEL with no run in flight: that run has already answered.

    async def _run(self) -> tuple[tuple[str, Any], bool]:
        """One run; returns the reply and whether ``EXIT`` arrived meanwhile."""
        reply: tuple[str, Any] | None = None
        leave = False

        async def watch(scope: anyio.CancelScope) -> None:
            nonlocal leave
            while True:
                message = await self._next_message()
                if message in (CANCEL, EXIT):
                    leave = message == EXIT
                    scope.cancel()
                    return

        async with anyio.create_task_group() as group:
            group.start_soon(watch, group.cancel_scope)
            try:
                self.executor.set_input(**self.inputs)
                await self.executor.run()
                for index, target in enumerate(self.outputs):
                    self.executor.get_output(index, out=target)
                reply = (OK, None)
            except Exception as exc:
                reply = (FAILED, encode_error(exc))
            group.cancel_scope.cancel()
        return (reply if reply is not None else (CANCELLED, None)), leave


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
    conn = Connection(int(argv[0]))
    block_fd, spec_fd = int(argv[1]), int(argv[2])
    try:
        with os.fdopen(spec_fd, "rb") as spec_file:
            spec: WorkerSpec = pickle.load(spec_file)  # from our own parent
        if spec.nice:
            renice(spec.nice)
        block = mmap.mmap(block_fd, spec.layout.nbytes)
        os.close(block_fd)
        worker = Worker(conn, spec, block)
    except Exception as exc:
        conn.send((FAILED, encode_error(exc)))
        return
    conn.send((READY, os.getpid()))
    worker.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
