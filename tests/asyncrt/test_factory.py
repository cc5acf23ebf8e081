"""build / export_library / load_module: one file, data only, round trip."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

import asyncrt
from asyncrt.errors import (
    ArgumentError,
    ArtifactError,
    ArtifactIOError,
    ArtifactNotFoundError,
    KernelNotFoundError,
)
from asyncrt.graph import GraphBuilder

from .test_executor import PARAMS, C, W, mlp_graph, reference


def test_export_and_load_round_trip(tmp_path: Path) -> None:
    factory = asyncrt.build(mlp_graph(), PARAMS)
    assert factory.kernel_names == ("add", "multiply", "relu", "subtract", "tanh")
    path = tmp_path / "mlp.asyncrt"
    factory.export_library(path)
    loaded = asyncrt.load_module(path)
    assert loaded.get_graph_json() == factory.get_graph_json()
    params = loaded.get_params()
    np.testing.assert_array_equal(params["w"].numpy(), W)
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    with loaded["default"](asyncrt.sim(0)) as ex:
        outs = ex.run_sync(x=x)
        assert outs is not None
        np.testing.assert_allclose(outs[0].numpy(), reference(x, C, W)[0], rtol=1e-6)


def test_custom_kernels_are_found_by_name_on_load(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    b.output(b.op("triple", x, shape=(4,), dtype="float32"))

    def triple(a: np.ndarray, out: np.ndarray) -> None:
        np.multiply(a, 3, out)

    lib = asyncrt.Module({"triple": triple})
    path = tmp_path / "triple.asyncrt"
    asyncrt.build(b.build(), lib=lib).export_library(path)
    with pytest.raises(KernelNotFoundError, match="registered nowhere: triple"):
        asyncrt.load_module(path)
    with asyncrt.load_module(path, lib).create() as ex:
        outs = ex.run_sync(x=np.ones(4, dtype=np.float32))
        assert outs is not None
        np.testing.assert_array_equal(outs[0].numpy(), np.full(4, 3.0))


def test_tampered_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.asyncrt"
    asyncrt.build(mlp_graph(), PARAMS).export_library(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("../evil.py", "print('pwned')")
    with pytest.raises(ArtifactError, match="evil"):
        asyncrt.load_module(path)


def test_not_a_module(tmp_path: Path) -> None:
    path = tmp_path / "graph.json"
    path.write_text(mlp_graph().to_json())
    with pytest.raises(ArtifactError, match="not a zip"):
        asyncrt.load_module(path)


# -- errors name the caller's path and keep the standard type -----------------------


def test_loading_a_missing_module_is_an_artifact_error_and_file_not_found(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nope.asyncrt"
    with pytest.raises(ArtifactNotFoundError) as caught:
        asyncrt.load_module(path)
    error = caught.value
    assert isinstance(error, FileNotFoundError) and isinstance(error, ArtifactError)
    assert error.filename == str(path) and error.path == str(path)
    assert str(error) == f"{path}: no such file"


def test_exporting_into_a_missing_folder_names_the_path_not_a_temp_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "no" / "such" / "dir" / "m.asyncrt"
    factory = asyncrt.build(mlp_graph(), PARAMS)
    with pytest.raises(ArtifactNotFoundError) as caught:
        factory.export_library(path)
    error = caught.value
    assert isinstance(error, FileNotFoundError)
    assert error.filename == str(path)
    assert str(error).startswith(f"{path}: ") and ".tmp" not in str(error)
    assert str(path.parent) in str(error)


def test_an_unwritable_place_is_an_artifact_io_error(tmp_path: Path) -> None:
    folder = tmp_path / "taken"
    folder.mkdir()
    (folder / "m.asyncrt").mkdir()  # a folder where the file should go
    with pytest.raises(ArtifactIOError) as caught:
        asyncrt.build(mlp_graph(), PARAMS).export_library(folder / "m.asyncrt")
    assert isinstance(caught.value, OSError)
    assert ".tmp" not in str(caught.value)
    assert os.listdir(folder) == ["m.asyncrt"]  # no temporary file left


def test_a_device_where_lib_goes_is_refused_at_build() -> None:
    with pytest.raises(ArgumentError, match=r"lib must be .*devices=") as caught:
        asyncrt.build(mlp_graph(), PARAMS, asyncrt.cpu())  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ArgumentError, match="params must map names to arrays"):
        asyncrt.build(mlp_graph(), "model.params")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="lib must be"):
        asyncrt.load_module("whatever.asyncrt", "cpu")  # type: ignore[arg-type]
