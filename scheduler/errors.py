"""Errors raised by planning and by running a plan."""

from __future__ import annotations

from devices.errors import AsyncrtError

__all__ = ("NodeFailedError", "PlanError")


class PlanError(AsyncrtError, ValueError):
    """Raised when a graph cannot be planned: a node no device can run, a pin
    to a device that is not available, an inconsistent storage request."""


class NodeFailedError(AsyncrtError):
    """Raised when a node's kernel failed during a run.

    The kernel's own exception is chained as ``__cause__``.

    :ivar node: the node's name.
    :ivar op: the kernel name (``func_name``).
    :ivar device: the device it ran on, such as ``"cpu:0"``.
    :ivar stream: the stream it ran on.
    """

    def __init__(self, node: str, op: str, device: str, stream: str) -> None:
        self.node = node
        self.op = op
        self.device = device
        self.stream = stream
        super().__init__(
            f"node {node!r} (op {op!r}) failed on {device}, stream {stream}"
        )
