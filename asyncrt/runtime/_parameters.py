"""The executor's parameters: held once, shared read-only by every run.

Each parameter is one host array (``cpu:0``), a copy of the value given
that nobody else writes: the source of truth. A compiled graph that keeps a
parameter on the host binds that array itself; one that reads it on another
device (a GPU, a simulated or a remote device) binds a copy there, made the
first time a run context needs it — in the context's build, which runs off
the event loop — and kept until the value changes. Values are keyed by
name, not by a compiled graph's entries: every compiled graph of an
executor (one per shape signature) binds the same arrays.

Changing a value replaces its host array and drops its device copies
(never writing in place into arrays that run contexts are bound to);
:attr:`Parameters.generation` counts such changes, and the executor
rebuilds its contexts after one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

import numpy as np

from devices import Device, NDArray, array, dtype_string
from devices._ndarray import wrap_fresh_host
from scheduler.dag import Entry

from .._devices import host
from ._compiled import CompiledGraph, HostValue

__all__ = ("HostValue", "Parameters")

_HOST = host()


class Parameters:
    """Parameter arrays by name, with their copies on other devices.

    :param parent: parameters to read through to for names this one lacks
        (an executor's shared weights, under one shape signature's own
        constants): the parent's arrays and device copies are shared, never
        copied.
    """

    def __init__(self, parent: Parameters | None = None) -> None:
        self._parent = parent
        self._host: dict[str, NDArray] = {}
        self._copies: dict[tuple[str, Device], NDArray] = {}
        # Contexts are built on worker threads, several at once.
        self._lock = threading.Lock()
        self.generation = 0

    def __contains__(self, name: object) -> bool:
        return name in self._host or (self._parent is not None and name in self._parent)

    def names(self) -> frozenset[str]:
        """The names of the parameters held (the parent's included)."""
        inherited = self._parent.names() if self._parent is not None else frozenset()
        return inherited | self._host.keys()

    def host_array(self, name: str) -> NDArray:
        """Parameter ``name`` on the host (callers must not write to it)."""
        if name not in self._host and self._parent is not None:
            return self._parent.host_array(name)
        return self._host[name]

    def load(self, values: Iterable[tuple[str, HostValue]]) -> None:
        """Set parameters (values already checked): each becomes a new host
        copy — or, for a read-only numpy array (``from_onnx``'s weights),
        that array itself, since nobody can write to it through numpy —
        and its device copies are dropped."""
        loaded = {name: _host_array(value) for name, value in values}
        with self._lock:
            self._host.update(loaded)
            self._forget(loaded)
            self.generation += 1

    def share(self, arrays: Mapping[str, NDArray]) -> None:
        """Use these host arrays (another executor's, no copy)."""
        with self._lock:
            self._host.update(arrays)
            self._forget(arrays)
            self.generation += 1

    def bound(self, compiled: CompiledGraph) -> dict[Entry, NDArray]:
        """The arrays a run context of ``compiled`` binds: each parameter at
        its entry, on the device the plan keeps it, and at each constant
        copy's entry on the copy's device (copies made here if missing:
        call it off the event loop)."""
        plan = compiled.plan
        arrays: dict[Entry, NDArray] = {}
        for name, entry in compiled.input_entries.items():
            if name in self:
                arrays[entry] = self.on(name, plan.storage[entry].device)
        for copy, source in plan.constant_copies.items():
            name = compiled.name_of(plan.resolve(source))
            if name not in self:
                continue
            value = self.on(name, plan.storage[copy].device)
            spec = compiled.tensor(copy)
            if value.shape != spec.shape or value.dtype != spec.dtype:
                # A copy of an alias of the parameter (a reshape): its bytes.
                value = NDArray(value.buffer, spec.shape, spec.dtype, value.byte_offset)
            arrays[copy] = value
        return arrays

    def on(self, name: str, device: Device) -> NDArray:
        """Parameter ``name`` on ``device`` (copied there on first use)."""
        if name not in self._host and self._parent is not None:
            return self._parent.on(name, device)
        with self._lock:
            host = self._host[name]
            if device == _HOST:
                return host
            copy = self._copies.get((name, device))
        if copy is None:
            made = host.copyto(device)  # outside the lock: it may take a while
            with self._lock:
                if self._host.get(name) is not host:  # replaced meanwhile
                    return made
                copy = self._copies.setdefault((name, device), made)
        return copy

    def _forget(self, names: Iterable[str]) -> None:
        changed = set(names)
        for key in [key for key in self._copies if key[0] in changed]:
            del self._copies[key]


def _host_array(value: HostValue) -> NDArray:
    """``value`` as a host NDArray nobody else writes: a read-only,
    C-contiguous, native-order numpy array as it is; anything else copied."""
    if (
        isinstance(value, np.ndarray)
        and not value.flags.writeable
        and value.flags.c_contiguous
        and value.flags.aligned
        and value.dtype.isnative
    ):
        return wrap_fresh_host(value, dtype_string(value.dtype))
    return array(value, _HOST)
