"""The worker process of a process-backed executor (:mod:`asyncrt._process`).

Started as ``python -m asyncrt._process_worker SOCKET BLOCK SPEC`` (three
file descriptors): it reads its :class:`~asyncrt._process_wire.WorkerSpec`,
builds an ordinary executor from it (one run context: the stateful API),
maps the I/O block, says ``READY`` and then serves runs one at a time on its own
event loop. A run copies the inputs out of the block, awaits the executor's
``run()`` and copies the outputs into the block. While a run is in flight
the worker keeps reading the socket, so a ``CANCEL`` (or ``EXIT``) stops it
through the executor's own cancellation: in-flight kernels drain, and the
run answers ``CANCELLED``.

Every kernel, copy and wait of the graph happens here, on this process's
threads and interpreter, so none of it holds the parent's GIL.
"""

from __future__ import annotations

import importlib
import mmap
import os
import pickle
import sys
from multiprocessing.connection import Connection
from typing import Any

import anyio

from devices import from_dlpack

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

    async def serve(self) -> None:
        """Answer messages until ``EXIT`` or the parent goes away."""
        fd = self.conn.fileno()
        while True:
            await anyio.wait_readable(fd)
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return
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
            fd = self.conn.fileno()
            while True:
                await anyio.wait_readable(fd)
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    message = EXIT
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


def main(argv: list[str]) -> None:
    """Entry point: ``argv`` is ``[socket_fd, block_fd, spec_fd]``."""
    conn = Connection(int(argv[0]))
    block_fd, spec_fd = int(argv[1]), int(argv[2])
    try:
        with os.fdopen(spec_fd, "rb") as spec_file:
            spec: WorkerSpec = pickle.load(spec_file)  # from our own parent
        if spec.nice:
            os.nice(spec.nice)
        block = mmap.mmap(block_fd, spec.layout.nbytes)
        os.close(block_fd)
        worker = Worker(conn, spec, block)
    except Exception as exc:
        conn.send((FAILED, encode_error(exc)))
        return
    conn.send((READY, os.getpid()))
    anyio.run(worker.serve)


if __name__ == "__main__":
    main(sys.argv[1:])
