"""Run contexts in worker processes: the event loop keeps its interpreter.

Why: a kernel thread in the event loop's process holds the GIL whenever it
runs Python (the dispatcher, small numpy calls that do not release it), and
a loop thread that wants the GIL back then waits up to the interpreter's
switch interval (5 ms): services see that as event-loop lag. A process-backed
executor (``create(..., processes=True)``) runs every pooled run context in a
worker process of its own (:mod:`asyncrt.runtime._process_worker`), so the loop's
process only copies inputs in, sends one message, awaits one reply on a
socket (no thread, no polling) and copies outputs out.

How: a :class:`ProcessContext` owns one worker, one socket pair and one I/O
block (an anonymous shared mapping, passed to the worker as a file
descriptor) with a slot per caller-given input and per output
(:mod:`asyncrt.runtime._process_wire`). It looks like an in-process
:class:`~asyncrt.runtime._context.RunContext` to the executor: ``inputs`` and
``output()`` are arrays over the block, and ``program.run()`` /
``program.stop()`` drive the worker. Cancelling a run sends ``CANCEL`` and
waits (shielded) for the worker's answer: its in-flight kernels drain
through the worker executor's own cancellation, exactly as in-process. A
worker that dies fails the run in flight with :class:`WorkerError` and its
context is dropped; the next run gets a new worker.

Workers build their executor from the global kernel registry: modules that
register user kernels are named in ``worker_imports`` and imported by every
worker first. Nothing but the executor's own spec (graph JSON, parameters in
TVM's format, options) and small JSON messages cross, and nothing is
unpickled on either side.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import anyio

from devices import NDArray, from_dlpack
from devices.errors import ClosedResourceError
from scheduler.dag import Entry

from ..errors import WorkerError
from ._process_wire import (
    CANCEL,
    CANCELLED,
    EXIT,
    FAILED,
    OK,
    READY,
    RUN,
    WorkerSpec,
    decode,
    decode_error,
    encode,
)

__all__ = ("ProcessContext", "ProcessProgram")

#: Seconds a worker gets to exit when closed, or to drain a stopped or
#: cancelled run, before it is killed.
EXIT_TIMEOUT = 10.0
#: Seconds to wait for the exit code of a worker whose socket closed.
EXIT_WAIT = 0.5


def _anonymous_file(data: bytes = b"", size: int = 0) -> int:
    """A file descriptor of an unnamed file holding ``data`` or ``size``
    zero bytes: a memfd where the OS has them, else an unlinked temp file."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("asyncrt-worker", 0)
    else:  # pragma: no cover - not Linux
        fd, path = tempfile.mkstemp(prefix="asyncrt-worker-")
        os.unlink(path)
    if data:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    else:
        os.ftruncate(fd, size)
    return fd


def _own_process_group() -> dict[str, Any]:
    """Popen arguments that put a worker in a process group of its own, so
    a terminal's Ctrl-C reaches this process only (which then closes its
    workers). Not a session of its own: where the kernel groups scheduling
    by session (Linux autogroup), a worker there would be weighed against
    the event loop's process as a peer, whatever its ``worker_nice``."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {}  # pragma: no cover - the worker ignores SIGINT all the same


def _worker_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment with its import path (so a worker imports
    the same asyncrt and the same kernel modules), updated with ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


class ProcessProgram:
    """The run and stop verbs of a :class:`ProcessContext` (what an
    in-process context's :class:`~scheduler.dispatch.Program` offers)."""

    def __init__(self, context: ProcessContext) -> None:
        self._context = context
        self._halted = False
        self._wait: anyio.CancelScope | None = None  # around a run's answer

    async def run(self) -> None:
        """Run once in the worker, with the inputs already in the block.

        Every run is numbered, and its answer carries the number: an answer
        to an earlier run can never be taken for this one's.

        :raises NodeFailedError: if a kernel failed (the worker's error,
            rebuilt with its node, op, device, stream and cause).
        :raises WorkerError: if the worker died or could not start.
        :raises ClosedResourceError: if :meth:`stop` stopped the run (the
            worker is killed if it has not drained within
            :data:`EXIT_TIMEOUT` seconds; so is the worker of a cancelled
            run).
        """
        context = self._context
        self._halted = False
        await context.ready()
        run = context.send_run()
        wait = self._wait = anyio.CancelScope()
        try:
            with wait:
                kind, data = await context.answer(run)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await context.cancel(run)
            raise
        except BaseException:
            # Interrupted some other way: the answer was not read, so the
            # context must never serve another run (it is dropped).
            context.broken = True
            raise
        finally:
            self._wait = None
        if wait.cancelled_caught:  # stopped, and the grace ran out
            context.kill()
            raise ClosedResourceError(
                f"the run was stopped; {context.describe()} did not drain "
                f"within {EXIT_TIMEOUT} s and was killed"
            )
        if kind == OK:
            return
        if kind == FAILED:
            error = decode_error(data, context.describe())
            raise error from error.__cause__
        if kind == CANCELLED and self._halted:
            raise ClosedResourceError("the run was stopped")
        context.broken = True
        raise WorkerError(f"{context.describe()} answered {kind!r} to a run")

    def stop(self) -> None:
        """Stop the run in flight, if any (from the event loop): it drains
        and raises :class:`ClosedResourceError`; a worker that has not
        drained within :data:`EXIT_TIMEOUT` seconds is killed."""
        self._halted = True
        self._context.send_cancel()
        if self._wait is not None:
            with contextlib.suppress(RuntimeError):  # no event loop here
                self._wait.deadline = anyio.current_time() + EXIT_TIMEOUT


class ProcessContext:
    """A run context whose runs happen in a worker process; see the module
    docstring.

    :param spec: what the worker builds.
    :param inputs: the entry of each caller-given input, by name.
    :param heads: the graph's outputs, in order.
    :param nbytes: the device bytes the worker's context costs (for the
        pool's memory budget; the I/O block is host memory and not counted).
    :param env: environment variables to set in the worker (on top of this
        process's).
    :raises WorkerError: if the worker process cannot be started.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        inputs: Mapping[str, Entry],
        heads: Sequence[Entry],
        nbytes: int,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.nbytes = nbytes  # the block is host memory, not a device's
        self.generation = 0
        self.broken = False
        self.is_set: set[Entry] = set()
        self._closed = False
        self._pid: int | None = None
        self._runs = 0  # the number of the latest run asked for
        block_fd = _anonymous_file(size=spec.layout.nbytes)
        spec_fd = _anonymous_file(spec.to_bytes())
        ours, theirs = socket.socketpair()
        self._block = mmap.mmap(block_fd, spec.layout.nbytes)
        try:
            fds = (theirs.fileno(), block_fd, spec_fd)
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "asyncrt.runtime._process_worker",
                    *map(str, fds),
                ],
                pass_fds=fds,
                env=_worker_env(env or {}),
                stdin=subprocess.DEVNULL,
                **_own_process_group(),
            )
        except BaseException as exc:
            ours.close()
            self._block.close()
            if isinstance(exc, (OSError, ValueError)):
                raise WorkerError(f"cannot start a worker process: {exc}") from exc
            raise
        finally:
            theirs.close()
            os.close(block_fd)
            os.close(spec_fd)
        self._conn = Connection(ours.detach())
        self.program = ProcessProgram(self)
        slots = {slot.name: slot for slot in spec.layout.inputs}
        self.inputs: dict[Entry, NDArray] = {
            entry: from_dlpack(slots[name].view(self._block))
            for name, entry in inputs.items()
        }
        self._outputs = {
            head: from_dlpack(slot.view(self._block))
            for head, slot in zip(heads, spec.layout.outputs, strict=True)
        }

    def __repr__(self) -> str:
        return f"<ProcessContext {self.describe()}>"

    def describe(self) -> str:
        """``"worker process <pid>"``, for messages."""
        return f"worker process {self._proc.pid}"

    @property
    def usable(self) -> bool:
        """Whether the context may serve another run (its worker lives)."""
        return not (self.broken or self._closed)

    def output(self, entry: Entry) -> NDArray:
        """The array of a head in the block (overwritten by the next run)."""
        return self._outputs[entry]

    # -- the wire ------------------------------------------------------------

    async def ready(self) -> None:
        """Wait until the worker has built its executor.

        :raises WorkerError: if it could not (the worker's error chained).
        """
        if self._pid is not None:
            return
        if self.broken:
            raise WorkerError(f"{self.describe()} is gone")
        try:
            kind, _, data = await self.receive()
        except BaseException:
            self.broken = True  # not ready: dropped, and killed on close
            raise
        if kind == READY:
            self._pid = int(data)
            return
        self.broken = True
        cause = decode_error(data, self.describe())
        raise WorkerError(f"{self.describe()} could not start: {cause}") from cause

    def send_run(self) -> int:
        """Ask the worker for a run; return the run's number."""
        self._runs += 1
        self._send((RUN, self._runs))
        return self._runs

    def send_cancel(self) -> None:
        """Cancel the latest run, if it is still in flight."""
        self._send((CANCEL, self._runs))

    async def cancel(self, run: int) -> None:
        """Cancel ``run`` and wait until it has drained in the worker; a
        worker that takes longer than :data:`EXIT_TIMEOUT` seconds (a kernel
        that never returns) is killed."""
        self._send((CANCEL, run))
        with anyio.move_on_after(EXIT_TIMEOUT) as drain:
            with contextlib.suppress(WorkerError):  # it died: dropped anyway
                await self.answer(run)
        if drain.cancelled_caught:
            self.kill()

    def kill(self) -> None:
        """Kill the worker (it hangs, or cannot be trusted): the context is
        dropped when it comes back to the pool."""
        self.broken = True
        self._proc.kill()

    async def answer(self, run: int) -> tuple[str, Any]:
        """The worker's answer to ``run`` (answers to earlier runs, which a
        cancelled caller never read, are skipped).

        :raises WorkerError: if the worker exited.
        """
        while True:
            kind, number, data = await self.receive()
            if number == run:
                return kind, data

    def _send(self, message: tuple[str, int]) -> None:
        """Send a message; a worker that has gone is noticed on receive."""
        try:
            self._conn.send_bytes(encode(message))
        except OSError:
            self.broken = True

    async def receive(self) -> tuple[str, int, Any]:
        """The worker's next message, awaited without blocking the loop.

        :raises WorkerError: if the worker exited.
        """
        try:
            await anyio.wait_readable(self._conn.fileno())
            kind, run, data = decode(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            self.broken = True
            try:  # its socket closed: the process is exiting, if not gone
                code: int | None = self._proc.wait(EXIT_WAIT)
            except subprocess.TimeoutExpired:
                code = None
            state = "is gone" if code is None else f"exited with code {code}"
            raise WorkerError(f"{self.describe()} {state}") from exc
        return str(kind), int(run), data

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Ask the worker to exit (kill it if it does not within
        :data:`EXIT_TIMEOUT` seconds) and release the block. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pid is None or self.broken:
            self._proc.kill()  # still starting, or not to be trusted
        else:
            self._send((EXIT, self._runs))
        self._conn.close()
        try:
            self._proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self.inputs.clear()
        self._outputs.clear()
        # A view still held somewhere keeps the mapping; it goes with the view.
        with contextlib.suppress(BufferError):
            self._block.close()
