"""``Device``: a value naming one device, such as ``cpu:0`` or ``sim:1``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import DeviceNotFoundError

__all__ = ("DLDeviceType", "Device", "device")

_DEVICE_RE = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*(?::\s*(\d+)\s*)?$")


class DLDeviceType:
    """DLPack's device-type codes (``DLDeviceType`` in ``dlpack.h``).

    TVM graph files store these numbers in ``device_index``.
    """

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    VPI = 9
    ROCM = 10
    EXT_DEV = 12


@dataclass(frozen=True, order=True)
class Device:
    """A device: a backend kind and an index, printed as ``kind:index``.

    Devices are plain values: equal when kind and index are, hashable, and
    cheap to make. Making one checks nothing; :func:`devices.get_api` and the
    backend decide whether it exists (see :attr:`exist`).
    """

    kind: str
    index: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not _DEVICE_RE.match(self.kind):
            raise DeviceNotFoundError(f"invalid device kind {self.kind!r}")
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise DeviceNotFoundError(
                f"device index must be an int, got {self.index!r}"
            )
        if self.index < 0:
            raise DeviceNotFoundError(f"device index must be >= 0, got {self.index}")

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    def __repr__(self) -> str:
        return f"Device({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> Device:
        """Parse ``"cuda:0"``, ``"sim:1"`` or ``"cpu"`` (index 0).

        :raises DeviceNotFoundError: if the text is not ``kind[:index]``.
        """
        match = _DEVICE_RE.match(text) if isinstance(text, str) else None
        if match is None:
            raise DeviceNotFoundError(
                f"cannot parse device {text!r}; expected 'kind' or 'kind:index'"
            )
        kind, index = match.group(1), match.group(2)
        return cls(kind, int(index) if index is not None else 0)

    @property
    def exist(self) -> bool:
        """Whether this device is present (TVM's ``Device.exist``)."""
        from ._registry import get_api

        try:
            api = get_api(self.kind)
        except DeviceNotFoundError:
            return False
        return api.exists(self)


def device(spec: str | Device, index: int | None = None) -> Device:
    """Make a :class:`Device` from ``"cuda:0"``, ``("cuda", 0)`` or a Device.

    :param spec: a device string or a Device.
    :param index: an index that overrides the one in ``spec``.
    :raises DeviceNotFoundError: if ``spec`` does not parse.
    """
    dev = spec if isinstance(spec, Device) else Device.parse(spec)
    return dev if index is None else Device(dev.kind, index)
