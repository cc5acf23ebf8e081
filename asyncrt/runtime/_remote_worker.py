"""Kernels on ``remote`` devices: looked up by name, on the worker.

A remote device's kernel never travels as an object. On the host,
:func:`remote_kernel` answers the executor's lookup for kind ``remote``
with a :class:`~devices.remote.RemoteFunction` naming :func:`run_kernel`,
the kernel's registry name and the module that defines it (and, as usual,
registers it); the worker receives that reference, imports asyncrt and that
module, and runs the kernel its own registry has for its own device kind.

What runs remotely, then, is exactly what the workers' registries hold:

* a kernel registered globally (``register_func``) in an importable module
  — asyncrt's built-ins, or a module of yours installed on the workers;
* not a kernel defined in ``__main__`` (the workers cannot import it), not
  one that only a ``Module`` passed as ``lib`` provides (or that ``lib``
  overrides: the worker would run another one), and not a coroutine kernel.

For those, :func:`remote_kernel` answers ``None``: placement keeps such nodes
off remote devices, and a node pinned to one is a ``PlanError`` when the
executor is created.
"""

from __future__ import annotations

import importlib
import inspect
import re
import threading
from typing import Any

from devices.remote import RemoteFunction, worker_kind

from ..errors import KernelNotFoundError
from ..ops._kernels import Kernel, Module, get_global_func

__all__ = ("remote_kernel", "run_kernel")

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_imported: set[str] = set()
_import_lock = threading.Lock()


def run_kernel(kind: str, name: str, module: str, *arrays: Any) -> None:
    """Run kernel ``name`` for device ``kind`` on this worker (worker side).

    :param kind: the worker-local device kind (a cpu or a GPU).
    :param name: the kernel's registry name.
    :param module: the module that defines and registers it ("" for
        asyncrt's own).
    :param arrays: the kernel's arguments, inputs then outputs.
    :raises KernelNotFoundError: if this worker has no such kernel.
    """
    if module and module not in _imported:
        with _import_lock:
            importlib.import_module(module)
            _imported.add(module)
    kernel = get_global_func(name, kind, allow_missing=True)
    if kernel is None:
        where = f"module {module!r}" if module else "asyncrt"
        raise KernelNotFoundError(
            f"this worker has no kernel {name!r} for {kind!r} after importing "
            f"{where}: is the same version installed on the workers?"
        )
    kernel(*arrays)


def remote_kernel(name: str, lib: Module | None) -> RemoteFunction | None:
    """The remote form of kernel ``name``, or ``None`` if the workers cannot
    run it (see the module docstring).

    :param name: the kernel's name.
    :param lib: the executor's ``lib``.
    """
    kind = worker_kind()
    kernel = get_global_func(name, kind, allow_missing=True)
    if kernel is None or inspect.iscoroutinefunction(kernel):
        return None
    local = lib.find(name, kind) if lib is not None else None
    if local is not None and local is not kernel:
        return None
    module = _defining_module(kernel)
    if module is None:
        return None
    return RemoteFunction(run_kernel, (name, module), label=name)


def _defining_module(kernel: Kernel) -> str | None:
    """The module a worker imports to get ``kernel`` registered, "" when
    importing asyncrt does, ``None`` when no worker can."""
    module = getattr(kernel, "__module__", None) or type(kernel).__module__
    if module in ("__main__", "__mp_main__") or not _MODULE_NAME.match(module):
        return None
    if module == "asyncrt" or module.startswith("asyncrt."):
        return ""  # importing run_kernel's module registers those
    return module
