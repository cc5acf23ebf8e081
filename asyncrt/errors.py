"""asyncrt's errors: one hierarchy rooted at :class:`AsyncrtError`.

The device-level and planning errors are defined in the lower packages and
re-exported here, so ``from asyncrt.errors import ...`` reaches every one.
"""

from __future__ import annotations

import os

from devices.errors import (
    AllocationError,
    ArgumentError,
    AsyncrtError,
    ClosedResourceError,
    CopyError,
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    DTypeError,
    OutOfMemoryError,
    RemoteError,
    StreamError,
    StreamMismatchError,
    UnsupportedOperationError,
)
from scheduler.errors import NodeFailedError, PlanError

__all__ = (
    "AllocationError",
    "ArgumentError",
    "ArtifactError",
    "ArtifactIOError",
    "ArtifactNotFoundError",
    "AsyncrtError",
    "BusyError",
    "ClosedResourceError",
    "CopyError",
    "DTypeError",
    "DeviceError",
    "DeviceLostError",
    "DeviceNotFoundError",
    "GraphError",
    "InputError",
    "KernelNotFoundError",
    "MissingDependencyError",
    "NodeFailedError",
    "NodeOutOfMemoryError",
    "OutOfMemoryError",
    "ParamsError",
    "PlanError",
    "RemoteError",
    "RenderError",
    "StreamError",
    "StreamMismatchError",
    "UnsupportedOpError",
    "UnsupportedOperationError",
    "WorkerError",
)


class GraphError(AsyncrtError, ValueError):
    """Raised when a graph is malformed.

    :ivar node: the offending node's name (or id), if one is to blame.
    :ivar field: the JSON field that is wrong, such as ``"inputs"``.
    :ivar source: the file the graph came from, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        field: str | None = None,
        source: str | None = None,
    ) -> None:
        self.node = node
        self.field = field
        self.source = source
        where = []
        if source is not None:
            where.append(source)
        if node is not None:
            where.append(f"node {node!r}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = ": ".join([", ".join(where)]) + ": " if where else ""
        super().__init__(prefix + message)


class UnsupportedOpError(GraphError):
    """Raised when a model imported by a frontend uses an operator, an
    attribute or a dtype that asyncrt does not implement — at import time,
    never as a wrong answer later.

    :ivar op_type: the operator, such as ``"Resize"``.
    :ivar opset: the model's opset for the operator's domain.
    :ivar attribute: the attribute to blame, if one is.
    """

    def __init__(
        self,
        message: str,
        *,
        op_type: str,
        node: str,
        opset: int,
        attribute: str | None = None,
    ) -> None:
        self.op_type = op_type
        self.opset = opset
        self.attribute = attribute
        super().__init__(f"node {node!r} ({op_type}, opset {opset}): {message}")
        self.node = node


class ParamsError(AsyncrtError, ValueError):
    """Raised when a params blob is truncated, corrupt or implausible.

    :ivar offset: the byte offset where decoding failed.
    """

    def __init__(self, message: str, *, offset: int) -> None:
        self.offset = offset
        super().__init__(f"params blob, byte offset {offset}: {message}")


class ArtifactError(AsyncrtError, ValueError):
    """Raised when an exported module file is malformed or tampered with.

    :ivar path: the file.
    """

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class ArtifactIOError(ArtifactError, OSError):
    """Raised when a module file cannot be read or written for a reason of
    the operating system's (no permission, a full disk, a folder where the
    file should be). It is also an :class:`OSError`, with ``errno``,
    ``strerror`` and ``filename`` (the caller's path, never a temporary
    file's) set as the operating system's own error would have them.

    :ivar path: the file.
    """

    def __init__(self, message: str, *, path: str, errno: int | None = None) -> None:
        super().__init__(message, path=path)
        self.errno = errno
        self.strerror = os.strerror(errno) if errno is not None else message
        self.filename = path

    def __str__(self) -> str:
        # OSError's own text would be "[Errno 2] ...": keep asyncrt's message.
        return str(self.args[0])


class ArtifactNotFoundError(ArtifactIOError, FileNotFoundError):
    """Raised when the module file to load does not exist, or the folder to
    export one into does not; ``except FileNotFoundError`` catches it too."""


class KernelNotFoundError(AsyncrtError, LookupError):
    """Raised at build time when no kernel is registered for a node's
    ``func_name`` on the device kind it was placed on."""


class InputError(AsyncrtError, ValueError):
    """Raised when an input given to an executor does not match the graph
    (unknown name or index, wrong shape, dtype or device)."""


class BusyError(AsyncrtError, RuntimeError):
    """Raised when the stateful API (``set_input`` / ``run()`` /
    ``get_output``) is used while a stateful run is in flight: those calls
    belong to one caller at a time. Concurrent callers use
    ``await run(**inputs)``."""


class NodeOutOfMemoryError(NodeFailedError, OutOfMemoryError):
    """Raised when a node's kernel failed because a device ran out of memory
    during a run (e.g. it asked for workspace that is not there). It is both
    a :class:`NodeFailedError` (naming the node, op, device and stream) and an
    :class:`OutOfMemoryError` (naming the request); the device's own error is
    chained. The run's context is intact: later runs may succeed.

    :ivar requested: bytes the kernel asked for.
    :ivar available: bytes the device could still give, if it knows.
    :ivar memory_device: the device that had no room (``device`` is the one
        the node ran on; they are the same unless the kernel allocated
        elsewhere).
    """

    def __init__(self, failed: NodeFailedError, cause: OutOfMemoryError) -> None:
        # Set both parents' fields here: their __init__s share one super().
        self.node, self.op = failed.node, failed.op
        self.device, self.stream = failed.device, failed.stream
        self.requested = cause.requested
        self.available = cause.available
        self.memory_device = cause.device
        free = "unknown" if cause.available is None else f"{cause.available} bytes"
        Exception.__init__(
            self,
            f"node {failed.node!r} (op {failed.op!r}) ran out of memory on "
            f"{cause.device}: requested {cause.requested} bytes, free {free} "
            f"(stream {failed.stream})",
        )


class WorkerError(AsyncrtError, RuntimeError):
    """Raised when a worker process of a process-backed executor
    (``create(..., processes=True)``) could not start (its own error
    chained: a kernel it cannot find, a module in ``worker_imports`` that
    does not import, ...) or died during a run. The run fails; the executor
    drops that worker and starts a new one for later runs."""


class MissingDependencyError(AsyncrtError, ImportError):
    """Raised when a feature needs an optional dependency that is not
    installed; the message says which ``pip install`` brings it.

    :ivar package: the missing package, such as ``"matplotlib"``.
    :ivar extra: asyncrt's extra that installs it, such as ``"plot"``.
    """

    def __init__(self, feature: str, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"{feature} needs {package}, which is not installed: "
            f"pip install 'asyncrt[{extra}]'"
        )


class RenderError(AsyncrtError, RuntimeError):
    """Raised when an external renderer (graphviz's ``dot``) fails to draw a
    picture; the message carries what it said."""
