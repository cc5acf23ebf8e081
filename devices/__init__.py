"""devices: asyncrt's DeviceAPI — devices, memory, streams, events, NDArray.

The lowest of asyncrt's three packages; it knows nothing of graphs.
"""

from ._device import DLDeviceType as DLDeviceType
from ._device import Device as Device
from ._device import device as device
from ._dtype import DTYPES as DTYPES
from ._dtype import dtype_nbytes as dtype_nbytes
from ._dtype import dtype_string as dtype_string
from ._dtype import numpy_dtype as numpy_dtype

__all__ = (
    "DTYPES",
    "DLDeviceType",
    "Device",
    "device",
    "dtype_nbytes",
    "dtype_string",
    "numpy_dtype",
)
