"""The backend registry: device kinds by name, loaded on first use.

As TVM registers ``device_api.<kind>``, a backend is one module that calls
:func:`register` at import time. The built-in kinds load lazily, so a
numpy-only install never imports cupy.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping

from ._api import DeviceAPI
from ._device import Device
from .errors import ArgumentError, DeviceNotFoundError

__all__ = (
    "get_api",
    "list_devices",
    "process_state",
    "register",
    "registered_kinds",
    "restore_process_state",
)

_BUILTIN_MODULES = {
    "cpu": "devices.cpu",
    "sim": "devices.sim",
    "cuda": "devices.cuda",
    "remote": "devices.remote",  # no devices until devices.remote.connect()
}
_factories: dict[str, Callable[[], DeviceAPI]] = {}
_apis: dict[str, DeviceAPI] = {}
_lock = threading.RLock()


def register(
    kind: str, factory: Callable[[], DeviceAPI], *, override: bool = False
) -> None:
    """Register the API of a device kind.

    :param kind: the kind's name, as in ``"kind:0"``.
    :param factory: makes the kind's :class:`DeviceAPI` on first use (a
        DeviceAPI subclass works).
    :param override: replace an existing registration (tests, plug-ins).
    :raises ValueError: if ``kind`` is taken and ``override`` is false.
    """
    Device(kind)  # validates the name
    with _lock:
        if kind in _factories and not override:
            raise ValueError(f"device kind {kind!r} is already registered")
        _factories[kind] = factory
        _apis.pop(kind, None)


def unregister(kind: str) -> None:
    """Remove a kind registered with :func:`register` (for tests)."""
    with _lock:
        _factories.pop(kind, None)
        _apis.pop(kind, None)


def get_api(kind: str | Device) -> DeviceAPI:
    """The :class:`DeviceAPI` of a kind (or of a device's kind).

    :raises DeviceNotFoundError: if no backend provides that kind, or its
        backend cannot load here (e.g. cuda without cupy).
    """
    name = kind.kind if isinstance(kind, Device) else kind
    api = _apis.get(name)
    if api is not None:
        return api
    with _lock:
        if name not in _factories and name in _BUILTIN_MODULES:
            try:
                importlib.import_module(_BUILTIN_MODULES[name])
            except ImportError as exc:
                raise DeviceNotFoundError(
                    f"device kind {name!r} is not available here: {exc}"
                ) from exc
        factory = _factories.get(name)
        if factory is None:
            known = ", ".join(sorted({*_factories, *_BUILTIN_MODULES}))
            raise DeviceNotFoundError(
                f"unknown device kind {name!r}; known kinds: {known}"
            )
        api = _apis.get(name)
        if api is None:
            api = _apis[name] = factory()
        return api


def registered_kinds() -> tuple[str, ...]:
    """The kinds that can be asked for (built-in ones included)."""
    return tuple(sorted({*_factories, *_BUILTIN_MODULES}))


def list_devices() -> list[Device]:
    """Every device present, across all kinds that load here."""
    found: list[Device] = []
    for kind in registered_kinds():
        try:
            api = get_api(kind)
        except DeviceNotFoundError:
            continue
        found.extend(Device(kind, i) for i in range(api.device_count()))
    return found


def process_state() -> dict[str, object]:
    """What a worker process must be given to have the devices this process
    has: for each kind loaded here whose backend keeps state (the simulated
    devices' speeds and sizes), :meth:`DeviceAPI.process_state`. Plain data,
    picklable and JSON-able; give it to :func:`restore_process_state` in the
    worker.

    :return: the state, by kind.
    """
    with _lock:
        apis = sorted(_apis.items())
    state: dict[str, object] = {}
    for kind, api in apis:
        value = api.process_state()
        if value is not None:
            state[kind] = value
    return state


def restore_process_state(state: Mapping[str, object]) -> None:
    """Make this process's devices those that :func:`process_state`
    described in another process (call it before any device is used).

    :param state: :func:`process_state`'s result.
    :raises ArgumentError: if ``state`` is not such a result.
    :raises DeviceNotFoundError: if it names a kind not available here.
    """
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise ArgumentError(
            f"process state must map device kinds to their state, got {state!r}"
        )
    for kind, value in state.items():
        get_api(kind).restore_process_state(value)
