"""Pre-bound host views of one run context, for ``run_sync(**inputs)`` and
``await run(**inputs)``.

A run with inputs copies every input into a run context (the executor's
own, or a pooled one, in this process or a worker's I/O block) and hands
back a copy of every output. The general path (``set_input``, then
``NDArray.copyto``) looks each name up, checks each value, and allocates
each output through the device API: a few microseconds per tensor, which is
most of a small graph's run. A :class:`HostFeed` does the lookups once per
context: it holds a numpy view of every owned input buffer and every output,
so a run whose inputs are numpy arrays of exactly the planned shapes and
dtypes costs one ``np.copyto`` per input and one ``ndarray.copy`` per
output. Anything else (lists, NDArrays, DLPack tensors, other dtypes, a
parameter's name, a missing input) falls back to the general path, which
also raises the errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from devices import Device, NDArray, get_api
from devices._ndarray import wrap_fresh_host
from scheduler.dag import Entry

from ._context import RunContext
from ._process import ProcessContext

__all__ = ("HostFeed",)


class HostFeed:
    """Numpy views of a context's input buffers and outputs on the cpu.

    :param context: the run context the views belong to.
    :param names: each graph input's entry, by name (parameters included;
        only the context's own input buffers are bound).
    :param heads: the graph's outputs, in order.
    :param host: the host-facing device (outputs are bound only where it
        is the cpu).
    """

    def __init__(
        self,
        context: RunContext | ProcessContext,
        names: Mapping[str, Entry],
        heads: Sequence[Entry],
        host: Device,
    ) -> None:
        self.context = context
        owned = {
            name: entry for name, entry in names.items() if entry in context.inputs
        }
        self._inputs: dict[str, np.ndarray[Any, Any]] | None = None
        if all(_on_host(context.inputs[e].device) for e in owned.values()):
            self._inputs = {
                name: context.inputs[entry].backend_array()
                for name, entry in owned.items()
            }
        self._entries = frozenset(owned.values())
        arrays = [context.output(entry) for entry in heads]
        self._outputs: list[tuple[np.ndarray[Any, Any], str]] | None = None
        if _on_host(host) and all(a.device == host for a in arrays):
            self._outputs = [(array.backend_array(), array.dtype) for array in arrays]

    def fill(self, inputs: Mapping[str, Any]) -> bool:
        """Copy ``inputs`` into the context if they are exactly the owned
        inputs, as numpy arrays of the planned shapes and dtypes.

        :return: whether they were copied (nothing is copied otherwise).
        """
        targets = self._inputs
        if targets is None or inputs.keys() != targets.keys():
            return False
        for name, value in inputs.items():
            target = targets[name]
            if (
                type(value) is not np.ndarray
                or value.shape != target.shape
                or value.dtype != target.dtype
            ):
                return False
        for name, value in inputs.items():
            np.copyto(targets[name], value, casting="no")
        self.context.is_set.update(self._entries)
        return True

    def outputs(self) -> list[NDArray] | None:
        """New cpu arrays holding the context's outputs, or ``None`` if an
        output is not on the cpu."""
        if self._outputs is None:
            return None
        return [wrap_fresh_host(view.copy(), dtype) for view, dtype in self._outputs]


def _on_host(device: Device) -> bool:
    """Whether ``device``'s arrays are host memory numpy can view."""
    return get_api(device.kind).is_host
