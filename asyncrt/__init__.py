"""asyncrt: run computation graphs across several devices from async Python.

The public surface, curated here; everything else is private or internal.
"""

from devices import Device as Device
from devices import Event as Event
from devices import NDArray as NDArray
from devices import Stream as Stream
from devices import device as device
from devices import list_devices as list_devices

from . import errors as errors
from . import nd as nd
from ._devices import cpu as cpu
from ._devices import cuda as cuda
from ._devices import sim as sim
from .errors import AsyncrtError as AsyncrtError

__version__ = "0.1.0"

__all__ = (
    "AsyncrtError",
    "Device",
    "Event",
    "NDArray",
    "Stream",
    "__version__",
    "cpu",
    "cuda",
    "device",
    "errors",
    "list_devices",
    "nd",
    "sim",
)
