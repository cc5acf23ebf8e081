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

from . import debug_executor as debug_executor
from . import errors as errors
from . import graph as graph
from . import graph_executor as graph_executor
from . import nd as nd
from . import ops as ops
from . import profiling as profiling
from . import serving as serving
from ._devices import cpu as cpu
from ._devices import cuda as cuda
from ._devices import sim as sim
from .errors import AsyncrtError as AsyncrtError
from .io._factory import GraphExecutorFactory as GraphExecutorFactory
from .io._factory import build as build
from .io._factory import load_module as load_module
from .io._param_dict import load_param_dict as load_param_dict
from .io._param_dict import save_param_dict as save_param_dict
from .ops import _builtin as _builtin  # registers the built-in kernels
from .ops._kernels import Bindable as Bindable
from .ops._kernels import Module as Module
from .ops._kernels import get_global_func as get_global_func
from .ops._kernels import list_global_func_names as list_global_func_names
from .ops._kernels import register_func as register_func
from .serving import Batcher as Batcher
from .serving import Padding as Padding
from .tools._time_evaluator import BenchmarkResult as BenchmarkResult
from .tools._time_evaluator import time_evaluator as time_evaluator

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # asyncrt.frontend needs the optional onnx package: imported on first use.
    if name == "frontend":
        import importlib

        return importlib.import_module(".frontend", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = (
    "AsyncrtError",
    "Batcher",
    "BenchmarkResult",
    "Bindable",
    "Device",
    "Event",
    "GraphExecutorFactory",
    "Module",
    "NDArray",
    "Padding",
    "Stream",
    "__version__",
    "build",
    "cpu",
    "cuda",
    "debug_executor",
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
    "ops",
    "profiling",
    "register_func",
    "save_param_dict",
    "serving",
    "sim",
    "time_evaluator",
)
