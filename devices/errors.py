"""The error hierarchy shared by every asyncrt package.

Every exception asyncrt raises on purpose derives from :class:`AsyncrtError`.
This module lives in ``devices`` because that package sits at the bottom of
the dependency order (``devices <- scheduler <- asyncrt``); the higher
packages derive their own errors from these classes and :mod:`asyncrt`
re-exports the whole family.
"""

from __future__ import annotations

__all__ = (
    "AllocationError",
    "ArgumentError",
    "AsyncrtError",
    "ClosedResourceError",
    "CopyError",
    "DTypeError",
    "DeviceError",
    "DeviceLostError",
    "DeviceNotFoundError",
    "OutOfMemoryError",
    "RemoteError",
    "StreamError",
    "StreamMismatchError",
    "UnsupportedOperationError",
)


class AsyncrtError(Exception):
    """The root of every error asyncrt raises on purpose."""


class DeviceError(AsyncrtError):
    """Raised when a device operation fails; subclasses say how."""


class DeviceNotFoundError(DeviceError, LookupError):
    """Raised for an unknown device kind, an index past the devices present,
    or a string that does not parse as a device."""


class UnsupportedOperationError(DeviceError):
    """Raised when a backend cannot do what was asked (an attribute it cannot
    report, DLPack export of memory the host cannot address, ...)."""


class ArgumentError(AsyncrtError, ValueError):
    """Raised when a function is given an argument it cannot use (an
    executor option out of range, a device where a kernel library goes, a
    speed that is not positive, a configuration that would strand memory in
    use, a tool's bad count); the message names the argument, what was
    wrong and, where there are few, the accepted values. One class for
    every package (:mod:`asyncrt.errors` re-exports it)."""


class AllocationError(DeviceError, ValueError):
    """Raised for a negative, absurd or otherwise invalid allocation request."""


class OutOfMemoryError(DeviceError, MemoryError):
    """Raised when a device has no room for an allocation.

    :ivar device: the device, as a string such as ``"sim:0"``.
    :ivar requested: bytes asked for.
    :ivar available: bytes the device could still give, if it knows.
    """

    def __init__(
        self, device: str, requested: int, available: int | None = None
    ) -> None:
        self.device = device
        self.requested = requested
        self.available = available
        free = "unknown" if available is None else f"{available} bytes"
        super().__init__(
            f"out of memory on {device}: requested {requested} bytes, free {free}"
        )


class CopyError(DeviceError, ValueError):
    """Raised when a copy's sizes, offsets, shapes or dtypes disagree."""


class DTypeError(AsyncrtError, TypeError):
    """Raised for a dtype string asyncrt does not know."""


class StreamMismatchError(DeviceError, ValueError):
    """Raised when a stream of one device is used for work on another."""


class ClosedResourceError(AsyncrtError):
    """Raised when a closed stream, device, executor or module is used."""


class StreamError(DeviceError):
    """Raised when work launched on a stream failed.

    The failing exception is chained as ``__cause__``. It is reported by the
    next event recorded on that stream (and by every stream that waited on
    that event).

    :ivar stream: a description of the stream, such as ``"cpu:0/stream 1"``.
    """

    def __init__(self, message: str, stream: str) -> None:
        self.stream = stream
        super().__init__(message)


class DeviceLostError(DeviceError):
    """Raised when a device stopped being reachable while it was in use: the
    worker behind a ``remote`` device died or left the cluster, or the
    connection to the cluster was closed. Work already launched there fails
    with this error (chained under the node's :class:`NodeFailedError`);
    later work on the device fails at once. Other devices are unaffected.

    :ivar device: the lost device, such as ``"remote:1"``.
    :ivar worker: the address of the worker behind it, if it had one.
    """

    def __init__(self, message: str, *, device: str, worker: str | None = None) -> None:
        self.device = device
        self.worker = worker
        super().__init__(message)


class RemoteError(DeviceError):
    """Raised when work on a ``remote`` device raised on its worker.

    The worker's own exception object does not travel: its type name, its
    message and its traceback come back as text.

    :ivar device: the device, such as ``"remote:0"``.
    :ivar worker: the worker's address.
    :ivar type_name: the remote exception's type, such as ``"ValueError"``.
    :ivar remote_traceback: the remote traceback, as text.
    """

    def __init__(
        self,
        message: str,
        *,
        device: str,
        worker: str,
        type_name: str,
        remote_traceback: str = "",
    ) -> None:
        self.device = device
        self.worker = worker
        self.type_name = type_name
        self.remote_traceback = remote_traceback
        super().__init__(message)
