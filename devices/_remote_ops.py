"""What a Dask worker runs for the ``remote`` backend.

Every function here reaches a worker *by reference* (Dask pickles a
module-level function as its module and name, and the worker imports
``devices``) and takes only plain data: ints, strings, uint8 arrays, the
worker-local buffers that :func:`allocate` made, and the results of earlier
tasks. Kernels arrive the same way: a module-level function and its string
arguments (for asyncrt's kernels, a registry name), never a closure.

**Order.** Each task of a stream takes the previous task of that stream
(``prev``) and the tasks of the events it waits for (``waits``) as arguments.
It ignores their values (``None``); the arguments are there so that Dask
runs it after them, which is how a stream keeps its order on a cluster.

**Failure.** A call that raises becomes :class:`RemoteFailure`: the id of the
call, the exception's type name, message and traceback, as text. Dask then
fails every task that depends on it without running it, with the same
exception: the rest of the stream's work, and the streams waiting on it —
exactly a stream's failure semantics, and the host learns which call failed
from the id.

**Memory.** Worker memory is a :class:`WorkerBuffer`, the result of
:func:`allocate`, kept by Dask as that task's result for as long as the host
holds its future. It refuses to be pickled, so Dask never spills it to disk
and never moves it to another worker: bytes leave a worker only as the
explicit chunks :func:`read` returns, and kernels write into it in place.
"""

from __future__ import annotations

import contextlib
import importlib
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ._device import Device
from ._ndarray import NDArray, empty

__all__ = (
    "RemoteFailure",
    "WireArray",
    "WireCall",
    "WorkerBuffer",
    "allocate",
    "copy",
    "measure_flops",
    "nbytes_of",
    "noop",
    "read",
    "run_calls",
    "write",
    "zeros",
)

#: One array argument on the wire: (buffer slot, byte offset, shape, dtype).
WireArray = tuple[int, int, tuple[int, ...], str]
#: One kernel call on the wire: (call id, function, its leading string
#: arguments, its arrays). The worker runs ``function(kind, *args, *arrays)``
#: where ``kind`` is the worker-local device kind ("cpu", "cuda").
WireCall = tuple[int, Callable[..., None], tuple[str, ...], tuple[WireArray, ...]]

#: The call id of work that belongs to no stream call (blocking copies).
NO_CALL = 0


class RemoteFailure(Exception):
    """Raised on a worker when a call failed; carries text, not objects.

    :ivar call: the host's id of the failing call (``NO_CALL`` if none).
    :ivar type_name: the original exception's type name.
    :ivar message: its message.
    :ivar remote_traceback: its traceback, formatted.
    """

    def __init__(
        self, call: int, type_name: str, message: str, remote_traceback: str
    ) -> None:
        super().__init__(call, type_name, message, remote_traceback)
        self.call = call
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"

    @classmethod
    def from_exception(cls, call: int, exc: BaseException) -> RemoteFailure:
        """Describe ``exc``, raised by call ``call``, as text."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(call, type(exc).__name__, str(exc), text)


class WorkerBuffer:
    """Device memory on a worker: what a remote buffer's future holds.

    :ivar array: the whole allocation, as uint8, on the worker-local device.
    """

    __slots__ = ("array",)

    def __init__(self, array: NDArray) -> None:
        self.array = array

    def view(self, offset: int, shape: tuple[int, ...], dtype: str) -> NDArray:
        """The typed view at ``offset`` (bounds are checked)."""
        return self.array.view(shape, dtype, offset)

    def __reduce__(self) -> Any:
        # Refusing pickling keeps the memory where it is: Dask neither
        # spills it to disk nor ships it to another worker.
        raise TypeError("a remote device's memory never leaves its worker")

    def __repr__(self) -> str:
        return f"<WorkerBuffer {self.array.nbytes} bytes on {self.array.device}>"


@contextlib.contextmanager
def _on(local: Device) -> Iterator[None]:
    """Run the body with ``local`` current; a GPU's work is finished (not
    just queued) when the body ends, so the task's completion means it."""
    if local.kind != "cuda":
        yield
        return
    cupy = importlib.import_module("cupy")
    with cupy.cuda.Device(local.index):
        yield
        cupy.cuda.Device(local.index).synchronize()


def _failure(call: int, exc: BaseException) -> RemoteFailure:
    return (
        exc
        if isinstance(exc, RemoteFailure)
        else RemoteFailure.from_exception(call, exc)
    )


def allocate(local: str, nbytes: int) -> WorkerBuffer:
    """Allocate ``nbytes`` on the worker-local device ``local`` ("cpu:0").

    :raises RemoteFailure: if the device has no room (type
        ``OutOfMemoryError``) or the request is invalid.
    """
    device = Device.parse(local)
    try:
        return WorkerBuffer(empty((nbytes,), "uint8", device))
    except Exception as exc:
        raise _failure(NO_CALL, exc) from None


def run_calls(
    prev: object,
    waits: Sequence[object],
    local: str,
    buffers: Sequence[WorkerBuffer],
    calls: Sequence[WireCall],
) -> None:
    """Run kernel calls in order on the worker-local device ``local``.

    :param prev: the stream's previous task (for order only).
    :param waits: the tasks of the events waited for (for order only).
    :param buffers: the buffers the calls' arrays view, by slot.
    :param calls: the calls.
    :raises RemoteFailure: naming the first call that raised; the calls
        after it do not run.
    """
    device = Device.parse(local)
    call = NO_CALL
    try:
        with _on(device):
            for call_id, function, args, refs in calls:
                call = call_id  # named in the failure if this call raises
                arrays = [
                    buffers[slot].view(offset, shape, dtype).backend_array()
                    for slot, offset, shape, dtype in refs
                ]
                function(device.kind, *args, *arrays)
    except Exception as exc:
        raise _failure(call, exc) from None


def read(
    prev: object,
    waits: Sequence[object],
    call: int,
    buffer: WorkerBuffer,
    offset: int,
    nbytes: int,
) -> np.ndarray[Any, Any]:
    """A copy of ``nbytes`` at ``offset``, as a host uint8 array: the chunk
    that travels (to the host, or to another worker).

    :raises RemoteFailure: if the range is outside the buffer.
    """
    try:
        return buffer.view(offset, (nbytes,), "uint8").numpy()
    except Exception as exc:
        raise _failure(call, exc) from None


def write(
    prev: object,
    waits: Sequence[object],
    call: int,
    buffer: WorkerBuffer,
    offset: int,
    data: np.ndarray[Any, Any],
) -> None:
    """Write a uint8 chunk (from the host or from :func:`read` on another
    worker) at ``offset``.

    :raises RemoteFailure: if the chunk does not fit.
    """
    try:
        buffer.view(offset, (data.nbytes,), "uint8").copyfrom(data)
    except Exception as exc:
        raise _failure(call, exc) from None


def copy(
    prev: object,
    waits: Sequence[object],
    call: int,
    src: WorkerBuffer,
    src_offset: int,
    dst: WorkerBuffer,
    dst_offset: int,
    nbytes: int,
) -> None:
    """Copy between two buffers of one worker (maybe of two of its devices).

    :raises RemoteFailure: if a range is outside its buffer.
    """
    try:
        source = src.view(src_offset, (nbytes,), "uint8")
        dst.view(dst_offset, (nbytes,), "uint8").copyfrom(source)
    except Exception as exc:
        raise _failure(call, exc) from None


def noop(*deps: object) -> None:
    """Nothing, after ``deps``: for measuring round trips and chains."""


def zeros(nbytes: int) -> np.ndarray[Any, Any]:
    """A chunk of ``nbytes`` zero bytes: for measuring links."""
    return np.zeros(nbytes, dtype=np.uint8)


def nbytes_of(data: np.ndarray[Any, Any]) -> int:
    """The size of a chunk that was moved here: for measuring links."""
    return int(data.nbytes)


def measure_flops(local: str) -> float:
    """Float32 matmul throughput of the worker-local device (~5 ms on a cpu).

    Only the cpu is measured; a GPU reports what its backend estimates.
    """
    device = Device.parse(local)
    if device.kind != "cpu":
        from ._registry import get_api

        return float(get_api(device.kind).get_attr(device, "flops"))
    a = np.ones((256, 256), dtype=np.float32)
    a @ a
    start = time.perf_counter()
    for _ in range(4):
        a @ a
    return 4 * 2 * 256**3 / max(time.perf_counter() - start, 1e-9)
