"""One ExecutorOptions for every way to make an executor, validated where it
is given, with errors that name the option and the accepted values."""

from __future__ import annotations

import dataclasses
import gc
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncrt
from asyncrt import debug_executor, graph_executor
from asyncrt.errors import ArgumentError, AsyncrtError, InputError
from asyncrt.graph import Graph, GraphBuilder
from asyncrt.runtime._options import ExecutorOptions, OptionOverrides


def small_graph() -> Graph:
    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    w = b.param("w", shape=(4,), dtype="float32")
    b.output(b.op("add", x, w, shape=(4,), dtype="float32"))
    return b.build()


W = np.arange(4, dtype=np.float32)


def test_the_overrides_are_the_options_fields() -> None:
    fields = {f.name for f in dataclasses.fields(ExecutorOptions)}
    assert set(OptionOverrides.__annotations__) == fields


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_contexts": 0}, "max_contexts must be an int >= 1, got 0"),
        ({"max_contexts": 2.5}, "max_contexts must be an int >= 1"),
        ({"max_contexts": True}, "max_contexts must be an int >= 1"),
        ({"memory_budget": -1}, "memory_budget must be an int >= 0 or None"),
        ({"kernel_threads": "lots"}, "kernel_threads must be one of auto, throughput"),
        ({"kernel_threads": 0}, "kernel_threads must be an int >= 1"),
        ({"policy": "bogus"}, "policy must be one of auto, fastest, heft"),
        ({"policy": 3}, "policy must be one of .* or a callable, got int"),
        ({"max_streams": 0}, "max_streams must be an int >= 1"),
        ({"fuse": "numba"}, "fuse must be True, False or one of auto, numpy, numexpr"),
        ({"split": 1}, "split must be True or False"),
        ({"processes": "yes"}, "processes must be True or False"),
        ({"worker_nice": 20}, "worker_nice must be in 0..19"),
        ({"worker_imports": "mykernels"}, "worker_imports must be a sequence"),
        ({"worker_env": {"A": 1}}, "worker_env must map names to strings"),
        ({"worker_blas": "no such set!"}, "worker_blas must be 'auto', 'default'"),
        ({"max_context": 2}, "unknown executor option 'max_context'; options: "),
    ],
)
def test_bad_options_are_refused_where_given(
    overrides: dict[str, Any], message: str
) -> None:
    makers = [
        lambda: graph_executor.create(small_graph(), **overrides),
        lambda: debug_executor.create(small_graph(), **overrides),
        lambda: asyncrt.build(small_graph(), {"w": W}, **overrides),
        lambda: asyncrt.build(small_graph(), {"w": W}).create(**overrides),
        lambda: ExecutorOptions.of(**overrides),
    ]
    for make in makers:
        with pytest.raises(ArgumentError, match=message) as info:
            make()
        assert isinstance(info.value, AsyncrtError)
        assert isinstance(info.value, ValueError)  # where Python expects one


def test_every_way_to_make_an_executor_takes_the_same_options(tmp_path: Path) -> None:
    options = ExecutorOptions(max_contexts=2, max_streams=2, fuse=True)
    path = tmp_path / "m.asyncrt"
    asyncrt.build(small_graph(), {"w": W}).export_library(path)
    made = [
        graph_executor.create(small_graph(), params={"w": W}, options=options),
        debug_executor.create(small_graph(), params={"w": W}, options=options),
        asyncrt.build(small_graph(), {"w": W}, options=options).create(),
        asyncrt.build(small_graph(), {"w": W}).create(options=options),
        asyncrt.load_module(path).create(options=options),
    ]
    for ex in made:
        with ex:
            assert ex.options == options
            assert ex.pool.limit == 2
            (out,) = ex.run_sync(x=np.ones(4, np.float32)) or []
            np.testing.assert_array_equal(out.numpy(), W + 1)
    # keyword overrides apply on top of the options given
    with graph_executor.create(
        small_graph(), params={"w": W}, options=options, max_contexts=3
    ) as ex:
        assert ex.options == dataclasses.replace(options, max_contexts=3)


def test_a_device_where_lib_goes_is_refused() -> None:
    with pytest.raises(ArgumentError, match=r"lib must be an asyncrt\.Module or None"):
        asyncrt.build(small_graph(), {"w": W}, asyncrt.cpu())  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="devices go by keyword"):
        graph_executor.create(small_graph(), "cpu")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="devices must be a device"):
        graph_executor.create(small_graph(), None, 3)  # type: ignore[arg-type]


def test_an_unknown_input_lists_what_a_caller_gives_not_the_parameters() -> None:
    with (
        graph_executor.create(small_graph(), params={"w": W}) as ex,
        pytest.raises(InputError) as info,
    ):
        ex.run_sync(y=np.ones(4, np.float32))
    assert "inputs: x (and 1 parameters)" in str(info.value)
    assert "w" not in str(info.value).split("inputs:")[1].replace("parameters", "")


def _asyncrt_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("asyncrt-")}


def test_a_dropped_executor_releases_its_threads_with_a_resource_warning() -> None:
    before = _asyncrt_threads()
    ex = graph_executor.create(
        small_graph(), None, ["cpu", "sim:0", "sim:1"], params={"w": W}, max_streams=2
    )
    ex.run_sync(x=np.ones(4, np.float32))
    assert _asyncrt_threads() - before  # its streams' threads run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del ex
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    assert "was not closed" in str(caught[0].message)
    for thread in _asyncrt_threads() - before:
        thread.join(timeout=5)
    assert not _asyncrt_threads() - before


def test_a_closed_executor_warns_nothing_when_collected() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with graph_executor.create(small_graph(), params={"w": W}) as ex:
            ex.run_sync(x=np.ones(4, np.float32))
        del ex
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_run_returns_a_list_for_every_caller() -> None:
    """``outputs = await ex.run(x=...); outputs[0]`` passes ``mypy --strict``:
    neither ``run`` (without ``out=``) nor ``run_sync`` is typed Optional."""
    from typing_extensions import get_overloads

    from asyncrt.graph_executor import GraphModule

    overloads = get_overloads(GraphModule.run)
    plain = [o for o in overloads if "None" in str(o.__annotations__.get("out"))]
    assert plain and "None" not in str(plain[0].__annotations__["return"])
    assert "None" not in str(GraphModule.run_sync.__annotations__["return"])
    with graph_executor.create(small_graph(), params={"w": W}) as ex:
        ex.set_input(x=np.ones(4, np.float32))
        (own,) = ex.run_sync()  # stateful: the executor's own outputs
        np.testing.assert_array_equal(own.numpy(), W + 1)
