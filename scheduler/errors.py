"""Errors raised by planning and by running a plan."""

from __future__ import annotations

from devices.errors import AsyncrtError

__all__ = ("NodeFailedError", "PlanError")


class PlanError(AsyncrtError, ValueError):
    """Raised when a graph cannot be planned: a node no device can run, a pin
    to a device that is not available, an inconsistent storage request."""


class NodeFailedError(AsyncrtError):
    """Raised when a node's kernel failed during a run.

    The message ends with the kernel's own exception, type and message (so a
    log or the command line shows why), and that exception is chained as
    ``__cause__``, e.g. ``node 'mm' (op 'matmul') failed on cpu:0, stream
    cpu:0/stream0: ValueError: matmul: Output operand 0 has a mismatch ...``.

    :ivar node: the node's name.
    :ivar op: the kernel name (``func_name``).
    :ivar device: the device it ran on, such as ``"cpu:0"``.
    :ivar stream: the stream it ran on.
    :ivar reason: the kernel's exception as ``"Type: message"`` ("" if not
        known).
    """

    def __init__(
        self,
        node: str,
        op: str,
        device: str,
        stream: str,
        cause: BaseException | None = None,
    ) -> None:
        self.node = node
        self.op = op
        self.device = device
        self.stream = stream
        self.reason = "" if cause is None else describe(cause)
        message = f"node {node!r} (op {op!r}) failed on {device}, stream {stream}"
        super().__init__(f"{message}: {self.reason}" if self.reason else message)


def describe(exc: BaseException) -> str:
    """An exception as ``"Type: message"`` (just ``"Type"`` without one).

    :param exc: the exception.
    """
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
