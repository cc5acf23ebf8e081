"""devices: asyncrt's DeviceAPI — devices, memory, streams, events, NDArray.

The lowest of asyncrt's three packages; it knows nothing of graphs. Backends
(``cpu``, ``sim``, ``cuda``) load by name on first use, so a numpy-only
install never imports cupy.
"""

from ._api import Buffer as Buffer
from ._api import DeviceAPI as DeviceAPI
from ._api import copy_function as copy_function
from ._device import Device as Device
from ._device import DLDeviceType as DLDeviceType
from ._device import device as device
from ._dtype import DTYPES as DTYPES
from ._dtype import EXTENSION_DTYPES as EXTENSION_DTYPES
from ._dtype import dtype_nbytes as dtype_nbytes
from ._dtype import dtype_string as dtype_string
from ._dtype import numpy_dtype as numpy_dtype
from ._event import Event as Event
from ._ndarray import NDArray as NDArray
from ._ndarray import array as array
from ._ndarray import empty as empty
from ._ndarray import from_dlpack as from_dlpack
from ._registry import get_api as get_api
from ._registry import list_devices as list_devices
from ._registry import register as register
from ._registry import registered_kinds as registered_kinds
from ._registry import unregister as unregister
from ._stream import BatchError as BatchError
from ._stream import Call as Call
from ._stream import Stream as Stream

__all__ = (
    "DTYPES",
    "EXTENSION_DTYPES",
    "BatchError",
    "Buffer",
    "Call",
    "DLDeviceType",
    "Device",
    "DeviceAPI",
    "Event",
    "NDArray",
    "Stream",
    "array",
    "copy_function",
    "device",
    "dtype_nbytes",
    "dtype_string",
    "empty",
    "from_dlpack",
    "get_api",
    "list_devices",
    "numpy_dtype",
    "register",
    "registered_kinds",
    "unregister",
)
