"""asyncrt: run computation graphs across several devices from async Python.

The public surface, curated here; everything else is private or internal.
TVM users will recognise the names: ``asyncrt.cpu()``, ``asyncrt.nd``,
``asyncrt.graph_executor.create``, ``register_func``, ``save_param_dict``.
"""

from devices import Device as Device
from devices import Event as Event
from devices import NDArray as NDArray
from devices import Stream as Stream
from devices import device as device
from devices import list_devices as list_devices

from . import _ops as _ops  # registers the built-in kernels
from . import errors as errors
from . import graph as graph
from . import graph_executor as graph_executor
from . import nd as nd
from ._devices import cpu as cpu
from ._devices import cuda as cuda
from ._devices import sim as sim
from ._factory import GraphExecutorFactory as GraphExecutorFactory
from ._factory import build as build
from ._factory import load_module as load_module
from ._kernels import Module as Module
from ._kernels import get_global_func as get_global_func
from ._kernels import list_global_func_names as list_global_func_names
from ._kernels import register_func as register_func
from ._param_dict import load_param_dict as load_param_dict
from ._param_dict import save_param_dict as save_param_dict
from .errors import AsyncrtError as AsyncrtError

__version__ = "0.1.0"

__all__ = (
    "AsyncrtError",
    "Device",
    "Event",
    "GraphExecutorFactory",
    "Module",
    "NDArray",
    "Stream",
    "__version__",
    "build",
    "cpu",
    "cuda",
    "device",
    "errors",
    "get_global_func",
    "graph",
    "graph_executor",
    "list_devices",
    "list_global_func_names",
    "load_module",
    "load_param_dict",
    "nd",
    "register_func",
    "save_param_dict",
    "sim",
)
