"""The executor's parameters: held once, shared read-only by every run.

A parameter lives once on its *home* device (where the first compiled graph
keeps it) and, where a compiled graph reads it on another device, once more
there (a constant copy, refreshed in place when the value changes, so run
contexts stay bound to the same arrays). Values are keyed by name, not by a
compiled graph's entries: every compiled graph of an executor (one per
shape signature) binds the same arrays.

:attr:`Parameters.generation` counts changes of the *set* of parameters or
of which arrays they are (``load_params`` of a new name, ``share_params``):
contexts made before such a change are rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from devices import Device, NDArray, empty
from scheduler.dag import Entry

from ._compiled import CompiledGraph

__all__ = ("Parameters",)

HostValue = NDArray | np.ndarray[Any, Any]


class Parameters:
    """Parameter arrays by name, with their copies on other devices."""

    def __init__(self) -> None:
        self._home: dict[str, NDArray] = {}
        self._copies: dict[tuple[str, Device], NDArray] = {}
        self.generation = 0

    def __contains__(self, name: object) -> bool:
        return name in self._home

    def names(self) -> frozenset[str]:
        """The names of the parameters held."""
        return frozenset(self._home)

    def array(self, name: str) -> NDArray:
        """The home array of parameter ``name`` (the caller may not write)."""
        return self._home[name]

    def host_values(self) -> dict[str, np.ndarray[Any, Any]]:
        """Every parameter as a host array (for a worker process's spec)."""
        return {name: array.numpy() for name, array in self._home.items()}

    def load(
        self, compiled: CompiledGraph, values: Iterable[tuple[str, HostValue]]
    ) -> None:
        """Set parameters (checked values), allocating those new on the
        device ``compiled`` keeps them on, and refresh their copies."""
        changed: list[str] = []
        for name, value in values:
            array = self._home.get(name)
            if array is None:
                entry = compiled.input_entries[name]
                spec = compiled.tensor(entry)
                device = compiled.plan.storage[entry].device
                array = self._home[name] = empty(spec.shape, spec.dtype, device)
                self.generation += 1
            array.copyfrom(value)
            changed.append(name)
        self._refresh(changed)

    def share(self, arrays: Mapping[str, NDArray]) -> None:
        """Use these arrays (another executor's, no copy) as parameters."""
        self._home.update(arrays)
        self.generation += 1
        self._refresh(arrays)

    def bound(self, compiled: CompiledGraph) -> dict[Entry, NDArray]:
        """The arrays a run context of ``compiled`` binds: each parameter at
        its entry, and its copy on another device at the copy's entry (made
        now if ``compiled`` is the first to read it there)."""
        plan = compiled.plan
        arrays: dict[Entry, NDArray] = {}
        for name in self._home:
            entry = compiled.input_entries.get(name)
            if entry is not None:
                arrays[entry] = self._on(name, plan.storage[entry].device)
        for copy, source in plan.constant_copies.items():
            name = compiled.name_of(plan.resolve(source))
            if name not in self._home:
                continue
            array = self._on(name, plan.storage[copy].device)
            spec = compiled.tensor(copy)
            if array.shape != spec.shape or array.dtype != spec.dtype:
                # A copy of an alias of the parameter (a reshape): its bytes.
                array = NDArray(array.buffer, spec.shape, spec.dtype, array.byte_offset)
            arrays[copy] = array
        return arrays

    def _on(self, name: str, device: Device) -> NDArray:
        home = self._home[name]
        if home.device == device:
            return home
        copy = self._copies.get((name, device))
        if copy is None:
            copy = self._copies[name, device] = empty(home.shape, home.dtype, device)
            copy.copyfrom(home)
        return copy

    def _refresh(self, names: Iterable[str]) -> None:
        """Bring the copies of ``names`` up to date, in place."""
        for name in names:
            home = self._home[name]
            for (copied, device), copy in list(self._copies.items()):
                if copied != name:
                    continue
                if copy.shape == home.shape and copy.dtype == home.dtype:
                    copy.copyfrom(home)
                else:  # shared by an array of another shape: made anew
                    del self._copies[copied, device]
