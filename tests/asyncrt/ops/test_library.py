"""The kernel library and its registry: kernels found per array namespace,
per device kind where TVM users register them so, never for devices whose
kernels run on remote workers; a new device kind that names its namespace
gets every op with no change outside ``devices``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncrt
import devices
from asyncrt import graph_executor, ops
from asyncrt.errors import ArgumentError, KernelNotFoundError
from asyncrt.graph import GraphBuilder
from asyncrt.ops._kernels import global_namespace_func, resolve
from devices import DeviceAPI
from devices.cpu import CPUDeviceAPI

TOY = "toyhost"
FAR = "toyfar"
OPS = Path(ops.__file__).parent


class ToyHostAPI(CPUDeviceAPI):
    """A new device kind whose kernels take numpy arrays (a CPU in disguise)."""

    kind = TOY


class ToyFarAPI(DeviceAPI):
    """A device kind whose kernels run elsewhere, as remote workers' do."""

    kind = FAR
    array_namespace = None


@pytest.fixture
def toy_kinds() -> Iterator[None]:
    devices.register(TOY, ToyHostAPI)
    devices.register(FAR, ToyFarAPI)
    yield
    devices.unregister(TOY)
    devices.unregister(FAR)


def _relu(a: Any, out: Any) -> None:
    np.maximum(a, 0, out=out)


def test_every_builtin_and_configured_kernel_serves_a_new_numpy_kind(
    toy_kinds: None,
) -> None:
    names = ops.builtin_names()
    assert {"add", "relu", "erf", "softmax", "matmul", "where"} <= set(names)
    for name in names:
        kernel = asyncrt.get_global_func(name, TOY)
        assert kernel is global_namespace_func(name, "numpy")
        assert kernel is asyncrt.get_global_func(name, "cpu")
    configured = ops.register_op_kernel("transpose", {"perm": [1, 0]})
    assert asyncrt.get_global_func(configured, TOY) is asyncrt.get_global_func(
        configured, "cpu"
    )


def _chain() -> asyncrt.graph.Graph:
    b = GraphBuilder()
    x = b.input("x", shape=(4, 64), dtype="float32")
    w = b.param("w", shape=(64, 8), dtype="float32")
    t = b.op("tanh", x, shape=(4, 64), dtype="float32", name="t")
    e = b.op("exp", t, shape=(4, 64), dtype="float32", name="e")
    m = b.op("matmul", e, w, shape=(4, 8), dtype="float32", name="m")
    s = b.op("softmax", m, shape=(4, 8), dtype="float32", name="s")
    b.output(s)
    return b.build()


@pytest.mark.parametrize("fuse", [False, True])
def test_a_new_numpy_kind_runs_graphs_as_cpu_does(toy_kinds: None, fuse: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    params = {"w": rng.standard_normal((64, 8)).astype(np.float32)}
    results = []
    for device in ("cpu:0", f"{TOY}:0"):
        with graph_executor.create(
            _chain(), None, device, params=params, fuse=fuse
        ) as ex:
            first = next(iter(ex.plan.launches()))
            assert first.name == ("fused_tanh_exp" if fuse else "t")
            (y,) = ex.run_sync(x=x) or []
            results.append(y.numpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_a_kernel_for_a_kind_is_found_for_that_kind_first(toy_kinds: None) -> None:
    lib = asyncrt.Module({"relu": {TOY: _relu}})
    assert lib.find("relu", TOY) is _relu
    assert lib.find("relu", "cpu") is None
    assert resolve("relu", TOY, lib) is _relu
    assert resolve("relu", "cpu", lib) is asyncrt.get_global_func("relu")
    assert lib.kinds("relu") == (TOY,) and lib.namespaces("relu") == ()


def test_a_bare_kernel_serves_every_namespace(toy_kinds: None) -> None:
    lib = asyncrt.Module({"my_relu": _relu})
    assert lib.namespaces("my_relu") == ("cupy", "numpy")
    assert lib.find("my_relu", TOY) is _relu
    assert lib.get_function("my_relu") is _relu  # the host's kind by default
    assert lib.find("my_relu", FAR) is None
    assert lib.find("my_relu", "no_such_kind") is None


def test_registering_by_namespace() -> None:
    lib = asyncrt.Module()
    lib.add("host_only", _relu, namespaces=("numpy",))
    assert lib.find("host_only", "cpu") is _relu
    assert lib.find("host_only", "sim") is _relu
    assert lib.find_namespace("host_only", "cupy") is None
    with pytest.raises(KernelNotFoundError, match=r"'host_only'.*numpy"):
        lib.get_function("host_only", "no_such_kind")


def test_a_builtin_name_is_taken_for_every_kind_of_its_namespace() -> None:
    with pytest.raises(ArgumentError, match="'relu' is already registered"):
        asyncrt.register_func("relu", _relu, kinds=("cpu",))
    with pytest.raises(ArgumentError, match="'relu' is already registered"):
        asyncrt.register_func("relu", _relu, namespaces=("numpy",))
    lib = asyncrt.Module({"relu": asyncrt.get_global_func("relu")})
    lib.add("relu", _relu, kinds=("cpu",), override=True)
    assert lib.find("relu", "cpu") is _relu


def test_kernels_for_remote_devices_are_refused(toy_kinds: None) -> None:
    """Remote devices run their workers' kernels, found there by name: a
    kernel registered for them would run on the client with remote handles."""
    for kind in ("remote", FAR):
        with pytest.raises(ArgumentError) as refused:
            asyncrt.register_func("remote_relu", _relu, kinds=(kind,))
        message = str(refused.value)
        assert f"device kind {kind!r}" in message
        assert "workers run their own kernels" in message and "by name" in message
        with pytest.raises(ArgumentError, match="workers run their own"):
            asyncrt.Module({"remote_relu": {kind: _relu}})
    assert asyncrt.get_global_func("remote_relu", allow_missing=True) is None


def test_a_refused_kernel_leaves_nothing_registered() -> None:
    with pytest.raises(ArgumentError):
        asyncrt.register_func("half_taken", _relu, kinds=("cpu", "remote"))
    assert asyncrt.get_global_func("half_taken", "cpu", allow_missing=True) is None


def test_each_op_is_one_record() -> None:
    gelu = ops.lookup("gelu")
    assert gelu is not None and gelu.configured and gelu.fusion is None
    tanh = ops.lookup_builtin("tanh")
    assert tanh is not None and not tanh.configured
    assert tanh.flops is not None and tanh.fusion == ops.fusion_template("tanh")
    assert ops.fusion_template("matmul") is None
    # softmax is both: over the last axis, and configured (axes, log)
    assert ops.lookup_builtin("softmax") is not ops.lookup("softmax")
    assert ops.lookup("tanh") is None and ops.lookup_builtin("gelu") is None
    with pytest.raises(KeyError, match="no configurable op 'tanh'"):
        ops.register_op_kernel("tanh", {})


def test_the_library_names_no_device_kind() -> None:
    """Kernels are chosen by array namespace, never by a device's name."""
    kind = re.compile(r"\b(cpu|sim|cuda|remote)\b")
    named = sorted(p.name for p in OPS.glob("*.py") if kind.search(p.read_text()))
    assert named == []
