"""Device constructors in TVM's spelling: ``asyncrt.cpu()``, ``asyncrt.cuda(0)``."""

from __future__ import annotations

from devices import Device

__all__ = ("cpu", "cuda", "host", "sim")


def cpu(index: int = 0) -> Device:
    """The host CPU, ``cpu:index``."""
    return Device("cpu", index)


def host() -> Device:
    """The host device: where a kernel asked for without a device kind
    runs (``get_global_func(name)``), ``cpu:0``."""
    return cpu()


def cuda(index: int = 0) -> Device:
    """An NVIDIA GPU, ``cuda:index``."""
    return Device("cuda", index)


def sim(index: int = 0) -> Device:
    """A simulated accelerator, ``sim:index``."""
    return Device("sim", index)
