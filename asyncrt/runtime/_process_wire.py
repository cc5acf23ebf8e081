"""What travels between an executor and its worker processes.

A process-backed executor (``create(..., processes=True)``) runs each pooled
run context in a worker process of its own (:mod:`asyncrt.runtime._process`,
:mod:`asyncrt.runtime._process_worker`). The two sides share:

* a :class:`WorkerSpec`, sent once when the worker starts: everything it
  needs to build the same executor (graph, parameters, devices, the
  parent's placement, options) and the layout of the shared *I/O block*;
* the I/O block: one shared memory mapping per context, holding a slot for
  every graph input the caller gives and every output (:class:`IoLayout`);
  inputs and outputs cross as plain memory copies, never through the pipe;
* small messages over a socket pair (``multiprocessing``'s framing): the
  parent sends ``(kind, run)`` with :data:`RUN`, :data:`CANCEL` or
  :data:`EXIT`; the worker answers each run exactly once with ``(kind, run,
  data)``, :data:`OK`, :data:`FAILED` or :data:`CANCELLED`, and says
  :data:`READY` (or :data:`FAILED`) once built. Runs are numbered, so an
  answer the parent never read (a cancelled caller's) cannot be taken for a
  later run's.

Everything crosses as JSON and raw bytes, never as pickles: the spec is a
JSON header followed by the parameters in TVM's params format
(:meth:`WorkerSpec.to_bytes`), messages are JSON lists (:func:`encode`),
and errors are data: :func:`encode_error` turns an exception into a dict
and :func:`decode_error` builds an equivalent one, keeping the node, op,
device and stream of a :class:`NodeFailedError`, the fields of an
:class:`OutOfMemoryError`, and for anything else its type (rebuilt when it
is a built-in exception or one of asyncrt's with a plain message, else a
:class:`~asyncrt.errors.RemoteError`), its message and, as a note, the
worker's traceback.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import struct
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from devices import Device
from devices import errors as device_errors
from devices.errors import OutOfMemoryError, RemoteError
from scheduler import errors as scheduler_errors
from scheduler.cost import CostModel
from scheduler.errors import NodeFailedError
from scheduler.placement import Placement, evaluate

from .. import errors as asyncrt_errors
from ..io._param_dict import load_param_dict, save_param_dict

__all__ = (
    "CANCEL",
    "CANCELLED",
    "EXIT",
    "FAILED",
    "OK",
    "READY",
    "RUN",
    "Given",
    "IoLayout",
    "Message",
    "Slot",
    "WorkerSpec",
    "decode",
    "decode_error",
    "encode",
    "encode_error",
)

# parent -> worker
RUN = "run"
CANCEL = "cancel"
EXIT = "exit"
# worker -> parent
READY = "ready"
OK = "ok"
FAILED = "failed"
CANCELLED = "cancelled"

#: A message to a worker: its kind and the run it is about (every run is
#: numbered, and the worker's answer carries the number).
Message = tuple[str, int]

#: Slots start on cache-line boundaries.
ALIGN = 64


def encode(message: Any) -> bytes:
    """A message (lists, strings, numbers, dicts) as bytes for the socket."""
    return json.dumps(message).encode()


def decode(data: bytes) -> Any:
    """A message from :func:`encode`'s bytes."""
    return json.loads(data)


@dataclass(frozen=True)
class Slot:
    """One tensor in the I/O block.

    :ivar name: the graph input's name, or ``"output:<i>"``.
    :ivar offset: byte offset in the block.
    :ivar shape: the tensor's shape.
    :ivar dtype: its dtype string.
    """

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """The slot's size in bytes."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count * np.dtype(self.dtype).itemsize

    def view(self, block: Any) -> np.ndarray[Any, Any]:
        """The slot as a numpy array over ``block`` (no copy)."""
        raw = np.frombuffer(
            block, dtype=np.uint8, count=self.nbytes, offset=self.offset
        )
        return raw.view(self.dtype).reshape(self.shape)


@dataclass(frozen=True)
class IoLayout:
    """Where each input and output lives in a context's I/O block.

    :ivar inputs: the slots of the inputs a caller gives, by graph order.
    :ivar outputs: the slots of the outputs, by output index.
    :ivar nbytes: the block's size (at least 1: an empty mapping is invalid).
    """

    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    nbytes: int

    @classmethod
    def of(
        cls,
        inputs: Mapping[str, tuple[tuple[int, ...], str]],
        outputs: list[tuple[tuple[int, ...], str]],
    ) -> IoLayout:
        """Lay out ``inputs`` (name -> (shape, dtype)) and ``outputs``."""
        offset = 0
        slots: list[Slot] = []
        named = [*inputs.items(), *((f"output:{i}", o) for i, o in enumerate(outputs))]
        for name, (shape, dtype) in named:
            slot = Slot(name, offset, tuple(shape), dtype)
            slots.append(slot)
            offset += -(-slot.nbytes // ALIGN) * ALIGN
        count = len(inputs)
        return cls(tuple(slots[:count]), tuple(slots[count:]), max(1, offset))


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs to build its executor.

    :ivar graph: the graph as JSON (fused and planned again in the worker).
    :ivar params: the parameters by name, as host arrays.
    :ivar devices: the devices, host-facing first, as strings.
    :ivar placement: the parent plan's device of every node (as strings),
        so the worker's plan places every node where the parent's does.
    :ivar options: the worker's executor options, as JSON-able fields of
        :class:`~asyncrt.runtime._options.ExecutorOptions`
        (:meth:`~asyncrt.runtime._options.ExecutorOptions.for_worker`).
    :ivar imports: modules the worker imports first (where user kernels
        register themselves).
    :ivar layout: the I/O block's layout.
    :ivar nice: added to the worker's scheduling niceness (0: unchanged).
    :ivar device_state: the parent's device state that a worker must share
        (:func:`devices.process_state`: the simulated devices' speeds and
        sizes, ...), plain JSON-able data; e.g. so that a worker's sims
        model the same hardware.
    """

    graph: str
    params: Mapping[str, np.ndarray[Any, Any]]
    devices: tuple[str, ...]
    placement: Mapping[int, str]
    options: Mapping[str, Any]
    imports: tuple[str, ...]
    layout: IoLayout
    nice: int = 0
    device_state: Mapping[str, Any] | None = None

    def to_bytes(self) -> bytes:
        """The spec as a JSON header (its length first, 8 bytes) and the
        parameters in TVM's params format."""
        header = {
            "graph": self.graph,
            "devices": list(self.devices),
            "placement": {str(nid): dev for nid, dev in self.placement.items()},
            "options": dict(self.options),
            "imports": list(self.imports),
            "layout": {
                "inputs": [dataclasses.astuple(slot) for slot in self.layout.inputs],
                "outputs": [dataclasses.astuple(slot) for slot in self.layout.outputs],
                "nbytes": self.layout.nbytes,
            },
            "nice": self.nice,
            "device_state": None
            if self.device_state is None
            else dict(self.device_state),
        }
        text = json.dumps(header).encode()
        return struct.pack("<Q", len(text)) + text + save_param_dict(self.params)

    @classmethod
    def from_bytes(cls, data: bytes) -> WorkerSpec:
        """The spec :meth:`to_bytes` wrote."""
        (length,) = struct.unpack_from("<Q", data)
        header = json.loads(data[8 : 8 + length])
        params = load_param_dict(memoryview(data)[8 + length :])

        def slots(rows: list[list[Any]]) -> tuple[Slot, ...]:
            return tuple(Slot(n, at, tuple(shape), dt) for n, at, shape, dt in rows)

        layout = header["layout"]
        return cls(
            graph=header["graph"],
            params={name: array.numpy() for name, array in params.items()},
            devices=tuple(header["devices"]),
            placement={int(nid): dev for nid, dev in header["placement"].items()},
            options=header["options"],
            imports=tuple(header["imports"]),
            layout=IoLayout(
                slots(layout["inputs"]), slots(layout["outputs"]), layout["nbytes"]
            ),
            nice=header["nice"],
            device_state=header["device_state"],
        )


def encode_error(exc: BaseException) -> dict[str, Any]:
    """An exception as plain data (see the module docstring)."""
    data: dict[str, Any] = _plain(exc)
    if isinstance(exc, NodeFailedError):
        data = {
            "kind": "node",
            "node": exc.node,
            "op": exc.op,
            "device": exc.device,
            "stream": exc.stream,
            "cause": None if exc.__cause__ is None else _plain(exc.__cause__),
        }
    return data


def _plain(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, OutOfMemoryError):
        return {
            "kind": "oom",
            "device": exc.device,
            "requested": exc.requested,
            "available": exc.available,
        }
    return {
        "kind": "other",
        "module": type(exc).__module__,
        "type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def decode_error(data: Mapping[str, Any], worker: str) -> BaseException:
    """The exception :func:`encode_error` described, raised in ``worker``
    (a description such as ``"worker process 123"``)."""
    if data["kind"] == "node":
        cause = None if data["cause"] is None else decode_error(data["cause"], worker)
        error = NodeFailedError(
            data["node"], data["op"], data["device"], data["stream"], cause
        )
        error.__cause__ = cause
        return error
    if data["kind"] == "oom":
        return OutOfMemoryError(data["device"], data["requested"], data["available"])
    rebuilt = _rebuild(data["module"], data["type"], data["message"])
    if rebuilt is not None:
        if sys.version_info >= (3, 11):  # notes are new in 3.11
            rebuilt.add_note(f"raised in {worker}:\n{data['traceback']}")
        return rebuilt
    return RemoteError(
        f"{data['type']}: {data['message']}",
        device="process",
        worker=worker,
        type_name=data["type"],
        remote_traceback=data["traceback"],
    )


class Given:
    """A placement policy that keeps the parent plan's placement: a worker
    plans its graph again, and every node must land where the parent's plan
    put it (the parent's printed plan is the one that runs).

    :param device_of: the device of every node.
    """

    def __init__(self, device_of: Mapping[int, Device]) -> None:
        self.device_of = dict(device_of)

    def __call__(
        self, dag: nx.DiGraph, devices: Sequence[Device], cost: CostModel
    ) -> Placement:
        return evaluate(dag, devices, cost, self.device_of, "given")


#: Where :func:`decode_error` may find an exception type by name.
_ERROR_MODULES = {
    "builtins": builtins,
    "asyncrt.errors": asyncrt_errors,
    "devices.errors": device_errors,
    "scheduler.errors": scheduler_errors,
}


def _rebuild(module: str, name: str, message: str) -> Exception | None:
    """An exception of a known type with ``message``, or ``None``."""
    cls = getattr(_ERROR_MODULES.get(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    try:
        return cls(message)
    except Exception:  # its constructor wants more than a message
        return None
