"""Kernels for the TVM graph files in ``tests/data/tvm-graphs``, so that the
command line plans and runs them (``asyncrt plan FILE --import
tests.tvm_graph_kernels``, from the repository root).

The files name TVM's fused kernels (``fuse_conv2d_broadcast_add_relu``,
``tvmgen_default_fused_nn_max_pool2d``...), compiled code asyncrt does not
have. DLR's 4in2out test graph is two broadcast adds, registered here as
what they are; every other kernel is a stand-in that writes into each output
a value derived from all of its inputs and its name (enough to plan, run,
and compare with a plain interpreter: ``test_tvm_graphs_run.py``). All are
registered globally for ``cpu`` and ``sim`` when this module is imported.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

import asyncrt

DATA = Path(__file__).resolve().parent / "data" / "tvm-graphs"
#: The kernels that compute what their names say.
REAL = ("fuse_broadcast_add", "fuse_broadcast_add_1")
KINDS = ("cpu", "sim")


def signature(*inputs: np.ndarray) -> float:
    """A number that changes when any input's first or last element does."""
    total = 0.0
    for position, x in enumerate(inputs, start=1):
        flat = x.reshape(-1)
        if flat.size:
            total += position * (float(flat[0]) + 0.5 * float(flat[-1]))
    return total


def stand_in(func_name: str, num_inputs: int) -> Callable[..., None]:
    """A kernel for ``func_name`` that fills every output with a value
    derived from its inputs and its name."""
    salt = zlib.crc32(func_name.encode()) % 97

    def kernel(*args: np.ndarray) -> None:
        value = (signature(*args[:num_inputs]) * 1.37 + salt) % 1000.0
        for out in args[num_inputs:]:
            out.fill(value)

    return kernel


def broadcast_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """TVM's ``broadcast_add``."""
    np.add(a, b, out)


def kernel_inputs() -> dict[str, int]:
    """Every kernel the graph files name, with its number of inputs."""
    found: dict[str, int] = {}
    for path in sorted(DATA.glob("*.json")):
        for node in json.loads(path.read_text())["nodes"]:
            attrs = node.get("attrs", node.get("attr", {}))
            name = attrs.get("func_name", "")
            if node["op"] != "null" and name and name != "__nop":
                found.setdefault(name, len(node["inputs"]))
    return found


def _register() -> None:
    for name, count in kernel_inputs().items():
        if asyncrt.get_global_func(name, "cpu", allow_missing=True) is not None:
            continue  # registered by an earlier import under another name
        kernel = broadcast_add if name in REAL else stand_in(name, count)
        asyncrt.register_func(name, kernel, kinds=KINDS)


_register()
