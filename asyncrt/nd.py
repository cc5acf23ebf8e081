"""Arrays on devices (TVM's ``tvm.nd``): ``empty``, ``array``, ``from_dlpack``."""

from devices import NDArray as NDArray
from devices import array as array
from devices import empty as empty
from devices import from_dlpack as from_dlpack

__all__ = ("NDArray", "array", "empty", "from_dlpack")
