"""Casts to the narrow formats: ONNX's saturation and e8m0 rounding, bit for
bit against ONNX's own helpers, and the Cast rule that picks them."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
from asyncrt.ops import _jit, lookup, lookup_builtin

FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def _floats(dtype: type) -> np.ndarray[Any, Any]:
    """Every float16 bit pattern (as ``dtype``), and random float32s of every
    magnitude, with the specials."""
    every_half = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    rng = np.random.default_rng(0)
    wide = rng.standard_normal(4096) * np.exp2(rng.integers(-140, 128, 4096))
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 448.0, 464.0, 57344.0, 61440.0]
    with np.errstate(all="ignore"):  # NaN payloads and overflows, on purpose
        values = np.concatenate([every_half.astype(np.float32), wide, specials])
        return values.astype(dtype)


def _bits(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return a.view(np.uint8)


def _ties(dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Every finite value of the float8 ``dtype``, the float32 midpoints
    between neighbours and the floats on either side of each: where
    rounding to nearest even decides."""
    values = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    values = np.unique(values[np.isfinite(values)])
    mids = (values[1:] + values[:-1]) / 2
    sides = [
        np.nextafter(mids, np.float32(np.inf)),
        np.nextafter(mids, np.float32(-np.inf)),
    ]
    return np.concatenate([values, mids, *sides, np.nextafter(values, np.float32(0))])


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("target", FLOAT8)
@pytest.mark.parametrize("source", [np.float32, np.float16])
def test_saturate_cast_is_onnx_saturate_cast(
    target: str, source: type, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_jit, "enabled", compiled)
    definition = lookup_builtin("saturate_cast")
    assert definition is not None
    kernel = definition.make(np, {})
    dtype = np.dtype(getattr(ml_dtypes, target))
    x = np.concatenate([_floats(source), _ties(dtype).astype(source)])
    out = np.empty(x.shape, dtype)
    kernel(x, out)
    with np.errstate(all="ignore"):
        want = numpy_helper.saturate_cast(x, dtype)
    np.testing.assert_array_equal(_bits(out), _bits(want))


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("source", [np.float32, np.float16])
def test_cast_e8m0_is_onnx_to_float8e8m0(
    mode: str, saturate: bool, source: type
) -> None:
    definition = lookup("cast_e8m0")
    assert definition is not None
    kernel = definition.make(np, {"round_mode": mode, "saturate": saturate})
    with np.errstate(all="ignore"):
        x = np.concatenate([_floats(source), np.array([2.0**127 * 1.5], source)])
    out = np.empty(x.shape, ml_dtypes.float8_e8m0fnu)
    kernel(x, out)
    with np.errstate(all="ignore"):
        want = numpy_helper.to_float8e8m0(x, saturate, mode)
    np.testing.assert_array_equal(_bits(out), _bits(want))


def _cast_model(to: int, source: int, **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node("Cast", ["x"], ["y"], to=to, **attrs)
    graph = helper.make_graph(
        [node],
        "cast",
        [helper.make_tensor_value_info("x", source, [6])],
        [helper.make_tensor_value_info("y", to, [6])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])


def _run(model: onnx.ModelProto, x: np.ndarray[Any, Any]) -> tuple[str, Any]:
    graph, params = from_onnx(model)
    (node,) = [n for n in graph.nodes if not n.is_null]
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        (y,) = executor.run_sync(x=x) or []
    return node.func_name.split(".")[0], y.numpy()


@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_rule_saturates_only_when_asked(saturate: int) -> None:
    x = np.array([1.0, 500.0, -1e6, np.inf, np.nan, 0.3], np.float32)
    model = _cast_model(TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT, saturate=saturate)
    kernel, y = _run(model, x)
    assert kernel == ("saturate_cast" if saturate else "cast")
    got = y.astype(np.float32)
    assert got[0] == 1.0 and np.isnan(got[4])
    if saturate:
        assert got[1:4].tolist() == [448.0, -448.0, 448.0]
    else:
        assert np.isnan(got[1:4]).all()


def test_cast_rule_rounds_e8m0_as_asked() -> None:
    x = np.array([1.0, 1.5, 3.0, 0.3, 2.0**127 * 1.5, 5.0], np.float32)
    model = _cast_model(
        TensorProto.FLOAT8E8M0, TensorProto.FLOAT, round_mode="down", saturate=1
    )
    kernel, y = _run(model, x)
    assert kernel == "cast_e8m0"
    assert y.astype(np.float64).tolist() == [1, 1, 2, 0.25, 2.0**127, 4]


def test_bfloat16_flows_through_a_graph_on_a_simulated_device() -> None:
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["y"], ["z"]), node][::-1],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    g, params = from_onnx(model)
    x = np.array([-1.5, 2.25, 3.0, -0.0], ml_dtypes.bfloat16)
    with graph_executor.create(g, None, ["cpu", "sim:0"], params=params) as ex:
        (z,) = ex.run_sync(x=x) or []
    assert z.numpy().tolist() == [0.0, 2.25, 3.0, 0.0]
