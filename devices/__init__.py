"""devices: asyncrt's DeviceAPI — devices, memory, streams, events, NDArray.

The lowest of asyncrt's three packages; it knows nothing of graphs. Backends
(``cpu``, ``sim``, ``cuda``, ``remote``) load by name on first use, so a
numpy-only install never imports cupy.

Code above this package never names a device kind: a :class:`DeviceAPI`
says what its kind can do (array namespace, whether it is the host, its copy
engines, its timing model and how its clock times a call), and the timing
model's formulas live here once (:class:`DeviceSpeed`, :class:`Link`,
:func:`transfer_seconds`). A new device kind is one new module that
subclasses :class:`DeviceAPI` and calls :func:`register`.
"""

from ._api import Buffer as Buffer
from ._api import DeviceAPI as DeviceAPI
from ._api import copy_function as copy_function
from ._api import modelled_copy_seconds as modelled_copy_seconds
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
from ._registry import process_state as process_state
from ._registry import register as register
from ._registry import registered_kinds as registered_kinds
from ._registry import restore_process_state as restore_process_state
from ._registry import unregister as unregister
from ._stream import BatchError as BatchError
from ._stream import Call as Call
from ._stream import Stream as Stream
from ._timing import CallTimer as CallTimer
from ._timing import CopyEngines as CopyEngines
from ._timing import DeviceSpeed as DeviceSpeed
from ._timing import Link as Link
from ._timing import ModelTimer as ModelTimer
from ._timing import transfer_seconds as transfer_seconds

__all__ = (
    "DTYPES",
    "EXTENSION_DTYPES",
    "BatchError",
    "Buffer",
    "Call",
    "CallTimer",
    "CopyEngines",
    "DLDeviceType",
    "Device",
    "DeviceAPI",
    "DeviceSpeed",
    "Event",
    "Link",
    "ModelTimer",
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
    "modelled_copy_seconds",
    "numpy_dtype",
    "process_state",
    "register",
    "registered_kinds",
    "restore_process_state",
    "transfer_seconds",
    "unregister",
)
