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
    "AsyncrtError",
    "ClosedResourceError",
    "CopyError",
    "DTypeError",
    "DeviceError",
    "DeviceNotFoundError",
    "OutOfMemoryError",
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
